//! `ibjitter study` output: `summary.json` (the figures), `summary.md` (the same for people,
//! with the verdict first) and three SVG plots: the metric against the injected sd at each
//! fixed mean (`sd.svg`), against the injected mean (`mean.svg`), and every configuration's
//! runs (`runs.svg`); a tolerance study's part is `export::tolerance`.
use super::tolerance;
use crate::report::plot::{scatter_chart, strip_chart, Series};
use crate::study::plan::Plan;
use crate::study::record::{counted, counted_metrics, Row};
use crate::study::stats::ALPHA;
use crate::study::summary::{ConfigSummary, Summary};
use std::path::Path;

/// Writes summary.json, summary.md, sd.svg, mean.svg and runs.svg into `dir`.
pub fn write_all(s: &Summary, plan: &Plan, rows: &[Row], dir: &Path) -> Result<(), String> {
    let json = dir.join("summary.json");
    // NaN (too few runs for a figure) is written as null.
    let text = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
    std::fs::write(&json, text + "\n").map_err(|e| format!("{}: {e}", json.display()))?;
    let md = dir.join("summary.md");
    std::fs::write(&md, markdown(s)).map_err(|e| format!("{}: {e}", md.display()))?;
    plots(s, plan, rows, dir)
}

fn f(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "–".into()
    }
}

fn interval(ci: [f64; 2]) -> String {
    if ci[0].is_finite() && ci[1].is_finite() {
        format!(" [{:.2}, {:.2}]", ci[0], ci[1])
    } else {
        String::new()
    }
}

/// The summary for people.
pub fn markdown(s: &Summary) -> String {
    let mut md = vec![
        "# ibjitter study".to_string(),
        String::new(),
        format!("Command: `{}`  ", s.command),
        format!(
            "Metric: {} ({} is better)",
            s.metric,
            if s.higher_is_better {
                "higher"
            } else {
                "lower"
            }
        ),
        String::new(),
        format!("**Verdict:** {}.", s.verdict),
        String::new(),
    ];
    if let Some(t) = &s.tolerance {
        for line in tolerance::sentences(t) {
            md.push(line);
            md.push(String::new());
        }
    }
    if !s.complete {
        md.push(
            "**Incomplete:** the study was interrupted, or `--until-ci` reached its cap before \
             every interval was narrow enough; re-run the same command to continue it."
                .to_string(),
        );
        md.push(String::new());
    }
    md.extend([
        "| configuration | kind | injected mean µs | injected sd µs | runs | mean | sd | median | 95 % CI ± | slowdown [95 % CI] | tail slowdown | drawn mean µs |".to_string(),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_string(),
    ]);
    for c in &s.configurations {
        md.push(row(c));
    }
    md.push(String::new());
    if s.r_mean.is_finite() || s.r_sd.is_finite() {
        md.push(correlations(s));
        md.push(String::new());
    }
    if let Some(t) = &s.tolerance {
        md.extend(tolerance::markdown(t));
    }
    md.push(
        "Slowdown: a configuration's mean metric over the clean runs' mean (the inverse for \
         metrics where higher is better); for a congestor this is GPCNeT's congestion impact \
         factor. Its 95 % interval is the delta method's on the log of the ratio (always \
         positive, wider above than below), with Welch's degrees of freedom."
            .to_string(),
    );
    md.push(String::new());
    md.push(format!(
        "Runs: {} in all, {} warm-up (not counted), {} that did not count.",
        s.runs_total, s.warmup_runs, s.runs_failed
    ));
    if !s.warnings.is_empty() {
        md.push(String::new());
        md.push("Warnings:".to_string());
        for w in &s.warnings {
            md.push(format!("- {w}"));
        }
    }
    md.push(String::new());
    if has_tables(s) {
        md.push("![metric vs injected sd](sd.svg)".to_string());
        md.push("![metric vs injected mean](mean.svg)".to_string());
    }
    md.push("![every run](runs.svg)".to_string());
    md.push(String::new());
    md.join("\n")
}

/// The correlation paragraph (only when the injected delays varied).
fn correlations(s: &Summary) -> String {
    format!(
        "Over the {} clean and table runs: Pearson r of the metric vs the injected mean \
         **r_mean = {}** (p = {}), vs the injected sd **r_sd = {}** (p = {}); Fisher's z of r_sd \
         vs r_mean **z = {}**, two-sided p = {} (α = {ALPHA}).",
        s.correlation_runs,
        f(s.r_mean, 3),
        f(s.p_r_mean, 3),
        f(s.r_sd, 3),
        f(s.p_r_sd, 3),
        f(s.fisher_z, 2),
        f(s.p_value, 4),
    )
}

fn row(c: &ConfigSummary) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {}{} | {} |",
        c.name,
        c.kind,
        f(c.table_mean_us, 1),
        f(c.table_sd_us, 1),
        c.runs,
        f(c.mean, 4),
        f(c.sd, 4),
        f(c.median, 4),
        f(c.ci95, 4),
        f(c.slowdown, 3),
        interval(c.slowdown_ci95),
        f(c.tail_slowdown, 3),
        interval(c.tail_slowdown_ci95),
        f(c.injected_mean_us, 1),
    )
}

/// Groups of table configurations with the same injected mean (to 1 %), in order of mean.
fn by_mean(s: &Summary) -> Vec<(f64, Vec<&ConfigSummary>)> {
    let mut groups: Vec<(f64, Vec<&ConfigSummary>)> = Vec::new();
    for c in s.configurations.iter().filter(|c| c.kind == "table") {
        match groups
            .iter_mut()
            .find(|(m, _)| (c.table_mean_us - m).abs() <= 0.01 * m.abs().max(1e-9))
        {
            Some(g) => g.1.push(c),
            None => groups.push((c.table_mean_us, vec![c])),
        }
    }
    groups.sort_by(|a, b| a.0.total_cmp(&b.0));
    groups
}

fn has_tables(s: &Summary) -> bool {
    s.configurations.iter().any(|c| c.kind == "table")
}

fn plots(s: &Summary, plan: &Plan, rows: &[Row], dir: &Path) -> Result<(), String> {
    runs_plot(s, plan, rows, dir)?;
    if has_tables(s) {
        delay_plots(s, rows, dir)?;
    }
    if let Some(t) = &s.tolerance {
        tolerance::plots(t, rows, dir)?;
    }
    Ok(())
}

/// Every configuration's runs with the mean and its CI.
fn runs_plot(s: &Summary, plan: &Plan, rows: &[Row], dir: &Path) -> Result<(), String> {
    let cats: Vec<(String, Vec<f64>, (f64, f64))> = plan
        .configurations
        .iter()
        .zip(&s.configurations)
        .map(|(c, cs)| {
            let v = counted_metrics(rows, &c.name);
            (c.name.clone(), v, (cs.mean - cs.ci95, cs.mean + cs.ci95))
        })
        .collect();
    strip_chart(
        &dir.join("runs.svg"),
        "every run, with each configuration's mean and 95 % CI",
        &s.metric,
        &cats,
    )
}

/// The metric against the injected sd (one line per mean) and against the injected mean.
fn delay_plots(s: &Summary, rows: &[Row], dir: &Path) -> Result<(), String> {
    let counted = |name: &str| counted(rows, name).collect::<Vec<_>>();
    let clean = s.configurations.iter().find(|c| c.kind == "clean");
    let y_label = s.metric.clone();

    // The metric against the sd, one line per mean; the clean runs at sd 0.
    let (mut lines, mut dots) = (Vec::new(), Vec::new());
    for (m, group) in by_mean(s) {
        let mut pts: Vec<(f64, f64)> = group
            .iter()
            .filter(|c| c.mean.is_finite())
            .map(|c| (c.table_sd_us, c.mean))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        lines.push(Series {
            name: format!("injected mean {m:.1} µs"),
            points: pts,
        });
        dots.push(Series {
            name: String::new(),
            points: group
                .iter()
                .flat_map(|c| counted(&c.name))
                .map(|r| (r.table_sd_us, r.metric))
                .collect(),
        });
    }
    if let Some(c) = clean {
        lines.push(Series {
            name: "clean".into(),
            points: vec![(0.0, c.mean)],
        });
        dots.push(Series {
            name: String::new(),
            points: counted(&c.name).iter().map(|r| (0.0, r.metric)).collect(),
        });
    }
    scatter_chart(
        &dir.join("sd.svg"),
        &format!(
            "metric vs injected sd at fixed mean (r_sd = {})",
            f(s.r_sd, 2)
        ),
        ("injected delay sd (µs)", &y_label),
        &lines,
        &dots,
    )?;

    // The metric against the mean: each configuration's mean, and its runs.
    let cfgs: Vec<&ConfigSummary> = s
        .configurations
        .iter()
        .filter(|c| c.kind != "congestor")
        .collect();
    let mut pts: Vec<(f64, f64)> = cfgs
        .iter()
        .filter(|c| c.mean.is_finite())
        .map(|c| (c.table_mean_us, c.mean))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let runs: Vec<(f64, f64)> = cfgs
        .iter()
        .flat_map(|c| counted(&c.name))
        .map(|r| (r.table_mean_us, r.metric))
        .collect();
    scatter_chart(
        &dir.join("mean.svg"),
        &format!("metric vs injected mean (r_mean = {})", f(s.r_mean, 2)),
        ("injected delay mean (µs)", &y_label),
        &[Series {
            name: "configuration means".into(),
            points: pts,
        }],
        &[Series {
            name: String::new(),
            points: runs,
        }],
    )?;
    Ok(())
}

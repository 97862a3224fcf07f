//! `ibjitter study` output: `summary.json` (the figures), `summary.md` (the same for people:
//! first why it is incomplete, if it is, then the verdict) and three SVG plots: the metric against the injected sd at each
//! fixed mean (`sd.svg`), against the injected mean (`mean.svg`), and every configuration's
//! runs (`runs.svg`); a tolerance study's part is `export::tolerance`.
use super::tolerance;
use crate::report::figures::{self, figure};
use crate::report::plot::{scatter_chart, strip_chart, Series};
use crate::study::plan::Plan;
use crate::study::record::{counted, counted_metrics, Row};
use crate::study::stats::ALPHA;
use crate::study::stopping::Ending;
use crate::study::summary::{ConfigSummary, Correlation, Summary};
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

/// ` [lo, hi]` after a figure, or nothing when there is no interval.
fn interval(ci: [f64; 2], significant: usize) -> String {
    if ci[0].is_finite() && ci[1].is_finite() {
        format!(" {}", figures::interval(ci, significant))
    } else {
        String::new()
    }
}

/// Why a study is not complete, first thing in its summary: what its figures are of.
fn incomplete(s: &Summary) -> Option<String> {
    let sweep = s.tolerance.is_some();
    match s.ending {
        Ending::Complete => None,
        Ending::Interrupted => Some(format!(
            "**Incomplete:** the study was interrupted: these figures are of the runs so far{}. \
             Re-run the same command to continue it.",
            if sweep {
                " (a target not reached is not reached so far)"
            } else {
                ""
            }
        )),
        Ending::CapReached => Some(format!(
            "**Incomplete:** `--until-ci` reached its cap before these intervals were within \
             the target: {}. {}",
            s.capped.join(", "),
            if sweep {
                "The sweep went on from them; a sweep's stopping rule cannot change (its \
                 choices rest on it): a new study (another `--out`) with a larger `--max-reps` \
                 narrows them."
            } else {
                "Re-run with a larger `--max-reps` to continue the study."
            }
        )),
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
    ];
    if let Some(text) = incomplete(s) {
        md.push(text);
        md.push(String::new());
    }
    if let Some(c) = &s.correlation {
        md.push(format!("**Verdict:** {}.", c.verdict));
        md.push(String::new());
    }
    if let Some(t) = &s.tolerance {
        for line in tolerance::sentences(t) {
            md.push(line);
            md.push(String::new());
        }
    }
    md.extend([
        "| configuration | kind | injected mean µs | injected sd µs | runs | mean | sd | median | 95 % CI ± | slowdown [95 % CI] | tail slowdown | drawn mean µs |".to_string(),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_string(),
    ]);
    for c in &s.configurations {
        md.push(row(c));
    }
    md.push(String::new());
    if let Some(c) = s
        .correlation
        .as_ref()
        .filter(|c| c.r_mean.is_finite() || c.r_sd.is_finite())
    {
        md.push(correlations(c));
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
    if has_tables(s) && s.correlation.is_some() {
        md.push("![metric vs injected sd](sd.svg)".to_string());
        md.push("![metric vs injected mean](mean.svg)".to_string());
    }
    md.push("![every run](runs.svg)".to_string());
    md.push(String::new());
    md.join("\n")
}

/// The correlation paragraph (only when the injected delays varied).
fn correlations(c: &Correlation) -> String {
    format!(
        "Over the {} clean and table runs: Pearson r of the metric vs the injected mean \
         **r_mean = {}** (p = {}), vs the injected sd **r_sd = {}** (p = {}); Fisher's z of r_sd \
         vs r_mean **z = {}**, two-sided p = {} (α = {ALPHA}).",
        c.correlation_runs,
        figure(c.r_mean, 3),
        figure(c.p_r_mean, 3),
        figure(c.r_sd, 3),
        figure(c.p_r_sd, 3),
        figure(c.fisher_z, 3),
        figure(c.p_value, 3),
    )
}

fn row(c: &ConfigSummary) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {}{} | {} |",
        c.name,
        c.kind,
        figure(c.table_mean_us, 3),
        figure(c.table_sd_us, 3),
        c.runs,
        figure(c.mean, 5),
        figure(c.sd, 3),
        figure(c.median, 5),
        figure(c.ci95, 3),
        figure(c.slowdown, 4),
        interval(c.slowdown_ci95, 4),
        figure(c.tail_slowdown, 4),
        interval(c.tail_slowdown_ci95, 4),
        figure(c.injected_mean_us, 3),
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
    // A tolerance sweep's delays are its design: its own plots show them against its lines.
    if let Some(c) = s.correlation.as_ref().filter(|_| has_tables(s)) {
        delay_plots(s, c, rows, dir)?;
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
fn delay_plots(s: &Summary, corr: &Correlation, rows: &[Row], dir: &Path) -> Result<(), String> {
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
            figure(corr.r_sd, 2)
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
        &format!(
            "metric vs injected mean (r_mean = {})",
            figure(corr.r_mean, 2)
        ),
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

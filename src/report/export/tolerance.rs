//! A tolerance study's part of the study's output: its sentences and fitted lines in
//! `summary.md`, and the plots of slowdown against the added mean (`tolerance.svg`) and
//! against the sd at the sd sweep's mean (`tolerance-sd.svg`), each with its runs, the
//! fitted line and the targets.
use crate::report::plot::{scatter_chart_with, Extras, Series};
use crate::study::record::Row;
use crate::study::tolerance::{mean_pairs, num, sd_pairs, AxisSummary, ToleranceSummary};
use crate::table::family::percent;
use std::path::Path;

/// The sentences, one per line swept, for the top of summary.md.
pub fn sentences(t: &ToleranceSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = &t.mean {
        out.push(format!(
            "**Tolerance (mean):** {} Runtime grows by {} added.",
            m.sentence,
            slope_words(m)
        ));
    }
    if let Some(s) = &t.sd {
        out.push(format!("**Tolerance (sd):** {}", s.sentence));
    }
    out
}

fn ci(c: [f64; 2]) -> String {
    format!("[{}, {}]", num(c[0]), num(c[1]))
}

/// A figure of any size: three significant digits, in scientific notation when very small
/// or large (a runtime in seconds grows by 1e-5 per µs).
fn fig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || (0.01..1e6).contains(&v.abs()) {
        num(v)
    } else {
        format!("{v:.2e}")
    }
}

/// The slope in words: µs of runtime per µs when the metric's unit is known.
fn slope_words(a: &AxisSummary) -> String {
    if a.slope_us_per_us.is_finite() {
        format!(
            "{} µs per µs {}",
            num(a.slope_us_per_us),
            ci(a.slope_us_per_us_ci95)
        )
    } else {
        format!(
            "{} per µs [{}, {}]",
            fig(a.slope),
            fig(a.slope_ci95[0]),
            fig(a.slope_ci95[1])
        )
    }
}

/// The fitted lines and crossings in tables, what was fitted, and the plots.
pub fn markdown(t: &ToleranceSummary) -> Vec<String> {
    let axes: Vec<(&str, &AxisSummary)> = [("mean", &t.mean), ("sd", &t.sd)]
        .into_iter()
        .filter_map(|(n, a)| a.as_ref().map(|a| (n, a)))
        .collect();
    let mut md = vec![
        "## Tolerance".to_string(),
        String::new(),
        "| line | x | runs | points | swept to µs | intercept | slope per µs [95 % CI] | µs of runtime per µs [95 % CI] | residual sd |".to_string(),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_string(),
    ];
    for (name, a) in &axes {
        md.push(format!(
            "| {name} | {} | {} | {} | {} | {} | {} [{}, {}] | {} {} | {} |",
            a.x,
            a.runs,
            a.points,
            num(a.swept_to_us),
            fig(a.intercept),
            fig(a.slope),
            fig(a.slope_ci95[0]),
            fig(a.slope_ci95[1]),
            num(a.slope_us_per_us),
            ci(a.slope_us_per_us_ci95),
            fig(a.residual_sd),
        ));
    }
    md.push(String::new());
    md.push("| line | target | crossing µs | 95 % CI | within the sweep |".to_string());
    md.push("| --- | ---: | ---: | ---: | --- |".to_string());
    for (name, a) in &axes {
        for c in &a.crossings {
            md.push(format!(
                "| {name} | {} % | {} | {} | {} |",
                percent(c.target),
                num(c.at_us),
                ci(c.ci95),
                if c.reached { "yes" } else { "no: not reached" }
            ));
        }
    }
    md.push(String::new());
    md.push(
        "Fitted: runtime as a straight line in the added latency, by ordinary least squares \
         over the runs (the mean line: runs under constant delays, the zero delay at 0, so the \
         injector's own cost is not taken for latency; the sd line: runs under tables at the \
         sd sweep's mean, its constant delay at 0). The slope's \
         interval is Student's t with n − 2 degrees of freedom; in µs of runtime per µs added \
         it is the number of latency-bound messages on the critical path (LLAMP's model: \
         runtime piecewise linear in latency). A target p is crossed where the line reaches \
         (1 + p) × its intercept (for the sd: over the constant delay at that mean); its \
         interval is Fieller's. Beyond the largest point swept a target is not reached."
            .to_string(),
    );
    md.push(String::new());
    if t.mean.is_some() {
        md.push("![slowdown vs added latency](tolerance.svg)".to_string());
    }
    if t.sd.is_some() {
        md.push("![slowdown vs sd at the sweep's mean](tolerance-sd.svg)".to_string());
    }
    md.push(String::new());
    md
}

/// tolerance.svg and tolerance-sd.svg, for the lines swept.
pub fn plots(t: &ToleranceSummary, rows: &[Row], dir: &Path) -> Result<(), String> {
    if let Some(a) = &t.mean {
        let (xs, ys) = mean_pairs(rows);
        plot(
            &dir.join("tolerance.svg"),
            "slowdown vs added constant delay per message",
            (
                "added delay (µs)",
                "runtime / fitted runtime at +0 µs (the zero delay)",
            ),
            a,
            &xs,
            &ys,
        )?;
    }
    if let Some(a) = &t.sd {
        let (xs, ys) = sd_pairs(rows, a.at_mean_us);
        plot(
            &dir.join("tolerance-sd.svg"),
            &format!("slowdown vs delay sd at +{} µs mean", num(a.at_mean_us)),
            (
                "delay sd (µs)",
                "runtime / fitted runtime at sd 0 (the constant delay)",
            ),
            a,
            &xs,
            &ys,
        )?;
    }
    Ok(())
}

/// Every run and each point's mean over the line's intercept, the fitted line, each target
/// and where the line crosses it.
fn plot(
    path: &Path,
    title: &str,
    labels: (&str, &str),
    a: &AxisSummary,
    xs: &[f64],
    ys: &[f64],
) -> Result<(), String> {
    let base = a.intercept;
    let mut points: Vec<(f64, Vec<f64>)> = Vec::new();
    for (&x, &y) in xs.iter().zip(ys) {
        match points.iter_mut().find(|p| p.0 == x) {
            Some(p) => p.1.push(y),
            None => points.push((x, vec![y])),
        }
    }
    points.sort_by(|p, q| p.0.total_cmp(&q.0));
    let means: Vec<(f64, f64)> = points
        .iter()
        .map(|(x, v)| (*x, v.iter().sum::<f64>() / v.len() as f64 / base))
        .collect();
    let x_end = a.swept_to_us;
    let fitted = if base.is_finite() && a.slope.is_finite() {
        vec![(0.0, 1.0), (x_end, (base + a.slope * x_end) / base)]
    } else {
        Vec::new()
    };
    let fits = [Series {
        name: "fitted line".into(),
        points: fitted,
    }];
    let lines = [Series {
        name: "mean of the runs at each point (runs: circles)".into(),
        points: means,
    }];
    let dots = [Series {
        name: String::new(),
        points: xs.iter().zip(ys).map(|(&x, &y)| (x, y / base)).collect(),
    }];
    let mut guides = Vec::new();
    for c in &a.crossings {
        let level = 1.0 + c.target;
        guides.push(Series {
            name: format!("{} % slower", percent(c.target)),
            points: vec![(0.0, level), (x_end, level)],
        });
        if c.reached {
            guides.push(Series {
                name: String::new(),
                points: vec![(c.at_us, 1.0), (c.at_us, level)],
            });
        }
    }
    let title = format!("{title}: slope {}", slope_words(a));
    let extras = Extras {
        fits: &fits,
        guides: &guides,
        y_from_zero: false,
        legend_left: true,
    };
    scatter_chart_with(path, &title, labels, (&lines, &dots), &extras)
}

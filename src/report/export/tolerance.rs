//! A tolerance study's part of the study's output: its sentences and fitted lines in
//! `summary.md`, and the plots of the slowdown against the added mean (`tolerance.svg`) and
//! against the sd at the sd sweep's mean (`tolerance-sd.svg`), each with its runs, its points,
//! the fitted line and the targets.
use crate::report::figures::{figure, interval};
use crate::report::plot::{scatter_chart_with, Extras, Series};
use crate::study::record::Row;
use crate::study::tolerance::{line_data, AxisSummary, CrossingSummary, ToleranceSummary};
use crate::table::family::percent;
use std::path::Path;

/// The sentences, one per line swept, for the top of summary.md.
pub fn sentences(t: &ToleranceSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = &t.mean {
        let slope = if m.slope.is_finite() {
            format!(" Runtime per µs added: {}.", slope_words(m))
        } else {
            String::new()
        };
        out.push(format!("**Tolerance (mean):** {}{slope}", m.sentence));
    }
    if let Some(s) = &t.sd {
        out.push(format!("**Tolerance (sd):** {}", s.sentence));
    }
    out
}

/// The slope in words: µs of runtime per µs when the metric's unit is known, else the
/// slowdown in % per µs.
fn slope_words(a: &AxisSummary) -> String {
    let (v, ci, unit) = if a.slope_us_per_us.is_finite() {
        (a.slope_us_per_us, a.slope_us_per_us_ci95, "µs")
    } else {
        let ci = [100.0 * a.slope_ci95[0], 100.0 * a.slope_ci95[1]];
        (100.0 * a.slope, ci, "% slower")
    };
    let ci = if ci.iter().all(|c| c.is_finite()) {
        format!(" {}", interval(ci, 3))
    } else {
        " (no interval)".to_string()
    };
    format!("{} {unit}{ci}", figure(v, 3))
}

/// A crossing's interval in the table.
fn crossing_interval(c: &CrossingSummary) -> String {
    match c.interval {
        "between" => interval(c.ci95, 3),
        "at_least" => format!("[≥ {}]", figure(c.ci95[0], 3)),
        "nowhere" => "none: the slowdown does not rise".into(),
        _ => "none: one point".into(),
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
        "| line | x | runs | points | swept to µs | base [95 % CI] | slowdown % per µs [95 % CI] | df | µs of runtime per µs [95 % CI] | lack of fit |".to_string(),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |".to_string(),
    ];
    for (name, a) in &axes {
        let lack = match &a.lack_of_fit {
            None => "not tested".to_string(),
            Some(l) => format!(
                "F = {} ({}, {} df), p = {}{}",
                figure(l.f, 3),
                l.df[0],
                l.df[1],
                figure(l.p, 2),
                if l.off_line { ": off a line" } else { "" }
            ),
        };
        md.push(format!(
            "| {name} | {} | {} | {} | {} | {} {} | {} {} | {} | {} {} | {lack} |",
            a.x,
            a.runs,
            a.points,
            figure(a.swept_to_us, 3),
            figure(a.base, 4),
            interval(a.base_ci95, 4),
            figure(100.0 * a.slope, 3),
            interval([100.0 * a.slope_ci95[0], 100.0 * a.slope_ci95[1]], 3),
            a.df,
            figure(a.slope_us_per_us, 3),
            interval(a.slope_us_per_us_ci95, 3),
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
                figure(c.at_us, 3),
                crossing_interval(c),
                if c.reached { "yes" } else { "no: not reached" }
            ));
        }
    }
    md.push(String::new());
    md.push(
        "Fitted: each run's slowdown over the reference runs of its own round (the mean line: \
         runs under constant delays over the zero delay's, the injector loaded and nothing \
         added; the sd line: runs under tables at the sd sweep's mean over the constant delay \
         there), so a machine's drift between steps is not read as latency; then a line \
         through the origin, slowdown = slope × x, fitted to each point's mean slowdown. The \
         points are the independent observations: the slope's interval is Student's t with \
         points − 1 degrees of freedom, and the lack-of-fit test compares the points' scatter \
         about the line with what their runs' scatter predicts (off a line: the runtime is \
         piecewise linear in latency within the sweep). The base is the reference runs' mean \
         metric; µs of runtime per µs is the slope times the base (the interval: both \
         intervals' product), for the mean line the number of latency-bound messages on the \
         critical path (LLAMP's model). A target p is crossed at x = p / slope; its interval \
         is the slope's inverted (Fieller's for a known numerator): bounded below only when \
         the slope's interval reaches 0. Beyond the largest point swept a target is not \
         reached."
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
        plot(
            &dir.join("tolerance.svg"),
            "slowdown vs added constant delay per message",
            (
                "added delay (µs)",
                "runtime / its round's zero-delay runtime",
            ),
            a,
            rows,
        )?;
    }
    if let Some(a) = &t.sd {
        plot(
            &dir.join("tolerance-sd.svg"),
            &format!(
                "slowdown vs delay sd at +{} µs mean",
                figure(a.at_mean_us.unwrap_or(f64::NAN), 3)
            ),
            (
                "delay sd (µs)",
                "runtime / its round's constant-delay runtime",
            ),
            a,
            rows,
        )?;
    }
    Ok(())
}

/// Every run's runtime over its reference and each point's mean, the fitted line, each
/// target and where the line crosses it.
fn plot(
    path: &Path,
    title: &str,
    labels: (&str, &str),
    a: &AxisSummary,
    rows: &[Row],
) -> Result<(), String> {
    let data = line_data(a.kind, rows);
    let mut means = vec![(0.0, 1.0)];
    means.extend(data.points.iter().map(|p| {
        (
            p.x,
            1.0 + p.values.iter().sum::<f64>() / p.values.len() as f64,
        )
    }));
    let x_end = a.swept_to_us;
    let fitted = if a.slope.is_finite() && x_end.is_finite() {
        vec![(0.0, 1.0), (x_end, 1.0 + a.slope * x_end)]
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
        points: data
            .points
            .iter()
            .flat_map(|p| p.values.iter().map(|v| (p.x, 1.0 + v)))
            .collect(),
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
    let title = if a.slope.is_finite() {
        format!("{title}: {} per µs", slope_words(a))
    } else {
        title.to_string()
    };
    let extras = Extras {
        fits: &fits,
        guides: &guides,
        y_from_zero: false,
        legend_left: true,
    };
    scatter_chart_with(path, &title, labels, (&lines, &dots), &extras)
}

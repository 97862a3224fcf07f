//! What a tolerance study found, from its rows alone: how much added latency, and how much
//! spread at a given mean, the program absorbs before it slows by each target.
//!
//! The runtime is modelled as LLAMP models it, linear in the latency added per message (its
//! slope is the number of latency-bound messages on the critical path; piecewise linear
//! overall, so the sweep stays near the targets' crossings). Two straight lines are fitted by
//! ordinary least squares over the runs themselves ([`LineFit`]):
//! - the **mean** line: the metric of every counted run under a constant delay (a table with
//!   sd 0, the sweep's zero delay included), against the delay in µs. Its x = 0 is the zero
//!   delay, not the clean runs: with the injector loaded, so that its own cost (loading,
//!   calibrating its clock at the first send, a few ns per send) is not taken for latency;
//! - the **sd** line: the metric of every counted run under a table whose mean is within 1 %
//!   of the sd sweep's mean (its constant delay at x = 0, the family's lognormals), against
//!   the table's sd in µs.
//!
//! A target p is crossed where a line reaches (1 + p) × its intercept: for the mean, p over
//! the program under the injector with no delay added; for the sd, p over the constant delay
//! at that mean.
use super::linefit::{Crossing, LineFit};
use super::plan::{Plan, Tolerance};
use super::record::Row;
use crate::table::family::percent;
use serde::Serialize;

/// Tables whose mean is within this share of the sd sweep's mean are at that mean.
pub const SAME_MEAN: f64 = 0.01;

/// The mean line's pairs (added mean µs, metric): runs under constant delays, zero included.
pub fn mean_pairs(rows: &[Row]) -> (Vec<f64>, Vec<f64>) {
    rows.iter()
        .filter(|r| r.counts() && r.kind == "table" && r.table_sd_us == 0.0)
        .map(|r| (r.table_mean_us, r.metric))
        .unzip()
}

/// The sd line's pairs (sd µs, metric): runs under tables at `mean_us`.
pub fn sd_pairs(rows: &[Row], mean_us: f64) -> (Vec<f64>, Vec<f64>) {
    rows.iter()
        .filter(|r| r.counts() && r.kind == "table")
        .filter(|r| (r.table_mean_us - mean_us).abs() <= SAME_MEAN * mean_us)
        .map(|r| (r.table_sd_us, r.metric))
        .unzip()
}

/// A target's crossing as reported.
#[derive(Debug, Clone, Serialize)]
pub struct CrossingSummary {
    pub target: f64,
    /// The added mean (or sd) in µs at which the fitted line crosses the target.
    pub at_us: f64,
    /// Fieller's 95 % interval (null bounds: not bounded, the slope is not resolved).
    pub ci95: [f64; 2],
    /// Whether the crossing lies within the swept range (else: not reached).
    pub reached: bool,
}

/// One fitted line and its crossings.
#[derive(Debug, Clone, Serialize)]
pub struct AxisSummary {
    /// What x is.
    pub x: String,
    /// The sd line's mean, µs (null for the mean line).
    pub at_mean_us: f64,
    /// Runs in the fit and distinct x values among them.
    pub runs: usize,
    pub points: usize,
    /// The largest x measured, µs.
    pub swept_to_us: f64,
    pub intercept: f64,
    /// The metric's growth per µs of x, with its 95 % interval (Student's t, n − 2 df).
    pub slope: f64,
    pub slope_ci95: [f64; 2],
    /// The slope as µs of runtime per µs added, when the metric's unit is known: for the mean
    /// line LLAMP's count of latency-bound messages on the critical path.
    pub slope_us_per_us: f64,
    pub slope_us_per_us_ci95: [f64; 2],
    pub residual_sd: f64,
    pub crossings: Vec<CrossingSummary>,
    /// The tolerances in one sentence.
    pub sentence: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToleranceSummary {
    pub targets: Vec<f64>,
    /// The mean line (null when only the sd was swept).
    pub mean: Option<AxisSummary>,
    /// The sd line (null when only the mean was swept).
    pub sd: Option<AxisSummary>,
}

/// The tolerance figures of a tolerance study's rows; `None` for other studies.
pub fn summarize(plan: &Plan, rows: &[Row]) -> Option<ToleranceSummary> {
    let t = plan.tolerance.as_ref()?;
    let mean = t.sweep.mean().then(|| {
        let (xs, ys) = mean_pairs(rows);
        axis(
            t,
            "added constant delay per message (µs)",
            f64::NAN,
            &xs,
            &ys,
        )
    });
    let sd = t.sweep.sd().then(|| {
        let m = t.sd_mean_ns / 1e3;
        let (xs, ys) = sd_pairs(rows, m);
        axis(
            t,
            &format!("delay sd at +{} µs mean (µs)", num(m)),
            m,
            &xs,
            &ys,
        )
    });
    Some(ToleranceSummary {
        targets: t.targets.clone(),
        mean,
        sd,
    })
}

fn axis(t: &Tolerance, x: &str, at_mean_us: f64, xs: &[f64], ys: &[f64]) -> AxisSummary {
    let mut distinct: Vec<f64> = xs.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let fit = LineFit::ols(xs, ys);
    let crossings: Vec<Crossing> = match &fit {
        Some(f) => t.targets.iter().map(|&p| f.crossing(p)).collect(),
        None => Vec::new(),
    };
    let unit = t.metric_unit_us.unwrap_or(f64::NAN);
    let nan2 = [f64::NAN; 2];
    let (intercept, slope, slope_ci95, residual_sd) = fit
        .as_ref()
        .map_or((f64::NAN, f64::NAN, nan2, f64::NAN), |f| {
            (f.intercept, f.slope, f.slope_ci95, f.residual_sd)
        });
    let swept_to = distinct.last().copied().unwrap_or(f64::NAN);
    let sentence = if at_mean_us.is_nan() {
        mean_sentence(fit.as_ref(), &crossings, swept_to)
    } else {
        sd_sentence(fit.as_ref(), &crossings, swept_to, at_mean_us)
    };
    AxisSummary {
        x: x.to_string(),
        at_mean_us,
        runs: xs.len(),
        points: distinct.len(),
        swept_to_us: swept_to,
        intercept,
        slope,
        slope_ci95,
        slope_us_per_us: slope * unit,
        slope_us_per_us_ci95: [slope_ci95[0] * unit, slope_ci95[1] * unit],
        residual_sd,
        crossings: crossings
            .iter()
            .map(|c| CrossingSummary {
                target: c.target,
                at_us: c.at,
                ci95: c.ci95,
                reached: c.reached,
            })
            .collect(),
        sentence,
    }
}

/// A figure with three significant digits (no exponent); `–` when not finite.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    // Decided on the value as rounded (9.9996 is "10.0", not "10.00").
    let digits = match v.abs() {
        a if a >= 99.95 => 0,
        a if a >= 9.995 => 1,
        a if a >= 0.9995 => 2,
        _ => 3,
    };
    format!("{v:.digits$}")
}

/// `[lo, hi]`, or `[interval not bounded]`.
fn interval(ci: [f64; 2]) -> String {
    if ci[0].is_finite() && ci[1].is_finite() {
        format!("[{}, {}]", num(ci[0]), num(ci[1]))
    } else {
        "[interval not bounded]".into()
    }
}

/// Targets as words: `5 %`, `5 % and 10 %`, `1 %, 5 % and 10 %`.
fn targets_in_words(cs: &[&Crossing]) -> String {
    let p: Vec<String> = cs
        .iter()
        .map(|c| format!("{} %", percent(c.target)))
        .collect();
    match p.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// The crossings reached and those not (targets ascending: the reached ones come first).
fn split(crossings: &[Crossing]) -> (Vec<&Crossing>, Vec<&Crossing>) {
    crossings.iter().partition(|c| c.reached)
}

fn mean_sentence(fit: Option<&LineFit>, crossings: &[Crossing], swept_to: f64) -> String {
    if fit.is_none() || crossings.is_empty() {
        return "Mean: too few runs under constant delays to fit a line.".into();
    }
    let (reached, not) = split(crossings);
    if reached.is_empty() {
        return format!(
            "Slows less than {} with up to +{} µs per message (> {} µs: not reached).",
            targets_in_words(&not[..1]),
            num(swept_to),
            num(swept_to)
        );
    }
    let parts: Vec<String> = reached
        .iter()
        .enumerate()
        .map(|(k, c)| {
            format!(
                "+{} µs {}{} before slowing {} %",
                num(c.at),
                interval(c.ci95),
                if k == 0 { " per message" } else { "" },
                percent(c.target)
            )
        })
        .collect();
    let rest = if !not.is_empty() {
        format!(
            "; {}: > {} µs, not reached",
            targets_in_words(&not),
            num(swept_to)
        )
    } else {
        String::new()
    };
    format!("Tolerates {}{rest}.", parts.join(", "))
}

fn sd_sentence(
    fit: Option<&LineFit>,
    crossings: &[Crossing],
    swept_to: f64,
    at_mean_us: f64,
) -> String {
    if fit.is_none() || crossings.is_empty() {
        return format!(
            "Sd: too few runs at +{} µs mean to fit a line.",
            num(at_mean_us)
        );
    }
    let (reached, not) = split(crossings);
    if reached.is_empty() {
        return format!(
            "At +{} µs mean, an sd up to {} µs costs less than {} over the constant delay \
             (> {} µs: not reached).",
            num(at_mean_us),
            num(swept_to),
            targets_in_words(&not[..1]),
            num(swept_to)
        );
    }
    let parts: Vec<String> = reached
        .iter()
        .map(|c| {
            format!(
                "beyond {} µs {} costs {} %",
                num(c.at),
                interval(c.ci95),
                percent(c.target)
            )
        })
        .collect();
    let rest = if !not.is_empty() {
        format!(
            "; {}: > {} µs, not reached",
            targets_in_words(&not),
            num(swept_to)
        )
    } else {
        String::new()
    };
    format!(
        "At +{} µs mean, an sd {} over the constant delay{rest}.",
        num(at_mean_us),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::plan::{Configuration, Perturbation, Stopping, Swept};

    fn row(run: usize, kind: &str, mean: f64, sd: f64, metric: f64) -> Row {
        Row {
            table_mean_us: mean,
            table_sd_us: sd,
            delayed: 1,
            ..Row::counted(run, &format!("{kind}-{mean}-{sd}"), kind, metric)
        }
    }

    fn plan(sweep: Swept) -> Plan {
        Plan {
            command: vec!["app".into()],
            configurations: vec![Configuration {
                name: "clean".into(),
                perturbation: Perturbation::Clean,
            }],
            seed: 1,
            warmup: 0,
            stopping: Stopping::Reps(3),
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: Some(Tolerance {
                targets: vec![0.01, 0.05, 0.5],
                sweep,
                mean_start_ns: 10e3,
                mean_max_ns: 100e3,
                sd_mean_ns: 20e3,
                sd_base_shape: 0.5,
                sd_base_scale_ns: 1e3,
                sd_base_loc_ns: 0.0,
                metric_unit_us: Some(1.0),
            }),
        }
    }

    #[test]
    fn runtime_base_plus_k_per_us_gives_k_and_its_crossings() {
        // runtime (µs) = 1000 + 20 × mean + 2 × sd at the sd sweep's mean, small noise.
        let noise = [0.5, -0.3, -0.2];
        let mut rows = Vec::new();
        for (k, e) in noise.iter().enumerate() {
            // A clean run, slower than the zero delay: the line does not see it.
            rows.push(row(rows.len(), "clean", 0.0, 0.0, 900.0 + e));
            rows.push(row(rows.len(), "table", 0.0, 0.0, 1000.0 + e));
            for m in [10.0, 20.0, 50.0] {
                rows.push(row(rows.len(), "table", m, 0.0, 1000.0 + 20.0 * m + e));
            }
            for sd in [10.0, 40.0, 120.0] {
                let y = 1000.0 + 20.0 * 20.0 + 2.0 * sd + noise[(k + 1) % 3];
                rows.push(row(rows.len(), "table", 20.0, sd, y));
            }
        }
        let s = summarize(&plan(Swept::Both), &rows).unwrap();
        let m = s.mean.unwrap();
        // The zero delay, 3 constant delays: 12 runs; the sd line's constant delay is one.
        assert_eq!((m.runs, m.points), (12, 4));
        assert!(m.slope_ci95[0] < 20.0 && 20.0 < m.slope_ci95[1], "{m:?}");
        assert!((m.slope - 20.0).abs() < 0.05);
        // 1 % of 1000 at 20 per µs: 0.5 µs; 5 %: 2.5 µs; 50 %: 25 µs; all within 50 µs.
        for (c, want) in m.crossings.iter().zip([0.5, 2.5, 25.0]) {
            assert!(c.reached && c.ci95[0] < want && want < c.ci95[1], "{c:?}");
        }
        assert!(
            m.sentence.starts_with("Tolerates +0.500 µs ["),
            "{}",
            m.sentence
        );
        assert!(m
            .sentence
            .contains("] per message before slowing 1 %, +2.50 µs ["));
        assert!(
            m.sentence.ends_with("before slowing 50 %."),
            "{}",
            m.sentence
        );
        let sd = s.sd.unwrap();
        assert_eq!((sd.runs, sd.points), (12, 4));
        assert!(sd.slope_ci95[0] < 2.0 && 2.0 < sd.slope_ci95[1], "{sd:?}");
        // Over 1400 at sd 0, 2 per µs of sd: 1 % at 7 µs, 5 % at 35, 50 % at 350 > 120.
        let c = &sd.crossings;
        assert!(c[1].ci95[0] < 35.0 && 35.0 < c[1].ci95[1], "{c:?}");
        assert!(!c[2].reached);
        assert!(
            sd.sentence
                .starts_with("At +20.0 µs mean, an sd beyond 7.00 µs ["),
            "{}",
            sd.sentence
        );
        assert!(
            sd.sentence
                .ends_with("costs 5 % over the constant delay; 50 %: > 120 µs, not reached."),
            "{}",
            sd.sentence
        );
    }

    #[test]
    fn only_the_swept_kind_is_reported_and_too_few_runs_say_so() {
        let rows = vec![row(0, "clean", 0.0, 0.0, 5.0)];
        let s = summarize(&plan(Swept::Mean), &rows).unwrap();
        assert!(s.sd.is_none());
        let m = s.mean.unwrap();
        assert!(m.slope.is_nan() && m.crossings.is_empty());
        assert!(m.sentence.contains("too few runs"), "{}", m.sentence);
        // A program that does not slow down: nothing reached, said in one sentence.
        let mut flat = Vec::new();
        for (k, m) in [0.0, 0.0, 10.0, 10.0, 50.0, 50.0].iter().enumerate() {
            flat.push(row(k, "table", *m, 0.0, 5.0 + 0.01 * (k % 2) as f64));
        }
        let m = summarize(&plan(Swept::Mean), &flat).unwrap().mean.unwrap();
        assert!(m.crossings.iter().all(|c| !c.reached), "{m:?}");
        assert_eq!(
            m.sentence,
            "Slows less than 1 % with up to +50.0 µs per message (> 50.0 µs: not reached)."
        );
        let mut p = plan(Swept::Sd);
        assert!(summarize(&p, &rows).unwrap().mean.is_none());
        p.tolerance = None;
        assert!(summarize(&p, &rows).is_none());
    }
}

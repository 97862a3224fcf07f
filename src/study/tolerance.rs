//! What a tolerance study found, from its rows alone: how much added latency, and how much
//! spread at a given mean, the program absorbs before it slows by each target.
//!
//! Two lines, each runs against an x with a reference at x = 0 ([`LineKind`]):
//! - the **mean** line: runs under a constant delay (a table of sd 0), x the delay in µs; its
//!   reference the zero delay (the injector loaded, nothing added: its own cost is not taken
//!   for latency);
//! - the **sd** line: runs under a table whose mean is within 1 % of the sd sweep's mean, x
//!   the table's sd in µs; its reference the constant delay at that mean.
//!
//! Every step of a sweep runs both references in each of its rounds, interleaved with the
//! step's points. A run's **slowdown** is its metric over the mean of its own round's
//! reference runs, less 1: a machine whose speed drifts between steps or rounds moves a run
//! and its reference together, so the drift is not read as latency. A run whose round has no
//! counted reference run is left out, and the summary says so.
//!
//! The runtime is modelled as LLAMP models it, linear in the latency added per message (the
//! slope: the latency-bound messages on the critical path), so the slowdown is a line through
//! the origin fitted to the points ([`LineFit`]), and a target p is crossed where it reaches
//! p. In µs of runtime per µs, the slope is the fitted one times the reference runs' mean
//! (the base), its interval the product of the two intervals (conservative).
use super::linefit::{Crossing, Interval, LineFit, Point};
use super::plan::{Plan, Tolerance};
use super::record::Row;
use super::stats::{ci95_half, mean};
use crate::report::figures::figure;
use crate::table::family::percent;
use serde::Serialize;
use std::collections::BTreeMap;

/// Tables whose mean is within this share of the sd sweep's mean are at that mean.
pub const SAME_MEAN: f64 = 0.01;

/// Which line: what its x is and what its reference is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LineKind {
    /// Constant delays against the delay; the zero delay as the reference.
    Mean,
    /// Tables at this mean (µs) against their sd; the constant delay there as the reference.
    Sd { at_mean_us: f64 },
}

impl LineKind {
    /// The x (µs) of a table of this mean and sd on this line, or `None` when it is not on it.
    pub fn x(self, mean_us: f64, sd_us: f64) -> Option<f64> {
        match self {
            LineKind::Mean => (sd_us == 0.0).then_some(mean_us),
            LineKind::Sd { at_mean_us } => {
                ((mean_us - at_mean_us).abs() <= SAME_MEAN * at_mean_us).then_some(sd_us)
            }
        }
    }

    fn x_of_row(self, r: &Row) -> Option<f64> {
        if r.kind == "table" {
            self.x(r.table_mean_us, r.table_sd_us)
        } else {
            None
        }
    }

    /// `mean` or `sd`.
    pub fn name(self) -> &'static str {
        match self {
            LineKind::Mean => "mean",
            LineKind::Sd { .. } => "sd",
        }
    }

    /// The reference run in words.
    fn reference(self) -> String {
        match self {
            LineKind::Mean => "zero-delay run".into(),
            LineKind::Sd { at_mean_us } => format!("constant +{} µs run", figure(at_mean_us, 3)),
        }
    }

    /// An x in a sentence: `+12.0 µs` added, or an sd of `12.0 µs`.
    fn at(self, x: f64) -> String {
        match self {
            LineKind::Mean => format!("+{} µs", figure(x, 3)),
            LineKind::Sd { .. } => format!("{} µs", figure(x, 3)),
        }
    }
}

/// A line's runs: the slowdowns of each point (x > 0, ascending), the reference runs' metrics,
/// and how many runs had no counted reference in their round.
#[derive(Debug, Clone, PartialEq)]
pub struct LineData {
    pub points: Vec<Point>,
    pub reference: Vec<f64>,
    pub left_out: usize,
}

/// The counted runs on `kind`'s line, each over its round's reference runs.
pub fn line_data(kind: LineKind, rows: &[Row]) -> LineData {
    let on: Vec<(&Row, f64)> = rows
        .iter()
        .filter(|r| r.counts())
        .filter_map(|r| kind.x_of_row(r).map(|x| (r, x)))
        .collect();
    let mut reference = Vec::new();
    let mut by_round: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (r, _) in on.iter().filter(|(_, x)| *x == 0.0) {
        reference.push(r.metric);
        if let Some(k) = r.round {
            by_round.entry(k).or_default().push(r.metric);
        }
    }
    let mut points: Vec<Point> = Vec::new();
    let mut left_out = 0;
    for (r, x) in on.iter().filter(|(_, x)| *x > 0.0) {
        let Some(base) = r.round.and_then(|k| by_round.get(&k)).map(|v| mean(v)) else {
            left_out += 1;
            continue;
        };
        let slowdown = r.metric / base - 1.0;
        match points.iter_mut().find(|p| p.x == *x) {
            Some(p) => p.values.push(slowdown),
            None => points.push(Point {
                x: *x,
                values: vec![slowdown],
            }),
        }
    }
    points.sort_by(|a, b| a.x.total_cmp(&b.x));
    LineData {
        points,
        reference,
        left_out,
    }
}

/// A target's crossing as reported.
#[derive(Debug, Clone, Serialize)]
pub struct CrossingSummary {
    pub target: f64,
    /// The x (µs) at which the fitted line reaches the target (null: the slope is not above 0).
    pub at_us: f64,
    /// Its 95 % interval: [low, high]; high null when bounded only below, both null when
    /// there is none.
    pub ci95: [f64; 2],
    /// `between`, `at_least`, `nowhere` (the slowdown does not rise) or `unknown` (one point).
    pub interval: &'static str,
    /// Whether `at_us` lies within the swept range (else: not reached).
    pub reached: bool,
}

/// The lack-of-fit test as reported.
#[derive(Debug, Clone, Serialize)]
pub struct LackOfFitSummary {
    pub f: f64,
    pub df: [usize; 2],
    pub p: f64,
    pub off_line: bool,
}

/// One fitted line and its crossings.
#[derive(Debug, Clone, Serialize)]
pub struct AxisSummary {
    #[serde(skip)]
    pub kind: LineKind,
    /// What x is.
    pub x: String,
    /// The sd line's mean, µs (absent for the mean line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_mean_us: Option<f64>,
    /// Runs in the fit (x > 0, with a reference in their round) and their distinct x values.
    pub runs: usize,
    pub points: usize,
    /// The reference's counted runs, and the runs left out for want of one in their round.
    pub reference_runs: usize,
    pub left_out_runs: usize,
    /// The largest x fitted, µs.
    pub swept_to_us: f64,
    /// The reference runs' mean metric and its 95 % interval: what a slowdown is relative to.
    pub base: f64,
    pub base_ci95: [f64; 2],
    /// The slowdown (a fraction) per µs of x, with its 95 % interval (Student's t, `df` =
    /// points − 1 degrees of freedom).
    pub slope: f64,
    pub slope_ci95: [f64; 2],
    pub df: usize,
    /// The slope as µs of runtime per µs, when the metric's unit is known: for the mean line
    /// LLAMP's count of latency-bound messages on the critical path.
    pub slope_us_per_us: f64,
    pub slope_us_per_us_ci95: [f64; 2],
    /// The points' mean slowdowns about the line.
    pub residual_sd: f64,
    /// Whether the points lie on a straight line (null: untested).
    pub lack_of_fit: Option<LackOfFitSummary>,
    pub crossings: Vec<CrossingSummary>,
    /// What to know before reading the line (also in the summary's warnings).
    pub warnings: Vec<String>,
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

impl ToleranceSummary {
    /// Both lines' warnings.
    pub fn warnings(&self) -> Vec<String> {
        [&self.mean, &self.sd]
            .into_iter()
            .flatten()
            .flat_map(|a| a.warnings.clone())
            .collect()
    }
}

/// The tolerance figures of a tolerance study's rows; `None` for other studies. `finished`:
/// the sweep ran its course (else a target not reached is not reached so far).
pub fn summarize(plan: &Plan, rows: &[Row], finished: bool) -> Option<ToleranceSummary> {
    let t = plan.tolerance.as_ref()?;
    let at_mean_us = t.sd_mean_ns / 1e3;
    let mean = t
        .sweep
        .mean()
        .then(|| axis(t, LineKind::Mean, rows, finished));
    let sd = t
        .sweep
        .sd()
        .then(|| axis(t, LineKind::Sd { at_mean_us }, rows, finished));
    Some(ToleranceSummary {
        targets: t.targets.clone(),
        mean,
        sd,
    })
}

/// The bounds of the product of two intervals (conservative: each holds its figure at 95 %).
fn product(a: [f64; 2], b: [f64; 2]) -> [f64; 2] {
    let p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]];
    [
        p.iter().copied().fold(f64::INFINITY, f64::min),
        p.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ]
}

fn axis(t: &Tolerance, kind: LineKind, rows: &[Row], finished: bool) -> AxisSummary {
    let data = line_data(kind, rows);
    // A slowdown is a ratio of times: a reference not above 0 is no time.
    let usable = data.reference.iter().all(|&m| m > 0.0);
    let fit = LineFit::fit(&data.points).filter(|_| usable);
    let crossings: Vec<Crossing> = match &fit {
        Some(f) => t.targets.iter().map(|&p| f.crossing(p)).collect(),
        None => Vec::new(),
    };
    let nan2 = [f64::NAN; 2];
    let base = mean(&data.reference);
    let half = ci95_half(&data.reference);
    let base_ci95 = [base - half, base + half];
    let unit = t.metric_unit_us.unwrap_or(f64::NAN);
    let (slope, slope_ci95, residual_sd, df) =
        fit.as_ref().map_or((f64::NAN, nan2, f64::NAN, 0), |f| {
            (f.slope, f.slope_ci95, f.residual_sd, f.points - 1)
        });
    let swept_to = fit.as_ref().map_or(f64::NAN, |f| f.x_max);
    let us = product(slope_ci95, base_ci95);
    let at_mean_us = match kind {
        LineKind::Mean => None,
        LineKind::Sd { at_mean_us } => Some(at_mean_us),
    };
    AxisSummary {
        kind,
        x: match kind {
            LineKind::Mean => "added constant delay per message (µs)".into(),
            LineKind::Sd { at_mean_us } => {
                format!("delay sd at +{} µs mean (µs)", figure(at_mean_us, 3))
            }
        },
        at_mean_us,
        runs: fit.as_ref().map_or(0, |f| f.runs),
        points: fit.as_ref().map_or(0, |f| f.points),
        reference_runs: data.reference.len(),
        left_out_runs: data.left_out,
        swept_to_us: swept_to,
        base,
        base_ci95,
        slope,
        slope_ci95,
        df,
        slope_us_per_us: slope * base * unit,
        slope_us_per_us_ci95: [us[0] * unit, us[1] * unit],
        residual_sd,
        lack_of_fit: fit
            .as_ref()
            .and_then(|f| f.lack_of_fit)
            .map(|l| LackOfFitSummary {
                f: l.f,
                df: [l.df.0, l.df.1],
                p: l.p,
                off_line: l.off_line(),
            }),
        crossings: crossings.iter().map(crossing_summary).collect(),
        warnings: warnings(kind, &data, usable, fit.as_ref()),
        sentence: sentence(kind, fit.as_ref(), usable, &crossings, finished),
    }
}

fn crossing_summary(c: &Crossing) -> CrossingSummary {
    let (ci95, interval) = match c.interval {
        Interval::Between(lo, hi) => ([lo, hi], "between"),
        Interval::AtLeast(lo) => ([lo, f64::NAN], "at_least"),
        Interval::Nowhere => ([f64::NAN; 2], "nowhere"),
        Interval::Unknown => ([f64::NAN; 2], "unknown"),
    };
    CrossingSummary {
        target: c.target,
        at_us: c.at,
        ci95,
        interval,
        reached: c.reached,
    }
}

/// What the line rests on, where that is less than its figures suggest.
fn warnings(kind: LineKind, data: &LineData, usable: bool, fit: Option<&LineFit>) -> Vec<String> {
    let line = format!("{} line", kind.name());
    let mut w = Vec::new();
    if !usable {
        w.push(format!(
            "{line}: a {}'s metric is not above 0, so not a time: no line fitted",
            kind.reference()
        ));
    }
    if data.left_out > 0 {
        w.push(format!(
            "{line}: {} runs left out of the fit: no {} counted in their round",
            data.left_out,
            kind.reference()
        ));
    }
    let Some(f) = fit else {
        return w;
    };
    if f.points == 1 {
        w.push(format!(
            "{line}: it rests on its reference and one point ({}): the slope has no interval, \
             and nothing shows that the runtime is linear",
            kind.at(f.x_max)
        ));
    }
    if let Some(l) = f.lack_of_fit.filter(|l| l.off_line()) {
        w.push(format!(
            "{line}: the points are off a straight line (lack of fit F = {} on {} and {} df, \
             p = {}): the slope changes within the sweep (runtime piecewise linear in \
             latency); read each crossing with the points near it (the plot)",
            figure(l.f, 3),
            l.df.0,
            l.df.1,
            figure(l.p, 2)
        ));
    }
    w
}

/// A crossing's 95 % interval in a sentence: `[lo, hi]`, `[≥ lo]` or `[no interval]`.
fn bracket(i: Interval) -> String {
    match i {
        Interval::Between(lo, hi) => format!("[{}, {}]", figure(lo, 3), figure(hi, 3)),
        Interval::AtLeast(lo) => format!("[≥ {}]", figure(lo, 3)),
        Interval::Nowhere | Interval::Unknown => "[no interval]".into(),
    }
}

/// A target not reached: beyond the sweep when its interval's low end is (shown), else not
/// reached within it (or so far, in a sweep that did not finish); with that low end.
fn not_reached(kind: LineKind, c: &Crossing, swept_to: f64, finished: bool) -> String {
    let low = c.interval.low();
    let at_least = low.map_or(String::new(), |lo| format!(" [≥ {}]", figure(lo, 3)));
    let within = kind.at(swept_to);
    let p = percent(c.target);
    match low {
        Some(lo) if finished && lo > swept_to => format!("{p} %: beyond {within}{at_least}"),
        _ if finished => format!("{p} %: not reached within {within}{at_least}"),
        _ => format!("{p} %: not reached so far, within {within}{at_least}"),
    }
}

/// The line's tolerances in one sentence; `docs/study.md` lists its forms.
fn sentence(
    kind: LineKind,
    fit: Option<&LineFit>,
    usable: bool,
    crossings: &[Crossing],
    finished: bool,
) -> String {
    let (label, mean_words) = match kind {
        LineKind::Mean => ("Mean".to_string(), String::new()),
        LineKind::Sd { at_mean_us } => ("Sd".to_string(), format!("+{} µs", figure(at_mean_us, 3))),
    };
    if !usable {
        return match kind {
            LineKind::Mean => "Mean: the zero delay's metric is not above 0 (not a time): no \
                               tolerance can be stated."
                .into(),
            LineKind::Sd { .. } => format!(
                "Sd: the constant delay's metric at {mean_words} is not above 0 (not a time): \
                 no tolerance can be stated."
            ),
        };
    }
    let Some(f) = fit.filter(|_| !crossings.is_empty()) else {
        return match kind {
            LineKind::Mean => format!("{label}: too few runs under constant delays to fit a line."),
            LineKind::Sd { .. } => {
                format!("{label}: too few runs at {mean_words} mean to fit a line.")
            }
        };
    };
    if f.falls() {
        let slope = format!(
            "slowdown {} % per µs [{}, {}]",
            figure(100.0 * f.slope, 3),
            figure(100.0 * f.slope_ci95[0], 3),
            figure(100.0 * f.slope_ci95[1], 3)
        );
        return match kind {
            LineKind::Mean => format!(
                "Mean: the runtime does not rise with the added delay ({slope}): no tolerance \
                 can be stated."
            ),
            LineKind::Sd { .. } => format!(
                "Sd: at {mean_words} mean the runtime does not rise with the sd ({slope}): no \
                 tolerance can be stated."
            ),
        };
    }
    let (reached, not): (Vec<&Crossing>, Vec<&Crossing>) =
        crossings.iter().partition(|c| c.reached);
    let clauses: Vec<String> = not
        .iter()
        .map(|c| not_reached(kind, c, f.x_max, finished))
        .collect();
    let so_far = if finished { "" } else { " so far" };
    if reached.is_empty() {
        return match kind {
            LineKind::Mean => format!(
                "Within {} per message{so_far}, the fitted line reaches no target: {}.",
                kind.at(f.x_max),
                clauses.join(", ")
            ),
            LineKind::Sd { .. } => format!(
                "At {mean_words} mean, within an sd of {}{so_far}, the fitted line reaches no \
                 target: {}.",
                kind.at(f.x_max),
                clauses.join(", ")
            ),
        };
    }
    let rest = if clauses.is_empty() {
        String::new()
    } else {
        format!("; {}", clauses.join(", "))
    };
    let parts: Vec<String> = reached
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let p = percent(c.target);
            match kind {
                LineKind::Mean => format!(
                    "{} {}{} before slowing {p} %",
                    kind.at(c.at),
                    bracket(c.interval),
                    if k == 0 { " per message" } else { "" }
                ),
                LineKind::Sd { .. } => format!(
                    "beyond {} {} costs {p} %",
                    kind.at(c.at),
                    bracket(c.interval)
                ),
            }
        })
        .collect();
    match kind {
        LineKind::Mean => format!("Tolerates {}{rest}.", parts.join(", ")),
        LineKind::Sd { .. } => format!(
            "At {mean_words} mean, an sd {} over the constant delay{rest}.",
            parts.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::plan::{Configuration, Perturbation, Stopping, Swept};

    fn row(run: usize, round: usize, mean: f64, sd: f64, metric: f64) -> Row {
        Row {
            round: Some(round),
            table_mean_us: mean,
            table_sd_us: sd,
            delayed: 1,
            ..Row::counted(run, &format!("t-{mean}-{sd}"), "table", metric)
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

    /// Rounds of a sweep over a program of runtime speed × (1000 + 20 × mean + 2 × sd) µs,
    /// its speed drifting from round to round (up to 3x), a little noise; the references in
    /// every round, as the sweep runs them.
    fn drifting(rounds: usize) -> Vec<Row> {
        let noise = [0.5, -0.3, -0.2, 0.1];
        let mut rows = Vec::new();
        for k in 0..rounds {
            let speed = 1.0 + (k % 5) as f64 * 0.5;
            let mut push = |m: f64, sd: f64, y: f64| {
                let run = rows.len();
                rows.push(row(run, k, m, sd, speed * (y + noise[run % 4])));
            };
            let (m, sd) = ([10.0, 20.0, 50.0][k % 3], [10.0, 40.0, 120.0][k % 3]);
            push(0.0, 0.0, 1000.0);
            push(m, 0.0, 1000.0 + 20.0 * m);
            push(20.0, 0.0, 1400.0);
            push(20.0, sd, 1400.0 + 2.0 * sd);
            let mut clean = Row::counted(rows.len(), "clean", "clean", 700.0);
            clean.round = Some(k);
            rows.push(clean);
        }
        rows
    }

    #[test]
    fn a_run_over_its_rounds_reference_removes_drift_between_rounds() {
        let s = summarize(&plan(Swept::Both), &drifting(9), true).unwrap();
        let m = s.mean.unwrap();
        // 10, 20 (its own point and the sd line's reference) and 50 µs, 3 + 12 + 3 runs over
        // 9 zero-delay runs; 2 df.
        assert_eq!((m.runs, m.points, m.reference_runs, m.df), (18, 3, 9, 2));
        // 20 per µs over 1000: a slowdown of 0.02 per µs, at any speed.
        assert!((m.slope - 0.02).abs() < 2e-4, "{m:?}");
        assert!(m.slope_ci95[0] < 0.02 && 0.02 < m.slope_ci95[1], "{m:?}");
        // 1 % at 0.5 µs, 5 % at 2.5, 50 % at 25.
        for (c, want) in m.crossings.iter().zip([0.5, 2.5, 25.0]) {
            assert!(c.reached && c.interval == "between", "{c:?}");
            assert!(c.ci95[0] < want && want < c.ci95[1], "{c:?}");
        }
        // The base is the zero delay's mean over every speed (17/9 of 1000 µs), and the
        // slope in µs per µs is taken at it.
        assert!((m.base - 1000.0 * 17.0 / 9.0).abs() < 1.0, "{}", m.base);
        assert!((m.slope_us_per_us - 0.02 * m.base).abs() < 0.05, "{m:?}");
        let [lo, hi] = m.slope_us_per_us_ci95;
        assert!(
            lo < m.slope_ci95[0] * m.base && m.slope_ci95[1] * m.base < hi,
            "{m:?}"
        );
        assert!(
            m.sentence.starts_with("Tolerates +0.500 µs ["),
            "{}",
            m.sentence
        );
        assert!(
            m.sentence.ends_with("before slowing 50 %."),
            "{}",
            m.sentence
        );
        let sd = s.sd.unwrap();
        // Over 1400 at 2 per µs of sd: 1 % at 7 µs, 5 % at 35, 50 % at 350 > 120. Its
        // reference: the constant 20 µs of every round and the mean line's point there.
        assert_eq!(
            (sd.runs, sd.points, sd.df, sd.reference_runs),
            (9, 3, 2, 12)
        );
        assert!(sd.slope_ci95[0] < 2.0 / 1400.0 && 2.0 / 1400.0 < sd.slope_ci95[1]);
        assert!(!sd.crossings[2].reached);
        assert!(
            sd.sentence
                .starts_with("At +20.0 µs mean, an sd beyond 7.00 µs ["),
            "{}",
            sd.sentence
        );
        assert!(
            sd.sentence
                .contains("over the constant delay; 50 %: beyond 120 µs [≥ ")
                && sd.sentence.ends_with("]."),
            "{}",
            sd.sentence
        );
        assert!(
            sd.warnings.is_empty() && m.warnings.is_empty(),
            "{sd:?} {m:?}"
        );
    }

    #[test]
    fn runs_without_their_rounds_reference_are_left_out_and_said_so() {
        let mut rows = drifting(9);
        // The zero-delay run of round 4 did not count: round 4's runs on the mean line have
        // no reference.
        rows[20].ok = false;
        let m = summarize(&plan(Swept::Mean), &rows, true)
            .unwrap()
            .mean
            .unwrap();
        assert_eq!((m.reference_runs, m.left_out_runs, m.runs), (8, 2, 16));
        assert!(m.warnings[0].contains("2 runs left out of the fit: no zero-delay run counted"));
        // A metric that is no time.
        rows[0].metric = -1.0;
        let m = summarize(&plan(Swept::Mean), &rows, true)
            .unwrap()
            .mean
            .unwrap();
        assert!(m.slope.is_nan() && m.crossings.is_empty());
        assert!(
            m.sentence.contains("not above 0 (not a time)"),
            "{}",
            m.sentence
        );
    }

    #[test]
    fn what_is_not_reached_is_said_as_far_as_it_is_shown() {
        // A slowdown of 0.0002 per µs (1 % at 50 µs), swept to 30 µs.
        let mut rows = Vec::new();
        for k in 0..4 {
            for (m, e) in [(0.0, 0.0), (10.0, 0.2), (30.0, -0.2)] {
                let y = 1000.0 * (1.0 + 0.0002 * m) + e * (k % 2) as f64;
                rows.push(row(rows.len(), k, m, 0.0, y));
            }
        }
        let p = plan(Swept::Mean);
        let m = summarize(&p, &rows, true).unwrap().mean.unwrap();
        let c = &m.crossings;
        // 1 % lies beyond 30 at 95 %; 5 % and 50 % too.
        assert!(c.iter().all(|c| !c.reached && c.ci95[0] > 30.0), "{c:?}");
        assert!(
            m.sentence.starts_with(
                "Within +30.0 µs per message, the fitted line reaches no target: 1 %: beyond \
                 +30.0 µs [≥ "
            ),
            "{}",
            m.sentence
        );
        // Interrupted: not reached so far.
        let m = summarize(&p, &rows, false).unwrap().mean.unwrap();
        assert!(
            m.sentence.starts_with(
                "Within +30.0 µs per message so far, the fitted line reaches no target: 1 %: \
                 not reached so far, within +30.0 µs [≥ "
            ),
            "{}",
            m.sentence
        );
        // One point: its crossing has no interval, and the line says what it rests on.
        let one: Vec<Row> = rows
            .iter()
            .filter(|r| r.table_mean_us != 10.0)
            .cloned()
            .collect();
        let m = summarize(&p, &one, true).unwrap().mean.unwrap();
        assert_eq!(m.crossings[0].interval, "unknown");
        assert!(m.warnings[0].contains("rests on its reference and one point (+30.0 µs)"));
        assert!(
            m.sentence.contains("1 %: not reached within +30.0 µs, "),
            "{}",
            m.sentence
        );
        // A runtime that falls with the delay: no tolerance.
        let falling: Vec<Row> = rows
            .iter()
            .map(|r| Row {
                metric: 1000.0 - 2.0 * r.table_mean_us + 0.1 * (r.run % 2) as f64,
                ..r.clone()
            })
            .collect();
        let m = summarize(&p, &falling, true).unwrap().mean.unwrap();
        assert!(m
            .crossings
            .iter()
            .all(|c| c.interval == "nowhere" && !c.reached));
        assert!(
            m.sentence
                .starts_with("Mean: the runtime does not rise with the added delay"),
            "{}",
            m.sentence
        );
    }

    #[test]
    fn only_the_swept_kind_is_reported_and_too_few_runs_say_so() {
        let rows = vec![Row::counted(0, "clean", "clean", 5.0)];
        let s = summarize(&plan(Swept::Mean), &rows, true).unwrap();
        assert!(s.sd.is_none());
        let m = s.mean.unwrap();
        assert!(m.slope.is_nan() && m.crossings.is_empty());
        assert_eq!(
            m.sentence,
            "Mean: too few runs under constant delays to fit a line."
        );
        let mut p = plan(Swept::Sd);
        assert_eq!(
            summarize(&p, &rows, true).unwrap().sd.unwrap().sentence,
            "Sd: too few runs at +20.0 µs mean to fit a line."
        );
        assert!(summarize(&p, &rows, true).unwrap().mean.is_none());
        p.tolerance = None;
        assert!(summarize(&p, &rows, true).is_none());
    }
}

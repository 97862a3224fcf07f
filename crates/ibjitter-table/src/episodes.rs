//! A two-state (calm/congested) episode model fitted to a latency time series: what the
//! injector's `IBJITTER_EPISODES=calm.dist:congested.dist:MEAN_CALM:MEAN_CONGESTED` replays.
//! Delays come from the calm table while calm and from the congested table while congested;
//! the state flips after exponentially distributed dwell times with those means.
//!
//! # The estimator
//!
//! 1. **Threshold.** Otsu's method on ln(latency): of all splits of the sorted log latencies
//!    into a low and a high class, the one that maximizes the between-class variance
//!    `w_low · w_high · (m_low − m_high)²`, found exactly over every split with prefix sums
//!    (this is also the global optimum of two-means on the log values, so no Lloyd iterations
//!    and no local optima). The threshold is the geometric midpoint of the gap at that split;
//!    a sample is congested when its latency is above it, calm otherwise. Latencies below 1 ns
//!    count as 1 ns in the logs.
//! 2. **Episodes.** A run of consecutive samples in one state is an episode. Its dwell is the
//!    time from its first sample to the first sample of the next episode.
//! 3. **Mean dwell.** Per state, the total time spent in the state divided by the number of
//!    *completed* episodes of the state: the maximum-likelihood mean of an exponential with
//!    right-censoring. The last episode is censored (the series ends before it does): it
//!    contributes its time, from its first sample to the series' last, but no count. The first
//!    episode, which started before the series did, counts as complete: by the exponential's
//!    lack of memory its remaining dwell has the same distribution as a whole one.
//! 4. **Tables.** Each state's latencies make an absolute table of empirical quantiles, as
//!    `ibjitter table empirical` makes one ([`Dist::empirical`], [`make_table`]).
//!
//! # Biases, and the warnings that flag them
//!
//! The series only shows the state at its samples. Episodes shorter than the sampling interval
//! are missed (their neighbours merge, lengthening the other state's dwell), and a single
//! mis-classified sample splits an episode in three (shortening both states' dwells). So
//! [`EpisodeFit`] reports the sampling interval (the median gap between samples) and warns
//! when:
//! - a state's fitted mean dwell is below [`MIN_DWELL_INTERVALS`] sampling intervals;
//! - the states are poorly separated: the gap between the two classes' mean log latencies is
//!   below [`MIN_SEPARATION`] pooled sds (the within-class sd, pooled over both classes). The
//!   classes are truncated at the threshold, which shrinks their sds: a single lognormal split
//!   in two scores about 2.6, a log-uniform about 3.5, so a lower bound of 2 would never fire
//!   on data with one state. Two lognormals 4 sds apart score about 4, and already classify
//!   about 2% of the samples into the wrong state;
//! - a state has fewer than [`MIN_EPISODES`] completed episodes (the mean of k exponentials has
//!   a relative standard error of 1/√k).
//!
//! # Input
//!
//! [`parse_series`] reads either layout (values returned in nanoseconds):
//! - **columns**: `TIME LATENCY` per line, separated by whitespace and/or a comma; TIME in
//!   seconds, LATENCY in the caller's unit (`--unit`), else in the unit a `# unit: us` comment
//!   names, else in nanoseconds. Lines starting with `#` are comments; the first other line
//!   may be a header (its first field is not a number). Times must not decrease.
//! - **hdrlog**: an HdrHistogram interval log, as `ibjitter run --hdr-log` writes it. Each
//!   non-empty interval is one sample: its start time, and its histogram's median latency
//!   (intervals without operations are skipped). The unit is as for columns (ibjitter's logs
//!   say `in ns`). The sampling interval is the log's interval (`--hdr-interval`, 1 s by
//!   default), so episodes need to last many of them.
//!
//! `ibjitter run --timeseries` files (throughput per flow, no latencies) and perftest dumps
//! (no times) are refused with a message saying so.

use super::dist::{Dist, LogNormal};
use super::duration::{format_ns, format_ns_rounded, format_short, Unit};
use super::format::{Kind, ParseError, Table};
use super::generate::make_table;
use super::samples::{
    col_of, decode_histogram, hdrlog_payload, hdrlog_unit, number, perftest_header, perr,
    read_text, unit_declaration,
};
use super::stats::Stats;
use super::TableError;
use serde::Serialize;
use std::path::Path;

/// The injector's variable for the model.
pub const ENV: &str = "IBJITTER_EPISODES";
/// Fewer samples than this are refused.
pub const MIN_SAMPLES: usize = 10;
/// Fewer completed episodes of a state than this raise a warning.
pub const MIN_EPISODES: usize = 5;
/// A mean dwell below this many sampling intervals raises a warning.
pub const MIN_DWELL_INTERVALS: f64 = 5.0;
/// A gap between the classes' mean log latencies below this many pooled sds raises a warning.
pub const MIN_SEPARATION: f64 = 4.0;

/// One sample of the series, nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub time_ns: f64,
    pub latency_ns: f64,
}

/// What was fitted for one state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateFit {
    /// Samples classified into the state.
    pub samples: usize,
    /// Completed episodes (the censored last one not counted).
    pub episodes: usize,
    /// Total time in the state, the censored last episode included.
    pub time_ns: f64,
    /// `time_ns / episodes`: the exponential dwell's maximum-likelihood mean.
    pub mean_dwell_ns: f64,
    /// Of the state's samples (nearest rank).
    pub median_ns: f64,
    pub mean_ns: f64,
}

/// The fitted model (see the module docs for the estimator).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpisodeFit {
    pub samples: usize,
    /// Latencies above this are congested.
    pub threshold_ns: f64,
    /// Gap between the classes' mean log latencies in pooled within-class sds (infinite, null
    /// in JSON, when each class is constant).
    pub separation: f64,
    /// Median gap between consecutive samples.
    pub sampling_interval_ns: f64,
    /// From the first sample to the last.
    pub span_ns: f64,
    pub calm: StateFit,
    pub congested: StateFit,
    /// Why the fit may be unreliable; empty when nothing was found.
    pub warnings: Vec<String>,
}

/// ln of a latency, below 1 ns counted as 1 ns.
fn log_latency(ns: f64) -> f64 {
    ns.max(1.0).ln()
}

/// Otsu's threshold on ln(latency), or None when every latency is the same.
fn otsu_log_threshold(points: &[Point]) -> Option<f64> {
    let mut ys: Vec<f64> = points.iter().map(|p| log_latency(p.latency_ns)).collect();
    ys.sort_unstable_by(f64::total_cmp);
    let n = ys.len();
    let total: f64 = ys.iter().sum();
    let mut below = 0.0;
    let mut best: Option<(f64, usize)> = None;
    for k in 1..n {
        below += ys[k - 1];
        if ys[k - 1] == ys[k] {
            continue;
        }
        let (lo, hi) = (k as f64, (n - k) as f64);
        let gap = below / lo - (total - below) / hi;
        let between = lo * hi * gap * gap;
        if best.is_none_or(|(b, _)| between > b) {
            best = Some((between, k));
        }
    }
    best.map(|(_, k)| 0.5 * (ys[k - 1] + ys[k]))
}

/// Gap between the classes' mean log latencies over their pooled within-class sd.
fn separation(points: &[Point], congested: &[bool]) -> f64 {
    let mut sum = [0.0f64; 2];
    let mut count = [0usize; 2];
    for (p, &c) in points.iter().zip(congested) {
        sum[c as usize] += log_latency(p.latency_ns);
        count[c as usize] += 1;
    }
    let mean = [sum[0] / count[0] as f64, sum[1] / count[1] as f64];
    let ss: f64 = points
        .iter()
        .zip(congested)
        .map(|(p, &c)| (log_latency(p.latency_ns) - mean[c as usize]).powi(2))
        .sum();
    let pooled = (ss / points.len() as f64).sqrt();
    // Constant classes leave only rounding in `ss`: a billionth of a log unit is far below
    // a nanosecond's resolution.
    if pooled < 1e-9 {
        return f64::INFINITY;
    }
    (mean[1] - mean[0]) / pooled
}

fn check_points(points: &[Point]) -> Result<(), TableError> {
    if points.len() < MIN_SAMPLES {
        return Err(TableError::new(format!(
            "expected at least {MIN_SAMPLES} samples to fit calm and congested episodes, found {}",
            points.len()
        )));
    }
    for (i, p) in points.iter().enumerate() {
        if !(p.time_ns.is_finite() && p.latency_ns.is_finite() && p.latency_ns >= 0.0) {
            return Err(TableError::new(format!(
                "sample {}: expected a finite time and a finite latency >= 0, found {:?}",
                i + 1,
                p
            )));
        }
        if i > 0 && p.time_ns < points[i - 1].time_ns {
            return Err(TableError::new(format!(
                "sample {}: expected samples in time order, found {} after {}",
                i + 1,
                format_ns(p.time_ns),
                format_ns(points[i - 1].time_ns)
            )));
        }
    }
    Ok(())
}

fn state_name(congested: bool) -> &'static str {
    if congested {
        "congested"
    } else {
        "calm"
    }
}

/// Fits the model to samples in time order (see the module docs).
///
/// Errors: fewer than [`MIN_SAMPLES`] samples, samples out of order, a series spanning no
/// time, only one state (every latency the same), or a state with no completed episode.
pub fn fit_episodes(points: &[Point]) -> Result<EpisodeFit, TableError> {
    check_points(points)?;
    let n = points.len();
    let span_ns = points[n - 1].time_ns - points[0].time_ns;
    if span_ns <= 0.0 {
        return Err(TableError::new(
            "expected samples spanning some time, found every sample at the same time",
        ));
    }
    let one_state = || {
        TableError::new(format!(
            "expected latencies of two states (calm and congested), found one: every latency is {}",
            format_ns(points[0].latency_ns)
        ))
    };
    let threshold_ns = otsu_log_threshold(points).ok_or_else(one_state)?.exp();
    let congested: Vec<bool> = points.iter().map(|p| p.latency_ns > threshold_ns).collect();
    if congested.iter().all(|&c| c) || congested.iter().all(|&c| !c) {
        return Err(one_state());
    }

    // Runs of one state; each ends at the first sample of the next.
    let mut time = [0.0f64; 2];
    let mut episodes = [0usize; 2];
    let mut start = 0;
    for i in 1..n {
        if congested[i] != congested[start] {
            let s = congested[start] as usize;
            time[s] += points[i].time_ns - points[start].time_ns;
            episodes[s] += 1;
            start = i;
        }
    }
    // The censored last episode: time, no count.
    time[congested[start] as usize] += points[n - 1].time_ns - points[start].time_ns;

    let mut gaps: Vec<f64> = points
        .windows(2)
        .map(|w| w[1].time_ns - w[0].time_ns)
        .collect();
    let mid = gaps.len() / 2;
    let sampling_interval_ns = *gaps.select_nth_unstable_by(mid, f64::total_cmp).1;

    let state = |c: bool| -> Result<StateFit, TableError> {
        let s = c as usize;
        if episodes[s] == 0 {
            return Err(TableError::new(format!(
                "the {} state never ended within the series (its only episode is the last, censored one): expected at least one completed episode of each state; measure longer",
                state_name(c)
            )));
        }
        let latencies: Vec<f64> = points
            .iter()
            .zip(&congested)
            .filter(|&(_, &k)| k == c)
            .map(|(p, _)| p.latency_ns)
            .collect();
        let st = Stats::of_f64(&latencies);
        Ok(StateFit {
            samples: latencies.len(),
            episodes: episodes[s],
            time_ns: time[s],
            mean_dwell_ns: time[s] / episodes[s] as f64,
            median_ns: st.p50,
            mean_ns: st.mean,
        })
    };
    let mut fit = EpisodeFit {
        samples: n,
        threshold_ns,
        separation: separation(points, &congested),
        sampling_interval_ns,
        span_ns,
        calm: state(false)?,
        congested: state(true)?,
        warnings: Vec::new(),
    };
    fit.warnings = warnings(&fit);
    Ok(fit)
}

fn warnings(fit: &EpisodeFit) -> Vec<String> {
    let mut w = Vec::new();
    if fit.separation < MIN_SEPARATION {
        w.push(format!(
            "the two states are poorly separated: their mean log latencies are {:.2} pooled sds apart (below {MIN_SEPARATION}; one lognormal split in two scores about 2.6): the series may hold one state only, and mis-classified samples split episodes, shortening both dwells",
            fit.separation
        ));
    }
    for (name, s) in [("calm", &fit.calm), ("congested", &fit.congested)] {
        if s.mean_dwell_ns < MIN_DWELL_INTERVALS * fit.sampling_interval_ns {
            w.push(format!(
                "the {name} state's mean dwell {} is below {MIN_DWELL_INTERVALS} sampling intervals ({} each): episodes shorter than an interval are missed and single mis-classified samples split episodes, so the dwells are unreliable; sample more often",
                format_short(s.mean_dwell_ns),
                format_short(fit.sampling_interval_ns)
            ));
        }
        if s.episodes < MIN_EPISODES {
            w.push(format!(
                "only {} completed {name} episode{}: its mean dwell has a relative standard error of about {:.0}%; measure longer",
                s.episodes,
                if s.episodes == 1 { "" } else { "s" },
                100.0 / (s.episodes as f64).sqrt()
            ));
        }
    }
    w
}

impl EpisodeFit {
    /// Whether a latency belongs to the congested state.
    pub fn is_congested(&self, latency_ns: f64) -> bool {
        latency_ns > self.threshold_ns
    }

    /// The calm and the congested table: absolute, of each state's empirical quantiles, with
    /// header lines saying how they were made. `points` are the samples fitted; `source` names
    /// them.
    pub fn tables(&self, points: &[Point], source: &str) -> Result<[Table; 2], TableError> {
        let table = |congested: bool| -> Result<Table, TableError> {
            let name = state_name(congested);
            let s = if congested {
                &self.congested
            } else {
                &self.calm
            };
            let latencies: Vec<f64> = points
                .iter()
                .map(|p| p.latency_ns)
                .filter(|&x| self.is_congested(x) == congested)
                .collect();
            let dist = Dist::empirical(latencies, &format!("the {name} state of {source}"))?;
            let mut t = make_table(&dist, Kind::Absolute)?;
            let side = if congested { "above" } else { "at or below" };
            t.comments.insert(
                2,
                format!(
                    "{name} state of a two-state episode model ({ENV}): the samples {side} the threshold {} (Otsu's method on log latency)",
                    format_ns_rounded(self.threshold_ns)
                ),
            );
            t.comments.insert(
                3,
                format!(
                    "{name} mean dwell {} = {} in the state / {} completed episodes (exponential MLE); sampling interval {}",
                    format_ns_rounded(s.mean_dwell_ns),
                    format_ns_rounded(s.time_ns),
                    s.episodes,
                    format_ns_rounded(self.sampling_interval_ns)
                ),
            );
            Ok(t)
        };
        Ok([table(false)?, table(true)?])
    }

    /// The value of [`ENV`] for tables at these paths: `calm:congested:MEAN_CALM:MEAN_CONGESTED`,
    /// the means in whole nanoseconds (at least 1).
    pub fn env_value(&self, calm: &str, congested: &str) -> String {
        let d = |ns: f64| format_ns(ns.round().max(1.0));
        format!(
            "{calm}:{congested}:{}:{}",
            d(self.calm.mean_dwell_ns),
            d(self.congested.mean_dwell_ns)
        )
    }
}

/// File stems of the two tables: `prefix-calm`, `prefix-congested`.
pub fn table_names(prefix: &str) -> [String; 2] {
    [format!("{prefix}-calm"), format!("{prefix}-congested")]
}

/// Which layout a series file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesLayout {
    Columns,
    HdrLog,
}

/// A latency time series read from a file, nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub points: Vec<Point>,
    pub layout: SeriesLayout,
    /// The unit the file's latencies were in.
    pub unit: Unit,
}

/// Fields of a columns line: separated by whitespace and/or commas, with their byte offsets.
fn fields(line: &str) -> Vec<(usize, &str)> {
    let sep = |c: char| c.is_whitespace() || c == ',';
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (sep(c), start) {
            (true, Some(s)) => {
                out.push((s, &line[s..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &line[s..]));
    }
    out
}

/// The header `ibjitter run --timeseries` writes.
const THROUGHPUT_HEADER: &str = "time_s,flow,bytes,gbps";

/// Parses a latency time series (see the module docs for layouts). `unit` (from `--unit`)
/// overrides the file's own.
pub fn parse_series(text: &str, origin: &str, unit: Option<Unit>) -> Result<Series, ParseError> {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    if let Some(h) = lines.iter().position(|l| perftest_header(l).is_some()) {
        return Err(perr(
            origin,
            h + 1,
            1,
            "expected a latency time series (TIME LATENCY lines or an HdrHistogram interval log), found a perftest dump, which has no times".to_string(),
        ));
    }
    if lines.iter().any(|l| hdrlog_payload(l).is_some()) {
        return parse_hdr_series(&lines, origin, unit);
    }
    let mut declared: Option<Unit> = None;
    let mut raw: Vec<(f64, f64)> = Vec::new();
    let mut header_allowed = true;
    for (idx, line) in lines.iter().enumerate() {
        let line_no = idx + 1;
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            if let Some(u) = unit_declaration(comment) {
                let col = col_of(line, line.len() - trimmed.len());
                declared = Some(Unit::parse(u).ok_or_else(|| {
                    perr(
                        origin,
                        line_no,
                        col,
                        format!(
                            "expected a unit (ns, us, ms, s) in the unit declaration, found {u:?}"
                        ),
                    )
                })?);
            }
            continue;
        }
        if trimmed.trim_end() == THROUGHPUT_HEADER {
            return Err(perr(
                origin,
                line_no,
                1,
                "expected latencies over time, found ibjitter run's --timeseries CSV (throughput per flow, no latencies); record latency over time with ibjitter run --hdr-log FILE and read that".to_string(),
            ));
        }
        let f = fields(line);
        let header = f.first().is_some_and(|&(_, first)| number(first).is_none());
        if std::mem::take(&mut header_allowed) && header {
            continue;
        }
        if f.len() != 2 {
            let at = f.get(2).map_or(line.len(), |&(at, _)| at);
            return Err(perr(
                origin,
                line_no,
                col_of(line, at),
                format!(
                    "expected two columns, TIME (seconds) and LATENCY, found {} field{}",
                    f.len(),
                    if f.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        let (t_at, t_tok) = f[0];
        let (l_at, l_tok) = f[1];
        let t = number(t_tok).ok_or_else(|| {
            perr(
                origin,
                line_no,
                col_of(line, t_at),
                format!("expected a time in seconds (a number), found {t_tok:?}"),
            )
        })?;
        let v = number(l_tok).ok_or_else(|| {
            perr(
                origin,
                line_no,
                col_of(line, l_at),
                format!("expected a latency (a number), found {l_tok:?}"),
            )
        })?;
        if v < 0.0 {
            return Err(perr(
                origin,
                line_no,
                col_of(line, l_at),
                format!("expected a non-negative latency, found {l_tok}"),
            ));
        }
        if let Some(&(prev, _)) = raw.last() {
            if t < prev {
                return Err(perr(
                    origin,
                    line_no,
                    col_of(line, t_at),
                    format!("expected times in order, found {t_tok} s after {prev} s"),
                ));
            }
        }
        raw.push((t, v));
    }
    let unit = unit.or(declared).unwrap_or(Unit::Ns);
    finish(raw, SeriesLayout::Columns, unit, origin)
}

fn parse_hdr_series(
    lines: &[&str],
    origin: &str,
    unit: Option<Unit>,
) -> Result<Series, ParseError> {
    let unit = unit.or_else(|| hdrlog_unit(lines)).unwrap_or(Unit::Ns);
    let mut raw: Vec<(f64, f64)> = Vec::new();
    for (idx, line) in lines.iter().enumerate() {
        let Some((at, payload)) = hdrlog_payload(line) else {
            continue;
        };
        // `[Tag=…,]start,length,max,HIST…`
        let mut head = line[..at].split(',');
        let mut first = head.next().unwrap_or_default();
        let mut first_at = 0;
        if first.starts_with("Tag=") {
            first_at = first.len() + 1;
            first = head.next().unwrap_or_default();
        }
        let start = number(first.trim()).ok_or_else(|| {
            perr(
                origin,
                idx + 1,
                col_of(line, first_at),
                format!("expected the interval's start time in seconds, found {first:?}"),
            )
        })?;
        let h = decode_histogram(payload)
            .map_err(|what| perr(origin, idx + 1, col_of(line, at), what))?;
        if h.is_empty() {
            continue;
        }
        if let Some(&(prev, _)) = raw.last() {
            if start < prev {
                return Err(perr(
                    origin,
                    idx + 1,
                    col_of(line, first_at),
                    format!("expected intervals in time order, found one starting at {start} s after one at {prev} s"),
                ));
            }
        }
        let median = h.median_equivalent(h.value_at_quantile(0.5)) as f64;
        raw.push((start, median));
    }
    finish(raw, SeriesLayout::HdrLog, unit, origin)
}

fn finish(
    raw: Vec<(f64, f64)>,
    layout: SeriesLayout,
    unit: Unit,
    origin: &str,
) -> Result<Series, ParseError> {
    if raw.is_empty() {
        return Err(perr(
            origin,
            1,
            1,
            "expected latency samples over time, found none".to_string(),
        ));
    }
    let k = unit.ns();
    Ok(Series {
        points: raw
            .into_iter()
            .map(|(t, v)| Point {
                time_ns: t * 1e9,
                latency_ns: v * k,
            })
            .collect(),
        layout,
        unit,
    })
}

/// Reads a series file (see the module docs for layouts).
pub fn read_series(path: &Path, unit: Option<Unit>) -> Result<Series, ParseError> {
    let (origin, text) = read_text(path, "the latency series")?;
    parse_series(&text, &origin, unit)
}

/// A model with known parameters, to sample series from: for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub calm: LogNormal,
    pub congested: LogNormal,
    pub mean_calm_ns: f64,
    pub mean_congested_ns: f64,
}

impl Model {
    /// The model sampled every `interval_ns` for `duration_ns`, from a PCG seeded with `seed`
    /// (repeatable). The state starts in its stationary distribution and flips after
    /// exponential dwells in continuous time; each sample draws its latency from the
    /// lognormal of the state it falls in.
    pub fn sample(&self, interval_ns: f64, duration_ns: f64, seed: u64) -> Vec<Point> {
        use rand_core::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        let mut uniform = move || ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let mean = |congested: bool| {
            if congested {
                self.mean_congested_ns
            } else {
                self.mean_calm_ns
            }
        };
        let p_congested = self.mean_congested_ns / (self.mean_calm_ns + self.mean_congested_ns);
        let mut congested = uniform() < p_congested;
        let mut flip_at = -mean(congested) * uniform().ln();
        let n = (duration_ns / interval_ns).floor() as usize;
        (0..n)
            .map(|k| {
                let t = k as f64 * interval_ns;
                while t >= flip_at {
                    congested = !congested;
                    flip_at += -mean(congested) * uniform().ln();
                }
                let l = if congested {
                    &self.congested
                } else {
                    &self.calm
                };
                Point {
                    time_ns: t,
                    latency_ns: l.quantile(uniform()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::parse;

    const MS: f64 = 1e6;
    const US: f64 = 1e3;

    fn rel(a: f64, b: f64) -> f64 {
        (a / b - 1.0).abs()
    }

    /// Calm around 5 us, congested around 200 us.
    fn model(mean_calm_ns: f64, mean_congested_ns: f64) -> Model {
        Model {
            calm: LogNormal::new(0.3, 5.0 * US, 0.0).unwrap(),
            congested: LogNormal::new(0.4, 200.0 * US, 0.0).unwrap(),
            mean_calm_ns,
            mean_congested_ns,
        }
    }

    #[test]
    fn recovers_known_dwells_and_medians() {
        // 50 ms calm, 10 ms congested, sampled every 100 us for 20 s.
        let points = model(50.0 * MS, 10.0 * MS).sample(100.0 * US, 20e9, 7);
        let f = fit_episodes(&points).unwrap();
        eprintln!(
            "calm dwell {} (50ms), congested dwell {} (10ms), calm median {} (5us), congested median {} (200us), episodes {}/{}, separation {:.2}, threshold {}",
            format_short(f.calm.mean_dwell_ns),
            format_short(f.congested.mean_dwell_ns),
            format_short(f.calm.median_ns),
            format_short(f.congested.median_ns),
            f.calm.episodes,
            f.congested.episodes,
            f.separation,
            format_short(f.threshold_ns)
        );
        assert!(rel(f.calm.mean_dwell_ns, 50.0 * MS) < 0.15, "{f:?}");
        assert!(rel(f.congested.mean_dwell_ns, 10.0 * MS) < 0.15, "{f:?}");
        assert!(rel(f.calm.median_ns, 5.0 * US) < 0.10, "{f:?}");
        assert!(rel(f.congested.median_ns, 200.0 * US) < 0.10, "{f:?}");
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
        assert_eq!(f.sampling_interval_ns, 100.0 * US);
        assert_eq!(f.samples, f.calm.samples + f.congested.samples);
        // Every moment of the series is in one state or the other.
        assert!(rel(f.calm.time_ns + f.congested.time_ns, f.span_ns) < 1e-12);
        assert!(f.threshold_ns > 10.0 * US && f.threshold_ns < 100.0 * US);

        let [calm, congested] = f.tables(&points, "synthetic").unwrap();
        for (t, median) in [(&calm, 5.0 * US), (&congested, 200.0 * US)] {
            assert_eq!(
                parse(&t.to_text().unwrap(), Kind::Absolute, "t").unwrap(),
                *t
            );
            let st = Stats::of_i64(&t.entries);
            assert!(rel(st.p50, median) < 0.10, "{st:?}");
            assert!(t.comments.iter().any(|c| c.contains("mean dwell")));
            assert!(t.comments.iter().any(|c| c.contains("synthetic")));
        }
        assert!(calm.comments.iter().any(|c| c.contains("calm state")));
        let env = f.env_value("a.dist", "b.dist");
        let parts: Vec<&str> = env.split(':').collect();
        assert_eq!(&parts[..2], ["a.dist", "b.dist"]);
        let calm_ns = crate::duration::parse_duration(parts[2]).unwrap();
        assert_eq!(calm_ns, f.calm.mean_dwell_ns.round());
    }

    #[test]
    fn dwells_below_the_sampling_interval_warn() {
        // 50 us and 20 us dwells sampled every 100 us: the state is nearly independent from
        // one sample to the next, and the fitted dwells are a few intervals at most.
        let points = model(50.0 * US, 20.0 * US).sample(100.0 * US, 2e9, 8);
        let f = fit_episodes(&points).unwrap();
        let dwell_warnings = f
            .warnings
            .iter()
            .filter(|w| w.contains("sampling intervals"))
            .count();
        assert_eq!(dwell_warnings, 2, "{:?}", f.warnings);
        assert!(!f.warnings.iter().any(|w| w.contains("poorly separated")));
    }

    #[test]
    fn overlapping_states_warn() {
        // 5 us and 7 us with shape 0.3: less than 1.2 sds apart in log space.
        let m = Model {
            calm: LogNormal::new(0.3, 5.0 * US, 0.0).unwrap(),
            congested: LogNormal::new(0.3, 7.0 * US, 0.0).unwrap(),
            mean_calm_ns: 50.0 * MS,
            mean_congested_ns: 10.0 * MS,
        };
        let f = fit_episodes(&m.sample(100.0 * US, 2e9, 9)).unwrap();
        assert!(f.separation < MIN_SEPARATION, "{f:?}");
        assert!(
            f.warnings.iter().any(|w| w.contains("poorly separated")),
            "{:?}",
            f.warnings
        );
        // One lognormal alone is split in two, and said to be poorly separated.
        let one: Vec<Point> = m
            .calm
            .samples(10_000, 3)
            .into_iter()
            .enumerate()
            .map(|(i, x)| Point {
                time_ns: i as f64 * 1e5,
                latency_ns: x,
            })
            .collect();
        let f = fit_episodes(&one).unwrap();
        assert!(f.separation > 2.0 && f.separation < 3.0, "{}", f.separation);
        assert!(f.warnings.iter().any(|w| w.contains("poorly separated")));
    }

    #[test]
    fn few_episodes_warn_and_hand_made_series_count_exactly() {
        // calm 0..3, congested 3..5, calm 5..9, congested 9 (censored): times 0..9 ms.
        let lat = [5, 5, 5, 200, 200, 5, 5, 5, 5, 200];
        let points: Vec<Point> = lat
            .iter()
            .enumerate()
            .map(|(i, &l)| Point {
                time_ns: i as f64 * MS,
                latency_ns: l as f64 * US,
            })
            .collect();
        let f = fit_episodes(&points).unwrap();
        assert_eq!((f.calm.episodes, f.congested.episodes), (2, 1));
        assert_eq!((f.calm.samples, f.congested.samples), (7, 3));
        assert_eq!(f.calm.mean_dwell_ns, 3.5 * MS);
        assert_eq!(f.congested.time_ns, 2.0 * MS);
        assert_eq!(f.congested.mean_dwell_ns, 2.0 * MS);
        assert_eq!(f.sampling_interval_ns, MS);
        assert!(rel(f.threshold_ns, (5.0f64 * 200.0).sqrt() * US) < 1e-12);
        assert!(f.separation.is_infinite());
        let few = f.warnings.iter().filter(|w| w.contains("only")).count();
        assert_eq!(few, 2, "{:?}", f.warnings);
        assert!(f
            .warnings
            .iter()
            .any(|w| w.contains("1 completed congested episode:")));
    }

    #[test]
    fn refusals() {
        let at = |lat: &[f64]| -> Vec<Point> {
            lat.iter()
                .enumerate()
                .map(|(i, &l)| Point {
                    time_ns: i as f64,
                    latency_ns: l,
                })
                .collect()
        };
        let e = fit_episodes(&at(&[1.0, 2.0, 3.0])).unwrap_err();
        assert!(e.message.contains("at least 10 samples"), "{e}");
        let e = fit_episodes(&at(&[7.0; 20])).unwrap_err();
        assert!(e.message.contains("found one"), "{e}");
        // Congested only at the end: no completed congested episode.
        let mut lat = vec![5.0; 15];
        lat.extend([500.0; 5]);
        let e = fit_episodes(&at(&lat)).unwrap_err();
        assert!(e.message.contains("never ended"), "{e}");
        let mut p = at(&[5.0, 500.0].repeat(10));
        p[4].time_ns = 1.0;
        let e = fit_episodes(&p).unwrap_err();
        assert!(e.message.contains("time order"), "{e}");
    }

    #[test]
    fn columns_layout() {
        let text = "\
# a measured series
# unit: us
time_s, latency_us
0.000 5.0
0.001,5.5
0.002\t200
\r
0.003 , 210
";
        let s = parse_series(text, "f", None).unwrap();
        assert_eq!(s.layout, SeriesLayout::Columns);
        assert_eq!(s.unit, Unit::Us);
        let want = [
            (0.0, 5000.0),
            (1e6, 5500.0),
            (2e6, 200_000.0),
            (3e6, 210_000.0),
        ];
        let got: Vec<(f64, f64)> = s.points.iter().map(|p| (p.time_ns, p.latency_ns)).collect();
        assert_eq!(got, want);
        // The default unit is ns; --unit overrides the file.
        let s = parse_series("0 5\n1 6\n", "f", None).unwrap();
        assert_eq!((s.unit, s.points[1].latency_ns), (Unit::Ns, 6.0));
        let s = parse_series("# unit: us\n0 5\n", "f", Some(Unit::Ms)).unwrap();
        assert_eq!(s.points[0].latency_ns, 5e6);
    }

    #[test]
    fn columns_errors_have_positions() {
        let e = parse_series("0 5\n1 x\n", "s.txt", None).unwrap_err();
        assert_eq!((e.line, e.col), (2, 3), "{e}");
        assert!(e.to_string().starts_with("s.txt:2:3: expected a latency"));
        let e = parse_series("0 5\n1 6 7\n", "f", None).unwrap_err();
        assert_eq!((e.line, e.col), (2, 5), "{e}");
        assert!(e.message.contains("two columns"), "{e}");
        let e = parse_series("0 5\n9\n", "f", None).unwrap_err();
        assert!(e.message.contains("found 1 field"), "{e}");
        let e = parse_series("time lat\nhdr again\n", "f", None).unwrap_err();
        assert_eq!((e.line, e.col), (2, 1), "only one header: {e}");
        let e = parse_series("2 5\n1 5\n", "f", None).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("in order"), "{e}");
        let e = parse_series("0 -5\n", "f", None).unwrap_err();
        assert!(e.message.contains("non-negative"), "{e}");
        let e = parse_series("t lat\n", "f", None).unwrap_err();
        assert!(e.message.contains("found none"), "{e}");
        let e = parse_series("time_s,flow,bytes,gbps\n0.0,1,100,0.1\n", "f", None).unwrap_err();
        assert!(e.message.contains("--hdr-log"), "{e}");
        let e = parse_series("#, usec\n1, 5.0\n", "f", None).unwrap_err();
        assert!(e.message.contains("perftest"), "{e}");
    }

    #[test]
    fn hdr_interval_log_gives_one_median_per_interval() {
        use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
        use hdrhistogram::serialization::V2DeflateSerializer;
        let intervals: [&[u64]; 4] = [&[1000, 2000, 3000], &[], &[5000], &[7000, 7000, 90_000]];
        let mut out = Vec::new();
        let mut ser = V2DeflateSerializer::new();
        let mut b = IntervalLogWriterBuilder::new();
        b.add_comment("ibjitter 0.1.0: per-operation latency in ns");
        let mut log = b.begin_log_with(&mut out, &mut ser).unwrap();
        for (k, vs) in intervals.iter().enumerate() {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            for &v in *vs {
                h.record(v).unwrap();
            }
            let t = std::time::Duration::from_millis(10 * k as u64);
            log.write_histogram(&h, t, std::time::Duration::from_millis(10), None)
                .unwrap();
        }
        drop(log);
        let text = String::from_utf8(out).unwrap();
        let s = parse_series(&text, "lat.hlog", None).unwrap();
        assert_eq!((s.layout, s.unit), (SeriesLayout::HdrLog, Unit::Ns));
        let times: Vec<f64> = s.points.iter().map(|p| p.time_ns).collect();
        assert_eq!(times, [0.0, 20e6, 30e6], "the empty interval is skipped");
        for (p, want) in s.points.iter().zip([2000.0, 5000.0, 7000.0]) {
            assert!(rel(p.latency_ns, want) < 1e-3, "{p:?}");
        }
        let bad = text.replace("HISTF", "HISTF!!");
        let e = parse_series(&bad, "f", None).unwrap_err();
        assert!(
            e.message.contains("base64") && e.line > 1 && e.col > 1,
            "{e}"
        );
    }
}

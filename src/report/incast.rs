//! What `ibjitter incast` reports: every sender's fate, every flow numbered across senders,
//! the totals ([`IncastReport`], its JSON), with the merged latency histogram and time series
//! ([`Merged`]); a sweep's table ([`SweepRow`]); and the plots' data. `incast::merge` computes
//! it, `export::incast` writes it.
use crate::report::plot::Series;
use crate::report::{us, Latency, Outcome, Totals};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One (sender, receiver) pair of a pattern across hosts; `report::pairs` computes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairCell {
    pub sender: String,
    pub receiver: String,
    /// Steps the pair sent in (more than one for a rotating incast that comes round again).
    pub steps: u32,
    /// "ok", or the first thing that went wrong in any of its steps.
    pub status: String,
    pub flows_requested: u32,
    pub flows_started: u32,
    pub ops: u64,
    pub bytes: u64,
    /// Mean of its steps' throughputs.
    pub gbps: f64,
    pub latency: Latency,
}

/// Per-pair figures as sender × receiver matrices (`report::pairs` computes them).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairMatrix {
    /// Rows are senders, columns receivers, both in this order.
    pub hosts: Vec<String>,
    pub gbps: Vec<Vec<Option<f64>>>,
    pub bytes: Vec<Vec<Option<u64>>>,
    pub flows_started: Vec<Vec<Option<u32>>>,
    pub p50_us: Vec<Vec<Option<f64>>>,
    pub p99_us: Vec<Vec<Option<f64>>>,
    pub pairs: Vec<PairCell>,
}

/// How one sender fared.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SenderSummary {
    pub host: String,
    /// The host it sent to.
    #[serde(default)]
    pub receiver: String,
    /// "ok", or what went wrong ("exit status 3", "failed to launch: ...", "no report").
    pub status: String,
    pub exit_code: Option<i32>,
    pub outcome: Option<Outcome>,
    pub flows_requested: u32,
    pub flows_started: u32,
    #[serde(default)]
    pub ops: u64,
    #[serde(default)]
    pub bytes: u64,
    pub gbps: f64,
    /// Its device port's own counters over its run (retransmissions, CNPs, ECN marks, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub port_counters: BTreeMap<String, u64>,
    /// The end of its stderr, when it failed.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub stderr_tail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IncastFlow {
    /// Numbered across all senders: sender k's flow i is `k * flows_per_sender + i`.
    pub id: u32,
    pub sender: String,
    pub flow: u32,
    pub ops: u64,
    pub bytes: u64,
    pub gbps: f64,
    pub status: String,
    pub latency: Latency,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IncastReport {
    pub tool: String,
    pub receiver: String,
    pub flows_per_sender: u32,
    pub flows_requested: u32,
    pub flows_started: u32,
    /// From the launch of the first process to the first operation of any flow; `None` (null)
    /// where the senders' clocks are off against this machine's (`clock_note` says how).
    pub launch_to_first_byte_s: Option<f64>,
    /// What is off in the senders' clocks against this machine's, when they are off alike
    /// (a lone sender's, or every one's): see `incast::clocks`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub clock_note: Option<String>,
    /// Why the step stopped before its senders' end (Ctrl-C): its figures are partial. Null
    /// when it ran to its end.
    #[serde(default)]
    pub stopped: Option<String>,
    /// Spread of every flow's first post, across hosts (wall clocks: as synchronized as the
    /// hosts' clocks are; exact on the bench, where all hosts share one).
    pub start_skew_us: f64,
    pub duration_s: f64,
    pub total: Totals,
    pub fairness: f64,
    pub senders: Vec<SenderSummary>,
    pub flows: Vec<IncastFlow>,
    /// With `--pattern` other than a plain incast: the pattern and its per-pair figures.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pairs: Option<PairMatrix>,
    /// By op type over every sender ("write", "read", ...), latencies merged exactly.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ops: BTreeMap<String, crate::report::ops::OpReport>,
}

/// Everything merged, plus the data the exports need.
pub struct Merged {
    pub report: IncastReport,
    pub latency: Histogram<u64>,
    /// Each sender's latency histogram, in the order of `report.senders` (`None`: no report).
    pub sender_latency: Vec<Option<Histogram<u64>>>,
    /// The senders' latency per interval of `latency_interval_s`, on the common time axis
    /// (empty if the senders sent none).
    pub latency_intervals: Vec<Histogram<u64>>,
    pub latency_interval_s: f64,
    /// The earliest sender's start (ns since the Unix epoch): the time axis' origin.
    pub start_unix_ns: u64,
    pub series_interval_s: f64,
    pub ids: Vec<u32>,
    pub series: Vec<Vec<u64>>,
}

/// How far a step of a sweep or a rotation got: a sweep's files list every step asked for,
/// so that one stopped early says so without its stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    /// Ran to its end.
    Done,
    /// Cut short by Ctrl-C: its figures are what was measured until then.
    Interrupted,
    /// Could not be launched: no figures, and the sweep stopped.
    NotLaunched,
    /// Not run: an earlier step stopped the sweep.
    NotRun,
}

impl StepStatus {
    pub fn name(self) -> &'static str {
        match self {
            StepStatus::Done => "done",
            StepStatus::Interrupted => "interrupted",
            StepStatus::NotLaunched => "not launched",
            StepStatus::NotRun => "not run",
        }
    }

    /// Whether the step measured anything (its figures mean something).
    pub fn ran(self) -> bool {
        matches!(self, StepStatus::Done | StepStatus::Interrupted)
    }
}

/// One step of a sweep, as the thesis tabulated it by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    pub per_sender: u32,
    /// Its figures are zero where the step did not run.
    pub status: StepStatus,
    pub requested: u32,
    pub started: u32,
    pub gbps: f64,
    pub fairness: f64,
    /// p50, p99, p99.9 in µs.
    pub latency_us: [f64; 3],
}

impl SweepRow {
    pub fn of(per_sender: u32, status: StepStatus, r: &IncastReport) -> SweepRow {
        let l = &r.total.latency;
        SweepRow {
            per_sender,
            status,
            requested: r.flows_requested,
            started: r.flows_started,
            gbps: r.total.gbps,
            fairness: r.fairness,
            latency_us: [us(l.p50_ns), us(l.p99_ns), us(l.p999_ns)],
        }
    }

    /// A step that did not run (`status` says why).
    pub fn unrun(per_sender: u32, status: StepStatus) -> SweepRow {
        SweepRow {
            per_sender,
            status,
            requested: 0,
            started: 0,
            gbps: 0.0,
            fairness: 0.0,
            latency_us: [0.0; 3],
        }
    }
}

/// A rotating incast (`--pattern rotating-incast`): its steps in order and the pairs of all.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RotationReport {
    pub tool: String,
    pub pattern: String,
    /// Steps asked for (--steps, or one per host).
    #[serde(default)]
    pub steps_asked: usize,
    /// Steps that ran to their end; fewer than asked where the rotation stopped early.
    #[serde(default)]
    pub steps_done: usize,
    /// Why the rotation stopped before its end (Ctrl-C, a step that could not be launched).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stopped: Option<String>,
    /// Every step that ran, one cut short by Ctrl-C too (`stopped` names it).
    pub steps: Vec<RotationStep>,
    pub pairs: PairMatrix,
}

/// One step of a rotating incast: its sink and headline figures (its own incast.json has all).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RotationStep {
    pub step: usize,
    pub sink: String,
    pub dir: String,
    pub flows_requested: u32,
    pub flows_started: u32,
    pub gbps: f64,
    pub fairness: f64,
    pub p99_us: f64,
}

impl RotationStep {
    pub fn of(step: usize, sink: &str, dir: &std::path::Path, r: &IncastReport) -> RotationStep {
        RotationStep {
            step,
            sink: sink.into(),
            dir: dir.display().to_string(),
            flows_requested: r.flows_requested,
            flows_started: r.flows_started,
            gbps: r.total.gbps,
            fairness: r.fairness,
            p99_us: us(r.total.latency.p99_ns),
        }
    }
}

/// The throughput plot's data: the total and one line per sender, and below them the spread
/// of the per-flow rates (min, p10, median, p90, max), in Mb/s. Each is binned to what it can
/// show: a flow's throughput over one 10 ms bucket is 0 or a whole message (triangle waves),
/// so the spread's points hold a few messages of every flow (8 to 40 points over the run);
/// the total and the senders sum many flows and keep a finer time axis (about 100 points,
/// at least 20 messages of all flows per point).
pub struct ThroughputPlot {
    pub total: Series,
    pub senders: Vec<Series>,
    /// (time, [min, p10, median, p90, max]) per point.
    pub spread: Vec<(f64, [f64; 5])>,
}

pub fn throughput_plot(m: &Merged) -> ThroughputPlot {
    let len = m.series.iter().map(Vec::len).max().unwrap_or(0);
    let r = &m.report;
    let flows = m.series.len().max(1) as f64;
    let msg = r.total.bytes as f64 / r.total.ops.max(1) as f64;
    let per_flow_bucket = r.total.bytes as f64 / flows / len.max(1) as f64;
    let for_messages = (4.0 * msg / per_flow_bucket.max(1.0)).ceil() as usize;
    let coarse = (len / 40).max(for_messages).min(len / 8).max(1);
    let total_msgs_per_bucket = r.total.ops as f64 / len.max(1) as f64;
    let fine = (len / 100)
        .max((20.0 / total_msgs_per_bucket.max(1e-9)).ceil() as usize)
        .min(coarse)
        .max(1);
    // Bytes per flow per bin of `per_bin` buckets, and that as Mb/s.
    let binned = |per_bin: usize| -> Vec<Vec<u64>> {
        m.series
            .iter()
            .map(|s| {
                (0..len.div_ceil(per_bin))
                    .map(|b| s.iter().skip(b * per_bin).take(per_bin).sum())
                    .collect()
            })
            .collect()
    };
    let mbps = |bytes: u64, per_bin: usize| {
        bytes as f64 * 8.0 / (m.series_interval_s * per_bin as f64) / 1e6
    };
    let at = |b: usize, per_bin: usize| b as f64 * m.series_interval_s * per_bin as f64;
    let fine_bins = binned(fine);
    let line = |name: String, flows: &[usize]| Series {
        name,
        points: (0..len.div_ceil(fine))
            .map(|b| {
                let bytes = flows.iter().map(|&f| fine_bins[f][b]).sum();
                (at(b, fine), mbps(bytes, fine))
            })
            .collect(),
    };
    let all: Vec<usize> = (0..m.series.len()).collect();
    let per_sender = r.flows_per_sender.max(1);
    let senders = (0..m.ids.len().div_ceil(per_sender as usize))
        .map(|k| {
            let flows: Vec<usize> = (0..m.ids.len())
                .filter(|&f| (m.ids[f] / per_sender) as usize == k)
                .collect();
            let host = r
                .senders
                .get(k)
                .map_or_else(|| format!("sender {k}"), |s| s.host.clone());
            line(host, &flows)
        })
        .collect();
    let coarse_bins = binned(coarse);
    let spread = (0..len.div_ceil(coarse))
        .map(|b| {
            let mut v: Vec<f64> = coarse_bins.iter().map(|f| mbps(f[b], coarse)).collect();
            v.sort_by(f64::total_cmp);
            let q = |q: f64| {
                v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
                    .copied()
                    .unwrap_or(0.0)
            };
            (at(b, coarse), [q(0.0), q(0.1), q(0.5), q(0.9), q(1.0)])
        })
        .collect();
    ThroughputPlot {
        total: line("total".into(), &all),
        senders,
        spread,
    }
}

/// HdrHistogram's percentile plot: x in "nines" (1 = 90%, 2 = 99%, 3 = 99.9%) shows the
/// tail; y in `unit` ([`time_unit`] of the largest latency).
pub fn percentile_points(h: &Histogram<u64>, unit: TimeUnit) -> Vec<(f64, f64)> {
    h.iter_quantiles(5)
        .map(|v| (v.quantile_iterated_to(), v.value_iterated_to()))
        .filter(|&(q, _)| q < 1.0)
        .map(|(q, v)| (-(1.0 - q).log10(), v as f64 / unit.ns))
        .collect()
}

/// A unit for an axis of durations: its name and its length in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeUnit {
    pub name: &'static str,
    pub ns: f64,
}

/// The unit that shows `max_ns` as a number from 1 to 999 (an axis reading "600000.0 us"
/// says 0.6 s).
pub fn time_unit(max_ns: u64) -> TimeUnit {
    let (name, ns) = match max_ns {
        0..=999 => ("ns", 1.0),
        1_000..=999_999 => ("us", 1e3),
        1_000_000..=999_999_999 => ("ms", 1e6),
        _ => ("s", 1e9),
    };
    TimeUnit { name, ns }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::stats::new_histogram;

    fn merged(buckets: usize, bytes_per_bucket: u64, ops: u64) -> Merged {
        let latency: Histogram<u64> = new_histogram();
        let bytes = buckets as u64 * bytes_per_bucket;
        Merged {
            report: IncastReport {
                tool: String::new(),
                receiver: "r".into(),
                stopped: None,
                flows_per_sender: 1,
                flows_requested: 1,
                flows_started: 1,
                launch_to_first_byte_s: Some(0.0),
                clock_note: None,
                start_skew_us: 0.0,
                duration_s: 1.0,
                total: Totals::new(ops, bytes, 1.0, &latency),
                fairness: 1.0,
                senders: Vec::new(),
                flows: Vec::new(),
                pattern: None,
                pairs: None,
                ops: BTreeMap::new(),
            },
            latency,
            sender_latency: Vec::new(),
            latency_intervals: Vec::new(),
            latency_interval_s: 0.0,
            start_unix_ns: 0,
            series_interval_s: 0.01,
            ids: vec![0],
            series: vec![vec![bytes_per_bucket; buckets]],
        }
    }

    #[test]
    fn throughput_is_rebinned_to_several_messages_per_point_and_keeps_its_rate() {
        // 100 buckets of 10 ms, one 1000-byte message each: 4 messages per point.
        // The spread: 4 messages per point; the total too (it is never coarser).
        let p = throughput_plot(&merged(100, 1000, 100));
        assert_eq!((p.spread.len(), p.total.points.len()), (25, 25));
        for &(_, mbps) in &p.total.points {
            assert!((mbps - 0.8).abs() < 1e-9, "{mbps}");
        }
        assert_eq!(p.senders.len(), 1);
        assert_eq!(p.senders[0].points, p.total.points);
        for (_, q) in &p.spread {
            assert!(q.iter().all(|v| (v - 0.8).abs() < 1e-9), "{q:?}");
        }
        // Huge messages: still at least 8 points.
        assert_eq!(throughput_plot(&merged(100, 1000, 1)).spread.len(), 9);
        // Many small messages: the total keeps about 100 points.
        assert_eq!(
            throughput_plot(&merged(1000, 1000, 100_000))
                .total
                .points
                .len(),
            100
        );
    }

    #[test]
    fn time_units_keep_axis_numbers_short() {
        assert_eq!(time_unit(999).name, "ns");
        assert_eq!(time_unit(45_000).name, "us");
        assert_eq!(time_unit(600_000_000).name, "ms");
        assert_eq!(time_unit(2_000_000_000).name, "s");
    }

    #[test]
    fn senders_sum_their_flows_and_the_spread_orders_the_flows() {
        let mut m = merged(8, 1000, 8);
        // Two senders of two flows: flows 0,1 (sender 0) and 2,3 (sender 1).
        m.report.flows_per_sender = 2;
        m.ids = vec![0, 1, 2, 3];
        m.series = vec![vec![1000; 8], vec![2000; 8], vec![0; 8], vec![4000; 8]];
        let p = throughput_plot(&m);
        let dt = 0.01; // 8 buckets, 8 messages per bucket: one bucket per point
        let mbps = |b: f64| b * 8.0 / dt / 1e6;
        assert_eq!(p.senders.len(), 2);
        assert!((p.senders[0].points[0].1 - mbps(3000.0)).abs() < 1e-9);
        assert!((p.senders[1].points[0].1 - mbps(4000.0)).abs() < 1e-9);
        assert!((p.total.points[0].1 - mbps(7000.0)).abs() < 1e-9);
        let q = p.spread[0].1;
        assert_eq!(q[0], 0.0);
        assert!((q[4] - mbps(4000.0)).abs() < 1e-9);
        assert!(q.windows(2).all(|w| w[0] <= w[1]), "{q:?}");
    }
}

//! What a run measured, as data: per-flow and total throughput, latency percentiles from
//! HdrHistograms, fairness. `export/` turns a [`RunReport`] into files, one format per file.
pub mod export;
pub mod fct;
pub mod figures;
pub mod incast;
pub mod latency;
pub mod ops;
pub mod pairs;
pub mod pcap;
pub mod table;

/// Nanoseconds as microseconds, the unit every report prints.
pub fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}
pub mod plot;

use hdrhistogram::Histogram;
pub use latency::Latency;
use ops::{OpReport, ServerReport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One flow (one RC QP) of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowReport {
    pub flow: u32,
    pub ops: u64,
    pub bytes: u64,
    /// Payload rate over the run's measured time, in Gb/s.
    pub gbps: f64,
    /// "ok", or why the flow ended early (its completion status, e.g. "transport retry counter exceeded").
    pub status: String,
    /// When the flow posted its first operation, after the common start (ns).
    pub first_post_ns: Option<u64>,
    pub latency: Latency,
    /// Operations still in flight when the run ended (not counted; not an error).
    #[serde(default)]
    pub in_flight: u32,
    /// Open loop: sends due by its schedule that it never posted (it could not keep up).
    #[serde(default)]
    pub missed: u64,
    /// Bytes completed per `series_interval_s` since the start (with `--json-series`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Vec<u64>>,
}

/// Totals over all flows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Totals {
    pub ops: u64,
    pub bytes: u64,
    pub gbps: f64,
    pub mops: f64,
    pub latency: Latency,
}

impl Totals {
    /// `ops` operations moving `bytes` in `seconds`, with the latency of every operation.
    pub fn new(ops: u64, bytes: u64, seconds: f64, latency: &Histogram<u64>) -> Totals {
        Totals {
            ops,
            bytes,
            gbps: gbps(bytes, seconds),
            mops: ops as f64 / seconds / 1e6,
            latency: Latency::of(latency),
        }
    }
}

/// Throughput in the steady state: completions between the end of the warm-up and the start
/// of the cool-down (perftest's margins), without the ramp up (set-up skew, first posts) and
/// the ramp down (flows stopping, the drain) that the whole-run figures include.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Steady {
    /// The window, s after the start.
    pub from_s: f64,
    pub until_s: f64,
    /// Completed inside the window.
    pub ops: u64,
    pub bytes: u64,
    /// The rate: each thread's completions between its first and last completion event in
    /// the window over the time between them, summed over the threads (no edge error: a
    /// window count is off by up to one batch of completions at each edge); the window's
    /// count over its length where a thread saw fewer than two events.
    pub gbps: f64,
    pub mops: f64,
}

impl Steady {
    pub fn new(from_s: f64, until_s: f64, ops: u64, bytes: u64) -> Steady {
        let seconds = (until_s - from_s).max(f64::MIN_POSITIVE);
        Steady {
            from_s,
            until_s,
            ops,
            bytes,
            gbps: gbps(bytes, seconds),
            mops: ops as f64 / seconds / 1e6,
        }
    }

    /// The rate between completion events, from every thread's span (see [`Steady::gbps`]).
    pub fn between_completions(self, spans: &[crate::gen::stats::SteadySpan]) -> Steady {
        let timed: Vec<_> = spans.iter().filter(|s| s.first_ns.is_some()).collect();
        if timed.is_empty() || timed.iter().any(|s| s.seconds() <= 0.0) {
            return self;
        }
        let bits: f64 = timed
            .iter()
            .map(|s| s.bytes as f64 * 8.0 / s.seconds())
            .sum();
        let ops: f64 = timed.iter().map(|s| s.ops as f64 / s.seconds()).sum();
        Steady {
            gbps: bits / 1e9,
            mops: ops / 1e6,
            ..self
        }
    }
}

/// Resident memory per flow, itemized (the items add up to the peak): the process before
/// the flows were made, what the provider's queues took (the QPs and CQs
/// made, less our buffers), our registered buffers, and what the run added by its peak (our
/// per-flow histograms and counters). From `/proc/self/status` around the set-up: the
/// allocator's and the kernel's rounding fall into one item or another.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryPerFlow {
    /// The process before the flows were made (program, libraries, device), shared out.
    #[serde(default)]
    pub baseline_bytes: u64,
    pub provider_queues_bytes: u64,
    pub buffers_bytes: u64,
    pub run_state_bytes: u64,
}

fn one() -> u32 {
    1
}

/// The spread (latest − earliest) of instants given in ns, in µs; 0 when there are none.
pub fn spread_us(instants: &[u64]) -> f64 {
    match (instants.iter().min(), instants.iter().max()) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e3,
        _ => 0.0,
    }
}

/// How a run ended; also decides the exit code (see the CLI's `run --help`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    /// Open loop: fewer than [`OVERLOAD_SHARE`] of the sends its schedule made due were
    /// posted: the rate asked for was not offered.
    Overloaded,
    FlowErrors,
    PeerLost,
    Interrupted,
}

/// An open-loop run that posted less than this share of its due sends is `Overloaded`.
pub const OVERLOAD_SHARE: f64 = 0.95;

/// What an open-loop run was asked to offer and what it did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OpenLoop {
    /// The rate asked for: per flow × flows started, operations per second.
    pub offered_ops_per_s: f64,
    /// Operations completed per second of measured time.
    pub achieved_ops_per_s: f64,
    /// Sends the schedule made due before posting stopped, and of those, how many were
    /// never posted (every slot of the flow was in flight) and their share.
    pub due: u64,
    pub missed: u64,
    pub missed_share: f64,
}

impl OpenLoop {
    /// From the flows' counts: posted = completed + in flight (+ failed), due = posted + missed.
    pub fn new(ops_per_s_per_flow: f64, flows: &[FlowReport], duration_s: f64) -> OpenLoop {
        let started = flows.iter().filter(|f| f.first_post_ns.is_some()).count();
        let ops: u64 = flows.iter().map(|f| f.ops).sum();
        let posted: u64 = flows.iter().map(|f| f.ops + u64::from(f.in_flight)).sum();
        let missed: u64 = flows.iter().map(|f| f.missed).sum();
        let due = posted + missed;
        OpenLoop {
            offered_ops_per_s: ops_per_s_per_flow * started as f64,
            achieved_ops_per_s: if duration_s > 0.0 {
                ops as f64 / duration_s
            } else {
                0.0
            },
            due,
            missed,
            missed_share: if due > 0 {
                missed as f64 / due as f64
            } else {
                0.0
            },
        }
    }

    /// Whether the run failed to offer its rate.
    pub fn overloaded(&self) -> bool {
        self.missed_share > 1.0 - OVERLOAD_SHARE
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub tool: String,
    pub device: String,
    pub server: String,
    /// The verbs name of the run's one op (RDMA_WRITE, SEND, ...), or MIX(write:70,...).
    pub op: String,
    /// "rc" (reliable connected) or "ud" (unreliable datagram).
    #[serde(default)]
    pub qp_type: String,
    /// closed (K outstanding per flow), open (paced), or pingpong (round trips).
    pub mode: String,
    pub size: u32,
    pub depth: u32,
    /// One operation in this many was signaled (`--signal-every`); above 1 the latency of
    /// the others runs to the completion that covered them (an upper bound).
    #[serde(default = "one")]
    pub signal_every: u32,
    pub threads: u32,
    /// CPUs in the process's affinity mask: more polling threads than this take turns.
    #[serde(default)]
    pub cpus: u32,
    /// Each thread: the CPU it was pinned to (`--pin`), its flows and what they moved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_thread: Vec<ThreadReport>,
    pub flows_requested: u32,
    pub flows_started: u32,
    /// How the flows' QPs were connected: "tcp" (QP numbers exchanged out of band) or
    /// "rdma_cm".
    #[serde(default)]
    pub connection: String,
    /// From process start to the common start signal: device, QPs, exchange, barrier.
    pub setup_s: f64,
    /// Spread of the flows' first posts after the start signal.
    pub start_skew_us: f64,
    /// Wall-clock time of the start signal (ns since the Unix epoch): flows of several
    /// processes or hosts line up on it (as well as the hosts' clocks agree).
    pub start_unix_ns: u64,
    /// Interval of the per-flow `series`.
    pub series_interval_s: f64,
    /// Operations posted in this first part of the run are not in the latency figures.
    #[serde(default)]
    pub warmup_s: f64,
    /// Measured time: from the start signal to the last completion.
    pub duration_s: f64,
    pub outcome: Outcome,
    /// Open loop: offered vs achieved rate and the sends never posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_loop: Option<OpenLoop>,
    /// Over the whole measured time.
    pub total: Totals,
    /// Between warm-up and cool-down.
    #[serde(default)]
    pub steady: Steady,
    /// Jain's index over per-flow throughput: 1 = perfectly fair, 1/n = one flow has it all.
    pub fairness: f64,
    /// Peak resident memory of the process over the run, divided by the number of flows.
    pub rss_per_flow_bytes: u64,
    /// The same, itemized (from the resident memory before and after the flows were made).
    #[serde(default)]
    pub memory_per_flow: MemoryPerFlow,
    pub server_received_bytes: Option<u64>,
    /// By op type of the run ("write", "read", ...): what completed and its latency.
    #[serde(default)]
    pub ops: BTreeMap<String, OpReport>,
    /// What the server reported at the end, by op type, with its checks (unless it was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_counts: Option<ServerReport>,
    /// The latency of every operation: an HdrHistogram (V2, compressed, base64), so reports of
    /// several senders merge exactly (`hist::decode`).
    pub histogram: String,
    /// With `--json-series`: the latency of each `latency_interval_s` since the start, encoded
    /// like `histogram` (an incast merges its senders' into one interval log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_intervals: Option<Vec<String>>,
    #[serde(default)]
    pub latency_interval_s: f64,
    /// The device port's own counters (sysfs `counters/`, `hw_counters/`): how much each
    /// rose over the measured phase (retransmissions, out-of-sequence, CNPs, ECN marks, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub port_counters: BTreeMap<String, u64>,
    /// `--size DIST`: the distribution the sizes were drawn from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<fct::SizesReport>,
    /// `--fct`: completion time and slowdown by size bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fct: Option<fct::FctReport>,
    pub flows: Vec<FlowReport>,
}

/// One sending thread of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadReport {
    pub thread: u32,
    pub cpu: Option<usize>,
    pub flows: u32,
    pub ops: u64,
    pub bytes: u64,
    /// Over the whole measured time.
    pub gbps: f64,
}

/// HdrHistograms in reports: compressed V2 encoding in base64, the form HdrHistogram's own
/// tools exchange.
pub mod hist {
    use base64::Engine;
    use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
    use hdrhistogram::Histogram;

    pub fn encode(h: &Histogram<u64>) -> String {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(h, &mut bytes)
            .expect("serializing to memory");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A sender's histogram: its stated lengths checked before it is decoded (one crafted or
    /// corrupt report must not make a merge allocate gigabytes and abort, losing the others).
    pub fn decode(text: &str) -> Result<Histogram<u64>, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("histogram is not base64: {e}"))?;
        crate::table::samples::decode_histogram_bytes(&bytes)
            .map_err(|e| format!("histogram does not decode: {e}"))
    }
}

/// Jain's fairness index (Σx)² / (n·Σx²); 1.0 for an empty or all-zero set.
pub fn jain(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let sum_sq: f64 = values.iter().map(|x| x * x).sum();
    if values.is_empty() || sum_sq == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * sum_sq)
}

/// Gb/s of `bytes` moved in `seconds`.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds / 1e9
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn latency_figures_equal_the_histograms_own() {
        let mut h: Histogram<u32> = crate::gen::stats::new_histogram();
        for (k, v) in [1u64, 7, 999, 1_000, 1_001, 12_345, 2_000_000, 300_000_000]
            .iter()
            .enumerate()
        {
            h.record_n(*v, k as u32 + 1).unwrap();
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, h.len());
        assert!((l.mean_ns - h.mean()).abs() < 1e-6 * h.mean(), "{l:?}");
        assert!((l.stdev_ns - h.stdev()).abs() < 1e-6 * h.stdev(), "{l:?}");
        for (got, q) in [
            (l.p50_ns, 0.5),
            (l.p90_ns, 0.9),
            (l.p99_ns, 0.99),
            (l.p999_ns, 0.999),
            (l.p9999_ns, 0.9999),
        ] {
            assert_eq!(got, h.value_at_quantile(q), "q {q}");
        }
        assert_eq!((l.min_ns, l.max_ns), (h.min(), h.max()));
    }

    use super::*;

    fn flow(ops: u64, in_flight: u32, missed: u64, started: bool) -> FlowReport {
        FlowReport {
            flow: 0,
            ops,
            bytes: ops * 64,
            gbps: 0.0,
            status: "ok".into(),
            first_post_ns: started.then_some(1),
            latency: Latency::of(&Histogram::<u64>::new(3).unwrap()),
            in_flight,
            missed,
            series: None,
        }
    }

    #[test]
    fn open_loop_adds_up_and_says_when_it_was_overloaded() {
        // Two flows started at 100 ops/s each over 2 s: 400 due.
        let ok = OpenLoop::new(100.0, &[flow(198, 1, 1, true), flow(199, 0, 1, true)], 2.0);
        assert_eq!((ok.due, ok.missed), (400, 2));
        assert_eq!(ok.offered_ops_per_s, 200.0);
        assert_eq!(ok.achieved_ops_per_s, 198.5);
        assert!(!ok.overloaded());
        // A flow that never started offers nothing; 30 of 100 missed is overload.
        let over = OpenLoop::new(100.0, &[flow(60, 10, 30, true), flow(0, 0, 0, false)], 1.0);
        assert_eq!(over.offered_ops_per_s, 100.0);
        assert!((over.missed_share - 0.3).abs() < 1e-12);
        assert!(over.overloaded());
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        let mid = jain(&[1.0, 2.0, 3.0]);
        assert!((mid - 36.0 / 42.0).abs() < 1e-12, "{mid}");
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn latency_summary_from_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!(
            (l.p50_ns as f64 - 500_000.0).abs() / 500_000.0 < 0.002,
            "{l:?}"
        );
        assert!(
            (l.p99_ns as f64 - 990_000.0).abs() / 990_000.0 < 0.002,
            "{l:?}"
        );
        assert!(l.min_ns <= l.p50_ns && l.p50_ns <= l.max_ns);
        assert_eq!(
            Latency::of(&Histogram::<u64>::new(3).unwrap()),
            Latency::default()
        );
    }

    #[test]
    fn histograms_survive_the_report() {
        let mut h = crate::gen::stats::new_histogram();
        for v in [1_000u64, 2_000, 50_000, 7_000_000] {
            h.record(v).unwrap();
        }
        let back = hist::decode(&hist::encode(&h)).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(Latency::of(&back), Latency::of(&h));
        assert!(hist::decode("not base64!").is_err());
    }

    #[test]
    fn rates() {
        assert!((gbps(1_000_000_000, 8.0) - 1.0).abs() < 1e-12);
        assert_eq!(gbps(5, 0.0), 0.0);
    }
}

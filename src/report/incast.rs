//! What `ibjitter incast` reports: every sender's fate, every flow numbered across senders,
//! the totals ([`IncastReport`], its JSON), with the merged latency histogram and time series
//! ([`Merged`]); a sweep's table ([`SweepRow`]); and the plots' data. `incast::merge` computes
//! it, `export::incast` writes it.
use crate::report::plot::Series;
use crate::report::{us, Latency, Outcome, Totals};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// How one sender fared.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SenderSummary {
    pub host: String,
    /// "ok", or what went wrong ("exit status 3", "failed to launch: ...", "no report").
    pub status: String,
    pub exit_code: Option<i32>,
    pub outcome: Option<Outcome>,
    pub flows_requested: u32,
    pub flows_started: u32,
    pub gbps: f64,
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
    /// From the launch of the first process to the first operation of any flow.
    pub launch_to_first_byte_s: f64,
    /// Spread of every flow's first post, across hosts (wall clocks: as synchronized as the
    /// hosts' clocks are; exact on the bench, where all hosts share one).
    pub start_skew_us: f64,
    pub duration_s: f64,
    pub total: Totals,
    pub fairness: f64,
    pub senders: Vec<SenderSummary>,
    pub flows: Vec<IncastFlow>,
}

/// Everything merged, plus the data the exports need.
pub struct Merged {
    pub report: IncastReport,
    pub latency: Histogram<u64>,
    pub series_interval_s: f64,
    pub ids: Vec<u32>,
    pub series: Vec<Vec<u64>>,
}

/// One step of a sweep, as the thesis tabulated it by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    pub per_sender: u32,
    pub requested: u32,
    pub started: u32,
    pub gbps: f64,
    pub fairness: f64,
    /// p50, p99, p99.9 in µs.
    pub latency_us: [f64; 3],
}

impl SweepRow {
    pub fn of(per_sender: u32, r: &IncastReport) -> SweepRow {
        let l = &r.total.latency;
        SweepRow {
            per_sender,
            requested: r.flows_requested,
            started: r.flows_started,
            gbps: r.total.gbps,
            fairness: r.fairness,
            latency_us: [us(l.p50_ns), us(l.p99_ns), us(l.p999_ns)],
        }
    }
}

/// Per-flow throughput over time, one line per flow (Mb/s). Rebinned so each point averages
/// several messages per flow (at the CSV's 10 ms, a flow that completes a few large messages
/// a second draws a comb of spikes), keeping at least 8 points.
pub fn throughput_lines(m: &Merged) -> Vec<Series> {
    let len = m.series.iter().map(Vec::len).max().unwrap_or(0);
    let r = &m.report;
    let msg = r.total.bytes as f64 / r.total.ops.max(1) as f64;
    let per_flow_bucket = r.total.bytes as f64 / m.series.len().max(1) as f64 / len.max(1) as f64;
    let for_messages = (4.0 * msg / per_flow_bucket.max(1.0)).ceil() as usize;
    let per_bin = (len / 40).max(for_messages).min(len / 8).max(1);
    let dt = m.series_interval_s * per_bin as f64;
    m.ids
        .iter()
        .zip(&m.series)
        .map(|(id, s)| Series {
            name: format!("flow {id}"),
            points: s
                .chunks(per_bin)
                .enumerate()
                .map(|(k, c)| (k as f64 * dt, c.iter().sum::<u64>() as f64 * 8.0 / dt / 1e6))
                .collect(),
        })
        .collect()
}

/// HdrHistogram's percentile plot: x in "nines" (1 = 90%, 2 = 99%, 3 = 99.9%) shows the
/// tail; y in µs.
pub fn percentile_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    h.iter_quantiles(5)
        .map(|v| (v.quantile_iterated_to(), v.value_iterated_to()))
        .filter(|&(q, _)| q < 1.0)
        .map(|(q, v)| (-(1.0 - q).log10(), v as f64 / 1e3))
        .collect()
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
                flows_per_sender: 1,
                flows_requested: 1,
                flows_started: 1,
                launch_to_first_byte_s: 0.0,
                start_skew_us: 0.0,
                duration_s: 1.0,
                total: Totals::new(ops, bytes, 1.0, &latency),
                fairness: 1.0,
                senders: Vec::new(),
                flows: Vec::new(),
            },
            latency,
            series_interval_s: 0.01,
            ids: vec![0],
            series: vec![vec![bytes_per_bucket; buckets]],
        }
    }

    #[test]
    fn throughput_is_rebinned_to_several_messages_per_point_and_keeps_its_rate() {
        // 100 buckets of 10 ms, one 1000-byte message each: 4 messages per point.
        let lines = throughput_lines(&merged(100, 1000, 100));
        assert_eq!(lines[0].points.len(), 25);
        for &(_, mbps) in &lines[0].points {
            assert!((mbps - 0.8).abs() < 1e-9, "{mbps}");
        }
        // Huge messages: still at least 8 points.
        assert_eq!(
            throughput_lines(&merged(100, 1000, 1))
                .first()
                .unwrap()
                .points
                .len(),
            9
        );
    }
}

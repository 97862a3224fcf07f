//! What one flow measured: operation and byte counts (all, and in the steady-state window), a
//! latency histogram, bytes per time-series interval when kept, and why it ended if it ended
//! early; and per thread, by op type ([`OpTally`]).
pub use super::histogram::{new_histogram, record};
use super::intervals::Sink;
use super::ops::Op;
use hdrhistogram::Histogram;

/// One flow's latencies: 1 significant digit (HdrHistogram's 16 sub-buckets per power of two:
/// each value within 1/16, 6.25 %), 1 ns to 100 s, 32-bit counters, allocated once: 544
/// counters, 2.1 KiB, so 10,000 flows fit in well under 16 KiB of our memory each. They
/// give each flow's own percentiles (fairness, the slowest flow); the run's totals and every
/// op type's are kept apart at 3 digits (0.1 %), per thread ([`Recorder`]). (Flows kept 3
/// digits and grew with their largest latency: ~90 KiB each, and when 4,000 flows'
/// latencies crossed a power of two together the copies stalled the thread for seconds
/// under TCG; then 2 digits, 15.5 KiB.)
pub type FlowHistogram = Histogram<u32>;

/// The longest latency a flow's histogram holds; longer ones are counted at this value.
pub const FLOW_HISTOGRAM_MAX_NS: u64 = 100_000_000_000;

pub fn new_flow_histogram() -> FlowHistogram {
    Histogram::new_with_bounds(1, FLOW_HISTOGRAM_MAX_NS, 1).expect("valid histogram bounds")
}

pub struct FlowStats {
    pub flow: u32,
    pub ops: u64,
    pub bytes: u64,
    pub latency: FlowHistogram,
    pub first_post_ns: Option<u64>,
    pub last_completion_ns: u64,
    /// Operations and bytes completed inside the steady-state window (after the warm-up,
    /// before the cool-down).
    pub steady_ops: u64,
    pub steady_bytes: u64,
    /// Bytes completed in each interval since the start: kept only for `--json-series`
    /// (it grows with the run; the CSV time series streams instead).
    pub series: Vec<u64>,
    pub error: Option<String>,
    /// Operations still in flight when the run stopped and the drain limit passed: not
    /// counted, not an error (a timed run always ends with some in flight).
    pub in_flight: u32,
    /// Open loop: sends the schedule made due before posting stopped that were never posted
    /// (the flow could not keep up: all its depth was in flight).
    pub missed: u64,
}

impl FlowStats {
    pub fn new(flow: u32) -> FlowStats {
        FlowStats {
            flow,
            ops: 0,
            bytes: 0,
            latency: new_flow_histogram(),
            first_post_ns: None,
            last_completion_ns: 0,
            steady_ops: 0,
            steady_bytes: 0,
            series: Vec::new(),
            error: None,
            in_flight: 0,
            missed: 0,
        }
    }

    /// Counts one completed operation of `bytes`, completing at `now_ns`; its latency goes into
    /// the histogram unless it is None (warm-up); `series_ns`: the kept series' interval.
    pub fn complete(
        &mut self,
        bytes: u64,
        latency_ns: Option<u64>,
        now_ns: u64,
        series_ns: Option<u64>,
    ) {
        self.ops += 1;
        self.bytes += bytes;
        if let Some(latency) = latency_ns {
            record(&mut self.latency, latency);
        }
        self.last_completion_ns = now_ns;
        if let Some(interval_ns) = series_ns {
            let bucket = (now_ns / interval_ns) as usize;
            if bucket >= self.series.len() {
                self.series.resize(bucket + 1, 0);
            }
            self.series[bucket] += bytes;
        }
    }

    pub fn posted(&mut self, now_ns: u64) {
        self.first_post_ns.get_or_insert(now_ns);
    }
}

/// One op type's completions on one thread: counts, latency (3 digits, like the totals), and
/// for cmp_swap how many found the value they expected (swapped).
#[derive(Clone)]
pub struct OpTally {
    pub ops: u64,
    pub bytes: u64,
    pub latency: Histogram<u64>,
    pub swapped: u64,
}

impl Default for OpTally {
    fn default() -> Self {
        OpTally {
            ops: 0,
            bytes: 0,
            latency: new_histogram(),
            swapped: 0,
        }
    }
}

impl OpTally {
    /// Adds another thread's tally of the same op.
    pub fn add(&mut self, other: &OpTally) {
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.swapped += other.swapped;
        self.latency
            .add(&other.latency)
            .expect("histograms grow to fit");
    }
}

/// One tally per op type, indexed by [`Op::index`].
pub type ByOp = [OpTally; 6];

/// A thread's completions inside the steady-state window, measured between completion events:
/// from the first poll that found a completion in the window to the last one, and what was
/// completed after the first (the first event's batch completed "at" the start edge). Its
/// rate has no edge error: a window count is off by up to one batch of completions at each
/// edge (with one flow signalling every 100th of 128 outstanding writes, about ±3 %).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteadySpan {
    pub first_ns: Option<u64>,
    pub last_ns: u64,
    pub ops: u64,
    pub bytes: u64,
}

impl SteadySpan {
    fn complete(&mut self, bytes: u64, now_ns: u64) {
        match self.first_ns {
            None => {
                self.first_ns = Some(now_ns);
                self.last_ns = now_ns;
            }
            Some(first) if now_ns > first => {
                self.ops += 1;
                self.bytes += bytes;
                self.last_ns = now_ns;
            }
            Some(_) => {}
        }
    }

    /// Seconds from the first completion event to the last; 0 with fewer than two.
    pub fn seconds(&self) -> f64 {
        self.first_ns
            .map_or(0.0, |f| self.last_ns.saturating_sub(f) as f64 / 1e9)
    }
}

/// Where one thread's completions go: its flows' stats, the streamed intervals (time series
/// and HdrHistogram log, [`Sink`]) and the steady-state window. Operations posted during the
/// warm-up count in bytes and time series but not in latency: the first operation of each of
/// hundreds of flows waits behind the set-up of all the others, and would otherwise be the
/// p99. Throughput's steady state counts completions between `steady_ns.0` and `steady_ns.1`.
pub struct Recorder {
    /// Every measured latency of the thread's flows, at full precision: the run's totals
    /// (the flows' own histograms keep 1 digit).
    pub total: Histogram<u64>,
    /// The same completions by op type.
    pub by_op: ByOp,
    sink: Option<Sink>,
    /// `--json-series`: the interval of the series each flow keeps.
    kept_series_ns: Option<u64>,
    warmup_ns: u64,
    steady_ns: (u64, u64),
    steady: SteadySpan,
}

impl Recorder {
    pub fn new(
        sink: Option<Sink>,
        kept_series_ns: Option<u64>,
        warmup_ns: u64,
        steady_ns: (u64, u64),
    ) -> Recorder {
        Recorder {
            total: new_histogram(),
            by_op: Default::default(),
            sink,
            kept_series_ns,
            warmup_ns,
            steady_ns,
            steady: SteadySpan::default(),
        }
    }

    /// One `op` of flow `index` (of this thread) of `bytes` posted (or due, open loop) at
    /// `posted_ns`, completed at `now_ns`.
    pub fn complete(
        &mut self,
        index: usize,
        flow: &mut FlowStats,
        op: Op,
        bytes: u64,
        posted_ns: u64,
        now_ns: u64,
    ) {
        let latency = now_ns.saturating_sub(posted_ns);
        let measured = posted_ns >= self.warmup_ns;
        flow.complete(
            bytes,
            measured.then_some(latency),
            now_ns,
            self.kept_series_ns,
        );
        if (self.steady_ns.0..self.steady_ns.1).contains(&now_ns) {
            flow.steady_ops += 1;
            flow.steady_bytes += bytes;
            self.steady.complete(bytes, now_ns);
        }
        let tally = &mut self.by_op[op.index()];
        tally.ops += 1;
        tally.bytes += bytes;
        if measured {
            record(&mut self.total, latency);
            record(&mut tally.latency, latency);
        }
        if let Some(sink) = &mut self.sink {
            sink.complete(index, bytes, measured.then_some(latency), now_ns);
        }
    }

    /// Time passes (each loop of the thread): closes streamed intervals that are over.
    pub fn tick(&mut self, now_ns: u64) {
        if let Some(sink) = &mut self.sink {
            sink.tick(now_ns);
        }
    }

    /// A completed cmp_swap found the value it expected: it swapped.
    pub fn swapped(&mut self) {
        self.by_op[Op::CmpSwap.index()].swapped += 1;
    }

    /// The thread is done: its last intervals go to the writer. Returns its total histogram,
    /// its tallies by op and its steady-state span.
    pub fn finish(self) -> (Histogram<u64>, ByOp, SteadySpan) {
        if let Some(sink) = self.sink {
            sink.finish();
        }
        (self.total, self.by_op, self.steady)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_fill_counts_histogram_and_series() {
        let mut f = FlowStats::new(3);
        f.posted(5);
        f.posted(9);
        f.complete(100, Some(2_000), 15, Some(10));
        f.complete(100, Some(4_000), 35, Some(10));
        assert_eq!((f.ops, f.bytes, f.first_post_ns), (2, 200, Some(5)));
        assert_eq!(f.series, vec![0, 100, 0, 100]);
        assert_eq!(f.latency.len(), 2);
        assert!(f.latency.max() >= 4_000);
    }

    #[test]
    fn histograms_start_small_and_grow_to_an_hour() {
        let mut h: Histogram<u64> = new_histogram();
        let small = h.distinct_values();
        assert!(small <= 4096, "{small} counters before any value");
        record(&mut h, 1);
        record(&mut h, 3_600_000_000_000);
        assert_eq!(h.min(), 1);
        assert_eq!(h.max(), h.highest_equivalent(3_600_000_000_000));
        assert!(h.distinct_values() > small);
    }

    #[test]
    fn flow_histograms_are_fixed_at_one_digit_and_totals_keep_three() {
        let mut flow = new_flow_histogram();
        let size = flow.distinct_values();
        assert!(size * 4 <= 2200, "{size} counters");
        for v in [1u64, 999, 123_456, 9_876_543_210, 500_000_000_000] {
            record(&mut flow, v);
        }
        assert_eq!(flow.distinct_values(), size, "never grows");
        assert_eq!(flow.len(), 5);
        // 1 digit: within 1/16; beyond 100 s, counted at the limit.
        let p = flow.value_at_quantile(0.6);
        assert!((p as f64 / 123_456.0 - 1.0).abs() <= 1.0 / 16.0, "{p}");
        assert_eq!(flow.max(), flow.highest_equivalent(FLOW_HISTOGRAM_MAX_NS));
        let mut r = Recorder::new(None, None, 0, (0, u64::MAX));
        let mut f = FlowStats::new(0);
        r.complete(0, &mut f, Op::Write, 8, 0, 123_456);
        let (total, _, _) = r.finish();
        assert_eq!(
            total.value_at_quantile(0.5),
            total.highest_equivalent(123_456)
        );
        assert!(
            total.highest_equivalent(123_456) - 123_456 < 100,
            "3 digits"
        );
    }

    #[test]
    fn the_steady_span_runs_from_the_first_completion_event_to_the_last() {
        let mut s = SteadySpan::default();
        assert_eq!(s.seconds(), 0.0);
        // A batch of 3 completions found at 1 s (the start edge: not counted), then batches
        // of 100 ops at 2 s and 3 s.
        for _ in 0..3 {
            s.complete(10, 1_000_000_000);
        }
        for t in [2_000_000_000u64, 3_000_000_000] {
            for _ in 0..100 {
                s.complete(10, t);
            }
        }
        assert_eq!((s.ops, s.bytes, s.seconds()), (200, 2000, 2.0));
        let steady = crate::report::Steady::new(0.5, 3.5, 203, 2030).between_completions(&[s]);
        assert_eq!(steady.mops, 100.0 / 1e6);
        assert_eq!(steady.gbps, 1000.0 * 8.0 / 1e9);
        // A thread with a single event: the window's count stays.
        let mut one = SteadySpan::default();
        one.complete(10, 5);
        let w = crate::report::Steady::new(0.0, 2.0, 4, 40).between_completions(&[s, one]);
        assert_eq!(w.mops, 2.0 / 1e6);
    }

    #[test]
    fn warm_up_counts_bytes_but_not_latency_and_steady_state_its_window() {
        let (tx, rx) = super::super::intervals::channel();
        let sink = Sink::new(tx, 0, &[0], None, Some(100));
        let mut r = Recorder::new(Some(sink), None, 1_000, (1_000, 3_000));
        let mut f = FlowStats::new(0);
        r.complete(0, &mut f, Op::Write, 8, 500, 900); // posted during the warm-up
        r.complete(0, &mut f, Op::Read, 8, 1_500, 2_500);
        r.complete(0, &mut f, Op::Write, 8, 2_500, 3_500); // in the cool-down
        let (total, by_op, _) = r.finish();
        assert_eq!(total.len(), 2);
        // By op: every completion counted, latency only after the warm-up.
        let (w, rd) = (&by_op[Op::Write.index()], &by_op[Op::Read.index()]);
        assert_eq!((w.ops, w.bytes, w.latency.len()), (2, 16, 1));
        assert_eq!((rd.ops, rd.bytes, rd.latency.len()), (1, 8, 1));
        assert_eq!(by_op[Op::Send.index()].ops, 0);
        assert_eq!((f.ops, f.bytes, f.latency.len()), (3, 24, 2));
        assert_eq!((f.steady_ops, f.steady_bytes), (1, 8));
        assert!(f.series.is_empty(), "no series kept unless asked");
        let measured: u64 = rx
            .try_iter()
            .map(|m| match m {
                super::super::intervals::Message::Latency { hist, .. } => hist.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(measured, 2);
    }
}

//! What one flow measured: operation and byte counts, a latency histogram, bytes per
//! time-series interval, and why it ended if it ended early.
use hdrhistogram::Histogram;

/// Latency histograms track 1 ns .. 1 hour at 3 significant digits, growing as needed.
pub fn new_histogram() -> Histogram<u64> {
    let mut h =
        Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds");
    h.auto(true);
    h
}

pub struct FlowStats {
    pub flow: u32,
    pub ops: u64,
    pub bytes: u64,
    pub latency: Histogram<u64>,
    pub first_post_ns: Option<u64>,
    pub last_completion_ns: u64,
    /// Bytes completed in each interval since the start.
    pub series: Vec<u64>,
    pub error: Option<String>,
}

impl FlowStats {
    pub fn new(flow: u32) -> FlowStats {
        FlowStats {
            flow,
            ops: 0,
            bytes: 0,
            latency: new_histogram(),
            first_post_ns: None,
            last_completion_ns: 0,
            series: Vec::new(),
            error: None,
        }
    }

    /// Counts one completed operation of `bytes` that took `latency_ns`, completing at `now_ns`.
    pub fn complete(&mut self, bytes: u64, latency_ns: u64, now_ns: u64, interval_ns: u64) {
        self.ops += 1;
        self.bytes += bytes;
        self.latency.saturating_record(latency_ns.max(1));
        self.last_completion_ns = now_ns;
        let bucket = (now_ns / interval_ns) as usize;
        if bucket >= self.series.len() {
            self.series.resize(bucket + 1, 0);
        }
        self.series[bucket] += bytes;
    }

    pub fn posted(&mut self, now_ns: u64) {
        self.first_post_ns.get_or_insert(now_ns);
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
        f.complete(100, 2_000, 15, 10);
        f.complete(100, 4_000, 35, 10);
        assert_eq!((f.ops, f.bytes, f.first_post_ns), (2, 200, Some(5)));
        assert_eq!(f.series, vec![0, 100, 0, 100]);
        assert_eq!(f.latency.len(), 2);
        assert!(f.latency.max() >= 4_000);
    }
}

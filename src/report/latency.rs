//! Latency percentiles of one histogram: the figures every report prints. A module of its
//! own so that the report's parts (by op, [`super::ops`]) share it without importing the
//! report that gathers them.
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency percentiles in nanoseconds, from one histogram.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: f64,
    pub stdev_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub p9999_ns: u64,
    pub max_ns: u64,
}

impl Latency {
    /// The same figures as the histogram's own `mean`, `stdev` and `value_at_quantile`, in
    /// two scans of its counters instead of eight: a 4,000-flow report took 3.4 s under the
    /// bench's TCG with the separate calls (most of a Ctrl-C's second).
    pub fn of<T: hdrhistogram::Counter>(h: &Histogram<T>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        // (median-equivalent value, count) of each recorded bucket: few, even when the
        // histogram spans seconds.
        let recorded: Vec<(f64, f64)> = h
            .iter_recorded()
            .map(|v| {
                (
                    h.median_equivalent(v.value_iterated_to()) as f64,
                    v.count_at_value().as_f64(),
                )
            })
            .collect();
        let n = h.len() as f64;
        let mean = recorded.iter().fold(0.0, |t, &(v, c)| t + v * c / n);
        let dev = recorded
            .iter()
            .fold(0.0, |t, &(v, c)| t + (v - mean) * (v - mean) * c);
        let mut q = h.value_at_quantiles([0.5, 0.9, 0.99, 0.999, 0.9999]);
        let mut next = || q.next().unwrap_or(0);
        Latency {
            count: h.len(),
            min_ns: h.min(),
            mean_ns: mean,
            stdev_ns: (dev / n).sqrt(),
            p50_ns: next(),
            p90_ns: next(),
            p99_ns: next(),
            p999_ns: next(),
            p9999_ns: next(),
            max_ns: h.max(),
        }
    }
}

//! The histogram constructor and recorder that the generator's statistics ([`super::stats`])
//! and its streamed intervals ([`super::intervals`]) share: below both, so neither imports
//! the other for them.
use hdrhistogram::{Counter, Histogram};

/// Latency histograms: 1 ns resolution at 3 significant digits, starting at the smallest
/// range and growing to the largest latency seen. Allocated for 1 ns .. 1 hour up front, each
/// took 33,792 counters (264 KiB): most of the memory of a 1,000-flow run. Growing costs an
/// allocation at most once per doubling of a flow's maximum latency.
pub fn new_histogram<T: Counter>() -> Histogram<T> {
    let mut h = Histogram::new_with_bounds(1, 2, 3).expect("valid histogram bounds");
    h.auto(true);
    h
}

/// Records one latency, growing the histogram to fit it where it can grow. (`saturating_record`
/// would clamp to the current range instead of growing.) Beyond its limits, it saturates.
pub fn record<T: Counter>(h: &mut Histogram<T>, latency_ns: u64) {
    let v = latency_ns.max(1);
    if h.record(v).is_err() {
        h.saturating_record(v);
    }
}

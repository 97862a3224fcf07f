//! Counters the workers bump and the main thread reads for the live one-line display.
use std::sync::atomic::{AtomicU64, Ordering};

/// One per thread, padded to its own cache line so threads never contend.
#[repr(align(128))]
#[derive(Default)]
pub struct Counters {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
}

impl Counters {
    pub fn add(&self, ops: u64, bytes: u64) {
        self.ops.fetch_add(ops, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Sums of every thread's counters: (ops, bytes).
pub fn totals(counters: &[Counters]) -> (u64, u64) {
    counters.iter().fold((0, 0), |(o, b), c| {
        (
            o + c.ops.load(Ordering::Relaxed),
            b + c.bytes.load(Ordering::Relaxed),
        )
    })
}

/// The live line: elapsed time, operations, current rate over the last tick.
pub fn line(elapsed_s: f64, ops: u64, gbps_now: f64, flows: u32) -> String {
    format!("\r[{elapsed_s:6.1}s] {ops:>12} ops  {gbps_now:8.3} Gb/s  {flows} flows ")
}

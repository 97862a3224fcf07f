//! Flow completion times by size bucket (`run --fct`): what the threads' histograms say, and
//! the size distribution the messages were drawn from.
use crate::gen::fct::{FctBuckets, FctParams, BUCKET_BOUNDS, BUCKET_NAMES, SLOWDOWN_UNIT};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FctReport {
    /// The ideal FCT of a message: base_latency_ns + size × 8 / line_gbps.
    pub line_gbps: f64,
    pub base_latency_ns: u64,
    /// Messages timed (those due after the warm-up).
    pub messages: u64,
    pub buckets: Vec<FctBucket>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FctBucket {
    pub name: String,
    /// Sizes in [min_bytes, max_bytes); no max for the last bucket.
    pub min_bytes: u64,
    pub max_bytes: Option<u64>,
    pub messages: u64,
    pub fct_p50_ns: u64,
    pub fct_p99_ns: u64,
    pub slowdown_mean: f64,
    pub slowdown_p50: f64,
    pub slowdown_p99: f64,
}

impl FctReport {
    pub fn of(params: FctParams, b: &FctBuckets) -> FctReport {
        let buckets: Vec<FctBucket> = (b.0.iter().enumerate())
            .map(|(k, h)| {
                let slow = |q: f64| h.slowdown.value_at_quantile(q) as f64 / SLOWDOWN_UNIT;
                FctBucket {
                    name: BUCKET_NAMES[k].into(),
                    min_bytes: if k == 0 { 0 } else { BUCKET_BOUNDS[k - 1] },
                    max_bytes: BUCKET_BOUNDS.get(k).copied(),
                    messages: h.fct.len(),
                    fct_p50_ns: h.fct.value_at_quantile(0.5),
                    fct_p99_ns: h.fct.value_at_quantile(0.99),
                    slowdown_mean: h.slowdown.mean() / SLOWDOWN_UNIT,
                    slowdown_p50: slow(0.5),
                    slowdown_p99: slow(0.99),
                }
            })
            .collect();
        FctReport {
            line_gbps: params.line_gbps,
            base_latency_ns: params.base_ns,
            messages: buckets.iter().map(|b| b.messages).sum(),
            buckets,
        }
    }
}

/// The size distribution of a run with `--size DIST`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SizesReport {
    /// As given: uniform:MIN-MAX, lognormal:MEDIAN,SIGMA, cdf:FILE.
    pub spec: String,
    pub scale: f64,
    /// The distribution's mean and largest size (scaled), and the mean of what completed.
    pub mean_bytes: f64,
    pub max_bytes: u32,
    pub drawn_mean_bytes: f64,
}

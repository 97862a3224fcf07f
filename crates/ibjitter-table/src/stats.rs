//! Summary statistics of a table's delays: mean, sd, min, p50, p90, p99, max.

use serde::Serialize;

/// Summary of a set of values (a table's 4096 delays, usually in nanoseconds).
///
/// `sd` is the population standard deviation (a table is the whole distribution, not a sample
/// of it); percentiles are nearest-rank (the smallest value with at least that fraction of the
/// values at or below it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    /// Statistics of `values`. Empty input gives NaNs and `n == 0`.
    pub fn of_f64(values: &[f64]) -> Stats {
        let n = values.len();
        if n == 0 {
            return Stats {
                n,
                mean: f64::NAN,
                sd: f64::NAN,
                min: f64::NAN,
                p50: f64::NAN,
                p90: f64::NAN,
                p99: f64::NAN,
                max: f64::NAN,
            };
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable_by(f64::total_cmp);
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let rank = |p: f64| {
            let r = (p * n as f64).ceil() as usize;
            sorted[r.clamp(1, n) - 1]
        };
        Stats {
            n,
            mean,
            sd: var.sqrt(),
            min: sorted[0],
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            max: sorted[n - 1],
        }
    }

    pub fn of_i64(values: &[i64]) -> Stats {
        Stats::of_f64(&values.iter().map(|&v| v as f64).collect::<Vec<_>>())
    }

    pub fn of_u64(values: &[u64]) -> Stats {
        Stats::of_f64(&values.iter().map(|&v| v as f64).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of_f64(&v);
        assert_eq!(s.n, 100);
        assert_eq!(s.mean, 50.5);
        assert_eq!(
            (s.min, s.p50, s.p90, s.p99, s.max),
            (1.0, 50.0, 90.0, 99.0, 100.0)
        );
        let expected_sd = ((100.0f64 * 100.0 - 1.0) / 12.0).sqrt();
        assert!((s.sd - expected_sd).abs() < 1e-12);
        let c = Stats::of_i64(&[7; 10]);
        assert_eq!((c.sd, c.p99), (0.0, 7.0));
        assert!(Stats::of_f64(&[]).mean.is_nan());
    }
}

//! tc netem's normalized tables, built the way iproute2 builds its own (`netem/normal.c`,
//! `netem/pareto.c`, `netem/paretonormal.c`), so ours equal the files iproute2 ships up to
//! differences in the error function's last bits. Plus normalization of any distribution into
//! netem's form.
//!
//! The constructions (facts about iproute2's generators, reimplemented here):
//! - normal: walk x from −10 in steps of 0.00005 while x < 10.05; the last x whose
//!   `rint(16384 Φ(x))` is i fills slot i of a 16384-slot inverse CDF; every 4th slot, times
//!   8192, rounded (ties to even) and clamped to i16, is an entry.
//! - pareto: for i = 65536, 65520, …, 16: `(4/3)·8192·((i/65536)^(−1/3) − 1.5)`, capped at
//!   32767, rounded.
//! - paretonormal: entry k is `(normal_k + 3·pareto_k) / 4` in integer arithmetic (truncating
//!   toward zero), clamped to i16.

use super::format::{ENTRIES, NETEM_SCALE};
use statrs::function::erf;

/// Slots in iproute2's intermediate inverse-CDF table.
const FINE: usize = 16384;

fn clamp_i16(v: i64) -> i64 {
    v.clamp(i64::from(i16::MIN), i64::from(i16::MAX))
}

/// netem's normal table, as iproute2's `normal.c` makes it.
pub fn normal_entries() -> Vec<i64> {
    normal_unclamped().into_iter().map(clamp_i16).collect()
}

/// The normal table's values before the i16 clamp (`paretonormal.c` mixes these).
fn normal_unclamped() -> Vec<i64> {
    let mut slot = vec![f64::NAN; FINE + 1];
    let step = 0.00005_f64;
    let mut x = -10.0_f64;
    // The sweep accumulates x by repeated addition, as the original does, so that the grid
    // points (and their rounding) are the same.
    while x < 10.05 {
        let cdf = 0.5 + 0.5 * erf::erf(x / std::f64::consts::SQRT_2);
        let i = (FINE as f64 * cdf).round_ties_even() as usize;
        slot[i.min(FINE)] = x;
        x += step;
    }
    (0..ENTRIES)
        .map(|k| {
            let mut v = slot[4 * k];
            if v.is_nan() {
                // Never happens for 16384 slots and this step; kept so the function is total.
                v = super::dist::std_normal_quantile(normal_entry_probability(k));
            }
            (v * NETEM_SCALE).round_ties_even() as i64
        })
        .collect()
}

/// The Pareto part of iproute2's tables, entry `k` (k = 0 … 4095).
fn pareto_entry(k: usize) -> i64 {
    let u = (65536 - 16 * k) as f64 / 65536.0;
    let v = (u.powf(-1.0 / 3.0) - 1.5) * (4.0 / 3.0) * NETEM_SCALE;
    v.min(32767.0).round_ties_even() as i64
}

/// netem's pareto table, as iproute2's `pareto.c` makes it.
pub fn pareto_entries() -> Vec<i64> {
    (0..ENTRIES).map(pareto_entry).collect()
}

/// netem's paretonormal table, as iproute2's `paretonormal.c` makes it: the normal values are
/// mixed before clamping (the first is about −32850, beyond i16).
pub fn paretonormal_entries() -> Vec<i64> {
    normal_unclamped()
        .into_iter()
        .enumerate()
        .map(|(k, n)| clamp_i16((n + 3 * pareto_entry(k)) / 4))
        .collect()
}

/// A distribution's quantiles turned into netem's normalized form.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub entries: Vec<i64>,
    /// Mean of the quantiles (the `mu` that gives the distribution back), same unit as input.
    pub mean: f64,
    /// Standard deviation of the quantiles (the `sigma` that gives it back).
    pub sd: f64,
    /// Entries that fell outside i16 (beyond ±4 sd) and were clamped.
    pub clamped: usize,
}

/// Normalizes quantiles to mean 0, sd 1 using their own mean and (population) sd, scales by
/// 8192, rounds and clamps to i16. Zero spread gives all-zero entries.
pub fn normalize(quantiles: &[f64]) -> Normalized {
    let n = quantiles.len() as f64;
    let mean = quantiles.iter().sum::<f64>() / n;
    let var = quantiles.iter().map(|q| (q - mean).powi(2)).sum::<f64>() / n;
    let sd = var.sqrt();
    let mut clamped = 0;
    let entries = quantiles
        .iter()
        .map(|q| {
            if sd == 0.0 {
                return 0;
            }
            let v = ((q - mean) / sd * NETEM_SCALE).round();
            if v < f64::from(i16::MIN) || v > f64::from(i16::MAX) {
                clamped += 1;
            }
            clamp_i16(v as i64)
        })
        .collect();
    Normalized {
        entries,
        mean,
        sd,
        clamped,
    }
}

/// Φ at a netem normal entry's position, for tests: entry k sits at probability (4k+0.5)/16384.
pub fn normal_entry_probability(k: usize) -> f64 {
    (4 * k) as f64 / FINE as f64 + 0.5 / FINE as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::std_normal_quantile;

    #[test]
    fn normal_is_the_quantized_inverse_cdf() {
        let t = normal_entries();
        assert_eq!(t.len(), ENTRIES);
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "monotone");
        for k in [100, 1000, 2048, 3000, 4000] {
            let exact = std_normal_quantile(normal_entry_probability(k)) * NETEM_SCALE;
            // The grid step (0.00005 * 8192 ≈ 0.41) bounds the difference.
            assert!(
                (t[k] as f64 - exact).abs() <= 1.0,
                "k={k}: {} vs {exact}",
                t[k]
            );
        }
        assert_eq!(t[0], i64::from(i16::MIN));
    }

    #[test]
    fn pareto_has_netem_shape() {
        let t = pareto_entries();
        assert_eq!(t[0], (-(2.0 / 3.0) * NETEM_SCALE).round() as i64);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*t.last().unwrap(), 32767);
    }

    #[test]
    fn paretonormal_mixes_the_two() {
        let (n, p, pn) = (normal_unclamped(), pareto_entries(), paretonormal_entries());
        assert!(n[0] < i64::from(i16::MIN), "mixed before the clamp");
        for k in [0, 5, 2000, 4095] {
            assert_eq!(pn[k], clamp_i16((n[k] + 3 * p[k]) / 4));
        }
    }

    #[test]
    fn normalize_gives_mean_zero_sd_8192() {
        let q: Vec<f64> = (0..ENTRIES)
            .map(|k| 5000.0 + 300.0 * std_normal_quantile((k as f64 + 0.5) / ENTRIES as f64))
            .collect();
        let n = normalize(&q);
        assert!((n.mean - 5000.0).abs() < 1e-6);
        assert!((n.sd - 300.0).abs() < 1.0);
        let m = n.entries.iter().sum::<i64>() as f64 / ENTRIES as f64;
        assert!(m.abs() < 1.0);
        let sd = (n
            .entries
            .iter()
            .map(|&e| (e as f64 - m).powi(2))
            .sum::<f64>()
            / ENTRIES as f64)
            .sqrt();
        assert!((sd - NETEM_SCALE).abs() < 2.0, "{sd}");
        assert_eq!(n.clamped, 0);
        assert!(normalize(&[7.0; ENTRIES]).entries.iter().all(|&e| e == 0));
    }
}

//! The research's mean-preserving lognormal family.
//!
//! From a base lognormal (fitted to measured latency, or given), make: the base table; for
//! each fraction f (e.g. 0.25, 0.5, 0.75) a lognormal with scale f × the base scale and the
//! shape, found by bisection, that makes the *table's* mean equal the base table's mean; and
//! the "uniform" table holding that mean with zero variance. All tables then inject the same
//! mean latency with different variation.
//!
//! The bisection works on the table's mean (the mean of its 4096 stratified quantiles), not
//! the analytic mean: for large shapes the table leaves out the far tail, and it is the table
//! the injector draws from.

use super::dist::{std_normal_quantile, Dist, LogNormal};
use super::duration::{format_ns, format_ns_rounded};
use super::format::{Kind, Table, ENTRIES};
use super::generate::{make_table, stratum_probability};
use super::TableError;

/// One lognormal table of the family.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Fraction of the base scale (1.0 for the base itself).
    pub fraction: f64,
    pub lognormal: LogNormal,
    pub table: Table,
}

/// The whole family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub base: LogNormal,
    /// The base table's mean (of its unrounded quantiles), which every member matches.
    pub target_mean_ns: f64,
    /// The base first, then one member per fraction, in the order given.
    pub members: Vec<Member>,
    /// Every entry the target mean.
    pub uniform: Table,
}

/// Standard normal quantiles at the stratum midpoints.
fn strata_z() -> Vec<f64> {
    (0..ENTRIES)
        .map(|k| std_normal_quantile(stratum_probability(k)))
        .collect()
}

/// Mean of exp(s z_k): the table mean of a lognormal with unit scale and no location.
fn unit_table_mean(z: &[f64], s: f64) -> f64 {
    z.iter().map(|&z| (s * z).exp()).sum::<f64>() / z.len() as f64
}

/// The mean of the table of this lognormal (unrounded quantiles).
pub fn table_mean(l: &LogNormal) -> f64 {
    l.loc_ns + l.scale_ns * unit_table_mean(&strata_z(), l.shape)
}

/// Shape s with `loc + scale * unit_table_mean(s) = target`, by bisection. The unit table mean
/// grows monotonically with s from 1 at s = 0 (each pair of symmetric strata contributes
/// cosh(s z)), so a solution exists iff target − loc > scale.
fn shape_for_mean(z: &[f64], target: f64, loc: f64, scale: f64) -> Result<f64, TableError> {
    let ratio = (target - loc) / scale;
    if ratio.is_nan() || ratio <= 1.0 {
        return Err(TableError::new(format!(
            "no lognormal with scale {} and loc {} has table mean {}: the scale must be below mean - loc",
            format_ns(scale),
            format_ns(loc),
            format_ns(target)
        )));
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while unit_table_mean(z, hi) < ratio {
        hi *= 2.0;
        if hi > 64.0 {
            return Err(TableError::new("shape bisection diverged"));
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if unit_table_mean(z, mid) < ratio {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// Builds the family of `base` for these fractions of its scale. `source` says where the
/// base came from (recorded in the headers).
pub fn family(base: &LogNormal, fractions: &[f64], source: &str) -> Result<Family, TableError> {
    let base = LogNormal::new(base.shape, base.scale_ns, base.loc_ns)?;
    let z = strata_z();
    let target = base.loc_ns + base.scale_ns * unit_table_mean(&z, base.shape);
    let family_line = |f: f64| {
        format!(
            "mean-preserving family of {source} ({}): scale at {}% of its scale, shape by bisection so the table mean equals the base table's mean {}",
            base.describe(),
            percent(f),
            format_ns_rounded(target)
        )
    };
    let mut base_table = make_table(&Dist::LogNormal(base), Kind::Absolute)?;
    base_table.comments.insert(
        2,
        format!("base of a mean-preserving family; from {source}"),
    );
    let mut members = vec![Member {
        fraction: 1.0,
        lognormal: base,
        table: base_table,
    }];
    for &f in fractions {
        if !(f.is_finite() && f > 0.0) {
            return Err(TableError::new(format!(
                "expected scale fractions > 0, found {f}"
            )));
        }
        let scale = base.scale_ns * f;
        let shape = shape_for_mean(&z, target, base.loc_ns, scale)?;
        let l = LogNormal::new(shape, scale, base.loc_ns)?;
        let mut table = make_table(&Dist::LogNormal(l), Kind::Absolute)?;
        table.comments.insert(2, family_line(f));
        members.push(Member {
            fraction: f,
            lognormal: l,
            table,
        });
    }
    let mut uniform = make_table(&Dist::Uniform { mean_ns: target }, Kind::Absolute)?;
    uniform.comments.insert(
        2,
        format!(
            "uniform member of the mean-preserving family of {source} ({})",
            base.describe()
        ),
    );
    Ok(Family {
        base,
        target_mean_ns: target,
        members,
        uniform,
    })
}

/// A fraction as a percentage for names and headers: `0.75` → `75`, `0.125` → `12.5`.
pub fn percent(f: f64) -> String {
    let p = (f * 100.0 * 1e6).round() / 1e6;
    format!("{p}")
}

/// File stem of a member: the base is `prefix`, others `prefix-scale75`.
pub fn member_name(prefix: &str, fraction: f64) -> String {
    if fraction == 1.0 {
        prefix.to_string()
    } else {
        format!("{prefix}-scale{}", percent(fraction))
    }
}

/// File stem of the uniform table: `prefix-uniform`.
pub fn uniform_name(prefix: &str) -> String {
    format!("{prefix}-uniform")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;

    #[test]
    fn members_keep_the_mean_and_spread_grows_as_scale_shrinks() {
        let base = LogNormal::new(0.6, 2000.0, 5000.0).unwrap();
        let fam = family(&base, &[0.75, 0.5, 0.25], "test").unwrap();
        assert_eq!(fam.members.len(), 4);
        let mut last_sd = 0.0;
        for m in &fam.members {
            let s = Stats::of_i64(&m.table.entries);
            let rel = (s.mean / fam.target_mean_ns - 1.0).abs();
            assert!(
                rel < 1e-3,
                "fraction {}: mean {} vs {}",
                m.fraction,
                s.mean,
                fam.target_mean_ns
            );
            assert!(s.sd > last_sd, "sd should grow as the scale shrinks");
            last_sd = s.sd;
            assert!((m.lognormal.scale_ns - base.scale_ns * m.fraction).abs() < 1e-9);
        }
        let u = Stats::of_i64(&fam.uniform.entries);
        assert_eq!(u.sd, 0.0);
        assert!((u.mean - fam.target_mean_ns).abs() <= 0.5);
    }

    #[test]
    fn infeasible_fraction_is_an_error() {
        let base = LogNormal::new(0.5, 2000.0, 0.0).unwrap();
        assert!(family(&base, &[2.0], "t").is_err());
        assert!(family(&base, &[0.0], "t").is_err());
    }

    #[test]
    fn names() {
        assert_eq!(member_name("rc", 1.0), "rc");
        assert_eq!(member_name("rc", 0.75), "rc-scale75");
        assert_eq!(member_name("rc", 0.125), "rc-scale12.5");
        assert_eq!(uniform_name("rc"), "rc-uniform");
    }
}

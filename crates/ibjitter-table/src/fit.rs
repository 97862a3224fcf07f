//! Maximum-likelihood lognormal with location: what `scipy.stats.lognorm.fit(samples)` does,
//! but finding the likelihood's interior maximum exactly instead of by a general optimizer.
//!
//! For a fixed location θ < min(x), the best shape and scale have closed forms:
//! μ = mean(ln(x − θ)), s = sd(ln(x − θ)) (the MLE sd, dividing by n), scale = e^μ. What is
//! left is the profile log-likelihood per sample, `ℓ(θ) = −μ(θ) − ln s(θ) − ½ ln 2π − ½`, a
//! function of one variable. We search it over `t = ln(min(x) − θ)`:
//!
//! - ℓ → +∞ as θ → min(x) (the well-known degenerate spike of the three-parameter lognormal),
//!   so "the MLE" means the interior local maximum, which is what scipy's optimizer finds from
//!   its starting point.
//! - Each evaluation is one pass over the data computing ℓ and its derivative dℓ/dt (sums of
//!   y, y², 1/u and y/u with u = x − θ, y = ln u).
//! - A coarse grid of t (on a strided subsample when there are many samples) brackets sign
//!   changes of dℓ/dt from + to − (local maxima); the best bracket is refined on all samples
//!   by the Illinois variant of regula falsi on dℓ/dt.

use super::dist::LogNormal;
use super::TableError;

/// Result of a fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub lognormal: LogNormal,
    /// Number of samples fitted.
    pub n: usize,
    /// Total log-likelihood at the fit (natural log, samples in nanoseconds).
    pub log_likelihood: f64,
    /// False when the likelihood had no interior maximum in the searched range and kept rising
    /// as the location went to −∞ (data closer to normal than to any shifted lognormal); the
    /// fit is then the far end of the range, a lognormal with a small shape.
    pub interior: bool,
    /// Passes over the data (full or subsample) that the search took.
    pub evaluations: usize,
}

/// Profile likelihood and its slope at one location.
#[derive(Debug, Clone, Copy)]
struct Point {
    t: f64,
    /// ℓ per sample.
    ell: f64,
    /// dℓ/dt per sample.
    slope: f64,
    /// mean of ln(x − θ) and its variance.
    mu: f64,
    var: f64,
}

struct Profile<'a> {
    xs: &'a [f64],
    min: f64,
    center: f64,
    evaluations: usize,
}

impl Profile<'_> {
    /// One pass: θ = min − e^t. Logs are taken relative to ln(center − θ) (with ln_1p) so
    /// that the variance keeps its precision when the location is far below the data.
    fn at(&mut self, t: f64) -> Point {
        self.evaluations += 1;
        let d = t.exp();
        let theta = self.min - d;
        let big_d = self.center - theta;
        let inv_big_d = 1.0 / big_d;
        let (mut sy, mut syy, mut sw, mut syw) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for &x in self.xs {
            let u = x - theta;
            let y = ((x - self.center) * inv_big_d).ln_1p();
            let w = 1.0 / u;
            sy += y;
            syy += y * y;
            sw += w;
            syw += y * w;
        }
        let n = self.xs.len() as f64;
        let my = sy / n;
        let var = (syy / n - my * my).max(f64::MIN_POSITIVE);
        let mw = sw / n;
        let myw = syw / n;
        let mu = my + big_d.ln();
        let ell = -mu - 0.5 * var.ln() - 0.5 * (2.0 * std::f64::consts::PI).ln() - 0.5;
        // dℓ/dθ = mean(w) + (mean(y w) − mean(y) mean(w)) / var;  dθ/dt = −d.
        let dl_dtheta = mw + (myw - my * mw) / var;
        Point {
            t,
            ell,
            slope: -d * dl_dtheta,
            mu,
            var,
        }
    }
}

/// Grid step in t = ln(min − θ).
const GRID_STEP: f64 = 0.5;
/// Step of the fallback scan over all samples.
const FULL_SCAN_STEP: f64 = 1.0;
/// Subsample size used for the grid when there are more samples than this.
const GRID_SAMPLES: usize = 32_768;

/// Fits a lognormal with location to `samples` (any order) by maximum likelihood.
pub fn fit_lognormal(samples: &[f64]) -> Result<Fit, TableError> {
    let n = samples.len();
    if n < 3 {
        return Err(TableError::new(format!(
            "expected at least 3 samples to fit a lognormal, found {n}"
        )));
    }
    let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in samples {
        if !x.is_finite() {
            return Err(TableError::new(format!(
                "expected finite samples, found {x}"
            )));
        }
        min = min.min(x);
        max = max.max(x);
        sum += x;
    }
    let range = max - min;
    if range <= 0.0 {
        return Err(TableError::new(format!(
            "all {n} samples are equal ({min} ns): nothing to fit (the `uniform` table has that mean)"
        )));
    }
    let center = sum / n as f64;

    // Range of d = min − θ searched: far below the data (≈ normal) down to a sliver above the
    // spike at min, but never below what f64 can tell apart from min.
    let t_hi = (range * 1e4).ln();
    let t_lo = (range * 1e-12).max(min.abs() * 1e-13).ln();

    let stride = n.div_ceil(GRID_SAMPLES);
    let sub: Vec<f64>;
    let grid_xs: &[f64] = if stride > 1 {
        sub = samples.iter().step_by(stride).copied().collect();
        &sub
    } else {
        samples
    };
    let mut coarse = Profile {
        xs: grid_xs,
        min,
        center,
        evaluations: 0,
    };
    let mut grid = Vec::new();
    let mut t = t_hi;
    while t >= t_lo {
        grid.push(coarse.at(t));
        t -= GRID_STEP;
    }
    // grid runs from high t to low t. A local maximum in t is where the slope changes from
    // + (at lower t) to − (at higher t).
    let best = grid
        .windows(2)
        .filter(|w| w[0].slope <= 0.0 && w[1].slope > 0.0)
        .max_by(|a, b| {
            let la = a[0].ell.max(a[1].ell);
            let lb = b[0].ell.max(b[1].ell);
            la.total_cmp(&lb)
        })
        .map(|w| (w[1].t, w[0].t));

    let mut full = Profile {
        xs: samples,
        min,
        center,
        evaluations: 0,
    };
    // Bracket the maximum on all samples. Start from the subsample's bracket (widened a few
    // steps if the full data moved it); if the subsample had none, or it does not hold on the
    // full data, scan the full data from the far end down, stopping at the first maximum.
    // (With heavy shapes the likelihood is so flat in the location that a subsample may show
    // no interior maximum where the full data has one.)
    let mut bracket = None;
    if let Some((mut lo, mut hi)) = best {
        let (mut plo, mut phi) = if stride > 1 {
            (full.at(lo), full.at(hi))
        } else {
            let find = |t: f64| *grid.iter().find(|p| p.t == t).expect("grid point");
            (find(lo), find(hi))
        };
        let mut widen = 0;
        while (plo.slope <= 0.0 || phi.slope > 0.0) && widen < 6 {
            if plo.slope <= 0.0 {
                lo -= GRID_STEP;
                plo = full.at(lo);
            }
            if phi.slope > 0.0 {
                hi += GRID_STEP;
                phi = full.at(hi);
            }
            widen += 1;
        }
        if plo.slope > 0.0 && phi.slope <= 0.0 {
            bracket = Some((plo, phi));
        }
    }
    let (plo, phi) = match bracket {
        Some(b) => b,
        None => {
            let mut above = if stride > 1 { full.at(t_hi) } else { grid[0] };
            if above.slope > 0.0 {
                // Likelihood still rising toward θ → −∞: report the far end, flagged.
                let evaluations = coarse.evaluations + full.evaluations;
                return Ok(make_fit(above, min, n, false, evaluations));
            }
            let mut found = None;
            let mut t = t_hi - FULL_SCAN_STEP;
            while t >= t_lo {
                let p = full.at(t);
                if p.slope > 0.0 {
                    found = Some((p, above));
                    break;
                }
                above = p;
                t -= FULL_SCAN_STEP;
            }
            found.ok_or_else(|| {
                TableError::new(
                    "the likelihood has no interior maximum: these samples do not look like a shifted lognormal",
                )
            })?
        }
    };

    // Illinois regula falsi on the slope: plo.slope > 0 > phi.slope.
    let (mut fa, mut fb) = (plo.slope, phi.slope);
    let (mut a, mut b) = (plo.t, phi.t);
    let mut last_side = 0i8;
    let mut best_point = if plo.slope.abs() < phi.slope.abs() {
        plo
    } else {
        phi
    };
    let mut prev_c = f64::NAN;
    for _ in 0..100 {
        let mut c = (a * fb - b * fa) / (fb - fa);
        if !(c > a && c < b) {
            c = 0.5 * (a + b);
        }
        let p = full.at(c);
        if p.slope.abs() < best_point.slope.abs() {
            best_point = p;
        }
        if p.slope == 0.0 || (c - prev_c).abs() < 1e-12 || b - a < 1e-12 {
            break;
        }
        prev_c = c;
        if p.slope > 0.0 {
            a = c;
            fa = p.slope;
            if last_side == 1 {
                fb *= 0.5;
            }
            last_side = 1;
        } else {
            b = c;
            fb = p.slope;
            if last_side == -1 {
                fa *= 0.5;
            }
            last_side = -1;
        }
    }
    Ok(make_fit(
        best_point,
        min,
        n,
        true,
        coarse.evaluations + full.evaluations,
    ))
}

fn make_fit(p: Point, min: f64, n: usize, interior: bool, evaluations: usize) -> Fit {
    Fit {
        lognormal: LogNormal {
            shape: p.var.sqrt(),
            scale_ns: p.mu.exp(),
            loc_ns: min - p.t.exp(),
        },
        n,
        log_likelihood: p.ell * n as f64,
        interior,
        evaluations,
    }
}

/// Kolmogorov–Smirnov distance between the samples' empirical distribution and `dist`:
/// sup |F_n(x) − F(x)|.
pub fn ks_distance(samples: &[f64], dist: &LogNormal) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let n = sorted.len() as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let f = dist.cdf(x);
            (f - i as f64 / n).max((i + 1) as f64 / n - f)
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::std_normal_quantile;

    #[test]
    fn recovers_parameters_on_small_sample() {
        let truth = LogNormal::new(0.8, 3000.0, 5000.0).unwrap();
        let xs = truth.samples(20_000, 7);
        let f = fit_lognormal(&xs).unwrap();
        assert!(f.interior);
        let l = f.lognormal;
        assert!((l.shape / truth.shape - 1.0).abs() < 0.05, "{l:?}");
        assert!((l.scale_ns / truth.scale_ns - 1.0).abs() < 0.05, "{l:?}");
        assert!((l.loc_ns / truth.loc_ns - 1.0).abs() < 0.05, "{l:?}");
        assert!(ks_distance(&xs, &l) < 0.02);
    }

    #[test]
    fn fit_is_a_local_maximum_of_the_full_likelihood() {
        let truth = LogNormal::new(0.5, 1500.0, 4500.0).unwrap();
        let xs = truth.samples(5_000, 11);
        let f = fit_lognormal(&xs).unwrap();
        let ll = |l: &LogNormal| -> f64 {
            xs.iter()
                .map(|&x| {
                    let z = ((x - l.loc_ns) / l.scale_ns).ln() / l.shape;
                    -(x - l.loc_ns).ln()
                        - l.shape.ln()
                        - 0.5 * (2.0 * std::f64::consts::PI).ln()
                        - 0.5 * z * z
                })
                .sum()
        };
        let at = ll(&f.lognormal);
        assert!(
            (at - f.log_likelihood).abs() < 1e-6 * at.abs(),
            "{at} {}",
            f.log_likelihood
        );
        let l = f.lognormal;
        for (ds, dscale, dloc) in [
            (1.01, 1.0, 0.0),
            (0.99, 1.0, 0.0),
            (1.0, 1.01, 0.0),
            (1.0, 0.99, 0.0),
            (1.0, 1.0, 20.0),
            (1.0, 1.0, -20.0),
        ] {
            let p = LogNormal {
                shape: l.shape * ds,
                scale_ns: l.scale_ns * dscale,
                loc_ns: l.loc_ns + dloc,
            };
            assert!(
                ll(&p) < at,
                "perturbation {ds} {dscale} {dloc} improved the fit"
            );
        }
    }

    #[test]
    fn rejects_degenerate_input() {
        assert!(fit_lognormal(&[1.0, 2.0]).is_err());
        assert!(fit_lognormal(&[5.0; 10]).is_err());
        assert!(fit_lognormal(&[1.0, f64::NAN, 3.0]).is_err());
    }

    #[test]
    fn symmetric_data_is_flagged_not_interior() {
        // Evenly spread quantiles of a normal: no skew, so no shifted lognormal beats the
        // normal limit.
        let xs: Vec<f64> = (0..2000)
            .map(|i| 10_000.0 + 100.0 * std_normal_quantile((i as f64 + 0.5) / 2000.0))
            .collect();
        let f = fit_lognormal(&xs).unwrap();
        assert!(!f.interior || f.lognormal.shape < 0.05, "{f:?}");
    }
}

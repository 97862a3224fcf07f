//! Distributions and their quantile functions, in nanoseconds.
//!
//! An absolute table holds a distribution's quantiles at the 4096 stratum midpoints
//! `(k + 0.5) / 4096`, so the table's empirical distribution *is* the target, not a random
//! sample of it. `normal`, `pareto` and `paretonormal` have netem's meanings: `mu + sigma * z`
//! where `z` is netem's standardized shape (see [`crate::netem`]).

use super::duration::format_ns;
use super::TableError;
use statrs::function::erf;

/// The standard normal quantile function Φ⁻¹(p), via statrs' inverse complementary error
/// function. `p` must lie in (0, 1).
pub fn std_normal_quantile(p: f64) -> f64 {
    -std::f64::consts::SQRT_2 * erf::erfc_inv(2.0 * p)
}

/// The standard normal distribution function Φ(x).
pub fn std_normal_cdf(x: f64) -> f64 {
    0.5 * erf::erfc(-x / std::f64::consts::SQRT_2)
}

/// netem's Pareto shape: a Pareto with index 3 and minimum 1, shifted by its mean (1.5) and
/// scaled by 4/3, as iproute2's `pareto.c` builds its table. Mean 0, sd 2/√3 ≈ 1.155.
pub fn netem_pareto_z(p: f64) -> f64 {
    ((1.0 - p).powf(-1.0 / 3.0) - 1.5) * (4.0 / 3.0)
}

/// netem's paretonormal shape: ¼ of the normal quantile plus ¾ of the Pareto quantile at the
/// same probability (iproute2's `paretonormal.c` mixes the two tables entry by entry).
pub fn netem_paretonormal_z(p: f64) -> f64 {
    0.25 * std_normal_quantile(p) + 0.75 * netem_pareto_z(p)
}

/// A lognormal in scipy's parametrization: `X = loc + scale * exp(shape * Z)`, `Z ~ N(0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    /// σ of log(X − loc).
    pub shape: f64,
    /// exp(μ), nanoseconds.
    pub scale_ns: f64,
    /// Location shift, nanoseconds.
    pub loc_ns: f64,
}

impl LogNormal {
    /// Checks the parameters: shape > 0 and scale > 0, all finite.
    pub fn new(shape: f64, scale_ns: f64, loc_ns: f64) -> Result<Self, TableError> {
        if !(shape.is_finite() && shape > 0.0) {
            return Err(TableError::new(format!(
                "expected a lognormal shape > 0, found {shape}"
            )));
        }
        if !(scale_ns.is_finite() && scale_ns > 0.0) {
            return Err(TableError::new(format!(
                "expected a lognormal scale > 0, found {}",
                format_ns(scale_ns)
            )));
        }
        if !loc_ns.is_finite() {
            return Err(TableError::new("expected a finite lognormal location"));
        }
        Ok(LogNormal {
            shape,
            scale_ns,
            loc_ns,
        })
    }

    /// The lognormal with this mean and standard deviation (and location).
    pub fn from_mean_sd(mean_ns: f64, sd_ns: f64, loc_ns: f64) -> Result<Self, TableError> {
        let m = mean_ns - loc_ns;
        if !(m > 0.0 && m.is_finite()) {
            return Err(TableError::new(format!(
                "expected a lognormal mean above its location, found mean {} and loc {}",
                format_ns(mean_ns),
                format_ns(loc_ns)
            )));
        }
        if !(sd_ns > 0.0 && sd_ns.is_finite()) {
            return Err(TableError::new(format!(
                "expected a lognormal sd > 0, found {}",
                format_ns(sd_ns)
            )));
        }
        let ratio = 1.0 + (sd_ns / m).powi(2);
        LogNormal::new(ratio.ln().sqrt(), m / ratio.sqrt(), loc_ns)
    }

    pub fn mean(&self) -> f64 {
        self.loc_ns + self.scale_ns * (self.shape * self.shape / 2.0).exp()
    }

    pub fn sd(&self) -> f64 {
        let s2 = self.shape * self.shape;
        self.scale_ns * (s2 / 2.0).exp() * s2.exp_m1().sqrt()
    }

    pub fn mode(&self) -> f64 {
        self.loc_ns + self.scale_ns * (-self.shape * self.shape).exp()
    }

    pub fn quantile(&self, p: f64) -> f64 {
        self.loc_ns + self.scale_ns * (self.shape * std_normal_quantile(p)).exp()
    }

    /// `n` random draws (inverse CDF of uniforms from a PCG seeded with `seed`): repeatable
    /// samples of known parameters, for checking the fit and for benchmarks.
    pub fn samples(&self, n: usize, seed: u64) -> Vec<f64> {
        use rand_core::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let u = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                self.quantile(u)
            })
            .collect()
    }

    pub fn cdf(&self, x: f64) -> f64 {
        if x <= self.loc_ns {
            return 0.0;
        }
        std_normal_cdf(((x - self.loc_ns) / self.scale_ns).ln() / self.shape)
    }

    pub fn describe(&self) -> String {
        format!(
            "lognormal shape={} scale={} loc={} (scipy.stats.lognorm parametrization)",
            self.shape,
            format_ns(self.scale_ns),
            format_ns(self.loc_ns)
        )
    }
}

/// iproute2's own netem tables and the distributions that make them (mu 0, sigma 1): the
/// files ours must equal.
pub fn iproute2_tables() -> [(&'static str, Dist); 3] {
    [
        (
            "normal",
            Dist::Normal {
                mu_ns: 0.0,
                sigma_ns: 1.0,
            },
        ),
        (
            "pareto",
            Dist::Pareto {
                mu_ns: 0.0,
                sigma_ns: 1.0,
            },
        ),
        (
            "paretonormal",
            Dist::ParetoNormal {
                mu_ns: 0.0,
                sigma_ns: 1.0,
            },
        ),
    ]
}

/// A distribution a table can be made from.
#[derive(Debug, Clone, PartialEq)]
pub enum Dist {
    /// Every entry the same value.
    Constant {
        value_ns: f64,
    },
    /// The research's "uniform": the mean with zero variance (every entry the mean).
    Uniform {
        mean_ns: f64,
    },
    /// netem's normal: `mu + sigma * Z`.
    Normal {
        mu_ns: f64,
        sigma_ns: f64,
    },
    /// Exponential with this mean, shifted by `loc`.
    Exponential {
        mean_ns: f64,
        loc_ns: f64,
    },
    /// netem's pareto: `mu + sigma * z` with [`netem_pareto_z`].
    Pareto {
        mu_ns: f64,
        sigma_ns: f64,
    },
    /// netem's paretonormal: `mu + sigma * z` with [`netem_paretonormal_z`].
    ParetoNormal {
        mu_ns: f64,
        sigma_ns: f64,
    },
    LogNormal(LogNormal),
    /// Measured latencies, sorted ascending; quantiles interpolate between order statistics.
    Empirical {
        sorted_ns: Vec<f64>,
        source: String,
    },
}

impl Dist {
    /// The empirical distribution of these samples (any order). Needs at least one finite sample.
    pub fn empirical(mut samples_ns: Vec<f64>, source: &str) -> Result<Dist, TableError> {
        if samples_ns.is_empty() {
            return Err(TableError::new(format!(
                "{source}: expected samples, found none"
            )));
        }
        if samples_ns.iter().any(|x| !x.is_finite()) {
            return Err(TableError::new(format!("{source}: samples must be finite")));
        }
        samples_ns.sort_unstable_by(f64::total_cmp);
        Ok(Dist::Empirical {
            sorted_ns: samples_ns,
            source: source.to_string(),
        })
    }

    /// Checks parameters (finite; positive where a spread is required).
    pub fn validate(&self) -> Result<(), TableError> {
        let finite = |name: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(TableError::new(format!(
                    "expected a finite {name}, found {v}"
                )))
            }
        };
        let non_negative = |name: &str, v: f64| {
            finite(name, v)?;
            if v >= 0.0 {
                Ok(())
            } else {
                Err(TableError::new(format!(
                    "expected {name} >= 0, found {}",
                    format_ns(v)
                )))
            }
        };
        match self {
            Dist::Constant { value_ns } => non_negative("value", *value_ns),
            Dist::Uniform { mean_ns } => non_negative("mean", *mean_ns),
            Dist::Normal { mu_ns, sigma_ns }
            | Dist::Pareto { mu_ns, sigma_ns }
            | Dist::ParetoNormal { mu_ns, sigma_ns } => {
                finite("mu", *mu_ns)?;
                non_negative("sigma", *sigma_ns)
            }
            Dist::Exponential { mean_ns, loc_ns } => {
                finite("loc", *loc_ns)?;
                finite("mean", *mean_ns)?;
                if *mean_ns > 0.0 {
                    Ok(())
                } else {
                    Err(TableError::new(format!(
                        "expected an exponential mean > 0, found {}",
                        format_ns(*mean_ns)
                    )))
                }
            }
            Dist::LogNormal(l) => LogNormal::new(l.shape, l.scale_ns, l.loc_ns).map(|_| ()),
            Dist::Empirical { sorted_ns, .. } => {
                if sorted_ns.is_empty() {
                    Err(TableError::new("expected samples, found none"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The quantile function at `p` in (0, 1), nanoseconds.
    pub fn quantile(&self, p: f64) -> f64 {
        match self {
            Dist::Constant { value_ns } => *value_ns,
            Dist::Uniform { mean_ns } => *mean_ns,
            Dist::Normal { mu_ns, sigma_ns } => mu_ns + sigma_ns * std_normal_quantile(p),
            Dist::Exponential { mean_ns, loc_ns } => loc_ns - mean_ns * (-p).ln_1p(),
            Dist::Pareto { mu_ns, sigma_ns } => mu_ns + sigma_ns * netem_pareto_z(p),
            Dist::ParetoNormal { mu_ns, sigma_ns } => mu_ns + sigma_ns * netem_paretonormal_z(p),
            Dist::LogNormal(l) => l.quantile(p),
            Dist::Empirical { sorted_ns, .. } => empirical_quantile(sorted_ns, p),
        }
    }

    /// The analytic mean, where there is one.
    pub fn mean(&self) -> Option<f64> {
        match self {
            Dist::Constant { value_ns } => Some(*value_ns),
            Dist::Uniform { mean_ns } => Some(*mean_ns),
            Dist::Normal { mu_ns, .. }
            | Dist::Pareto { mu_ns, .. }
            | Dist::ParetoNormal { mu_ns, .. } => Some(*mu_ns),
            Dist::Exponential { mean_ns, loc_ns } => Some(loc_ns + mean_ns),
            Dist::LogNormal(l) => Some(l.mean()),
            Dist::Empirical { sorted_ns, .. } => {
                Some(sorted_ns.iter().sum::<f64>() / sorted_ns.len() as f64)
            }
        }
    }

    /// The analytic standard deviation, where there is a closed form.
    pub fn sd(&self) -> Option<f64> {
        match self {
            Dist::Constant { .. } | Dist::Uniform { .. } => Some(0.0),
            Dist::Normal { sigma_ns, .. } => Some(*sigma_ns),
            Dist::Exponential { mean_ns, .. } => Some(*mean_ns),
            // Var of (4/3)(X - 1.5) with X ~ Pareto(3, 1) is (16/9)(3/4) = 4/3.
            Dist::Pareto { sigma_ns, .. } => Some(sigma_ns * (4.0f64 / 3.0).sqrt()),
            Dist::ParetoNormal { .. } => None,
            Dist::LogNormal(l) => Some(l.sd()),
            Dist::Empirical { .. } => None,
        }
    }

    /// The command-line name of this kind of distribution.
    pub fn name(&self) -> &'static str {
        match self {
            Dist::Constant { .. } => "constant",
            Dist::Uniform { .. } => "uniform",
            Dist::Normal { .. } => "normal",
            Dist::Exponential { .. } => "exponential",
            Dist::Pareto { .. } => "pareto",
            Dist::ParetoNormal { .. } => "paretonormal",
            Dist::LogNormal(_) => "lognormal",
            Dist::Empirical { .. } => "empirical",
        }
    }

    /// One line naming the distribution and its parameters with units, for table headers.
    pub fn describe(&self) -> String {
        match self {
            Dist::Constant { value_ns } => format!("constant value={}", format_ns(*value_ns)),
            Dist::Uniform { mean_ns } => format!(
                "uniform mean={} (every entry the mean: same mean, zero variance)",
                format_ns(*mean_ns)
            ),
            Dist::Normal { mu_ns, sigma_ns } => format!(
                "normal mu={} sigma={} (netem's definition)",
                format_ns(*mu_ns),
                format_ns(*sigma_ns)
            ),
            Dist::Exponential { mean_ns, loc_ns } => format!(
                "exponential mean={} loc={}",
                format_ns(*mean_ns),
                format_ns(*loc_ns)
            ),
            Dist::Pareto { mu_ns, sigma_ns } => format!(
                "pareto mu={} sigma={} (netem's definition: mu + sigma*(4/3)*(X-1.5), X ~ Pareto(3, 1))",
                format_ns(*mu_ns),
                format_ns(*sigma_ns)
            ),
            Dist::ParetoNormal { mu_ns, sigma_ns } => format!(
                "paretonormal mu={} sigma={} (netem's definition: 1/4 normal + 3/4 pareto quantiles)",
                format_ns(*mu_ns),
                format_ns(*sigma_ns)
            ),
            Dist::LogNormal(l) => l.describe(),
            Dist::Empirical { sorted_ns, source } => format!(
                "empirical quantiles of {} samples from {source}",
                sorted_ns.len()
            ),
        }
    }
}

/// Quantile of sorted samples at `p`, interpolating linearly between order statistics placed
/// at plotting positions `(i + 0.5) / n` (Hazen). With 4096 samples the stratified table is
/// exactly the sorted samples.
pub fn empirical_quantile(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 1 {
        return sorted[0];
    }
    let h = (p * n as f64 - 0.5).clamp(0.0, (n - 1) as f64);
    let i = h.floor() as usize;
    let frac = h - i as f64;
    if i + 1 >= n {
        sorted[n - 1]
    } else {
        sorted[i] + frac * (sorted[i + 1] - sorted[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_quantile_matches_cdf() {
        for &p in &[1e-6, 0.001, 0.1, 0.5, 0.7, 0.999] {
            let x = std_normal_quantile(p);
            assert!(
                (std_normal_cdf(x) - p).abs() < 1e-9 * p,
                "{p}: {}",
                std_normal_cdf(x) - p
            );
        }
        assert!(std_normal_quantile(0.5).abs() < 1e-15);
    }

    #[test]
    fn lognormal_from_mean_sd_round_trips() {
        let l = LogNormal::from_mean_sd(12_000.0, 5_000.0, 4_000.0).unwrap();
        assert!((l.mean() - 12_000.0).abs() < 1e-6);
        assert!((l.sd() - 5_000.0).abs() < 1e-6);
        assert!((l.cdf(l.quantile(0.3)) - 0.3).abs() < 1e-12);
        assert!(LogNormal::from_mean_sd(1000.0, 10.0, 2000.0).is_err());
        assert!(LogNormal::new(0.0, 1.0, 0.0).is_err());
    }

    #[test]
    fn netem_shapes() {
        assert_eq!(netem_pareto_z(0.0), -2.0 / 3.0);
        assert!(netem_pareto_z(0.9) > netem_pareto_z(0.5));
        let p = 0.8;
        let mixed = 0.25 * std_normal_quantile(p) + 0.75 * netem_pareto_z(p);
        assert_eq!(netem_paretonormal_z(p), mixed);
    }

    #[test]
    fn empirical_quantiles() {
        let d = Dist::empirical(vec![3.0, 1.0, 2.0, 4.0], "t").unwrap();
        assert_eq!(d.quantile(0.125), 1.0);
        assert_eq!(d.quantile(0.25), 1.5);
        assert_eq!(d.quantile(0.999), 4.0);
        assert_eq!(d.quantile(0.0001), 1.0);
        assert!(Dist::empirical(vec![], "t").is_err());
        assert!(Dist::empirical(vec![f64::NAN], "t").is_err());
    }

    #[test]
    fn exponential_quantile() {
        let d = Dist::Exponential {
            mean_ns: 100.0,
            loc_ns: 10.0,
        };
        let p = 0.5;
        assert!((d.quantile(p) - (10.0 + 100.0 * 2f64.ln())).abs() < 1e-9);
        assert!(Dist::Exponential {
            mean_ns: 0.0,
            loc_ns: 0.0
        }
        .validate()
        .is_err());
    }
}

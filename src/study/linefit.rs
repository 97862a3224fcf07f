//! A straight line through the origin fitted to a sweep's points, and where it crosses a
//! target slowdown.
//!
//! A point is an x (µs added) and the slowdowns of its runs, each run over a reference
//! measured in its own round (`study::tolerance`): at x = 0 the slowdown is 0 by
//! construction, so the line `slowdown = slope · x` has one coefficient. The points, not the
//! runs, are the independent observations: a point's runs share whatever puts that point off
//! the line (the next linear piece of a piecewise-linear runtime, a machine's state while
//! that point ran), so the slope is fitted to the points' mean slowdowns and its Student-t
//! interval has points − 1 degrees of freedom. A lack-of-fit test compares the points'
//! scatter about the line with what their runs' own scatter predicts.
//!
//! A target p is crossed at x = p / slope. Fieller's interval for that ratio, whose numerator
//! is exact, is the x ≥ 0 with |p − slope·x| ≤ h·x (h the slope's half-width): the slope's
//! interval inverted. [p / hi, p / lo] when lo > 0; at least p / hi when lo ≤ 0 < hi (the
//! set's other part lies below 0); no x at all when hi ≤ 0 (the slowdown does not rise).
//! Pure functions of the points, so a test can recompute every figure independently.
use super::stats::{ci95_half, mean, t975, ALPHA};
use statrs::distribution::{ContinuousCDF, FisherSnedecor};

/// The runs at one x: their slowdowns.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub x: f64,
    pub values: Vec<f64>,
}

impl Point {
    /// The low end of the 95 % interval of the point's mean slowdown (NaN below two runs).
    pub fn low95(&self) -> f64 {
        mean(&self.values) - ci95_half(&self.values)
    }
}

/// Whether the points lie on a straight line: F = the points' squared distances from the
/// line over what their runs' scatter makes them on average (an approximate F test, exact
/// when every point has as many runs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LackOfFit {
    pub f: f64,
    /// Degrees of freedom: points − 1, and runs − points (the runs' own scatter).
    pub df: (usize, usize),
    pub p: f64,
}

impl LackOfFit {
    /// Significantly off a straight line.
    pub fn off_line(&self) -> bool {
        self.p < ALPHA
    }
}

/// The line `slowdown = slope · x` over `points` points (x > 0).
#[derive(Debug, Clone, PartialEq)]
pub struct LineFit {
    pub points: usize,
    pub runs: usize,
    pub slope: f64,
    /// Student's t, points − 1 degrees of freedom; NaN with one point.
    pub slope_ci95: [f64; 2],
    /// The points' mean slowdowns about the line (points − 1 degrees of freedom).
    pub residual_sd: f64,
    /// The largest x fitted: beyond it a crossing is not reached.
    pub x_max: f64,
    /// Needs two points and runs repeated at some point.
    pub lack_of_fit: Option<LackOfFit>,
}

/// Where the x of a crossing lies, at 95 %.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interval {
    Between(f64, f64),
    /// Not bounded above: the slope's interval reaches 0.
    AtLeast(f64),
    /// No x: the slope is significantly not above 0.
    Nowhere,
    /// No interval: one point, the slope's interval has no degrees of freedom.
    Unknown,
}

impl Interval {
    /// The interval's low end, where it has one.
    pub fn low(self) -> Option<f64> {
        match self {
            Interval::Between(lo, _) | Interval::AtLeast(lo) => Some(lo),
            Interval::Nowhere | Interval::Unknown => None,
        }
    }
}

/// Where a fitted line crosses a target slowdown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crossing {
    pub target: f64,
    /// p / slope; NaN unless the slope is above 0.
    pub at: f64,
    pub interval: Interval,
    /// Whether `at` lies within the fitted range (else the target is not reached).
    pub reached: bool,
}

impl LineFit {
    /// The line through the origin fitted to the mean slowdown of each point with an x above
    /// 0 and a run; `None` without one.
    pub fn fit(points: &[Point]) -> Option<LineFit> {
        let pts: Vec<(f64, f64, usize)> = points
            .iter()
            .filter(|p| p.x > 0.0 && !p.values.is_empty())
            .map(|p| (p.x, mean(&p.values), p.values.len()))
            .collect();
        if pts.is_empty() {
            return None;
        }
        let k = pts.len();
        let sxx: f64 = pts.iter().map(|p| p.0 * p.0).sum();
        let slope = pts.iter().map(|p| p.0 * p.1).sum::<f64>() / sxx;
        let ssr: f64 = pts.iter().map(|p| (p.1 - slope * p.0).powi(2)).sum();
        let (residual_sd, slope_ci95) = if k >= 2 {
            let s = (ssr / (k - 1) as f64).sqrt();
            let half = t975((k - 1) as f64) * s / sxx.sqrt();
            (s, [slope - half, slope + half])
        } else {
            (f64::NAN, [f64::NAN; 2])
        };
        // The runs' own scatter about their point's mean, pooled.
        let (ss_pe, df_pe) = points
            .iter()
            .filter(|p| p.x > 0.0 && !p.values.is_empty())
            .fold((0.0, 0usize), |(ss, df), p| {
                let m = mean(&p.values);
                let s: f64 = p.values.iter().map(|v| (v - m).powi(2)).sum();
                (ss + s, df + p.values.len() - 1)
            });
        let lack_of_fit = if k >= 2 && df_pe >= 1 && ss_pe > 0.0 {
            let ms_pe = ss_pe / df_pe as f64;
            // E[SSR] = σ² Σ (1 − h_j) / n_j, h_j = x_j² / Σ x² (the line's leverage).
            let expected: f64 = pts
                .iter()
                .map(|p| (1.0 - p.0 * p.0 / sxx) / p.2 as f64)
                .sum::<f64>()
                * ms_pe;
            let f = ssr / expected;
            let p = FisherSnedecor::new((k - 1) as f64, df_pe as f64)
                .map(|d| 1.0 - d.cdf(f))
                .unwrap_or(f64::NAN);
            Some(LackOfFit {
                f,
                df: (k - 1, df_pe),
                p,
            })
        } else {
            None
        };
        Some(LineFit {
            points: k,
            runs: pts.iter().map(|p| p.2).sum(),
            slope,
            slope_ci95,
            residual_sd,
            x_max: pts.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max),
            lack_of_fit,
        })
    }

    /// Whether the slope's interval lies above 0.
    pub fn rises(&self) -> bool {
        self.slope_ci95[0] > 0.0
    }

    /// Whether the slope's interval lies at or below 0: the slowdown does not rise.
    pub fn falls(&self) -> bool {
        self.slope_ci95[1] <= 0.0
    }

    /// The x at which the line reaches slowdown `target`, and its interval.
    pub fn crossing(&self, target: f64) -> Crossing {
        let (b, [lo, hi]) = (self.slope, self.slope_ci95);
        let at = if b > 0.0 { target / b } else { f64::NAN };
        let interval = if !(lo.is_finite() && hi.is_finite()) {
            Interval::Unknown
        } else if lo > 0.0 {
            Interval::Between(target / hi, target / lo)
        } else if hi > 0.0 {
            Interval::AtLeast(target / hi)
        } else {
            Interval::Nowhere
        };
        Crossing {
            target,
            at,
            interval,
            reached: at.is_finite() && at <= self.x_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    fn points(xs: &[f64], at: impl Fn(f64, usize) -> f64, runs: usize) -> Vec<Point> {
        xs.iter()
            .map(|&x| Point {
                x,
                values: (0..runs).map(|k| at(x, k)).collect(),
            })
            .collect()
    }

    #[test]
    fn an_exact_line_is_recovered_with_a_zero_width_interval() {
        // Exactly representable slowdowns: their runs do not scatter at all.
        let f = LineFit::fit(&points(&[2.0, 8.0, 16.0], |x, _| 0.25 * x, 3)).unwrap();
        assert!(f.slope == 0.25 && f.residual_sd == 0.0 && f.rises());
        assert_eq!((f.points, f.runs, f.x_max), (3, 9, 16.0));
        // 50 % at 0.25 per unit: 2, inside the fitted range; no scatter, no test of it.
        let c = f.crossing(0.5);
        assert!(c.at == 2.0 && c.reached);
        assert_eq!(c.interval, Interval::Between(2.0, 2.0));
        assert!(f.lack_of_fit.is_none());
        // 500 % needs 20, beyond the largest x (16): not reached.
        assert!(!f.crossing(5.0).reached);
        // Points at x = 0 are the reference itself: not fitted.
        assert!(LineFit::fit(&points(&[0.0], |_, _| 0.0, 3)).is_none());
    }

    #[test]
    fn textbook_figures_through_the_origin() {
        // Means 2.1, 3.9, 6.3 at x = 1, 2, 3 (two runs each, ±0.1 around them):
        // Σx² = 14, Σxy = 2.1 + 7.8 + 18.9 = 28.8, b = 28.8 / 14; residuals 2.1 − b, 3.9 − 2b,
        // 6.3 − 3b; s² = SSR / 2; half-width t(2) s / √14 with t(2) = 4.302653.
        let means = [2.1, 3.9, 6.3];
        let pts = points(
            &[1.0, 2.0, 3.0],
            |x, k| means[x as usize - 1] + [0.1, -0.1][k],
            2,
        );
        let f = LineFit::fit(&pts).unwrap();
        let b = 28.8 / 14.0;
        assert!((f.slope - b).abs() < 1e-12);
        let ssr: f64 = (0..3)
            .map(|j| (means[j] - b * (j + 1) as f64).powi(2))
            .sum();
        let s = (ssr / 2.0).sqrt();
        assert!((f.residual_sd - s).abs() < 1e-12);
        let half = 4.302_652_73 * s / 14f64.sqrt();
        assert!((f.slope_ci95[0] - (b - half)).abs() < 1e-6, "{f:?}");
        // Lack of fit: pure error 6 × 0.01 over 3 df; E[SSR] = 0.02 Σ (1 − x²/14) / 2 = 0.02;
        // F = SSR / 0.02 on (2, 3) df.
        let lof = f.lack_of_fit.unwrap();
        assert_eq!(lof.df, (2, 3));
        assert!((lof.f - ssr / 0.02).abs() < 1e-9, "{lof:?}");
        // F(2, 3) survival at F: (1 + 2F/3)^(-3/2)... checked against its closed form for
        // d1 = 2: p = (d2 / (d2 + d1 F))^(d2 / 2).
        let closed = (3.0 / (3.0 + 2.0 * lof.f)).powf(1.5);
        assert!((lof.p - closed).abs() < 1e-9, "{} {closed}", lof.p);
    }

    #[test]
    fn an_unresolved_slope_gives_a_one_sided_interval_and_a_falling_one_none() {
        // Scatter as large as the slope: the interval straddles 0, so a crossing is only
        // bounded below (the Fieller set's other part is below 0).
        let noisy = points(
            &[10.0, 20.0, 50.0],
            |x, _| [0.02, -0.01, 0.03][(x as usize / 20).min(2)],
            3,
        );
        let f = LineFit::fit(&noisy).unwrap();
        assert!(
            f.slope > 0.0 && f.slope_ci95[0] < 0.0 && f.slope_ci95[1] > 0.0,
            "{f:?}"
        );
        let c = f.crossing(0.05);
        match c.interval {
            Interval::AtLeast(lo) => {
                assert!((lo - 0.05 / f.slope_ci95[1]).abs() < 1e-12 && lo > 0.0 && lo < c.at)
            }
            other => panic!("{other:?}"),
        }
        // A significantly falling slowdown: no crossing, and no interval of negative x.
        let falling = points(&[10.0, 20.0, 50.0], |x, k| -0.001 * x + 1e-4 * k as f64, 3);
        let f = LineFit::fit(&falling).unwrap();
        assert!(f.falls() && !f.rises(), "{f:?}");
        let c = f.crossing(0.05);
        assert!(c.at.is_nan() && !c.reached);
        assert_eq!(c.interval, Interval::Nowhere);
        assert_eq!(c.interval.low(), None);
        // Falling but not significantly: no estimate, yet at least p / hi.
        let flat = points(
            &[10.0, 20.0],
            |x, _| if x < 15.0 { 0.001 } else { -0.0015 },
            2,
        );
        let f = LineFit::fit(&flat).unwrap();
        assert!(f.slope < 0.0 && f.slope_ci95[1] > 0.0, "{f:?}");
        let c = f.crossing(0.05);
        assert!(c.at.is_nan() && matches!(c.interval, Interval::AtLeast(lo) if lo > 0.0));
        // One point: a slope, but no interval and no test.
        let one = LineFit::fit(&points(&[10.0], |_, k| 0.1 + 0.01 * k as f64, 3)).unwrap();
        assert!(one.slope_ci95[0].is_nan() && one.lack_of_fit.is_none());
        assert_eq!(one.crossing(0.05).interval, Interval::Unknown);
    }

    #[test]
    fn points_off_a_line_are_found_and_points_on_it_are_not() {
        // A piecewise-linear slowdown (flat to 5, then 0.01 per unit), runs ±0.001.
        let hinge = |x: f64, k: usize| 0.01 * (x - 5.0).max(0.0) + 0.001 * [1.0, -1.0, 0.0][k];
        let f = LineFit::fit(&points(&[2.0, 5.0, 10.0, 50.0], hinge, 3)).unwrap();
        let lof = f.lack_of_fit.unwrap();
        assert!(lof.off_line() && lof.p < 1e-6, "{lof:?}");
        let straight = |x: f64, k: usize| 0.01 * x + 0.001 * [1.0, -1.0, 0.0][k];
        let f = LineFit::fit(&points(&[2.0, 5.0, 10.0, 50.0], straight, 3)).unwrap();
        assert!(!f.lack_of_fit.unwrap().off_line(), "{f:?}");
    }

    /// Why the points are the unit: each point off the line by its own random amount (as a
    /// machine's state during that point's step, or a piecewise-linear runtime, puts it),
    /// plus each run's noise. The points' interval holds the slope in about 95 % of sweeps;
    /// an interval over the runs (runs − 1 degrees of freedom, each run its own observation)
    /// holds it far less often.
    #[test]
    fn the_slopes_interval_holds_the_slope_when_points_share_an_error() {
        let mut rng = Pcg64::seed_from_u64(33);
        let mut normal = move || {
            // Box-Muller from two uniforms in (0, 1].
            let u = |r: &mut Pcg64| ((r.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let (a, b) = (u(&mut rng), u(&mut rng));
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        };
        let xs = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0];
        let (slope, sweeps) = (0.01, 2000);
        let (mut points_hold, mut runs_hold) = (0, 0);
        for _ in 0..sweeps {
            let pts: Vec<Point> = xs
                .iter()
                .map(|&x| {
                    let off = 0.004 * normal();
                    Point {
                        x,
                        values: (0..3).map(|_| slope * x + off + 0.002 * normal()).collect(),
                    }
                })
                .collect();
            let f = LineFit::fit(&pts).unwrap();
            points_hold += usize::from(f.slope_ci95[0] <= slope && slope <= f.slope_ci95[1]);
            // Every run its own point: the same slope, runs − 1 degrees of freedom.
            let runs: Vec<Point> = pts
                .iter()
                .flat_map(|p| {
                    p.values.iter().map(|&v| Point {
                        x: p.x,
                        values: vec![v],
                    })
                })
                .collect();
            let (sxx, n): (f64, usize) = (runs.iter().map(|p| p.x * p.x).sum(), runs.len());
            let ssr: f64 = runs
                .iter()
                .map(|p| (p.values[0] - f.slope * p.x).powi(2))
                .sum();
            let half = t975((n - 1) as f64) * (ssr / (n - 1) as f64).sqrt() / sxx.sqrt();
            runs_hold += usize::from((f.slope - slope).abs() <= half);
        }
        let share = |k: usize| k as f64 / sweeps as f64;
        eprintln!("points: {}, runs: {}", share(points_hold), share(runs_hold));
        assert!(
            (0.93..=0.97).contains(&share(points_hold)),
            "{}",
            share(points_hold)
        );
        assert!(share(runs_hold) < 0.85, "{}", share(runs_hold));
    }
}

//! A straight line fitted to runs, and where it crosses a slowdown: ordinary least squares of
//! y on x with the slope's Student-t 95 % interval, and for a target slowdown p the x at
//! which the line reaches (1 + p) × its intercept, with Fieller's 95 % interval (the x for
//! which p·a − b·x is not significantly different from 0; the standard interval for a ratio
//! of regression coefficients, which the delta method would make symmetric and too narrow
//! when the slope is barely resolved). Pure functions of the pairs, so a test can recompute
//! every figure independently.
use super::stats::t975;

/// A line `y = intercept + slope · x` over `n` pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct LineFit {
    pub n: usize,
    pub intercept: f64,
    pub slope: f64,
    pub slope_ci95: [f64; 2],
    /// Residual standard deviation (n − 2 degrees of freedom).
    pub residual_sd: f64,
    /// The largest x fitted: beyond it a crossing is an extrapolation.
    pub x_max: f64,
    /// (XᵀX)⁻¹: the coefficients' covariance divided by the residual variance.
    v_aa: f64,
    v_ab: f64,
    v_bb: f64,
    /// Student's t at 97.5 %, n − 2 degrees of freedom.
    t: f64,
}

/// Where a fitted line crosses a target slowdown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crossing {
    pub target: f64,
    /// The x at which the line reaches (1 + target) × its intercept; NaN without a rising
    /// line.
    pub at: f64,
    /// Fieller's 95 % interval; NaN bounds when it is not bounded (the slope not resolved).
    pub ci95: [f64; 2],
    /// Whether the line rises and crosses within the fitted range (else it is not reached).
    pub reached: bool,
}

impl LineFit {
    /// The least-squares line; `None` below three pairs or when every x is the same.
    pub fn ols(xs: &[f64], ys: &[f64]) -> Option<LineFit> {
        let n = xs.len().min(ys.len());
        if n < 3 {
            return None;
        }
        let (xs, ys) = (&xs[..n], &ys[..n]);
        let nf = n as f64;
        let mx = xs.iter().sum::<f64>() / nf;
        let my = ys.iter().sum::<f64>() / nf;
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        let intercept = my - slope * mx;
        let ssr: f64 = xs
            .iter()
            .zip(ys)
            .map(|(x, y)| (y - intercept - slope * x).powi(2))
            .sum();
        let residual_sd = (ssr / (nf - 2.0)).sqrt();
        let t = t975(nf - 2.0);
        let v_bb = 1.0 / sxx;
        let half = t * residual_sd * v_bb.sqrt();
        Some(LineFit {
            n,
            intercept,
            slope,
            slope_ci95: [slope - half, slope + half],
            residual_sd,
            x_max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            v_aa: 1.0 / nf + mx * mx / sxx,
            v_ab: -mx / sxx,
            v_bb,
            t,
        })
    }

    /// Whether the slope's interval lies above 0.
    pub fn rises(&self) -> bool {
        self.slope_ci95[0] > 0.0
    }

    /// The x where the line reaches `(1 + target) × intercept`, and Fieller's interval: the
    /// x with `(p·a − b·x)² ≤ t² s² (p² v_aa − 2 p x v_ab + x² v_bb)`, a quadratic
    /// `A x² + B x + C ≤ 0` that is a bounded interval exactly when A > 0 (the slope is
    /// resolved).
    pub fn crossing(&self, target: f64) -> Crossing {
        let (a, b, p) = (self.intercept, self.slope, target);
        let at = if b > 0.0 { p * a / b } else { f64::NAN };
        let g = (self.t * self.residual_sd).powi(2);
        let qa = b * b - g * self.v_bb;
        let qb = -2.0 * p * (a * b - g * self.v_ab);
        // qb² − 4·qa·qc with its a²b² terms cancelled by hand (subtracting them in floating
        // point leaves a rounding error that can make an exact line's interval vanish).
        let (vaa, vab, vbb) = (self.v_aa, self.v_ab, self.v_bb);
        let disc = 4.0
            * p
            * p
            * g
            * (a * a * vbb - 2.0 * a * b * vab + b * b * vaa - g * (vaa * vbb - vab * vab));
        let ci95 = if qa > 0.0 && disc >= 0.0 {
            let r = disc.sqrt();
            [(-qb - r) / (2.0 * qa), (-qb + r) / (2.0 * qa)]
        } else {
            [f64::NAN; 2]
        };
        Crossing {
            target,
            at,
            ci95,
            reached: at.is_finite() && at >= 0.0 && at <= self.x_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_line_is_recovered_with_a_zero_width_interval() {
        let xs = [0.0, 0.0, 10.0, 10.0, 20.0];
        let ys: Vec<f64> = xs.iter().map(|x| 100.0 + 2.0 * x).collect();
        let f = LineFit::ols(&xs, &ys).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-12 && (f.intercept - 100.0).abs() < 1e-9);
        assert!(f.residual_sd < 1e-9 && f.rises());
        // 5 % of 100 at 2 per unit: 2.5, inside the fitted range.
        let c = f.crossing(0.05);
        assert!((c.at - 2.5).abs() < 1e-9 && c.reached);
        assert!((c.ci95[0] - 2.5).abs() < 1e-6 && (c.ci95[1] - 2.5).abs() < 1e-6);
        // 50 % needs 25, beyond the largest x (20): not reached.
        assert!(!f.crossing(0.5).reached);
        assert!(LineFit::ols(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]).is_none());
        assert!(LineFit::ols(&[1.0, 2.0], &[1.0, 2.0]).is_none());
    }

    #[test]
    fn a_noisy_line_gives_textbook_figures() {
        // By hand: x̄ = 4, ȳ = 10.56, Sxx = 40, Sxy = 29.2, b = 0.73, a = 7.64; residuals
        // -0.64, 0.90, -0.56, 0.98, -0.68: SSR = 2.956, s² = 2.956 / 3.
        let xs = [0.0, 2.0, 4.0, 6.0, 8.0];
        let ys = [7.0, 10.0, 10.0, 13.0, 12.8];
        let f = LineFit::ols(&xs, &ys).unwrap();
        assert!((f.slope - 0.73).abs() < 1e-12, "{}", f.slope);
        assert!((f.intercept - 7.64).abs() < 1e-12, "{}", f.intercept);
        let s = (2.956f64 / 3.0).sqrt();
        assert!((f.residual_sd - s).abs() < 1e-12);
        // t(3, 0.975) = 3.182446; half-width t s / sqrt(Sxx).
        let half = 3.182_446_305 * s / 40f64.sqrt();
        assert!((f.slope_ci95[1] - (0.73 + half)).abs() < 1e-6);
        // The crossing's interval holds its point, and its bounds make the quadratic 0.
        let c = f.crossing(0.2);
        assert!((c.at - 0.2 * 7.64 / 0.73).abs() < 1e-12);
        assert!(c.ci95[0] < c.at && c.at < c.ci95[1], "{c:?}");
        for x in c.ci95 {
            let lhs = (0.2 * f.intercept - f.slope * x).powi(2);
            let var = 0.04 * f.v_aa - 0.4 * x * f.v_ab + x * x * f.v_bb;
            let rhs = (f.t * f.residual_sd).powi(2) * var;
            assert!((lhs - rhs).abs() < 1e-9 * rhs.max(1.0), "{lhs} {rhs}");
        }
    }

    #[test]
    fn a_flat_line_has_no_crossing_and_no_bounded_interval() {
        let xs = [0.0, 0.0, 0.0, 50.0, 50.0, 50.0];
        let ys = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0];
        let f = LineFit::ols(&xs, &ys).unwrap();
        assert!(!f.rises());
        let c = f.crossing(0.05);
        assert!(!c.reached);
        assert!(c.ci95[0].is_nan() && c.ci95[1].is_nan());
    }
}

//! The statistics a study reports: mean, sd and a Student-t 95 % confidence interval per
//! configuration, the ratio of two means with its interval, Pearson's r with its p-value,
//! and Fisher's z test of two correlations. Pure functions of the measured values, so a
//! test can recompute every figure independently.
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Significance level of a study's tests (the verdict's, a line's lack of fit).
pub const ALPHA: f64 = 0.05;

/// Arithmetic mean; NaN when empty.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sample standard deviation (n − 1); NaN below two values.
pub fn sd(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return f64::NAN;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Median (mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// The two-sided 97.5 % quantile of Student's t with `df` degrees of freedom.
pub fn t975(df: f64) -> f64 {
    if !(df.is_finite() && df > 0.0) {
        return f64::NAN;
    }
    StudentsT::new(0.0, 1.0, df)
        .map(|t| t.inverse_cdf(0.975))
        .unwrap_or(f64::NAN)
}

/// Half-width of the 95 % confidence interval of the mean (t with n − 1 df); NaN below two
/// values.
pub fn ci95_half(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return f64::NAN;
    }
    t975((xs.len() - 1) as f64) * sd(xs) / (xs.len() as f64).sqrt()
}

/// The ratio mean(num) / mean(den) and its 95 % interval: `(ratio, low, high)`, NaN parts
/// where a side has under two values. The delta method on the log of the ratio, with Welch's
/// degrees of freedom on the two relative variances: `ratio · exp(± t · se)`, se² =
/// var(num)/(n·mean(num)²) + var(den)/(n·mean(den)²). On the log scale the interval of a
/// ratio of positive means stays positive and grows with the ratio, as the ratio's own
/// spread does: a noisy denominator (a few clean runs, one of them slow) no longer gives a
/// 28x slowdown an interval reaching below 1. Where a mean is not positive (a metric that
/// can be negative), the same variances give a symmetric interval around the ratio.
pub fn ratio_ci95(num: &[f64], den: &[f64]) -> (f64, f64, f64) {
    let (mn, md) = (mean(num), mean(den));
    let r = mn / md;
    if num.len() < 2 || den.len() < 2 {
        return (r, f64::NAN, f64::NAN);
    }
    // Relative variances of the two means.
    let a = sd(num).powi(2) / num.len() as f64 / (mn * mn);
    let b = sd(den).powi(2) / den.len() as f64 / (md * md);
    let se = (a + b).sqrt();
    // Welch–Satterthwaite on the relative variances.
    let df = if a + b > 0.0 {
        (a + b).powi(2)
            / (a * a / (num.len() - 1) as f64 + b * b / (den.len() - 1) as f64)
                .max(f64::MIN_POSITIVE)
    } else {
        f64::INFINITY
    };
    let t = if df.is_finite() {
        t975(df)
    } else {
        1.959_963_984_540_054
    };
    if mn > 0.0 && md > 0.0 {
        (r, r * (-t * se).exp(), r * (t * se).exp())
    } else {
        (r, r - t * se * r.abs(), r + t * se * r.abs())
    }
}

/// Pearson's correlation coefficient; NaN when either side is constant or under three pairs.
pub fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len().min(ys.len());
    if n < 3 {
        return f64::NAN;
    }
    let (mx, my) = (mean(&xs[..n]), mean(&ys[..n]));
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx).powi(2);
        syy += (y - my).powi(2);
    }
    if sxx == 0.0 || syy == 0.0 {
        return f64::NAN;
    }
    sxy / (sxx * syy).sqrt()
}

/// Two-sided p-value of r ≠ 0 over n pairs (t = r √((n−2)/(1−r²)), n − 2 df).
pub fn pearson_p(r: f64, n: usize) -> f64 {
    if !r.is_finite() || n < 3 {
        return f64::NAN;
    }
    if r.abs() >= 1.0 {
        return 0.0;
    }
    let df = (n - 2) as f64;
    let t = r * (df / (1.0 - r * r)).sqrt();
    StudentsT::new(0.0, 1.0, df)
        .map(|d| 2.0 * (1.0 - d.cdf(t.abs())))
        .unwrap_or(f64::NAN)
}

/// Fisher's z test of two correlations, each over n pairs, as the research used it:
/// z = (atanh r1 − atanh r2) / √(2 / (n − 3)); returns (z, two-sided p). NaN under four pairs.
pub fn fisher_z(r1: f64, r2: f64, n: usize) -> (f64, f64) {
    if n < 4 || !r1.is_finite() || !r2.is_finite() {
        return (f64::NAN, f64::NAN);
    }
    // atanh(±1) is infinite: keep the test finite for a perfect correlation.
    let clamp = |r: f64| r.clamp(-0.999_999, 0.999_999);
    let z = (clamp(r1).atanh() - clamp(r2).atanh()) / (2.0 / (n - 3) as f64).sqrt();
    let p = 2.0 * (1.0 - Normal::standard().cdf(z.abs()));
    (z, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_and_intervals_match_known_values() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        assert!((sd(&xs) - 2.138_089_935).abs() < 1e-9);
        assert_eq!(median(&xs), 4.5);
        // t(7, 0.975) = 2.364624; half = t * sd / sqrt(8).
        assert!((ci95_half(&xs) - 2.364_624_252 * 2.138_089_935 / 8f64.sqrt()).abs() < 1e-6);
        assert!(ci95_half(&[1.0]).is_nan());
    }

    #[test]
    fn correlations_and_fisher_z() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!((pearson(&x, &[2.0, 4.0, 6.0, 8.0, 10.0]) - 1.0).abs() < 1e-12);
        assert!((pearson(&x, &[5.0, 4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert!(pearson(&x, &[1.0; 5]).is_nan());
        let r = pearson(&x, &[1.0, 3.0, 2.0, 5.0, 4.0]);
        assert!((r - 0.8).abs() < 1e-12);
        // t = 0.8 * sqrt(3 / 0.36) = 2.3094, 3 df: p = 0.1041.
        assert!((pearson_p(r, 5) - 0.1041).abs() < 1e-3);
        // z = (atanh .95 - atanh .70) / sqrt(2 / 27) = (1.8318 - 0.8673) / 0.2722 = 3.544.
        let (z, p) = fisher_z(0.95, 0.70, 30);
        assert!((z - 3.544).abs() < 1e-3, "{z}");
        assert!(p < 0.001);
        assert!(fisher_z(0.9, 0.8, 3).0.is_nan());
    }

    #[test]
    fn a_ratio_of_equal_means_straddles_one() {
        let a = [10.0, 11.0, 9.0, 10.5, 9.5];
        let (r, lo, hi) = ratio_ci95(&a, &a);
        assert_eq!(r, 1.0);
        assert!(lo < 1.0 && hi > 1.0);
        let b: Vec<f64> = a.iter().map(|x| 2.0 * x).collect();
        let (r, lo, hi) = ratio_ci95(&b, &a);
        assert_eq!(r, 2.0);
        assert!(lo > 1.5 && hi < 2.5 && lo < 2.0 && hi > 2.0);
    }

    #[test]
    fn a_large_ratio_over_a_noisy_base_keeps_a_positive_interval() {
        // A bench run's congestor study: 4 clean runs, one slow; 4 congested runs.
        let clean = [160.0, 171.0, 172.0, 462.0];
        let congested = [4200.0, 6700.0, 6780.0, 9230.0];
        let (r, lo, hi) = ratio_ci95(&congested, &clean);
        assert!(lo > 5.0 && lo < r && r < hi, "{r} [{lo}, {hi}]");
        // Symmetric on the log scale: lo * hi = r^2.
        assert!((lo * hi / (r * r) - 1.0).abs() < 1e-12);
        // Hand-computed: relative variances a, b and Welch's df give t, then r e^(±t se).
        let (mn, md) = (mean(&congested), mean(&clean));
        let a = sd(&congested).powi(2) / 4.0 / (mn * mn);
        let b = sd(&clean).powi(2) / 4.0 / (md * md);
        let df = (a + b).powi(2) / (a * a / 3.0 + b * b / 3.0);
        let t = t975(df);
        assert!((hi - r * (t * (a + b).sqrt()).exp()).abs() < 1e-9 * hi);
        // A metric that can be negative: a symmetric interval, still around the ratio.
        let (r, lo, hi) = ratio_ci95(&[-2.0, -2.2, -1.8], &[1.0, 1.1, 0.9]);
        assert!(lo < r && r < hi && ((r - lo) - (hi - r)).abs() < 1e-12);
    }
}

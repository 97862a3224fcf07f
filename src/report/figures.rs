//! Figures for people: the one way summaries, sentences and tables write a measured number.

/// `v` with `significant` digits: fixed notation from 0.01 up to a million (`0.0123`, `12.3`,
/// `5000`), scientific outside it (`1.23e-5`, a runtime in seconds per µs), `0` for zero and
/// `–` when not finite. The decimals are chosen on the value as rounded: 9.9996 to three
/// digits is `10.0`, not `10.00`.
pub fn figure(v: f64, significant: usize) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let sig = significant.max(1);
    if !(0.01..1e6).contains(&v.abs()) {
        return format!("{v:.*e}", sig - 1);
    }
    let decimals = |e: i32| (sig as i32 - 1 - e).max(0) as usize;
    let e = v.abs().log10().floor() as i32;
    let text = format!("{v:.*}", decimals(e));
    // Rounded up to the next power of ten, it has a digit more than asked: one decimal less.
    match text.trim_start_matches('-').parse::<f64>() {
        Ok(r) if r >= 10f64.powi(e + 1) => format!("{v:.*}", decimals(e + 1)),
        _ => text,
    }
}

/// `[lo, hi]`, each a [`figure`].
pub fn interval(ci: [f64; 2], significant: usize) -> String {
    format!(
        "[{}, {}]",
        figure(ci[0], significant),
        figure(ci[1], significant)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits_in_fixed_or_scientific_notation() {
        assert_eq!(figure(38.04, 3), "38.0");
        assert_eq!(figure(9.9996, 3), "10.0");
        assert_eq!(figure(99.96, 3), "100");
        assert_eq!(figure(0.5, 3), "0.500");
        assert_eq!(figure(0.012345, 3), "0.0123");
        assert_eq!(figure(-1234.6, 3), "-1235");
        assert_eq!(figure(1.2345, 5), "1.2345");
        assert_eq!(figure(1.2345e-5, 3), "1.23e-5");
        assert_eq!(figure(2.5e7, 3), "2.50e7");
        assert_eq!(figure(0.0, 3), "0");
        assert_eq!(figure(f64::NAN, 3), "–");
        assert_eq!(interval([1.0, 2.5], 3), "[1.00, 2.50]");
    }
}

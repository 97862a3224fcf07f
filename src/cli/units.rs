//! Command-line values with units shared by `run` and `serve`: byte sizes (`64K`, `1MiB`),
//! rates (`10k`), durations (`5s`, `10ms`, through the library's duration parser).
use ibjitter::table::duration::parse_duration;
use std::time::Duration;

/// `65536`, `64K`, `64KiB`, `1M`, `1MiB`, `1G` (binary multiples, as perftest's sizes).
pub fn size(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let too_large = || {
        format!(
            "size {text:?} is too large: at most {} bytes (4G - 1)",
            u32::MAX
        )
    };
    let n: u64 = num.parse().map_err(|e: std::num::ParseIntError| {
        if *e.kind() == std::num::IntErrorKind::PosOverflow {
            too_large()
        } else {
            format!("expected a size like 65536 or 64K, found {text:?}")
        }
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?} (use K, M or G)"
            ))
        }
    };
    // Checked: an unchecked product wraps (18014398509482048K was taken as 64 KiB).
    n.checked_mul(mult)
        .and_then(|b| u32::try_from(b).ok())
        .ok_or_else(too_large)
}

/// A positive rate: `1000`, `10k`, `2.5M` (per second).
pub fn rate(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("expected a rate like 1000 or 10k, found {text:?}"))?;
    let per_s = v * mult;
    if !(per_s > 0.0 && per_s.is_finite()) {
        return Err(format!("rate must be positive and finite, found {text:?}"));
    }
    Ok(per_s)
}

/// A link rate in Gb/s from `25G`, `25gbit`, `200mbit`, `200M`, `1.5g`.
pub fn bit_rate(text: &str) -> Result<f64, String> {
    let t = text.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("expected a rate like 25G or 200mbit, found {text:?}"))?;
    let gbps = match unit.trim_end_matches("bps").trim_end_matches("bit") {
        "g" => v,
        "m" => v / 1e3,
        "k" => v / 1e6,
        _ => {
            return Err(format!(
                "expected a rate like 25G or 200mbit (units G, M, K, gbit, mbit), found {text:?}"
            ))
        }
    };
    if !(gbps > 0.0 && gbps.is_finite()) {
        return Err(format!("a rate must be positive, found {text:?}"));
    }
    Ok(gbps)
}

/// A positive duration with a unit: `5s`, `250ms`, `10us`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let d = duration_or_zero(text)?;
    if d.is_zero() {
        return Err(format!(
            "expected a positive duration (at least 1ns), found {text:?}"
        ));
    }
    Ok(d)
}

/// A duration of at least 0 (`0s` allowed), whole nanoseconds, at most u64::MAX ns (584
/// years): larger values are refused rather than saturated.
pub fn duration_or_zero(text: &str) -> Result<Duration, String> {
    let ns = parse_duration(text)?;
    if ns < 0.0 {
        return Err(format!("expected a duration of at least 0, found {text:?}"));
    }
    // u64::MAX as f64 rounds up to 2^64, so this refuses exactly what does not fit.
    if ns >= u64::MAX as f64 {
        return Err(format!(
            "duration {text:?} is too long: at most {}ns (about 584 years)",
            u64::MAX
        ));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// A fraction in (0, 1].
pub fn fraction(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a fraction like 0.5, found {text:?}"))?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!("expected a fraction in (0, 1], found {text:?}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size("65536"), Ok(65536));
        assert_eq!(size("64K"), Ok(65536));
        assert_eq!(size("1MiB"), Ok(1 << 20));
        assert!(size("8X").unwrap_err().contains("unit"));
        assert!(size("8G").unwrap_err().contains("too large"));
        assert!(size("big").is_err());
        // Products and numbers that overflow are refused, not wrapped.
        assert!(size("18014398509482048K")
            .unwrap_err()
            .contains("too large"));
        assert!(size("17179869185G").unwrap_err().contains("too large"));
        assert!(size("99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(size("4194303K"), Ok(4194303 << 10));
    }

    #[test]
    fn bit_rates() {
        assert_eq!(bit_rate("25G"), Ok(25.0));
        assert_eq!(bit_rate("200mbit"), Ok(0.2));
        assert_eq!(bit_rate("1.5gbps"), Ok(1.5));
        assert_eq!(bit_rate("400M"), Ok(0.4));
        assert!(bit_rate("fast").is_err());
        assert!(bit_rate("10").unwrap_err().contains("units G, M, K"));
        assert!(bit_rate("0G").is_err());
    }

    #[test]
    fn rates_durations_fractions() {
        assert_eq!(rate("10k"), Ok(10_000.0));
        assert!(rate("-1").is_err());
        assert_eq!(duration("10ms"), Ok(Duration::from_millis(10)));
        // `ibjitter run -D 24h`: a day's run as a user writes it.
        assert_eq!(duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(duration("90min"), Ok(Duration::from_secs(5_400)));
        assert!(duration("5").unwrap_err().contains("unit"));
        assert!(duration("0s").is_err());
        assert!(duration("0.1ns").unwrap_err().contains("at least 1ns"));
        assert!(duration("1e30s").unwrap_err().contains("too long"));
        assert!(duration("1e300s").is_err());
        assert_eq!(duration_or_zero("0s"), Ok(Duration::ZERO));
        assert!(rate("1e308k").unwrap_err().contains("finite"));
        assert_eq!(fraction("0.5"), Ok(0.5));
        assert!(fraction("1.5").is_err());
    }
}

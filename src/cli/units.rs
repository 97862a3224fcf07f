//! Command-line values with units shared by `run` and `serve`: byte sizes (`64K`, `1MiB`),
//! rates (`10k`), durations (`5s`, `10ms`, through the library's duration parser).
use ibjitter::table::duration::parse_duration;
use std::time::Duration;

/// `65536`, `64K`, `64KiB`, `1M`, `1MiB`, `1G` (binary multiples, as perftest's sizes).
pub fn size(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("expected a size like 65536 or 64K, found {text:?}"))?;
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
    u32::try_from(n * mult).map_err(|_| {
        format!(
            "size {text:?} is too large: at most {} bytes (4G - 1)",
            u32::MAX
        )
    })
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
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("rate must be positive, found {text:?}"));
    }
    Ok(v * mult)
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
    let ns = parse_duration(text)?;
    if ns <= 0.0 {
        return Err(format!("expected a positive duration, found {text:?}"));
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
        assert!(duration("5").unwrap_err().contains("unit"));
        assert!(duration("0s").is_err());
        assert_eq!(fraction("0.5"), Ok(0.5));
        assert!(fraction("1.5").is_err());
    }
}

//! Durations with units, as the CLI and sample files give them: `6.1us`, `250 ns`, `1.5ms`,
//! `24h`.
//!
//! Everything inside the library is in nanoseconds (`f64`); this module turns text into
//! nanoseconds and nanoseconds back into text for table headers.

use std::fmt;
use std::str::FromStr;

/// A time unit accepted on the command line and in sample files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ns,
    Us,
    Ms,
    S,
    /// Minutes and hours: a 24-hour run is `24h`, not `86400s`.
    Min,
    H,
}

impl Unit {
    /// Nanoseconds in one of this unit.
    pub fn ns(self) -> f64 {
        match self {
            Unit::Ns => 1.0,
            Unit::Us => 1e3,
            Unit::Ms => 1e6,
            Unit::S => 1e9,
            Unit::Min => 60e9,
            Unit::H => 3600e9,
        }
    }

    /// Recognizes `ns`, `us`/`µs`/`μs`/`usec`, `ms`/`msec`, `s`/`sec`, `min`, `h`/`hour`
    /// (case-insensitive ASCII). Not `m`: minutes or milliseconds, the reader cannot tell.
    pub fn parse(text: &str) -> Option<Unit> {
        let t = text.trim();
        // Both the micro sign (U+00B5) and Greek small mu (U+03BC) are in use.
        let t = t.replace(['\u{b5}', '\u{3bc}'], "u").to_ascii_lowercase();
        match t.as_str() {
            "ns" | "nsec" => Some(Unit::Ns),
            "us" | "usec" => Some(Unit::Us),
            "ms" | "msec" => Some(Unit::Ms),
            "s" | "sec" => Some(Unit::S),
            "min" | "mins" => Some(Unit::Min),
            "h" | "hour" | "hours" => Some(Unit::H),
            _ => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Ns => "ns",
            Unit::Us => "us",
            Unit::Ms => "ms",
            Unit::S => "s",
            Unit::Min => "min",
            Unit::H => "h",
        })
    }
}

impl FromStr for Unit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("m") {
            return Err("unit \"m\" could be minutes or milliseconds: write min or ms".into());
        }
        Unit::parse(s)
            .ok_or_else(|| format!("expected a unit (ns, us, µs, ms, s, min, h), found {s:?}"))
    }
}

/// A duration in nanoseconds, parsed from `<number><unit>` (space allowed between them).
/// The unit is required: a bare number is an error, so that `6` never silently means 6 ns.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Duration {
    pub ns: f64,
}

impl FromStr for Duration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(|ns| Duration { ns })
    }
}

/// Parses `<number><unit>` into nanoseconds. Negative values are allowed (a lognormal location
/// may be negative); callers that need a positive duration check it.
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(t.len());
    // "1e3us" is fine, but an 'e' that starts the unit cannot happen with our units.
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if unit.is_empty() {
        return Err(format!(
            "expected a duration with a unit (e.g. 6.1us, 250ns, 1.5ms), found {text:?} (no unit)"
        ));
    }
    let unit: Unit = unit
        .parse()
        .map_err(|e: String| format!("in {text:?}: {e}"))?;
    let value: f64 = num
        .parse()
        .map_err(|_| format!("expected a number before the unit in {text:?}, found {num:?}"))?;
    let ns = value * unit.ns();
    if !ns.is_finite() {
        return Err(format!("expected a finite duration, found {text:?}"));
    }
    Ok(ns)
}

/// Nanoseconds for table headers: the shortest text that reads back as the same `f64`,
/// followed by `ns` (e.g. `6100ns`, `1243.5ns`). Deterministic, so headers regenerate
/// byte for byte.
pub fn format_ns(ns: f64) -> String {
    format!("{ns}ns")
}

/// [`format_ns`] of `ns` rounded to a thousandth of a nanosecond: computed figures (a mean, an
/// sd) in headers, without float noise in the last digits.
pub fn format_ns_rounded(ns: f64) -> String {
    format_ns((ns * 1000.0).round() / 1000.0)
}

/// A duration for people: three significant digits in the largest unit that keeps the number
/// at or above 1 (`48.7ms`, `6.10us`, `250ns`). Reads back with [`parse_duration`], but is
/// rounded: headers and machine-read values use [`format_ns`].
pub fn format_short(ns: f64) -> String {
    let a = ns.abs();
    let (v, unit) = if a >= 1e9 {
        (ns / 1e9, "s")
    } else if a >= 1e6 {
        (ns / 1e6, "ms")
    } else if a >= 1e3 {
        (ns / 1e3, "us")
    } else {
        (ns, "ns")
    };
    let decimals = match v.abs() {
        x if x >= 100.0 => 0,
        x if x >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.decimals$}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("250ns").unwrap(), 250.0);
        assert_eq!(parse_duration("6.1us").unwrap(), 6100.0);
        assert_eq!(parse_duration("6.1µs").unwrap(), 6100.0);
        assert_eq!(parse_duration("6.1\u{3bc}s").unwrap(), 6100.0);
        assert_eq!(parse_duration("1.5 ms").unwrap(), 1_500_000.0);
        assert_eq!(parse_duration("2s").unwrap(), 2e9);
        assert_eq!(parse_duration("1e3us").unwrap(), 1e6);
        assert_eq!(parse_duration("-2us").unwrap(), -2000.0);
        assert_eq!(parse_duration("24h").unwrap(), 86_400e9);
        assert_eq!(parse_duration("1.5 min").unwrap(), 90e9);
        assert_eq!(parse_duration("2HOURS").unwrap(), 7200e9);
    }

    #[test]
    fn errors_say_what_was_expected() {
        assert!(parse_duration("6").unwrap_err().contains("no unit"));
        assert!(parse_duration("6 parsecs")
            .unwrap_err()
            .contains("expected a unit"));
        assert!(parse_duration("x.1us").unwrap_err().contains("expected"));
        assert!(parse_duration("us")
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_duration("1e400ms").is_err());
        assert!(parse_duration("5m").unwrap_err().contains("min or ms"));
    }

    #[test]
    fn short_format() {
        assert_eq!(format_short(48_700_000.0), "48.7ms");
        assert_eq!(format_short(6100.0), "6.10us");
        assert_eq!(format_short(250.0), "250ns");
        assert_eq!(format_short(2.5e9), "2.50s");
        assert_eq!(parse_duration(&format_short(123_456.0)).unwrap(), 123_000.0);
    }

    #[test]
    fn format_round_trips() {
        for v in [6100.0, 1243.0639, 0.5, 1e12] {
            let s = format_ns(v);
            assert_eq!(parse_duration(&s).unwrap(), v);
        }
    }
}

//! The grammar of single values: durations (in ns or loops), seeds, probabilities,
//! correlations, rank lists. Pure parsing: errors say the variable, what was found and what
//! is expected; nothing here reads the environment.
use ibjitter_table as table;
use std::path::Path;

/// What a table entry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ns,
    /// Raw busy-loop iterations, as the research's injector used.
    Loops,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Loops => "loops",
        }
    }
}

/// The most of a user's value a message quotes: a warning stays one readable line whatever
/// was pasted into a variable.
pub const QUOTE_MAX: usize = 200;

/// `v` for a message: as is up to [`QUOTE_MAX`] bytes, else its start and its length
/// ("abc… (131072 bytes)").
pub fn shown(v: &str) -> std::borrow::Cow<'_, str> {
    if v.len() <= QUOTE_MAX {
        return v.into();
    }
    let mut end = QUOTE_MAX;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &v[..end], v.len()).into()
}

/// `v` quoted for a message (`"…"`, escapes as Rust writes them), at most [`QUOTE_MAX`]
/// bytes of it.
pub fn quoted(v: &str) -> String {
    if v.len() <= QUOTE_MAX {
        return format!("{v:?}");
    }
    let mut end = QUOTE_MAX;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &v[..end], v.len())
}

/// `msg` (another crate's message) with each quote of the user's `v` shortened as by
/// [`shown`].
pub fn clipped(msg: String, v: &str) -> String {
    if v.len() <= QUOTE_MAX {
        return msg;
    }
    msg.replace(v, &shown(v))
}

/// The words every boolean variable accepts, in any case.
pub const BOOLEAN_WORDS: &str = "1/0, true/false, yes/no or on/off";

/// A boolean variable (`IBJITTER_QUIET`, `_CONTROL`, `_SEED_PER_RANK`): one grammar for all.
pub fn parse_bool(var: &str, v: &str) -> Result<bool, String> {
    let t = v.trim();
    match t.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{var}={}: expected 0 or 1 (or {BOOLEAN_WORDS}, any case)",
            shown(t)
        )),
    }
}

/// `IBJITTER_PROB=p`, 0 < p <= 1.
pub fn parse_probability(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "IBJITTER_PROB={}: expected a probability in (0, 1], e.g. 0.1",
            shown(v.trim())
        )),
    }
}

/// `IBJITTER_CORRELATION=rho`: 0 <= rho < 1, or a percentage as netem writes it (`25%`).
pub fn parse_correlation(v: &str) -> Result<f64, String> {
    let t = v.trim();
    let rho = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    };
    match rho {
        Ok(r) if (0.0..1.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "IBJITTER_CORRELATION={}: expected a correlation in [0, 1), e.g. 0.5 or 50%",
            shown(t)
        )),
    }
}

/// `IBJITTER_RANKS=0,3-5`: ranks and inclusive ranges, kept as ranges (a range of a billion
/// ranks costs 8 bytes, not 4 GB), sorted and merged: membership is a binary search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranks(Vec<(u32, u32)>);

impl Ranks {
    pub fn contains(&self, rank: u32) -> bool {
        let i = self.0.partition_point(|&(_, last)| last < rank);
        self.0.get(i).is_some_and(|&(first, _)| first <= rank)
    }
}

/// `IBJITTER_RANKS=0,3-5`: ranks and inclusive ranges.
pub fn parse_ranks(v: &str) -> Result<Ranks, String> {
    let bad = || {
        format!(
            "IBJITTER_RANKS={}: expected ranks and ranges like 0,3-5",
            shown(v.trim())
        )
    };
    let mut ranges = Vec::new();
    for part in v.split(',').map(str::trim) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b {
            return Err(bad());
        }
        ranges.push((a, b));
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    Ok(Ranks(merged))
}

/// A seed file holds one integer (and perhaps a comment): more is not a seed file.
pub const MAX_SEED_BYTES: u64 = 4096;

/// `IBJITTER_SEED=N` (decimal or 0x hex) or `IBJITTER_SEED=FILE` holding one integer.
pub fn parse_seed(v: &str) -> Result<(u64, String), String> {
    let v = v.trim();
    if let Some(n) = parse_u64(v) {
        return Ok((n, "IBJITTER_SEED".into()));
    }
    let bytes = table::format::read_small_file(Path::new(v), MAX_SEED_BYTES).map_err(|e| {
        format!(
            "IBJITTER_SEED={}: not an integer, and cannot read it as a seed file: {}",
            shown(v),
            clipped(e.to_string(), v)
        )
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let t = text.trim();
    parse_u64(t)
        .map(|n| (n, format!("file {v}")))
        .ok_or_else(|| {
            let found: String = t.chars().take(40).collect();
            format!(
                "IBJITTER_SEED={}: seed file must hold one integer, found {found:?}",
                shown(v)
            )
        })
}

pub fn parse_u64(t: &str) -> Option<u64> {
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        t.parse().ok()
    }
}

/// The longest text read as a duration: any real one is far shorter, and a long one would
/// be quoted in full by the table crate's messages.
const DURATION_MAX_BYTES: usize = 64;

/// The largest duration (ns, or loops) any setting may hold: what a u64 holds. A larger
/// one (`1e30s`) would wrap or saturate wherever it is converted, so it is refused here.
pub const DURATION_MAX: f64 = u64::MAX as f64;

/// The longest delay the injector holds, whatever `IBJITTER_MAX_DELAY` says: 10^15 ns
/// (11.6 days; or loops). The counts carry it: in clock units (up to 10 per ns: 10^16) and,
/// in ns, summed over a full delay line (4,096 requests: 4.1 * 10^18) within 64 bits. A
/// delay of 2^63 ns saturated the clock units and the sums, and the exit line reported
/// requests never handed over as ~2.8 * 10^13 ms delayed.
pub const DELAY_CEILING: u64 = 1_000_000_000_000_000;

/// Parses IBJITTER_DELAY/JITTER: a duration in the table crate's one grammar (a number and a
/// unit: ns, us/µs/usec, ms/msec, s/sec, e.g. `1.5ms`, `250 ns`, `1e3us`), non-negative. A bare
/// `0` needs no unit. A bare non-zero number is refused: tc reads it as µs, most readers as
/// ns, so we ask instead of guessing. In loops mode the value is a plain loop count.
/// Non-finite and negative values are refused.
pub fn parse_duration(v: &str, unit: Unit) -> Result<f64, String> {
    let t = v.trim();
    if t.len() > DURATION_MAX_BYTES {
        return Err(format!(
            "{}: too long for a duration (at most {DURATION_MAX_BYTES} bytes)",
            quoted(t)
        ));
    }
    let bare: Option<f64> = t.parse().ok().filter(|n: &f64| n.is_finite());
    let n = match (unit, bare) {
        (Unit::Loops, Some(n)) => n,
        (Unit::Loops, None) => {
            return Err(format!(
                "{t:?}: with IBJITTER_UNIT=loops give a plain loop count"
            ))
        }
        (Unit::Ns, Some(0.0)) => 0.0,
        (Unit::Ns, Some(n)) => {
            return Err(format!("{t:?}: missing unit (write e.g. {n}us or {n}ns)"))
        }
        (Unit::Ns, None) => {
            table::duration::parse_duration(t).map_err(|e| format!("{t:?}: {e}"))?
        }
    };
    if !n.is_finite() {
        return Err(format!("{t:?}: expected a finite duration"));
    }
    if n < 0.0 {
        return Err(format!("{t:?}: expected a non-negative duration"));
    }
    Ok(n)
}

/// [`parse_duration`] for a value kept as a whole count (a bound, a time, a completion
/// delay): larger than [`DURATION_MAX`] is refused, where a conversion would saturate or wrap.
pub fn parse_duration_u64(v: &str, unit: Unit) -> Result<u64, String> {
    let n = parse_duration(v, unit)?;
    if n.round() >= DURATION_MAX {
        // Read as a float: values within ~2,048 of 2^64 (u64::MAX itself) round up to it.
        return Err(format!(
            "{:?}: too large (read as 2^64 {u} or more; 64 bits hold less)",
            v.trim(),
            u = unit.name()
        ));
    }
    Ok(n.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1.5ms", Unit::Ns), Ok(1.5e6));
        assert_eq!(parse_duration("250 ns", Unit::Ns), Ok(250.0));
        assert_eq!(parse_duration("2sec", Unit::Ns), Ok(2e9));
        assert_eq!(parse_duration("0", Unit::Ns), Ok(0.0));
        assert!(parse_duration("100", Unit::Ns)
            .unwrap_err()
            .contains("missing unit"));
        assert!(parse_duration("1furlong", Unit::Ns).is_err());
        // The table grammar's forms: exponents, µ/μ, any ASCII case.
        assert_eq!(parse_duration("1e3us", Unit::Ns), Ok(1e6));
        assert_eq!(parse_duration("6.1µs", Unit::Ns), Ok(6100.0));
        assert_eq!(parse_duration("2MS", Unit::Ns), Ok(2e6));
        // IBJITTER_START=1h (a job that settles for an hour first), IBJITTER_DELAY=1min.
        assert_eq!(parse_duration("1h", Unit::Ns), Ok(3.6e12));
        assert_eq!(parse_duration("1min", Unit::Ns), Ok(60e9));
        assert!(parse_duration("1m", Unit::Ns)
            .unwrap_err()
            .contains("min or ms"));
        assert!(parse_duration("1e400ms", Unit::Ns).is_err());
        assert!(parse_duration("inf", Unit::Ns).is_err());
        assert!(parse_duration("-1", Unit::Loops).is_err());
        assert!(parse_duration("-3us", Unit::Ns).is_err());
        assert_eq!(parse_duration("300", Unit::Loops), Ok(300.0));
        assert!(parse_duration("3us", Unit::Loops).is_err());
    }
}

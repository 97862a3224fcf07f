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

/// `IBJITTER_PROB=p`, 0 < p <= 1.
pub fn parse_probability(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "IBJITTER_PROB={}: expected a probability in (0, 1], e.g. 0.1",
            v.trim()
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
            "IBJITTER_CORRELATION={t}: expected a correlation in [0, 1), e.g. 0.5 or 50%"
        )),
    }
}

/// `IBJITTER_RANKS=0,3-5`: ranks and inclusive ranges.
pub fn parse_ranks(v: &str) -> Result<Vec<u32>, String> {
    let bad = || {
        format!(
            "IBJITTER_RANKS={}: expected ranks and ranges like 0,3-5",
            v.trim()
        )
    };
    let mut ranks = Vec::new();
    for part in v.split(',').map(str::trim) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b || b - a > 1_000_000 {
                    return Err(bad());
                }
                ranks.extend(a..=b);
            }
            None => ranks.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(ranks)
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
        format!("IBJITTER_SEED={v}: not an integer, and cannot read it as a seed file: {e}")
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let t = text.trim();
    parse_u64(t)
        .map(|n| (n, format!("file {v}")))
        .ok_or_else(|| {
            let shown: String = t.chars().take(40).collect();
            format!("IBJITTER_SEED={v}: seed file must hold one integer, found {shown:?}")
        })
}

pub fn parse_u64(t: &str) -> Option<u64> {
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        t.parse().ok()
    }
}

/// Parses IBJITTER_DELAY/JITTER: a duration in the table crate's one grammar (a number and a
/// unit: ns, us/µs/usec, ms/msec, s/sec, e.g. `1.5ms`, `250 ns`, `1e3us`), non-negative. A bare
/// `0` needs no unit. A bare non-zero number is refused: tc reads it as µs, most readers as
/// ns, so we ask instead of guessing. In loops mode the value is a plain loop count.
pub fn parse_duration(v: &str, unit: Unit) -> Result<f64, String> {
    let t = v.trim();
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
    if n < 0.0 {
        return Err(format!("{t:?}: expected a non-negative duration"));
    }
    Ok(n)
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
        assert!(parse_duration("1e400ms", Unit::Ns).is_err());
        assert!(parse_duration("inf", Unit::Ns).is_err());
        assert!(parse_duration("-1", Unit::Loops).is_err());
        assert!(parse_duration("-3us", Unit::Ns).is_err());
        assert_eq!(parse_duration("300", Unit::Loops), Ok(300.0));
        assert!(parse_duration("3us", Unit::Loops).is_err());
    }
}

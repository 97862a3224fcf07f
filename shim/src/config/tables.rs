//! Loading and bounding the tables the settings name: the send table (`IBJITTER_TABLE`,
//! `_DIST`, `_DELAY`, `_JITTER`), `IBJITTER_PROB`'s thinning, `IBJITTER_EPISODES`' two tables
//! and the completion-side table (`IBJITTER_CQ_TABLE`, `_CQ_DELAY`).
use crate::config::dists::{dist_dirs, find_named, own_path};
use crate::config::values::{clipped, parse_duration, parse_duration_u64, quoted, shown, Unit};
use ibjitter_table::{self as table, Kind, ENTRIES};
use std::path::{Path, PathBuf};

/// How the loaders read the environment (the process's, or a live `set`'s lines).
pub type Var<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A loaded delay table, in `Unit`s.
#[derive(Debug, Clone, PartialEq)]
pub struct Delays {
    /// How it was specified, for the startup line and the stats file.
    pub source: String,
    pub values: Vec<u64>,
}

impl Delays {
    pub fn mean(&self) -> f64 {
        self.values.iter().map(|&v| v as f64).sum::<f64>() / self.values.len() as f64
    }
    pub fn max(&self) -> u64 {
        self.values.iter().copied().max().unwrap_or(0)
    }
}

/// The salt of the stream that chooses `IBJITTER_PROB`'s entries (the draws' streams use 0
/// and fork numbers).
const PROBABILITY_SALT: u64 = 0x7072_6f62; // "prob"

/// The table with all but round(p x 4096) of its entries set to 0, the kept ones chosen by a
/// shuffle seeded from `seed`: a draw (a uniform index) then delays with probability p, at
/// no cost on the post path, and the delays it draws are a random sample of the table's.
/// Probabilities are in steps of 1/4096 (and at least one entry is kept).
pub fn with_probability(d: Delays, p: f64, seed: u64) -> Delays {
    let keep = ((p * ENTRIES as f64).round() as usize).clamp(1, ENTRIES);
    let mut order: Vec<usize> = (0..ENTRIES).collect();
    // Fisher-Yates over a stream of the draws' own generator, salted apart from theirs:
    // deterministic for a seed.
    let mut rng = crate::sys::rng::stream(seed, PROBABILITY_SALT, 0);
    for i in (1..ENTRIES).rev() {
        let j = (rand_core::Rng::next_u64(&mut rng) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut values = d.values;
    // Each table of IBJITTER_EPISODES keeps the same entries.
    for table in values.chunks_mut(ENTRIES) {
        for &i in &order[keep..] {
            table[i] = 0;
        }
    }
    Delays {
        source: format!(
            "{}, with probability {p} ({keep} of {ENTRIES} entries kept)",
            d.source
        ),
        values,
    }
}

/// The longest path a table may have (Linux's PATH_MAX): a longer value is no file.
const PATH_MAX_BYTES: usize = 4096;

/// The absolute table at `path`, given as `what` (`IBJITTER_TABLE`, …), negative entries
/// read as 0.
fn read_absolute(what: &str, path: &str) -> Result<Delays, String> {
    if path.len() > PATH_MAX_BYTES {
        return Err(format!(
            "{what}={}: too long for a path (at most {PATH_MAX_BYTES} bytes)",
            shown(path)
        ));
    }
    if !Path::new(path).is_absolute() {
        return Err(format!("{what}={}: give an absolute path", shown(path)));
    }
    let t = table::read(Path::new(path), Kind::Absolute)
        .map_err(|e| format!("{what}: {}", clipped(e.to_string(), path)))?;
    Ok(Delays {
        source: path.to_string(),
        values: t.entries.iter().map(|&e| e.max(0) as u64).collect(),
    })
}

/// `IBJITTER_CQ_TABLE=FILE` (an absolute table, absolute path) or `IBJITTER_CQ_DELAY=D` (a
/// constant): how long completions are held, in ns, each at most `limit_ns` (the send
/// table's bound: a completion held for an hour hangs an event-driven poller as long).
pub fn load_cq(var: Var<'_>, limit_ns: f64) -> Result<Option<Delays>, String> {
    let (k, cq) = match (var("IBJITTER_CQ_TABLE"), var("IBJITTER_CQ_DELAY")) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err("give IBJITTER_CQ_TABLE or IBJITTER_CQ_DELAY, not both".into())
        }
        (Some(path), None) => (
            "IBJITTER_CQ_TABLE",
            read_absolute("IBJITTER_CQ_TABLE", path.trim())?,
        ),
        (None, Some(d)) => {
            let ns =
                parse_duration_u64(&d, Unit::Ns).map_err(|e| format!("IBJITTER_CQ_DELAY={e}"))?;
            let d = Delays {
                source: format!("constant {ns} ns"),
                values: vec![ns; ENTRIES],
            };
            ("IBJITTER_CQ_DELAY", d)
        }
    };
    bounded(Some(cq), limit_ns, Unit::Ns).map_err(|e| format!("{k} ({e})"))
}

/// `IBJITTER_EPISODES=CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED`: two absolute tables
/// (absolute paths) and the mean dwell times (with units). Returns the calm table followed by
/// the congested one, and the means in ns.
pub fn load_episodes(v: &str, var: Var<'_>) -> Result<(Delays, (f64, f64)), String> {
    let v = v.trim();
    let form = || {
        format!(
            "IBJITTER_EPISODES={}: expected CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED \
             (absolute table paths, durations with units, e.g. /t/calm.dist:/t/cong.dist:50ms:10ms)",
            shown(v)
        )
    };
    if [
        "IBJITTER_TABLE",
        "IBJITTER_DIST",
        "IBJITTER_DELAY",
        "IBJITTER_JITTER",
    ]
    .iter()
    .any(|k| var(k).is_some())
    {
        return Err(
            "IBJITTER_EPISODES brings its own two tables: do not combine it with \
                    IBJITTER_TABLE/DIST/DELAY/JITTER"
                .into(),
        );
    }
    let mut parts = v.rsplitn(3, ':');
    let (Some(congested_mean), Some(calm_mean), Some(paths)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(form());
    };
    let Some((calm, congested)) = paths.split_once(':') else {
        return Err(form());
    };
    let mean = |t: &str, which: &str| match parse_duration(t, Unit::Ns) {
        Ok(ns) if ns > 0.0 => Ok(ns),
        _ => Err(format!(
            "IBJITTER_EPISODES: mean {which} dwell {}: expected a positive duration with a unit",
            quoted(t)
        )),
    };
    let dwell = (mean(calm_mean, "calm")?, mean(congested_mean, "congested")?);
    let mut values = Vec::with_capacity(2 * ENTRIES);
    let mut means = Vec::new();
    for (path, which) in [(calm, "calm"), (congested, "congested")] {
        let t = read_absolute(&format!("IBJITTER_EPISODES ({which} table)"), path.trim())?;
        let before = values.len();
        values.extend(t.values);
        let n = (values.len() - before) as f64;
        means.push(values[before..].iter().map(|&x| x as f64).sum::<f64>() / n);
    }
    let source = format!(
        "episodes: calm {calm} (mean {:.0} ns) for {calm_mean} on average, congested {congested} \
         (mean {:.0} ns) for {congested_mean} on average",
        means[0], means[1]
    );
    Ok((Delays { source, values }, dwell))
}

/// The longest delay accepted without IBJITTER_MAX_DELAY: 10 s (in loops mode 10^10 loops,
/// seconds on any machine). A longer one is a typo far more often than an experiment, and
/// a post that waits for hours looks like a hung program.
pub fn default_max_delay(unit: Unit) -> f64 {
    match unit {
        Unit::Ns => 10e9,
        Unit::Loops => 1e10,
    }
}

/// `delays`, unless one of them exceeds `limit` (then the configuration is refused).
pub fn bounded(delays: Option<Delays>, limit: f64, unit: Unit) -> Result<Option<Delays>, String> {
    match delays {
        Some(d) if d.max() as f64 > limit => Err(format!(
            "{}: its largest delay, {} {u}, exceeds IBJITTER_MAX_DELAY ({limit} {u}; set it higher to allow that)",
            d.source,
            d.max(),
            u = unit.name()
        )),
        d => Ok(d),
    }
}

/// The table the environment selects, None if it selects none.
pub fn load_delays(var: Var<'_>, unit: Unit) -> Result<Option<Delays>, String> {
    let table = var("IBJITTER_TABLE");
    let dist = var("IBJITTER_DIST");
    let delay = var("IBJITTER_DELAY");
    let jitter = var("IBJITTER_JITTER");
    if let Some(path) = table {
        if dist.is_some() || delay.is_some() || jitter.is_some() {
            return Err(
                "IBJITTER_TABLE is an absolute table: do not combine it with IBJITTER_DIST/DELAY/JITTER"
                    .into(),
            );
        }
        return read_absolute("IBJITTER_TABLE", path.trim()).map(Some);
    }
    let mu = delay
        .as_deref()
        .map(|d| parse_duration(d, unit).map_err(|e| format!("IBJITTER_DELAY={e}")))
        .transpose()?;
    let sigma = jitter
        .as_deref()
        .map(|d| parse_duration(d, unit).map_err(|e| format!("IBJITTER_JITTER={e}")))
        .transpose()?;
    let u = unit.name();
    match (dist, mu, sigma) {
        (None, None, None) => Ok(None),
        (None, None, Some(_)) => Err("IBJITTER_JITTER needs IBJITTER_DELAY".into()),
        (Some(d), None, _) => Err(format!(
            "IBJITTER_DIST={} needs IBJITTER_DELAY (and IBJITTER_JITTER)",
            shown(&d)
        )),
        (None, Some(mu), None) => Ok(Some(Delays {
            source: format!("constant {mu} {u}"),
            values: vec![mu.round() as u64; ENTRIES],
        })),
        (None, Some(mu), Some(sigma)) => {
            // netem without a distribution: uniform over [mu - sigma, mu + sigma].
            let values = (0..ENTRIES)
                .map(|i| {
                    let x = mu - sigma + 2.0 * sigma * (i as f64 + 0.5) / ENTRIES as f64;
                    x.max(0.0).round() as u64
                })
                .collect();
            Ok(Some(Delays {
                source: format!("uniform {mu}±{sigma} {u}"),
                values,
            }))
        }
        (Some(d), Some(mu), sigma) => {
            let sigma = sigma.unwrap_or(0.0);
            let d = d.trim();
            if d.len() > PATH_MAX_BYTES {
                return Err(format!(
                    "IBJITTER_DIST={}: too long for a name or path (at most {PATH_MAX_BYTES} bytes)",
                    shown(d)
                ));
            }
            let path: PathBuf = if d.contains('/') {
                PathBuf::from(d)
            } else {
                let dirs = dist_dirs(
                    own_path().as_deref(),
                    var("IBJITTER_DISTRIBUTIONS").as_deref(),
                );
                find_named(d, &dirs).map_err(|e| format!("IBJITTER_DIST={}: {e}", shown(d)))?
            };
            let t = table::read(&path, Kind::Netem)
                .map_err(|e| format!("IBJITTER_DIST: {}", clipped(e.to_string(), d)))?;
            Ok(Some(Delays {
                source: format!("{} mu={mu} sigma={sigma} {u}", path.display()),
                values: t.netem_delays_ns(mu, sigma),
            }))
        }
    }
}

//! Configuration from the environment, read once at load. Any problem becomes one warning
//! line and pass-through: the host program must never be harmed by a typo.
use crate::config::select::Selection;
use ibjitter_table::{self as table, Kind, ENTRIES};
use std::path::{Path, PathBuf};

pub use crate::sys::rng::DEFAULT_SEED;

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

/// What one draw delays (`IBJITTER_PER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// One delay per `ibv_post_send` call and per `ibv_wr_*` batch, however many work
    /// requests it carries: the research's semantics (the default).
    Post,
    /// One delay per work request: each WR of a chain or batch waits its own draw, closer to
    /// a per-packet network delay.
    Wr,
}

impl Per {
    pub fn name(self) -> &'static str {
        match self {
            Per::Post => "post",
            Per::Wr => "wr",
        }
    }
}

/// Where a message is delayed (`IBJITTER_LAYER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// Each `ibv_post_send` call or `ibv_wr_*` batch.
    Verbs,
    /// Each message a program hands to UCX's UCP API (`ucp_tag_send_nbx`, `ucp_put_nbx`, …),
    /// whatever transport UCX then picks.
    Ucp,
    /// UCP for UCX's messages (the verbs contexts UCX opens stay unpatched), verbs for every
    /// other context of the process: no message is delayed at both.
    Auto,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::Verbs => "verbs",
            Layer::Ucp => "ucp",
            Layer::Auto => "auto",
        }
    }
}

/// How the clock spins wait (`IBJITTER_SPIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Pause between clock reads where that is measured harmless (bare metal, cheap pause).
    Auto,
    /// Never pause.
    Plain,
    /// Always pause.
    Pause,
}

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

/// Everything the environment asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// None: no injection (not configured, or configuration refused).
    pub delays: Option<Delays>,
    pub unit: Unit,
    pub per: Per,
    pub layer: Layer,
    pub spin: Spin,
    pub seed: u64,
    /// Where the seed came from ("default", "IBJITTER_SEED", a file).
    pub seed_source: String,
    /// Stats file pattern (`%p` is replaced by the pid at exit).
    pub stats: Option<String>,
    pub quiet: bool,
    /// At most one line: why injection is off, when it is not simply unconfigured.
    pub warning: Option<String>,
    /// Why this process injects nothing although a table is configured, when that was asked
    /// for (`IBJITTER_RANKS` leaves its rank out): said instead of the table.
    pub not_this_process: Option<String>,
    /// `IBJITTER_START`/`IBJITTER_STOP`: inject only from `start` to `stop` ns after load.
    pub window: Option<Window>,
    /// `IBJITTER_OPS`, `IBJITTER_QPN`, `IBJITTER_DEST`: which sends are delayed.
    pub select: Selection,
    /// `IBJITTER_EPISODES`, `IBJITTER_CORRELATION`, `IBJITTER_TRACE`: how draws follow each
    /// other.
    pub shape: Shape,
    /// Live control (`ibjitter inject`): on unless `IBJITTER_CONTROL=0`.
    pub control: bool,
    /// `IBJITTER_MODE=line`: delays overlap in a delay line instead of blocking the poster.
    pub line: bool,
    /// `IBJITTER_CQ_TABLE`/`IBJITTER_CQ_DELAY`: completions are held this long (ns).
    pub cq: Option<Delays>,
}

/// How draws follow each other (all off by default: i.i.d. draws from one table).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shape {
    /// `IBJITTER_EPISODES`: mean dwell times (ns) of the calm and the congested state; the
    /// delays then hold the calm table followed by the congested one.
    pub episodes: Option<(f64, f64)>,
    /// `IBJITTER_CORRELATION`: the probability that a thread's draw repeats its last index.
    pub correlation: Option<f64>,
    /// `IBJITTER_TRACE`: file pattern (`%p`) for the draws, and how many are kept.
    pub trace: Option<(String, usize)>,
}

/// When to inject, in ns after the shim was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ns: u64,
    /// None: to the end.
    pub stop_ns: Option<u64>,
}

/// Set in each rank by MPI launchers and Slurm: the process's rank (the first one set).
pub const LAUNCHER_RANK_VARS: [&str; 5] = [
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "MV2_COMM_WORLD_RANK",
];

impl Settings {
    /// Pass-through, default seed, no stats.
    pub fn passthrough() -> Settings {
        Settings {
            delays: None,
            unit: Unit::Ns,
            per: Per::Post,
            layer: Layer::Auto,
            spin: Spin::Auto,
            seed: DEFAULT_SEED,
            seed_source: "default".into(),
            stats: None,
            quiet: false,
            warning: None,
            not_this_process: None,
            window: None,
            select: Selection::default(),
            shape: Shape::default(),
            control: true,
            line: false,
            cq: None,
        }
    }

    /// Reads the `IBJITTER_*` variables through `var` (the process environment in the shim).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Settings {
        let mut s = Settings::passthrough();
        let nonempty = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        s.quiet = nonempty("IBJITTER_QUIET").is_some_and(|v| v.trim() != "0");
        s.stats = nonempty("IBJITTER_STATS");
        s.control = nonempty("IBJITTER_CONTROL").is_none_or(|v| v.trim() != "0");
        let mut problems: Vec<String> = Vec::new();
        match nonempty("IBJITTER_UNIT").as_deref().map(str::trim) {
            None | Some("ns") => {}
            Some("loops") => s.unit = Unit::Loops,
            Some(other) => problems.push(format!(
                "IBJITTER_UNIT={other}: expected \"ns\" or \"loops\""
            )),
        }
        match nonempty("IBJITTER_PER").as_deref().map(str::trim) {
            None | Some("post") => {}
            Some("wr") => s.per = Per::Wr,
            Some(other) => problems.push(format!(
                "IBJITTER_PER={other}: expected \"post\" (one delay per call or batch) or \"wr\" (one per work request)"
            )),
        }
        match nonempty("IBJITTER_LAYER").as_deref().map(str::trim) {
            None | Some("auto") => {}
            Some("verbs") => s.layer = Layer::Verbs,
            Some("ucp") => s.layer = Layer::Ucp,
            Some(other) => problems.push(format!(
                "IBJITTER_LAYER={other}: expected \"auto\" (UCP for UCX's messages, verbs for the rest), \"verbs\" or \"ucp\""
            )),
        }
        match nonempty("IBJITTER_MODE").as_deref().map(str::trim) {
            None | Some("spin") => {}
            Some("line") if s.unit == Unit::Loops => problems.push(
                "IBJITTER_MODE=line keeps time: it needs delays in ns, not IBJITTER_UNIT=loops"
                    .into(),
            ),
            Some("line") => s.line = true,
            Some(other) => problems.push(format!(
                "IBJITTER_MODE={other}: expected \"spin\" (the posting thread waits) or \"line\" (a delay line: posts return at once)"
            )),
        }
        match nonempty("IBJITTER_SPIN").as_deref().map(str::trim) {
            None | Some("auto") => {}
            Some("plain") => s.spin = Spin::Plain,
            Some("pause") => s.spin = Spin::Pause,
            Some(other) => problems.push(format!(
                "IBJITTER_SPIN={other}: expected \"auto\", \"plain\" or \"pause\""
            )),
        }
        match nonempty("IBJITTER_SEED") {
            None => {}
            Some(v) => match parse_seed(&v) {
                Ok((seed, source)) => {
                    s.seed = seed;
                    s.seed_source = source;
                }
                Err(e) => problems.push(e),
            },
        }
        // A launcher gives every rank the same environment, so the same seed: with
        // IBJITTER_SEED_PER_RANK=1 each rank draws its own sequence (seed + rank), repeatably.
        match nonempty("IBJITTER_SEED_PER_RANK").as_deref().map(str::trim) {
            None | Some("0") => {}
            Some("1") => {
                let rank = LAUNCHER_RANK_VARS
                    .iter()
                    .find_map(|k| var(k).map(|r| (*k, r)));
                if let Some((k, r)) = rank {
                    match r.trim().parse::<u64>() {
                        Ok(n) => {
                            s.seed = s.seed.wrapping_add(n);
                            s.seed_source = format!("{} + rank {n} ({k})", s.seed_source);
                        }
                        Err(_) => problems.push(format!(
                            "IBJITTER_SEED_PER_RANK=1 but {k}={r:?} is not a rank number"
                        )),
                    }
                }
            }
            Some(other) => {
                problems.push(format!("IBJITTER_SEED_PER_RANK={other}: expected 0 or 1"))
            }
        }
        let limit = match nonempty("IBJITTER_MAX_DELAY") {
            Some(v) => parse_duration(&v, s.unit)
                .map_err(|e| problems.push(format!("IBJITTER_MAX_DELAY={e}")))
                .unwrap_or(f64::INFINITY),
            None => default_max_delay(s.unit),
        };
        let loaded = match nonempty("IBJITTER_EPISODES") {
            Some(v) => load_episodes(&v, &nonempty).map(|(d, dwell)| {
                s.shape.episodes = Some(dwell);
                Some(d)
            }),
            None => load_delays(&nonempty, s.unit),
        };
        let delays = match loaded.and_then(|d| bounded(d, limit, s.unit)) {
            Ok(d) => d,
            Err(e) => {
                problems.push(e);
                None
            }
        };
        let delays = match nonempty("IBJITTER_PROB") {
            Some(v) => match (parse_probability(&v), delays) {
                (Ok(p), Some(d)) => Some(with_probability(d, p, s.seed)),
                (Ok(_), None) => {
                    problems.push(
                        "IBJITTER_PROB needs a table (IBJITTER_TABLE, _DIST or _DELAY)".into(),
                    );
                    None
                }
                (Err(e), _) => {
                    problems.push(e);
                    None
                }
            },
            None => delays,
        };
        let mut at = |k: &str| -> Option<u64> {
            let v = nonempty(k)?;
            match parse_duration(&v, Unit::Ns) {
                Ok(ns) => Some(ns.round() as u64),
                Err(e) => {
                    problems.push(format!("{k}={e}"));
                    None
                }
            }
        };
        let (start, stop) = (at("IBJITTER_START"), at("IBJITTER_STOP"));
        if start.is_some() || stop.is_some() {
            let w = Window {
                start_ns: start.unwrap_or(0),
                stop_ns: stop,
            };
            if w.stop_ns.is_some_and(|stop| stop <= w.start_ns) {
                problems.push(format!(
                    "IBJITTER_STOP must come after IBJITTER_START ({} ns <= {} ns)",
                    w.stop_ns.unwrap_or(0),
                    w.start_ns
                ));
            }
            s.window = Some(w);
        }
        match load_cq(&nonempty) {
            Ok(cq) => s.cq = cq,
            Err(e) => problems.push(e),
        }
        if let Some(v) = nonempty("IBJITTER_CORRELATION") {
            match parse_correlation(&v) {
                Ok(_) if delays.is_none() => problems.push(
                    "IBJITTER_CORRELATION needs a table (IBJITTER_TABLE, _DIST, _DELAY or _EPISODES)"
                        .into(),
                ),
                Ok(rho) => s.shape.correlation = Some(rho),
                Err(e) => problems.push(e),
            }
        }
        if let Some(path) = nonempty("IBJITTER_TRACE") {
            let max = match nonempty("IBJITTER_TRACE_MAX") {
                None => Some(DEFAULT_TRACE_MAX),
                Some(v) => match parse_u64(v.trim()) {
                    Some(n) if (1..=MAX_TRACE_MAX).contains(&n) => Some(n as usize),
                    _ => {
                        problems.push(format!(
                            "IBJITTER_TRACE_MAX={}: expected a number of draws, 1..={MAX_TRACE_MAX}",
                            v.trim()
                        ));
                        None
                    }
                },
            };
            if delays.is_none() {
                problems.push("IBJITTER_TRACE records draws: it needs a table".into());
            } else if let Some(max) = max {
                s.shape.trace = Some((path.trim().to_string(), max));
            }
        }
        match Selection::parse(
            nonempty("IBJITTER_OPS").as_deref(),
            nonempty("IBJITTER_QPN").as_deref(),
            nonempty("IBJITTER_DEST").as_deref(),
        ) {
            Ok(sel) if sel.any() && delays.is_none() => problems.push(
                "IBJITTER_OPS, _QPN and _DEST select among delayed sends: they need a table \
                 (IBJITTER_TABLE, _DIST or _DELAY)"
                    .into(),
            ),
            Ok(sel) => s.select = sel,
            Err(e) => problems.push(e),
        }
        if let Some(v) = nonempty("IBJITTER_RANKS") {
            match parse_ranks(&v) {
                Ok(ranks) => {
                    let rank = LAUNCHER_RANK_VARS
                        .iter()
                        .find_map(|k| var(k).map(|r| (*k, r)));
                    match rank {
                        Some((_, r)) if r.trim().parse::<u32>().is_ok_and(|r| ranks.contains(&r)) => {}
                        Some((k, r)) => {
                            s.not_this_process = Some(format!(
                                "rank {} ({k}) is not in IBJITTER_RANKS={}: nothing is delayed in this process",
                                r.trim(),
                                v.trim()
                            ))
                        }
                        None => problems.push(format!(
                            "IBJITTER_RANKS={} but no rank variable ({}) is set: is this an MPI or Slurm rank?",
                            v.trim(),
                            LAUNCHER_RANK_VARS.join(", ")
                        )),
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        if problems.is_empty() {
            s.delays = if s.not_this_process.is_some() {
                None
            } else {
                delays
            };
        } else {
            s.warning = Some(format!(
                "{}; injection disabled (pass-through)",
                problems.join("; ")
            ));
        }
        s
    }
}

/// The salt of the stream that chooses `IBJITTER_PROB`'s entries (the draws' streams use 0
/// and fork numbers).
const PROBABILITY_SALT: u64 = 0x7072_6f62; // "prob"

/// `IBJITTER_PROB=p`, 0 < p <= 1.
fn parse_probability(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "IBJITTER_PROB={}: expected a probability in (0, 1], e.g. 0.1",
            v.trim()
        )),
    }
}

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

/// `IBJITTER_CQ_TABLE=FILE` (an absolute table, absolute path) or `IBJITTER_CQ_DELAY=D` (a
/// constant): how long completions are held.
fn load_cq(var: &impl Fn(&str) -> Option<String>) -> Result<Option<Delays>, String> {
    match (var("IBJITTER_CQ_TABLE"), var("IBJITTER_CQ_DELAY")) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err("give IBJITTER_CQ_TABLE or IBJITTER_CQ_DELAY, not both".into()),
        (Some(path), None) => {
            let path = path.trim();
            if !Path::new(path).is_absolute() {
                return Err(format!("IBJITTER_CQ_TABLE={path}: give an absolute path"));
            }
            let t = table::read(Path::new(path), Kind::Absolute)
                .map_err(|e| format!("IBJITTER_CQ_TABLE: {e}"))?;
            Ok(Some(Delays {
                source: path.to_string(),
                values: t.entries.iter().map(|&e| e.max(0) as u64).collect(),
            }))
        }
        (None, Some(d)) => {
            let ns = parse_duration(&d, Unit::Ns).map_err(|e| format!("IBJITTER_CQ_DELAY={e}"))?;
            Ok(Some(Delays {
                source: format!("constant {} ns", ns.round()),
                values: vec![ns.round() as u64; ENTRIES],
            }))
        }
    }
}

/// Draws `IBJITTER_TRACE` keeps by default (4 bytes each), and at most.
pub const DEFAULT_TRACE_MAX: usize = 1_000_000;
const MAX_TRACE_MAX: u64 = 1 << 28;

/// `IBJITTER_CORRELATION=rho`: 0 <= rho < 1, or a percentage as netem writes it (`25%`).
fn parse_correlation(v: &str) -> Result<f64, String> {
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

/// `IBJITTER_EPISODES=CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED`: two absolute tables
/// (absolute paths) and the mean dwell times (with units). Returns the calm table followed by
/// the congested one, and the means in ns.
fn load_episodes(
    v: &str,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(Delays, (f64, f64)), String> {
    let v = v.trim();
    let form = || {
        format!(
            "IBJITTER_EPISODES={v}: expected CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED \
             (absolute table paths, durations with units, e.g. /t/calm.dist:/t/cong.dist:50ms:10ms)"
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
    let mean = |t: &str, which: &str| {
        match parse_duration(t, Unit::Ns) {
        Ok(ns) if ns > 0.0 => Ok(ns),
        _ => Err(format!(
            "IBJITTER_EPISODES: mean {which} dwell \"{t}\": expected a positive duration with a unit"
        )),
    }
    };
    let dwell = (mean(calm_mean, "calm")?, mean(congested_mean, "congested")?);
    let mut values = Vec::with_capacity(2 * ENTRIES);
    let mut means = Vec::new();
    for (path, which) in [(calm, "calm"), (congested, "congested")] {
        let path = path.trim();
        if !Path::new(path).is_absolute() {
            return Err(format!(
                "IBJITTER_EPISODES: {which} table {path}: give an absolute path"
            ));
        }
        let t = table::read(Path::new(path), Kind::Absolute)
            .map_err(|e| format!("IBJITTER_EPISODES ({which}): {e}"))?;
        let before = values.len();
        values.extend(t.entries.iter().map(|&e| e.max(0) as u64));
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

/// `IBJITTER_RANKS=0,3-5`: ranks and inclusive ranges.
fn parse_ranks(v: &str) -> Result<Vec<u32>, String> {
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
const MAX_SEED_BYTES: u64 = 4096;

/// `IBJITTER_SEED=N` (decimal or 0x hex) or `IBJITTER_SEED=FILE` holding one integer.
fn parse_seed(v: &str) -> Result<(u64, String), String> {
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

fn parse_u64(t: &str) -> Option<u64> {
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

/// The longest delay accepted without IBJITTER_MAX_DELAY: 10 s (in loops mode 10^10 loops,
/// seconds on any machine). A longer one is a typo far more often than an experiment, and
/// a post that waits for hours looks like a hung program.
fn default_max_delay(unit: Unit) -> f64 {
    match unit {
        Unit::Ns => 10e9,
        Unit::Loops => 1e10,
    }
}

/// `delays`, unless one of them exceeds `limit` (then the configuration is refused).
fn bounded(delays: Option<Delays>, limit: f64, unit: Unit) -> Result<Option<Delays>, String> {
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

type Var<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The table the environment selects, None if it selects none.
fn load_delays(var: Var<'_>, unit: Unit) -> Result<Option<Delays>, String> {
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
        let path = path.trim();
        if !Path::new(path).is_absolute() {
            return Err(format!("IBJITTER_TABLE={path}: give an absolute path"));
        }
        let t = table::read(Path::new(path), Kind::Absolute)
            .map_err(|e| format!("IBJITTER_TABLE: {e}"))?;
        return Ok(Some(Delays {
            source: path.to_string(),
            values: t.entries.iter().map(|&e| e.max(0) as u64).collect(),
        }));
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
            "IBJITTER_DIST={d} needs IBJITTER_DELAY (and IBJITTER_JITTER)"
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
            let path: PathBuf = if d.contains('/') {
                PathBuf::from(d)
            } else {
                table::resolve_named_dist(d).ok_or_else(|| {
                    format!("IBJITTER_DIST={d}: no such named distribution (looked for {d}.dist in the project's distributions/ and iproute2's directory)")
                })?
            };
            let t = table::read(&path, Kind::Netem).map_err(|e| format!("IBJITTER_DIST: {e}"))?;
            Ok(Some(Delays {
                source: format!("{} mu={mu} sigma={sigma} {u}", path.display()),
                values: t.netem_delays_ns(mu, sigma),
            }))
        }
    }
}

#[cfg(test)]
mod tests {

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| v.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn probability_keeps_that_share_of_the_table_and_the_seed_chooses_which() {
        let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_PROB", "0.1")]));
        let d = s.delays.expect("a table");
        let kept = d.values.iter().filter(|&&v| v > 0).count();
        assert_eq!(kept, 410, "round(0.1 x 4096)");
        assert!(d.values.iter().all(|&v| v == 0 || v == 1_000_000));
        assert!(
            d.source
                .ends_with("with probability 0.1 (410 of 4096 entries kept)"),
            "{}",
            d.source
        );
        let again =
            Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_PROB", "0.1")]));
        assert_eq!(
            again.delays.unwrap().values,
            d.values,
            "same seed, same entries"
        );
        let other = Settings::from_vars(env(&[
            ("IBJITTER_DELAY", "1ms"),
            ("IBJITTER_PROB", "0.1"),
            ("IBJITTER_SEED", "7"),
        ]));
        assert_ne!(other.delays.unwrap().values, d.values);
        for bad in ["0", "1.5", "often"] {
            let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_PROB", bad)]));
            assert!(s.delays.is_none());
            assert!(s.warning.unwrap().contains("IBJITTER_PROB"), "{bad}");
        }
    }

    #[test]
    fn episodes_and_correlation_parse_or_say_what_was_expected() {
        let dir = std::env::temp_dir().join(format!("ibjitter-episodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (calm, cong) = (dir.join("calm.dist"), dir.join("cong.dist"));
        let table = |v: u64| {
            (0..512)
                .map(|_| vec![v.to_string(); 8].join(" "))
                .collect::<Vec<_>>()
                .join("\n")
        };
        std::fs::write(&calm, table(1000)).unwrap();
        std::fs::write(&cong, table(9000)).unwrap();
        let spec = format!("{}:{}:50ms:10ms", calm.display(), cong.display());
        let s = Settings::from_vars(env(&[
            ("IBJITTER_EPISODES", &spec),
            ("IBJITTER_CORRELATION", "25%"),
        ]));
        assert_eq!(s.warning, None);
        assert_eq!(s.shape.episodes, Some((50e6, 10e6)));
        assert_eq!(s.shape.correlation, Some(0.25));
        let d = s.delays.unwrap();
        assert_eq!(d.values.len(), 2 * ENTRIES);
        assert_eq!((d.values[0], d.values[ENTRIES]), (1000, 9000));
        for (k, v, says) in [
            (
                "IBJITTER_EPISODES",
                format!("{}:50ms:10ms", calm.display()),
                "expected CALM.dist",
            ),
            (
                "IBJITTER_EPISODES",
                "calm.dist:cong.dist:50ms:10ms".into(),
                "absolute path",
            ),
            (
                "IBJITTER_EPISODES",
                format!("{}:{}:50:10ms", calm.display(), cong.display()),
                "mean calm dwell",
            ),
            (
                "IBJITTER_CORRELATION",
                "1.5".into(),
                "expected a correlation in [0, 1)",
            ),
        ] {
            let mut vars = vec![(k, v.as_str())];
            if k == "IBJITTER_CORRELATION" {
                vars.push(("IBJITTER_DELAY", "1us"));
            }
            let w = Settings::from_vars(env(&vars)).warning.unwrap_or_default();
            assert!(w.contains(says), "{k}={v}: {w}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_time_window_needs_its_stop_after_its_start() {
        let s = Settings::from_vars(env(&[
            ("IBJITTER_DELAY", "1ms"),
            ("IBJITTER_START", "10s"),
            ("IBJITTER_STOP", "20s"),
        ]));
        assert_eq!(
            s.window,
            Some(Window {
                start_ns: 10_000_000_000,
                stop_ns: Some(20_000_000_000)
            })
        );
        assert!(s.delays.is_some());
        let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_STOP", "2s")]));
        assert_eq!(s.window.unwrap().start_ns, 0);
        for (start, stop) in [("5s", "5s"), ("5s", "1s")] {
            let s = Settings::from_vars(env(&[
                ("IBJITTER_DELAY", "1ms"),
                ("IBJITTER_START", start),
                ("IBJITTER_STOP", stop),
            ]));
            assert!(s.delays.is_none());
            assert!(s.warning.unwrap().contains("IBJITTER_STOP must come after"));
        }
        let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_START", "10")]));
        assert!(s.warning.unwrap().contains("IBJITTER_START="));
    }

    #[test]
    fn ranks_select_the_processes_that_inject() {
        let with = |rank_var: &str, rank: &str| {
            Settings::from_vars(env(&[
                ("IBJITTER_DELAY", "1ms"),
                ("IBJITTER_RANKS", "0,3-5"),
                (rank_var, rank),
            ]))
        };
        for (k, r) in [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("PMI_RANK", "4"),
            ("SLURM_PROCID", "5"),
        ] {
            let s = with(k, r);
            assert!(
                s.delays.is_some() && s.not_this_process.is_none(),
                "{k}={r}"
            );
        }
        let s = with("PMIX_RANK", "2");
        assert!(s.delays.is_none() && s.warning.is_none());
        assert_eq!(
            s.not_this_process.as_deref(),
            Some("rank 2 (PMIX_RANK) is not in IBJITTER_RANKS=0,3-5: nothing is delayed in this process")
        );
        let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_RANKS", "0")]));
        assert!(s.delays.is_none());
        assert!(s.warning.unwrap().contains("no rank variable"));
        let s = Settings::from_vars(env(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_RANKS", "3-1")]));
        assert!(s.warning.unwrap().contains("expected ranks and ranges"));
    }

    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn delays_above_the_maximum_are_refused() {
        let dir = std::env::temp_dir().join(format!("ibjitter-maxdelay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let huge = dir.join("huge.tbl");
        let line = format!("{}\n", ["9000000000000000000"; 8].join(" "));
        std::fs::write(&huge, line.repeat(512)).unwrap();
        for env in [
            vec![("IBJITTER_TABLE", huge.to_str().unwrap())],
            vec![("IBJITTER_DELAY", "1000000000000s")],
            vec![("IBJITTER_DELAY", "11s")],
            vec![("IBJITTER_DELAY", "9s"), ("IBJITTER_JITTER", "2s")],
            vec![("IBJITTER_DELAY", "2ms"), ("IBJITTER_MAX_DELAY", "1ms")],
        ] {
            let s = settings(&env);
            assert!(s.delays.is_none(), "{env:?}");
            let w = s.warning.unwrap_or_default();
            assert!(w.contains("exceeds IBJITTER_MAX_DELAY"), "{env:?}: {w}");
        }
        let ok = settings(&[("IBJITTER_DELAY", "20s"), ("IBJITTER_MAX_DELAY", "30s")]);
        assert_eq!(ok.delays.map(|d| d.max()), Some(20_000_000_000));
        let bad = settings(&[("IBJITTER_DELAY", "1ms"), ("IBJITTER_MAX_DELAY", "soon")]);
        assert!(bad.delays.is_none() && bad.warning.unwrap().contains("IBJITTER_MAX_DELAY"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_set_is_passthrough_without_warning() {
        let s = settings(&[]);
        assert_eq!(s, Settings::passthrough());
    }

    #[test]
    fn constant_delay_and_seed() {
        let s = settings(&[("IBJITTER_DELAY", "10us"), ("IBJITTER_SEED", "0x10")]);
        assert_eq!(s.warning, None);
        let d = s.delays.unwrap();
        assert!(d.values.iter().all(|&v| v == 10_000));
        assert_eq!(s.seed, 16);
    }

    #[test]
    fn a_seed_per_rank_adds_the_launchers_rank() {
        let base = [("IBJITTER_DELAY", "10us"), ("IBJITTER_SEED", "100")];
        let with = |extra: &[(&str, &str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            settings(&v)
        };
        assert_eq!(with(&[("PMI_RANK", "3")]).seed, 100, "off by default");
        let s = with(&[("IBJITTER_SEED_PER_RANK", "1"), ("PMI_RANK", "3")]);
        assert_eq!((s.seed, s.warning), (103, None));
        assert_eq!(s.seed_source, "IBJITTER_SEED + rank 3 (PMI_RANK)");
        // One process, no launcher: the seed as given.
        assert_eq!(with(&[("IBJITTER_SEED_PER_RANK", "1")]).seed, 100);
        let bad = with(&[("IBJITTER_SEED_PER_RANK", "yes")]);
        assert!(bad.warning.unwrap().contains("expected 0 or 1"));
    }

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

    #[test]
    fn per_post_is_the_default_and_wr_is_chosen_by_name() {
        assert_eq!(settings(&[("IBJITTER_DELAY", "1us")]).per, Per::Post);
        assert_eq!(settings(&[("IBJITTER_DELAY", "1us")]).layer, Layer::Auto);
        for (v, layer) in [
            ("verbs", Layer::Verbs),
            (" ucp ", Layer::Ucp),
            ("auto", Layer::Auto),
        ] {
            assert_eq!(
                settings(&[("IBJITTER_DELAY", "1us"), ("IBJITTER_LAYER", v)]).layer,
                layer
            );
        }
        let s = settings(&[("IBJITTER_DELAY", "1us"), ("IBJITTER_LAYER", "nccl")]);
        assert!(
            s.delays.is_none()
                && s.warning
                    .as_deref()
                    .unwrap()
                    .contains("IBJITTER_LAYER=nccl")
        );
        let s = settings(&[("IBJITTER_DELAY", "1us"), ("IBJITTER_PER", " wr ")]);
        assert_eq!((s.per, s.delays.is_some()), (Per::Wr, true));
        let s = settings(&[("IBJITTER_DELAY", "1us"), ("IBJITTER_PER", "post")]);
        assert_eq!(s.per, Per::Post);
    }

    #[test]
    fn bad_inputs_give_one_warning_and_no_table() {
        for pairs in [
            &[("IBJITTER_TABLE", "/nonexistent/table")][..],
            &[("IBJITTER_TABLE", "relative.tbl")][..],
            &[
                ("IBJITTER_DELAY", "10us"),
                ("IBJITTER_SEED", "/nonexistent/seed"),
            ][..],
            &[("IBJITTER_DELAY", "10")][..],
            &[("IBJITTER_DIST", "nosuchdist"), ("IBJITTER_DELAY", "10us")][..],
            &[("IBJITTER_DELAY", "10us"), ("IBJITTER_UNIT", "parsecs")][..],
            &[("IBJITTER_DELAY", "10us"), ("IBJITTER_PER", "packet")][..],
            &[("IBJITTER_DELAY", "10us"), ("IBJITTER_SPIN", "yield")][..],
            &[("IBJITTER_JITTER", "10us")][..],
        ] {
            let s = settings(pairs);
            assert!(s.delays.is_none(), "{pairs:?}");
            let w = s.warning.expect("a warning");
            assert!(!w.contains('\n'), "one line: {w}");
            assert!(w.ends_with("injection disabled (pass-through)"), "{w}");
        }
    }

    #[test]
    fn garbage_table_and_seed_files() {
        let dir = std::env::temp_dir().join(format!("ibjitter-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = dir.join("garbage.tbl");
        std::fs::write(&t, "1 2 three\n").unwrap();
        let s = settings(&[("IBJITTER_TABLE", t.to_str().unwrap())]);
        assert!(s.warning.unwrap().contains("garbage.tbl:1:"));
        let seed = dir.join("seed");
        std::fs::write(&seed, "hello\n").unwrap();
        let s = settings(&[
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_SEED", seed.to_str().unwrap()),
        ]);
        assert!(s.warning.unwrap().contains("one integer"));
        std::fs::write(&seed, " 1234\n").unwrap();
        let s = settings(&[
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_SEED", seed.to_str().unwrap()),
        ]);
        assert_eq!((s.seed, s.warning), (1234, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn named_dist_scales_netem_entries() {
        let s = settings(&[
            ("IBJITTER_DIST", "normal"),
            ("IBJITTER_DELAY", "100us"),
            ("IBJITTER_JITTER", "10us"),
        ]);
        if let Some(w) = &s.warning {
            panic!("{w}");
        }
        let d = s.delays.unwrap();
        assert_eq!(d.values.len(), ENTRIES);
        assert!((d.mean() - 100_000.0).abs() < 1_000.0, "mean {}", d.mean());
    }

    #[test]
    fn dist_given_as_a_path() {
        let path = table::resolve_named_dist("pareto").expect("pareto.dist installed");
        let s = settings(&[
            ("IBJITTER_DIST", path.to_str().unwrap()),
            ("IBJITTER_DELAY", "50us"),
            ("IBJITTER_JITTER", "5us"),
        ]);
        assert_eq!(s.warning, None);
        let d = s.delays.unwrap();
        assert!(d.source.contains("pareto.dist"), "{}", d.source);
        assert!((d.mean() - 50_000.0).abs() < 2_000.0, "mean {}", d.mean());
    }

    #[test]
    fn uniform_jitter_without_dist() {
        let s = settings(&[("IBJITTER_DELAY", "10us"), ("IBJITTER_JITTER", "20us")]);
        let d = s.delays.unwrap();
        assert_eq!(*d.values.iter().min().unwrap(), 0);
        assert!(d.max() < 30_000 && d.max() > 29_900);
    }
}

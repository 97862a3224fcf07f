//! The settings: what the `IBJITTER_*` environment asks for, read once at load (and for a
//! live `set`). Any problem becomes one warning line and pass-through: the host program must
//! never be harmed by a typo. The grammar of single values is in [`crate::config::values`],
//! the tables in [`crate::config::tables`].
use crate::config::select::Selection;
use crate::config::tables::{
    bounded, default_max_delay, load_cq, load_delays, load_episodes, with_probability, Delays, Var,
};
use crate::config::values::{
    parse_bool, parse_correlation, parse_duration, parse_duration_u64, parse_probability,
    parse_ranks, parse_seed, parse_u64, quoted, shown, Unit, DELAY_CEILING,
};

pub use crate::sys::rng::DEFAULT_SEED;

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
    /// The seed before `IBJITTER_SEED_PER_RANK` adds the rank: what every rank of a job
    /// shares (the wall-clock schedule of `IBJITTER_EPISODES_SYNC` is drawn from it).
    pub job_seed: u64,
    /// Where the seed came from ("default", "IBJITTER_SEED", a file).
    pub seed_source: String,
    /// Stats file pattern (`%p` is replaced by the pid at exit).
    pub stats: Option<String>,
    pub quiet: bool,
    /// At most one line: why injection is off, when it is not simply unconfigured.
    pub warning: Option<String>,
    /// A variable that was set but does nothing here, while the rest works (said as a
    /// warning with the start-up line).
    pub ignored: Option<String>,
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
    /// `IBJITTER_DISTRIBUTIONS`: the first directory of named tables (kept for live `set`s,
    /// which must not read the environment from the control thread).
    pub distributions: Option<String>,
}

/// How draws follow each other (all off by default: i.i.d. draws from one table).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shape {
    /// `IBJITTER_EPISODES`: mean dwell times (ns) of the calm and the congested state; the
    /// delays then hold the calm table followed by the congested one.
    pub episodes: Option<(f64, f64)>,
    /// `IBJITTER_EPISODES_SYNC`: the episodes follow the one wall-clock schedule of the seed
    /// (shared by every process with the same seed and means), not one drawn from this
    /// process's start.
    pub episodes_sync: bool,
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

/// Set in each rank by MPI launchers, torchrun and Slurm: the process's rank (the first one
/// set, [`launcher_rank`]). The innermost launcher's comes first: torchrun's workers inherit
/// the `SLURM_PROCID` of the srun task that started torchrun (every worker of a node the
/// same), and the ranks of an mpirun in a Slurm batch script inherit its `SLURM_PROCID=0`;
/// so torchrun's `RANK` is read first (only with `TORCHELASTIC_RUN_ID`, which says torchrun
/// set it: `RANK` alone is too common a name) and `SLURM_PROCID` last.
pub const LAUNCHER_RANK_VARS: [&str; 6] = [
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
];

/// The names of [`LAUNCHER_RANK_VARS`] as a message says them.
pub const LAUNCHER_RANK_NAMES: &str =
    "torchrun's RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, MV2_COMM_WORLD_RANK, SLURM_PROCID";

/// The launcher's rank variable set in this process, and its value (see
/// [`LAUNCHER_RANK_VARS`]).
pub fn launcher_rank(var: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    let torchrun = var("TORCHELASTIC_RUN_ID").is_some();
    LAUNCHER_RANK_VARS
        .iter()
        .filter(|k| **k != "RANK" || torchrun)
        .find_map(|k| var(k).map(|r| (*k, r)))
}

/// Draws `IBJITTER_TRACE` keeps by default (4 bytes each), and at most: 16 Mi draws, 64 MiB
/// of address space (a shim in every process of a job must not ask for a gigabyte; a longer
/// study takes several runs).
pub const DEFAULT_TRACE_MAX: usize = 1_000_000;
const MAX_TRACE_MAX: u64 = 1 << 24;

/// Reads variables and collects what is wrong with them, in the order they are read.
struct Reader<'a> {
    var: Var<'a>,
    problems: Vec<String>,
}

impl Reader<'_> {
    /// The variable, unless unset or blank.
    fn nonempty(&self, k: &str) -> Option<String> {
        (self.var)(k).filter(|v| !v.trim().is_empty())
    }

    /// A path the shim writes or searches (`IBJITTER_STATS`, `_TRACE`, `_DISTRIBUTIONS`):
    /// one whose bytes are not UTF-8 was read with U+FFFD in their place ([`super::env_var`])
    /// and would name another file, so it is refused (pass-through), not used mangled.
    fn path(&mut self, k: &str) -> Option<String> {
        let v = self.nonempty(k)?;
        if v.contains(char::REPLACEMENT_CHARACTER) {
            self.problem(format!(
                "{k}={v:?}: not valid UTF-8 (the shim keeps paths as UTF-8; a byte it cannot \
                 keep would name another file)"
            ));
            return None;
        }
        Some(v)
    }

    fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }

    /// The launcher's rank variable set in this process, if any ([`launcher_rank`]).
    fn rank_var(&self) -> Option<(&'static str, String)> {
        launcher_rank(self.var)
    }
}

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
            job_seed: DEFAULT_SEED,
            seed_source: "default".into(),
            stats: None,
            quiet: false,
            warning: None,
            ignored: None,
            not_this_process: None,
            window: None,
            select: Selection::default(),
            shape: Shape::default(),
            control: true,
            line: false,
            cq: None,
            distributions: None,
        }
    }

    /// Reads the `IBJITTER_*` variables through `var` (the process environment in the shim).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Settings {
        let mut r = Reader {
            var: &var,
            problems: Vec::new(),
        };
        let mut s = Settings::passthrough();
        s.read_outputs(&mut r);
        s.read_choices(&mut r);
        s.read_seed(&mut r);
        let limit = s.read_max_delay(&mut r);
        let delays = s.read_table(&mut r, limit);
        s.read_window(&mut r);
        // Completions are held in ns: in loops mode IBJITTER_MAX_DELAY counts loops, so the
        // completion side keeps the default bound.
        let cq_limit = match s.unit {
            Unit::Ns => limit,
            Unit::Loops => default_max_delay(Unit::Ns),
        };
        match load_cq(&|k| r.nonempty(k), cq_limit) {
            Ok(cq) => s.cq = cq,
            Err(e) => r.problem(e),
        }
        s.read_shape(&mut r, delays.is_some());
        s.read_selection(&mut r, delays.is_some());
        s.read_ranks(&mut r);
        if r.problems.is_empty() {
            s.delays = if s.not_this_process.is_some() {
                None
            } else {
                delays
            };
        } else {
            s.warning = Some(format!(
                "{}; injection disabled (pass-through)",
                r.problems.join("; ")
            ));
        }
        s
    }

    /// A boolean variable: `default` when unset, `on_error` (and a problem) when unreadable.
    fn read_bool(r: &mut Reader<'_>, k: &str, default: bool, on_error: bool) -> bool {
        match r.nonempty(k).map(|v| parse_bool(k, &v)) {
            None => default,
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                r.problem(e);
                on_error
            }
        }
    }

    /// `IBJITTER_QUIET`, `_STATS`, `_CONTROL`, `_DISTRIBUTIONS`. An unreadable boolean does the
    /// least: the shim is not quiet (its warning shows anyway) and starts no live control.
    fn read_outputs(&mut self, r: &mut Reader<'_>) {
        self.quiet = Self::read_bool(r, "IBJITTER_QUIET", false, false);
        self.stats = r.path("IBJITTER_STATS");
        self.distributions = r.path("IBJITTER_DISTRIBUTIONS");
        self.control = Self::read_bool(r, "IBJITTER_CONTROL", true, false);
    }

    /// The named choices: `IBJITTER_UNIT`, `_PER`, `_LAYER`, `_MODE`, `_SPIN`.
    fn read_choices(&mut self, r: &mut Reader<'_>) {
        match r.nonempty("IBJITTER_UNIT").as_deref().map(str::trim) {
            None | Some("ns") => {}
            Some("loops") => self.unit = Unit::Loops,
            Some(other) => r.problem(format!(
                "IBJITTER_UNIT={}: expected \"ns\" or \"loops\"",
                shown(other)
            )),
        }
        match r.nonempty("IBJITTER_PER").as_deref().map(str::trim) {
            None | Some("post") => {}
            Some("wr") => self.per = Per::Wr,
            Some(other) => r.problem(format!(
                "IBJITTER_PER={}: expected \"post\" (one delay per call or batch) or \"wr\" (one per work request)",
                shown(other)
            )),
        }
        match r.nonempty("IBJITTER_LAYER").as_deref().map(str::trim) {
            None | Some("auto") => {}
            Some("verbs") => self.layer = Layer::Verbs,
            Some("ucp") => self.layer = Layer::Ucp,
            Some(other) => r.problem(format!(
                "IBJITTER_LAYER={}: expected \"auto\" (UCP for UCX's messages, verbs for the rest), \"verbs\" or \"ucp\"",
                shown(other)
            )),
        }
        match r.nonempty("IBJITTER_MODE").as_deref().map(str::trim) {
            None | Some("spin") => {}
            Some("line") if self.unit == Unit::Loops => r.problem(
                "IBJITTER_MODE=line keeps time: it needs delays in ns, not IBJITTER_UNIT=loops",
            ),
            Some("line") => self.line = true,
            Some(other) => r.problem(format!(
                "IBJITTER_MODE={}: expected \"spin\" (the posting thread waits) or \"line\" (a delay line: posts return at once)",
                shown(other)
            )),
        }
        match r.nonempty("IBJITTER_SPIN").as_deref().map(str::trim) {
            None | Some("auto") => {}
            Some("plain") => self.spin = Spin::Plain,
            Some("pause") => self.spin = Spin::Pause,
            Some(other) => r.problem(format!(
                "IBJITTER_SPIN={}: expected \"auto\", \"plain\" or \"pause\"",
                shown(other)
            )),
        }
    }

    /// `IBJITTER_SEED`, then `IBJITTER_SEED_PER_RANK`.
    fn read_seed(&mut self, r: &mut Reader<'_>) {
        if let Some(v) = r.nonempty("IBJITTER_SEED") {
            match parse_seed(&v) {
                Ok((seed, source)) => {
                    self.seed = seed;
                    self.seed_source = source;
                }
                Err(e) => r.problem(e),
            }
        }
        self.job_seed = self.seed;
        // A launcher gives every rank the same environment, so the same seed: with
        // IBJITTER_SEED_PER_RANK=1 each rank draws its own sequence (seed + rank), repeatably.
        if !Self::read_bool(r, "IBJITTER_SEED_PER_RANK", false, false) {
            return;
        }
        if let Some((k, rank)) = r.rank_var() {
            match rank.trim().parse::<u64>() {
                Ok(n) => {
                    self.seed = self.seed.wrapping_add(n);
                    self.seed_source = format!("{} + rank {n} ({k})", self.seed_source);
                }
                Err(_) => r.problem(format!(
                    "IBJITTER_SEED_PER_RANK=1 but {k}={} is not a rank number",
                    quoted(&rank)
                )),
            }
        } else {
            // Not a rank (a single process, a launcher's own process): its sequence is the
            // seed's, as every other such process's. Said in the start-up line.
            self.seed_source = format!(
                "{} (IBJITTER_SEED_PER_RANK=1, but no rank variable is set: {LAUNCHER_RANK_NAMES})",
                self.seed_source
            );
        }
    }

    /// `IBJITTER_MAX_DELAY`, in the unit of the tables (infinite when unreadable: the problem
    /// is said and nothing is injected).
    fn read_max_delay(&self, r: &mut Reader<'_>) -> f64 {
        match r.nonempty("IBJITTER_MAX_DELAY") {
            // Read as a float first: a bound past 64 bits is refused with the ceiling too.
            Some(v) => match parse_duration(&v, self.unit).map(|l| l.round()) {
                Ok(l) if l > DELAY_CEILING as f64 => {
                    let days = if self.unit == Unit::Ns {
                        " (11.6 days)"
                    } else {
                        ""
                    };
                    r.problem(format!(
                        "IBJITTER_MAX_DELAY={}: at most {DELAY_CEILING} {u}{days}, the longest \
                         delay the injector holds",
                        v.trim(),
                        u = self.unit.name()
                    ));
                    f64::INFINITY
                }
                Ok(l) => l,
                Err(e) => {
                    r.problem(format!("IBJITTER_MAX_DELAY={e}"));
                    f64::INFINITY
                }
            },
            None => default_max_delay(self.unit),
        }
    }

    /// The send table (`IBJITTER_EPISODES` or `_TABLE`/`_DIST`/`_DELAY`/`_JITTER`), bounded
    /// by `IBJITTER_MAX_DELAY` and thinned by `IBJITTER_PROB`. None if none or refused.
    fn read_table(&mut self, r: &mut Reader<'_>, limit: f64) -> Option<Delays> {
        let loaded = match r.nonempty("IBJITTER_EPISODES") {
            Some(v) => load_episodes(&v, &|k| r.nonempty(k)).map(|(d, dwell)| {
                self.shape.episodes = Some(dwell);
                Some(d)
            }),
            None => load_delays(&|k| r.nonempty(k), self.unit),
        };
        let delays = match loaded.and_then(|d| bounded(d, limit, self.unit)) {
            Ok(d) => d,
            Err(e) => {
                r.problem(e);
                None
            }
        };
        let Some(v) = r.nonempty("IBJITTER_PROB") else {
            return delays;
        };
        match (parse_probability(&v), delays) {
            (Ok(p), Some(d)) => Some(with_probability(d, p, self.seed)),
            (Ok(_), None) => {
                r.problem("IBJITTER_PROB needs a table (IBJITTER_TABLE, _DIST or _DELAY)");
                None
            }
            (Err(e), _) => {
                r.problem(e);
                None
            }
        }
    }

    /// `IBJITTER_START`/`IBJITTER_STOP`.
    fn read_window(&mut self, r: &mut Reader<'_>) {
        let mut at = |k: &str| -> Option<u64> {
            let v = r.nonempty(k)?;
            match parse_duration_u64(&v, Unit::Ns) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    r.problem(format!("{k}={e}"));
                    None
                }
            }
        };
        let (start, stop) = (at("IBJITTER_START"), at("IBJITTER_STOP"));
        if start.is_none() && stop.is_none() {
            return;
        }
        let w = Window {
            start_ns: start.unwrap_or(0),
            stop_ns: stop,
        };
        if w.stop_ns.is_some_and(|stop| stop <= w.start_ns) {
            r.problem(format!(
                "IBJITTER_STOP must come after IBJITTER_START ({} ns <= {} ns)",
                w.stop_ns.unwrap_or(0),
                w.start_ns
            ));
        }
        self.window = Some(w);
    }

    /// `IBJITTER_EPISODES_SYNC`, `IBJITTER_CORRELATION`, `IBJITTER_TRACE` and `_TRACE_MAX`:
    /// they shape a table's draws.
    fn read_shape(&mut self, r: &mut Reader<'_>, has_table: bool) {
        // Without episodes there is nothing to share: said, and the rest goes on.
        let sync = Self::read_bool(r, "IBJITTER_EPISODES_SYNC", false, false);
        match r.nonempty("IBJITTER_EPISODES_SYNC") {
            Some(v) if sync && r.nonempty("IBJITTER_EPISODES").is_none() => {
                self.ignored = Some(format!(
                    "IBJITTER_EPISODES_SYNC={} shares the schedule of IBJITTER_EPISODES, which \
                     is not set: ignored",
                    shown(v.trim())
                ))
            }
            _ => self.shape.episodes_sync = sync,
        }
        if let Some(v) = r.nonempty("IBJITTER_CORRELATION") {
            match parse_correlation(&v) {
                Ok(_) if !has_table => r.problem(
                    "IBJITTER_CORRELATION needs a table (IBJITTER_TABLE, _DIST, _DELAY or _EPISODES)",
                ),
                Ok(rho) => self.shape.correlation = Some(rho),
                Err(e) => r.problem(e),
            }
        }
        let Some(path) = r.path("IBJITTER_TRACE") else {
            return;
        };
        let max = match r.nonempty("IBJITTER_TRACE_MAX") {
            None => Some(DEFAULT_TRACE_MAX),
            Some(v) => match parse_u64(v.trim()) {
                Some(n) if (1..=MAX_TRACE_MAX).contains(&n) => Some(n as usize),
                _ => {
                    r.problem(format!(
                        "IBJITTER_TRACE_MAX={}: expected a number of draws, 1..={MAX_TRACE_MAX}",
                        shown(v.trim())
                    ));
                    None
                }
            },
        };
        if !has_table {
            r.problem("IBJITTER_TRACE records draws: it needs a table");
        } else if let Some(max) = max {
            self.shape.trace = Some((path.trim().to_string(), max));
        }
    }

    /// `IBJITTER_OPS`, `IBJITTER_QPN`, `IBJITTER_DEST`.
    fn read_selection(&mut self, r: &mut Reader<'_>, has_table: bool) {
        match Selection::parse(
            r.nonempty("IBJITTER_OPS").as_deref(),
            r.nonempty("IBJITTER_QPN").as_deref(),
            r.nonempty("IBJITTER_DEST").as_deref(),
        ) {
            Ok(sel) if sel.any() && !has_table => r.problem(
                "IBJITTER_OPS, _QPN and _DEST select among delayed sends: they need a table \
                 (IBJITTER_TABLE, _DIST or _DELAY)",
            ),
            Ok(sel) => self.select = sel,
            Err(e) => r.problem(e),
        }
    }

    /// `IBJITTER_RANKS`: whether this process, by its launcher's rank, injects at all.
    fn read_ranks(&mut self, r: &mut Reader<'_>) {
        let Some(v) = r.nonempty("IBJITTER_RANKS") else {
            return;
        };
        let ranks = match parse_ranks(&v) {
            Ok(ranks) => ranks,
            Err(e) => return r.problem(e),
        };
        match r.rank_var() {
            Some((_, rank)) if rank.trim().parse::<u32>().is_ok_and(|n| ranks.contains(n)) => {}
            Some((k, rank)) => {
                self.not_this_process = Some(format!(
                    "rank {} ({k}) is not in IBJITTER_RANKS={}: nothing is delayed in this process",
                    shown(rank.trim()),
                    shown(v.trim())
                ))
            }
            None => r.problem(format!(
                "IBJITTER_RANKS={} but no rank variable ({LAUNCHER_RANK_NAMES}) is set: is this \
                 an MPI, torchrun or Slurm rank?",
                shown(v.trim()),
            )),
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
    fn episodes_sync_is_a_boolean_that_needs_episodes() {
        let dir = std::env::temp_dir().join(format!("ibjitter-epsync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = (0..512).map(|_| "1000 ".repeat(8)).collect::<Vec<_>>();
        let calm = dir.join("calm.dist");
        std::fs::write(&calm, table.join("\n")).unwrap();
        let spec = format!("{}:{}:20ms:20ms", calm.display(), calm.display());
        let with = |sync: Option<&str>| {
            let mut vars = vec![("IBJITTER_EPISODES", spec.as_str())];
            vars.extend(sync.map(|v| ("IBJITTER_EPISODES_SYNC", v)));
            Settings::from_vars(env(&vars))
        };
        // Off by default: each process draws its own schedule, as before.
        let s = with(None);
        assert_eq!(
            (s.shape.episodes_sync, s.warning, s.ignored),
            (false, None, None)
        );
        for (v, on) in [("1", true), (" yes ", true), ("off", false)] {
            let s = with(Some(v));
            assert_eq!((s.shape.episodes_sync, s.warning), (on, None), "{v}");
            assert!(s.delays.is_some() && s.ignored.is_none(), "{v}");
        }
        // A bad value: the usual one warning and pass-through.
        let s = with(Some("maybe"));
        assert!(s.delays.is_none());
        let w = s.warning.unwrap_or_default();
        assert!(
            w.contains("IBJITTER_EPISODES_SYNC=maybe: expected 0 or 1")
                && w.ends_with("injection disabled (pass-through)"),
            "{w}"
        );
        let huge = "x".repeat(130 * 1024);
        let w = Settings::from_vars(env(&[
            ("IBJITTER_EPISODES", &spec),
            ("IBJITTER_EPISODES_SYNC", &huge),
        ]))
        .warning
        .unwrap_or_default();
        assert!(
            w.len() < 1000 && w.contains("IBJITTER_EPISODES_SYNC"),
            "{w}"
        );
        // Set without episodes: said, ignored, and the table still injects.
        let s = Settings::from_vars(env(&[
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_EPISODES_SYNC", "1"),
        ]));
        assert!(s.delays.is_some() && s.warning.is_none() && !s.shape.episodes_sync);
        let ignored = s.ignored.unwrap_or_default();
        assert!(
            ignored.contains("IBJITTER_EPISODES_SYNC=1")
                && ignored.contains("IBJITTER_EPISODES")
                && ignored.ends_with("ignored"),
            "{ignored}"
        );
        // Asked off without episodes: nothing to say.
        let s = Settings::from_vars(env(&[
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_EPISODES_SYNC", "0"),
        ]));
        assert_eq!((s.warning, s.ignored), (None, None));
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
    use ibjitter_table::{self as table, ENTRIES};
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
        // A bound beyond the longest delay the injector holds is refused, whatever the table;
        // the ceiling itself is accepted.
        for (max, delay) in [("1000001s", "1ms"), ("9223372036854775808ns", "1000001s")] {
            let s = settings(&[("IBJITTER_DELAY", delay), ("IBJITTER_MAX_DELAY", max)]);
            let w = s.warning.unwrap_or_default();
            assert!(
                s.delays.is_none()
                    && w.contains(&format!(
                        "IBJITTER_MAX_DELAY={max}: at most 1000000000000000 ns (11.6 days)"
                    )),
                "{max}: {w}"
            );
        }
        let loops = settings(&[
            ("IBJITTER_UNIT", "loops"),
            ("IBJITTER_DELAY", "5"),
            ("IBJITTER_MAX_DELAY", "1000000000000001"),
        ]);
        assert!(loops.delays.is_none(), "{:?}", loops.warning);
        assert!(loops
            .warning
            .unwrap()
            .contains("at most 1000000000000000 loops, the longest"));
        let ceiling = settings(&[
            ("IBJITTER_DELAY", "1000000s"),
            ("IBJITTER_MAX_DELAY", "1000000s"),
        ]);
        assert_eq!(ceiling.warning, None);
        assert_eq!(ceiling.delays.map(|d| d.max()), Some(DELAY_CEILING));
        // A bound past 64 bits is told the ceiling; another duration there, that it is read
        // as 2^64 or more (u64::MAX itself rounds to 2^64 as a float), not "at most u64::MAX".
        for (k, says) in [
            (
                "IBJITTER_MAX_DELAY",
                "at most 1000000000000000 ns (11.6 days)",
            ),
            (
                "IBJITTER_CQ_DELAY",
                "too large (read as 2^64 ns or more; 64 bits hold less)",
            ),
        ] {
            let w = settings(&[("IBJITTER_DELAY", "1ms"), (k, "18446744073709551615ns")])
                .warning
                .unwrap();
            assert!(w.contains(says), "{k}: {w}");
        }
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
        assert_eq!(s.job_seed, 100, "the rank's seed; the job's stays shared");
        assert_eq!(s.seed_source, "IBJITTER_SEED + rank 3 (PMI_RANK)");
        // One process, no launcher: the seed as given, and the start-up line says why.
        let alone = with(&[("IBJITTER_SEED_PER_RANK", "1")]);
        assert_eq!((alone.seed, alone.warning), (100, None));
        assert!(
            alone.seed_source.contains("no rank variable is set"),
            "{}",
            alone.seed_source
        );
        let bad = with(&[("IBJITTER_SEED_PER_RANK", "perhaps")]);
        assert!(bad.warning.unwrap().contains("expected 0 or 1"));
    }

    /// `srun torchrun`: every worker of a node inherits the srun task's SLURM_PROCID; its own
    /// rank is torchrun's RANK. An mpirun's ranks in a batch script inherit SLURM_PROCID=0.
    #[test]
    fn the_innermost_launchers_rank_wins() {
        let per_rank = |extra: &[(&str, &str)]| {
            let mut v = vec![
                ("IBJITTER_DELAY", "10us"),
                ("IBJITTER_SEED", "100"),
                ("IBJITTER_SEED_PER_RANK", "1"),
            ];
            v.extend_from_slice(extra);
            settings(&v)
        };
        let torch = [
            ("SLURM_PROCID", "0"),
            ("TORCHELASTIC_RUN_ID", "j1"),
            ("LOCAL_RANK", "1"),
        ];
        let s = per_rank(&[torch.as_slice(), &[("RANK", "9")]].concat());
        assert_eq!(
            (s.seed, s.seed_source.as_str()),
            (109, "IBJITTER_SEED + rank 9 (RANK)")
        );
        // RANK without torchrun's mark is not taken for a rank.
        assert_eq!(per_rank(&[("SLURM_PROCID", "2"), ("RANK", "9")]).seed, 102);
        assert_eq!(
            per_rank(&[("SLURM_PROCID", "0"), ("MV2_COMM_WORLD_RANK", "5")]).seed,
            105
        );
        // IBJITTER_RANKS=0 leaves torchrun's worker 1 out, whatever SLURM_PROCID says.
        let mut v = vec![("IBJITTER_DELAY", "10us"), ("IBJITTER_RANKS", "0")];
        v.extend_from_slice(&torch);
        v.push(("RANK", "1"));
        let s = settings(&v);
        assert!(s.delays.is_none(), "{:?}", s.not_this_process);
        assert!(s.not_this_process.unwrap().contains("rank 1 (RANK)"));
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

    #[test]
    fn every_boolean_reads_the_same_words_and_warns_on_others() {
        for (v, b) in [
            ("1", true),
            ("true", true),
            ("YES", true),
            (" On ", true),
            ("0", false),
            ("False", false),
            ("no", false),
            ("OFF", false),
        ] {
            let s = settings(&[
                ("IBJITTER_DELAY", "1us"),
                ("IBJITTER_QUIET", v),
                ("IBJITTER_CONTROL", v),
                ("IBJITTER_SEED_PER_RANK", v),
                ("IBJITTER_SEED", "100"),
                ("PMI_RANK", "3"),
            ]);
            assert_eq!(s.warning, None, "{v}");
            assert_eq!((s.quiet, s.control), (b, b), "{v}");
            assert_eq!(s.seed, if b { 103 } else { 100 }, "{v}");
        }
        for k in [
            "IBJITTER_QUIET",
            "IBJITTER_CONTROL",
            "IBJITTER_SEED_PER_RANK",
        ] {
            let s = settings(&[("IBJITTER_DELAY", "1us"), (k, "enabled")]);
            let w = s.warning.unwrap_or_default();
            assert!(
                w.contains(&format!("{k}=enabled: expected 0 or 1"))
                    && w.contains("true/false, yes/no or on/off"),
                "{k}: {w}"
            );
            assert!(s.delays.is_none() && !s.quiet, "{k}");
            // An unreadable IBJITTER_CONTROL starts no control; the others leave it on.
            assert_eq!(s.control, k != "IBJITTER_CONTROL", "{k}");
        }
    }

    #[test]
    fn a_huge_bad_value_is_quoted_by_its_start_and_its_length() {
        let huge = "x".repeat(130 * 1024);
        let long_path = format!("/{}", "y".repeat(130 * 1024));
        for k in [
            "IBJITTER_UNIT",
            "IBJITTER_PER",
            "IBJITTER_LAYER",
            "IBJITTER_MODE",
            "IBJITTER_SPIN",
            "IBJITTER_SEED",
            "IBJITTER_SEED_PER_RANK",
            "IBJITTER_QUIET",
            "IBJITTER_CONTROL",
            "IBJITTER_MAX_DELAY",
            "IBJITTER_JITTER",
            "IBJITTER_PROB",
            "IBJITTER_START",
            "IBJITTER_STOP",
            "IBJITTER_CQ_DELAY",
            "IBJITTER_CQ_TABLE",
            "IBJITTER_CORRELATION",
            "IBJITTER_TRACE_MAX",
            "IBJITTER_OPS",
            "IBJITTER_QPN",
            "IBJITTER_DEST",
            "IBJITTER_RANKS",
            "IBJITTER_DIST",
        ] {
            for v in [&huge, &long_path] {
                let mut vars = vec![(k, v.as_str()), ("PMI_RANK", "1")];
                if k == "IBJITTER_TRACE_MAX" {
                    vars.push(("IBJITTER_TRACE", "/tmp/t"));
                }
                if k != "IBJITTER_JITTER" {
                    vars.push(("IBJITTER_DELAY", "1us"));
                }
                let w = settings(&vars).warning.unwrap_or_default();
                assert!(!w.is_empty(), "{k}: no warning");
                assert!(w.len() < 1000, "{k}: a {} byte warning", w.len());
                assert!(w.contains(k), "{k}: {w}");
            }
        }
        for (k, v) in [
            ("IBJITTER_TABLE", &long_path),
            ("IBJITTER_TABLE", &huge),
            ("IBJITTER_DELAY", &huge),
            ("IBJITTER_EPISODES", &huge),
            ("IBJITTER_EPISODES", &format!("{long_path}:/b:1ms:1ms")),
        ] {
            let w = settings(&[(k, v)]).warning.unwrap_or_default();
            assert!(w.len() < 1000, "{k}: a {} byte warning", w.len());
            assert!(w.contains(k), "{k}: {w}");
        }
        let w = settings(&[("IBJITTER_DELAY", "1us"), ("IBJITTER_UNIT", &huge)])
            .warning
            .unwrap();
        assert!(w.contains(&format!("… ({} bytes)", huge.len())), "{w}");
    }

    #[test]
    fn completion_delays_are_bounded_like_send_delays() {
        for (vars, says) in [
            (
                vec![("IBJITTER_CQ_DELAY", "3600s")],
                "exceeds IBJITTER_MAX_DELAY",
            ),
            (
                vec![("IBJITTER_CQ_DELAY", "2ms"), ("IBJITTER_MAX_DELAY", "1ms")],
                "exceeds IBJITTER_MAX_DELAY",
            ),
            (vec![("IBJITTER_CQ_DELAY", "1e30s")], "too large"),
            (vec![("IBJITTER_CQ_DELAY", "-1ms")], "non-negative"),
            (vec![("IBJITTER_CQ_DELAY", "infs")], "IBJITTER_CQ_DELAY"),
            (vec![("IBJITTER_CQ_DELAY", "nanms")], "IBJITTER_CQ_DELAY"),
        ] {
            let s = settings(&vars);
            assert_eq!(s.cq, None, "{vars:?}");
            let w = s.warning.unwrap_or_default();
            assert!(
                w.contains("IBJITTER_CQ_DELAY") && w.contains(says),
                "{vars:?}: {w}"
            );
        }
        let dir = std::env::temp_dir().join(format!("ibjitter-cqmax-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let huge = dir.join("huge.tbl");
        let line = format!("{}\n", ["9000000000000000000"; 8].join(" "));
        std::fs::write(&huge, line.repeat(512)).unwrap();
        let s = settings(&[("IBJITTER_CQ_TABLE", huge.to_str().unwrap())]);
        assert_eq!(s.cq, None);
        let w = s.warning.unwrap_or_default();
        assert!(
            w.contains("IBJITTER_CQ_TABLE") && w.contains("exceeds IBJITTER_MAX_DELAY"),
            "{w}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let ok = settings(&[("IBJITTER_CQ_DELAY", "20s"), ("IBJITTER_MAX_DELAY", "30s")]);
        assert_eq!(ok.cq.map(|d| d.max()), Some(20_000_000_000));
        // Loops count the send side only: completions keep the default bound in ns.
        let loops = settings(&[
            ("IBJITTER_UNIT", "loops"),
            ("IBJITTER_MAX_DELAY", "1000"),
            ("IBJITTER_CQ_DELAY", "5ms"),
        ]);
        assert_eq!(loops.cq.map(|d| d.max()), Some(5_000_000));
    }

    #[test]
    fn wrapping_durations_are_refused_everywhere() {
        for k in [
            "IBJITTER_DELAY",
            "IBJITTER_MAX_DELAY",
            "IBJITTER_START",
            "IBJITTER_STOP",
        ] {
            for v in ["1e30s", "-5ms", "infms"] {
                let mut vars = vec![(k, v)];
                if k != "IBJITTER_DELAY" {
                    vars.push(("IBJITTER_DELAY", "1us"));
                }
                let s = settings(&vars);
                assert!(s.delays.is_none(), "{k}={v}");
                let w = s.warning.unwrap_or_default();
                // A delay beyond 64 bits is beyond IBJITTER_MAX_DELAY, which is at most that.
                let names_it = w.contains(&format!("{k}="))
                    || (k == "IBJITTER_DELAY" && w.contains("exceeds IBJITTER_MAX_DELAY"));
                assert!(names_it, "{k}={v}: {w}");
            }
        }
        // A bound past 64 bits is past the injector's ceiling, and told so.
        let s = settings(&[("IBJITTER_UNIT", "loops"), ("IBJITTER_MAX_DELAY", "1e30")]);
        let w = s.warning.unwrap();
        assert!(
            w.contains("IBJITTER_MAX_DELAY=1e30: at most 1000000000000000 loops"),
            "{w}"
        );
    }

    #[test]
    fn ranks_are_kept_as_ranges() {
        let spec = (0..600)
            .map(|i: u64| format!("{}-{}", i * 7_000_000, i * 7_000_000 + 4_000_000))
            .collect::<Vec<_>>()
            .join(",");
        assert!(spec.len() > 5000);
        let t0 = std::time::Instant::now();
        for (rank, inside) in [
            ("0", true),
            ("4000000", true),
            ("4000001", false),
            ("7000000", true),
        ] {
            let s = settings(&[
                ("IBJITTER_DELAY", "1ms"),
                ("IBJITTER_RANKS", &spec),
                ("PMI_RANK", rank),
            ]);
            assert_eq!(s.warning, None);
            assert_eq!(s.delays.is_some(), inside, "rank {rank}");
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t0.elapsed()
        );
        let s = settings(&[
            ("IBJITTER_DELAY", "1ms"),
            ("IBJITTER_RANKS", "0-4294967295"),
            ("PMI_RANK", "4294967295"),
        ]);
        assert!(s.delays.is_some() && s.warning.is_none());
    }
}

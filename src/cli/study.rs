//! `ibjitter study`: parsing and exit status; the work is in `ibjitter::study`.
use super::exit;
use super::units::duration;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::study::plan::{Configuration, Perturbation, Plan, Stopping, Swept, Tolerance};
use ibjitter::study::runner::{new_attempt, Runner};
use ibjitter::study::tables::{episodes, family_at_means, from_files, FamilyBase};
use ibjitter::study::{self, Ending};
use regex::Regex;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
#[command(after_help = "Examples:
  ibjitter study --family lat.txt --family-means 20us,40us --reps 5 --out st -- \\
      mpirun -np 2 ./solver
  ibjitter study --tables a.dist,b.dist --until-ci 5% --metric 'Loop time of ([0-9.]+)' \\
      --out st2 -- sh -c 'mpirun -np 4 lmp -in in.lj'
  ibjitter study --congestor 'incast --receiver n0:10.0.0.1 --senders n2,n3 -- --duration 3600s' \\
      --reps 10 --out st3 -- srun -N2 ./canary
  ibjitter study --tolerance --target 1%,5%,10% --kind both --until-ci 0.5% --out tol -- \\
      mpirun -np 2 ./solver
  ibjitter study --episodes calm.dist:cong.dist:20ms:20ms --reps 5 --out ep -- \\
      mpirun -np 4 ./solver

--tolerance sweeps added constant delays (and, at --tolerance-mean, the sd of the
mean-preserving lognormal family) in steps of rounds with clean runs and two references (a zero
delay: the injector loaded, nothing added; the constant delay at --tolerance-mean), each step
chosen from the rows so far (a resumed sweep replays them). Each run's slowdown is taken over
the references of its own round; a line through the origin is fitted to each sweep's points
(points - 1 degrees of freedom, with a test of whether they lie on a line), and the study
reports the added latency and the sd at which the slowdown crosses each --target, with
intervals, and the runtime per us added (the number of latency-bound messages on the critical
path). No verdict or correlations: the sweep's delays are its design. See summary.md,
tolerance.svg and docs/study.md.

Every run's environment loads libibjitter.so (LD_PRELOAD, IBJITTER_TABLE or _EPISODES and
_EPISODES_SYNC, IBJITTER_SEED, IBJITTER_SEED_PER_RANK, IBJITTER_STATS) for table and episodes
configurations; launchers that start ranks on other hosts must pass it on (Open MPI: -x
LD_PRELOAD -x IBJITTER_TABLE -x IBJITTER_SEED ...; srun passes the environment by default).
Re-running with the same --out continues the study, first stopping (and naming) the processes
a killed invocation of it left running on this host (each run's processes carry
IBJITTER_STUDY_RUN).
Exit status: 0 done; 1 some runs did not count (failed, metric missing, nothing injected) or
--until-ci hit its cap; 2 bad arguments; 130 Ctrl-C (the rows so far are kept and
summarized).")]
pub struct StudyArgs {
    /// Results directory: plan.json, study.csv, runs/, summary.md, summary.json, *.svg
    #[arg(long, short = 'o')]
    out: PathBuf,
    /// Delay tables to inject, one configuration each (named by file stem)
    #[arg(long, value_delimiter = ',', value_name = "A.dist,B.dist")]
    tables: Vec<PathBuf>,
    /// Generate the mean-preserving lognormal family and its uniform table from measured
    /// latencies (FILE, fitted), a fit (FIT.json from `ibjitter table fit --json`) or
    /// shape=S,scale=D[,loc=D] (with --tolerance: the base of its sd sweep)
    #[arg(long, value_name = "FILE|FIT.json|shape=S,scale=D[,loc=D]")]
    family: Option<String>,
    /// The family's means (default: the base lognormal's own); two or more make the runtime's
    /// correlation with the mean meaningful
    #[arg(long, value_delimiter = ',', value_name = "D,D", requires = "family")]
    family_means: Vec<String>,
    /// Fractions of the base scale for the family's members
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.75,0.5,0.25",
        requires = "family"
    )]
    family_fractions: Vec<f64>,
    /// Run `ibjitter ARGS` alongside the program (e.g. 'incast --receiver ... -- --duration
    /// 3600s'), started before it and stopped with SIGINT after it: a configuration of its own
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    congestor: Option<String>,
    /// Congestion episodes (the injector's IBJITTER_EPISODES): calm and congested tables and
    /// the mean dwell of each state; a configuration for each of --episodes-sharing
    #[arg(long, value_name = "CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED")]
    episodes: Option<String>,
    /// With --episodes: every rank congested at the same moments on the job's one wall-clock
    /// schedule (shared, IBJITTER_EPISODES_SYNC=1), each rank on its own (independent), or both
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "shared,independent",
        requires = "episodes"
    )]
    episodes_sharing: Vec<Sharing>,
    /// How long the congestor runs before the program starts
    #[arg(long, default_value = "2s", value_parser = duration)]
    congestor_settle: Duration,
    /// libibjitter.so (default: PREFIX/lib/ibjitter/ of an installed ibjitter, else beside
    /// this binary)
    #[arg(long)]
    shim: Option<PathBuf>,
    /// More injector settings for every table run (repeatable): IBJITTER_CORRELATION=0.5.
    /// Not the variables study sets itself: IBJITTER_TABLE (and _DIST, _DELAY, _EPISODES),
    /// IBJITTER_SEED, IBJITTER_STATS
    #[arg(long, value_name = "KEY=VALUE")]
    shim_env: Vec<String>,
    /// Measured runs per configuration
    #[arg(long, default_value_t = 5, conflicts_with = "until_ci")]
    reps: usize,
    /// Repeat rounds until every configuration's 95 % CI is within this share of its mean
    /// (e.g. 5%), after --min-reps rounds and at most --max-reps
    #[arg(long, value_name = "PERCENT")]
    until_ci: Option<String>,
    /// With --until-ci: rounds before the intervals are first checked
    #[arg(long, default_value_t = 3)]
    min_reps: usize,
    /// With --until-ci: the most rounds, met or not (then exit 1)
    #[arg(long, default_value_t = 30)]
    max_reps: usize,
    /// Clean runs at the start that are measured but not counted
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Seed of the run order and of the injector's seeds
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The metric is the last number this regex matches in the program's output (its first
    /// group, else the whole match), instead of the wall time. Matched line by line, from the
    /// end of the output (which is never held in memory; lines beyond 1 MiB are matched on
    /// their last 1 MiB)
    #[arg(long, value_name = "REGEX")]
    metric: Option<String>,
    /// A second metric, e.g. a p99 latency the program prints: its slowdown is reported too
    #[arg(long, value_name = "REGEX")]
    tail_metric: Option<String>,
    /// The metric is a rate: higher is better (slowdowns are inverted)
    #[arg(long)]
    higher_is_better: bool,
    /// Kill a run after this long (it then does not count)
    #[arg(long, value_parser = duration)]
    timeout: Option<Duration>,
    /// No progress line
    #[arg(long)]
    no_progress: bool,
    /// How much added latency, and spread, the program tolerates: an adaptive sweep of
    /// constant delays and of the lognormal family's sd at --tolerance-mean, each point
    /// repeated as --reps or --until-ci say, runtime fitted as a line in each; reports where
    /// the slowdown crosses each --target (instead of --tables, --family-means, --congestor)
    #[arg(long)]
    tolerance: bool,
    /// With --tolerance: the slowdowns whose crossing points are sought
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1%,5%,10%",
        value_name = "PERCENT,PERCENT",
        requires = "tolerance"
    )]
    target: Vec<String>,
    /// With --tolerance: sweep the added mean (constant delays), the sd at --tolerance-mean
    /// (the mean-preserving lognormal family of --family, else of a lognormal of shape 0.5),
    /// or both
    #[arg(long, value_enum, default_value_t = SweepKind::Both, requires = "tolerance")]
    kind: SweepKind,
    /// With --tolerance: the mean at which the sd is swept
    #[arg(long, default_value = "20us", value_name = "D", requires = "tolerance")]
    tolerance_mean: String,
    /// With --tolerance: the mean sweep's first constant delay
    #[arg(long, default_value = "10us", value_name = "D", requires = "tolerance")]
    tolerance_start: String,
    /// With --tolerance: the most constant delay the mean sweep adds (a target not crossed
    /// by then is reported as not reached)
    #[arg(long, default_value = "1ms", value_name = "D", requires = "tolerance")]
    tolerance_max: String,
    /// With --tolerance and --metric: the metric's unit, so the fitted slope is also given
    /// as µs of runtime per µs added (the wall time's is s)
    #[arg(long, value_enum, requires_all = ["metric", "tolerance"])]
    metric_unit: Option<MetricUnit>,
    /// The program and its arguments (a launcher line: mpirun ..., srun ..., sh -c '...')
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
    /// Whether --family-fractions was given, not its default (from clap's value source).
    #[arg(skip)]
    family_fractions_given: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SweepKind {
    Mean,
    Sd,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Sharing {
    Shared,
    Independent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MetricUnit {
    S,
    Ms,
    Us,
    Ns,
}

impl MetricUnit {
    fn in_us(self) -> f64 {
        match self {
            MetricUnit::S => 1e6,
            MetricUnit::Ms => 1e3,
            MetricUnit::Us => 1.0,
            MetricUnit::Ns => 1e-3,
        }
    }
}

/// Why an injector variable is study's own, or `None` if `--shim-env` may set it. Overriding
/// one silently defeated the study (every table run rejected as "the injector drew no delay").
fn owned_by_study(name: &str) -> Option<&'static str> {
    match name {
        "IBJITTER_TABLE" | "IBJITTER_DIST" | "IBJITTER_DELAY" | "IBJITTER_EPISODES" => {
            Some("each run's table is the one its configuration names: give tables with --tables, --family or --episodes")
        }
        "IBJITTER_EPISODES_SYNC" => {
            Some("each --episodes configuration says whether its ranks share episodes: --episodes-sharing")
        }
        "IBJITTER_SEED" => Some("a seed per run, from --seed, so that the study repeats"),
        ibjitter::study::stragglers::VAR => Some(
            "it marks every process of a run, so that a resumed study finds what a killed one left running",
        ),
        "IBJITTER_STATS" => Some(
            "what each run injected is read from its own stats files, DIR/runs/NNNN.stats.ATTEMPT.HOST.PID.json",
        ),
        _ => None,
    }
}

/// `--episodes CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED` (the injector's grammar;
/// relative paths allowed: study passes them on absolute) as its configurations.
fn episodes_configurations(spec: &str, sharing: &[Sharing]) -> Result<Vec<Configuration>, String> {
    let form = || {
        format!(
            "--episodes {spec:?}: expected CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED \
             (two tables and the mean dwell of each state, e.g. calm.dist:cong.dist:50ms:10ms)"
        )
    };
    let mut parts = spec.rsplitn(3, ':');
    let (Some(congested_mean), Some(calm_mean), Some(paths)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(form());
    };
    let (calm, congested) = paths.split_once(':').ok_or_else(form)?;
    let dwell = |t: &str, which: &str| match ibjitter::table::duration::parse_duration(t) {
        Ok(ns) if ns >= 1.0 && ns.is_finite() && ns <= 3.6e15 => Ok(ns),
        Ok(_) => Err(format!(
            "--episodes: mean {which} dwell {t:?}: expected a duration from 1ns to 1000h"
        )),
        Err(e) => Err(format!("--episodes: mean {which} dwell: {e}")),
    };
    let dwell_ns = (
        dwell(calm_mean, "calm")?,
        dwell(congested_mean, "congested")?,
    );
    // Shared first, each once, however often named.
    let shared: Vec<bool> = [Sharing::Shared, Sharing::Independent]
        .into_iter()
        .filter(|s| sharing.contains(s))
        .map(|s| s == Sharing::Shared)
        .collect();
    episodes(Path::new(calm), Path::new(congested), dwell_ns, &shared)
}

/// `5%` (or `0.05`) as 0.05, for `flag`; strictly between 0 and 100 %.
fn percent(flag: &str, text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (v, scale) = match t.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (t, 1.0),
    };
    let v: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{flag}: expected a percentage like 5%, found {text:?}"))?;
    let f = v / scale;
    if !(f > 0.0 && f < 1.0) {
        return Err(format!(
            "{flag}: expected a share between 0 and 100 %, found {text:?}"
        ));
    }
    Ok(f)
}

/// `--tolerance`'s sweep, checked; `None` without `--tolerance`.
fn tolerance(a: &StudyArgs, stopping: Stopping) -> Result<Option<Tolerance>, String> {
    if !a.tolerance {
        return Ok(None);
    }
    // What a sweep chooses itself, or cannot use.
    let refused = [
        (!a.tables.is_empty(), "--tables", "it makes its own tables (constant delays and the family at --tolerance-mean); to study given tables, leave out --tolerance"),
        (!a.family_means.is_empty(), "--family-means", "the sd is swept at --tolerance-mean"),
        (a.family_fractions_given, "--family-fractions", "the sweep chooses the family's members"),
        (a.congestor.is_some(), "--congestor", "it sweeps delays only; to study a congestor, leave out --tolerance"),
        (a.episodes.is_some(), "--episodes", "it sweeps constant delays and spread only; to study episodes, leave out --tolerance"),
        (a.higher_is_better, "--higher-is-better", "runtime is fitted as a line in latency: give a time as the metric"),
        (a.family.is_some() && a.kind == SweepKind::Mean, "--family", "it is the base of the sd sweep, and --kind mean has none"),
    ];
    if let Some((_, flag, why)) = refused.iter().find(|r| r.0) {
        return Err(format!("--tolerance cannot be used with {flag}: {why}"));
    }
    if stopping == Stopping::Reps(1) {
        return Err(
            "--tolerance needs --reps 2 or more: each point's interval needs two runs".into(),
        );
    }
    let mut targets = a
        .target
        .iter()
        .map(|t| percent("--target", t))
        .collect::<Result<Vec<f64>, String>>()?;
    targets.sort_by(f64::total_cmp);
    targets.dedup();
    let us = |flag: &str, text: &str| {
        ibjitter::table::duration::parse_duration(text)
            .map_err(|e| format!("{flag}: {e}"))
            .and_then(|ns| {
                if ns >= 1e3 {
                    Ok(ns)
                } else {
                    Err(format!("{flag}: expected at least 1us, found {text:?}"))
                }
            })
    };
    let (start, max) = (
        us("--tolerance-start", &a.tolerance_start)?,
        us("--tolerance-max", &a.tolerance_max)?,
    );
    if start >= max {
        return Err(format!(
            "--tolerance-start ({}) must be below --tolerance-max ({})",
            a.tolerance_start, a.tolerance_max
        ));
    }
    let sd_mean = us("--tolerance-mean", &a.tolerance_mean)?;
    // The sd sweep's base: the family given, else a lognormal of shape 0.5 (scaled to the
    // mean: only its shape matters).
    let (base, _) = match &a.family {
        Some(spec) => FamilyBase::parse(spec)?.lognormal()?,
        None => FamilyBase::parse("shape=0.5,scale=1us")?.lognormal()?,
    };
    let metric_unit_us = match (&a.metric, a.metric_unit) {
        (None, _) => Some(MetricUnit::S.in_us()),
        (Some(_), u) => u.map(MetricUnit::in_us),
    };
    Ok(Some(Tolerance {
        targets,
        sweep: match a.kind {
            SweepKind::Mean => Swept::Mean,
            SweepKind::Sd => Swept::Sd,
            SweepKind::Both => Swept::Both,
        },
        mean_start_ns: start,
        mean_max_ns: max,
        sd_mean_ns: sd_mean,
        sd_base_shape: base.shape,
        sd_base_scale_ns: base.scale_ns,
        sd_base_loc_ns: base.loc_ns,
        metric_unit_us,
    }))
}

/// Everything checked, tables generated: the plan and its runner.
fn prepare(a: &StudyArgs) -> Result<(Plan, Runner), String> {
    // Each round runs the program once per configuration: past this, a count is a typo (or a
    // wrapping number: 2^63 rounds wrapped the run count to one run).
    const MOST_ROUNDS: usize = 100_000;
    for (flag, n) in [
        ("--reps", a.reps),
        ("--max-reps", a.max_reps),
        ("--min-reps", a.min_reps),
        ("--warmup", a.warmup),
    ] {
        if n > MOST_ROUNDS {
            return Err(format!(
                "{flag} {n}: at most {MOST_ROUNDS} (each round runs the program once per \
                 configuration)"
            ));
        }
    }
    let stopping = match &a.until_ci {
        Some(p) => {
            if a.min_reps < 2 || a.max_reps < a.min_reps {
                return Err(format!(
                    "--until-ci needs 2 <= --min-reps <= --max-reps (found {} and {})",
                    a.min_reps, a.max_reps
                ));
            }
            Stopping::UntilCi {
                fraction: percent("--until-ci", p)?,
                min: a.min_reps,
                max: a.max_reps,
            }
        }
        None if a.reps == 0 => return Err("--reps must be at least 1".into()),
        None => Stopping::Reps(a.reps),
    };
    let tolerance = tolerance(a, stopping)?;
    if a.tables.is_empty()
        && a.family.is_none()
        && a.congestor.is_none()
        && a.episodes.is_none()
        && tolerance.is_none()
    {
        return Err(
            "nothing to compare with the clean runs: give --tables, --family, --congestor, \
             --episodes or --tolerance"
                .into(),
        );
    }
    let mut configurations = vec![Configuration {
        name: "clean".into(),
        perturbation: Perturbation::Clean,
    }];
    let mut taken = vec!["clean".to_string(), "congested".to_string()];
    configurations.extend(from_files(&a.tables, &mut taken)?);
    // A sweep makes its tables as it goes; --family is then its sd sweep's base.
    if let Some(spec) = a.family.as_ref().filter(|_| tolerance.is_none()) {
        let base = FamilyBase::parse(spec)?;
        let means = a
            .family_means
            .iter()
            .map(|m| {
                ibjitter::table::duration::parse_duration(m)
                    .map_err(|e| format!("--family-means: {e}"))
            })
            .collect::<Result<Vec<f64>, String>>()?;
        let fam = family_at_means(&base, &means, &a.family_fractions, &a.out.join("tables"))?;
        if let Some(c) = fam.iter().find(|c| taken.contains(&c.name)) {
            return Err(format!(
                "--family makes a table named {:?}, as --tables does: rename that file",
                c.name
            ));
        }
        configurations.extend(fam);
    }
    if let Some(spec) = &a.episodes {
        configurations.extend(episodes_configurations(spec, &a.episodes_sharing)?);
    }
    if let Some(args) = &a.congestor {
        configurations.push(Configuration {
            name: "congested".into(),
            perturbation: Perturbation::Congestor { args: args.clone() },
        });
    }
    let regex = |r: &Option<String>, what: &str| -> Result<Option<Regex>, String> {
        r.as_deref()
            .map(|s| Regex::new(s).map_err(|e| format!("--{what}: {e}")))
            .transpose()
    };
    let self_exe =
        std::env::current_exe().map_err(|e| format!("cannot find this program's path: {e}"))?;
    let needs_shim = tolerance.is_some() || configurations.iter().any(|c| c.perturbation.injects());
    let shim = match &a.shim {
        Some(p) => p.clone(),
        // Installed (PREFIX/lib/ibjitter/) or built (beside this binary).
        None => match ibjitter::inject_env::find_shim(&self_exe) {
            Ok(p) => p,
            Err(e) if needs_shim => return Err(e),
            Err(_) => self_exe.with_file_name("libibjitter.so"),
        },
    };
    if needs_shim && !shim.is_file() {
        return Err(format!(
            "no injector at {} (build it with cargo build --release, or give --shim)",
            shim.display()
        ));
    }
    let shim = std::fs::canonicalize(&shim).unwrap_or(shim);
    let mut shim_env = Vec::new();
    for kv in &a.shim_env {
        match kv.split_once('=') {
            Some((k, _)) if owned_by_study(k).is_some() => {
                let why = owned_by_study(k).unwrap_or_default();
                return Err(format!(
                    "--shim-env {kv:?}: {k} is set by study itself for every table run ({why}); \
                     it cannot be overridden"
                ));
            }
            Some((k, v)) if k.starts_with("IBJITTER_") => shim_env.push((k.into(), v.into())),
            _ => return Err(format!("--shim-env {kv:?}: expected IBJITTER_NAME=VALUE")),
        }
    }
    let plan = Plan {
        command: a.command.clone(),
        configurations,
        seed: a.seed,
        warmup: a.warmup,
        stopping,
        metric: a.metric.clone(),
        tail_metric: a.tail_metric.clone(),
        higher_is_better: a.higher_is_better,
        tolerance,
    };
    let runner = Runner {
        command: a.command.clone(),
        shim,
        shim_env,
        runs_dir: a.out.join("runs"),
        self_exe,
        congestor_settle: a.congestor_settle,
        timeout: a.timeout,
        metric: regex(&a.metric, "metric")?,
        tail_metric: regex(&a.tail_metric, "tail-metric")?,
        stop: StopToken::process(),
        attempt: new_attempt(),
    };
    Ok((plan, runner))
}

pub fn run(mut a: StudyArgs, matches: Option<&ArgMatches>) -> i32 {
    a.family_fractions_given = matches
        .and_then(|m| m.value_source("family_fractions"))
        .is_some_and(|source| source != ValueSource::DefaultValue);
    let (plan, runner) = match prepare(&a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    let (mut schedule, rows) = match study::open(&plan, &a.out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    stop::install_signal_handlers();
    let (rows, ending) = match study::run(&mut schedule, &a.out, &runner, rows, !a.no_progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    let summary = match study::finish(&schedule, &a.out, &rows, ending) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::with_write_failure(exit::PARTLY);
        }
    };
    // What the figures are of comes first: an interrupted study's are of the runs so far.
    if ending == Ending::Interrupted {
        eprintln!("ibjitter study: interrupted: the figures below are of the runs so far");
    }
    if let Some(c) = &summary.correlation {
        eprintln!("ibjitter study: {}", c.verdict);
    }
    if let Some(t) = &summary.tolerance {
        for axis in [&t.mean, &t.sd].into_iter().flatten() {
            eprintln!("ibjitter study: {}", axis.sentence);
        }
    }
    for w in &summary.warnings {
        eprintln!("ibjitter study: {w}");
    }
    eprintln!(
        "ibjitter study: {} runs; results in {}/summary.md",
        rows.len(),
        a.out.display()
    );
    match ending {
        Ending::Interrupted => {
            eprintln!("ibjitter study: interrupted: re-run the same command to continue");
            exit::INTERRUPTED
        }
        Ending::CapReached => {
            eprintln!(
                "ibjitter study: --until-ci: not every 95 % CI is within the target after {} \
                 rounds ({}): the summary says incomplete",
                a.max_reps,
                summary.capped.join(", ")
            );
            exit::PARTLY
        }
        Ending::Complete if summary.runs_failed > 0 => exit::PARTLY,
        Ending::Complete => exit::OK,
    }
}

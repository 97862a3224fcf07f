//! `ibjitter study`: parsing and exit status; the work is in `ibjitter::study`.
use super::exit;
use super::units::duration;
use clap::Args;
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::study::plan::{Configuration, Perturbation, Plan, Stopping};
use ibjitter::study::runner::Runner;
use ibjitter::study::tables::{family_at_means, from_files, FamilyBase};
use ibjitter::study::{self, Ending};
use regex::Regex;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
#[command(after_help = "Examples:
  ibjitter study --family lat.txt --family-means 20us,40us --reps 5 --out st -- \\
      mpirun -np 2 ./solver
  ibjitter study --tables a.dist,b.dist --until-ci 5% --metric 'Loop time of ([0-9.]+)' \\
      --out st2 -- sh -c 'mpirun -np 4 lmp -in in.lj'
  ibjitter study --congestor 'incast --receiver n0:10.0.0.1 --senders n2,n3 -- --duration 3600s' \\
      --reps 10 --out st3 -- srun -N2 ./canary

Every run's environment loads libibjitter.so (LD_PRELOAD, IBJITTER_TABLE, IBJITTER_SEED,
IBJITTER_STATS) for table configurations; launchers that start ranks on other hosts must pass
it on (Open MPI: -x LD_PRELOAD -x IBJITTER_TABLE -x IBJITTER_SEED -x IBJITTER_STATS; srun
passes the environment by default). Re-running with the same --out continues the study.
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
    /// shape=S,scale=D[,loc=D]
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
    /// The program and its arguments (a launcher line: mpirun ..., srun ..., sh -c '...')
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Why an injector variable is study's own, or `None` if `--shim-env` may set it. Overriding
/// one silently defeated the study (every table run rejected as "the injector drew no delay").
fn owned_by_study(name: &str) -> Option<&'static str> {
    match name {
        "IBJITTER_TABLE" | "IBJITTER_DIST" | "IBJITTER_DELAY" | "IBJITTER_EPISODES" => {
            Some("each run's table is the one its configuration names: give tables with --tables or --family")
        }
        "IBJITTER_SEED" => Some("a seed per run, from --seed, so that the study repeats"),
        "IBJITTER_STATS" => Some(
            "what each run injected is read from its own stats files, DIR/runs/NNNN.stats.PID.json",
        ),
        _ => None,
    }
}

fn percent(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (v, scale) = match t.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (t, 1.0),
    };
    let v: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("--until-ci: expected a percentage like 5%, found {text:?}"))?;
    let f = v / scale;
    if !(f > 0.0 && f < 1.0) {
        return Err(format!(
            "--until-ci: expected a share between 0 and 100 %, found {text:?}"
        ));
    }
    Ok(f)
}

/// Everything checked, tables generated: the plan and its runner.
fn prepare(a: &StudyArgs) -> Result<(Plan, Runner), String> {
    let stopping = match &a.until_ci {
        Some(p) => {
            if a.min_reps < 2 || a.max_reps < a.min_reps {
                return Err(format!(
                    "--until-ci needs 2 <= --min-reps <= --max-reps (found {} and {})",
                    a.min_reps, a.max_reps
                ));
            }
            Stopping::UntilCi {
                fraction: percent(p)?,
                min: a.min_reps,
                max: a.max_reps,
            }
        }
        None if a.reps == 0 => return Err("--reps must be at least 1".into()),
        None => Stopping::Reps(a.reps),
    };
    if a.tables.is_empty() && a.family.is_none() && a.congestor.is_none() {
        return Err(
            "nothing to compare with the clean runs: give --tables, --family or --congestor".into(),
        );
    }
    let mut configurations = vec![Configuration {
        name: "clean".into(),
        perturbation: Perturbation::Clean,
    }];
    let mut taken = vec!["clean".to_string(), "congested".to_string()];
    configurations.extend(from_files(&a.tables, &mut taken)?);
    if let Some(spec) = &a.family {
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
    let needs_shim = configurations
        .iter()
        .any(|c| matches!(c.perturbation, Perturbation::Table { .. }));
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
        tolerance: None,
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
    };
    Ok((plan, runner))
}

pub fn run(a: StudyArgs) -> i32 {
    let (plan, runner) = match prepare(&a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    let rows = match study::open(&plan, &a.out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    stop::install_signal_handlers();
    let (rows, ending) = match study::run(&plan, &a.out, &runner, rows, !a.no_progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::SETUP;
        }
    };
    let summary = match study::finish(&plan, &a.out, &rows, ending) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ibjitter study: {e}");
            return exit::with_write_failure(exit::PARTLY);
        }
    };
    eprintln!("ibjitter study: {}", summary.verdict);
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
                "ibjitter study: --until-ci: not every 95 % CI is within the target after {} rounds",
                a.max_reps
            );
            exit::PARTLY
        }
        Ending::Complete if summary.runs_failed > 0 => exit::PARTLY,
        Ending::Complete => exit::OK,
    }
}

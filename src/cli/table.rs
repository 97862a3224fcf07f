//! `ibjitter table …`: make, fit and inspect delay tables. Argument parsing only; the work is
//! in `ibjitter::table`.

use super::exit;
use clap::{Args, Subcommand, ValueEnum};
use ibjitter::report::export::table as export;
use ibjitter::report::table::{
    EpisodesReport, FamilyReport, FamilyRow, FitReport, TableStatsReport,
};
use ibjitter::table::dist::{Dist, LogNormal};
use ibjitter::table::duration::{Duration, Unit};
use ibjitter::table::episodes::{fit_episodes, read_series, table_names, SeriesLayout, ENV};
use ibjitter::table::family::{family, member_name, uniform_name};
use ibjitter::table::fit::fit_lognormal;
use ibjitter::table::generate::{check_moments, make_table};
use ibjitter::table::samples::{read_samples, Layout, Samples};
use ibjitter::table::stats::Stats;
use ibjitter::table::{read, resolve_named_dist, ErrorKind, Kind, Table, TableError};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct TableArgs {
    #[command(subcommand)]
    command: TableCommand,
}

#[derive(Subcommand)]
enum TableCommand {
    /// Lognormal (scipy's parametrization): --shape/--scale[/--loc] or --mean/--sd[/--loc]
    Lognormal(LognormalArgs),
    /// Every entry the mean: the research's "uniform" (same mean, zero variance)
    Uniform(UniformArgs),
    /// Every entry the same value
    Constant(ConstantArgs),
    /// netem's normal: mu + sigma * Z (with --format netem: iproute2's normal.dist)
    Normal(NetemDistArgs),
    /// Exponential with this mean, shifted by --loc
    Exponential(ExponentialArgs),
    /// netem's pareto (with --format netem: iproute2's pareto.dist)
    Pareto(NetemDistArgs),
    /// netem's paretonormal (with --format netem: iproute2's paretonormal.dist)
    Paretonormal(NetemDistArgs),
    /// Quantiles of measured latencies
    Empirical(EmpiricalArgs),
    /// Maximum-likelihood lognormal with location (as scipy.stats.lognorm.fit)
    Fit(FitArgs),
    /// The mean-preserving lognormal family: scale fractions, shape by bisection, plus uniform
    Family(FamilyArgs),
    /// Two-state (calm/congested) model of a latency time series: a table per state and the
    /// mean dwells, for IBJITTER_EPISODES
    Episodes(EpisodesArgs),
    /// Mean, sd, min, p50, p90, p99, max of a table
    Stats(StatsArgs),
    /// Write a seed file (one integer)
    Seed(SeedArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    /// Delays in nanoseconds (the injector's tables)
    Absolute,
    /// tc netem's normalized form (mean 0, sd 8192), mu and sigma given at use
    Netem,
}

impl FormatArg {
    fn kind(self) -> Kind {
        match self {
            FormatArg::Absolute => Kind::Absolute,
            FormatArg::Netem => Kind::Netem,
        }
    }
}

#[derive(Args)]
struct OutputArgs {
    /// Write the table here (default: standard output)
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Kind of table to write
    #[arg(long, value_enum, default_value = "absolute")]
    format: FormatArg,
    /// Write an absolute table even when its mean is more than 5 % or its sd more than 10 %
    /// from the distribution's (a tail too far for 4096 quantiles, or rounding to whole ns);
    /// without it such a table is refused (exit 1), with the achieved and asked mean and sd
    #[arg(long)]
    allow_approx: bool,
}

#[derive(Args)]
struct LognormalArgs {
    /// Shape: sd of log(x - loc)
    #[arg(long, conflicts_with_all = ["mean", "sd"])]
    shape: Option<f64>,
    /// Scale: exp(mean of log(x - loc)), e.g. 2us
    #[arg(long, conflicts_with_all = ["mean", "sd"])]
    scale: Option<Duration>,
    /// Mean, e.g. 12us (with --sd)
    #[arg(long)]
    mean: Option<Duration>,
    /// Standard deviation (with --mean)
    #[arg(long)]
    sd: Option<Duration>,
    /// Location shift (may be negative: `--loc -1us`)
    #[arg(long, default_value = "0ns", allow_hyphen_values = true)]
    loc: Duration,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct UniformArgs {
    #[arg(long)]
    mean: Duration,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct ConstantArgs {
    #[arg(long)]
    value: Duration,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct NetemDistArgs {
    /// netem's mu (absolute tables only; netem tables take it at use)
    #[arg(long, allow_hyphen_values = true)]
    mu: Option<Duration>,
    /// netem's sigma (absolute tables only)
    #[arg(long)]
    sigma: Option<Duration>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct ExponentialArgs {
    #[arg(long)]
    mean: Duration,
    /// Location shift (may be negative: `--loc -1us`)
    #[arg(long, default_value = "0ns", allow_hyphen_values = true)]
    loc: Duration,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct SamplesArgs {
    /// Latency samples: numbers (one per line or whitespace separated), a perftest -H dump, or
    /// an HdrHistogram interval log (ibjitter run's latency output)
    #[arg(long, value_name = "FILE")]
    samples: PathBuf,
    /// Unit of the numbers (perftest dumps and '# unit: us' headers name their own)
    #[arg(long)]
    unit: Option<Unit>,
}

#[derive(Args)]
struct EmpiricalArgs {
    #[command(flatten)]
    samples: SamplesArgs,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct FitArgs {
    #[command(flatten)]
    samples: SamplesArgs,
    /// Also write the fitted lognormal's table here
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "absolute")]
    format: FormatArg,
    /// Print the fit as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct FamilyArgs {
    /// Fit the base lognormal to these samples
    #[arg(long, value_name = "FILE", conflicts_with_all = ["shape", "scale"])]
    from: Option<PathBuf>,
    #[arg(long)]
    unit: Option<Unit>,
    /// Base lognormal shape (instead of --from)
    #[arg(long, requires = "scale")]
    shape: Option<f64>,
    /// Base lognormal scale
    #[arg(long, requires = "shape")]
    scale: Option<Duration>,
    /// Base lognormal location
    #[arg(
        long,
        default_value = "0ns",
        conflicts_with = "from",
        allow_hyphen_values = true
    )]
    loc: Duration,
    /// Fractions of the base scale
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,0.75")]
    fractions: Vec<f64>,
    /// Directory to write the tables to
    #[arg(short, long, value_name = "DIR")]
    output: PathBuf,
    /// File name prefix: PREFIX.dist, PREFIX-scale75.dist, …, PREFIX-uniform.dist
    #[arg(long, default_value = "lognormal")]
    prefix: String,
}

#[derive(Args)]
struct EpisodesArgs {
    /// Latency over time: lines 'TIME LATENCY' (time in seconds; whitespace or comma
    /// separated; '#' comments and one header line allowed), or an HdrHistogram interval log
    /// (ibjitter run --hdr-log), where each interval is one sample: its start time and its
    /// median latency
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// Unit of the latencies [default: ns, or what a '# unit: us' comment names]
    #[arg(long)]
    unit: Option<Unit>,
    /// Directory to write the tables to
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// File name prefix: PREFIX-calm.dist, PREFIX-congested.dist
    #[arg(long, default_value = "episodes")]
    prefix: String,
    /// Print the fit as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsArgs {
    /// A table file, or a name found by resolve_named_dist (normal, pareto, …)
    table: String,
    /// The table is netem-format; with --mu/--sigma, report the delays it stands for
    #[arg(long)]
    netem: bool,
    #[arg(
        long,
        requires = "netem",
        requires = "sigma",
        allow_hyphen_values = true
    )]
    mu: Option<Duration>,
    #[arg(long, requires = "netem", requires = "mu")]
    sigma: Option<Duration>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SeedArgs {
    /// The seed (default: random, below 2^32)
    #[arg(long)]
    value: Option<u64>,
    /// Write here (default: standard output)
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `ibjitter table …`; returns the exit code. Errors print one line to stderr.
pub fn run(args: TableArgs) -> i32 {
    match dispatch(args.command) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("ibjitter table: {e}");
            exit::TABLE_ERROR
        }
    }
}

/// Every output of `cmd` checked before any input is read or any
/// table made, so that a bad path is found first.
fn check_outputs(cmd: &TableCommand) -> Result<(), TableError> {
    let file = |p: &Option<PathBuf>| match p {
        Some(p) => super::output_path::check_writable(p).map_err(TableError::new),
        None => Ok(()),
    };
    // Not created yet: nothing is written when the input is refused.
    let dir = |d: &Path| super::output_path::check_dir_creatable(d).map_err(TableError::new);
    match cmd {
        TableCommand::Lognormal(LognormalArgs { out, .. })
        | TableCommand::Uniform(UniformArgs { out, .. })
        | TableCommand::Constant(ConstantArgs { out, .. })
        | TableCommand::Normal(NetemDistArgs { out, .. })
        | TableCommand::Pareto(NetemDistArgs { out, .. })
        | TableCommand::Paretonormal(NetemDistArgs { out, .. })
        | TableCommand::Exponential(ExponentialArgs { out, .. })
        | TableCommand::Empirical(EmpiricalArgs { out, .. }) => file(&out.output),
        TableCommand::Fit(a) => file(&a.output),
        TableCommand::Seed(a) => file(&a.output),
        TableCommand::Family(a) => dir(&a.output),
        TableCommand::Episodes(a) => dir(&a.out_dir),
        TableCommand::Stats(_) => Ok(()),
    }
}

fn dispatch(cmd: TableCommand) -> Result<(), TableError> {
    check_outputs(&cmd)?;
    match cmd {
        TableCommand::Lognormal(a) => {
            let l = match (a.shape, a.scale, a.mean, a.sd) {
                (Some(shape), Some(scale), None, None) => LogNormal::new(shape, scale.ns, a.loc.ns)?,
                (None, None, Some(mean), Some(sd)) => {
                    LogNormal::from_mean_sd(mean.ns, sd.ns, a.loc.ns)?
                }
                _ => {
                    return Err(TableError::new(
                        "lognormal: expected --shape S --scale D or --mean D --sd D (each with optional --loc D)",
                    ))
                }
            };
            emit_dist(&Dist::LogNormal(l), &a.out)
        }
        TableCommand::Uniform(a) => emit_dist(&Dist::Uniform { mean_ns: a.mean.ns }, &a.out),
        TableCommand::Constant(a) => emit_dist(
            &Dist::Constant {
                value_ns: a.value.ns,
            },
            &a.out,
        ),
        TableCommand::Exponential(a) => emit_dist(
            &Dist::Exponential {
                mean_ns: a.mean.ns,
                loc_ns: a.loc.ns,
            },
            &a.out,
        ),
        TableCommand::Normal(a) => netem_dist("normal", a, |mu_ns, sigma_ns| Dist::Normal {
            mu_ns,
            sigma_ns,
        }),
        TableCommand::Pareto(a) => netem_dist("pareto", a, |mu_ns, sigma_ns| Dist::Pareto {
            mu_ns,
            sigma_ns,
        }),
        TableCommand::Paretonormal(a) => netem_dist("paretonormal", a, |mu_ns, sigma_ns| {
            Dist::ParetoNormal { mu_ns, sigma_ns }
        }),
        TableCommand::Empirical(a) => {
            let s = load_samples(&a.samples)?;
            let d = Dist::empirical(s.values_ns, &a.samples.samples.display().to_string())?;
            emit_dist(&d, &a.out)
        }
        TableCommand::Fit(a) => fit(a),
        TableCommand::Family(a) => run_family(a),
        TableCommand::Episodes(a) => run_episodes(a),
        TableCommand::Stats(a) => stats(a),
        TableCommand::Seed(a) => seed(a),
    }
}

fn netem_dist(
    name: &str,
    a: NetemDistArgs,
    make: impl Fn(f64, f64) -> Dist,
) -> Result<(), TableError> {
    let dist = match (a.out.format, a.mu, a.sigma) {
        (FormatArg::Netem, None, None) => make(0.0, 1.0),
        (FormatArg::Netem, _, _) => {
            return Err(TableError::new(format!(
                "{name} --format netem: a netem table is normalized; mu and sigma are given when it is used (tc … delay MU SIGMA distribution {name}), not here"
            )))
        }
        (FormatArg::Absolute, Some(mu), Some(sigma)) => make(mu.ns, sigma.ns),
        (FormatArg::Absolute, _, _) => {
            return Err(TableError::new(format!(
                "{name}: an absolute table needs --mu D and --sigma D (or use --format netem)"
            )))
        }
    };
    emit_dist(&dist, &a.out)
}

/// Makes and writes the table of `dist`, unless it misses the distribution's mean or sd
/// beyond the tolerances (then refused, or with --allow-approx written with a warning on
/// stderr and in its header).
fn emit_dist(dist: &Dist, out: &OutputArgs) -> Result<(), TableError> {
    let mut table = make_table(dist, out.format.kind())?;
    if let Err(short) = check_moments(dist, &table) {
        if !out.allow_approx {
            return Err(TableError::new(format!(
                "{}: {short}; not written (--allow-approx writes it)",
                dist.describe()
            )));
        }
        eprintln!("ibjitter table: warning: {short}; written as asked (--allow-approx)");
        // Before the summary and made-by lines, which end every header.
        let at = table.comments.len().saturating_sub(2);
        table
            .comments
            .insert(at, format!("approximate (--allow-approx): {short}"));
    }
    emit(&table, &out.output)
}

/// Writes a table to the file, or to standard output.
fn emit(table: &Table, output: &Option<PathBuf>) -> Result<(), TableError> {
    match output {
        Some(path) => write_table(table, path),
        None => stdout_result(table.write(std::io::stdout().lock())),
    }
}

fn write_table(table: &Table, path: &Path) -> Result<(), TableError> {
    // Whole or not at all: a table cut short by a full disk is still a table to netem.
    super::output_path::replace_whole(path, |w| table.write(w)).map_err(TableError::new)
}

fn load_samples(a: &SamplesArgs) -> Result<Samples, TableError> {
    Ok(read_samples(&a.samples, a.unit)?)
}

fn describe_source(s: &Samples, path: &Path) -> String {
    let layout = match s.layout {
        Layout::Plain => "numbers",
        Layout::Perftest => "perftest dump",
        Layout::HdrLog => "HdrHistogram log",
    };
    format!(
        "{} samples from {} ({layout}, {})",
        s.values_ns.len(),
        path.display(),
        s.unit
    )
}

fn print_out(text: &str) -> Result<(), TableError> {
    stdout_result(std::io::stdout().lock().write_all(text.as_bytes()))
}

/// A reader that went away (`| head`) is not an error worth a message.
fn stdout_result(r: std::io::Result<()>) -> Result<(), TableError> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(TableError::new(format!(
            "cannot write to standard output: {e}"
        ))),
        _ => Ok(()),
    }
}

fn fit(a: FitArgs) -> Result<(), TableError> {
    let s = load_samples(&a.samples)?;
    let source = describe_source(&s, &a.samples.samples);
    let f = fit_lognormal(&s.values_ns)?;
    let report = FitReport::new(&f, &s.values_ns, &source);
    if let Some(path) = &a.output {
        let mut table = make_table(&Dist::LogNormal(f.lognormal), a.format.kind())?;
        table.comments.insert(
            2,
            format!(
                "fitted by maximum likelihood to {source}; KS distance {:.5}",
                report.ks_distance
            ),
        );
        write_table(&table, path)?;
    }
    print_out(&if a.json {
        export::json(&report)
    } else {
        export::fit_text(&report)
    })
}

/// A `--prefix` names files inside the output directory: never a path out of it.
fn check_prefix(prefix: &str) -> Result<(), TableError> {
    if prefix.is_empty() || prefix.contains(['/', '\0']) || prefix == ".." {
        return Err(TableError::new(format!(
            "--prefix {prefix:?}: expected a file name (no '/'): the tables go into the output \
             directory"
        )));
    }
    Ok(())
}

/// A file of the family: name, (fraction, lognormal) unless uniform, table.
type FamilyFile<'a> = (String, Option<(f64, LogNormal)>, &'a Table);

fn run_family(a: FamilyArgs) -> Result<(), TableError> {
    let (base, source) = match (&a.from, a.shape, a.scale) {
        (Some(path), None, None) => {
            let s = read_samples(path, a.unit)?;
            let f = fit_lognormal(&s.values_ns)?;
            let src = format!("the lognormal fitted to {}", describe_source(&s, path));
            (f.lognormal, src)
        }
        (None, Some(shape), Some(scale)) => (
            LogNormal::new(shape, scale.ns, a.loc.ns)?,
            "the lognormal given on the command line".to_string(),
        ),
        _ => {
            return Err(TableError::new(
                "family: expected --from FILE or --shape S --scale D [--loc D]",
            ))
        }
    };
    check_prefix(&a.prefix)?;
    let fam = family(&base, &a.fractions, &source)?;
    let mut files: Vec<FamilyFile> = fam
        .members
        .iter()
        .map(|m| {
            (
                member_name(&a.prefix, m.fraction),
                Some((m.fraction, m.lognormal)),
                &m.table,
            )
        })
        .collect();
    files.push((uniform_name(&a.prefix), None, &fam.uniform));
    // Names are the fractions to 1e-6 %: two that round alike would write one file twice.
    for (k, (name, ..)) in files.iter().enumerate() {
        if files[..k].iter().any(|(other, ..)| other == name) {
            return Err(TableError::new(format!(
                "family: two members would both be {name}.dist (--fractions {:?}: the base \
                 is 1.0 and is always made; fractions are named to 0.000001 %): give distinct \
                 fractions",
                a.fractions
            )));
        }
    }
    std::fs::create_dir_all(&a.output)
        .map_err(|e| TableError::new(format!("{}: cannot create: {e}", a.output.display())))?;
    let mut report = FamilyReport {
        base: base.describe(),
        target_mean_ns: fam.target_mean_ns,
        rows: Vec::new(),
    };
    for (name, member, table) in files {
        let path = a.output.join(format!("{name}.dist"));
        write_table(table, &path)?;
        let st = Stats::of_i64(&table.entries);
        report.rows.push(FamilyRow {
            path: path.display().to_string(),
            member,
            mean: st.mean,
            sd: st.sd,
        });
    }
    print_out(&export::family_text(&report))
}

fn run_episodes(a: EpisodesArgs) -> Result<(), TableError> {
    let series = read_series(&a.from, a.unit)?;
    let layout = match series.layout {
        SeriesLayout::Columns => "time and latency columns",
        SeriesLayout::HdrLog => "HdrHistogram log, one median per interval",
    };
    let source = format!(
        "{} samples from {} ({layout}, {})",
        series.points.len(),
        a.from.display(),
        series.unit
    );
    check_prefix(&a.prefix)?;
    let fit = fit_episodes(&series.points)?;
    let tables = fit.tables(&series.points, &source)?;
    std::fs::create_dir_all(&a.out_dir)
        .map_err(|e| TableError::new(format!("{}: cannot create: {e}", a.out_dir.display())))?;
    // The injector takes absolute paths only (ranks may start in other directories).
    let out_dir = std::fs::canonicalize(&a.out_dir)
        .map_err(|e| TableError::new(format!("{}: {e}", a.out_dir.display())))?;
    let paths = table_names(&a.prefix).map(|name| out_dir.join(format!("{name}.dist")));
    let [calm, congested] = paths.each_ref().map(|p| p.display().to_string());
    for p in [&calm, &congested] {
        if p.contains(':') {
            return Err(TableError::new(format!(
                "{p}: {ENV} separates its fields with ':', so a table's path cannot contain one; choose another --out-dir or --prefix"
            )));
        }
    }
    for (table, path) in tables.iter().zip(&paths) {
        write_table(table, path)?;
    }
    let report = EpisodesReport {
        env: format!("{ENV}={}", fit.env_value(&calm, &congested)),
        source,
        fit,
        calm_table: calm,
        congested_table: congested,
    };
    print_out(&if a.json {
        export::json(&report)
    } else {
        export::episodes_text(&report)
    })
}

fn stats(a: StatsArgs) -> Result<(), TableError> {
    let path = if Path::new(&a.table).exists() {
        PathBuf::from(&a.table)
    } else {
        resolve_named_dist(&a.table).ok_or_else(|| {
            TableError::new(format!(
                "{}: no such file, nor a named table in $IBJITTER_DISTRIBUTIONS, distributions/ or iproute2's tc directories",
                a.table
            ))
        })?
    };
    let kind = if a.netem { Kind::Netem } else { Kind::Absolute };
    let table = read(&path, kind).map_err(|e| {
        if !a.netem && e.kind == ErrorKind::Negative {
            TableError::new(format!("{e} (a netem table? pass --netem)"))
        } else {
            e.into()
        }
    })?;
    let (st, unit) = match (a.mu, a.sigma) {
        (Some(mu), Some(sigma)) => (Stats::of_u64(&table.netem_delays_ns(mu.ns, sigma.ns)), "ns"),
        _ if a.netem => (Stats::of_i64(&table.entries), "netem units (8192 = 1 sd)"),
        _ => (Stats::of_i64(&table.entries), "ns"),
    };
    let report = TableStatsReport {
        table: path.display().to_string(),
        unit,
        stats: st,
    };
    print_out(&if a.json {
        export::json(&report)
    } else {
        export::stats_text(&report)
    })
}

fn seed(a: SeedArgs) -> Result<(), TableError> {
    let value = a.value.unwrap_or_else(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS's randomness; no extra dependency needed.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.finish() >> 32
    });
    let text = format!("{value}\n");
    match &a.output {
        Some(path) => super::output_path::replace_whole(path, |w| w.write_all(text.as_bytes()))
            .map_err(TableError::new),
        None => print_out(&text),
    }
}

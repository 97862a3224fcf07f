//! `ibjitter incast`: argument parsing; the driver is `ibjitter::incast`, the report
//! `ibjitter::report::incast`, its files `ibjitter::report::export::incast`.
use super::{exit, units};
use clap::Args;
use ibjitter::gen::server::ServeConfig;
use ibjitter::gen::stats::new_histogram;
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::gen::wire::MAX_FLOWS;
use ibjitter::incast::pattern::{self, Host, Pattern};
use ibjitter::incast::{run_step, IncastConfig};
use ibjitter::report::export::incast as export;
use ibjitter::report::export::pairs as pairs_export;
use ibjitter::report::incast::{Merged, RotationReport, RotationStep, StepStatus, SweepRow};
use ibjitter::report::pairs::PairMatrix;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Everything after -- goes to every sender's `ibjitter run` (e.g. \
-- --op send --size 64K --duration 10s --depth 4).\n\nPatterns: incast (--receiver, --senders: many \
to one); alltoall, permutation, rotating-incast (--hosts: every host sends and receives; host i's \
receiver listens on --port + i). With several receivers (alltoall, permutation) every receiver \
holds its start barrier until all are ready: one start for every flow. A rotating incast runs one \
incast per step (--steps), its sink moving to the next host each step, into DIR/step-K-HOST/. \
Per-pair figures: pairs.csv and the JSON's `pairs` (sender x receiver matrices).\n\nExit status: \
0 every sender ran and every flow completed; 1 a sender failed or died, flows ended with errors, \
or a pair moved nothing (the report says which and why); 2 bad arguments, or a step could not be \
launched (what it launched is stopped, the steps before it written); 130 interrupted (partial \
results written)."
)]
pub struct IncastArgs {
    /// Who sends to whom
    #[arg(long, value_enum, default_value = "incast")]
    pattern: Pattern,
    /// The receiving host, and the address senders connect to if it differs: HOST[:ADDR]
    /// (--pattern incast)
    #[arg(long)]
    receiver: Option<String>,
    /// Sending hosts, comma separated (--pattern incast)
    #[arg(long, value_delimiter = ',')]
    senders: Vec<String>,
    /// Every host of the pattern with its RDMA address: HOST[:ADDR],... (patterns other than
    /// incast)
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Flows (QPs) started by each sender toward each of its receivers (1..=65536)
    #[arg(long, alias = "flows-per-pair", default_value_t = 10)]
    flows_per_sender: u32,
    /// A series of flows-per-sender values, one step each: 10,20,30 (not with rotating-incast)
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<u32>,
    /// Steps of a rotating incast (default: one per host, each host a sink once; at most 10000)
    #[arg(long)]
    steps: Option<usize>,
    /// Seed of the permutation pattern's random pairing
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How to run a command on a host; {host} is replaced (srun, mpirun, ip netns exec fit too)
    #[arg(long, default_value = "ssh {host}")]
    launcher: String,
    /// The ibjitter executable on the hosts (default: this one's path)
    #[arg(long)]
    bin: Option<String>,
    /// TCP port of the receiver's out-of-band exchange (host i of --hosts: this + i)
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// How long a receiver waits for all its senders before starting those that are ready
    #[arg(long, default_value = "60s", value_parser = units::duration)]
    start_timeout: Duration,
    /// Where the merged report, time series and logs go
    #[arg(long, default_value = "incast-out")]
    out: PathBuf,
    /// Also write SVG figures: per-flow throughput over time, latency percentiles
    #[arg(long)]
    plot: bool,
    /// Options for every sender's `ibjitter run`
    #[arg(last = true)]
    run_args: Vec<String>,
}

/// The hosts of the pattern, checked: for an incast the receiver first, then the senders.
fn hosts_of(a: &IncastArgs) -> Result<Vec<Host>, String> {
    let hosts: Vec<Host> = if a.pattern == Pattern::Incast {
        if !a.hosts.is_empty() {
            return Err("--pattern incast takes --receiver and --senders, not --hosts".into());
        }
        let receiver = a
            .receiver
            .as_deref()
            .ok_or("--pattern incast needs --receiver")?;
        if a.senders.is_empty() {
            return Err("--pattern incast needs --senders".into());
        }
        if a.senders.iter().any(|s| s.is_empty()) {
            return Err("empty host name in --senders".into());
        }
        let mut v = vec![Host::parse(receiver).map_err(|e| format!("--receiver {e}"))?];
        v.extend(a.senders.iter().map(|s| Host {
            name: s.clone(),
            addr: s.clone(),
        }));
        v
    } else {
        if a.receiver.is_some() || !a.senders.is_empty() {
            return Err(format!(
                "--pattern {} takes --hosts (every host sends and receives), not --receiver or --senders",
                a.pattern.name()
            ));
        }
        let v = a
            .hosts
            .iter()
            .map(|h| Host::parse(h).map_err(|e| format!("--hosts {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if v.len() < 2 {
            return Err(format!(
                "--pattern {} needs at least 2 --hosts",
                a.pattern.name()
            ));
        }
        v
    };
    let mut names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("host {} is named twice", w[0]));
    }
    if usize::from(a.port) + hosts.len() > usize::from(u16::MAX) + 1 {
        return Err(format!(
            "--port {} + {} hosts runs past port 65535",
            a.port,
            hosts.len()
        ));
    }
    if a.pattern == Pattern::RotatingIncast && !a.sweep.is_empty() {
        return Err("--sweep does not go with --pattern rotating-incast".into());
    }
    if a.steps == Some(0) {
        return Err("--steps must be at least 1".into());
    }
    // Counted before any step or pair is made: a step's pairs, and a rotation's steps, are
    // allocated (and launched) from these.
    let pairs = pattern::pairs_per_step(a.pattern, hosts.len());
    if pairs > pattern::MAX_PAIRS {
        return Err(format!(
            "--pattern {} over {} hosts makes {pairs} pairs in a step, at most {}: each pair is \
             a process launched from here, with a thread reading its report",
            a.pattern.name(),
            hosts.len(),
            pattern::MAX_PAIRS
        ));
    }
    // A receiver takes at most MAX_FLOWS flows from one sender (`run`'s own limit), and the
    // report numbers flows across senders in 32 bits.
    let flows = std::iter::once(("--flows-per-sender", a.flows_per_sender))
        .chain(a.sweep.iter().map(|&n| ("--sweep", n)));
    for (flag, n) in flows {
        if n == 0 || n > MAX_FLOWS {
            return Err(format!(
                "{flag} {n}: must be 1..={MAX_FLOWS}, the flows a receiver takes from one sender"
            ));
        }
        if u64::from(n) * pairs > u64::from(u32::MAX) {
            return Err(format!(
                "{flag} {n} for each of {pairs} pairs makes {} flows in a step, more than a \
                 report numbers (32 bits)",
                u64::from(n) * pairs
            ));
        }
    }
    let steps = a.steps.unwrap_or(hosts.len());
    if a.pattern == Pattern::RotatingIncast && steps > pattern::MAX_STEPS {
        return Err(format!(
            "--steps {steps}{}: at most {}: each step is a whole incast with a directory of its \
             own, and pattern.json keeps a summary of every one",
            if a.steps.is_none() {
                " (one per host)"
            } else {
                ""
            },
            pattern::MAX_STEPS
        ));
    }
    Ok(hosts)
}

pub fn run(a: IncastArgs) -> i32 {
    let bin = match a.bin.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .map(|p| p.display().to_string())
    }) {
        Some(b) => b,
        None => {
            eprintln!("ibjitter incast: cannot tell where ibjitter is: give --bin");
            return exit::SETUP;
        }
    };
    let hosts = match hosts_of(&a) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ibjitter incast: {e}");
            return exit::SETUP;
        }
    };
    let cm = match super::run::uses_cm(&a.run_args) {
        Ok(cm) => cm,
        Err(e) => {
            eprintln!("ibjitter incast: {e}");
            return exit::SETUP;
        }
    };
    // Every step writes into --out, after its traffic: checked before any is launched.
    if let Err(e) = super::output_path::check_dir_creatable(&a.out) {
        eprintln!("ibjitter incast: {e}");
        return exit::SETUP;
    }
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    let cfg = IncastConfig {
        hosts,
        launcher: a.launcher.clone(),
        bin,
        serve: ServeConfig {
            once: true,
            start_timeout: a.start_timeout,
            // Senders connecting through rdma_cm need a receiver that listens for it.
            cm,
            ..ServeConfig::default()
        },
        serve_args: super::serve::to_args,
        port: a.port,
        sender_args: super::run::sender_args,
        run_args: a.run_args.clone(),
    };
    stop::install_signal_handlers();
    let is_pattern = a.pattern != Pattern::Incast;
    if a.pattern == Pattern::RotatingIncast {
        return rotate(&a, &cfg, &names);
    }
    let layout = pattern::layout(a.pattern, names.len(), a.seed, 0);
    let steps = if a.sweep.is_empty() {
        vec![a.flows_per_sender]
    } else {
        a.sweep.clone()
    };
    let mut rows = Vec::new();
    let mut code = exit::OK;
    // Why the sweep stopped before its end, as stderr and sweep.csv say it.
    let mut stopped = None;
    for &n in &steps {
        let dir = if a.sweep.is_empty() {
            a.out.clone()
        } else {
            a.out.join(format!("flows-{n}"))
        };
        let mut step = match run_step(&cfg, &layout, n, &dir, StopToken::process()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ibjitter incast: {e}");
                // What the sweep's steps before measured is still written.
                code = code.max(exit::SETUP);
                rows.push(SweepRow::unrun(n, StepStatus::NotLaunched));
                stopped = Some(format!(
                    "its step of {n} flows per sender could not be launched"
                ));
                break;
            }
        };
        if is_pattern {
            let pairs = PairMatrix::of(&names, &[&step.merged]);
            code = code.max(pairs_out(&pairs, &dir));
            step.merged.report.pattern = Some(a.pattern.name().into());
            step.merged.report.pairs = Some(pairs);
        }
        if let Err(e) = export::step_files(&step.merged, &dir, a.plot) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        let report_path = dir.join("incast.json");
        let _ = export::step_summary(&step.merged.report, &report_path, std::io::stdout().lock());
        if let Some(p) = &step.merged.report.pairs {
            let _ = pairs_export::gbps_table(p, std::io::stdout().lock());
        }
        if !step.clean() {
            code = code.max(exit::PARTLY);
        }
        if step.interrupted {
            rows.push(SweepRow::of(
                n,
                StepStatus::Interrupted,
                &step.merged.report,
            ));
            code = exit::INTERRUPTED;
            stopped = Some(format!(
                "interrupted (Ctrl-C) in its step of {n} flows per sender, whose figures are \
                 partial"
            ));
            break;
        }
        rows.push(SweepRow::of(n, StepStatus::Done, &step.merged.report));
    }
    // The steps after one that stopped the sweep are listed too: the files alone say it.
    let not_run = steps[rows.len()..].iter();
    rows.extend(not_run.map(|&n| SweepRow::unrun(n, StepStatus::NotRun)));
    if let (false, Some(why)) = (a.sweep.is_empty(), &stopped) {
        let done = rows.iter().filter(|r| r.status == StepStatus::Done).count();
        say_stopped("sweep", done, rows.len(), why);
    } else if code == exit::INTERRUPTED {
        // A single incast: its files say it too (incast.json's `stopped`).
        eprintln!(
            "ibjitter incast: {}; written to {}",
            ibjitter::incast::INTERRUPTED,
            a.out.display()
        );
    }
    if !a.sweep.is_empty() && rows.iter().any(|r| r.status.ran()) {
        if let Err(e) = export::sweep_csv(&rows, &a.out.join("sweep.csv")) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        let _ = export::sweep_table(&rows, std::io::stdout().lock());
    }
    code
}

/// Says on stderr that a sweep or a rotation stopped before its end, as its files say it.
fn say_stopped(what: &str, done: usize, asked: usize, why: &str) {
    eprintln!("ibjitter incast: {what} stopped early, {done} of {asked} steps done: {why}");
}

/// Writes pairs.csv into `dir`; says which pairs moved nothing or failed. Its exit status.
fn pairs_out(pairs: &PairMatrix, dir: &std::path::Path) -> i32 {
    let mut code = exit::OK;
    if let Err(e) = pairs_export::pairs_csv(pairs, &dir.join("pairs.csv")) {
        eprintln!("ibjitter incast: {e}");
        code = exit::with_write_failure(code);
    }
    for c in pairs.idle_or_failed() {
        eprintln!(
            "ibjitter incast: pair {} -> {} moved {} bytes ({})",
            c.sender, c.receiver, c.bytes, c.status
        );
        code = code.max(exit::PARTLY);
    }
    code
}

/// A rotating incast: one incast per step into DIR/step-K-SINK, then the pairs of all steps
/// in DIR/pattern.json and DIR/pairs.csv.
fn rotate(a: &IncastArgs, cfg: &IncastConfig, names: &[String]) -> i32 {
    let mut code = exit::OK;
    let mut kept = KeptSteps::default();
    let mut steps = Vec::new();
    let asked = a.steps.unwrap_or(names.len());
    // Why the rotation stopped before its end, and whether its last step was cut short.
    let mut stopped = None;
    let mut cut_short = false;
    for k in 0..asked {
        // Made as it runs: a rotation's steps are many.
        let layout = pattern::layout(a.pattern, names.len(), a.seed, k);
        let sink = &names[layout.receivers()[0]];
        let dir = a.out.join(format!("step-{k}-{}", pattern::file_name(sink)));
        let step = match run_step(cfg, &layout, a.flows_per_sender, &dir, StopToken::process()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ibjitter incast: {e}");
                // What the steps before measured is still written, pattern.json with them.
                code = code.max(exit::SETUP);
                stopped = Some(format!("step {k} (sink {sink}) could not be launched"));
                break;
            }
        };
        if let Err(e) = export::step_files(&step.merged, &dir, a.plot) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        let report_path = dir.join("incast.json");
        let _ = export::step_summary(&step.merged.report, &report_path, std::io::stdout().lock());
        if !step.clean() {
            code = code.max(exit::PARTLY);
        }
        steps.push(RotationStep::of(k, sink, &dir, &step.merged.report));
        let interrupted = step.interrupted;
        kept.push(step.merged);
        if interrupted {
            code = exit::INTERRUPTED;
            stopped = Some(format!(
                "interrupted (Ctrl-C) in step {k} (sink {sink}), whose figures are partial"
            ));
            cut_short = true;
            break;
        }
    }
    let done = steps.len() - usize::from(cut_short);
    if let Some(why) = &stopped {
        say_stopped("rotation", done, asked, why);
    }
    if steps.is_empty() {
        // Its first step could not be launched: nothing to write.
        return code;
    }
    let all: Vec<&_> = kept.steps.iter().collect();
    let pairs = PairMatrix::of(names, &all);
    code = code.max(pairs_out(&pairs, &a.out));
    let report = RotationReport {
        tool: format!("ibjitter {}", ibjitter::VERSION),
        pattern: a.pattern.name().into(),
        steps_asked: asked,
        steps_done: done,
        stopped,
        steps,
        pairs,
    };
    let path = a.out.join("pattern.json");
    if let Err(e) = export::rotation_json(&report, &path) {
        eprintln!("ibjitter incast: {e}");
        code = exit::with_write_failure(code);
    }
    let _ = pairs_export::gbps_table(&report.pairs, std::io::stdout().lock());
    println!("  report: {}", path.display());
    code
}

/// What pattern.json's pair matrix needs of a rotation's past steps, in memory that does not
/// grow with their flows, series or latencies: each step's sender summaries, and each pair's
/// latency added into the histogram of the first step it sent in (the matrix sums a pair's
/// steps, so the sum is the same). A step's own files have all the rest.
#[derive(Default)]
struct KeptSteps {
    steps: Vec<Merged>,
    /// (sender, receiver) -> (step, sender) holding the pair's latency so far.
    first: HashMap<(String, String), (usize, usize)>,
}

impl KeptSteps {
    fn push(&mut self, mut m: Merged) {
        let step = self.steps.len();
        m.report.flows = Vec::new();
        m.latency = new_histogram();
        m.latency_intervals = Vec::new();
        m.series = Vec::new();
        m.ids = Vec::new();
        for (k, s) in m.report.senders.iter().enumerate() {
            let pair = (s.host.clone(), s.receiver.clone());
            let Some(&(i, j)) = self.first.get(&pair) else {
                self.first.insert(pair, (step, k));
                continue;
            };
            if let Some(h) = m.sender_latency.get_mut(k).and_then(Option::take) {
                match &mut self.steps[i].sender_latency[j] {
                    Some(sum) => sum.add(&h).expect("histograms grow to fit"),
                    slot => *slot = Some(h),
                }
            }
        }
        self.steps.push(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibjitter::report::incast::SenderSummary;

    /// A step whose pairs (sender, receiver, latency) each ran one operation.
    fn step(pairs: &[(&str, &str, u64)]) -> Merged {
        let senders = pairs
            .iter()
            .map(|&(s, r, _)| SenderSummary {
                host: s.into(),
                receiver: r.into(),
                status: "ok".into(),
                exit_code: Some(0),
                outcome: None,
                flows_requested: 1,
                flows_started: 1,
                ops: 1,
                bytes: 8,
                gbps: 1.0,
                port_counters: Default::default(),
                stderr_tail: String::new(),
            })
            .collect();
        let none: Vec<_> = pairs.iter().map(|_| None).collect();
        let clocks = ibjitter::incast::clocks::Clocks::of(&[], 0, Default::default());
        let mut m = ibjitter::incast::merge::merge("r", 1, &none, senders, &clocks, 0);
        m.sender_latency = pairs
            .iter()
            .map(|&(_, _, ns)| {
                let mut h = new_histogram();
                h.record(ns).unwrap();
                Some(h)
            })
            .collect();
        m
    }

    #[test]
    fn kept_steps_give_the_pair_matrix_of_the_whole_steps() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).into();
        let steps = || {
            vec![
                step(&[("b", "a", 10), ("c", "a", 20)]),
                step(&[("a", "b", 30), ("c", "b", 40)]),
                step(&[("b", "a", 50), ("c", "a", 60)]),
            ]
        };
        let whole = steps();
        let mut kept = KeptSteps::default();
        for m in steps() {
            kept.push(m);
        }
        assert!(kept.steps.iter().all(|m| m.series.is_empty()));
        assert_eq!(
            PairMatrix::of(&names, &kept.steps.iter().collect::<Vec<_>>()),
            PairMatrix::of(&names, &whole.iter().collect::<Vec<_>>())
        );
    }
}

//! `ibjitter inject`: live control of running processes under libibjitter.so.
use super::units;
use clap::{Args, Subcommand};
use ibjitter::control::{self, Answer, STATE_INJECTING, STATE_PAUSED};
use ibjitter_control::Command;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Each process under libibjitter.so that opened an RDMA device serves \
a control file, /dev/shm/ibjitter.<uid>/<pid> (unless started with IBJITTER_CONTROL=0); its \
shim applies a request within about 10 ms, off the post path.\n\n\
Exit status: 0 every process applied the request; 1 one refused it or could not be reached \
(with --all: a control file left alone, e.g. of another pid namespace or not served); 2 no \
process to address, or the request cannot be sent (too long, a control directory that is not \
the caller's own)."
)]
pub struct InjectArgs {
    #[command(subcommand)]
    command: InjectCommand,
}

/// The processes a request goes to.
#[derive(Args)]
struct Targets {
    /// Process ids
    pids: Vec<u32>,
    /// Every process of this user that serves a control file
    #[arg(long, conflicts_with = "pids")]
    all: bool,
}

#[derive(Subcommand)]
enum InjectCommand {
    /// Each process's state and live counts (sends, delayed, their sum)
    Status(Targets),
    /// A new table from now on (the variables of the launch environment: a table file, a
    /// named netem distribution with delay and jitter, a constant delay; and a probability)
    Set(SetArgs),
    /// Count sends but delay none, until resume
    Pause(Targets),
    /// Delay again after pause
    Resume(Targets),
}

#[derive(Args)]
struct SetArgs {
    /// IBJITTER_TABLE: an absolute table (4096 delays in ns)
    #[arg(long, conflicts_with_all = ["dist", "delay", "jitter"])]
    table: Option<PathBuf>,
    /// IBJITTER_DIST: normal, pareto, paretonormal or a netem .dist file (with --delay)
    #[arg(long)]
    dist: Option<String>,
    /// IBJITTER_DELAY, e.g. 200us
    #[arg(long, value_parser = units::duration)]
    delay: Option<Duration>,
    /// IBJITTER_JITTER
    #[arg(long, value_parser = units::duration)]
    jitter: Option<Duration>,
    /// IBJITTER_PROB: delay a send with this probability
    #[arg(long)]
    prob: Option<f64>,
    #[command(flatten)]
    targets: Targets,
}

impl SetArgs {
    /// The request's `IBJITTER_*=value` lines.
    fn settings(&self) -> Result<String, String> {
        let mut lines = Vec::new();
        if let Some(t) = &self.table {
            let abs = std::fs::canonicalize(t).map_err(|e| format!("{}: {e}", t.display()))?;
            lines.push(format!("IBJITTER_TABLE={}", abs.display()));
        }
        if let Some(d) = &self.dist {
            let p = std::path::Path::new(d);
            // A file is named by its absolute path: the process may run elsewhere.
            let d = if d.contains('/') {
                std::fs::canonicalize(p)
                    .map_err(|e| format!("{d}: {e}"))?
                    .display()
                    .to_string()
            } else {
                d.clone()
            };
            lines.push(format!("IBJITTER_DIST={d}"));
        }
        for (k, v) in [
            ("IBJITTER_DELAY", self.delay),
            ("IBJITTER_JITTER", self.jitter),
        ] {
            if let Some(v) = v {
                lines.push(format!("{k}={}ns", v.as_nanos()));
            }
        }
        if let Some(p) = self.prob {
            lines.push(format!("IBJITTER_PROB={p}"));
        }
        if self.table.is_none() && self.delay.is_none() {
            return Err(
                "set needs a table: --table FILE, or --delay D (with --jitter, --dist)".into(),
            );
        }
        Ok(lines.join("\n"))
    }
}

/// How long a process has to answer (it polls every 10 ms).
const TIMEOUT: Duration = Duration::from_secs(2);

pub fn run(args: InjectArgs) -> i32 {
    let (command, targets, settings) = match &args.command {
        InjectCommand::Status(t) => (Command::Status, t, String::new()),
        InjectCommand::Pause(t) => (Command::Pause, t, String::new()),
        InjectCommand::Resume(t) => (Command::Resume, t, String::new()),
        InjectCommand::Set(s) => match s.settings() {
            Ok(text) => (Command::Set, &s.targets, text),
            Err(e) => {
                eprintln!("ibjitter inject: {e}");
                return 2;
            }
        },
    };
    // Text that does not fit a request is refused here, before any process is addressed.
    if let Err(e) = control::check_text(&settings) {
        eprintln!("ibjitter inject: {e}");
        return 2;
    }
    let found = match control::targets(&targets.pids, targets.all) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ibjitter inject: {e}");
            return 2;
        }
    };
    for pid in &found.removed {
        eprintln!("ibjitter inject: removed the stale control file of {pid} (process gone)");
    }
    for (pid, why) in &found.skipped {
        eprintln!("ibjitter inject: {pid}: {why}");
    }
    let pids = found.live;
    if pids.is_empty() {
        eprintln!(
            "ibjitter inject: no process to address ({})",
            if targets.all {
                "no live control file in /dev/shm/ibjitter.<uid>"
            } else {
                "give PIDs or --all"
            }
        );
        return 2;
    }
    // A file --all could not address is a process the request did not reach.
    let mut failed = !found.skipped.is_empty();
    for pid in pids {
        match control::send(pid, command, &settings, TIMEOUT) {
            Ok(a) => {
                failed |= !a.ok;
                println!("{}", line(&a));
            }
            Err(e) => {
                failed = true;
                eprintln!("ibjitter inject: {pid}: {e}");
            }
        }
    }
    i32::from(failed)
}

/// One process's answer: "4242 injecting: table constant 200000 ns; 1200 sends, 800
/// delayed, 160.000 ms in all (applied after 7.1 ms)".
fn line(a: &Answer) -> String {
    let state = if !a.ok {
        "refused"
    } else if a.state & STATE_PAUSED != 0 {
        "paused"
    } else if a.state & STATE_INJECTING != 0 {
        "injecting"
    } else {
        "pass-through"
    };
    format!(
        "{} {state}: {}; {} sends, {} delayed, {:.3} ms in all (applied after {:.1} ms)",
        a.pid,
        a.text,
        a.posts,
        a.delayed,
        a.sum_ns as f64 / 1e6,
        a.applied_after.as_secs_f64() * 1e3
    )
}

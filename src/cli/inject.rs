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
a control file, /dev/shm/ibjitter.<uid>/<pid>.<pid namespace> (unless started with IBJITTER_CONTROL=0); its \
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
    /// IBJITTER_DELAY, e.g. 200us; a plain number is a loop count, for processes started
    /// with IBJITTER_UNIT=loops
    #[arg(long, value_parser = delay_value)]
    delay: Option<Delay>,
    /// IBJITTER_JITTER (a duration, or a loop count as --delay)
    #[arg(long, value_parser = delay_value)]
    jitter: Option<Delay>,
    /// IBJITTER_PROB: delay a send with this probability
    #[arg(long)]
    prob: Option<f64>,
    #[command(flatten)]
    targets: Targets,
}

/// A `--delay`/`--jitter` value: a duration, or a plain count of busy-wait loops (what a
/// process started with `IBJITTER_UNIT=loops` counts; a process counting ns refuses it and
/// says so).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Delay {
    Time(Duration),
    Loops(u64),
}

fn delay_value(text: &str) -> Result<Delay, String> {
    match text.trim().parse::<u64>() {
        Ok(n) => Ok(Delay::Loops(n)),
        Err(_) => units::duration(text).map(Delay::Time),
    }
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
            match v {
                Some(Delay::Time(t)) => lines.push(format!("{k}={}ns", t.as_nanos())),
                Some(Delay::Loops(n)) => lines.push(format!("{k}={n}")),
                None => {}
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

/// How long a process has to answer (its control thread is woken at once).
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

/// What the shim of a process started with `IBJITTER_UNIT=loops` says after its table
/// (`runtime::live::LOOPS_MARK` in libibjitter.so): its sum counts loops, not ns.
const LOOPS_MARK: &str = " (delays in loops)";

/// One process's answer: "4242 injecting: table constant 200000 ns; 1200 sends, 800
/// delayed, 160.000 ms in all (applied after 7.1 ms)"; with loops, "… 800 delayed, 4000000
/// loops in all …".
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
    let sum = if a.text.contains(LOOPS_MARK) {
        format!("{} loops", a.sum_ns)
    } else {
        format!("{:.3} ms", a.sum_ns as f64 / 1e6)
    };
    format!(
        "{} {state}: {}; {} sends, {} delayed, {sum} in all (applied after {:.1} ms)",
        a.pid,
        a.text,
        a.posts,
        a.delayed,
        a.applied_after.as_secs_f64() * 1e3
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Answer {
        Answer {
            pid: 42,
            ok: true,
            text: text.into(),
            state: STATE_INJECTING,
            posts: 10,
            delayed: 4,
            sum_ns: 20_000,
            applied_after: Duration::from_millis(3),
        }
    }

    #[test]
    fn a_process_counting_loops_is_answered_in_loops() {
        let l = line(&answer("table constant 5000 loops (delays in loops)"));
        assert!(l.contains("4 delayed, 20000 loops in all"), "{l}");
        let ns = line(&answer("table constant 5000 ns"));
        assert!(ns.contains("4 delayed, 0.020 ms in all"), "{ns}");
    }

    #[test]
    fn a_plain_delay_is_a_loop_count_and_a_unit_a_duration() {
        assert_eq!(delay_value("5000"), Ok(Delay::Loops(5000)));
        assert_eq!(
            delay_value("200us"),
            Ok(Delay::Time(Duration::from_micros(200)))
        );
        assert!(delay_value("soon").is_err());
        let set = |delay| SetArgs {
            table: None,
            dist: None,
            delay: Some(delay),
            jitter: None,
            prob: None,
            targets: Targets {
                pids: vec![1],
                all: false,
            },
        };
        assert_eq!(
            set(Delay::Loops(5000)).settings().unwrap(),
            "IBJITTER_DELAY=5000"
        );
        assert_eq!(
            set(Delay::Time(Duration::from_micros(200)))
                .settings()
                .unwrap(),
            "IBJITTER_DELAY=200000ns"
        );
    }
}

//! `ibjitter incast`: one command for a many-to-one incast. Starts `serve` on the receiver and
//! `run` on every sender through the cluster's launcher, all flows of all senders released by
//! one start barrier at the receiver, then merges what every sender measured.
pub mod launcher;
pub mod merge;

use crate::gen::stop::{Reason, StopToken};
use crate::report::incast::{Merged, SenderSummary};
use crate::report::RunReport;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, Clone)]
pub struct IncastConfig {
    /// Where `serve` runs (a name for the launcher).
    pub receiver_host: String,
    /// The address senders connect to (the receiver's address on the RDMA network).
    pub receiver_addr: String,
    pub senders: Vec<String>,
    /// Launcher template; `{host}` is replaced by the host.
    pub launcher: String,
    /// The ibjitter executable, at the same path on every host.
    pub bin: String,
    /// The receiver's `ibjitter serve` arguments (the CLI spells them beside `serve`'s flags).
    pub serve_args: Vec<String>,
    /// The receiver's TCP port (in `serve_args` too).
    pub port: u16,
    /// A sender's `ibjitter run` arguments for (receiver address, port, flows), before
    /// `run_args` (the CLI spells them beside `run`'s flags).
    pub sender_args: fn(&str, u16, u32) -> Vec<String>,
    /// Passed to every `run` as they are (--op, --size, --duration, ...).
    pub run_args: Vec<String>,
}

/// One incast: every sender's outcome and the merged report.
pub struct Step {
    pub merged: Merged,
    pub interrupted: bool,
}

impl Step {
    /// Every sender ran and every flow completed.
    pub fn clean(&self) -> bool {
        self.merged.report.senders.iter().all(|s| s.status == "ok")
            && self.merged.report.flows.iter().all(|f| f.status == "ok")
    }
}

/// Runs one incast of `flows_per_sender` flows from each sender; logs go to `dir`.
/// Runs one incast with `flows_per_sender`, its logs and reports in `dir`. Ctrl-C on `stop`
/// is passed on to every sender (they write what they measured).
pub fn run_step(
    cfg: &IncastConfig,
    flows_per_sender: u32,
    dir: &Path,
    stop: StopToken,
) -> Result<Step, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let log = |name: &str| -> Result<Stdio, String> {
        let path = dir.join(name);
        File::create(&path)
            .map(Stdio::from)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let launch_unix_ns = unix_ns(SystemTime::now());
    let serve_args: Vec<String> = [cfg.bin.clone(), "serve".into()]
        .into_iter()
        .chain(cfg.serve_args.iter().cloned())
        .collect();
    let serve_line = launcher::command_line(&cfg.launcher, &cfg.receiver_host, &serve_args);
    let mut server = launcher::spawn(&serve_line, log("serve.log")?, log("serve.err")?)
        .map_err(|e| format!("cannot launch the receiver ({serve_line}): {e}"))?;

    // Senders: each reports JSON on stdout, read by a thread so a full pipe never blocks it.
    let mut senders: Vec<(
        Option<Child>,
        Option<std::thread::JoinHandle<String>>,
        SenderSummary,
    )> = Vec::new();
    for (k, host) in cfg.senders.iter().enumerate() {
        let args: Vec<String> = [cfg.bin.clone(), "run".into()]
            .into_iter()
            .chain((cfg.sender_args)(
                &cfg.receiver_addr,
                cfg.port,
                flows_per_sender,
            ))
            .chain(cfg.run_args.iter().cloned())
            .collect();
        let line = launcher::command_line(&cfg.launcher, host, &args);
        let summary = SenderSummary {
            host: host.clone(),
            status: "ok".into(),
            exit_code: None,
            outcome: None,
            flows_requested: flows_per_sender,
            flows_started: 0,
            gbps: 0.0,
            port_counters: Default::default(),
            stderr_tail: String::new(),
        };
        let stderr = log(&format!("sender-{k}-{host}.err"))?;
        match launcher::spawn(&line, Stdio::piped(), stderr) {
            Ok(mut child) => {
                let mut out = child.stdout.take().expect("piped stdout");
                let reader = std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = out.read_to_string(&mut s);
                    s
                });
                senders.push((Some(child), Some(reader), summary));
            }
            Err(e) => {
                let status = format!("failed to launch: {e}");
                senders.push((None, None, SenderSummary { status, ..summary }));
            }
        }
    }

    // Wait for the senders; Ctrl-C is passed on to each (they write what they measured).
    let mut forwarded = false;
    loop {
        if stop.requested() == Some(Reason::Interrupted) && !forwarded {
            for child in senders.iter().filter_map(|s| s.0.as_ref()) {
                launcher::signal_group(child, libc::SIGINT);
            }
            forwarded = true;
        }
        let running = senders
            .iter_mut()
            .filter_map(|s| s.0.as_mut())
            .map(|c| matches!(c.try_wait(), Ok(None)))
            .filter(|&alive| alive)
            .count();
        if running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The receiver exits by itself once its senders are done; one that does not is stopped.
    wait_or_stop(&mut server, Duration::from_secs(10));

    let mut reports = Vec::new();
    let mut summaries = Vec::new();
    for (k, (child, reader, mut summary)) in senders.into_iter().enumerate() {
        let stdout = reader
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default();
        if let Some(mut child) = child {
            let code = child.wait().ok().and_then(|s| s.code());
            summary.exit_code = code;
            if code != Some(0) {
                summary.status = match code {
                    Some(c) => format!("exit status {c}"),
                    None => "killed by a signal".into(),
                };
            }
        }
        let report = serde_json::from_str::<RunReport>(&stdout).ok();
        if report.is_none() && summary.status == "ok" {
            summary.status = "no report on stdout".into();
        }
        if summary.status != "ok" {
            let err = dir.join(format!("sender-{k}-{}.err", summary.host));
            summary.stderr_tail = tail(&err, 5);
        }
        reports.push(report);
        summaries.push(summary);
    }
    let receiver = format!("{} ({})", cfg.receiver_host, cfg.receiver_addr);
    let merged = merge::merge(
        &receiver,
        flows_per_sender,
        &reports,
        summaries,
        launch_unix_ns,
    );
    Ok(Step {
        merged,
        interrupted: stop.requested() == Some(Reason::Interrupted),
    })
}

/// Waits up to `grace` for a child, then asks it to stop (SIGTERM), then kills it.
fn wait_or_stop(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    launcher::signal_group(child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    if matches!(child.try_wait(), Ok(None)) {
        launcher::signal_group(child, libc::SIGKILL);
    }
    let _ = child.wait();
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The last `n` lines of a log file, for the report.
fn tail(path: &PathBuf, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

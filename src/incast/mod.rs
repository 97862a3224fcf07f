//! `ibjitter incast`: one command for traffic across hosts. For each step of a
//! [`pattern`] (a many-to-one incast, all-to-all, a permutation, or a rotating incast's
//! sinks) it starts `serve` on every receiver and one `run` per (sender, receiver) pair
//! through the cluster's launcher, all flows released by one start barrier, then merges what
//! every sender measured.
pub mod clocks;
pub mod launcher;
pub mod merge;
pub mod pattern;

use crate::gen::server::{ServeConfig, READY_LINE};
use crate::gen::stop::{Reason, StopToken};
use crate::report::incast::{Merged, SenderSummary};
use crate::report::RunReport;
use clocks::Clocks;
use launcher::Group;
use pattern::{Host, Layout};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, Clone)]
pub struct IncastConfig {
    /// Every host of the pattern, named for the launcher, with its RDMA address.
    pub hosts: Vec<Host>,
    /// Launcher template; `{host}` is replaced by the host.
    pub launcher: String,
    /// The ibjitter executable, at the same path on every host.
    pub bin: String,
    /// Every receiver's `serve` configuration; its port, clients and hold are set per
    /// receiver.
    pub serve: ServeConfig,
    /// The `ibjitter serve` arguments that give a configuration (the CLI spells them beside
    /// `serve`'s flags).
    pub serve_args: fn(&ServeConfig) -> Vec<String>,
    /// The first receiver's TCP port; host i of `hosts` listens on `port + i` (hosts may
    /// share one network namespace, as on the bench).
    pub port: u16,
    /// A sender's `ibjitter run` arguments for (receiver address, port, flows), before
    /// `run_args` (the CLI spells them beside `run`'s flags).
    pub sender_args: fn(&str, u16, u32) -> Vec<String>,
    /// Passed to every `run` as they are (--op, --size, --duration, ...).
    pub run_args: Vec<String>,
}

/// Why a step Ctrl-C stopped says it stopped (incast.json's `stopped`, stderr).
pub const INTERRUPTED: &str =
    "interrupted (Ctrl-C): the senders were stopped and the figures are partial";

/// One step: every pair's outcome and the merged report.
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

/// A receiver's `serve`, and with several receivers what releases it.
struct Receiver {
    group: Group,
    host: String,
    /// Held at its start barrier until we write a line here (several receivers only).
    stdin: Option<ChildStdin>,
    ready: Arc<AtomicBool>,
}

/// A sender: its process group (`None`: it could not be launched), the thread reading its
/// report, and how it fared.
type Sender = (Option<Group>, Option<ReportReader>, SenderSummary);

/// Everything a step launched. Dropped, at the step's end or with any of it still running (an
/// error after some were launched, a panic), it stops them all and reaps them: nothing a step
/// launched outlives it. No leader is reaped before: each group can be signalled until then.
#[derive(Default)]
struct Started {
    receivers: Vec<Receiver>,
    senders: Vec<Sender>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let receivers = self.receivers.iter_mut().map(|r| &mut r.group);
        let senders = self.senders.iter_mut().filter_map(|s| s.0.as_mut());
        stop_all(receivers.chain(senders).collect());
    }
}

/// Runs one step of `layout`: `flows_per_sender` flows for each (sender, receiver) pair, its
/// logs and reports in `dir`. Ctrl-C on `stop` is passed on to every sender (they write what
/// they measured).
pub fn run_step(
    cfg: &IncastConfig,
    layout: &Layout,
    flows_per_sender: u32,
    dir: &Path,
    stop: StopToken,
) -> Result<Step, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let log = |name: &str| -> Result<File, String> {
        let path = dir.join(name);
        File::create(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let launch_unix_ns = unix_ns(SystemTime::now());
    let launched = Instant::now();
    let receivers_of_step = layout.receivers();
    // With several receivers, each holds its start barrier until all are ready: one start.
    let hold = receivers_of_step.len() > 1;
    // From here on, any return stops what was launched (the receivers already started would
    // wait for senders that never come).
    let mut started = Started::default();
    for &r in &receivers_of_step {
        let host = &cfg.hosts[r];
        let args: Vec<String> = [cfg.bin.clone(), "serve".into()]
            .into_iter()
            .chain((cfg.serve_args)(&ServeConfig {
                port: port_of(cfg, r),
                clients: layout.senders_of(r),
                hold,
                ..cfg.serve.clone()
            }))
            .collect();
        let line = launcher::command_line(&cfg.launcher, &host.name, &args);
        let name = if hold {
            format!("serve-{}", pattern::file_name(&host.name))
        } else {
            "serve".into()
        };
        let out = log(&format!("{name}.log"))?;
        let err = log(&format!("{name}.err"))?;
        let stdio = if hold {
            Stdio::piped()
        } else {
            Stdio::from(out.try_clone().map_err(|e| e.to_string())?)
        };
        let stdin = if hold { Stdio::piped() } else { Stdio::null() };
        let mut group = Group::spawn(&line, stdin, stdio, Stdio::from(err))
            .map_err(|e| format!("cannot launch the receiver on {} ({line}): {e}", host.name))?;
        let ready = Arc::new(AtomicBool::new(false));
        if let Some(stdout) = group.take_stdout() {
            watch_ready(stdout, out, ready.clone());
        }
        started.receivers.push(Receiver {
            stdin: group.take_stdin(),
            group,
            host: host.name.clone(),
            ready,
        });
    }

    // Senders: each reports JSON on stdout, read by a thread so a full pipe never blocks it.
    for (k, &(s, d)) in layout.pairs.iter().enumerate() {
        let (host, to) = (&cfg.hosts[s], &cfg.hosts[d]);
        let args: Vec<String> = [cfg.bin.clone(), "run".into()]
            .into_iter()
            .chain((cfg.sender_args)(
                &to.addr,
                port_of(cfg, d),
                flows_per_sender,
            ))
            .chain(cfg.run_args.iter().cloned())
            .collect();
        let line = launcher::command_line(&cfg.launcher, &host.name, &args);
        let summary = SenderSummary {
            host: host.name.clone(),
            receiver: to.name.clone(),
            status: "ok".into(),
            exit_code: None,
            outcome: None,
            flows_requested: flows_per_sender,
            flows_started: 0,
            ops: 0,
            bytes: 0,
            gbps: 0.0,
            port_counters: Default::default(),
            stderr_tail: String::new(),
        };
        let stderr = Stdio::from(log(&sender_log(k, &summary))?);
        match Group::spawn(&line, Stdio::null(), Stdio::piped(), stderr) {
            Ok(mut group) => {
                let mut out = group.take_stdout().expect("piped stdout");
                let reader = std::thread::spawn(move || read_report(&mut out, MAX_REPORT));
                started.senders.push((Some(group), Some(reader), summary));
            }
            Err(e) => {
                let status = format!("failed to launch: {e}");
                started
                    .senders
                    .push((None, None, SenderSummary { status, ..summary }));
            }
        }
    }

    // Wait for the senders: each until its leader has exited and its stdout is closed (what
    // the leader started may still be writing its report). Ctrl-C is passed on to each (they
    // write what they measured). Held receivers are released together once each is ready (or
    // gone).
    let mut forwarded = false;
    loop {
        if stop.requested() == Some(Reason::Interrupted) && !forwarded {
            // To every sender's group, also those whose leader has exited: none is reaped yet,
            // so each id is still its group's.
            for group in started.senders.iter().filter_map(|s| s.0.as_ref()) {
                group.signal(libc::SIGINT);
            }
            forwarded = true;
        }
        release_when_all_ready(&mut started.receivers);
        let running = started
            .senders
            .iter()
            .filter(|(group, reader, _)| {
                group.as_ref().is_some_and(Group::running)
                    || reader.as_ref().is_some_and(|r| !r.is_finished())
            })
            .count();
        if running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Receivers exit by themselves once their senders are done; one that does not is stopped.
    for r in &mut started.receivers {
        r.stdin = None;
        wait_or_stop(&mut r.group, Duration::from_secs(10));
    }

    // Every sender's leader has exited, unreaped: what is left of its group is stopped and it
    // is reaped when `started` is dropped.
    let mut reports = Vec::new();
    let mut summaries = Vec::new();
    for (k, (group, reader, summary)) in started.senders.iter_mut().enumerate() {
        let (stdout, too_large) = reader
            .take()
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default();
        let mut summary = summary.clone();
        if let Some(group) = group {
            let code = group.exited().ok().flatten().and_then(|s| s.code());
            summary.exit_code = code;
            if code != Some(0) {
                summary.status = match code {
                    Some(c) => format!("exit status {c}"),
                    None => "killed by a signal".into(),
                };
            }
        }
        let report = serde_json::from_str::<RunReport>(&stdout).ok();
        if too_large && summary.status == "ok" {
            summary.status = format!(
                "its stdout went past {} MiB: not a report, not read",
                MAX_REPORT >> 20
            );
        } else if report.is_none() && summary.status == "ok" {
            summary.status = "no report on stdout".into();
        }
        if summary.status != "ok" {
            summary.stderr_tail = tail(&dir.join(sender_log(k, &summary)), 5);
        }
        reports.push(report);
        summaries.push(summary);
    }
    let receiver = receivers_of_step
        .iter()
        .map(|&r| format!("{} ({})", cfg.hosts[r].name, cfg.hosts[r].addr))
        .collect::<Vec<_>>()
        .join(", ");
    let starts: Vec<Option<u64>> = reports
        .iter()
        .map(|r| r.as_ref().map(|r| r.start_unix_ns))
        .collect();
    let clocks = Clocks::of(&starts, launch_unix_ns, launched.elapsed());
    for (k, s) in summaries.iter().enumerate() {
        if let Some(off) = clocks.off(k) {
            eprintln!(
                "ibjitter incast: sender {} -> {}: {off}",
                s.host, s.receiver
            );
        }
    }
    if let Some(off) = clocks.common_off() {
        eprintln!("ibjitter incast: {off}");
    }
    let mut merged = merge::merge(
        &receiver,
        flows_per_sender,
        &reports,
        summaries,
        &clocks,
        launch_unix_ns,
    );
    let interrupted = stop.requested() == Some(Reason::Interrupted);
    if interrupted {
        merged.report.stopped = Some(INTERRUPTED.to_string());
    }
    Ok(Step {
        merged,
        interrupted,
    })
}

/// Host i's receiver listens on the base port + i.
fn port_of(cfg: &IncastConfig, host: usize) -> u16 {
    cfg.port.saturating_add(host as u16)
}

/// A sender's stderr log: `sender-K-HOST.err`, K its pair's number in the step (HOST as
/// [`pattern::file_name`] writes it).
fn sender_log(k: usize, s: &SenderSummary) -> String {
    format!("sender-{k}-{}.err", pattern::file_name(&s.host))
}

/// Copies a held receiver's stdout to its log, noting when it says it is ready.
fn watch_ready(stdout: std::process::ChildStdout, mut log: File, ready: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(READY_LINE) {
                ready.store(true, Ordering::Release);
            }
            let _ = writeln!(log, "{line}");
        }
    });
}

/// Once every held receiver is ready or has exited, tells each still waiting to start (one
/// line on its stdin). A no-op for receivers that are not held.
fn release_when_all_ready(receivers: &mut [Receiver]) {
    if receivers.iter().all(|r| r.stdin.is_none()) {
        return;
    }
    let waiting = receivers
        .iter()
        .any(|r| !r.ready.load(Ordering::Acquire) && r.group.running());
    if waiting {
        return;
    }
    for r in receivers.iter_mut() {
        if let Some(mut stdin) = r.stdin.take() {
            if let Err(e) = stdin.write_all(b"go\n") {
                eprintln!("ibjitter incast: cannot release receiver {}: {e}", r.host);
            }
        }
    }
}

/// Stops every group launched, together, and reaps its leader: SIGTERM to each, SIGKILL to
/// each once none runs anything or after a grace (a process of a group that outlived its
/// leader, which a scan of /proc may miss, is killed all the same), then the leaders reaped.
/// Only then: until a leader is reaped its group id is still ours (see [`Group`]), and a
/// group with nothing left in it is only its zombie leader, which signals do not reach.
fn stop_all(mut groups: Vec<&mut Group>) {
    groups.retain(|g| !g.is_reaped());
    for g in &groups {
        g.signal(libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && launcher::any_running(groups.iter().map(|g| &**g)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for g in &mut groups {
        g.kill();
    }
    for g in groups {
        g.reap();
    }
}

/// Waits up to `grace` for a group's leader, then asks the group to stop (SIGTERM), then kills
/// it; [`stop_all`] reaps it.
fn wait_or_stop(group: &mut Group, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !group.running() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    group.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    if group.running() {
        group.kill();
    }
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The thread reading a sender's stdout: [`read_report`]'s answer.
type ReportReader = std::thread::JoinHandle<(String, bool)>;

/// The most of a sender's stdout read: its JSON report, time series included, takes tens of
/// MB for an hour's run of thousands of flows; anything past this is not one.
const MAX_REPORT: u64 = 256 << 20;

/// A sender's stdout, up to `max` bytes, and whether it went past them (the rest is read and
/// dropped, so that the sender never blocks on a full pipe).
fn read_report(out: &mut impl Read, max: u64) -> (String, bool) {
    let mut bytes = Vec::new();
    let _ = out.by_ref().take(max + 1).read_to_end(&mut bytes);
    let too_large = bytes.len() as u64 > max;
    if too_large {
        bytes = Vec::new();
        let _ = std::io::copy(out, &mut std::io::sink());
    }
    (String::from_utf8(bytes).unwrap_or_default(), too_large)
}

/// The last `n` lines of a log file (within its last 64 KiB: a sender's log may be large), for
/// the report.
fn tail(path: &PathBuf, n: usize) -> String {
    use std::io::{Seek, SeekFrom};
    const TAIL_BYTES: u64 = 64 << 10;
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
        let _ = f.take(TAIL_BYTES).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_senders_stdout_is_read_up_to_its_limit_and_drained() {
        let (text, too_large) = read_report(&mut &b"{\"a\": 1}"[..], 16);
        assert_eq!((text.as_str(), too_large), ("{\"a\": 1}", false));
        let mut endless = std::io::repeat(b'x').take(1 << 20);
        let (text, too_large) = read_report(&mut endless, 16);
        assert_eq!((text.as_str(), too_large), ("", true));
        // Drained to its end.
        assert_eq!(endless.limit(), 0);
    }

    #[test]
    fn the_tail_of_a_log_is_its_last_lines() {
        let p = std::env::temp_dir().join(format!("ibjitter-incast-tail-{}", std::process::id()));
        let mut text = "x".repeat(200 << 10);
        text.push_str("\na\nb\nc\n");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(tail(&p, 2), "b\nc");
        let _ = std::fs::remove_file(&p);
    }
}

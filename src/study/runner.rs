//! One run of the program under one configuration: the environment that loads the injector
//! (or nothing, for a clean run), the congestor started before it and stopped after it, the
//! wall time, the metric read from its output, and what the injector reports it delayed.
//! The program runs in a process group of its own, so Ctrl-C and time-outs reach everything
//! it started (an `mpirun`'s ranks too), and only through us.
pub use super::output::last_match;
use super::output::last_match_in_file;
use super::plan::{Configuration, Perturbation, Plan, Slot};
use super::record::Row;
use super::stragglers;
use crate::gen::stop::StopToken;
use crate::incast::launcher::{shell_quote, Group};
use crate::inject_env::InjectorEnv;
use regex::Regex;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What every run of a study shares.
pub struct Runner {
    pub command: Vec<String>,
    /// libibjitter.so.
    pub shim: PathBuf,
    /// Extra `IBJITTER_*` settings for the injector (`--shim-env`).
    pub shim_env: Vec<(String, String)>,
    /// Where each run's output and the injector's stats go (`DIR/runs`).
    pub runs_dir: PathBuf,
    /// This program, to start the congestor (`ibjitter ARGS`).
    pub self_exe: PathBuf,
    pub congestor_settle: Duration,
    pub timeout: Option<Duration>,
    pub metric: Option<Regex>,
    pub tail_metric: Option<Regex>,
    pub stop: StopToken,
    /// This invocation's mark in the stats files' names ([`new_attempt`]).
    pub attempt: String,
}

/// A mark of its own for each invocation of a study (resumes included), in its stats files'
/// names. A study killed while its program is a launcher leaves the ranks it launched
/// running (the launcher gets the study's SIGTERM; they do not): they end later, writing
/// their stats under the index the resumed study runs again. Only the files of this
/// attempt are the re-run's.
pub fn new_attempt() -> String {
    let mut bytes = [0u8; 4];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let mark = if got == bytes.len() as isize {
        u32::from_ne_bytes(bytes)
    } else {
        // No getrandom (a seccomp filter): the time and pid differ between attempts too.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        nanos ^ std::process::id().rotate_left(16)
    };
    format!("a{mark:08x}")
}

/// How long the program's process group gets to exit after SIGINT before SIGKILL.
const GRACE: Duration = Duration::from_secs(3);
/// The congestor's: an incast stops its senders and merges their partial results first.
const CONGESTOR_GRACE: Duration = Duration::from_secs(15);

/// The run was interrupted (Ctrl-C): nothing of it is recorded.
pub struct Interrupted;

impl Runner {
    fn log_path(&self, slot: &Slot, config: &Configuration, what: &str) -> PathBuf {
        self.runs_dir
            .join(format!("{:04}-{}.{what}", slot.index, config.name))
    }

    /// What marks every process of this attempt's runs ([`stragglers`]): a resumed study
    /// finds by it what a killed one left running.
    fn mark(&self) -> String {
        stragglers::mark(&self.attempt, &self.runs_dir)
    }

    /// Stops what an earlier, killed invocation of this study left running on this host
    /// ([`stragglers`]), and says so. Once per study, before its first run.
    pub fn stop_left_running(&self) {
        let done = stragglers::stop_left_running(&self.runs_dir, &self.attempt, stragglers::GRACE);
        for line in done.lines() {
            eprintln!("ibjitter study: {line}");
        }
    }

    /// The start of the names of run `index`'s stats files in this attempt.
    fn stats_prefix(&self, index: usize) -> String {
        format!("{index:04}.stats.{}.", self.attempt)
    }

    /// The injector's stats files of run `index` (`%h.%p`: one per process that loaded it,
    /// on whichever node: ranks of different nodes can have the same pid).
    fn stats_pattern(&self, index: usize) -> PathBuf {
        self.runs_dir
            .join(format!("{}%h.%p.json", self.stats_prefix(index)))
    }

    /// Removes the injector's stats files of run `from` and every later one: none of them is
    /// in the CSV, but a run killed in flight (the study killed with it) may have written
    /// some, and its re-run at the same index would add them to its own counts. Once per
    /// study, before its first run: no cost per run.
    pub fn forget_unrecorded(&self, from: usize) -> Result<(), String> {
        let Ok(entries) = std::fs::read_dir(&self.runs_dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let index = name
                .split_once(".stats.")
                .filter(|_| name.ends_with(".json"))
                .and_then(|(i, _)| i.parse::<usize>().ok());
            if index.is_some_and(|i| i >= from) {
                std::fs::remove_file(e.path())
                    .map_err(|err| format!("{}: {err}", e.path().display()))?;
            }
        }
        Ok(())
    }

    /// Runs the program once; `Err(Interrupted)` when Ctrl-C came during it.
    pub fn run(&self, plan: &Plan, slot: Slot) -> Result<Row, Interrupted> {
        let config = &plan.configurations[slot.config];
        let seed = plan.run_seed(slot.index);
        let (table_mean_us, table_sd_us) = config.perturbation.injected_us();
        let mut row = Row {
            run: slot.index,
            round: slot.round,
            config: config.name.clone(),
            kind: config.perturbation.kind().to_string(),
            warmup: slot.round.is_none(),
            seed,
            ok: false,
            exit: String::new(),
            wall_s: f64::NAN,
            metric: f64::NAN,
            tail_metric: f64::NAN,
            table_mean_us,
            table_sd_us,
            delayed: 0,
            injected_mean_us: f64::NAN,
            note: String::new(),
        };
        let log = self.log_path(&slot, config, "log");

        // The congestor first, given time to reach its steady state.
        let mut congestor = None;
        if let Perturbation::Congestor { args } = &config.perturbation {
            let mut c = match self.start_congestor(&slot, config, args) {
                Ok(c) => c,
                Err(e) => {
                    row.exit = "not started".into();
                    row.note = e;
                    return Ok(row);
                }
            };
            if self.settle().is_err() {
                stop_group(&mut c, CONGESTOR_GRACE);
                return Err(Interrupted);
            }
            if let Ok(Some(status)) = c.exited() {
                c.reap();
                row.exit = "not started".into();
                row.note = format!(
                    "the congestor ended before the program started ({}; see {})",
                    describe(status),
                    self.log_path(&slot, config, "congestor.log").display()
                );
                return Ok(row);
            }
            congestor = Some(c);
        }

        let mut cmd = Command::new(&self.command[0]);
        cmd.args(&self.command[1..])
            .stdin(Stdio::null())
            .env(stragglers::VAR, self.mark());
        match File::create(&log).and_then(|f| Ok((f.try_clone()?, f))) {
            Ok((out, err)) => {
                cmd.stdout(out).stderr(err);
            }
            Err(e) => {
                row.exit = "not started".into();
                row.note = format!("cannot write {}: {e}", log.display());
                return Ok(row);
            }
        }
        // The program leads a process group of its own (Group::start).
        // If the study itself is killed (SIGKILL, a job's end), its run must not outlive it.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        if config.perturbation.injects() {
            let mut env = InjectorEnv::new(self.shim.clone());
            match &config.perturbation {
                Perturbation::Episodes {
                    calm,
                    congested,
                    mean_calm_ns,
                    mean_congested_ns,
                    shared,
                    ..
                } => {
                    env.set(
                        "IBJITTER_EPISODES",
                        format!(
                            "{}:{}:{mean_calm_ns:.0}ns:{mean_congested_ns:.0}ns",
                            calm.display(),
                            congested.display()
                        ),
                    );
                    if *shared {
                        env.set("IBJITTER_EPISODES_SYNC", "1");
                    }
                }
                Perturbation::Table { path, .. } => {
                    env.set("IBJITTER_TABLE", path);
                }
                _ => {}
            }
            env.set("IBJITTER_SEED", seed.to_string())
                // Every rank of an MPI job its own sequence (--shim-env may turn it off).
                .set("IBJITTER_SEED_PER_RANK", "1")
                .set("IBJITTER_STATS", self.stats_pattern(slot.index));
            for (k, v) in &self.shim_env {
                env.set(k.clone(), v);
            }
            env.apply(&mut cmd);
        }
        let started = Instant::now();
        let status = match Group::start(&mut cmd) {
            Ok(mut group) => self.wait(&mut group, started),
            Err(e) => {
                row.exit = "not started".into();
                row.note = format!("cannot start {}: {e}", self.command[0]);
                if let Some(c) = congestor.as_mut() {
                    stop_group(c, CONGESTOR_GRACE);
                }
                return Ok(row);
            }
        };
        let wall = started.elapsed().as_secs_f64();

        // The congestor must have run the whole time; then it is stopped like Ctrl-C would.
        let mut congestor_note = None;
        if let Some(c) = congestor.as_mut() {
            if let Ok(Some(st)) = c.exited() {
                congestor_note = Some(format!(
                    "the congestor ended during the run ({}): not congested throughout",
                    describe(st)
                ));
            }
            stop_group(c, CONGESTOR_GRACE);
        }
        let status = match status {
            Waited::Interrupted => return Err(Interrupted),
            Waited::TimedOut => {
                row.exit = "timeout".into();
                row.note = format!(
                    "killed after {:?} (--timeout); output in {}",
                    self.timeout.unwrap_or_default(),
                    log.display()
                );
                return Ok(row);
            }
            Waited::Exited(s) => s,
        };
        row.wall_s = wall;
        row.exit = describe(status);
        // Read from the log's end, in bounded memory: the output is never held whole.
        row.metric = match &self.metric {
            None => wall,
            Some(re) => last_match_in_file(re, &log),
        };
        if let Some(re) = &self.tail_metric {
            row.tail_metric = last_match_in_file(re, &log);
        }
        // Draws show the injector in place where no delay came out non-zero: under a
        // zero-delay table, or a few sends under a table whose smallest entries are 0.
        let mut draws = 0;
        let mut notes = Vec::new();
        if config.perturbation.injects() {
            let got = injected(&self.runs_dir, &self.stats_prefix(slot.index));
            row.delayed = got.delayed;
            row.injected_mean_us = got.mean_us;
            draws = got.draws;
            if let Some(first) = got.unreadable.first() {
                notes.push(format!(
                    "{} of the injector's stats files could not be read, and the delays \
                     counted leave them out (first: {first})",
                    got.unreadable.len()
                ));
            }
        }
        if !status.success() {
            notes.push(format!("the program failed; output in {}", log.display()));
        } else if !row.metric.is_finite() {
            notes.push(format!(
                "--metric {:?} found no number in the output ({})",
                self.metric.as_ref().map(|r| r.as_str()).unwrap_or(""),
                log.display()
            ));
        }
        if config.perturbation.injects() && row.delayed == 0 && draws == 0 {
            notes.push(
                "the injector drew no delay (does the program send over RDMA, and does its \
                 launcher pass LD_PRELOAD on?)"
                    .to_string(),
            );
        }
        notes.extend(congestor_note);
        row.ok = notes.is_empty();
        row.note = notes.join("; ");
        Ok(row)
    }

    fn start_congestor(
        &self,
        slot: &Slot,
        config: &Configuration,
        args: &str,
    ) -> Result<Group, String> {
        let path = self.log_path(slot, config, "congestor.log");
        let out = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let line = format!(
            "exec {} {args}",
            shell_quote(&self.self_exe.display().to_string())
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&line)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env(stragglers::VAR, self.mark());
        Group::start(&mut cmd).map_err(|e| format!("cannot start the congestor ({line}): {e}"))
    }

    /// Waits the congestor's settling time, watching for Ctrl-C.
    fn settle(&self) -> Result<(), Interrupted> {
        let until = Instant::now() + self.congestor_settle;
        while Instant::now() < until {
            if self.stop.is_set() {
                return Err(Interrupted);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn wait(&self, group: &mut Group, started: Instant) -> Waited {
        loop {
            match group.exited() {
                Ok(Some(status)) => {
                    // What the program left in its group goes on, as it always did.
                    group.reap();
                    return Waited::Exited(status);
                }
                Ok(None) => {}
                Err(_) => return Waited::Exited(ExitStatus::from_raw(1 << 8)),
            }
            if self.stop.is_set() {
                stop_group(group, GRACE);
                return Waited::Interrupted;
            }
            if self.timeout.is_some_and(|t| started.elapsed() > t) {
                stop_group(group, GRACE);
                return Waited::TimedOut;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

enum Waited {
    Exited(ExitStatus),
    Interrupted,
    TimedOut,
}

/// SIGINT to the whole group (what Ctrl-C would do: programs write their partial results),
/// SIGKILL as soon as the leader has ended (to what it left in its group) or after a grace
/// period, and only then the leader reaped: until it is, its pid, the group's id, cannot be
/// another group's ([`Group`]).
fn stop_group(group: &mut Group, grace: Duration) {
    if group.running() {
        group.signal(libc::SIGINT);
        let until = Instant::now() + grace;
        while group.running() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    group.kill();
    group.reap();
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown".into(),
    }
}

/// What the injector reports it did in one run, over every process's stats file.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// Sends delayed (by a non-zero delay).
    pub delayed: u64,
    /// The mean delay drawn, µs (NaN when none was delayed).
    pub mean_us: f64,
    /// Delays drawn, zero ones included.
    pub draws: u64,
    /// Stats files of the run that could not be read or are not whole JSON (a process killed
    /// while writing it, a full disk), and why: the counts above leave them out.
    pub unreadable: Vec<String>,
}

/// What the stats files whose names start with `prefix` (one run's, in one attempt) say was
/// injected.
pub fn injected(runs_dir: &Path, prefix: &str) -> Injected {
    let (mut delayed, mut sum_us, mut draws) = (0u64, 0.0f64, 0u64);
    let mut unreadable = Vec::new();
    let Ok(entries) = std::fs::read_dir(runs_dir) else {
        return Injected {
            delayed: 0,
            mean_us: f64::NAN,
            draws: 0,
            unreadable,
        };
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !(name.starts_with(prefix) && name.ends_with(".json")) {
            continue;
        }
        let text = match crate::table::input::read_text(
            &e.path(),
            "the injector's stats",
            crate::table::input::LIMITS,
        ) {
            Ok(t) => t,
            Err(why) => {
                unreadable.push(format!("{name}: {why}"));
                continue;
            }
        };
        let doc = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(d) => d,
            Err(why) => {
                unreadable.push(format!("{name}: not whole JSON ({why})"));
                continue;
            }
        };
        delayed += doc["delays_injected"].as_u64().unwrap_or(0);
        draws += doc["draws"].as_u64().unwrap_or(0);
        let unit = doc["unit"].as_str().unwrap_or("ns");
        let sum = doc[format!("sum_{unit}")].as_f64().unwrap_or(0.0);
        sum_us += match unit {
            "us" => sum,
            "ms" => sum * 1e3,
            _ => sum / 1e3,
        };
    }
    let mean_us = if delayed > 0 {
        sum_us / delayed as f64
    } else {
        f64::NAN
    };
    unreadable.sort();
    Injected {
        delayed,
        mean_us,
        draws,
        unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_is_the_last_number_matched() {
        let re = Regex::new(r"Loop time of ([0-9.eE+-]+)").unwrap();
        let text = "Loop time of 1.5 on 2 procs\n...\nLoop time of 2.25 on 2 procs\n";
        assert_eq!(last_match(&re, text), 2.25);
        assert!(last_match(&re, "nothing").is_nan());
        let whole = Regex::new(r"[0-9]+\.[0-9]+").unwrap();
        assert_eq!(last_match(&whole, "a 1.5 b 3.5"), 3.5);
    }

    #[test]
    fn the_stats_of_runs_not_in_the_csv_are_forgotten_before_a_study_goes_on() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stats = r#"{"unit":"ns","draws":5,"delays_injected":5,"sum_ns":5000}"#;
        for name in [
            "0006.stats.a1.h.7.json",
            "0007.stats.a1.h.8.json",
            "0012.stats.a1.h.9.json",
        ] {
            std::fs::write(dir.join(name), stats).unwrap();
        }
        std::fs::write(dir.join("0007-clean.log"), "kept").unwrap();
        let runner = Runner {
            command: vec!["true".into()],
            shim: PathBuf::new(),
            shim_env: Vec::new(),
            runs_dir: dir.clone(),
            self_exe: PathBuf::new(),
            congestor_settle: Duration::ZERO,
            timeout: None,
            metric: None,
            tail_metric: None,
            stop: StopToken::new(),
            attempt: "a1".into(),
        };
        // Seven runs recorded: run 7 was in flight when the study was killed.
        runner.forget_unrecorded(7).unwrap();
        let injected = |index| injected(&dir, &runner.stats_prefix(index));
        assert_eq!(injected(6).delayed, 5);
        assert_eq!(injected(7).delayed, 0);
        assert_eq!(injected(12).delayed, 0);
        assert!(dir.join("0007-clean.log").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn injected_sums_every_process_file_of_the_run() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-inj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("0003.stats.a1.h.11.json"),
            r#"{"unit":"ns","draws":12,"delays_injected":10,"sum_ns":50000}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("0003.stats.a1.h.12.json"),
            r#"{"unit":"us","delays_injected":30,"sum_us":150}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("0004.stats.a1.h.13.json"),
            r#"{"unit":"ns","delays_injected":99,"sum_ns":1}"#,
        )
        .unwrap();
        // Another attempt's file of the same run (a rank its killed study left running).
        std::fs::write(
            dir.join("0003.stats.a2.h.11.json"),
            r#"{"unit":"ns","draws":7,"delays_injected":7,"sum_ns":7}"#,
        )
        .unwrap();
        let got = injected(&dir, "0003.stats.a1.");
        assert_eq!((got.delayed, got.draws), (40, 12));
        assert!((got.mean_us - 5.0).abs() < 1e-9, "{got:?}");
        assert!(got.unreadable.is_empty(), "{got:?}");
        assert_eq!(injected(&dir, "0005.stats.a1.").delayed, 0);
        // A file cut short (its process killed while writing it, a full disk) is named.
        std::fs::write(
            dir.join("0003.stats.a1.h.14.json"),
            r#"{"unit":"ns","delays_inj"#,
        )
        .unwrap();
        let got = injected(&dir, "0003.stats.a1.");
        assert_eq!(got.delayed, 40);
        assert_eq!(got.unreadable.len(), 1, "{got:?}");
        assert!(
            got.unreadable[0].starts_with("0003.stats.a1.h.14.json: not whole JSON"),
            "{got:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The processes an earlier, killed invocation of a study left running on this host, stopped
//! before a resumed study's first run.
//!
//! Why: a study SIGKILLed (the OOM killer, `kill -9`, a job's time limit) while its program is
//! a launcher takes the launcher with it (PR_SET_PDEATHSIG), not the ranks the launcher
//! started: they run on, and would compete for the cores with the resumed study's first runs,
//! whose times would then be wrong without a word.
//!
//! How they are known: every process a run starts (program, congestor, and whatever they
//! start, as long as the environment is passed on) carries [`VAR`] = `ATTEMPT:PID:START:DIR`:
//! the invocation's attempt mark, its pid and start time (the invocation itself, not a
//! recycled pid), and the canonical runs directory. One scan of `/proc` reads, for the
//! processes of our own user, their initial environment; one of this study (the same runs
//! directory, compared as the same directory) that is not of this attempt, and whose study no
//! longer runs, is a straggler. A process whose environment cannot be read (another user's,
//! `hidepid`) is not looked at; nor one whose study still runs (the same study started twice:
//! those are said, and left alone). Each straggler is opened as a pidfd, checked again, and
//! signalled through the pidfd (SIGTERM, SIGKILL after the grace): a pid recycled since the
//! scan is never signalled. Without pidfds (Linux < 5.3) its start time is checked again
//! before each signal instead. A process a straggler forks during the scan is missed.
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The variable that marks every process of a study's runs.
pub const VAR: &str = "IBJITTER_STUDY_RUN";

/// How long stragglers get to end after SIGTERM (an injector writes its stats then), and
/// after SIGKILL (a process stuck in the kernel may take a moment).
pub const GRACE: Duration = Duration::from_secs(2);
const AFTER_KILL: Duration = Duration::from_secs(1);

/// A directory as the marks name it: canonical where it can be.
fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| std::path::absolute(dir).unwrap_or(dir.into()))
}

/// This invocation's [`VAR`] value, for every process of its runs.
pub fn mark(attempt: &str, runs_dir: &Path) -> String {
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    format!("{attempt}:{pid}:{start}:{}", canonical(runs_dir).display())
}

/// A [`VAR`] value read back.
#[derive(Debug, PartialEq)]
struct Mark {
    attempt: String,
    study_pid: u32,
    study_start: u64,
    runs_dir: PathBuf,
}

fn parse(value: &str) -> Option<Mark> {
    let mut parts = value.splitn(4, ':');
    let attempt = parts.next()?.to_string();
    let study_pid = parts.next()?.parse().ok()?;
    let study_start = parts.next()?.parse().ok()?;
    let runs_dir = PathBuf::from(parts.next()?);
    (!attempt.is_empty() && runs_dir.is_absolute()).then_some(Mark {
        attempt,
        study_pid,
        study_start,
        runs_dir,
    })
}

/// A process's state and start time (clock ticks after boot), from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state (field 3) … start time (field 22).
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// Whether process `pid`, started at `start`, runs (a zombie has ended).
fn runs(pid: u32, start: u64) -> bool {
    stat(pid).is_some_and(|(state, s)| s == start && !matches!(state, 'Z' | 'X' | 'x'))
}

/// The [`VAR`] value in process `pid`'s initial environment, if it can be read.
fn marked(pid: u32) -> Option<String> {
    let mut environ = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .read_to_end(&mut environ)
        .ok()?;
    let key = format!("{VAR}=");
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(key.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
}

/// A process found by the scan, to be signalled.
struct Straggler {
    pid: u32,
    start: u64,
    /// None: no pidfds here; the start time is checked before each signal.
    pidfd: Option<OwnedFd>,
}

impl Straggler {
    /// Opens `pid` and checks again that it is the process with `value` the scan saw: the
    /// pidfd is opened first, so that while it refers to a live process, `/proc/PID` is that
    /// process. None if it is gone (or another process since).
    fn open(pid: u32, start: u64, value: &str) -> Option<Straggler> {
        // SAFETY: pidfd_open(2) takes a pid and flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = if fd >= 0 {
            // SAFETY: a descriptor pidfd_open just returned, owned by nobody else.
            Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return None;
        } else {
            None // No pidfd_open (ENOSYS, or EPERM from a seccomp filter).
        };
        let s = Straggler { pid, start, pidfd };
        (marked(pid).as_deref() == Some(value) && start_time(pid) == Some(start) && s.runs())
            .then_some(s)
    }

    fn runs(&self) -> bool {
        match &self.pidfd {
            // A pidfd becomes readable when its process ends.
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd, no wait.
                unsafe { libc::poll(&mut p, 1, 0) == 0 }
            }
            None => runs(self.pid, self.start),
        }
    }

    fn signal(&self, signal: i32) {
        match &self.pidfd {
            // SAFETY: pidfd_send_signal(2) on our pidfd, no siginfo, no flags; a process that
            // has ended gives ESRCH.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            None => {
                if runs(self.pid, self.start) {
                    // SAFETY: kill(2) on the pid just seen to be the same process.
                    unsafe {
                        libc::kill(self.pid as libc::pid_t, signal);
                    }
                }
            }
        }
    }
}

/// What [`stop_left_running`] did.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Stragglers stopped (SIGTERM, or SIGKILL after the grace).
    pub stopped: Vec<u32>,
    /// Those of them that needed SIGKILL.
    pub killed: Vec<u32>,
    /// Those still running even after SIGKILL and a second's wait.
    pub survived: Vec<u32>,
    /// Processes of another invocation of this study that still runs (left alone), and that
    /// invocation's pid.
    pub of_live_study: Vec<(u32, u32)>,
}

impl Stopped {
    /// What to say on stderr, one line each.
    pub fn lines(&self) -> Vec<String> {
        let list = |pids: &[u32]| {
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut lines = Vec::new();
        if !self.stopped.is_empty() {
            let n = self.stopped.len();
            let mut line = format!(
                "stopped {n} process{} an earlier, killed invocation of this study left running \
                 on this host (pid{} {}), so that {} not compete with its runs",
                if n == 1 { "" } else { "es" },
                if n == 1 { "" } else { "s" },
                list(&self.stopped),
                if n == 1 { "it does" } else { "they do" },
            );
            if !self.killed.is_empty() {
                line += &format!(
                    "; SIGKILL after {} s of SIGTERM: {}",
                    GRACE.as_secs(),
                    list(&self.killed)
                );
            }
            lines.push(line);
        }
        if !self.survived.is_empty() {
            lines.push(format!(
                "still running after SIGKILL: pid {} (the first runs may share the host with it)",
                list(&self.survived)
            ));
        }
        if let Some((_, study)) = self.of_live_study.first() {
            let pids: Vec<u32> = self.of_live_study.iter().map(|(p, _)| *p).collect();
            lines.push(format!(
                "another invocation of this study (pid {study}) still runs, with its processes \
                 (pid {}): they were left alone; is the study running twice?",
                list(&pids)
            ));
        }
        lines
    }
}

/// Finds, in one scan of `/proc`, the processes of our user that another invocation of the
/// study whose runs go to `runs_dir` left running when it was killed (this invocation is
/// `attempt`), and stops them: SIGTERM, SIGKILL after `grace`.
pub fn stop_left_running(runs_dir: &Path, attempt: &str, grace: Duration) -> Stopped {
    let mut done = Stopped::default();
    let ours = canonical(runs_dir);
    let Ok(ours_meta) = std::fs::metadata(&ours) else {
        return done;
    };
    let same_dir = |dir: &Path| {
        dir == ours
            || std::fs::metadata(dir)
                .is_ok_and(|m| (m.dev(), m.ino()) == (ours_meta.dev(), ours_meta.ino()))
    };
    let me = std::process::id();
    // SAFETY: geteuid(2) cannot fail.
    let uid = unsafe { libc::geteuid() };
    let Some(processes) = crate::incast::launcher::processes() else {
        return done;
    };
    let mut found = Vec::new();
    for (pid, entry) in processes {
        if pid == me || !entry.metadata().is_ok_and(|m| m.uid() == uid) {
            continue;
        }
        let Some(value) = marked(pid) else {
            continue;
        };
        let Some(mark) = parse(&value) else {
            continue;
        };
        if mark.attempt == attempt || !same_dir(&mark.runs_dir) {
            continue;
        }
        if runs(mark.study_pid, mark.study_start) {
            done.of_live_study.push((pid, mark.study_pid));
            continue;
        }
        let Some(start) = start_time(pid) else {
            continue;
        };
        found.extend(Straggler::open(pid, start, &value));
    }
    if found.is_empty() {
        return done;
    }
    for s in &found {
        s.signal(libc::SIGTERM);
    }
    let until = Instant::now() + grace;
    while found.iter().any(Straggler::runs) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in found.iter().filter(|s| s.runs()) {
        s.signal(libc::SIGKILL);
        done.killed.push(s.pid);
    }
    let until = Instant::now() + AFTER_KILL;
    while found.iter().any(Straggler::runs) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in &found {
        if s.runs() {
            done.survived.push(s.pid);
        } else {
            done.stopped.push(s.pid);
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    #[test]
    fn marks_are_read_back() {
        let dir = std::env::temp_dir();
        let m = parse(&mark("a0000002a", &dir)).unwrap();
        assert_eq!(m.attempt, "a0000002a");
        assert_eq!(m.study_pid, std::process::id());
        assert!(runs(m.study_pid, m.study_start));
        assert_eq!(m.runs_dir, std::fs::canonicalize(&dir).unwrap());
        // A directory with colons in its name.
        let m = parse("a1:12:34:/x/a:b/runs").unwrap();
        assert_eq!(m.runs_dir, Path::new("/x/a:b/runs"));
        assert_eq!(parse("a1:12:34:runs"), None);
        assert_eq!(parse("a1:x:34:/runs"), None);
    }

    fn sleeper(script: &str, value: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .env(VAR, value)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Our child, not reaped yet: a zombie counts as ended.
    fn ended(c: &Child) -> bool {
        stat(c.id()).is_none_or(|(state, _)| state == 'Z')
    }

    #[test]
    fn only_the_processes_of_this_study_whose_invocation_is_gone_are_stopped() {
        let base = std::env::temp_dir().join(format!("ibjitter-stragglers-{}", std::process::id()));
        let runs_dir = base.join("st/runs");
        let other = base.join("other/runs");
        std::fs::create_dir_all(&runs_dir).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        // A study that no longer runs: a pid that has ended (or is another process now).
        let mut gone = Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let dead = format!("a00000001:{}:1", gone.id());
        // Named through another spelling of the same directory.
        let spelled = base.join("other/../st/./runs");
        let straggler = sleeper("exec sleep 30", &format!("{dead}:{}", spelled.display()));
        // One that ignores SIGTERM (an ignored signal stays ignored across exec).
        let stubborn = sleeper(
            "trap '' TERM; exec sleep 30",
            &format!("{dead}:{}", runs_dir.display()),
        );
        let of_other_study = sleeper("exec sleep 30", &format!("{dead}:{}", other.display()));
        // This process stands for an invocation that still runs.
        let live = mark("a00000003", &runs_dir);
        let of_live_study = sleeper("exec sleep 30", &live);
        let current = sleeper(
            "exec sleep 30",
            &format!("a00000004:1:1:{}", runs_dir.display()),
        );
        // Their environments are theirs once they have exec'd sleep.
        let t0 = Instant::now();
        let all = [
            &straggler,
            &stubborn,
            &of_other_study,
            &of_live_study,
            &current,
        ];
        while all.iter().any(|c| {
            std::fs::read_link(format!("/proc/{}/exe", c.id()))
                .map_or(true, |p| !p.to_string_lossy().contains("sleep"))
        }) {
            assert!(t0.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(10));
        }
        let done = stop_left_running(&runs_dir, "a00000004", Duration::from_millis(500));
        let mut stopped = done.stopped.clone();
        stopped.sort();
        let mut want = vec![straggler.id(), stubborn.id()];
        want.sort();
        assert_eq!(stopped, want, "{done:?}");
        assert_eq!(done.killed, vec![stubborn.id()], "{done:?}");
        assert!(done.survived.is_empty(), "{done:?}");
        assert_eq!(
            done.of_live_study,
            vec![(of_live_study.id(), std::process::id())]
        );
        assert!(ended(&straggler) && ended(&stubborn));
        assert!(!ended(&of_other_study) && !ended(&of_live_study) && !ended(&current));
        let lines = done.lines();
        assert!(lines[0].starts_with("stopped 2 processes"), "{lines:?}");
        assert!(lines[0].contains(&stubborn.id().to_string()), "{lines:?}");
        for mut c in [straggler, stubborn, of_other_study, of_live_study, current] {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}

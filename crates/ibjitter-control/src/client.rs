//! The client's side (`ibjitter inject`): opening a live process's segment, checked to be
//! this user's own, of this layout, made by that very process and served, then sending it a
//! request ([`send`]) and waiting for its answer.
use crate::clock::monotonic_ns;
use crate::files::{check_dir, dir, kind, maker_gone, path, uid, wake_at, wake_path_of};
use crate::segment::*;
use crate::sweep::listed;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a segment cannot be used.
#[derive(Debug)]
pub enum OpenError {
    /// No such file: the process is not injected, or has not opened a device yet.
    Missing,
    /// The process that made it is gone (or the pid was reused), as this pid namespace
    /// proves: the file is stale.
    Stale,
    /// Not a segment (wrong size or another pid in it): left alone.
    Foreign,
    /// A segment of another layout: another ibjitter version made it (its magic).
    OtherVersion(String),
    /// Not this user's own private directory or file (the reason): never used.
    Unsafe(String),
    /// Made in another pid namespace, or where `/proc` was unreadable (here or there): whether
    /// its process lives cannot be told from here, so it is neither used nor removed.
    Unreachable,
    /// Its process lives but no control thread answers (it exec'd a program without the shim,
    /// or is stopped): the heartbeat has not moved for [`SILENT_POLLS`] polls.
    NotServing,
    Io(std::io::Error),
}

impl OpenError {
    /// The error in words, for the segment of `pid`.
    pub fn describe(&self, pid: u32) -> String {
        self.describe_file(&find(pid), pid)
    }

    /// The error in words, for segment file `p` of `pid`.
    pub fn describe_file(&self, p: &Path, pid: u32) -> String {
        let p = p.display();
        match self {
            OpenError::Missing => format!(
                "no control segment {p}: is {pid} running under libibjitter.so (with \
                 IBJITTER_CONTROL unset or 1), and has it opened an RDMA device yet?"
            ),
            OpenError::Stale => format!("process {pid} is gone (its control file is stale)"),
            OpenError::Foreign => format!("{p} is not a control segment"),
            OpenError::OtherVersion(m) => format!(
                "{p} was made by another ibjitter version (layout {m}; this one reads {}): \
                 use the ibjitter of the libibjitter.so the process runs",
                magic_name(MAGIC)
            ),
            OpenError::Unsafe(why) => {
                format!("{why}: refused (another user could answer for process {pid})")
            }
            OpenError::Unreachable => format!(
                "{p} was made in another pid namespace (a container sharing /dev/shm?) or \
                 without a readable /proc: not reachable from this pid namespace; left alone"
            ),
            OpenError::NotServing => format!(
                "process {pid} has a control file but is not serving it (exec'd without the \
                 shim, or stopped): no heartbeat for at least {} ms",
                SILENT_POLLS * POLL_MS
            ),
            OpenError::Io(e) => format!("{p}: {e}"),
        }
    }
}

/// The client's side: an open segment of a live process that serves it.
pub struct Client {
    pub pid: u32,
    file: File,
    /// The file opened (its wake FIFO is beside it).
    path: PathBuf,
}

/// Opens the segment of `pid` for requests; checks it is this user's own, of this layout,
/// made by that very process (in this pid namespace) and served.
pub fn open(pid: u32) -> Result<Client, OpenError> {
    check_dir(&dir())?;
    open_path(&find(pid), pid)
}

/// The file of `pid` that [`open`] reads: this namespace's; else one of a shim from before
/// namespaced names (`<pid>`, the same layout 03) or of another namespace (unreachable from
/// here, and said so); this namespace's name when there is none.
fn find(pid: u32) -> PathBuf {
    let p = path(pid);
    if std::fs::symlink_metadata(&p).is_ok() {
        return p;
    }
    // By pid, then namespace: a legacy name first.
    listed()
        .into_iter()
        .find(|f| f.pid == pid)
        .map_or(p, |f| f.path)
}

/// [`open`] of the file at `p` (its directory already checked).
pub fn open_path(p: &Path, pid: u32) -> Result<Client, OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        // Never a link; a FIFO put there must not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(OpenError::Unsafe(format!(
                "{} is a symbolic link",
                p.display()
            )))
        }
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    let uid = uid();
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(OpenError::Unsafe(format!(
            "{} is not a private file of uid {uid} (a {}, owner uid {}, mode {:o}; expected \
             a file of uid {uid}, mode 600)",
            p.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut m = [0u8; 8];
    if file.read_exact_at(&mut m, 0).is_err() {
        return Err(OpenError::Foreign);
    }
    if m != MAGIC.to_le_bytes() {
        return Err(if m.starts_with(MAGIC_FAMILY) {
            OpenError::OtherVersion(magic_name(u64::from_le_bytes(m)))
        } else {
            OpenError::Foreign
        });
    }
    let s = match read(&file).map_err(OpenError::Io)? {
        Some(s) if meta.len() == SIZE as u64 && s.pid == u64::from(pid) => s,
        _ => return Err(OpenError::Foreign),
    };
    match maker_gone(&s, pid) {
        Some(false) => {}
        Some(true) => return Err(OpenError::Stale),
        None => return Err(OpenError::Unreachable),
    }
    let c = Client {
        pid,
        file,
        path: p.to_path_buf(),
    };
    if !c.serving(s.heartbeat_ns) {
        return Err(OpenError::NotServing);
    }
    Ok(c)
}

impl Client {
    /// Whether a control thread serves the segment: its heartbeat is recent, or (clocks of
    /// another time namespace, a slow poll) moves within [`SILENT_POLLS`] polls.
    fn serving(&self, beat: u64) -> bool {
        let silent = Duration::from_millis(SILENT_POLLS * POLL_MS);
        if beat != 0 && monotonic_ns().saturating_sub(beat) <= silent.as_nanos() as u64 {
            return true;
        }
        // An idle thread sleeps up to IDLE_WAKE_MS: woken, it stamps at once (woken again
        // every WAKE_AGAIN_MS: a wake-up is never lost, but costs nothing to repeat).
        let t0 = Instant::now();
        let mut woken = None::<Instant>;
        while t0.elapsed() < silent {
            if woken.is_none_or(|w| w.elapsed() >= Duration::from_millis(WAKE_AGAIN_MS)) {
                self.wake();
                woken = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
            match read(&self.file) {
                Ok(Some(s)) if s.heartbeat_ns != beat => return true,
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        false
    }

    /// Wakes the process's control thread through the FIFO beside the file opened.
    fn wake(&self) -> bool {
        wake_at(&wake_path_of(&self.path))
    }

    /// Takes the file's lock without blocking, retrying until `deadline`.
    fn lock(&self, deadline: Instant) -> Result<(), String> {
        loop {
            // SAFETY: flock on our open descriptor; released when the file closes.
            if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(format!("flock {}: {e}", self.path.display()));
            }
            if Instant::now() >= deadline {
                let holder = self
                    .lock_holder()
                    .map_or_else(|| "another process".into(), |h| format!("process {h}"));
                return Err(format!(
                    "the control file of process {} stayed locked by {holder} until the \
                     timeout (another `ibjitter inject` still waiting, or someone holding \
                     its lock); nothing sent",
                    self.pid
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The pid holding an flock on the file, from `/proc/locks` (if it says).
    fn lock_holder(&self) -> Option<u32> {
        let ino = self.file.metadata().ok()?.ino();
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        locks.lines().find_map(|l| {
            // "1: FLOCK  ADVISORY  WRITE 4242 00:1a:12345 0 EOF"
            let f: Vec<&str> = l.split_whitespace().collect();
            let dev_ino = f.get(5)?;
            (f.get(1) == Some(&"FLOCK") && dev_ino.rsplit(':').next()?.parse() == Ok(ino))
                .then(|| f.get(4)?.parse().ok())?
        })
    }
}

/// What one process answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub pid: u32,
    /// The request was applied (else `text` says why not).
    pub ok: bool,
    /// What is injected now, or why the request was refused.
    pub text: String,
    /// [`STATE_INJECTING`], [`STATE_PAUSED`].
    pub state: u32,
    /// Sends that passed a hook, how many were delayed, the delays' sum (ns), at the answer.
    pub posts: u64,
    pub delayed: u64,
    pub sum_ns: u64,
    /// From the request to the moment the process applied it.
    pub applied_after: Duration,
}

/// Sends `command` (with `settings`, `IBJITTER_*=value` lines, for [`Command::Set`]) to
/// `pid` and waits up to `timeout` (the lock's wait included) for its answer.
pub fn send(
    pid: u32,
    command: Command,
    settings: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    let deadline = Instant::now() + timeout;
    check_text(settings)?;
    let c = open(pid).map_err(|e| e.describe(pid))?;
    let io = |e: std::io::Error| format!("{}: {e}", c.path.display());
    // One request at a time per process: concurrent `ibjitter inject` runs take turns.
    c.lock(deadline)?;
    let mut s = Segment::zeroed();
    s.command = command as u32;
    Segment::put(&mut s.text, settings);
    write(&c.file, &s, field!(command)).map_err(io)?;
    write(&c.file, &s, field!(text)).map_err(io)?;
    let now = read(&c.file).map_err(io)?.ok_or_else(|| {
        OpenError::Foreign.describe_file(&c.path, pid) + " (truncated while in use)"
    })?;
    let t0 = monotonic_ns();
    s.request = now.request.wrapping_add(1);
    let request = s.request;
    write(&c.file, &s, field!(request)).map_err(io)?;
    c.wake();
    let mut woken = Instant::now();
    // The heartbeat must keep moving while we wait: a process that stops serving is said at
    // once, not after the whole timeout.
    let (mut beat, mut beat_seen) = (now.heartbeat_ns, Instant::now());
    let silent = Duration::from_millis(2 * SILENT_POLLS * POLL_MS);
    loop {
        let s = read(&c.file).map_err(io)?.ok_or_else(|| {
            OpenError::Foreign.describe_file(&c.path, pid) + " (truncated while in use)"
        })?;
        if s.done == request {
            return Ok(Answer {
                pid,
                ok: s.result == 0,
                text: Segment::get(&s.answer).unwrap_or_default(),
                state: s.state,
                posts: s.posts,
                delayed: s.delayed,
                sum_ns: s.sum_ns,
                applied_after: Duration::from_nanos(s.applied_ns.saturating_sub(t0)),
            });
        }
        if woken.elapsed() >= Duration::from_millis(WAKE_AGAIN_MS) {
            c.wake();
            woken = Instant::now();
        }
        if s.heartbeat_ns != beat {
            (beat, beat_seen) = (s.heartbeat_ns, Instant::now());
        } else if beat_seen.elapsed() > silent {
            return Err(OpenError::NotServing.describe_file(&c.path, pid));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "process {pid} did not answer within {} ms (is its control thread stopped?)",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

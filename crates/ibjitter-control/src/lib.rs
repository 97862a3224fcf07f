//! The live-control segment: one small shared file per injected process,
//! `/dev/shm/ibjitter.<uid>/<pid>`, mapped by `libibjitter.so` (which serves it) and by
//! `ibjitter inject` (which sends it requests). Everything in it is an atomic, so neither
//! side needs a lock to read it; requests from concurrent `ibjitter inject` runs are
//! serialized by an `flock` on the file.
//!
//! A request: the client writes its fields ([`Segment::command`], the settings text), then
//! bumps [`Segment::request`]; the process's control thread (polling every
//! [`POLL_MS`] ms, never on a post path) applies it, writes its answer (result, counts, the
//! state) and sets [`Segment::done`] to the request's number.
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::time::{Duration, Instant};

/// "IBJCTL01".
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBJCTL01");
/// How often the process looks for a request.
pub const POLL_MS: u64 = 10;
/// Bytes of text each way (the settings of a `set`, the answer's message, the table's name).
pub const TEXT: usize = 1024;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Command {
    Status = 1,
    /// New settings: `IBJITTER_*=value` lines in [`Segment::text`].
    Set = 2,
    Pause = 3,
    Resume = 4,
}

impl Command {
    pub fn from_u32(v: u32) -> Option<Command> {
        [
            Command::Status,
            Command::Set,
            Command::Pause,
            Command::Resume,
        ]
        .into_iter()
        .find(|c| *c as u32 == v)
    }
}

/// [`Segment::state`] bits.
pub const STATE_INJECTING: u32 = 1;
pub const STATE_PAUSED: u32 = 2;

/// The shared layout (`repr(C)`, atomics only; both sides are built from this crate).
#[repr(C)]
pub struct Segment {
    pub magic: AtomicU64,
    pub pid: AtomicU64,
    /// The process's start time (`/proc/PID/stat` field 22): a reused pid does not match.
    pub start_time: AtomicU64,
    /// The last request's number (the client bumps it), and the last one applied.
    pub request: AtomicU64,
    pub done: AtomicU64,
    pub command: AtomicU32,
    /// 0: applied; 1: refused (the reason in `answer`).
    pub result: AtomicU32,
    /// [`STATE_INJECTING`], [`STATE_PAUSED`].
    pub state: AtomicU32,
    pub _pad: AtomicU32,
    /// Counts at the answer: sends that passed a hook, delayed ones, their delays' sum (ns).
    pub posts: AtomicU64,
    pub delayed: AtomicU64,
    pub sum_ns: AtomicU64,
    /// When the request was applied (CLOCK_MONOTONIC ns, for the switch latency).
    pub applied_ns: AtomicU64,
    /// The request's text (settings), the answer's text (an error, or the table now in use).
    pub text: [AtomicU8; TEXT],
    pub answer: [AtomicU8; TEXT],
}

/// Size of the file.
pub const SIZE: usize = std::mem::size_of::<Segment>();

impl Segment {
    /// Writes `s` (truncated to fit) into `buf`, NUL-terminated.
    pub fn put(buf: &[AtomicU8; TEXT], s: &str) {
        let b = s.as_bytes();
        let n = b.len().min(TEXT - 1);
        for (slot, &c) in buf.iter().zip(&b[..n]) {
            slot.store(c, Relaxed);
        }
        buf[n].store(0, Release);
    }

    /// The NUL-terminated text in `buf`.
    pub fn get(buf: &[AtomicU8; TEXT]) -> String {
        let bytes: Vec<u8> = buf
            .iter()
            .map(|c| c.load(Acquire))
            .take_while(|&c| c != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The directory of this user's segments.
pub fn dir() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/ibjitter.{uid}"))
}

/// The segment file of `pid`.
pub fn path(pid: u32) -> PathBuf {
    dir().join(pid.to_string())
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot), if readable.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A mapped segment (unmapped on drop; the file stays).
pub struct Mapping {
    ptr: *mut Segment,
    pub file: File,
}

// SAFETY: the mapping holds atomics only.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl std::ops::Deref for Mapping {
    type Target = Segment;
    fn deref(&self) -> &Segment {
        // SAFETY: a live shared mapping of SIZE bytes, atomics only.
        unsafe { &*self.ptr }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping of SIZE bytes.
        unsafe { libc::munmap(self.ptr.cast(), SIZE) };
    }
}

fn map(file: File) -> std::io::Result<Mapping> {
    use std::os::fd::AsRawFd;
    // SAFETY: a shared read-write mapping of a file at least SIZE bytes long.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Mapping {
        ptr: p.cast(),
        file,
    })
}

/// Creates (or replaces) this process's segment, marked with its pid and start time. The
/// directory must be this user's own and private (not a symlink); the file is made under a
/// temporary name without following links and renamed into place once complete, so a
/// reader never sees a half-made segment and nobody else's file is ever written.
pub fn create(pid: u32) -> std::io::Result<(Mapping, PathBuf)> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let d = dir();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&d)?;
    let meta = std::fs::symlink_metadata(&d)?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of uid {uid}",
            d.display()
        )));
    }
    let tmp = d.join(format!("{pid}.new"));
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.set_len(SIZE as u64)?;
    let m = map(file)?;
    m.pid.store(u64::from(pid), Relaxed);
    m.start_time.store(start_time(pid).unwrap_or(0), Relaxed);
    m.magic.store(MAGIC, Release);
    let p = path(pid);
    std::fs::rename(&tmp, &p)?;
    Ok((m, p))
}

/// Why a segment cannot be used.
#[derive(Debug)]
pub enum OpenError {
    /// No such file: the process is not injected, or has not opened a device yet.
    Missing,
    /// The process that made it is gone (or the pid was reused): the file is stale.
    Stale,
    /// Not a segment of this layout (another ibjitter version): left alone.
    Foreign,
    Io(std::io::Error),
}

/// Maps the segment of `pid` for requests; checks the process is the one that made it.
pub fn open(pid: u32) -> Result<Mapping, OpenError> {
    open_path(&path(pid), pid)
}

/// [`open`] of the file at `p`.
pub fn open_path(p: &Path, pid: u32) -> Result<Mapping, OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) => return Err(OpenError::Io(e)),
    };
    if file.metadata().map_err(OpenError::Io)?.len() != SIZE as u64 {
        return Err(OpenError::Foreign);
    }
    let m = map(file).map_err(OpenError::Io)?;
    if m.magic.load(Acquire) != MAGIC || m.pid.load(Acquire) != u64::from(pid) {
        return Err(OpenError::Foreign);
    }
    // Stale only when the process is provably not the one that made it.
    if start_time(pid) != Some(m.start_time.load(Acquire)) {
        return Err(OpenError::Stale);
    }
    Ok(m)
}

/// The pids that have a segment file in [`dir`] (live or stale).
pub fn listed() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dir())
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
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
/// `pid` and waits up to `timeout` for its answer.
pub fn send(
    pid: u32,
    command: Command,
    settings: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    let m = open(pid).map_err(|e| match e {
        OpenError::Missing => format!(
            "no control segment {}: is {pid} running under libibjitter.so (with \
             IBJITTER_CONTROL unset or 1), and has it opened an RDMA device yet?",
            path(pid).display()
        ),
        OpenError::Stale => format!("process {pid} is gone (its control file is stale)"),
        OpenError::Foreign => format!(
            "{} is not a control segment of this ibjitter version",
            path(pid).display()
        ),
        OpenError::Io(e) => format!("{}: {e}", path(pid).display()),
    })?;
    // One request at a time per process: concurrent `ibjitter inject` runs take turns.
    // SAFETY: flock on our open descriptor; released when the file closes.
    if unsafe { libc::flock(m.file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!("flock: {}", std::io::Error::last_os_error()));
    }
    m.command.store(command as u32, Relaxed);
    Segment::put(&m.text, settings);
    let t0 = monotonic_ns();
    let request = m.request.fetch_add(1, AcqRel) + 1;
    let started = Instant::now();
    while m.done.load(Acquire) != request {
        if started.elapsed() > timeout {
            return Err(format!(
                "process {pid} did not answer within {} ms (is its control thread stopped?)",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Answer {
        pid,
        ok: m.result.load(Acquire) == 0,
        text: Segment::get(&m.answer),
        state: m.state.load(Acquire),
        posts: m.posts.load(Acquire),
        delayed: m.delayed.load(Acquire),
        sum_ns: m.sum_ns.load(Acquire),
        applied_after: Duration::from_nanos(m.applied_ns.load(Acquire).saturating_sub(t0)),
    })
}

/// CLOCK_MONOTONIC, the clock the shim stamps `applied_ns` with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_round_trips_text_and_knows_its_process() {
        let me = std::process::id();
        let (m, p) = create(me).unwrap();
        Segment::put(&m.text, "IBJITTER_DELAY=200us");
        assert_eq!(Segment::get(&m.text), "IBJITTER_DELAY=200us");
        let long = "x".repeat(TEXT * 2);
        Segment::put(&m.answer, &long);
        assert_eq!(Segment::get(&m.answer).len(), TEXT - 1);
        let other = open(me).unwrap();
        assert_eq!(other.pid.load(Relaxed), u64::from(me));
        assert!(listed().contains(&me));
        // A segment of a pid that is not running is stale; one that names another pid, or
        // has another size, is foreign (left alone).
        let fake = 4_000_000u32;
        let (_stale, fp) = create(fake).unwrap();
        assert!(matches!(open(fake), Err(OpenError::Stale)));
        std::fs::copy(&p, fp).unwrap();
        assert!(matches!(open(fake), Err(OpenError::Foreign)));
        assert!(matches!(open(4_000_001), Err(OpenError::Missing)));
        let _ = std::fs::remove_file(path(fake));
        let _ = std::fs::remove_file(p);
        assert_eq!(Command::from_u32(2), Some(Command::Set));
        assert_eq!(Command::from_u32(9), None);
    }
}

//! Where the segments live and who made them: this user's private directory in `/dev/shm`,
//! each process's file and wake FIFO by pid and pid namespace, and whether the process that
//! made a segment is still there.
use crate::segment::Segment;
use crate::OpenError;
use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub(crate) fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The directory of this user's segments.
pub fn dir() -> PathBuf {
    // This crate's unit tests make segments for pids that run nothing: in the real directory,
    // any injected process's start (its sweep of files of processes gone) could take them
    // mid-test.
    let name = if cfg!(test) {
        "ibjitter-unit-tests"
    } else {
        "ibjitter"
    };
    PathBuf::from(format!("/dev/shm/{name}.{}", uid()))
}

/// The segment file of `pid` in this pid namespace: `<pid>.<namespace>`, the namespace being
/// the inode of `/proc/self/ns/pid` (0 when `/proc` does not say). Containers that share
/// `/dev/shm` but not a pid namespace (Docker's `--ipc=host`, a rank per container: small
/// pids, pid 1 in each) name their files apart: with the pid alone, the second one's file
/// replaced the first's, whose exit then removed it.
pub fn path(pid: u32) -> PathBuf {
    dir().join(format!("{pid}.{}", pid_ns().unwrap_or(0)))
}

/// The FIFO that wakes the control thread of `pid`.
pub fn wake_path(pid: u32) -> PathBuf {
    wake_path_of(&path(pid))
}

/// The FIFO beside segment file `p`.
pub(crate) fn wake_path_of(p: &Path) -> PathBuf {
    let mut w = p.as_os_str().to_owned();
    w.push(".wake");
    PathBuf::from(w)
}

/// Removes the segment of `pid` and its wake FIFO.
pub fn remove(pid: u32) {
    remove_path(&path(pid));
}

/// Removes segment file `p` and its wake FIFO.
pub fn remove_path(p: &Path) {
    let _ = std::fs::remove_file(p);
    let _ = std::fs::remove_file(wake_path_of(p));
}

/// Wakes the control thread of `pid` (one byte into its FIFO, never blocking): false when
/// nobody reads the FIFO (no such process, one that exec'd, an older shim without one) or it
/// is not a FIFO of this user's. A full FIFO is a wake-up already pending.
pub fn wake(pid: u32) -> bool {
    wake_at(&wake_path(pid))
}

pub(crate) fn wake_at(fifo: &Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let Ok(mut f) = OpenOptions::new()
        .write(true)
        // Never a link; no reader is ENXIO, not a wait.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(fifo)
    else {
        return false;
    };
    match f.metadata() {
        Ok(m) if m.file_type().is_fifo() && m.uid() == uid() => {}
        _ => return false,
    }
    match f.write_all(&[1]) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot), if readable.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_start_time(pid).ok()
}

pub(crate) fn proc_start_time(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let bad = || std::io::Error::other(format!("/proc/{pid}/stat: no start time"));
    let rest = &stat[stat.rfind(')').ok_or_else(bad)? + 1..];
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), if `/proc` says.
pub fn pid_ns() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Checks that `d` is a directory (not a link) of this user, private to it.
pub fn check_dir(d: &Path) -> Result<(), OpenError> {
    let meta = match std::fs::symlink_metadata(d) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) => return Err(OpenError::Io(e)),
    };
    let uid = uid();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(OpenError::Unsafe(format!(
            "{} is not a private directory of uid {uid} (a {}, owner uid {}, mode {:o}; \
             expected a directory of uid {uid}, mode 700)",
            d.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

pub(crate) fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "file"
    } else {
        "special file"
    }
}

/// Whether the process that made segment `s` (of `pid`) is gone, as this pid namespace proves
/// (its pid is no process, or one started at another time); None when this namespace cannot
/// tell (the segment was made in another, or `/proc` does not say).
pub(crate) fn maker_gone(s: &Segment, pid: u32) -> Option<bool> {
    if s.pid_ns == 0 || pid_ns() != Some(s.pid_ns) {
        return None;
    }
    match proc_start_time(pid) {
        Ok(t) => Some(t != s.start_time),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(true),
        Err(_) => None,
    }
}

//! The files of [`dir`] by name, and the sweep that removes those of processes gone (a job
//! cancelled or killed never removes its own).
use crate::files::{dir, maker_gone, pid_ns, uid, wake_path_of};
use crate::segment::*;
use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A segment file in [`dir`] (live or stale).
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub pid: u32,
    /// The pid namespace its name says; None for a file of a shim from before namespaced
    /// names (`<pid>`).
    pub ns: Option<u64>,
    pub path: PathBuf,
}

/// What a file of [`dir`] is, by its name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// `<pid>.<ns>`, or `<pid>` (before namespaced names).
    Segment,
    /// `<pid>.<ns>.new`: a segment being made (left by a process that died meanwhile).
    Making,
    /// `<pid>.<ns>.wake`: a segment's wake FIFO.
    Wake,
}

/// The segment files in [`dir`], of every pid namespace, by pid.
pub fn listed() -> Vec<Listed> {
    let mut v: Vec<Listed> = entries()
        .into_iter()
        .filter(|(kind, _)| *kind == Kind::Segment)
        .map(|(_, l)| l)
        .collect();
    v.sort_unstable_by_key(|l| (l.pid, l.ns));
    v
}

/// The files of [`dir`] this crate names, of every kind.
pub(crate) fn entries() -> Vec<(Kind, Listed)> {
    let d = dir();
    std::fs::read_dir(&d)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name();
                    let (kind, pid, ns) = parse_name(name.to_str()?)?;
                    let path = d.join(name);
                    Some((kind, Listed { pid, ns, path }))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `<pid>.<namespace>` (a legacy `<pid>`), and its `.new` and `.wake` files; None for
/// anything else (a legacy `<pid>.wake`: whose namespace it is, its name does not say).
pub(crate) fn parse_name(name: &str) -> Option<(Kind, u32, Option<u64>)> {
    let mut parts = name.split('.');
    let pid = parts.next()?.parse().ok()?;
    let Some(ns) = parts.next() else {
        return Some((Kind::Segment, pid, None));
    };
    let ns = Some(ns.parse().ok()?);
    let kind = match parts.next() {
        None => Kind::Segment,
        Some("new") => Kind::Making,
        Some("wake") => Kind::Wake,
        Some(_) => return None,
    };
    parts.next().is_none().then_some((kind, pid, ns))
}

/// Removes the files of this user's processes that are gone, as this pid namespace proves
/// (at most `limit`, so the cost stays bounded); returns how many. A process that ended by a
/// signal's default action, SIGKILL or `_exit` (a job cancelled, a time limit) never removes
/// its own: without this, such files gathered on a node for ever. Files another pid
/// namespace's name are left at once; one `kill(pid, 0)` tells a live process of this
/// namespace from the rest; a file is removed only when its segment says it was made in this
/// namespace by a process that is not there any more, and only that very file (a process that
/// took the pid meanwhile may have put its own in its place). The directory is not checked
/// here: [`crate::create`] just did.
pub fn remove_stale(limit: usize) -> usize {
    let here = pid_ns().unwrap_or(0);
    let (mut removed, mut opened) = (0, 0);
    for (kind, f) in entries() {
        // Bounded work too: files it cannot remove are opened again at each start.
        if removed >= limit || opened >= limit.saturating_mul(4) {
            break;
        }
        let swept = match kind {
            Kind::Segment => sweep(&f, here),
            Kind::Making | Kind::Wake => sweep_leftover(kind, &f, here),
        };
        match swept {
            Swept::Left => {}
            Swept::Opened => opened += 1,
            Swept::Removed => (opened, removed) = (opened + 1, removed + 1),
        }
    }
    removed
}

/// What the sweep did with one file.
#[derive(Debug, PartialEq)]
pub(crate) enum Swept {
    /// Another namespace's, or its pid is a live process: not even opened.
    Left,
    /// Opened and kept (not a segment whose maker is gone).
    Opened,
    Removed,
}

/// Whether `f` is named in namespace `here` (or by an earlier shim) for a pid that no
/// process of `here` has.
fn gone_here(f: &Listed, here: u64) -> bool {
    if f.ns.is_some_and(|ns| ns != here) {
        return false;
    }
    let Ok(p) = libc::pid_t::try_from(f.pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    p > 0
        && unsafe { libc::kill(p, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Sweeps segment file `f` from pid namespace `here`.
pub(crate) fn sweep(f: &Listed, here: u64) -> Swept {
    if !gone_here(f, here) {
        return Swept::Left;
    }
    let Some(stale) = stale_file(&f.path, f.pid) else {
        return Swept::Opened;
    };
    let same = std::fs::symlink_metadata(&f.path).is_ok_and(|m| m.ino() == stale.ino());
    if same && std::fs::remove_file(&f.path).is_ok() {
        // Its FIFO was made before it: a FIFO changed after it is a new process's, which
        // took the pid and makes its segment now.
        let fifo = wake_path_of(&f.path);
        let changed = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
        let theirs = std::fs::symlink_metadata(&fifo).is_ok_and(|m| changed(&m) > changed(&stale));
        if !theirs {
            let _ = std::fs::remove_file(fifo);
        }
        return Swept::Removed;
    }
    Swept::Opened
}

/// Removes segment file `f` (listed by [`listed`]) if its process is gone, as this pid
/// namespace proves, and it is still the file found stale; whether it did.
pub fn remove_if_stale(f: &Listed) -> bool {
    sweep(f, pid_ns().unwrap_or(0)) == Swept::Removed
}

/// Sweeps a segment's half-made file or wake FIFO `f` (named in a namespace) from `here`:
/// removed when its process is gone here, a FIFO only once its segment is gone too (the
/// segment's sweep takes both). A process that died between making and renaming its
/// segment, or a FIFO whose segment a user removed, left them for ever.
pub(crate) fn sweep_leftover(kind: Kind, f: &Listed, here: u64) -> Swept {
    if f.ns.is_none() || !gone_here(f, here) {
        return Swept::Left;
    }
    if kind == Kind::Wake {
        let segment = f.path.with_extension("");
        if std::fs::symlink_metadata(segment).is_ok() {
            return Swept::Opened;
        }
    }
    match std::fs::remove_file(&f.path) {
        Ok(()) => Swept::Removed,
        Err(_) => Swept::Opened,
    }
}

/// The metadata of file `p` when it is a segment of `pid` (this layout or 02, which keeps its
/// maker's pid, start time and namespace where 03 has them) made in this pid namespace by a
/// process that is gone.
fn stale_file(p: &Path, pid: u32) -> Option<std::fs::Metadata> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != uid() {
        return None;
    }
    let s = read(&f).ok()??;
    let layout = s.magic == MAGIC || s.magic == u64::from_le_bytes(*b"IBJCTL02");
    (layout && s.pid == u64::from(pid) && maker_gone(&s, pid) == Some(true)).then_some(meta)
}

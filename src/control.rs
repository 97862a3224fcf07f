//! `ibjitter inject`'s side of live control: finding the injected processes' segments
//! ([`ibjitter_control`]), sending one a request, and reading its answer. The process's
//! own side (the shim's control thread, woken through its FIFO) applies it at once.
use ibjitter_control::{self as ctl, OpenError};

pub use ibjitter_control::{check_text, send, Answer, Command, STATE_INJECTING, STATE_PAUSED};

/// The processes `--all` addresses, and the files it did not.
#[derive(Debug, Default)]
pub struct Found {
    /// Live processes serving their segment.
    pub live: Vec<u32>,
    /// Stale files removed: their process is gone, as this pid namespace proves.
    pub removed: Vec<u32>,
    /// Files left alone, and why (another pid namespace, not served, another version...).
    pub skipped: Vec<(u32, String)>,
}

/// The processes to address: `pids`, or with `all` every live segment of this user. Stale
/// files are removed only when this pid namespace proves their process gone; every other
/// file that cannot be addressed is named with the reason. An error when the directory is not
/// this user's own and private.
pub fn targets(pids: &[u32], all: bool) -> Result<Found, String> {
    if !all {
        return Ok(Found {
            live: pids.to_vec(),
            ..Found::default()
        });
    }
    match ctl::check_dir(&ctl::dir()) {
        Ok(()) | Err(OpenError::Missing) => {}
        Err(OpenError::Unsafe(why)) => {
            return Err(format!(
                "{why}: refused (another user could answer for your processes)"
            ))
        }
        Err(OpenError::Io(e)) => return Err(format!("{}: {e}", ctl::dir().display())),
        Err(e) => return Err(format!("{}: {e:?}", ctl::dir().display())),
    }
    let mut found = Found::default();
    for f in ctl::listed() {
        match ctl::open_path(&f.path, f.pid) {
            Ok(_) => found.live.push(f.pid),
            // Only the very file found stale (a process that took the pid may have put its
            // own in its place meanwhile).
            Err(OpenError::Stale) if ctl::remove_if_stale(&f) => found.removed.push(f.pid),
            Err(OpenError::Stale) => {}
            Err(OpenError::Missing) => {}
            Err(e) => found.skipped.push((f.pid, e.describe_file(&f.path, f.pid))),
        }
    }
    Ok(found)
}

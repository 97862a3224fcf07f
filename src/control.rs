//! `ibjitter inject`'s side of live control: finding the injected processes' segments
//! ([`ibjitter_control`]), sending one a request, and reading its answer. The process's
//! own side (the shim's control thread) applies it within [`ibjitter_control::POLL_MS`] ms.
use ibjitter_control::{self as ctl, OpenError};

pub use ibjitter_control::{send, Answer, Command, STATE_INJECTING, STATE_PAUSED};

/// The processes to address: `pids`, or with `all` every live segment of this user (stale
/// files of processes that are gone are removed, and named in the second list).
pub fn targets(pids: &[u32], all: bool) -> (Vec<u32>, Vec<u32>) {
    if !all {
        return (pids.to_vec(), Vec::new());
    }
    let (mut live, mut stale) = (Vec::new(), Vec::new());
    for pid in ctl::listed() {
        match ctl::open(pid) {
            Ok(_) => live.push(pid),
            Err(OpenError::Stale) => {
                let _ = std::fs::remove_file(ctl::path(pid));
                stale.push(pid);
            }
            Err(_) => {}
        }
    }
    (live, stale)
}

//! Parent domains made with a thread domain (`ibv_alloc_parent_domain` with `attr.td`): the
//! provider takes no lock on their QPs (mlx5 leaves out the send queue's lock and shares a
//! doorbell between a thread domain's QPs), trusting the program to use them from one
//! thread at a time. The line hands requests over from whichever thread flushes it, so
//! their QPs' posts wait in place instead ([`super::post`]).
//!
//! A fixed table, written when a domain is made or freed and read when a QP's entry is
//! made: never on a post. Past its size (256 domains alive at once) every new QP is taken
//! for a thread domain's from then on, for the process's life (they all wait in place, said
//! once): the safe side.
use crate::abi::verbs::ibv_pd;
use crate::sys::say;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

const SLOTS: usize = 256;
static DOMAINS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// A domain could not be noted: any PD may be one.
static OVERFLOWED: AtomicBool = AtomicBool::new(false);

/// `pd` was made with a thread domain. Noted even if its address is there already: a domain
/// freed by another thread just before this one was made at its address, and not yet
/// forgotten ([`freed`] runs after the real dealloc), must not take the new one's note with
/// it. One note per domain made, one removed per domain freed.
pub fn made(pd: *mut ibv_pd) {
    if pd.is_null() {
        return;
    }
    let key = pd as usize;
    for d in &DOMAINS {
        if d.compare_exchange(0, key, AcqRel, Relaxed).is_ok() {
            return;
        }
    }
    OVERFLOWED.store(true, Release);
    say::warn_once!(
        "IBJITTER_MODE=line: more than 256 parent domains with a thread domain; from now on \
         every new QP's posts wait in place (spin)",
    );
}

/// `pd` is being freed (`ibv_dealloc_pd`): its address may come back as a plain PD.
pub fn freed(pd: *mut ibv_pd) {
    let key = pd as usize;
    if key == 0 {
        return;
    }
    for d in &DOMAINS {
        if d.compare_exchange(key, 0, AcqRel, Relaxed).is_ok() {
            return;
        }
    }
}

/// Whether a QP of `pd` is in a thread domain (or may be).
pub fn holds(pd: *mut ibv_pd) -> bool {
    let key = pd as usize;
    OVERFLOWED.load(Acquire) || (key != 0 && DOMAINS.iter().any(|d| d.load(Acquire) == key))
}

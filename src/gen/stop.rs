//! Why a run stops early: Ctrl-C (SIGINT/SIGTERM) or a lost peer. Workers check [`requested`]
//! between completions; the signal handler only stores to an atomic.
use std::sync::atomic::{AtomicU8, Ordering};

static REASON: AtomicU8 = AtomicU8::new(0);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Interrupted = 1,
    PeerLost = 2,
}

/// Asks every worker to stop posting; the first reason given wins.
pub fn request(reason: Reason) {
    let _ = REASON.compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst);
}

pub fn requested() -> Option<Reason> {
    match REASON.load(Ordering::Relaxed) {
        1 => Some(Reason::Interrupted),
        2 => Some(Reason::PeerLost),
        _ => None,
    }
}

/// Clears the reason (between runs of one process, and in tests).
pub fn reset() {
    REASON.store(0, Ordering::SeqCst);
}

extern "C" fn on_signal(_: libc::c_int) {
    request(Reason::Interrupted);
}

/// Routes SIGINT and SIGTERM to [`request`]: results measured so far are then written.
pub fn install_signal_handlers() {
    // SAFETY: the handler only performs an atomic compare-exchange, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

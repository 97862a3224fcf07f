//! Why a run stops early: Ctrl-C (SIGINT/SIGTERM) or a lost peer. A [`StopToken`] goes to
//! everything that must notice or may ask: the threads' loop checks it between completions,
//! the watcher of the control connection sets it. The process's token is the one the signal
//! handlers set (they only store to an atomic).
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Interrupted = 1,
    PeerLost = 2,
}

/// The process's flag: what SIGINT and SIGTERM set.
static PROCESS: AtomicU8 = AtomicU8::new(0);

/// A shared "stop, and why": copies all see the same flag; the first reason given wins.
#[derive(Debug, Clone, Copy)]
pub struct StopToken(&'static AtomicU8);

impl StopToken {
    /// The token the signal handlers set (after [`install_signal_handlers`]).
    pub fn process() -> StopToken {
        StopToken(&PROCESS)
    }

    /// A token of its own, that no signal sets (tests; a library caller's own runs). Its
    /// few bytes live as long as the process.
    pub fn new() -> StopToken {
        StopToken(Box::leak(Box::new(AtomicU8::new(0))))
    }

    /// Asks everything holding the token to stop; the first reason given wins.
    pub fn request(self, reason: Reason) {
        let _ = self
            .0
            .compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn requested(self) -> Option<Reason> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Reason::Interrupted),
            2 => Some(Reason::PeerLost),
            _ => None,
        }
    }

    /// Whether a stop was asked for, for any reason.
    pub fn is_set(self) -> bool {
        self.requested().is_some()
    }
}

impl Default for StopToken {
    fn default() -> Self {
        StopToken::new()
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    StopToken::process().request(Reason::Interrupted);
}

/// Routes SIGINT and SIGTERM to the process's token: results measured so far are then written.
pub fn install_signal_handlers() {
    // SAFETY: the handler only performs an atomic compare-exchange, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_wins_and_tokens_are_independent() {
        let (a, b) = (StopToken::new(), StopToken::new());
        assert_eq!(a.requested(), None);
        a.request(Reason::PeerLost);
        a.request(Reason::Interrupted);
        assert_eq!(a.requested(), Some(Reason::PeerLost));
        assert!(!b.is_set());
        let copy = a;
        assert!(copy.is_set());
    }
}

//! `IBJITTER_START`/`IBJITTER_STOP`: a thread of the shim opens the window at the start and
//! closes it at the stop ([`crate::state::set_in_window`]); the post path only reads the
//! mode. Started when the process first uses verbs or UCP: programs that never do get no
//! thread. A fork child keeps the mode it was forked with (it has no window thread).
use crate::state;
use crate::sys::{clock, threads};

/// What a process whose window thread cannot start, or cannot sleep, goes without.
const LOST: &str = "IBJITTER_START/IBJITTER_STOP cannot be kept; injection disabled (pass-through)";

/// The window thread cannot sleep or read the clock (a seccomp filter): said, and the
/// window closed.
fn cannot_keep(why: &str) {
    crate::sys::say::warn(&format!("the shim's window thread {why}: {LOST}"));
    state::set_in_window(false);
}

/// Starts the window thread if the settings have a window (at the process's first use,
/// which runs once: [`crate::state::first_use`]).
pub fn start() {
    let Some((start, stop, t0)) = state::window() else {
        return;
    };
    // Sleeps until `ns` after `t0` (CLOCK_MONOTONIC); why the window cannot be kept, if so.
    let until = move |ns: u64| -> Result<(), &'static str> {
        let at = t0.saturating_add(ns);
        loop {
            let now = clock::read_monotonic().map_err(|_| "cannot read CLOCK_MONOTONIC")?;
            if now >= at {
                return Ok(());
            }
            if !threads::nap(at - now) {
                return Err("cannot sleep (clock_nanosleep and poll fail: a seccomp filter?)");
            }
        }
    };
    let kept = threads::spawn_or_say("ibjitter-window", LOST, move || {
        if start > 0 {
            if let Err(why) = until(start) {
                return cannot_keep(why);
            }
            state::set_in_window(true);
        }
        if stop != u64::MAX {
            if let Err(why) = until(stop) {
                return cannot_keep(why);
            }
            state::set_in_window(false);
        }
    });
    if !kept {
        state::set_in_window(false);
    }
}

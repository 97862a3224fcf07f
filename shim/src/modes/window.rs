//! `IBJITTER_START`/`IBJITTER_STOP`: a thread of the shim opens the window at the start and
//! closes it at the stop ([`crate::state::set_in_window`]); the post path only reads the
//! mode. Started when the process first uses verbs or UCP: programs that never do get no
//! thread. A fork child keeps the mode it was forked with (it has no window thread).
use crate::state;
use crate::sys::threads;

/// What a process whose window thread cannot start, or cannot sleep, goes without.
const LOST: &str = "IBJITTER_START/IBJITTER_STOP cannot be kept; injection disabled (pass-through)";

fn cannot_sleep() {
    crate::sys::say::warn(&format!(
        "the shim's window thread cannot sleep (clock_nanosleep and poll fail: a seccomp \
         filter?): {LOST}"
    ));
    state::set_in_window(false);
}

/// Starts the window thread if the settings have a window (at the process's first use,
/// which runs once: [`crate::state::first_use`]).
pub fn start() {
    let Some((start, stop, t0)) = state::window() else {
        return;
    };
    // False when the thread cannot sleep (a seccomp filter): the window cannot be kept.
    let until = move |ns: u64| {
        let at = t0 + std::time::Duration::from_nanos(ns);
        let now = std::time::Instant::now();
        at <= now || threads::nap((at - now).as_nanos().min(u64::MAX as u128) as u64)
    };
    let kept = threads::spawn_or_say("ibjitter-window", LOST, move || {
        if start > 0 {
            if !until(start) {
                return cannot_sleep();
            }
            state::set_in_window(true);
        }
        if stop != u64::MAX {
            if !until(stop) {
                return cannot_sleep();
            }
            state::set_in_window(false);
        }
    });
    if !kept {
        state::set_in_window(false);
    }
}

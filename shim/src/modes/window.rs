//! `IBJITTER_START`/`IBJITTER_STOP`: a thread of the shim opens the window at the start and
//! closes it at the stop ([`crate::state::set_in_window`]); the post path only reads the
//! mode. Started when the process first uses verbs or UCP: programs that never do get no
//! thread. A fork child keeps the mode it was forked with (it has no window thread).
use crate::state;
use crate::sys::threads;

/// Starts the window thread if the settings have a window (at the process's first use,
/// which runs once: [`crate::state::first_use`]).
pub fn start() {
    let Some((start, stop, t0)) = state::window() else {
        return;
    };
    let until = move |ns: u64| {
        let at = t0 + std::time::Duration::from_nanos(ns);
        let now = std::time::Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
    };
    let kept = threads::spawn_or_say(
        "ibjitter-window",
        "IBJITTER_START/IBJITTER_STOP cannot be kept; injection disabled (pass-through)",
        move || {
            if start > 0 {
                until(start);
                state::set_in_window(true);
            }
            if stop != u64::MAX {
                until(stop);
                state::set_in_window(false);
            }
        },
    );
    if !kept {
        state::set_in_window(false);
    }
}

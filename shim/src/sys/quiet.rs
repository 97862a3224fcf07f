//! Writes that raise no signal: `write(2)` sends SIGPIPE for a pipe whose reader is gone and
//! SIGXFSZ past `ulimit -f`, whose default actions kill the process. The shim writes to
//! stderr and its output files inside other people's programs, which asked for neither.
use std::ffi::c_int;

/// Runs `f` with `sig` blocked in this thread. `f` says, through its flag, whether its write
/// failed with the errno that comes with `sig` (`EPIPE`, `EFBIG`): then the `sig` that write
/// raised is taken back before the mask is restored, unless one was pending before (the
/// program's, which it gets as it would have). A `sig` sent meanwhile by someone else, with
/// the write succeeding, stays pending for the program. Async-signal-safe: mask and
/// pending-set calls and a zero-timeout `sigtimedwait` (which takes a thread-directed signal,
/// the write's, before a process-directed one), no allocation.
pub fn without<T>(sig: c_int, f: impl FnOnce(&mut bool) -> T) -> T {
    // SAFETY: signal-set and mask calls on local sets.
    unsafe {
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &one, &mut old);
        let was_pending = pending(sig);
        let mut raised = false;
        let r = f(&mut raised);
        let errno = *libc::__errno_location();
        if raised && !was_pending && pending(sig) {
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&one, std::ptr::null_mut(), &now);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        *libc::__errno_location() = errno;
        r
    }
}

/// Whether `sig` is pending for this thread or the process.
fn pending(sig: c_int) -> bool {
    // SAFETY: a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set);
        libc::sigismember(&set, sig) == 1
    }
}

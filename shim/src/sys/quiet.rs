//! Writes that raise no signal: `write(2)` sends SIGPIPE for a pipe whose reader is gone and
//! SIGXFSZ past `ulimit -f`, whose default actions kill the process. The shim writes to
//! stderr and its output files inside other people's programs, which asked for neither.
use std::ffi::c_int;

/// Runs `f` with `sig` blocked in this thread; a `sig` that became pending meanwhile (the
/// write's own, not one pending before) is taken back before the mask is restored, so the
/// write fails with its errno (`EPIPE`, `EFBIG`) instead. Async-signal-safe: mask and
/// pending-set calls and a zero-timeout `sigtimedwait`, no allocation.
pub fn without<T>(sig: c_int, f: impl FnOnce() -> T) -> T {
    // SAFETY: signal-set and mask calls on local sets.
    unsafe {
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &one, &mut old);
        let was_pending = pending(sig);
        let r = f();
        let errno = *libc::__errno_location();
        if !was_pending && pending(sig) {
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

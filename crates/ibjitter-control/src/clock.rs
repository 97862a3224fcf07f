//! The clock of the heartbeat and answers, and a sleep that never panics.

/// Sleeps `ns` (CLOCK_MONOTONIC), resuming after a signal; false, at once, when no sleep can
/// be had. The injector's threads sleep through this, never `std::thread::sleep`, which
/// panics on any error but EINTR: under a seccomp filter that denies `clock_nanosleep`, their
/// sleeps fall back to `ppoll`, then `poll` (whole milliseconds), with no descriptors, then
/// a timed futex wait, and where all fail their caller must stop rather than spin a core.
pub fn nap(ns: u64) -> bool {
    let mut ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        let mut rest = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid timespecs; clock_nanosleep returns its error rather than set errno.
        match unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, &mut rest) } {
            0 => return true,
            libc::EINTR => ts = rest,
            _ => break,
        }
    }
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: no descriptors, a valid timeout, no signal mask change.
        if unsafe { libc::ppoll(std::ptr::null_mut(), 0, &ts, std::ptr::null()) } >= 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    let ms = ns.div_ceil(1_000_000).min(i32::MAX as u64) as libc::c_int;
    loop {
        // SAFETY: no descriptors: a plain timed sleep.
        if unsafe { libc::poll(std::ptr::null_mut(), 0, ms) } >= 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    // Last, a futex wait that nobody wakes: every threaded program needs futex, so a sandbox
    // that refuses all the rest still allows it.
    let word = std::sync::atomic::AtomicU32::new(0);
    // SAFETY: a private futex wait on a live word of ours, with a valid relative timeout.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &ts as *const libc::timespec,
        )
    };
    rc == 0
        || matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ETIMEDOUT | libc::EINTR)
        )
}

/// CLOCK_MONOTONIC, the clock of `applied_ns` and the heartbeat.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

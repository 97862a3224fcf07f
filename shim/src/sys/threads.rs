//! The shim's own threads (the delay line's timer, live control, the injection window, the
//! episodes' switch). Each starts with every signal blocked: a signal sent to the process
//! (`kill`, Ctrl-C, a batch system's SIGTERM) goes to one of the program's threads that does
//! not block it. A shim thread taking it would run the program's handler on a thread the
//! program never made, or end the process by the default action while the program waited
//! for it in `sigwait` in a thread of its own (a pattern of MPI programs and of Python's
//! `signal.sigwait`). glibc leaves its own internal signals (cancellation, set*id) unblocked;
//! so does the shim the synchronous fault signals, which only the faulting thread gets.
use std::io;
use std::thread::{Builder, JoinHandle};

/// Each shim thread's stack: the size Rust would choose, set here so that the job's own
/// `RUST_MIN_STACK` (read by std at the first spawn) cannot make it fail or bloat.
const STACK: usize = 2 << 20;

/// Spawns `f` on a thread named `name` whose signals are all blocked from its first
/// instruction: blocked here, around the creation, as a new thread inherits its creator's
/// mask, and restored after.
pub fn spawn<F>(name: &str, f: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t values initialized by sigfillset; pthread_sigmask on the calling
    // thread, with valid pointers.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // A fault in a shim thread still reaches the program's crash handler (blocked, the
        // kernel would kill the process with the default action instead).
        for fault in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL] {
            libc::sigdelset(&mut all, fault);
        }
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut before) == 0;
        let spawned = Builder::new().name(name.into()).stack_size(STACK).spawn(f);
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        }
        spawned
    }
}

/// [`spawn`], saying on stderr when the thread cannot start (a cgroup's `pids.max` or
/// `RLIMIT_NPROC` reached, a sandbox refusing `clone3`) and what the process goes without
/// then (`lost`); whether it started.
pub fn spawn_or_say<F>(name: &str, lost: &str, f: F) -> bool
where
    F: FnOnce() + Send + 'static,
{
    match spawn(name, f) {
        Ok(_) => true,
        Err(e) => {
            super::say::warn(&format!("cannot start the thread {name} ({e}): {lost}"));
            false
        }
    }
}

/// The shim's threads sleep through this, never `std::thread::sleep` (which panics on any
/// error but EINTR): false when no sleep can be had, and the caller stops rather than spin.
pub use ibjitter_control::nap;

/// How many CPUs the calling thread may run on (its affinity mask; a new thread inherits its
/// creator's), if the kernel says. A kernel built for more CPUs than libc's fixed 1,024-bit
/// `cpu_set_t` refuses that size (EINVAL): the mask is asked again, twice as large each time.
/// None when it cannot be read (a seccomp filter).
pub fn allowed_cpus() -> Option<usize> {
    let mut words = std::mem::size_of::<libc::cpu_set_t>() / 8;
    while words <= 1 << 16 {
        let mut mask = vec![0u64; words];
        // SAFETY: the kernel writes at most `words * 8` bytes into our buffer.
        let rc =
            unsafe { libc::syscall(libc::SYS_sched_getaffinity, 0, words * 8, mask.as_mut_ptr()) };
        if rc > 0 {
            return Some(mask.iter().map(|w| w.count_ones() as usize).sum());
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return None;
        }
        words *= 2;
    }
    None
}

extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}
/// glibc's `PTHREAD_CANCEL_DISABLE`.
const CANCEL_DISABLE: libc::c_int = 1;

/// Cancellation of the calling thread held off while it lives, then put back as it was: a
/// program's thread cancelled inside the shim (at a cancellation point of the provider's
/// call in a hand-over, e.g. rxe's doorbell `write`, or of the first use's file reads) would
/// leave what the shim holds taken for ever: the delay line, the first use that every
/// other thread waits for. A cancel sent meanwhile acts at the thread's next cancellation
/// point after it. An atomic update of the thread's own state in glibc, no system call.
pub struct NoCancel(libc::c_int);

impl NoCancel {
    pub fn hold() -> NoCancel {
        let mut before = 0;
        // SAFETY: the calling thread's own state, a valid pointer.
        unsafe { pthread_setcancelstate(CANCEL_DISABLE, &mut before) };
        NoCancel(before)
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        // SAFETY: as in hold.
        unsafe { pthread_setcancelstate(self.0, std::ptr::null_mut()) };
    }
}

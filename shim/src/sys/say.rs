//! What the shim says on stderr: the startup line (or its one warning) when the process first
//! uses verbs or UCP, and at most one further warning. Each is one write, so it does not
//! interleave with the application's output, and none raises SIGPIPE ([`write_to_stderr`]).
use super::quiet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Descriptor 2 was closed when the shim loaded (a process started with `2>&-`): the next
/// file the program opens takes that number, and the shim's lines would go into the
/// program's own data. Nothing is written then.
static STDERR_CLOSED_AT_LOAD: AtomicBool = AtomicBool::new(false);
/// The file descriptor 2 named at load (device, inode). A daemon or launcher that closes
/// 0-2 after its first device open and opens its own files gives one of them that number:
/// a line written then goes only where stderr was, never into the file now there.
static STDERR_DEV: AtomicU64 = AtomicU64::new(0);
static STDERR_INO: AtomicU64 = AtomicU64::new(0);

/// The (device, inode) descriptor 2 names now, or None if it is closed. Async-signal-safe.
fn stderr_file() -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid stat; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a descriptor number into our buffer.
    (unsafe { libc::fstat(2, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// At load, before anything is said: whether descriptor 2 is open, and which file it names.
pub fn note_stderr_at_load() {
    match stderr_file() {
        Some((dev, ino)) => {
            STDERR_DEV.store(dev, Relaxed);
            STDERR_INO.store(ino, Relaxed);
            STDERR_CLOSED_AT_LOAD.store(false, Relaxed);
        }
        None => STDERR_CLOSED_AT_LOAD.store(true, Relaxed),
    }
}

/// Whether descriptor 2 still names the file it named at load. A program that moves stderr
/// itself (`dup2` of a log file, `freopen`) is told apart from one whose own file took the
/// number by nothing the kernel keeps: both lose the shim's lines, which nothing of theirs
/// needs, rather than the second getting them in its data.
fn stderr_is_still_stderr() -> bool {
    !STDERR_CLOSED_AT_LOAD.load(Relaxed)
        && stderr_file() == Some((STDERR_DEV.load(Relaxed), STDERR_INO.load(Relaxed)))
}

/// The startup line (or its warning) was printed.
static SHOWN: AtomicBool = AtomicBool::new(false);
static STARTUP: Mutex<Option<String>> = Mutex::new(None);

/// Sets the line [`show_startup_now`] prints (None: print nothing).
pub fn set_startup(message: Option<String>) {
    *STARTUP.lock().unwrap_or_else(|e| e.into_inner()) = message;
}

/// Prints the startup line now (a configuration that was refused is said at load, in every
/// process, so that a mistyped variable shows at once, even in a shell).
pub fn show_startup_now() {
    if SHOWN.swap(true, Relaxed) {
        return;
    }
    let msg = STARTUP.lock().ok().and_then(|s| s.clone());
    if let Some(m) = msg {
        write_parts(&["", &m]);
    }
}

/// Prints one line as it is (the coverage line at exit).
pub fn line(msg: &str) {
    write_parts(&["", msg]);
}

/// Prints a warning (the few that are each said once by their callers).
pub fn warn(msg: &str) {
    write_parts(&["ibjitter: warning: ", msg]);
}

/// Prints a warning at most once per process for each place that says it: `said` is that
/// place's own flag ([`warn_once!`] makes one per call site). One flag for them all lost
/// every warning after the first, whatever it said.
pub fn warn_once_at(said: &AtomicBool, msg: &str) {
    if !said.swap(true, Relaxed) {
        write_parts(&["ibjitter: warning: ", msg]);
    }
}

/// `warn_once!(msg)`: [`warn_once_at`] with a flag of this call site's own.
macro_rules! warn_once {
    ($msg:expr $(,)?) => {{
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        $crate::sys::say::warn_once_at(&SAID, $msg)
    }};
}
pub(crate) use warn_once;

/// `prefix`, `msg` and a newline in one `writev` to stderr: no allocation and no lock, so a
/// warning said on a post path that a signal handler entered (or in a fork child whose
/// parent held Rust's stderr lock) cannot deadlock; one call, so it does not interleave.
fn write_parts([prefix, msg]: &[&str; 2]) {
    let part = |s: &str| libc::iovec {
        iov_base: s.as_ptr() as *mut libc::c_void,
        iov_len: s.len(),
    };
    write_to_stderr(&[part(prefix), part(msg), part("\n")]);
}

/// One `writev` of `parts` to stderr that never raises SIGPIPE: when stderr is a pipe whose
/// reader is gone (a harness that closed it, a logger that died), the write's SIGPIPE would
/// kill a program that never writes there itself, at its device open or in its exit
/// handler, before its stats are written ([`quiet::without`]). Async-signal-safe: no
/// allocation, no lock. Returns what `writev` returned (-1 when descriptor 2 was closed at
/// load or names another file now: [`stderr_is_still_stderr`]).
pub fn write_to_stderr(parts: &[libc::iovec]) -> isize {
    if !stderr_is_still_stderr() {
        return -1;
    }
    quiet::without(libc::SIGPIPE, |raised| {
        // SAFETY: the caller's buffers, valid for their lengths.
        let n = unsafe { libc::writev(2, parts.as_ptr(), parts.len() as libc::c_int) };
        // SAFETY: errno is thread-local and always readable.
        *raised = n < 0 && unsafe { *libc::__errno_location() } == libc::EPIPE;
        n
    })
}

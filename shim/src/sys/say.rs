//! What the shim says on stderr: the startup line (or its one warning) when the process first
//! uses verbs or UCP, and at most one further warning. Each is one write, so it does not
//! interleave with the application's output.
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

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
        let _ = std::io::stderr().write_all(format!("{m}\n").as_bytes());
    }
}

/// Prints one line as it is (the coverage line at exit).
pub fn line(msg: &str) {
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// Prints a warning (the few that are each said once by their callers).
pub fn warn(msg: &str) {
    let _ = std::io::stderr().write_all(format!("ibjitter: warning: {msg}\n").as_bytes());
}

/// Prints a warning at most once per process.
pub fn warn_once(msg: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        let _ = std::io::stderr().write_all(format!("ibjitter: warning: {msg}\n").as_bytes());
    }
}

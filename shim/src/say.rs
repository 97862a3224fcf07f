//! What the shim says on stderr: the startup line (or its one warning) when the process first
//! opens a device, and at most one further warning. Each is one write, so it does not
//! interleave with the application's output.
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

static ANNOUNCED: AtomicBool = AtomicBool::new(false);
static STARTUP: Mutex<Option<String>> = Mutex::new(None);

/// Sets the line [`announce_once`] prints (None: print nothing).
pub fn set_startup(message: Option<String>) {
    *STARTUP.lock().unwrap_or_else(|e| e.into_inner()) = message;
}

/// Prints the startup line once per process, when it first opens a device: processes that
/// never use verbs (shells, launchers under LD_PRELOAD) stay silent.
pub fn announce_once() {
    if ANNOUNCED.swap(true, Relaxed) {
        return;
    }
    let msg = STARTUP.lock().ok().and_then(|s| s.clone());
    if let Some(m) = msg {
        let _ = std::io::stderr().write_all(format!("{m}\n").as_bytes());
    }
}

/// Whether the process has opened a device (and so was announced).
pub fn announced() -> bool {
    ANNOUNCED.load(Relaxed)
}

/// Prints a warning at most once per process.
pub fn warn_once(msg: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        let _ = std::io::stderr().write_all(format!("ibjitter: warning: {msg}\n").as_bytes());
    }
}

//! Shared helpers for integration tests. Each test file that needs them says `mod common;`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod bench;
pub mod perftest;
pub mod study;

/// Reads a JSON file a test run wrote, failing the test with the path on any error.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What a bounded run of `ibjitter` left: its exit status (None: killed by a signal) and
/// output.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `ibjitter ARGS` under an address-space limit of `memory` bytes, killed (and the
/// test failed) after `limit`: a hang, or memory grown until the OOM killer, fails the case
/// instead of the machine. Its output goes to `stdout` and `stderr` files in `dir` (a pipe
/// left unread could block it).
pub fn ibjitter_bounded(
    args: &[&str],
    dir: &std::path::Path,
    memory: u64,
    limit: std::time::Duration,
) -> Ran {
    use std::os::unix::process::CommandExt;
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.args(args)
        // Few malloc arenas: their reservations would count against the limit.
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches only this child's limits.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: memory,
                rlim_max: memory,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ibjitter {args:?}: still running after {limit:?}: a hang");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ran {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

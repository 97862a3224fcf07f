//! Host-only: `ibjitter incast` against hostile arguments and hostile sender reports. A fake
//! launcher (a shell script playing every host: `serve` exits at once, `run` prints a canned
//! report) stands in for the cluster, so nothing touches a device. Each case runs the real
//! binary under an address-space limit and a time bound, and must end in a clear error or a
//! bounded run with its results written: never an abort, a file outside --out, or a process
//! of its own left running.
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address space of each run: a merge of a few senders fits well within it; allocating what a
/// hostile argument or report asks for does not.
const MEMORY_LIMIT: u64 = 1 << 30;
/// Longest a case may take: each is done in well under a second.
const TIME_LIMIT: Duration = Duration::from_secs(20);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ibjitter-incast-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `ibjitter ARGS` under [`MEMORY_LIMIT`] and [`TIME_LIMIT`], its output in files of `dir`
/// (a pipe left unread could block it). It must end by itself, with an exit status.
fn ibjitter(dir: &TempDir, args: &[&str]) -> Ran {
    let (out_path, err_path) = (dir.path("stdout"), dir.path("stderr"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.args(args)
        // Few malloc arenas: their reservations would count against the limit.
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches only this child's limits.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: MEMORY_LIMIT,
                rlim_max: MEMORY_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ibjitter {args:?}: still running after {TIME_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ran = Ran {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    };
    assert!(
        ran.code.is_some() && !ran.stderr.contains("panicked"),
        "ibjitter {args:?}: {status}: {}",
        ran.stderr
    );
    ran
}

/// The run is refused (exit status 2) and its stderr says every one of `says`.
#[track_caller]
fn refused(dir: &TempDir, args: &[&str], says: &[&str]) {
    let ran = ibjitter(dir, args);
    assert_eq!(
        ran.code,
        Some(2),
        "ibjitter {args:?}: {}{}",
        ran.stdout,
        ran.stderr
    );
    for s in says {
        assert!(
            ran.stderr.contains(s),
            "ibjitter {args:?}: expected {s:?} in: {}",
            ran.stderr
        );
    }
}

#[test]
fn step_and_pair_counts_are_refused_beyond_their_limits_before_anything_is_allocated() {
    let dir = TempDir::new("steps");
    let out = dir.arg("out");
    // 10^9 steps took 24 GB of step layouts, u64::MAX a "capacity overflow" panic.
    for steps in ["1000000000", "18446744073709551615", "10001"] {
        refused(
            &dir,
            &[
                "incast",
                "--pattern",
                "rotating-incast",
                "--hosts",
                "a,b",
                "--steps",
                steps,
                "--launcher",
                "false",
                "--out",
                &out,
            ],
            &["--steps", "at most 10000"],
        );
    }
    // Every pair is a process started from here: 8,200 hosts all-to-all make 67 million.
    let hosts: Vec<String> = (0..8200).map(|i| format!("h{i}")).collect();
    refused(
        &dir,
        &[
            "incast",
            "--pattern",
            "alltoall",
            "--hosts",
            &hosts.join(","),
            "--launcher",
            "false",
            "--out",
            &out,
        ],
        &["67231800 pairs", "at most 65536"],
    );
    assert!(!dir.path("out").exists(), "nothing was launched");
}

//! Settings a hostile host gives the injector, with the built libibjitter.so over the stub
//! libibverbs: an address-space limit (`ulimit -v`, as batch systems set it), a sandbox that
//! refuses threads. The rule: one clear warning, then pass-through; never an abort.
//!
//! Each case runs a child under `sh -c 'ulimit -v KB; exec ...'` with a time limit (a hang
//! fails the test).
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// Built once for the tests of this binary (they run in parallel).
fn built() -> &'static (PathBuf, PathBuf, PathBuf) {
    static BUILT: std::sync::OnceLock<(PathBuf, PathBuf, PathBuf)> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        (
            build_shim(),
            build_stub(),
            build_c("limited_post", "limited_post", &["-ldl"]),
        )
    })
}

/// Runs `program args` with the shim preloaded, only `env` of the `IBJITTER_*` variables,
/// under `ulimit -v limit_kb` (None: no limit); fails the test after 30 s.
fn run_limited<V: AsRef<std::ffi::OsStr>>(
    limit_kb: Option<u64>,
    env: &[(&str, V)],
    program: &Path,
    args: &[&str],
) -> Output {
    let (so, _, _) = built();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        // The shim goes into the program only, not into this shell.
        .arg(
            r#"if [ "$0" != none ]; then ulimit -v "$0" || exit 99; fi
               LD_PRELOAD="$1"; export LD_PRELOAD; shift; exec "$@""#,
        )
        .arg(limit_kb.map_or("none".to_string(), |k| k.to_string()))
        .arg(so)
        .arg(program)
        .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") || k == "RUST_BACKTRACE" {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("LD_PRELOAD")
        .envs(env.iter().map(|(k, v)| (k, v.as_ref())));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn sh");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("{cmd:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The child's stderr and the shim's warnings on it; asserts that its `posts` posts all
/// reached the provider (limited_post's line).
fn passed_through(out: &Output, posts: u32) -> (String, Vec<String>) {
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains(&format!("posts={posts} provider={posts} ")),
        "{stdout}{err}"
    );
    let warnings = err
        .lines()
        .filter(|l| l.starts_with("ibjitter: warning:"))
        .map(String::from)
        .collect();
    (err, warnings)
}

/// An address space of 64 MiB holds a shell and the shim many times over: settings that
/// asked for more at load (a 1 GiB or 64 MiB trace buffer, a rank list expanded to 2 GB)
/// aborted even `/bin/sh -c true` (exit 134). Now the shell runs; a setting the shim refuses
/// is said.
#[test]
fn a_shell_under_an_address_space_limit_runs_whatever_the_settings() {
    const LIMIT_KB: u64 = 64 * 1024;
    // Ranges of a million ranks each: 5.9 KB of text, 300 million ranks.
    let ranks: String = (0..300u64)
        .map(|i| format!("{}-{}", i * 2_000_000, i * 2_000_000 + 1_000_000))
        .collect::<Vec<_>>()
        .join(",");
    let trace = std::env::temp_dir().join(format!("ibjitter-limited-{}.trace", std::process::id()));
    let trace = trace.to_str().unwrap();
    for (env, warns) in [
        (
            vec![
                ("IBJITTER_DELAY", "1us"),
                ("IBJITTER_TRACE", trace),
                ("IBJITTER_TRACE_MAX", "268435456"),
            ],
            Some("IBJITTER_TRACE_MAX=268435456: expected a number of draws, 1..=16777216"),
        ),
        (
            vec![
                ("IBJITTER_DELAY", "1us"),
                ("IBJITTER_TRACE", trace),
                ("IBJITTER_TRACE_MAX", "16777216"),
            ],
            None,
        ),
        (
            vec![
                ("IBJITTER_DELAY", "1us"),
                ("IBJITTER_RANKS", &ranks),
                ("PMI_RANK", "2500000"),
            ],
            None,
        ),
    ] {
        let out = run_limited(Some(LIMIT_KB), &env, Path::new("/bin/sh"), &["-c", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{env:?}: {}\n{err}", out.status);
        match warns {
            Some(w) => assert!(
                err.lines()
                    .filter(|l| l.starts_with("ibjitter: warning:"))
                    .count()
                    == 1
                    && err.contains(w),
                "{env:?}: {err}"
            ),
            None => assert!(!err.contains("ibjitter"), "{env:?}: {err}"),
        }
    }
    assert!(!Path::new(trace).exists(), "no draw, no trace file");
}

/// A program that opens a device and posts, under a limit a few MiB above what it needs with
/// the shim passing through: the send counters (4 MiB), the delay line's pool (3.7 MiB) and
/// the trace buffer (64 MiB) do not fit. Each was allocated with an abort on failure (exit
/// 134); now each is one warning and that feature off, and every post reaches the provider.
#[test]
fn a_verbs_program_under_an_address_space_limit_posts_with_features_off() {
    let (_, stub, driver) = built();
    let stub = stub.to_str().unwrap();
    const POSTS: &str = "200";
    // What the program needs with the shim loaded and doing nothing.
    let base = run_limited(None, &[("IBJITTER_CONTROL", "0")], driver, &[stub, POSTS]);
    let base_out = text(&base.stdout);
    assert!(base.status.success(), "{}{}", base_out, text(&base.stderr));
    let peak_kb: u64 = base_out
        .split("vm_peak_kb=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no vm_peak_kb in {base_out}"));
    let limit_kb = peak_kb + 3 * 1024;
    let trace = std::env::temp_dir().join(format!(
        "ibjitter-limited-post-{}.trace",
        std::process::id()
    ));
    let out = run_limited(
        Some(limit_kb),
        &[
            ("IBJITTER_CONTROL", "0"),
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_STATS", "/dev/null"),
            ("IBJITTER_CQ_DELAY", "1us"),
            ("IBJITTER_MODE", "line"),
            ("IBJITTER_TRACE", trace.to_str().unwrap()),
            ("IBJITTER_TRACE_MAX", "16777216"),
        ],
        driver,
        &[stub, POSTS],
    );
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "ulimit -v {limit_kb}: {}\n{stdout}{err}",
        out.status
    );
    assert!(
        stdout.contains(&format!("posts={POSTS} provider={POSTS} ")),
        "{stdout}"
    );
    for says in [
        "cannot allocate the send counters",
        "IBJITTER_MODE=line: cannot allocate the delay line",
        "IBJITTER_TRACE: cannot allocate 64 MiB",
    ] {
        assert_eq!(
            err.matches(says).count(),
            1,
            "ulimit -v {limit_kb}: once {says:?} in\n{err}"
        );
    }
    let _ = std::fs::remove_file(&trace);
}

/// `IBJITTER_DIST=NAME` looks beside the loaded library (an installed layout,
/// `PREFIX/lib/libibjitter.so` and `PREFIX/share/ibjitter/distributions/`), not under the path
/// the library was built in: a copy installed elsewhere never reads the build's checkout.
#[test]
fn named_tables_are_found_beside_the_installed_library() {
    let (so, stub, driver) = built();
    let stub = stub.to_str().unwrap();
    let prefix = std::env::temp_dir().join(format!("ibjitter-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let dists = prefix.join("share/ibjitter/distributions");
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::create_dir_all(&dists).unwrap();
    let checkout = workspace_root();
    std::fs::copy(
        checkout.join("distributions/normal.dist"),
        dists.join("installed-only.dist"),
    )
    .unwrap();
    let installed = prefix.join("lib/libibjitter.so");
    std::fs::copy(so, &installed).unwrap();
    let run = |name: &str| {
        let mut cmd = Command::new(driver);
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd
            .args([stub, "10"])
            .env("LD_PRELOAD", &installed)
            .env("IBJITTER_CONTROL", "0")
            .env("IBJITTER_DIST", name)
            .env("IBJITTER_DELAY", "10us")
            .env("IBJITTER_JITTER", "1us")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stderr)
    };
    let err = run("installed-only");
    assert!(
        err.contains(&format!(
            "table {}",
            dists.join("installed-only.dist").display()
        )),
        "{err}"
    );
    // The checkout has normal.dist; the installed copy must not read it.
    let err = run("normal");
    let ours = checkout.join("distributions");
    assert!(!err.contains(ours.to_str().unwrap()), "{err}");
    let iproute2 = [
        "/usr/lib/x86_64-linux-gnu/tc",
        "/usr/lib/tc",
        "/usr/lib64/tc",
    ]
    .iter()
    .map(|d| Path::new(d).join("normal.dist"))
    .find(|p| p.is_file());
    match iproute2 {
        Some(p) => assert!(err.contains(&format!("table {}", p.display())), "{err}"),
        None => assert!(
            err.contains(
                "IBJITTER_DIST=normal: no such named distribution (looked for normal.dist in"
            ) && err.contains(dists.to_str().unwrap()),
            "{err}"
        ),
    }
    std::fs::remove_dir_all(&prefix).unwrap();
}

/// Starts the driver with the shim and `env`, posting `posts` sends then staying `hold_ms`;
/// returns it once it has posted (its control file is served from its device open).
fn start_held(env: &[(&str, &str)], posts: &str, hold_ms: &str) -> std::process::Child {
    use std::io::BufRead;
    let (so, stub, driver) = built();
    let mut cmd = Command::new(driver);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args([stub.to_str().unwrap(), posts, hold_ms])
        .env("LD_PRELOAD", so)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("limited_post posts="), "{first:?}");
    child
}

/// A process started with `IBJITTER_UNIT=loops` answers live control in its unit: the table
/// and the sum are said in loops (status showed loops as ms), and a `set` it cannot read in
/// loops is refused with the unit and how to give the value (`inject set --delay` sent ns, so
/// no set could ever succeed). A plain loop count is applied.
#[test]
fn live_control_of_a_process_counting_loops_speaks_loops() {
    use ibjitter_control::{self as ctl, Command as Request};
    let wait = Duration::from_secs(2);
    let mut loops = start_held(
        &[("IBJITTER_UNIT", "loops"), ("IBJITTER_DELAY", "300")],
        "50",
        "4000",
    );
    let pid = loops.id();
    let a = ctl::send(pid, Request::Status, "", wait).unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(a.text, "table constant 300 loops (delays in loops)");
    assert_eq!(
        (a.delayed, a.sum_ns),
        (50, 50 * 300),
        "the sum counts loops"
    );
    let a = ctl::send(pid, Request::Set, "IBJITTER_DELAY=200000ns", wait).unwrap();
    assert!(!a.ok, "{a:?}");
    assert!(
        a.text.contains("IBJITTER_UNIT=loops")
            && a.text.contains("plain loop counts, e.g. --delay 5000"),
        "{}",
        a.text
    );
    let a = ctl::send(pid, Request::Set, "IBJITTER_DELAY=5000", wait).unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(a.text, "table constant 5000 loops (delays in loops)");
    assert!(loops.wait().unwrap().success());
    // The shim leaves its control file at exit (`inject --all` clears such files): ours go.
    let _ = std::fs::remove_file(ctl::path(pid));

    let mut ns = start_held(&[("IBJITTER_DELAY", "1us")], "10", "4000");
    let pid = ns.id();
    let a = ctl::send(pid, Request::Status, "", wait).unwrap();
    assert_eq!(a.text, "table constant 1000 ns");
    let a = ctl::send(pid, Request::Set, "IBJITTER_DELAY=5000", wait).unwrap();
    assert!(!a.ok, "{a:?}");
    assert!(
        a.text.contains("counts delays in ns") && a.text.contains("e.g. --delay 200us"),
        "{}",
        a.text
    );
    assert!(ns.wait().unwrap().success());
    let _ = std::fs::remove_file(ctl::path(pid));
}

/// Endless delays. The longest the injector holds (10^15 ns, 11.6 days) is taken, and in line
/// mode requests still waiting at exit are said not delivered, none counted as delayed: a
/// delay of 2^63 ns saturated the line's clock units and its sums, and the exit line said
/// "delayed 0 of 5 sends, 27670116110564.328 ms in all". A bound beyond that ceiling is one
/// warning and pass-through: every post reaches the provider.
#[test]
fn endless_delays_are_refused_or_reported_whole() {
    let (_, stub, driver) = built();
    let stub = stub.to_str().unwrap();
    let line = |max: &str| {
        let out = run_limited(
            None,
            &[
                ("IBJITTER_CONTROL", "0"),
                ("IBJITTER_MODE", "line"),
                ("IBJITTER_DELAY", "1000000s"),
                ("IBJITTER_MAX_DELAY", max),
            ],
            driver,
            &[stub, "5"],
        );
        (text(&out.stdout), text(&out.stderr))
    };
    let (stdout, err) = line("1000000s");
    assert!(stdout.contains("posts=5 provider=0 "), "{stdout}{err}");
    assert!(
        err.contains("delayed 0 of 5 sends (post_send 5), 0.000 ms in all; not delivered 5"),
        "{err}"
    );
    for max in ["1000001s", "9223372036854775808ns"] {
        let (stdout, err) = line(max);
        assert!(
            stdout.contains("posts=5 provider=5 "),
            "{max}: {stdout}{err}"
        );
        let warnings: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("ibjitter: warning:"))
            .collect();
        assert!(
            warnings.len() == 1
                && warnings[0].contains(&format!(
                    "IBJITTER_MAX_DELAY={max}: at most 1000000000000000 ns (11.6 days)"
                ))
                && warnings[0].ends_with("injection disabled (pass-through)"),
            "{max}: {err}"
        );
    }
}

/// A setting whose value is not UTF-8 (a stray byte, a Latin-1 path) is refused by its name
/// and value, once, like any bad value. Before, it read as unset: `IBJITTER_DELAY` so set
/// gave "no IBJITTER_TABLE, IBJITTER_DIST or IBJITTER_DELAY set", denying the one given.
#[test]
fn a_value_that_is_not_utf8_is_refused_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let (_, stub, driver) = built();
    let bad = std::ffi::OsStr::from_bytes(b"200\xffus");
    let out = run_limited(
        None,
        &[
            ("IBJITTER_CONTROL", std::ffi::OsStr::new("0")),
            ("IBJITTER_DELAY", bad),
        ],
        driver,
        &[stub.to_str().unwrap(), "5"],
    );
    let (err, warnings) = passed_through(&out, 5);
    assert!(
        warnings.len() == 1 && warnings[0].contains("IBJITTER_DELAY=\"200\u{fffd}us\""),
        "{err}"
    );
    // A path: refused, not written under another name (U+FFFD for the byte).
    let dir = std::env::temp_dir().join(format!("ibjitter-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stats = dir.as_os_str().as_bytes().to_vec();
    stats.extend_from_slice(b"/st\xe9.json");
    let out = run_limited(
        None,
        &[
            ("IBJITTER_CONTROL", std::ffi::OsStr::new("0")),
            ("IBJITTER_DELAY", std::ffi::OsStr::new("1us")),
            ("IBJITTER_STATS", std::ffi::OsStr::from_bytes(&stats)),
        ],
        driver,
        &[stub.to_str().unwrap(), "5"],
    );
    let (err, warnings) = passed_through(&out, 5);
    assert!(
        warnings.len() == 1
            && warnings[0].contains("IBJITTER_STATS=")
            && warnings[0].contains("not valid UTF-8"),
        "{err}"
    );
    let written: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(written.is_empty(), "{written:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sandbox that refuses new threads (a container's seccomp profile refusing `clone3`; a
/// cgroup's `pids.max` reached fails the same call): each shim thread that cannot start is
/// said with what the process goes without, and what needed it passes through. Before, the
/// window thread's failure was silent: `IBJITTER_STOP` was never applied (every post
/// delayed past it), `IBJITTER_START` never opened the window ("delayed 0 of N" without a
/// reason), and live control's file stayed, served by nobody. A sandbox that refuses FIFOs
/// is said too.
#[test]
fn a_sandbox_without_threads_or_fifos_is_said_and_passes_through() {
    let (_, stub, driver) = built();
    static SANDBOX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let sandbox = SANDBOX.get_or_init(|| build_c("sandboxed", "sandboxed", &[]));
    let args = [
        "clone3",
        driver.to_str().unwrap(),
        stub.to_str().unwrap(),
        "20",
    ];
    let out = run_limited(
        None,
        &[("IBJITTER_DELAY", "1ms"), ("IBJITTER_STOP", "1ms")],
        sandbox,
        &args,
    );
    let (err, warnings) = passed_through(&out, 20);
    let said = |name: &str, lost: &str| {
        warnings
            .iter()
            .filter(|w| w.contains(&format!("cannot start the thread {name}")) && w.contains(lost))
            .count()
    };
    assert_eq!(
        said("ibjitter-window", "injection disabled (pass-through)"),
        1,
        "{err}"
    );
    assert_eq!(
        said("ibjitter-control", "live control unavailable"),
        1,
        "{err}"
    );
    // Nothing delayed: 20 posts of 1 ms were not waited for.
    assert!(err.contains("delayed 0 of 20 sends"), "{err}");
    // A sandbox that refuses FIFOs (mknodat): live control polls instead of sleeping until
    // woken, and says so (it was silent).
    let args = [
        "mknodat",
        driver.to_str().unwrap(),
        stub.to_str().unwrap(),
        "20",
    ];
    let out = run_limited(None, &[("IBJITTER_DELAY", "1us")], sandbox, &args);
    let (err, said) = passed_through(&out, 20);
    assert!(
        said.len() == 1
            && said[0].contains("live control: no wake FIFO")
            && said[0].contains("Operation not permitted"),
        "{err}"
    );
    assert!(err.contains("delayed 20 of 20 sends"), "{err}");
}

/// A sandbox that refuses sleeps (a seccomp filter denying `clock_nanosleep` and
/// `nanosleep`): the shim's threads sleep by `ppoll` instead, and the delay line hands its
/// requests over. Before, `std::thread::sleep` panicked in the line's timer thread (and in
/// the exit drain): none of the 20 reached the provider, and no stats were written. One that
/// refuses `poll` and `ppoll` too: they sleep by a futex wait (no threaded program runs
/// without futex); live control, which polls its wake FIFO, says once that it looks every
/// 10 ms instead; a window (`IBJITTER_STOP`) is still kept.
#[test]
fn a_sandbox_without_sleeps_neither_panics_nor_loses_the_line() {
    let (_, stub, driver) = built();
    static SANDBOX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let sandbox = SANDBOX.get_or_init(|| build_c("sandboxed", "sandboxed", &[]));
    // Long enough that the timer thread sleeps towards the due time (a nap), not only spins.
    let line = [("IBJITTER_MODE", "line"), ("IBJITTER_DELAY", "20ms")];
    let window = [("IBJITTER_DELAY", "1us"), ("IBJITTER_STOP", "10s")];
    for (calls, env) in [
        ("clock_nanosleep,nanosleep", &line),
        ("clock_nanosleep,nanosleep,poll,ppoll", &line),
        ("clock_nanosleep,nanosleep,poll,ppoll", &window),
    ] {
        // (A ppoll refused alone leaves poll's whole milliseconds: the line then says that
        // it was late.) The program stays 300 ms: its threads have slept by then.
        let args = [
            calls,
            driver.to_str().unwrap(),
            stub.to_str().unwrap(),
            "20",
            "300",
        ];
        let out = run_limited(None, env, sandbox, &args);
        let (err, warnings) = passed_through(&out, 20);
        assert!(out.status.success(), "{calls}: {err}");
        assert!(!err.contains("panicked"), "{calls}: {err}");
        assert!(err.contains("delayed 20 of 20 sends"), "{calls}: {err}");
        let polled = warnings
            .iter()
            .filter(|w| w.contains("live control: its wake FIFO cannot be polled"))
            .count();
        assert_eq!(
            polled,
            usize::from(calls.contains("poll")),
            "{calls}: {err}"
        );
        assert_eq!(warnings.len(), polled, "{calls}: {err}");
    }
}

/// A sandbox that refuses `sched_getaffinity` (or a kernel built for more than 1,024 CPUs,
/// which refuses libc's fixed mask with EINVAL): the delay line's timer thread does not know
/// whether the rank is bound to one CPU, and takes it that it may be (it never spins there).
/// Before, an unreadable mask counted as many CPUs: on a rank pinned to one it spun on the
/// rank's core (610-665 ms of CPU in 2.9 s against 110-120, a helper's audit measured).
#[test]
fn a_timer_thread_that_cannot_read_its_cpus_takes_it_that_it_has_one() {
    let (_, stub, driver) = built();
    static SANDBOX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let sandbox = SANDBOX.get_or_init(|| build_c("sandboxed", "sandboxed", &[]));
    let dir = std::env::temp_dir().join(format!("ibjitter-affinity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    for (calls, one) in [("mknodat", false), ("sched_getaffinity", true)] {
        let env = [
            ("IBJITTER_MODE", "line"),
            ("IBJITTER_DELAY", "1ms"),
            ("IBJITTER_CONTROL", "0"),
            ("IBJITTER_STATS", stats.to_str().unwrap()),
        ];
        let args = [
            calls,
            driver.to_str().unwrap(),
            stub.to_str().unwrap(),
            "20",
        ];
        let out = run_limited(None, &env, sandbox, &args);
        let (err, _) = passed_through(&out, 20);
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        // This host has more than one CPU, and the program is bound to none.
        assert_eq!(
            s["line"]["timer_thread"]["one_cpu"], one,
            "{calls}: {err}\n{s}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A program started with stderr closed (`2>&-`, a daemon's start) whose next file takes
/// descriptor 2: the shim's lines never go into that file. Before, its startup line and exit
/// line were written into the program's own record.
#[test]
fn a_program_started_without_stderr_keeps_its_files_clean() {
    program_record_is_clean(true);
}

/// A program that closes its stderr after its posts (a daemon or launcher closing 0-2 once
/// set up) and opens a file of its own, which takes descriptor 2: the shim's exit line
/// goes nowhere rather than into that file. Before, it was written there after the record.
#[test]
fn a_program_that_closes_its_stderr_later_keeps_its_files_clean() {
    program_record_is_clean(false);
}

/// `limited_post` with a file of its own on descriptor 2: from the start (stderr closed
/// at load) or from after its posts (stderr closed by the program).
fn program_record_is_clean(closed_at_start: bool) {
    let (so, stub, driver) = built();
    let dir = std::env::temp_dir().join(format!(
        "ibjitter-no-stderr-{}-{closed_at_start}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let own = dir.join("record.txt");
    let mut cmd = Command::new("sh");
    let script = if closed_at_start {
        r#"LD_PRELOAD="$1" exec "$2" "$3" 20 2>&-"#
    } else {
        r#"LIMITED_POST_CLOSE_STDERR=1 LD_PRELOAD="$1" exec "$2" "$3" 20"#
    };
    cmd.arg("-c")
        .arg(script)
        .arg("sh")
        .arg(so)
        .arg(driver)
        .arg(stub);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("LD_PRELOAD")
        .env("IBJITTER_DELAY", "1us")
        .env("IBJITTER_CONTROL", "0")
        .env("LIMITED_POST_FILE", &own);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).contains("posts=20 provider=20 "),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&own).unwrap(),
        "the program's record (descriptor 2)\n"
    );
    if !closed_at_start {
        // Said where stderr was while it was there.
        assert!(text(&out.stderr).starts_with("ibjitter: "), "{out:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The injector's signal handlers and output files in hostile hosts, with the built
//! libibjitter.so LD_PRELOADed over the stub libibverbs: a Python program's Ctrl-C, a small
//! alternate signal stack, stats and trace paths that are FIFOs, symbolic links or another
//! user's file, stats written at a signal after a live `set`, the flags of the shim's
//! handler chained to the program's (Python's Ctrl-C in a blocking read), and stats across a
//! SIGINT the program catches and survives. The rule: the program's signals behave as without
//! the shim; an output the shim must not write gets one warning naming it and why, and nothing
//! else happens (no hang, nothing written through a link).
//!
//! Each program runs with a time limit: a hang fails the test.
mod support;

use serde_json::Value;
use std::io::{BufRead, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::*;

struct Built {
    so: PathBuf,
    stub: PathBuf,
    /// tests/support/post_then_end.c, linked against the stub.
    driver: PathBuf,
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let so = build_shim();
        let stub = build_stub();
        let driver = build_c("post_then_end", "post_then_end", &[stub.to_str().unwrap()]);
        Built { so, stub, driver }
    })
}

fn scratch(name: &str) -> PathBuf {
    let d = target_dir()
        .join("ibjitter-hostile-outputs")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `program` under the shim: LD_PRELOAD, the stub first on the library path, a 1 µs constant
/// delay, no live control unless asked, and none of this process's `IBJITTER_*` variables.
fn injected(program: &Path) -> Command {
    let b = built();
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_PRELOAD", &b.so)
        .env("LD_LIBRARY_PATH", b.stub.parent().unwrap())
        .env("IBJITTER_DELAY", "1us")
        .env("IBJITTER_CONTROL", "0");
    cmd
}

/// The driver under the shim: `post_then_end ALTSTACK POSTS END`.
fn driver(altstack: usize, posts: u64, end: &str) -> Command {
    let mut cmd = injected(&built().driver);
    cmd.args([altstack.to_string(), posts.to_string(), end.to_string()]);
    cmd
}

struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Waits for `child` at most `limit`; a child still running then is killed and fails the test.
fn finish(mut child: Child, what: &str, limit: Duration) -> Ran {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (it hung)");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    // None when the caller gave stderr elsewhere.
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).unwrap();
    }
    Ran {
        status,
        stdout,
        stderr,
    }
}

/// Runs `cmd` to its end, at most 10 s.
fn run(cmd: &mut Command) -> Ran {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, &format!("{cmd:?}"), Duration::from_secs(10))
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no stats file {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// The start of the Python programs below: libibverbs through ctypes (the stub's
/// `ibv_open_device` returns its argument: no device, but the shim sees the process use
/// verbs at the program's `verbs.ibv_open_device(None)`).
const PY_VERBS: &str = r#"import ctypes
verbs = ctypes.CDLL("libibverbs.so.1")
verbs.ibv_open_device.restype = ctypes.c_void_p
verbs.ibv_open_device.argtypes = [ctypes.c_void_p]
"#;

fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("ibjitter: warning"))
        .collect()
}

/// CPython installs its SIGINT handler (KeyboardInterrupt) only over the default action; the
/// shim's handlers, installed at load, used to make it skip that: Ctrl-C then killed the
/// program with no `KeyboardInterrupt` and no `finally`. Installed at the first device open,
/// they chain to Python's.
#[test]
fn python_keeps_its_ctrl_c_under_the_shim() {
    let dir = scratch("python");
    let stats = dir.join("stats.json");
    let script = &format!(
        "{PY_VERBS}{}",
        r#"
import ctypes, os, signal, time
# The stub returns its argument: no device, but the shim sees the process use verbs.
verbs.ibv_open_device(None)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
    print("no KeyboardInterrupt", flush=True)
except KeyboardInterrupt:
    print("caught KeyboardInterrupt", flush=True)
finally:
    print("finally ran", flush=True)
"#
    );
    let r = run(injected(Path::new("python3"))
        .args(["-c", script])
        .env("IBJITTER_STATS", &stats));
    assert!(
        r.status.success(),
        "python3 under the shim: {} (signal {:?})\n{}{}",
        r.status,
        r.status.signal(),
        r.stdout,
        r.stderr
    );
    assert!(
        r.stdout.contains("caught KeyboardInterrupt") && r.stdout.contains("finally ran"),
        "{}{}",
        r.stdout,
        r.stderr
    );
    // The process used verbs: its stats file is there at exit.
    assert_eq!(read_json(&stats)["ended_by"], "exit");
}

/// The main thread of `pid` is blocked in read(2) on descriptor `fd` (/proc/PID/syscall:
/// the call's number, then its arguments in hex).
fn blocked_in_read(pid: u32, fd: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) else {
        return false;
    };
    let mut f = text.split_whitespace();
    f.next() == Some(&libc::SYS_read.to_string()) && f.next() == Some(&format!("{fd:#x}"))
}

/// CPython's SIGINT handler has no SA_RESTART: Ctrl-C during a blocking read makes read(2)
/// fail with EINTR, and Python raises KeyboardInterrupt. The shim's handler chained to it
/// used to force SA_RESTART: the kernel restarted the read and the program hung. (The
/// `time.sleep` test above cannot see this: sleeps return EINTR either way.)
#[test]
fn python_ctrl_c_interrupts_a_blocking_read_under_the_shim() {
    let dir = scratch("python-read");
    let stats = dir.join("stats.json");
    let script = &format!(
        "{PY_VERBS}{}",
        r#"
import ctypes, os
verbs.ibv_open_device(None)
r, w = os.pipe()
print("READING", r, flush=True)
try:
    os.read(r, 1)
    print("read returned", flush=True)
except KeyboardInterrupt:
    print("caught KeyboardInterrupt", flush=True)
"#
    );
    let mut child = injected(Path::new("python3"))
        .args(["-c", script])
        .env("IBJITTER_STATS", &stats)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let Some(fd) = line.trim().strip_prefix("READING ") else {
        let _ = child.kill();
        let ran = finish(child, "python3", Duration::from_secs(5));
        panic!("no READING line: {line:?}\n{}", ran.stderr);
    };
    let fd: u32 = fd.parse().unwrap();
    // The signal must find it inside read(2), not before: wait until it is there.
    let t0 = Instant::now();
    while !blocked_in_read(pid, fd) {
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let ran = finish(child, "python3", Duration::from_secs(5));
            panic!("python3 never blocked in read({fd})\n{}", ran.stderr);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    child.stdout = Some(out.into_inner());
    let r = finish(child, "python3 blocked in os.read", Duration::from_secs(5));
    assert!(
        r.status.success() && r.stdout.contains("caught KeyboardInterrupt"),
        "{} (signal {:?})\n{}{}",
        r.status,
        r.status.signal(),
        r.stdout,
        r.stderr
    );
    assert_eq!(read_json(&stats)["ended_by"], "exit");
}

/// The kernel's own signal frame on this CPU (AT_MINSIGSTKSZ), at least glibc's MINSIGSTKSZ.
fn kernel_signal_frame() -> usize {
    // SAFETY: getauxval reads the auxiliary vector.
    let at = unsafe { libc::getauxval(libc::AT_MINSIGSTKSZ) } as usize;
    at.max(libc::MINSIGSTKSZ)
}

/// A program with a small alternate signal stack (`sigaltstack`; the shim's handlers run on
/// it, `SA_ONSTACK`) gets its stats at SIGTERM and still dies of SIGTERM: the handler needs
/// less than 1 KiB of stack beyond the kernel's frame (its output buffer is not on the stack).
#[test]
fn a_small_alternate_signal_stack_still_gets_the_stats() {
    let dir = scratch("altstack");
    let stats = dir.join("stats.json");
    // MINSIGSTKSZ (2 KiB) where the kernel's frame leaves 1 KiB of it free; else the frame + 1 KiB.
    let size = libc::MINSIGSTKSZ.max(kernel_signal_frame() + 1024);
    let r = run(driver(size, 100, "term").env("IBJITTER_STATS", &stats));
    assert_eq!(
        r.status.signal(),
        Some(libc::SIGTERM),
        "alternate stack of {size} bytes (kernel frame {}): {}\n{}{}",
        kernel_signal_frame(),
        r.status,
        r.stdout,
        r.stderr
    );
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "SIGTERM", "{s}");
    assert_eq!(s["posts_total"], 100, "{s}");
    assert_eq!(s["draws"], 100, "{s}");
    assert_eq!(s["delays_injected"], 100, "{s}");
    assert_eq!(s["sum_ns"], 100_000, "{s}");
    assert_eq!(s["delay_ns"]["percentiles"]["p50"], 1000, "{s}");
}

/// A process in line mode ended by SIGTERM (the default action: no drain) with requests
/// still in the line: the signal-time stats say how many (`line.in_line_at_signal`), and
/// stderr says they were not delivered. Both were silent: the file had no line object and
/// counted the 10 as delays injected.
#[test]
fn a_signal_that_ends_a_line_says_what_it_loses() {
    let dir = scratch("line-term");
    let stats = dir.join("stats.json");
    let r = run(driver(0, 10, "term")
        .env("IBJITTER_MODE", "line")
        .env("IBJITTER_DELAY", "5s")
        .env("IBJITTER_STATS", &stats));
    assert_eq!(r.status.signal(), Some(libc::SIGTERM), "{}", r.stderr);
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "SIGTERM", "{s}");
    assert_eq!(s["line"]["in_line_at_signal"], 10, "{s}");
    assert_eq!(
        warnings(&r.stderr),
        ["ibjitter: warning: SIGTERM: 10 requests still in the delay line were not delivered"],
        "{}",
        r.stderr
    );
}

/// A program that sandboxes itself once it has opened its device (a seccomp filter on every
/// thread, as programs that drop privileges after their set-up install) still dies of the
/// SIGTERM sent to it, with its stats written: the shim's handler needs neither
/// `rt_sigaction` nor `tgkill` to end it. With `rt_sigaction` refused the handler used to
/// re-raise into itself for ever (the process alive, its stats rewritten ~430 times a
/// second); with `tgkill` refused the SIGTERM was swallowed. With `kill` refused too, the
/// process still ends, with the status a shell gives a death by SIGTERM (143).
#[test]
fn a_program_that_sandboxes_itself_still_dies_of_its_sigterm() {
    let dir = scratch("sandboxed-term");
    // "chain": the program installed a SIGTERM handler after the shim's that calls it and
    // returns; with rt_sigaction refused the shim cannot see that its handler was called by
    // the program's rather than delivered (the action in place cannot be read), and ends the
    // process as by the signal, 143 (it looped for ever after e2ee46b). Readable, the
    // program lives on as without the shim (the test below).
    for (denied, chain) in [
        ("rt_sigaction", false),
        ("tgkill", false),
        ("rt_sigaction,tgkill", false),
        ("rt_sigaction,tgkill,kill", false),
        ("rt_sigaction", true),
    ] {
        let stats = dir.join(format!("{denied}.{chain}.json"));
        let mut child = driver(0, 10, "wait");
        if chain {
            child.env("POST_THEN_END_CHAIN", "1");
        }
        let mut child = child
            .env("IBJITTER_STATS", &stats)
            .env("POST_THEN_END_DENY", denied)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut before = String::new();
        let pid: i32 = loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                child.stdout = Some(out.into_inner());
                let ran = finish(child, "post_then_end", Duration::from_secs(5));
                panic!("{denied}: no READY line: {before}\n{}", ran.stderr);
            }
            if let Some(pid) = line.trim().strip_prefix("READY ") {
                break pid.parse().unwrap();
            }
            before.push_str(&line);
        };
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        child.stdout = Some(out.into_inner());
        let r = finish(
            child,
            &format!("post_then_end denied {denied}, sent SIGTERM"),
            Duration::from_secs(10),
        );
        if denied.ends_with(",kill") || chain && denied.contains("rt_sigaction") {
            assert_eq!(
                r.status.code(),
                Some(128 + libc::SIGTERM),
                "{denied}: {}",
                r.stderr
            );
        } else {
            assert_eq!(
                r.status.signal(),
                Some(libc::SIGTERM),
                "{denied}: {}\n{}",
                r.status,
                r.stderr
            );
        }
        assert!(warnings(&r.stderr).is_empty(), "{denied}: {}", r.stderr);
        let s = read_json(&stats);
        assert_eq!(s["ended_by"], "SIGTERM", "{denied}: {s}");
        assert_eq!(s["posts_total"], 10, "{denied}: {s}");
    }
}

/// A program that installs its own SIGTERM handler after its first device open, chaining to
/// the action it replaced when that is a function (signal-hook and tokio's `ctrl_c` do), and
/// goes on: without the shim that action is the default, which it never calls, and the
/// program lives on (a graceful shutdown). The shim's handler stands for the default action:
/// called by the program's, it writes the stats and returns, and the program lives on too.
/// Before, it ended the process as by the signal (its cleanup lost, status "killed").
#[test]
fn a_program_whose_handler_chains_to_the_shims_lives_on_as_without_it() {
    let dir = scratch("chain-lives");
    let stats = dir.join("stats.json");
    for shim in [false, true] {
        let mut cmd = driver(0, 10, "wait");
        if !shim {
            cmd.env_remove("LD_PRELOAD");
        }
        let mut child = cmd
            .env("POST_THEN_END_CHAIN", "1")
            .env("IBJITTER_STATS", &stats)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        let mut read_until = |what: &str, seen: &mut String| -> Option<String> {
            loop {
                let mut line = String::new();
                if out.read_line(&mut line).unwrap() == 0 {
                    return None;
                }
                seen.push_str(&line);
                if line.starts_with(what) {
                    return Some(line);
                }
            }
        };
        let Some(ready) = read_until("READY ", &mut seen) else {
            let _ = child.kill();
            panic!("shim {shim}: no READY line: {seen}");
        };
        let pid: i32 = ready.trim()["READY ".len()..].parse().unwrap();
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let chained = read_until("CHAINED", &mut seen);
        std::thread::sleep(Duration::from_millis(300));
        let alive = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert!(
            chained.is_some(),
            "shim {shim}: its handler did not run: {seen}"
        );
        assert!(alive, "shim {shim}: ended by its SIGTERM: {status}: {seen}");
        if shim {
            // What the shim saw, written at the signal.
            let s = read_json(&stats);
            assert_eq!(s["posts_total"], 10, "{s}");
        }
    }
}

/// A second ending signal while the shim writes the stats for the first: Ctrl-C at a
/// terminal reaches every rank and then `mpirun` forwards SIGTERM; Slurm and the launcher
/// both send SIGTERM. The program has threads that block no signal (a runtime's helpers), so
/// the second signal (a SIGTERM, or a SIGINT, which the main thread blocks) goes to one of
/// them while the first one's handler writes on the main thread. The file must
/// be whole and say what the process died of. Before: a second SIGTERM found the default
/// action back (SA_RESETHAND) and killed the process mid-write (an empty file in each of 8
/// rounds). The SIGINT rounds passed before too: its handler on the other thread waited for
/// the writer, but could have taken the file in the microseconds between the writer's end
/// and its process's death.
#[test]
fn a_second_ending_signal_during_the_stats_write_leaves_the_file_whole() {
    let dir = scratch("two-signals");
    let mut cut = Vec::new();
    for round in 0..16 {
        let second = if round % 2 == 0 {
            libc::SIGTERM
        } else {
            libc::SIGINT
        };
        let stats = dir.join(format!("{round}.json"));
        // 200,000 draws over the 4096 entries: every entry hit, a document of ~60 KB, written
        // in ~15 calls.
        let mut child = driver(0, 200_000, "wait")
            .env("POST_THEN_END_THREADS", "2")
            .env("IBJITTER_STATS", &stats)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let pid: i32 = loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "no READY line");
            if let Some(pid) = line.trim().strip_prefix("READY ") {
                break pid.parse().unwrap();
            }
        };
        // SAFETY: signals to our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        // The file appears as the handler opens it: it is writing now.
        let t0 = Instant::now();
        while !stats.exists() && t0.elapsed() < Duration::from_secs(5) {
            std::hint::spin_loop();
        }
        // SAFETY: as above (the child is not reaped yet: its pid is its own).
        unsafe { libc::kill(pid, second) };
        child.stdout = Some(out.into_inner());
        let r = finish(child, "post_then_end, two signals", Duration::from_secs(10));
        let died_of = r.status.signal();
        assert!(
            died_of == Some(libc::SIGTERM) || died_of == Some(second),
            "round {round}: {} {}",
            r.status,
            r.stderr
        );
        let text = std::fs::read_to_string(&stats).unwrap_or_default();
        match serde_json::from_str::<Value>(&text) {
            Ok(s) => {
                assert_eq!(s["posts_total"], 200_000, "round {round}: {s}");
                let name = if died_of == Some(libc::SIGTERM) {
                    "SIGTERM"
                } else {
                    "SIGINT"
                };
                assert_eq!(
                    s["ended_by"], name,
                    "round {round}: the file says another end"
                );
            }
            Err(e) => cut.push(format!("round {round}: {} bytes: {e}", text.len())),
        }
        assert!(
            warnings(&r.stderr).is_empty(),
            "round {round}: {}",
            r.stderr
        );
    }
    assert!(cut.is_empty(), "stats files cut short: {cut:#?}");
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Asserts one warning naming `path`, saying `why`.
fn warned_once(r: &Ran, path: &Path, why: &str) {
    let w = warnings(&r.stderr);
    let about: Vec<_> = w
        .iter()
        .filter(|l| l.contains(path.to_str().unwrap()))
        .collect();
    assert!(
        about.len() == 1 && about[0].contains(why),
        "expected one warning naming {} and saying \"{why}\" ({}):\n{}{}",
        path.display(),
        r.status,
        r.stdout,
        r.stderr
    );
}

/// A FIFO (with no reader) as the stats or trace file: the program ends promptly, at exit
/// or at SIGTERM, with a warning; nothing blocks.
#[test]
fn a_fifo_as_an_output_file_neither_hangs_nor_is_written() {
    let dir = scratch("fifo");
    let fifo = dir.join("stats.json");
    mkfifo(&fifo);
    let r = run(driver(0, 10, "exit").env("IBJITTER_STATS", &fifo));
    assert!(r.status.success(), "{}\n{}", r.status, r.stderr);
    warned_once(&r, &fifo, "not a regular file");
    let r = run(driver(0, 10, "term").env("IBJITTER_STATS", &fifo));
    assert_eq!(r.status.signal(), Some(libc::SIGTERM), "{}", r.stderr);
    warned_once(&r, &fifo, "not a regular file");
    let trace = dir.join("trace.txt");
    mkfifo(&trace);
    let r = run(driver(0, 10, "exit")
        .env("IBJITTER_TRACE", &trace)
        .env("IBJITTER_TRACE_MAX", "100"));
    assert!(r.status.success(), "{}\n{}", r.status, r.stderr);
    warned_once(&r, &trace, "not a regular file");
}

/// A FIFO that a reader has open as the stats file: opening it for writing would succeed
/// (and hand the reader an empty file, an end of file: a side effect of its own, as opening a
/// device may have). The shim looks before it opens: the reader never sees a writer.
#[test]
fn an_unfit_output_path_is_never_opened() {
    let dir = scratch("fifo-read");
    let fifo = dir.join("stats.json");
    mkfifo(&fifo);
    // The reader blocks in open(2) until some writer opens the FIFO.
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (fifo, opened) = (fifo.clone(), opened.clone());
        std::thread::spawn(move || {
            let _f = std::fs::File::open(&fifo).unwrap();
            opened.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let r = run(driver(0, 10, "exit").env("IBJITTER_STATS", &fifo));
    assert!(
        r.status.success(),
        "{}
{}",
        r.status,
        r.stderr
    );
    warned_once(&r, &fifo, "not a regular file");
    std::thread::sleep(Duration::from_millis(100));
    let shim_opened_it = opened.load(std::sync::atomic::Ordering::SeqCst);
    if !shim_opened_it {
        // Let the reader go (this test is its writer now).
        let _w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    }
    reader.join().unwrap();
    assert!(
        !shim_opened_it,
        "the shim opened the FIFO its reader waited on"
    );
}

/// A symbolic link as the stats or trace file (a path like `/tmp/ibjitter.%p.json` is
/// predictable): the link is not followed, its target keeps its contents.
#[test]
fn a_symlink_as_an_output_file_is_not_followed() {
    let dir = scratch("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = dir.join("stats.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let r = run(driver(0, 10, "exit").env("IBJITTER_STATS", &link));
    assert!(r.status.success(), "{}\n{}", r.status, r.stderr);
    warned_once(&r, &link, "symbolic link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let r = run(driver(0, 10, "term").env("IBJITTER_STATS", &link));
    assert_eq!(r.status.signal(), Some(libc::SIGTERM), "{}", r.stderr);
    warned_once(&r, &link, "symbolic link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let trace = dir.join("trace.txt");
    std::os::unix::fs::symlink(&victim, &trace).unwrap();
    let r = run(driver(0, 10, "exit")
        .env("IBJITTER_TRACE", &trace)
        .env("IBJITTER_TRACE_MAX", "100"));
    assert!(r.status.success(), "{}\n{}", r.status, r.stderr);
    warned_once(&r, &trace, "symbolic link");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

/// A file another user made at the stats path, in a sticky world-writable directory (as in
/// `/tmp`), is left alone, at exit and at SIGTERM. Needs root to make the file (as CI runs).
#[test]
fn another_users_file_in_a_sticky_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("other-user");
    let sticky = dir.join("tmp");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = sticky.join("stats.json");
    std::fs::write(&theirs, "theirs\n").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Not a skip: without root the file cannot be given to another user, and the test says so.
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534))
        .unwrap_or_else(|e| panic!("chown to uid 65534 (this test needs root): {e}"));
    for end in ["exit", "term"] {
        let r = run(driver(0, 10, end).env("IBJITTER_STATS", &theirs));
        warned_once(&r, &theirs, "another user");
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "theirs\n",
            "{end}"
        );
        if end == "exit" {
            assert!(r.status.success(), "{}\n{}", r.status, r.stderr);
        } else {
            assert_eq!(r.status.signal(), Some(libc::SIGTERM), "{}", r.stderr);
        }
    }
}

/// Stats written at SIGTERM after a live `set`: the totals are every table's draws (100 of
/// 2 µs, then 20 of 1 ms), not every hit priced at the new table; index hits and percentiles
/// are the new table's.
#[test]
fn stats_at_a_signal_after_a_live_set_count_both_tables() {
    use ibjitter_control::{self as ctl, Command as Request};
    let dir = scratch("live-set");
    let stats = dir.join("stats.json");
    let mut cmd = injected(&built().driver);
    let mut child = cmd
        .args(["0", "100", "term", "20"])
        .env("IBJITTER_DELAY", "2us")
        .env("IBJITTER_CONTROL", "1")
        .env("IBJITTER_STATS", &stats)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let Some(pid) = line.trim().strip_prefix("READY ") else {
        let _ = child.kill();
        let ran = finish(child, "post_then_end", Duration::from_secs(5));
        panic!("no READY line: {line:?}\n{}", ran.stderr);
    };
    let pid: u32 = pid.parse().unwrap();
    let set = ctl::send(
        pid,
        Request::Set,
        "IBJITTER_DELAY=1ms",
        Duration::from_secs(5),
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    child.stdout = Some(out.into_inner());
    let r = finish(child, "post_then_end", Duration::from_secs(10));
    let set = set.unwrap_or_else(|e| panic!("live set: {e}\n{}", r.stderr));
    assert!(set.ok, "{set:?}");
    assert_eq!(r.status.signal(), Some(libc::SIGTERM), "{}", r.stderr);
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "SIGTERM", "{s}");
    assert_eq!(s["posts_total"], 120, "{s}");
    assert_eq!(s["draws"], 120, "{s}");
    assert_eq!(s["delays_injected"], 120, "{s}");
    assert_eq!(s["sum_ns"], 100 * 2_000 + 20 * 1_000_000, "{s}");
    assert_eq!(s["live_sets"], 1, "{s}");
    let since: u64 = s["index_hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[1].as_u64().unwrap())
        .sum();
    assert_eq!(since, 20, "index hits since the set: {s}");
    assert_eq!(s["delay_ns"]["count"], 20, "{s}");
    assert_eq!(s["delay_ns"]["percentiles"]["p0"], 1_000_000, "{s}");
}

/// The shim's handler, chained to a C program's SIGINT handler, has that handler's flags and
/// mask: SA_RESTART as the program asked (the Python test above: no SA_RESTART when it did
/// not), and the signals the program blocks while its handler runs still blocked.
#[test]
fn the_shims_handler_keeps_the_programs_flags_and_mask() {
    let dir = scratch("flags");
    let r = run(driver(0, 10, "int-exit").env("IBJITTER_STATS", dir.join("stats.json")));
    assert!(r.status.success(), "{}\n{}{}", r.status, r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("SIGINT action: shim=1 restart=1 usr1_blocked=1"),
        "{}",
        r.stdout
    );
}

/// Runs the driver with POSTS_AFTER: waits for its READY line, does `meanwhile` with its pid,
/// then lets it post the rest and end.
fn driver_in_two_halves(cmd: &mut Command, meanwhile: impl FnOnce(u32)) -> Ran {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut before = String::new();
    let pid = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            let ran = finish(child, "post_then_end", Duration::from_secs(5));
            panic!("no READY line: {before}\n{}", ran.stderr);
        }
        if let Some(pid) = line.trim().strip_prefix("READY ") {
            break pid.parse().unwrap();
        }
        before.push_str(&line);
    };
    meanwhile(pid);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    child.stdout = Some(out.into_inner());
    let mut r = finish(child, "post_then_end", Duration::from_secs(10));
    r.stdout.insert_str(0, &before);
    r
}

/// A SIGINT the program catches and survives does not end its stats: the shim's handler
/// writes the file (a program that then `_exit`s still leaves one) and runs the program's
/// handler with the program's own flags and mask; the process goes on, and what ends it
/// writes the file again: a later SIGTERM (default action) with every post, priced with a
/// table set live after the SIGINT, or the normal exit. The shim used to latch at the first
/// signal: the file stayed "SIGINT" with that moment's counts, nothing later rewrote it at a
/// signal, and live sets were no longer seen by the signal-time writer.
#[test]
fn a_caught_sigint_does_not_end_the_stats() {
    use ibjitter_control::{self as ctl, Command as Request};
    let dir = scratch("caught-sigint");

    let stats = dir.join("term.json");
    let mut set = None;
    let r = driver_in_two_halves(
        injected(&built().driver)
            .args(["0", "100", "int-term", "20"])
            .env("IBJITTER_DELAY", "2us")
            .env("IBJITTER_CONTROL", "1")
            .env("IBJITTER_STATS", &stats),
        |pid| {
            let ans = ctl::send(
                pid,
                Request::Set,
                "IBJITTER_DELAY=1ms",
                Duration::from_secs(5),
            );
            set = Some(ans);
        },
    );
    let set = set
        .unwrap()
        .unwrap_or_else(|e| panic!("live set: {e}\n{}", r.stderr));
    assert!(set.ok, "{set:?}");
    assert_eq!(
        r.status.signal(),
        Some(libc::SIGTERM),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(r.stdout.contains("caught SIGINT"), "{}", r.stdout);
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "SIGTERM", "{s}");
    assert_eq!(s["posts_total"], 120, "{s}");
    assert_eq!(s["draws"], 120, "{s}");
    assert_eq!(s["sum_ns"], 100 * 2_000 + 20 * 1_000_000, "{s}");
    assert_eq!(s["live_sets"], 1, "{s}");
    assert_eq!(s["delay_ns"]["percentiles"]["p0"], 1_000_000, "{s}");

    let stats = dir.join("exit.json");
    let r = driver_in_two_halves(
        injected(&built().driver)
            .args(["0", "100", "int-exit", "20"])
            .env("IBJITTER_STATS", &stats),
        |_| {},
    );
    assert!(r.status.success(), "{}\n{}{}", r.status, r.stdout, r.stderr);
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "exit", "{s}");
    assert_eq!(s["posts_total"], 120, "{s}");

    // No exit handler runs: the file is the one written at the SIGINT.
    let stats = dir.join("_exit.json");
    let r = run(driver(0, 100, "int-_exit").env("IBJITTER_STATS", &stats));
    assert!(r.status.success(), "{}\n{}{}", r.status, r.stdout, r.stderr);
    let s = read_json(&stats);
    assert_eq!(s["ended_by"], "SIGINT", "{s}");
    assert_eq!(s["posts_total"], 100, "{s}");
}

/// A program that blocks a signal in its threads and takes it with `sigwait` (MPI programs'
/// shutdown threads; Python's `signal.sigtimedwait`): a process-directed SIGTERM must reach
/// that wait. The kernel gives it to any thread that does not block it; the shim's threads
/// (the delay line's timer, live control, the injection window) used to be such threads, so
/// the SIGTERM ran the shim's handler there and ended the program by the default action.
/// They now start with every signal blocked.
#[test]
fn a_signal_the_program_waits_for_never_lands_on_a_shim_thread() {
    let dir = scratch("sigwait");
    let stats = dir.join("stats.json");
    let script = &format!(
        "{PY_VERBS}{}",
        r#"
import ctypes, os, signal, time
verbs.ibv_open_device(None)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
def names():
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
# A thread names itself once it runs.
for _ in range(200):
    if sum(n.startswith("ibjitter-") for n in names()) >= 3:
        break
    time.sleep(0.01)
for tid in sorted(os.listdir("/proc/self/task")):
    name = open(f"/proc/self/task/{tid}/comm").read().strip()
    blk = [l.split()[1] for l in open(f"/proc/self/task/{tid}/status") if l.startswith("SigBlk:")][0]
    print("thread", name, blk, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
got = signal.sigtimedwait({signal.SIGTERM}, 5)
print("sigwait got", got.si_signo if got else None, flush=True)
"#
    );
    let r = run(injected(Path::new("python3"))
        .args(["-c", script])
        .env("IBJITTER_STATS", &stats)
        .env("IBJITTER_MODE", "line")
        .env("IBJITTER_CONTROL", "1")
        // The window's thread sleeps until then.
        .env("IBJITTER_START", "3600s"));
    let threads: Vec<(&str, u64)> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("thread "))
        .map(|l| {
            let (name, blk) = l.split_once(' ').unwrap();
            (name, u64::from_str_radix(blk, 16).unwrap())
        })
        .collect();
    let shims: Vec<&(&str, u64)> = threads
        .iter()
        .filter(|t| t.0.starts_with("ibjitter-"))
        .collect();
    let names: Vec<&str> = shims.iter().map(|t| t.0).collect();
    // (comm keeps 15 characters.)
    for want in ["ibjitter-line", "ibjitter-contro", "ibjitter-window"] {
        assert!(
            names.contains(&want),
            "{want} not running: {threads:?}\n{}",
            r.stderr
        );
    }
    // Every signal but glibc's two internal ones (SIGCANCEL 32, SIGSETXID 33), the two the
    // kernel never lets a thread block (SIGKILL 9, SIGSTOP 19), and the faults a thread
    // raises on itself (SIGILL 4, SIGBUS 7, SIGFPE 8, SIGSEGV 11: the program's crash handler).
    let never = [4u32, 7, 8, 9, 11, 19, 32, 33]
        .iter()
        .fold(0u64, |m, s| m | 1 << (s - 1));
    for (name, blk) in &shims {
        assert_eq!(
            blk | never,
            u64::MAX,
            "{name} leaves signals unblocked: {blk:#x}"
        );
    }
    assert!(
        r.status.success() && r.stdout.contains("sigwait got 15"),
        "{} (signal {:?})\n{}{}",
        r.status,
        r.status.signal(),
        r.stdout,
        r.stderr
    );
}

/// Runs `cmd` with stderr a pipe whose reader is already gone (a harness that closed it, a
/// logger that died), at most 10 s.
fn run_with_stderr_unread(cmd: &mut Command) -> Ran {
    let mut fds = [0; 2];
    // SAFETY: a pipe of our own; its read end closed at once.
    let write_end = unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        libc::close(fds[0]);
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(write_end))
        .spawn()
        .unwrap();
    finish(child, &format!("{cmd:?}"), Duration::from_secs(10))
}

/// A program whose stderr is a pipe nobody reads, and which never writes there itself, is
/// not killed by the shim's start-up line, exit line or signal-time warning (SIGPIPE's
/// default action): it ends as it would without the shim, with its stats written. Before,
/// it died of SIGPIPE at its device open.
#[test]
fn a_stderr_nobody_reads_never_kills_the_program() {
    let dir = scratch("stderr-unread");
    let stats = dir.join("stats.json");
    let r = run_with_stderr_unread(driver(0, 10, "exit").env("IBJITTER_STATS", &stats));
    assert!(r.status.success(), "{:?}, stdout {:?}", r.status, r.stdout);
    assert!(r.stdout.contains("posted 10"), "{}", r.stdout);
    assert_eq!(read_json(&stats)["posts_total"], 10);
    // Ended by SIGTERM with a stats path the signal-time writer refuses (a FIFO): its
    // warning goes to the unread pipe, and the program still ends by SIGTERM, not SIGPIPE.
    let fifo = dir.join("fifo.json");
    mkfifo(&fifo);
    let r = run_with_stderr_unread(driver(0, 10, "term").env("IBJITTER_STATS", &fifo));
    assert_eq!(
        r.status.signal(),
        Some(libc::SIGTERM),
        "{:?}, {:?}",
        r.status,
        r.stdout
    );
    assert!(r.stdout.contains("posted 10"), "{}", r.stdout);
}

/// `driver(0, posts, end)` run by `sh` under `ulimit -f 1` (a file-size limit of 512 or 1024
/// bytes, less than a stats file) and no core files.
fn under_file_size_limit(posts: u64, end: &str) -> Command {
    let b = built();
    let mut cmd = injected(Path::new("sh"));
    // Live control on, as by default: its segment is larger than the limit too.
    cmd.env_remove("IBJITTER_CONTROL");
    cmd.args(["-c", "ulimit -c 0; ulimit -f 1; exec \"$@\"", "sh"])
        .arg(&b.driver)
        .args(["0", &posts.to_string(), end]);
    cmd
}

/// Past the file-size limit (`ulimit -f`), the stats file is not written: the program ends as
/// it would without the shim (not killed by SIGXFSZ, whose default action ends a process
/// that writes past it), one warning says so, and the file is left empty rather than cut
/// short (a reader would take a prefix for a whole document). At exit, and at a signal. The
/// live-control segment, reserved at the device open, is refused the same way (one warning,
/// no live control): it killed the program there.
#[test]
fn a_file_size_limit_leaves_the_stats_empty_and_said_never_a_killed_program() {
    let dir = scratch("file-size-limit");
    for (end, said) in [
        ("exit", "cannot write stats file"),
        ("term", "(at a signal)"),
    ] {
        let stats = dir.join(format!("{end}.json"));
        let r = run(under_file_size_limit(1000, end).env("IBJITTER_STATS", &stats));
        let ended_as_asked = match end {
            "exit" => r.status.success() && r.stdout.contains("posted 1000"),
            _ => r.status.signal() == Some(libc::SIGTERM),
        };
        assert!(ended_as_asked, "{end}: {:?}: {}", r.status, r.stderr);
        let w = warnings(&r.stderr);
        let stats_said = w
            .iter()
            .filter(|l| l.contains(said) && l.contains("left empty"));
        let control_said = w.iter().filter(|l| l.contains("live control unavailable"));
        assert!(
            w.len() == 2 && stats_said.count() == 1 && control_said.count() == 1,
            "{end}: {}",
            r.stderr
        );
        assert_eq!(std::fs::metadata(&stats).unwrap().len(), 0, "{end}");
    }
}

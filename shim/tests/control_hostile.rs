//! Live control in hostile hosts, with the built libibjitter.so over the stub libibverbs: a
//! full `/dev/shm`, a segment truncated under its process, a process that exec'd a program
//! without the shim. The rule: one clear warning, then pass-through; never a fault, never a
//! wait for nobody.
//!
//! Each test re-runs itself (this binary, `--exact`) inside a private mount namespace with a
//! small tmpfs of its own on `/dev/shm` (`unshare -m`; the tests run as root, as CI does), so
//! it can fill that filesystem and never touches the segments of anyone else on the machine;
//! that copy then starts the injected child processes.
mod support;

use ibjitter_control::{self as ctl, Command as Request};
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// Set in the copy that runs inside the private mount namespace.
const PRIVATE: &str = "IBJITTER_HOSTILE_PRIVATE";
/// Set in an injected child: its scenario.
const CHILD: &str = "IBJITTER_HOSTILE_CHILD";

/// Re-runs test `test` of this binary in a private mount namespace whose `/dev/shm` is a new
/// tmpfs of `size`; asserts it passed.
fn in_private_shm(test: &str, size: &str) {
    // Built once for the tests of this binary (they run in parallel).
    static BUILT: std::sync::OnceLock<(std::path::PathBuf, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    let (so, stub) = BUILT.get_or_init(|| (build_shim(), build_stub()));
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=\"$0\",mode=1777 ibjitter-hostile /dev/shm && exec \"$@\"")
        .arg(size)
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"]);
    without_ibjitter_env(&mut cmd);
    cmd.env(PRIVATE, "1")
        .env("IBJITTER_TEST_SO", so)
        .env("IBJITTER_TEST_STUB", stub);
    let out = cmd.output().expect("run unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    // Not a skip: without a private /dev/shm the test cannot run, and says why.
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "{test} in a private /dev/shm ({size}; needs root for unshare -m and mount): {}",
        out.status
    );
}

fn without_ibjitter_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
}

fn private() -> bool {
    std::env::var_os(PRIVATE).is_some() && std::env::var_os(CHILD).is_none()
}

fn load_shim() -> Shim {
    Shim::load(
        Path::new(&std::env::var("IBJITTER_TEST_SO").unwrap()),
        Path::new(&std::env::var("IBJITTER_TEST_STUB").unwrap()),
    )
}

/// The injected child: opens a fake device (which arms live control), says READY, then
/// posts every ~1 ms for `IBJITTER_TEST_HOLD_MS` ms; "exec" then becomes `sleep 3` instead,
/// a program without the shim, with the same pid and start time.
fn child(scenario: &str) {
    let shim = load_shim();
    let mut fc = FakeContext::new(counting_post_send);
    // SAFETY: the stub returns the fake context we pass as the device.
    let ctx = unsafe { (shim.open_device)(fc.ctx() as *mut _) };
    let mut q = fake_qp(ctx);
    let qpx: *mut verbs_abi::ibv_qp_ex = &mut *q;
    // SAFETY: the stub's ibv_create_qp returns its pd argument: our fake QP.
    let qp = unsafe { (shim.create_qp)(qpx as *mut _, std::ptr::null_mut()) };
    // What a program may do to descriptors it did not open: close them (`closefrom`, a
    // daemon's close-all loop) or put its own files under their numbers (`dup2`, a shell's
    // `exec 4<file`).
    let mine: Vec<std::fs::File> = match scenario {
        "close" | "replace" => {
            let fds = shims_descriptors();
            assert!(fds.len() >= 2, "the shim's segment and wake FIFO: {fds:?}");
            // Above the numbers the program's own opens take first.
            assert!(fds.iter().all(|&fd| fd >= 100), "{fds:?}");
            fds.iter()
                .filter_map(|&fd| take_descriptor(fd, scenario == "replace"))
                .collect()
        }
        "nofile" => {
            // A sandbox that allows no more descriptors (OpenSSH's rlimit sandbox): `poll`
            // on one descriptor then fails at once with EINVAL.
            let mut none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: valid rlimits for this process (the hard limit kept).
            unsafe {
                assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut none), 0);
                none.rlim_cur = 0;
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &none), 0);
            }
            Vec::new()
        }
        _ => Vec::new(),
    };
    println!("READY {}", std::process::id());
    if scenario == "exec" {
        use std::os::unix::process::CommandExt;
        let e = Command::new("sleep").arg("3").exec();
        panic!("exec sleep: {e}");
    }
    let hold: u64 = std::env::var("IBJITTER_TEST_HOLD_MS")
        .unwrap()
        .parse()
        .unwrap();
    let t0 = Instant::now();
    let mut posts = 0u64;
    // A file the test makes ends the hold early (IBJITTER_TEST_STOP, if set).
    let stop = std::env::var_os("IBJITTER_TEST_STOP").map(std::path::PathBuf::from);
    while t0.elapsed() < Duration::from_millis(hold) && !stop.as_ref().is_some_and(|p| p.exists()) {
        // SAFETY: a fake QP of a patched fake context.
        assert_eq!(unsafe { ibv_post_send(qp) }, 0);
        posts += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: the context is ours; the stub's close does nothing.
    unsafe { (shim.close_device)(ctx) };
    let provider = PROVIDER_POSTS.load(std::sync::atomic::Ordering::Relaxed);
    println!("RESULT posts {posts} provider {provider}");
    for mut f in mine {
        // Everything the program put there is still there for it to read.
        use std::io::Read;
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        println!("KEPT {} of {}", got.len(), OWN_FILE.len());
    }
}

/// What the program's own files (put under the shim's descriptors) hold.
const OWN_FILE: &[u8] = &[b'x'; 4096];

/// The descriptors the shim holds open in this process: those whose file is in the control
/// directory.
fn shims_descriptors() -> Vec<i32> {
    let dir = ctl::dir();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&dir)))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Closes descriptor `fd`; with `replace`, puts a file of the program's own under its number
/// (as `dup2` does) and returns it, for reading at the end.
fn take_descriptor(fd: i32, replace: bool) -> Option<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    if !replace {
        // SAFETY: closing a descriptor we do not own is the point (the shim's).
        assert_eq!(unsafe { libc::close(fd) }, 0);
        return None;
    }
    let path = std::env::temp_dir().join(format!("ibjitter-own-file.{}.{fd}", std::process::id()));
    std::fs::write(&path, OWN_FILE).unwrap();
    let own = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // SAFETY: dup2 of our own file onto the shim's number (closing its file there).
    assert_eq!(unsafe { libc::dup2(own.as_raw_fd(), fd) }, fd);
    // SAFETY: fd is now ours (a duplicate of `own`, dropped here).
    Some(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Starts the injected child for `scenario` (from the private copy), returns it and its pid.
fn spawn_child(test: &str, scenario: &str, hold_ms: u64) -> (Child, u32) {
    spawn_child_under(&[], test, scenario, hold_ms)
}

/// [`spawn_child`] through the command `under` (e.g. `unshare` and its options); the pid
/// returned is the one the child says (its own namespace's).
fn spawn_child_under(under: &[&str], test: &str, scenario: &str, hold_ms: u64) -> (Child, u32) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match under.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    cmd.env(CHILD, scenario)
        .env("IBJITTER_TEST_HOLD_MS", hold_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let pid = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            let e = child.wait_with_output().unwrap();
            panic!(
                "no READY from {scenario}: {}\n{}",
                e.status,
                String::from_utf8_lossy(&e.stderr)
            );
        }
        // The harness's "test NAME ... " precedes it on the same line.
        if let Some((_, p)) = line.trim().split_once("READY ") {
            break p.parse::<u32>().unwrap();
        }
    };
    child.stdout = Some(out.into_inner());
    (child, pid)
}

/// Waits for `child`; returns (exit status, stdout, the shim's stderr lines).
fn finish(child: Child) -> (std::process::ExitStatus, String, Vec<String>) {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = stderr
        .lines()
        .filter(|l| l.starts_with("ibjitter"))
        .map(String::from)
        .collect();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        lines,
    )
}

/// A full `/dev/shm` (MPI's shared-memory transports fill Docker's 64 MB): a process that
/// opens a device says once that live control is unavailable, and passes every send through
/// (it died of SIGBUS, exit 135, when the sparse segment was first written through its
/// mapping).
#[test]
fn a_full_dev_shm_is_one_warning_and_pass_through() {
    const NAME: &str = "a_full_dev_shm_is_one_warning_and_pass_through";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "256k");
    }
    // Fill it: every block taken.
    let mut fill = std::fs::File::create("/dev/shm/fill").unwrap();
    let e = loop {
        if let Err(e) = std::io::Write::write_all(&mut fill, &[0u8; 4096]) {
            break e;
        }
    };
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let (child, pid) = spawn_child(NAME, "open", 50);
    let (status, stdout, lines) = finish(child);
    eprintln!("{status}\n{stdout}\n{lines:?}");
    assert!(status.success(), "{status}: {lines:?}");
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("live control unavailable"))
        .collect();
    assert_eq!(warned.len(), 1, "{lines:?}");
    assert!(
        warned[0].contains("No space left on device"),
        "{}",
        warned[0]
    );
    // Every send reached the provider.
    every_send_reached_the_provider(&stdout, 0);
    // Nothing half-made is left behind.
    let left: Vec<_> = std::fs::read_dir(ctl::dir())
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?} left in {}", ctl::dir().display());
    assert!(!ctl::path(pid).exists());
}

/// A same-user `truncate -s 0` of a live segment: the process keeps running and passing its
/// sends through (it died of SIGBUS at its control thread's next poll), says so once, and a
/// client finds the file is no longer a segment rather than waiting for an answer.
#[test]
fn a_truncated_live_segment_leaves_its_process_running() {
    const NAME: &str = "a_truncated_live_segment_leaves_its_process_running";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let (child, pid) = spawn_child(NAME, "open", 600);
    let a = ctl::send(pid, Request::Status, "", Duration::from_secs(2)).unwrap();
    assert!(a.ok, "{a:?}");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(ctl::path(pid))
        .unwrap();
    f.set_len(0).unwrap();
    // Its control thread sleeps until woken (as a request does) or a second passes.
    assert!(ctl::wake(pid));
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let e = ctl::send(pid, Request::Pause, "", Duration::from_secs(2)).unwrap_err();
    assert!(e.contains("is not a control segment"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    let (status, stdout, lines) = finish(child);
    eprintln!("{status}\n{stdout}\n{lines:?}");
    assert!(status.success(), "{status}: {lines:?}");
    let warned = lines.iter().filter(|l| l.contains("truncated")).count();
    assert_eq!(warned, 1, "{lines:?}");
    // Every send reached the provider, before and after the truncation.
    every_send_reached_the_provider(&stdout, 100);
}

/// A sandbox that refuses `rename` (the segment is made under a temporary name and renamed
/// into place): the process says once that live control is unavailable, passes every send
/// through, and leaves nothing in the control directory. Before, its `<pid>.<ns>.new` and
/// `<pid>.<ns>.wake` stayed there for good.
#[test]
fn a_segment_that_cannot_be_renamed_into_place_leaves_no_file() {
    const NAME: &str = "a_segment_that_cannot_be_renamed_into_place_leaves_no_file";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let sandbox = build_c("sandboxed", "sandboxed", &[]);
    let (child, pid) = spawn_child_under(&[sandbox.to_str().unwrap(), "rename"], NAME, "open", 50);
    let (status, stdout, lines) = finish(child);
    eprintln!("{status}\n{stdout}\n{lines:?}");
    assert!(status.success(), "{status}: {lines:?}");
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("live control unavailable"))
        .collect();
    assert_eq!(warned.len(), 1, "{lines:?}");
    let left: Vec<String> = std::fs::read_dir(ctl::dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{pid}.")))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "left in {}: {left:?}",
        ctl::dir().display()
    );
    every_send_reached_the_provider(&stdout, 0);
}

/// After an exec into a program without the shim, the file stays (same pid, same start
/// time) but nobody serves it: a request says so at once (it waited the whole 2 s).
#[test]
fn a_segment_left_by_an_exec_is_said_not_served_at_once() {
    const NAME: &str = "a_segment_left_by_an_exec_is_said_not_served_at_once";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let (mut child, pid) = spawn_child(NAME, "exec", 0);
    std::thread::sleep(Duration::from_millis(50));
    assert!(ctl::path(pid).exists(), "the exec'd process's file stays");
    let t0 = Instant::now();
    let e = ctl::send(pid, Request::Status, "", Duration::from_secs(2)).unwrap_err();
    let took = t0.elapsed();
    child.kill().unwrap();
    let _ = child.wait();
    eprintln!("{e} (after {took:?})");
    assert!(e.contains("not serving") && e.contains("exec'd"), "{e}");
    assert!(took < Duration::from_millis(1000), "{took:?}");
}

/// A `set` whose settings fill the text without a terminator (a request cut to fit, or
/// written by something else) is refused by the process, not applied as far as it reads.
#[test]
fn a_set_without_its_terminator_is_refused_by_the_process() {
    use ctl::Segment;
    use std::mem::offset_of;
    use std::os::unix::fs::FileExt;
    const NAME: &str = "a_set_without_its_terminator_is_refused_by_the_process";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let (child, pid) = spawn_child(NAME, "open", 400);
    // Valid settings, then blank lines up to the last byte: no NUL anywhere.
    let mut text = b"IBJITTER_DELAY=1ms".to_vec();
    text.resize(ctl::TEXT, b'\n');
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ctl::path(pid))
        .unwrap();
    let u64_at = |off: usize| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, off as u64).unwrap();
        u64::from_ne_bytes(b)
    };
    f.write_all_at(&text, offset_of!(Segment, text) as u64)
        .unwrap();
    f.write_all_at(
        &(Request::Set as u32).to_ne_bytes(),
        offset_of!(Segment, command) as u64,
    )
    .unwrap();
    let request = u64_at(offset_of!(Segment, request)) + 1;
    f.write_all_at(&request.to_ne_bytes(), offset_of!(Segment, request) as u64)
        .unwrap();
    // As a client does: the control thread sleeps until woken.
    assert!(ctl::wake(pid));
    let t0 = Instant::now();
    while u64_at(offset_of!(Segment, done)) != request {
        assert!(t0.elapsed() < Duration::from_secs(2), "no answer");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, offset_of!(Segment, result) as u64)
        .unwrap();
    let mut answer = vec![0u8; ctl::TEXT];
    f.read_exact_at(&mut answer, offset_of!(Segment, answer) as u64)
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..answer.iter().position(|&c| c == 0).unwrap()])
        .into_owned();
    assert_eq!(u32::from_ne_bytes(b), 1, "refused: {answer}");
    assert!(answer.contains("no terminator"), "{answer}");
    let a = ctl::send(pid, Request::Status, "", Duration::from_secs(2)).unwrap();
    assert!(
        a.ok && a.state & ctl::STATE_INJECTING == 0,
        "nothing applied: {a:?}"
    );
    let (status, _, lines) = finish(child);
    assert!(status.success(), "{status}: {lines:?}");
}

/// Another user made the control directory first (`/dev/shm` is shared by every user): the
/// injected process puts no segment in it (whoever owns it could answer `inject pause` with
/// "paused" while nothing paused), says once that live control is unavailable and why, and
/// passes every send through.
#[test]
fn another_users_control_directory_is_refused_by_the_process() {
    const NAME: &str = "another_users_control_directory_is_refused_by_the_process";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let dir = ctl::dir();
    std::fs::create_dir(&dir).unwrap();
    // nobody's, and writable by all: a planted directory.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let (child, pid) = spawn_child(NAME, "open", 50);
    let (status, stdout, lines) = finish(child);
    eprintln!("{status}\n{stdout}\n{lines:?}");
    assert!(status.success(), "{status}: {lines:?}");
    let warned: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("live control unavailable"))
        .collect();
    assert_eq!(warned.len(), 1, "{lines:?}");
    every_send_reached_the_provider(&stdout, 0);
    assert!(
        !ctl::path(pid).exists(),
        "a segment in another user's directory"
    );
    let inside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(inside.is_empty(), "{inside:?}");
}

/// Processes killed (SIGKILL, a job cancelled) never remove their control file; the next
/// process that starts live control removes those whose process is gone, and leaves a live
/// process's file alone (it still answers). Before, the files stayed for ever.
#[test]
fn files_of_killed_processes_are_removed_by_the_next_one() {
    const NAME: &str = "files_of_killed_processes_are_removed_by_the_next_one";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "4m");
    }
    // Killed at the end: it must outlive the rest of the test, however slow the runner.
    let (mut live, live_pid) = spawn_child(NAME, "hold", 60_000);
    // All started before any is killed: each one's start sweeps the others' files.
    let children: Vec<(Child, u32)> = (0..10).map(|_| spawn_child(NAME, "hold", 60_000)).collect();
    // An answer means its control thread is serving: its sweep, which comes first, is done.
    for (_, pid) in &children {
        ctl::send(*pid, Request::Status, "", Duration::from_secs(5)).unwrap();
    }
    let mut killed = Vec::new();
    for (mut c, pid) in children {
        c.kill().unwrap();
        let _ = c.wait();
        killed.push(pid);
    }
    for pid in &killed {
        assert!(ctl::path(*pid).exists(), "a killed process's file stays");
    }
    // Two as earlier shims left them (processes killed before an upgrade): named by the pid
    // alone, one of the previous layout.
    {
        use std::os::unix::fs::FileExt;
        for (i, pid) in killed[..2].iter().enumerate() {
            let legacy = ctl::dir().join(pid.to_string());
            std::fs::rename(ctl::path(*pid), &legacy).unwrap();
            if i == 0 {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&legacy)
                    .unwrap();
                f.write_all_at(b"IBJCTL02", 0).unwrap();
            }
        }
    }
    let (next, next_pid) = spawn_child(NAME, "hold", 300);
    // Its answer means its sweep, which comes before, is done.
    ctl::send(next_pid, Request::Status, "", Duration::from_secs(5)).unwrap();
    let (status, _, lines) = finish(next);
    assert!(status.success(), "{lines:?}");
    let left: Vec<u32> = ctl::listed().iter().map(|f| f.pid).collect();
    assert_eq!(left, [live_pid], "killed {killed:?}, the next {next_pid}");
    let a = ctl::send(live_pid, Request::Status, "", Duration::from_secs(2));
    live.kill().unwrap();
    let _ = live.wait();
    assert!(a.is_ok(), "the live process still answers: {a:?}");
}

/// Containers that share `/dev/shm` but not a pid namespace (`docker run --ipc=host`, a rank
/// per container) have the same small pids: each process keeps a file of its own, and one's
/// exit leaves the other's. Before, both were named `1`: the second replaced the first's
/// (`ibjitter inject` in the first container found the other's), and the first's exit
/// removed it.
#[test]
fn processes_of_one_pid_in_two_pid_namespaces_keep_their_own_files() {
    const NAME: &str = "processes_of_one_pid_in_two_pid_namespaces_keep_their_own_files";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "4m");
    }
    // Each the first process of a new pid namespace (pid 1), as a container's program; the
    // first holds until the test makes its stop file (a time limit could end it before the
    // second starts, on a loaded host), the second until it is killed (with unshare).
    let stop = std::path::Path::new("/dev/shm/stop-first");
    let container = ["unshare", "-p", "-f", "--mount-proc", "--kill-child"];
    let first_stops = [
        &["env", "IBJITTER_TEST_STOP=/dev/shm/stop-first"][..],
        &container,
    ]
    .concat();
    let (first, pid_a) = spawn_child_under(&first_stops, NAME, "hold", 60_000);
    let (mut second, pid_b) = spawn_child_under(&container, NAME, "hold", 60_000);
    assert_eq!((pid_a, pid_b), (1, 1));
    // Both serving: each wrote its segment and woke.
    let files = ctl::listed();
    let ours = ctl::pid_ns();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files[0].ns != files[1].ns && files.iter().all(|f| f.pid == 1 && f.ns != ours),
        "{files:?}"
    );
    std::fs::write(stop, b"").unwrap();
    let (status, _, lines) = finish(first);
    assert!(status.success(), "{lines:?}");
    let left = ctl::listed();
    second.kill().unwrap();
    let _ = second.wait();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(files.contains(&left[0]), "{left:?} of {files:?}");
}

/// The control thread's voluntary context switches (its wake-ups), from /proc.
fn control_thread_wakeups(pid: u32) -> u64 {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == "ibjitter-contro" {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap();
            return status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
        }
    }
    panic!("no control thread in process {pid}");
}

/// Live control costs a busy node next to nothing while nobody asks: the control thread
/// sleeps until `ibjitter inject` wakes it (at most a second between heartbeats), and a
/// request still gets its answer at once. Before, it woke every 10 ms (98 wake-ups a second,
/// 0.7 % of a core here).
#[test]
fn the_control_thread_sleeps_until_asked() {
    const NAME: &str = "the_control_thread_sleeps_until_asked";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let (mut child, pid) = spawn_child(NAME, "hold", 5000);
    // Its first look (and sweep) done.
    ctl::send(pid, Request::Status, "", Duration::from_secs(2)).unwrap();
    let before = control_thread_wakeups(pid);
    std::thread::sleep(Duration::from_secs(2));
    let idle = control_thread_wakeups(pid) - before;
    let t0 = Instant::now();
    let a = ctl::send(pid, Request::Status, "", Duration::from_secs(2));
    let took = t0.elapsed();
    child.kill().unwrap();
    let _ = child.wait();
    eprintln!("{idle} wake-ups in 2 s idle; a request answered in {took:?}");
    assert!(a.is_ok(), "{a:?}");
    assert!(idle <= 6, "{idle} wake-ups in 2 s");
    assert!(took < Duration::from_millis(500), "{took:?}");
}

/// A program that allows itself no more descriptors once set up (a sandbox's
/// `RLIMIT_NOFILE` of 0): the control thread's `poll` fails at once, so it sleeps
/// [`ctl::POLL_MS`] between looks instead, says so once, and still answers. Before, it polled
/// again at once, for ever: 1,000 ms of CPU a second.
#[test]
fn a_program_that_allows_no_descriptors_keeps_its_cores() {
    const NAME: &str = "a_program_that_allows_no_descriptors_keeps_its_cores";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    let (child, pid) = spawn_child(NAME, "nofile", 2600);
    std::thread::sleep(Duration::from_millis(300));
    let before = thread_cpu_ms(pid, "ibjitter-contro");
    std::thread::sleep(Duration::from_millis(1000));
    let after = thread_cpu_ms(pid, "ibjitter-contro");
    let answered = ctl::send(pid, Request::Status, "", Duration::from_secs(2));
    let (status, stdout, lines) = finish(child);
    eprintln!("{status}\n{stdout}\n{lines:?}\ncontrol thread {before:?} -> {after:?} ms");
    assert!(status.success(), "{status}: {lines:?}");
    let spent = after.unwrap().saturating_sub(before.unwrap());
    assert!(spent < 200, "the control thread used {spent} ms of 1 s");
    assert!(answered.is_ok(), "{answered:?}");
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("cannot be polled"))
        .collect();
    assert_eq!(said.len(), 1, "{lines:?}");
}

/// The child's `RESULT posts provider` line: more than `least` posts, each of which reached
/// the provider.
fn every_send_reached_the_provider(stdout: &str, least: u64) {
    let result = stdout
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|r| r.1.to_string()))
        .expect("RESULT");
    let n: Vec<u64> = result
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(n[0] > least && n[0] == n[1], "{result}");
}

/// The CPU time (ms) the thread named `name` of `pid` used so far; None if it has none.
fn thread_cpu_ms(pid: u32, name: &str) -> Option<u64> {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // After the ")" that ends the name: utime and stime are the 12th and 13th.
            let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: u64 = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
            return Some(ticks * 1000 / hz);
        }
    }
    None
}

/// A program that closes the shim's descriptors (a daemon's close-all loop, `closefrom`) or
/// puts its own files under their numbers (`dup2`, a shell's `exec 4<file`): the control
/// thread says once that live control stops, removes its file, and never reads, writes or
/// closes those numbers again. Before, a closed wake FIFO made its thread spin a core (poll
/// answering at once), and a file put under the FIFO's number was read to its end by it:
/// the program's reads found nothing.
#[test]
fn a_program_that_takes_the_shims_descriptors_keeps_its_files_and_its_cores() {
    const NAME: &str = "a_program_that_takes_the_shims_descriptors_keeps_its_files_and_its_cores";
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    if !private() {
        return in_private_shm(NAME, "1m");
    }
    for scenario in ["close", "replace"] {
        let (child, pid) = spawn_child(NAME, scenario, 2600);
        // Past the control thread's next look (a second at most while nobody asks).
        std::thread::sleep(Duration::from_millis(1300));
        let file_left = ctl::path(pid).exists();
        let before = thread_cpu_ms(pid, "ibjitter-contro");
        std::thread::sleep(Duration::from_millis(1000));
        let after = thread_cpu_ms(pid, "ibjitter-contro");
        let (status, stdout, lines) = finish(child);
        eprintln!(
            "{scenario}: {status}\n{stdout}\n{lines:?}\ncontrol thread {before:?} -> {after:?} ms"
        );
        assert!(status.success(), "{scenario}: {status}: {lines:?}");
        let spent = after.unwrap_or(0).saturating_sub(before.unwrap_or(0));
        assert!(
            spent < 200,
            "{scenario}: the control thread used {spent} ms of 1 s"
        );
        let said: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains("live control stops"))
            .collect();
        assert_eq!(said.len(), 1, "{scenario}: {lines:?}");
        assert!(
            !file_left,
            "{scenario}: {} still there",
            ctl::path(pid).display()
        );
        if scenario == "replace" {
            let kept: Vec<&str> = stdout.lines().filter(|l| l.contains("KEPT ")).collect();
            assert!(kept.len() >= 2, "{stdout}");
            for k in kept {
                assert!(
                    k.ends_with("KEPT 4096 of 4096"),
                    "the program's own file was read: {k}"
                );
            }
        }
    }
}

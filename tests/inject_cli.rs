//! `ibjitter inject` against hostile control directories: another user's directory or file,
//! a lock someone holds, a segment of another pid namespace, one nobody serves, a request
//! that does not fit. A test process plays the injected process with the segment crate's
//! [`Server`] (what libibjitter.so's control thread runs).
//!
//! Tests that make segments re-run themselves (this binary, `--exact`) inside a private mount
//! namespace with a tmpfs of their own on `/dev/shm` (`unshare -m`; the tests run as root, as
//! CI does): they chown and lock files there and run `inject --all`, which must never reach
//! the segments of anyone else on the machine.
use ibjitter_control::{self as ctl, Reply, Server};
use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PRIVATE: &str = "IBJITTER_INJECT_TEST_PRIVATE";
/// Set in the process that serves a segment from another pid namespace.
const OTHER_NS: &str = "IBJITTER_INJECT_TEST_OTHER_NS";

/// Re-runs test `test` of this binary in a private mount namespace with a new tmpfs on
/// `/dev/shm`; asserts it passed.
fn in_private_shm(test: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m,mode=1777 ibjitter-inject-test /dev/shm && exec \"$@\"")
        .arg("sh")
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(PRIVATE, "1")
        .output()
        .expect("run unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    // Not a skip: without a private /dev/shm the test cannot run, and says why.
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "{test} in a private /dev/shm (needs root for unshare -m and mount): {}",
        out.status
    );
}

fn private() -> bool {
    std::env::var_os(PRIVATE).is_some()
}

/// Serves `server` until `stop`, answering every request "paused", as a shim would.
fn serve(server: Server, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Acquire) {
            std::thread::sleep(Duration::from_millis(ctl::POLL_MS));
            if let Ok(Some(req)) = server.poll() {
                let reply = Reply {
                    ok: true,
                    text: "table constant 1000 ns".into(),
                    state: ctl::STATE_PAUSED,
                    applied_ns: ctl::monotonic_ns(),
                    ..Reply::default()
                };
                server.answer(&req, &reply).unwrap();
            }
        }
    })
}

/// Runs `ibjitter inject ARGS`, killed if it takes longer than 10 s; returns its output and
/// how long it took.
fn inject(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .arg("inject")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "inject {args:?}: {} after {:?}\n{}{}",
        out.status,
        t0.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, t0.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn chown(p: &std::path::Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), None).unwrap();
}

/// A directory or file that is not the caller's own and private is refused before any
/// request: whoever made it could answer "paused" while nothing paused.
#[test]
fn another_users_directory_or_file_is_refused() {
    const NAME: &str = "another_users_directory_or_file_is_refused";
    if !private() {
        return in_private_shm(NAME);
    }
    let me = std::process::id();
    let (server, file) = ctl::create(me).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(server, stop.clone());
    let pid = me.to_string();
    // Served and ours: answered (the normal case still works).
    let (o, _) = inject(&["pause", &pid]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = ctl::dir();
    let nobody = 65534;
    for (what, undo) in [
        ("directory owner", 0),
        ("directory mode", 1),
        ("file owner", 2),
        ("file mode", 3),
    ] {
        match undo {
            0 => chown(&dir, nobody),
            1 => {
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                    .unwrap()
            }
            2 => chown(&file, nobody),
            _ => {
                std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                    .unwrap()
            }
        }
        for args in [vec!["pause", &pid], vec!["pause", "--all"]] {
            let (o, _) = inject(&args);
            let e = stderr(&o);
            assert!(!o.status.success(), "{what}: {e}");
            assert!(o.stdout.is_empty(), "{what}: nothing answered");
            assert!(
                e.contains("refused") && e.contains("private"),
                "{what}: {e}"
            );
        }
        // Back to a private directory and file of this uid.
        chown(&dir, 0);
        chown(&file, 0);
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    // A link in place of the file is never followed.
    let real = dir.join("elsewhere");
    std::fs::rename(&file, &real).unwrap();
    std::os::unix::fs::symlink(&real, &file).unwrap();
    let (o, _) = inject(&["status", &pid]);
    assert!(
        !o.status.success() && stderr(&o).contains("symbolic link"),
        "{}",
        stderr(&o)
    );
    stop.store(true, Release);
    t.join().unwrap();
}

/// A lock held by someone else (another `inject` stuck, or a hostile holder) costs the
/// request's timeout, not forever, and the error names the process and the holder.
#[test]
fn a_held_lock_gives_up_within_the_timeout_and_names_the_holder() {
    const NAME: &str = "a_held_lock_gives_up_within_the_timeout_and_names_the_holder";
    if !private() {
        return in_private_shm(NAME);
    }
    let me = std::process::id();
    let (server, file) = ctl::create(me).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(server, stop.clone());
    let held = std::fs::File::open(&file).unwrap();
    // SAFETY: flock on our own descriptor.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) },
        0
    );
    for args in [
        vec!["status".to_string(), me.to_string()],
        vec!["status".into(), "--all".into()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (o, took) = inject(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.contains(&format!(
                "control file of process {me} stayed locked by process {me}"
            )),
            "{e}"
        );
        assert!(took < Duration::from_secs(4), "{took:?}");
    }
    drop(held);
    let (o, _) = inject(&["status", &me.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    stop.store(true, Release);
    t.join().unwrap();
}

/// The process that serves a segment from a pid namespace of its own (a container sharing
/// `/dev/shm`): made with `unshare -p --mount-proc`, it is pid 2 there.
fn serve_in_other_namespace() {
    let (server, _) = ctl::create(std::process::id()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(server, stop.clone());
    println!("SERVING {}", std::process::id());
    // Until the test closes our stdin.
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    stop.store(true, Release);
    t.join().unwrap();
}

/// `--all` never removes the file of a live process of another pid namespace (its pid means
/// another process here, or none): it says the file is not reachable from this namespace and
/// leaves it. A file nobody serves (its process exec'd without the shim) is said at once.
#[test]
fn all_leaves_other_namespaces_and_unserved_files_alone_and_says_so() {
    const NAME: &str = "all_leaves_other_namespaces_and_unserved_files_alone_and_says_so";
    if std::env::var_os(OTHER_NS).is_some() {
        return serve_in_other_namespace();
    }
    if !private() {
        return in_private_shm(NAME);
    }
    let exe = std::env::current_exe().unwrap();
    // sh is pid 1 of the new namespace and forks the server (pid 2), as a container's init.
    let mut other = Command::new("unshare")
        .args([
            "-p",
            "-f",
            "--mount-proc",
            "sh",
            "-c",
            "\"$0\" \"$@\"; true",
        ])
        .arg(exe)
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(OTHER_NS, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(other.stdout.take().unwrap());
    let inner = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "no SERVING");
        if let Some((_, p)) = line.trim().split_once("SERVING ") {
            break p.parse::<u32>().unwrap();
        }
    };
    // Its own namespace's pid: here that pid is another process.
    assert_ne!(inner, other.id());
    let (o, _) = inject(&["status", "--all"]);
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains(&format!("{inner}: ")) && e.contains("not reachable from this pid namespace"),
        "{e}"
    );
    assert!(!e.contains("removed"), "{e}");
    assert!(
        ctl::listed().iter().any(|f| f.pid == inner),
        "the live process's file was removed"
    );
    // Addressed by its pid, its file (named by its namespace) is found and said unreachable,
    // not missing.
    let (o, _) = inject(&["status", &inner.to_string()]);
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("not reachable from this pid namespace"),
        "{e}"
    );
    // A file of this process that nobody serves: said without waiting for an answer.
    let me = std::process::id();
    let (_unserved, _) = ctl::create(me).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (o, took) = inject(&["status", "--all"]);
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "process {me} has a control file but is not serving it"
        )),
        "{e}"
    );
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(ctl::path(me).exists());
    assert_eq!(
        std::fs::metadata(ctl::path(me)).unwrap().mode() & 0o777,
        0o600
    );
    drop(other.stdin.take());
    assert!(other.wait().unwrap().success());
}

/// A `set` whose text does not fit a request (1023 bytes) is refused with the limit before
/// any process is addressed (it was cut, and another table file got applied).
#[test]
fn a_set_too_long_for_a_request_is_refused_with_the_limit() {
    let dir = std::env::temp_dir().join(format!("ibjitter-inject-long-{}", std::process::id()));
    let mut deep = dir.clone();
    for i in 0..6 {
        deep.push(format!("{i}{}", "d".repeat(200)));
    }
    std::fs::create_dir_all(&deep).unwrap();
    let table = deep.join("t.tbl");
    std::fs::write(&table, "1000\n").unwrap();
    let (o, _) = inject(&["set", "--table", table.to_str().unwrap(), "4000000"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("at most 1023 bytes"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Set in the process that serves a segment where `/proc` is an empty directory.
const NO_PROC: &str = "IBJITTER_INJECT_TEST_NO_PROC";

/// `--all` never removes the file of a live process that made it without a readable `/proc`
/// (a chroot, a sandbox): whether that process lives cannot be told, so its file is said to
/// be unreachable and left alone, and the process keeps its live control.
#[test]
fn all_leaves_the_file_of_a_process_without_proc_alone() {
    const NAME: &str = "all_leaves_the_file_of_a_process_without_proc_alone";
    if std::env::var_os(NO_PROC).is_some() {
        // Here /proc is an empty tmpfs: no start time, no pid namespace to record.
        assert!(std::fs::metadata("/proc/self/stat").is_err());
        return serve_in_other_namespace();
    }
    if !private() {
        return in_private_shm(NAME);
    }
    let exe = std::env::current_exe().unwrap();
    let mut other = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs ibjitter-no-proc /proc && exec \"$@\"")
        .arg("sh")
        .arg(exe)
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(NO_PROC, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(other.stdout.take().unwrap());
    let pid = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "no SERVING");
        if let Some((_, p)) = line.trim().split_once("SERVING ") {
            break p.parse::<u32>().unwrap();
        }
    };
    let (o, _) = inject(&["status", "--all"]);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("{pid}: ")) && e.contains("without a readable /proc"),
        "{e}"
    );
    assert!(!e.contains("removed"), "{e}");
    assert!(
        ctl::listed().iter().any(|f| f.pid == pid),
        "the live process's file was removed"
    );
    drop(other.stdin.take());
    other.wait().unwrap();
}

//! Each test that makes a segment of a pid that is not running uses its own fake pid (the
//! tests of one binary run in parallel); the files of this very process's pid are made under
//! [`OWN_PID`].
use super::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Held by the tests that make files of this very process's pid (they run in parallel).
static OWN_PID: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serves `server` as the shim does, echoing the request's text (or `long` text, when set),
/// until `stop`.
fn serve_echo(server: Server, stop: Arc<AtomicBool>, long: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Acquire) {
            std::thread::sleep(Duration::from_millis(POLL_MS));
            if let Ok(Some(req)) = server.poll() {
                let text = if long {
                    "x".repeat(TEXT * 2)
                } else {
                    req.text.clone().unwrap_or_default()
                };
                let reply = Reply {
                    ok: true,
                    text,
                    state: STATE_PAUSED,
                    posts: 7,
                    applied_ns: monotonic_ns(),
                    ..Reply::default()
                };
                server.answer(&req, &reply).unwrap();
            }
        }
    })
}

#[test]
fn a_segment_round_trips_text_and_knows_its_process() {
    let _own = OWN_PID.lock().unwrap_or_else(|e| e.into_inner());
    let me = std::process::id();
    let (server, p) = create(me).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve_echo(server, stop.clone(), false);
    let a = send(
        me,
        Command::Set,
        "IBJITTER_DELAY=200us",
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(a.text, "IBJITTER_DELAY=200us");
    assert!(a.ok && a.state == STATE_PAUSED && a.posts == 7, "{a:?}");
    stop.store(true, Release);
    t.join().unwrap();
    // A long answer is cut to what fits, and says so.
    let (server, _) = create(me).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve_echo(server, stop.clone(), true);
    let a = send(me, Command::Status, "", Duration::from_secs(2)).unwrap();
    assert_eq!(a.text.len(), TEXT - 1);
    assert!(a.text.ends_with("..."), "{}", a.text);
    let other = open(me).unwrap();
    assert_eq!(other.pid, me);
    assert!(listed().iter().any(|f| f.pid == me && f.path == p));
    stop.store(true, Release);
    t.join().unwrap();
    // Nobody serves it now (as after an exec without the shim): said at once, not after the
    // whole timeout.
    let t0 = Instant::now();
    let e = send(me, Command::Status, "", Duration::from_secs(2)).unwrap_err();
    assert!(e.contains("not serving"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    // A segment of a pid that is not running is stale; one that names another pid, or
    // has another size, is foreign (left alone).
    let fake = 4_000_000u32;
    let (_stale, fp) = create(fake).unwrap();
    assert!(matches!(open(fake), Err(OpenError::Stale)));
    std::fs::copy(&p, &fp).unwrap();
    assert!(matches!(open(fake), Err(OpenError::Foreign)));
    assert!(matches!(open(4_000_001), Err(OpenError::Missing)));
    remove_path(&path(fake));
    remove_path(&p);
    assert_eq!(Command::from_u32(2), Some(Command::Set));
    assert_eq!(Command::from_u32(9), None);
}

#[test]
fn a_request_that_does_not_fit_is_refused_with_the_limit() {
    let long = format!("IBJITTER_TABLE=/{}", "d".repeat(TEXT));
    let e = send(4_000_010, Command::Set, &long, Duration::from_secs(1)).unwrap_err();
    assert!(
        e.contains(&format!("{} bytes", long.len())) && e.contains("at most 1023 bytes"),
        "{e}"
    );
    assert!(check_text(&"y".repeat(TEXT - 1)).is_ok());
    assert!(check_text("IBJITTER_DELAY=1ms\0IBJITTER_PROB=1").is_err());
}

#[test]
fn a_text_without_its_terminator_is_no_settings_and_garbage_no_command() {
    let fake = 4_000_011u32;
    let (server, p) = create(fake).unwrap();
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    let mut s = Segment::zeroed();
    s.text = [b'x'; TEXT];
    s.command = Command::Set as u32;
    s.request = 1;
    write(&f, &s, field!(text)).unwrap();
    write(&f, &s, field!(command)).unwrap();
    write(&f, &s, field!(request)).unwrap();
    let req = server.poll().unwrap().expect("a pending request");
    assert_eq!((req.number, req.command), (1, Ok(Command::Set)));
    assert_eq!(req.text, None);
    server.answer(&req, &Reply::default()).unwrap();
    assert!(server.poll().unwrap().is_none(), "answered once");
    s.command = 0xdead_beef;
    s.request = 2;
    write(&f, &s, field!(command)).unwrap();
    write(&f, &s, field!(request)).unwrap();
    assert_eq!(server.poll().unwrap().unwrap().command, Err(0xdead_beef));
    remove_path(&p);
}

#[test]
fn a_truncated_or_overwritten_segment_is_no_request_and_no_fault() {
    let fake = 4_000_012u32;
    let (server, p) = create(fake).unwrap();
    assert!(server.poll().unwrap().is_none());
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(0).unwrap();
    let e = server.poll().unwrap_err();
    assert!(e.contains("truncated"), "{e}");
    assert_eq!(f.metadata().unwrap().len(), 0, "nothing written to it");
    f.write_all_at(&[0x5a; SIZE], 0).unwrap();
    assert!(server.poll().unwrap_err().contains("overwritten"));
    remove_path(&p);
}

#[test]
fn a_segment_of_another_layout_is_another_version() {
    use std::os::unix::fs::OpenOptionsExt;
    let fake = 4_000_013u32;
    let (_server, p) = create(fake).unwrap();
    let f = OpenOptions::new().write(true).mode(0o600).open(&p).unwrap();
    f.write_all_at(b"IBJCTL01", 0).unwrap();
    let e = open(fake).err().unwrap();
    assert!(
        matches!(e, OpenError::OtherVersion(ref m) if m == "IBJCTL01"),
        "{e:?}"
    );
    assert!(e.describe(fake).contains("another ibjitter version"));
    remove_path(&p);
}

#[test]
fn a_segment_of_another_pid_namespace_is_unreachable_not_stale() {
    let fake = 4_000_014u32;
    let (_server, p) = create(fake).unwrap();
    assert!(
        matches!(open(fake), Err(OpenError::Stale)),
        "same namespace: stale"
    );
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    for ns in [pid_ns().unwrap() + 1, 0] {
        let mut s = Segment::zeroed();
        s.pid_ns = ns;
        write(&f, &s, field!(pid_ns)).unwrap();
        assert!(matches!(open(fake), Err(OpenError::Unreachable)), "{ns}");
    }
    remove_path(&p);
}

/// The wake FIFO wakes the server's wait at once; a wake needs a FIFO of this user's with a
/// reader: a regular file or a link put in its place is never written, and no reader (an
/// exec'd process) is no wake.
#[test]
fn a_wake_reaches_the_server_and_nothing_else() {
    let fake = 4_000_015u32;
    let (server, p) = create(fake).unwrap();
    let t0 = Instant::now();
    assert!(wake(fake));
    server.wait().unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(IDLE_WAKE_MS / 2),
        "{:?}",
        t0.elapsed()
    );
    let w = wake_path(fake);
    drop(server);
    assert!(!wake(fake), "no reader: no wake");
    std::fs::remove_file(&w).unwrap();
    std::fs::write(&w, b"").unwrap();
    assert!(!wake(fake));
    assert_eq!(
        std::fs::metadata(&w).unwrap().len(),
        0,
        "a regular file is not written"
    );
    std::fs::remove_file(&w).unwrap();
    std::os::unix::fs::symlink(&p, &w).unwrap();
    let before = std::fs::read(&p).unwrap();
    assert!(!wake(fake));
    assert_eq!(std::fs::read(&p).unwrap(), before, "never through a link");
    remove(fake);
    assert!(!p.exists() && std::fs::symlink_metadata(&w).is_err());
}

/// Files are named by pid and pid namespace: another namespace's file of the same pid is
/// neither replaced, removed nor swept here (its name says whose it is, even when its
/// contents would pass for this namespace's); a file of an earlier shim (the pid alone) is
/// still found, and swept when its process is gone.
#[test]
fn a_pid_of_another_namespace_keeps_its_file_and_a_legacy_name_is_found() {
    let fake = 4_000_016u32;
    let (server, p) = create(fake).unwrap();
    let here = pid_ns().unwrap();
    assert_eq!(p, dir().join(format!("{fake}.{here}")));
    let other = dir().join(format!("{fake}.{}", here + 1));
    std::fs::copy(&p, &other).unwrap();
    drop(server);
    let (_again, p2) = create(fake).unwrap();
    assert_eq!(p2, p);
    remove(fake);
    assert!(
        !p.exists() && other.exists(),
        "another namespace's file stays"
    );
    let theirs = listed().into_iter().find(|f| f.path == other).unwrap();
    assert_eq!(theirs.ns, Some(here + 1));
    // (One file at a time: a sweep of the directory would take other tests' fake pids.)
    assert_eq!(sweep(&theirs, here), Swept::Left);
    assert!(other.exists(), "never swept from here");
    std::fs::remove_file(&other).unwrap();
    // An earlier shim's name: found, and stale (the pid runs nothing).
    let (_s, p3) = create(fake).unwrap();
    let legacy = dir().join(fake.to_string());
    std::fs::rename(&p3, &legacy).unwrap();
    assert!(matches!(open(fake), Err(OpenError::Stale)));
    let old = listed().into_iter().find(|f| f.path == legacy).unwrap();
    assert_eq!(old.ns, None);
    assert_eq!(sweep(&old, here), Swept::Removed);
    assert!(!legacy.exists(), "a gone process's legacy file is swept");
    remove_path(&p3);
    assert_eq!(parse_name("12.34"), Some((Kind::Segment, 12, Some(34))));
    assert_eq!(parse_name("12"), Some((Kind::Segment, 12, None)));
    assert_eq!(parse_name("12.34.wake"), Some((Kind::Wake, 12, Some(34))));
    assert_eq!(parse_name("12.34.new"), Some((Kind::Making, 12, Some(34))));
    assert_eq!(parse_name("12.new"), None);
    assert_eq!(parse_name("12.34.wake.x"), None);
    assert_eq!(parse_name("x"), None);
}

/// A half-made segment (its process died between making and renaming it) and a wake FIFO
/// whose segment is gone are swept once their process is gone here; a FIFO beside its
/// segment is the segment's sweep's, and another namespace's is never touched.
#[test]
fn leftovers_of_a_gone_process_are_swept() {
    let fake = 4_000_017u32;
    let here = pid_ns().unwrap();
    let (_server, p) = create(fake).unwrap();
    let fifo = wake_path(fake);
    let making = dir().join(format!("{fake}.{here}.new"));
    std::fs::write(&making, b"half").unwrap();
    let find = |path: &Path| entries().into_iter().find(|(_, f)| f.path == path).unwrap();
    let (kind, f) = find(&making);
    assert_eq!(sweep_leftover(kind, &f, here), Swept::Removed);
    assert!(!making.exists());
    // The FIFO stays while its segment does.
    let (kind, w) = find(&fifo);
    assert_eq!(kind, Kind::Wake);
    assert_eq!(sweep_leftover(kind, &w, here), Swept::Opened);
    std::fs::remove_file(&p).unwrap();
    assert_eq!(sweep_leftover(kind, &w, here + 1), Swept::Left);
    assert_eq!(sweep_leftover(kind, &w, here), Swept::Removed);
    assert!(std::fs::symlink_metadata(&fifo).is_err());
    // This process's own are never swept (it is not gone).
    let _own = OWN_PID.lock().unwrap_or_else(|e| e.into_inner());
    let mine = dir().join(format!("{}.{here}.new", std::process::id()));
    std::fs::write(&mine, b"").unwrap();
    let (kind, m) = find(&mine);
    assert_eq!(sweep_leftover(kind, &m, here), Swept::Left);
    std::fs::remove_file(&mine).unwrap();
}

/// A stale segment is swept with its FIFO, but not with a FIFO made after it: that one is a
/// new process's, which took the pid and is making its segment now (its FIFO comes first).
#[test]
fn a_stale_segment_is_swept_without_a_newer_fifo() {
    let fake = 4_000_018u32;
    let here = pid_ns().unwrap();
    let find = |p: &Path| listed().into_iter().find(|f| f.path == p).unwrap();
    let (server, p) = create(fake).unwrap();
    drop(server);
    assert_eq!(sweep(&find(&p), here), Swept::Removed);
    assert!(
        std::fs::symlink_metadata(wake_path(fake)).is_err(),
        "its own FIFO goes"
    );
    let (server, p) = create(fake).unwrap();
    drop(server);
    std::thread::sleep(Duration::from_millis(20));
    let _newer = make_wake_fifo(&wake_path(fake)).unwrap();
    assert_eq!(sweep(&find(&p), here), Swept::Removed);
    assert!(
        std::fs::symlink_metadata(wake_path(fake)).is_ok(),
        "a newer FIFO stays"
    );
    remove(fake);
}

//! What the shim does at load in a process that may never use verbs, and what live control
//! may change in a process the user left out: with the built libibjitter.so over the stub
//! libibverbs, each scenario in a child (this binary, re-run with `IBJITTER_STARTUP_CHILD`).
mod support;

use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const CHILD: &str = "IBJITTER_STARTUP_CHILD";

fn scenario() -> Option<String> {
    std::env::var(CHILD).ok()
}

fn child(test: &str, scenario: &str, env: &[(&str, &str)], wrapper: &[&str]) -> Command {
    child_command(test, CHILD, scenario, env, wrapper)
}

/// Loads the shim; opens a fake device and posts `posts` times unless `posts` is None.
fn run_child(posts: Option<u32>, hold: Duration) {
    let shim = load_child_shim();
    let Some(posts) = posts else { return };
    let mut fc = FakeContext::new(counting_post_send);
    // SAFETY: the stub returns the fake context we pass as the device.
    let ctx = unsafe { (shim.open_device)(fc.ctx() as *mut _) };
    let mut q = fake_qp(ctx);
    let qpx: *mut verbs_abi::ibv_qp_ex = &mut *q;
    // SAFETY: the stub's ibv_create_qp returns its pd argument: our fake QP.
    let qp = unsafe { (shim.create_qp)(qpx as *mut _, std::ptr::null_mut()) };
    println!("READY {}", std::process::id());
    let t0 = std::time::Instant::now();
    let mut n = 0;
    while n < posts || t0.elapsed() < hold {
        // SAFETY: a fake QP of a patched fake context.
        assert_eq!(unsafe { ibv_post_send(qp) }, 0);
        n += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: the context is ours; the stub's close does nothing.
    unsafe { (shim.close_device)(ctx) };
}

/// Calibrating the TSC costs 2 ms of busy time and reads the kernel's clocksource: a shell
/// or launcher under `LD_PRELOAD` that never opens a device must not pay it. `strace`
/// shows whether the clock was looked at (the clocksource file, `/proc/cpuinfo`).
#[test]
fn the_clock_is_chosen_at_first_use_not_at_load() {
    match scenario().as_deref() {
        Some("load") => return run_child(None, Duration::ZERO),
        Some("open") => return run_child(Some(5), Duration::ZERO),
        _ => {}
    }
    let dir = target_dir().join(format!("ibjitter-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let opened_clock = |scenario: &str| {
        let log = dir.join(format!("{scenario}.strace"));
        let strace = ["strace", "-f", "-qq", "-e", "trace=open,openat", "-o"];
        let log_arg = log.to_str().unwrap().to_string();
        let mut wrapper: Vec<&str> = strace.to_vec();
        wrapper.push(&log_arg);
        let out = child(
            "the_clock_is_chosen_at_first_use_not_at_load",
            scenario,
            &[("IBJITTER_DELAY", "100us")],
            &wrapper,
        )
        .output()
        .expect("run strace (tools/setup installs it)");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{scenario}: {stderr}");
        let calls = std::fs::read_to_string(&log).unwrap();
        let looked = calls
            .lines()
            .any(|l| l.contains("clocksource") || l.contains("/proc/cpuinfo"));
        (looked, stderr)
    };
    let (looked, _) = opened_clock("load");
    assert!(
        !looked,
        "a process that never opened a device looked at the clock"
    );
    // The check sees it when it happens: the first device open chooses the clock, and the
    // start-up line names it.
    let (looked, stderr) = opened_clock("open");
    assert!(looked, "the first device open did not look at the clock");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ibjitter: table"))
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    assert!(
        line.contains("clock tsc") || line.contains("clock CLOCK_MONOTONIC"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that `IBJITTER_RANKS` left out stays out: `ibjitter inject set` is refused there,
/// and status says why nothing is injected.
#[test]
fn a_rank_left_out_refuses_a_live_set() {
    use ibjitter_control::{self as ctl, Command as Request};
    if scenario().as_deref() == Some("left-out") {
        return run_child(Some(1), Duration::from_millis(1500));
    }
    let mut child = child(
        "a_rank_left_out_refuses_a_live_set",
        "left-out",
        &[("IBJITTER_RANKS", "1"), ("PMI_RANK", "0")],
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let pid = loop {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0,
            "no READY"
        );
        if let Some((_, p)) = line.trim().split_once("READY ") {
            break p.parse::<u32>().unwrap();
        }
    };
    // The control thread polls every 10 ms; give it a moment to serve.
    std::thread::sleep(Duration::from_millis(200));
    let ask = |c: Request, text: &str| ctl::send(pid, c, text, Duration::from_secs(2)).unwrap();
    let set = ask(Request::Set, "IBJITTER_DELAY=1ms");
    let status = ask(Request::Status, "");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    assert!(
        !set.ok,
        "a live set was applied in a rank left out: {set:?}"
    );
    assert!(set.text.contains("IBJITTER_RANKS"), "{set:?}");
    assert!(
        status.text.contains("pass-through") && status.text.contains("IBJITTER_RANKS"),
        "{status:?}"
    );
    assert_eq!(status.delayed, 0, "{status:?}");
    assert_eq!(status.state & ctl::STATE_INJECTING, 0, "{status:?}");
}

/// Eight threads open a device at once and post at once: the first one's first use
/// (choosing the clock, 2 ms of calibration; the table converted to its units) must be done
/// before any thread's post draws, or posts meanwhile see a table of zeros: counted as
/// delayed, never waited. Prints each thread's post time (ns).
fn concurrent_first_use() {
    let shim = load_child_shim();
    let barrier = std::sync::Barrier::new(8);
    let took: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let shim = &shim;
                let barrier = &barrier;
                s.spawn(move || {
                    let mut fc = FakeContext::new(counting_post_send);
                    let mut q = None;
                    barrier.wait();
                    // SAFETY: the stub returns the fake context we pass as the device.
                    let ctx = unsafe { (shim.open_device)(fc.ctx() as *mut _) };
                    let q = q.insert(fake_qp(ctx));
                    let qpx: *mut verbs_abi::ibv_qp_ex = &mut **q;
                    // SAFETY: the stub's ibv_create_qp returns its pd argument: our fake QP.
                    let qp = unsafe { (shim.create_qp)(qpx as *mut _, std::ptr::null_mut()) };
                    let t0 = now_ns();
                    // SAFETY: a fake QP of a patched fake context.
                    assert_eq!(unsafe { ibv_post_send(qp) }, 0);
                    now_ns() - t0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("TOOK {took:?}");
}

#[test]
fn threads_opening_devices_at_once_all_wait_their_delay() {
    if scenario().as_deref() == Some("concurrent") {
        return concurrent_first_use();
    }
    // Several processes: the race, when there is one, needs the threads to meet in the 2 ms.
    for round in 0..5 {
        let out = child(
            "threads_opening_devices_at_once_all_wait_their_delay",
            "concurrent",
            &[("IBJITTER_DELAY", "1ms")],
            &[],
        )
        .output()
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        let took: Vec<u64> = stdout
            .lines()
            .find_map(|l| l.split_once("TOOK ").map(|(_, t)| t))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap_or_else(|| panic!("no TOOK: {stdout}"));
        assert!(
            took.iter().all(|&t| t >= waited(1_000_000)),
            "round {round}: a post that the first use had not prepared for went without its 1 ms: {took:?} ns"
        );
    }
}

/// A library whose constructor opens a device and posts runs before the shim's own when the
/// loader initializes it first (preloaded after the shim here; a library the program links
/// is the same): its posts wait their delay, as the exit line says. Before, the first use
/// came before the settings were read: no clock, nothing waited (20 posts of 1 ms took
/// 1 us) while the exit said otherwise, and first use was never tried again.
#[test]
fn a_device_opened_before_the_shims_constructor_still_waits() {
    let (so, stub) = (build_shim(), build_stub());
    let early = build_c(
        "limited_post",
        "limited_post_at_load.so",
        &["-shared", "-fPIC", "-DIN_CONSTRUCTOR", "-ldl"],
    );
    let mut cmd = Command::new("true");
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.env(
        "LD_PRELOAD",
        format!("{} {}", so.display(), early.display()),
    )
    .env("LIMITED_POST_STUB", &stub)
    .env("LIMITED_POST_N", "20")
    .env("IBJITTER_DELAY", "1ms")
    .env("IBJITTER_CONTROL", "0");
    let (stdout, stderr) = run_ok(&mut cmd);
    eprintln!("{stdout}{stderr}");
    let posting_us: f64 = stdout
        .split("posting_us=")
        .nth(1)
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(stdout.contains("posts=20 provider=20 "), "{stdout}");
    assert!(
        posting_us >= 20_000.0,
        "20 posts of 1 ms took {posting_us} us"
    );
    assert!(stderr.contains("delayed 20 of 20 sends"), "{stderr}");
}

/// Two copies of the shim in one process (an installed one and a build tree's both
/// preloaded; glibc loads a file once, but two files twice): the second says once that it
/// stands aside and does nothing. Before, it said "no device was opened ... nothing was
/// delayed" after the first's exit line, and wrote the same stats file after the first:
/// `posts_total` 0 over the first's counts.
#[test]
fn a_second_copy_of_the_shim_stands_aside() {
    let (so, stub) = (build_shim(), build_stub());
    let driver = build_c("limited_post", "limited_post", &["-ldl"]);
    let dir = target_dir().join(format!("ibjitter-two-copies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let second = dir.join("libibjitter.so");
    std::fs::copy(&so, &second).unwrap();
    let stats = dir.join("stats.json");
    let mut cmd = Command::new(&driver);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg(&stub)
        .arg("20")
        .env(
            "LD_PRELOAD",
            format!("{} {}", so.display(), second.display()),
        )
        .env("IBJITTER_DELAY", "100us")
        .env("IBJITTER_CONTROL", "0")
        .env("IBJITTER_STATS", &stats);
    let (stdout, stderr) = run_ok(&mut cmd);
    eprintln!("{stdout}{stderr}");
    assert!(stdout.contains("posts=20 provider=20 "), "{stdout}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ibjitter: warning:"))
        .collect();
    assert!(
        warnings.len() == 1
            && warnings[0].contains(&format!("{} is loaded before", so.display()))
            && warnings[0].contains(&second.display().to_string()),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("delayed 20 of 20 sends").count(),
        1,
        "{stderr}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(doc["posts_total"], 20, "{doc}");
    assert_eq!(doc["delays_injected"], 20, "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// CLOCK_MONOTONIC that cannot be read (a seccomp filter refusing `clock_gettime` where the
/// vDSO falls back to the system call; here an interposer, `support/failing_clock.c`): from
/// the start, or after the shim's first read at load. The process opens a device and posts:
/// one warning says the clock cannot be read, every send passes through, the process ends
/// as without the shim, and the stats say why nothing was injected. Before, a failed read
/// was taken as 0: the first device open's TSC calibration spun for ever (790 ms of CPU a
/// second), and with every read failing std's `Instant::now` panicked at load in every
/// process (4 lines of panic on stderr).
#[test]
fn a_clock_that_cannot_be_read_is_one_warning_and_pass_through() {
    let (so, stub) = (build_shim(), build_stub());
    let driver = build_c("limited_post", "limited_post", &["-ldl"]);
    let failing = build_c(
        "failing_clock",
        "failing_clock.so",
        &["-shared", "-fPIC", "-ldl"],
    );
    let dir = target_dir().join(format!("ibjitter-failing-clock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for after in ["0", "1"] {
        let stats = dir.join(format!("after-{after}.json"));
        let mut cmd = Command::new(&driver);
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") || LAUNCHER_RANK_ENV.contains(&k.as_str()) {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .arg(&stub)
            .arg("20")
            .env(
                "LD_PRELOAD",
                format!("{} {}", failing.display(), so.display()),
            )
            .env("FAILING_CLOCK_AFTER", after)
            .env("IBJITTER_DELAY", "10us")
            .env("IBJITTER_STATS", &stats)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A hang is a failure, not a stuck suite (generous: a loaded host).
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "FAILING_CLOCK_AFTER={after}: still running after 20 s (it hung)\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "FAILING_CLOCK_AFTER={after}: {}\n{stdout}{stderr}",
            out.status
        );
        assert!(out.status.success(), "{after}: {}\n{stderr}", out.status);
        assert!(
            stdout.contains("posts=20 provider=20 "),
            "{after}: {stdout}"
        );
        assert!(!stderr.contains("panicked"), "{after}: {stderr}");
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("ibjitter: warning:"))
            .collect();
        assert!(
            warnings.len() == 1
                && warnings[0].contains("CLOCK_MONOTONIC cannot be read")
                && warnings[0].ends_with("(pass-through)"),
            "{after}: {stderr}"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert_eq!(doc["posts_total"], 20, "{after}: {doc}");
        assert_eq!(doc["delays_injected"], 0, "{after}: {doc}");
        assert_eq!(doc["injecting"], false, "{after}: {doc}");
        assert!(
            doc["disabled_reason"]
                .as_str()
                .is_some_and(|r| r.contains("CLOCK_MONOTONIC")),
            "{after}: {doc}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Minor page faults of `cmd` and every child it waited for (`wait4`'s rusage).
// Reaped by wait4, which returns its rusage (std's wait does not).
#[allow(clippy::zombie_processes)]
fn page_faults(cmd: &mut Command) -> i64 {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: all-zero rusage is valid; wait4 on our own child, which std never waits for.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert_eq!(status, 0, "{cmd:?} failed");
    usage.ru_minflt
}

/// The shim enters every process of a job: a shell running a job script's commands, each
/// forked and exec'd with the shim loaded again. Such a process, which never uses verbs,
/// must pay little for it. The send counters (4 MiB, one slot a thread) were written whole
/// at every load (the allocator's zeroed allocation of an over-aligned array) and read whole
/// at every fork and exit: 1,176 page faults more per command here, now 88 (the pages of
/// threads that never posted are never touched).
#[test]
fn a_shell_that_never_uses_verbs_pays_little_for_the_shim() {
    let so = build_shim();
    const COMMANDS: i64 = 20;
    let script = format!("for i in $(seq {COMMANDS}); do /bin/true; done");
    let shell = |preload: bool| {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        if preload {
            cmd.env("LD_PRELOAD", &so);
        }
        cmd
    };
    // The least of a few runs each, interleaved: faults vary little, but never fewer.
    let (mut plain, mut shim) = (i64::MAX, i64::MAX);
    for _ in 0..3 {
        plain = plain.min(page_faults(&mut shell(false)));
        shim = shim.min(page_faults(&mut shell(true)));
    }
    let each = (shim - plain) / (COMMANDS + 1);
    // The rest: the library's own pages, its relocations, its TLS.
    assert!(
        each < 500,
        "the shim added {each} page faults to each process (plain shell {plain}, with the shim {shim})"
    );
}

/// A plugin host that loads libibverbs itself (`RTLD_GLOBAL`), opens a device, unloads the
/// library and loads it again from another path, then opens a device again: the second open
/// reaches the shim's exported `ibv_open_device`, which calls the real one it found the
/// first time. Were that copy unloaded, the call would jump into unmapped memory. It is
/// not: glibc records a dependency of the shim on the library its `dlvsym(RTLD_NEXT)` finds
/// a symbol in (as for any lookup that adds one), so the first copy stays while the shim
/// is loaded, and the address stays good. Without the shim the first copy is unloaded (the
/// control). A guard: a change to how the shim finds its real functions must keep this.
#[test]
fn a_libibverbs_unloaded_and_loaded_again_keeps_working_under_the_shim() {
    let so = build_shim();
    let stub = build_stub();
    let program = build_c("reload_verbs", "reload_verbs", &["-ldl"]);
    let copy = stub
        .parent()
        .unwrap()
        .join(format!("copy-{}/libibverbs.so.1", std::process::id()));
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&stub, &copy).unwrap();
    for shim in [false, true] {
        let mut cmd = Command::new(&program);
        cmd.arg(&stub).arg(&copy);
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") {
                cmd.env_remove(k);
            }
        }
        cmd.env_remove("LD_PRELOAD").env("IBJITTER_CONTROL", "0");
        if shim {
            cmd.env("LD_PRELOAD", &so).env("IBJITTER_DELAY", "1us");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let all = format!("shim {shim}: {out:?}");
        assert!(out.status.success(), "{all}");
        assert!(stdout.contains("second open ok"), "{all}");
        // The control: without the shim the first copy really leaves.
        let unloaded = if shim { "no" } else { "yes" };
        assert!(stdout.contains(&format!("unloaded: {unloaded}")), "{all}");
    }
    std::fs::remove_dir_all(copy.parent().unwrap()).unwrap();
}

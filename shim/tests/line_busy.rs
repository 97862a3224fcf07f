//! `IBJITTER_MODE=line` as a busy node sees it, with the built libibjitter.so over the stub
//! libibverbs and a fake provider: due requests leave from the program's own calls (its
//! polls), the exit says what happened rather than what was drawn (lateness, requests never
//! handed over). Each scenario runs in a child (this binary, `IBJITTER_LINE_CHILD`).
mod support;

use serde_json::Value;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;
use std::time::Duration;
use support::verbs_abi::*;
use support::*;

const CHILD: &str = "IBJITTER_LINE_CHILD";

/// What the fake provider was handed: (wr_id, when).
static SEEN: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
/// How long the fake provider's `post_send` takes (ns): a slow provider makes a late line.
static PROVIDER_NS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn provider_post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    let t = now_ns();
    let mut cur = wr;
    while !cur.is_null() {
        SEEN.lock().unwrap().push(((*cur).wr_id, t));
        cur = (*cur).next;
    }
    busy_until(t + PROVIDER_NS.load(Relaxed));
    0
}

/// Spins (no call into the shim, no sleep) until `now_ns()` reaches `t`.
fn busy_until(t: u64) {
    while now_ns() < t {
        std::hint::spin_loop();
    }
}

/// Whether the provider saw `n` requests, or 10 s passed since `t0`.
fn all_seen_or_timed_out(n: u64, t0: u64) -> bool {
    SEEN.lock().unwrap().len() as u64 >= n || now_ns() - t0 >= 10_000_000_000
}

unsafe extern "C" fn empty_poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    0
}

/// Calls of the fake provider's extended `start_poll` (an empty CQ).
static START_POLLS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn empty_start_poll(_cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    START_POLLS.fetch_add(1, Relaxed);
    libc::ENOENT
}

unsafe extern "C" fn empty_create_cq_ex(
    ctx: *mut ibv_context,
    _attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: all-zero is a valid ibv_cq_ex (pointers, integers, Option<fn>).
    let mut cq: Box<ibv_cq_ex> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    cq.start_poll = Some(empty_start_poll);
    Box::into_raw(cq)
}

/// A full node, for this process: its main thread and the shim's timer thread share CPU 0,
/// the timer thread in `SCHED_IDLE` (it runs only when the main thread does not).
fn starve_the_timer_thread() {
    // SAFETY: plain affinity and scheduler calls on this process's own threads.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
        // The thread names itself as it starts: look until it has.
        let find = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|e| e.ok())
                .find(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "ibjitter-line")
                })
                .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        };
        let t0 = std::time::Instant::now();
        let tid = loop {
            match find() {
                Some(t) => break t,
                None if t0.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                None => panic!("the delay line's timer thread never named itself"),
            }
        };
        assert_eq!(
            libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set),
            0
        );
        let param = libc::sched_param { sched_priority: 0 };
        assert_eq!(libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param), 0);
    }
}

/// Opens the fake context through the shim (which patches it) and makes a QP on it through
/// the shim's `ibv_create_qp`: the context, the fake QP (kept alive by the caller) and the QP.
fn open_and_create_qp(
    shim: &Shim,
    fc: &mut FakeContext,
) -> (*mut ibv_context, Box<ibv_qp_ex>, *mut ibv_qp) {
    // SAFETY: the stub returns the fake context we pass as the device.
    let ctx = unsafe { (shim.open_device)(fc.ctx() as *mut _) };
    let mut q = fake_qp(ctx);
    let qpx: *mut ibv_qp_ex = &mut *q;
    // SAFETY: the stub's ibv_create_qp returns its pd argument: our fake QP.
    let qp = unsafe { (shim.create_qp)(qpx as *mut _, std::ptr::null_mut()) };
    (ctx, q, qp)
}

/// The child: posts `n` inline SENDs `gap` apart, then either busy-polls its CQ until the
/// provider saw them all ("poll", "poll-full-node": the timer thread starved first; with
/// "-ex", an extended CQ polled with `ibv_start_poll`) or returns at once ("exit"); emits
/// when each was posted.
fn child(how: &str, n: u64, gap: Duration) {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    fc.set_create_cq_ex(empty_create_cq_ex);
    let (ctx, _q, qp) = open_and_create_qp(&shim, &mut fc);
    if how.starts_with("poll-full-node") {
        starve_the_timer_thread();
    }
    // SAFETY: all-zero attributes; the inline ibv_create_cq_ex calls this pointer.
    let cq_ex = unsafe { fc.create_cq_ex()(ctx, &mut std::mem::zeroed()) };
    // SAFETY: all-zero is a valid ibv_cq.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    let mut posted = Vec::new();
    let byte = [7u8; 8];
    for k in 0..n {
        let mut sge = byte_sge(&byte);
        let mut wr = inline_send(k, &mut sge);
        posted.push(now_ns());
        post_send(qp, &mut wr);
        if how == "bursts" {
            // Busy between posts (no call into the shim), asleep between bursts.
            busy_until(now_ns() + gap.as_nanos() as u64);
            if (k + 1) % BURST == 0 {
                std::thread::sleep(BURST_PAUSE);
            }
        } else if how.starts_with("poll-full-node") || how == "poll-pinned" {
            // Busy between posts, as a rank: the due times spread over n x gap.
            busy_until(now_ns() + gap.as_nanos() as u64);
        } else {
            std::thread::sleep(gap);
        }
    }
    if how == "bursts" {
        // Asleep (a completion channel's wait): only the timer thread hands over.
        let t0 = now_ns();
        while !all_seen_or_timed_out(n, t0) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if how.starts_with("poll") {
        let t0 = now_ns();
        let mut wc: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
        // Polls at least once: if the child was off its CPU past the last due time, the
        // timer thread may have handed everything over already (a run saw no poll at all).
        let mut first = true;
        while std::mem::take(&mut first) || !all_seen_or_timed_out(n, t0) {
            // SAFETY: as verbs.h's inline ibv_poll_cq and ibv_start_poll, on the patched
            // fake context and extended CQ.
            unsafe {
                if how.ends_with("-ex") {
                    let f = (*cq_ex).start_poll.unwrap();
                    f(cq_ex, &mut std::mem::zeroed());
                } else {
                    let f = (*ctx).ops.poll_cq.unwrap();
                    f(&mut *cq, 4, wc.as_mut_ptr());
                }
            }
        }
    }
    let seen = SEEN.lock().unwrap().clone();
    // What `ibjitter inject status` would be told now (this process asks its own shim).
    let status = ibjitter_control::send(
        std::process::id(),
        ibjitter_control::Command::Status,
        "",
        Duration::from_secs(2),
    )
    .map_or_else(|e| format!("no answer: {e}"), |a| a.text);
    println!(
        "RESULT {}",
        serde_json::json!({ "posted": posted, "seen": seen,
                            "start_polls": START_POLLS.load(Relaxed), "status": status })
    );
}

/// Posts `wr` on `qp` as verbs.h's inline `ibv_post_send` does (through the patched fake
/// context) and checks that the post returned 0.
fn post_send(qp: *mut ibv_qp, wr: &mut ibv_send_wr) {
    // SAFETY: `qp` is a QP of a live, patched fake context; `wr` a valid request.
    let rc = unsafe {
        let mut bad = std::ptr::null_mut();
        (*(*qp).context).ops.post_send.unwrap()(qp, wr, &mut bad)
    };
    assert_eq!(rc, 0);
}

/// The scatter entry of `bytes`.
fn byte_sge(bytes: &[u8]) -> ibv_sge {
    ibv_sge {
        addr: bytes.as_ptr() as u64,
        length: bytes.len() as u32,
        lkey: 0,
    }
}

/// An inline SEND of `sge`, with `wr_id` `k` (the fake provider records it).
fn inline_send(k: u64, sge: &mut ibv_sge) -> ibv_send_wr {
    // SAFETY: all-zero is a valid ibv_send_wr.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = k;
    wr.opcode = ibv_wr_opcode_IBV_WR_SEND;
    wr.send_flags = ibv_send_flags_IBV_SEND_INLINE;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr
}

/// Rounds of the exchanging child, and how long it polls the empty line after each.
const EXCHANGES: u64 = 200;
const EXCHANGE_GAP: Duration = Duration::from_millis(1);

/// A busy-polling program that exchanges messages (an MPI rank's ping-pong): `rounds`
/// times, one post, then `ibv_poll_cq` in a loop until the provider saw it, then the loop
/// goes on for [`EXCHANGE_GAP`] with the line empty (waiting for the peer's answer).
fn exchange_child(rounds: u64) {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    let (ctx, _q, qp) = open_and_create_qp(&shim, &mut fc);
    // SAFETY: all-zero is a valid ibv_cq.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    let mut wc: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
    let mut poll = || {
        // SAFETY: as verbs.h's inline ibv_poll_cq, on the patched fake context.
        unsafe { (*ctx).ops.poll_cq.unwrap()(&mut *cq, 4, wc.as_mut_ptr()) };
    };
    let (mut posted, byte) = (Vec::new(), [7u8; 8]);
    for k in 0..rounds {
        let mut sge = byte_sge(&byte);
        let mut wr = inline_send(k, &mut sge);
        posted.push(now_ns());
        post_send(qp, &mut wr);
        let t0 = now_ns();
        while SEEN.lock().unwrap().len() as u64 <= k && now_ns() - t0 < 10_000_000_000 {
            poll();
        }
        let t1 = now_ns();
        while now_ns() - t1 < EXCHANGE_GAP.as_nanos() as u64 {
            poll();
        }
    }
    let seen = SEEN.lock().unwrap().clone();
    println!(
        "RESULT {}",
        serde_json::json!({ "posted": posted, "seen": seen })
    );
}

/// Calls of the fake provider's `req_notify_cq`.
static NOTIFIES: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn counting_req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    NOTIFIES.fetch_add(1, Relaxed);
    0
}

/// The sleeper child's rounds, and the idle spell before each (the line empty).
const SLEEPER_ROUNDS: u64 = 20;
const SLEEPER_IDLE: Duration = Duration::from_millis(50);

/// The child of a program that sleeps: [`SLEEPER_ROUNDS`] times, an idle spell (the line
/// empty), one inline SEND, then, as `how` says, `ibv_req_notify_cq` ("notify") or
/// `ibv_get_cq_event` ("event") before it sleeps until the provider saw it, or no call at all
/// ("quiet"). Emits when each was posted and seen, and the provider's `req_notify_cq` calls.
fn sleeper_child(how: &str) {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    fc.set_req_notify_cq(counting_req_notify_cq);
    let (ctx, _q, qp) = open_and_create_qp(&shim, &mut fc);
    // SAFETY: all-zero is a valid ibv_cq.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    let mut posted = Vec::new();
    let byte = [7u8; 8];
    for k in 0..SLEEPER_ROUNDS {
        std::thread::sleep(SLEEPER_IDLE);
        let mut sge = byte_sge(&byte);
        let mut wr = inline_send(k, &mut sge);
        posted.push(now_ns());
        post_send(qp, &mut wr);
        // SAFETY: as verbs.h's inline ibv_req_notify_cq, on the patched fake context; the
        // stub's ibv_get_cq_event (behind the shim's) returns at once.
        unsafe {
            match how {
                "notify" => {
                    let f = (*ctx).ops.req_notify_cq.unwrap();
                    assert_eq!(f(&mut *cq, 0), 0);
                }
                "event" => {
                    let (mut c, mut c_ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
                    assert_eq!(
                        (shim.get_cq_event)(std::ptr::null_mut(), &mut c, &mut c_ctx),
                        0
                    );
                }
                _ => {}
            }
        }
        // Asleep (the channel's wait): only the timer thread hands the request over.
        let t0 = now_ns();
        while SEEN.lock().unwrap().len() as u64 <= k && now_ns() - t0 < 10_000_000_000 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let seen = SEEN.lock().unwrap().clone();
    println!(
        "RESULT {}",
        serde_json::json!({ "posted": posted, "seen": seen,
                            "notifies": NOTIFIES.load(Relaxed) })
    );
}

/// Rounds of the "sooner" child.
const SOONER_ROUNDS: u64 = 12;

/// A program on one CPU that posts a request due in 20 ms, then one due sooner (50 us, on
/// another QP: a live `set` between them, as a table of long and short delays would draw),
/// then sleeps on a completion (`ibv_req_notify_cq`, then asleep): [`SOONER_ROUNDS`] times.
/// Emits how late each sooner request left (ns after its post plus 50 us).
fn sooner_child() {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    fc.set_req_notify_cq(counting_req_notify_cq);
    let (ctx, _q, qp) = open_and_create_qp(&shim, &mut fc);
    let (_q2, qp2) = another_qp(&shim, ctx);
    // SAFETY: all-zero is a valid ibv_cq.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    let set = |delay: &str| {
        let a = ibjitter_control::send(
            std::process::id(),
            ibjitter_control::Command::Set,
            &format!("IBJITTER_DELAY={delay}"),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(a.ok, "{a:?}");
    };
    let seen = |id: u64| SEEN.lock().unwrap().iter().find(|s| s.0 == id).map(|s| s.1);
    let byte = [7u8; 8];
    let mut late = Vec::new();
    for k in 0..SOONER_ROUNDS {
        set("20ms");
        let mut sge = byte_sge(&byte);
        post_send(qp, &mut inline_send(2 * k, &mut sge));
        set("50us");
        let mut sge = byte_sge(&byte);
        let posted = now_ns();
        post_send(qp2, &mut inline_send(2 * k + 1, &mut sge));
        // SAFETY: as verbs.h's inline ibv_req_notify_cq, on the patched fake context.
        unsafe { assert_eq!((*ctx).ops.req_notify_cq.unwrap()(&mut *cq, 0), 0) };
        let left = loop {
            if let Some(t) = seen(2 * k + 1) {
                break t;
            }
            assert!(now_ns() - posted < 10_000_000_000, "never left");
            std::thread::sleep(Duration::from_micros(20));
        };
        late.push(left.saturating_sub(posted + 50_000));
        while seen(2 * k).is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!("RESULT {}", serde_json::json!({ "late": late }));
}

/// Each request's lateness (ns after posted + `delay_ns`), checking order and that none
/// left early.
fn lateness_of(r: &Value, n: usize, delay_ns: u64) -> Vec<u64> {
    let posted: Vec<u64> = serde_json::from_value(r["posted"].clone()).unwrap();
    let seen: Vec<(u64, u64)> = serde_json::from_value(r["seen"].clone()).unwrap();
    assert_eq!(seen.len(), n, "{r}");
    let mut late: Vec<u64> = seen
        .iter()
        .enumerate()
        .map(|(k, &(id, t))| {
            assert_eq!(id, k as u64, "order");
            assert!(t - posted[k] >= delay_ns, "request {k} left early");
            t - posted[k] - delay_ns
        })
        .collect();
    late.sort_unstable();
    late
}

/// While the line is empty its timer thread sleeps longer and longer (to 1 ms), so an idle
/// line costs the host few wake-ups (it was one each 50 us, ~15 % of a core); a program that
/// posts into the idle line and then sleeps on a completion (`ibv_req_notify_cq`, or
/// `ibv_get_cq_event`) wakes it, and its request leaves on time.
#[test]
fn a_program_that_sleeps_on_a_completion_wakes_the_idle_line() {
    if let Some(how) = scenario() {
        return sleeper_child(&how);
    }
    for how in ["notify", "event"] {
        let (r, stderr, s) = run(
            "a_program_that_sleeps_on_a_completion_wakes_the_idle_line",
            how,
            &[("IBJITTER_DELAY", "100us")],
        );
        let late = lateness_of(&r, SLEEPER_ROUNDS as usize, 100_000);
        let t = &s["line"]["timer_thread"];
        eprintln!("{how}: lateness {late:?} ns; timer thread {t}");
        // The timer thread slept a long sleep when each request entered (50 ms after the
        // last): the program's call woke it (nearly always: not if it was just between two
        // sleeps). Left asleep up to 1 ms, it would see the request ~500 us late at the
        // median (the "quiet" test's child); woken, at once.
        assert!(
            t["woken_by_program"].as_u64().unwrap() >= SLEEPER_ROUNDS / 2,
            "{how}: {t}"
        );
        assert!(late[late.len() / 2] < 300_000, "{how}: {late:?}\n{stderr}");
        if how == "notify" {
            assert_eq!(
                r["notifies"], SLEEPER_ROUNDS,
                "the provider's req_notify_cq ran"
            );
        }
        assert_idle_line_is_cheap(t);
    }
}

/// The same program without a call before it sleeps: the timer thread sees its request within
/// its longest sleep (1 ms), and hands each over; the stats count each one's lateness, and
/// the exit's warning says why they were late: not the provider (fast here, busy a sliver of
/// the time), but no call handed them over.
#[test]
fn an_idle_line_is_seen_within_its_longest_nap() {
    if let Some(how) = scenario() {
        return sleeper_child(&how);
    }
    let (r, stderr, s) = run(
        "an_idle_line_is_seen_within_its_longest_nap",
        "quiet",
        &[("IBJITTER_DELAY", "100us")],
    );
    let late = lateness_of(&r, SLEEPER_ROUNDS as usize, 100_000);
    let t = &s["line"]["timer_thread"];
    eprintln!("quiet: lateness {late:?} ns; timer thread {t}");
    // Seen within the longest sleep (1 ms) less the delay (100 us): ~0.5 ms at the median;
    // a sleep of 5 ms would put it near 2.5 ms. The tail is the host's: on a loaded one a
    // sleep of 1 ms now and then ends 12 ms late (one of 20 in a CI run), so the tail is
    // bounded by a count, not by its largest.
    assert!(late[late.len() / 2] < 2_000_000, "{late:?}\n{stderr}");
    let over_5ms = late.iter().filter(|&&l| l >= 5_000_000).count();
    assert!(over_5ms <= late.len() / 10, "{late:?}\n{stderr}");
    assert_idle_line_is_cheap(t);
    assert_eq!(t["woken_by_program"], 0, "{t}");
    let line = &s["line"];
    assert_eq!(
        line["handed_over_by_timer_thread"], SLEEPER_ROUNDS,
        "{line}"
    );
    assert_eq!(line["late_ns"]["count"], SLEEPER_ROUNDS, "{line}");
    let p = &line["provider_post"];
    eprintln!("provider_post {p}\n{stderr}");
    assert!(p["busy_share"].as_f64().unwrap() < 0.5, "{p}");
    // Late by the naps (~0.3-0.6 ms at the median) against a 100 us table: said, with why.
    assert!(
        stderr.contains(
            "Why: the program's own calls and the shim's timer thread did not hand them over"
        ),
        "{stderr}"
    );
    warnings_read_as_sentences(&stderr);
}

/// A busy-polling program whose line empties between its messages: its own polls hand each
/// request over, and the timer thread, seeing them do so, sleeps long whether the line is
/// empty or not (its 50 us looks at every empty spell cost such a program's node a fifth to
/// two fifths of a vCPU on the bench; ~17,000 wake-ups a second on this host's cores).
#[test]
fn the_timer_thread_stays_asleep_while_the_programs_polls_hand_over() {
    if scenario().is_some() {
        return exchange_child(EXCHANGES);
    }
    let (r, stderr, s) =
        run_exchange("the_timer_thread_stays_asleep_while_the_programs_polls_hand_over");
    let late = lateness_of(&r, EXCHANGES as usize, 100_000);
    let line = &s["line"];
    let t = &line["timer_thread"];
    let (wakeups, alive) = (
        t["wakeups"].as_u64().unwrap() as f64,
        t["alive_ns"].as_u64().unwrap() as f64 / 1e9,
    );
    eprintln!(
        "exchanges: lateness p50 {} ns; {:.0} wake-ups/s; {line}",
        late[late.len() / 2],
        wakeups / alive
    );
    // Most: on a loaded host the child is off its CPU now and then, and the timer thread
    // hands a request over (153-198 of 200 beside a `yes` and the other tests' children).
    assert!(
        line["handed_over_by_program_calls"].as_u64().unwrap() >= EXCHANGES / 2,
        "{line}\n{stderr}"
    );
    // ~1,000 a second at the longest sleep (1 ms; up to ~3,600 on that loaded host, each
    // hand-over of the timer thread's own ending the calm); 50 us looks in every 1 ms empty
    // spell would be ~10,000-17,000.
    assert!(alive > 0.2 && wakeups / alive < 6_000.0, "{t}");
    // The polls hand each over at its due time: the median well under the 1 ms sleeps.
    assert!(late[late.len() / 2] < 200_000, "{late:?}");
}

/// The same program over a provider whose `post_send` takes 2 ms (rxe's calls take
/// milliseconds on a full node): while its polls hold the line in such a call, the timer
/// thread sleeps. It took the program for quiet (none of its calls is seen meanwhile) and
/// spun, failing to take the line, for the rest of each call.
#[test]
fn the_timer_thread_sleeps_while_the_program_is_in_a_slow_provider_call() {
    if scenario().is_some() {
        PROVIDER_NS.store(PROVIDER_NS_SLOW, Relaxed);
        return exchange_child(100);
    }
    let (_, stderr, s) =
        run_exchange("the_timer_thread_sleeps_while_the_program_is_in_a_slow_provider_call");
    let line = &s["line"];
    let t = &line["timer_thread"];
    let (program, timer) = (
        line["handed_over_by_program_calls"].as_u64().unwrap(),
        line["handed_over_by_timer_thread"].as_u64().unwrap(),
    );
    assert_eq!(program + timer, 100, "{line}\n{stderr}");
    // When the program is off its CPU (a loaded host) the timer thread hands requests over
    // itself, each in a 2 ms provider call of its own (a busy wait): its CPU outside those.
    let own_calls_ns = (timer * PROVIDER_NS_SLOW) as f64;
    let share =
        (t["cpu_ns"].as_f64().unwrap() - own_calls_ns).max(0.0) / t["alive_ns"].as_f64().unwrap();
    eprintln!(
        "slow provider: timer thread {:.1} % of a core outside its own provider calls; {line}",
        100.0 * share
    );
    // Spinning through each of the program's 2 ms calls was ~2/3 of a core; asleep, a few
    // percent.
    assert!(share < 0.2, "{t}");
}

/// Runs the exchanging child for `test` at 100 us, alone among the busy children.
fn run_exchange(test: &str) -> (Value, String, Value) {
    let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
    run(test, "exchange", &[("IBJITTER_DELAY", "100us")])
}

/// The slow provider's `post_send` (ns).
const PROVIDER_NS_SLOW: u64 = 2_000_000;

/// The timer thread woke at most 6,000 times a second over its life (20 idle spells of
/// 50 ms: 5 ms at 50 us a sleep, then at up to 1 ms, ~3,000; at 50 us throughout, as before,
/// ~17,000 on the host).
fn assert_idle_line_is_cheap(t: &Value) {
    let (wakeups, alive) = (
        t["wakeups"].as_u64().unwrap() as f64,
        t["alive_ns"].as_u64().unwrap() as f64 / 1e9,
    );
    assert!(alive > 1.0 && wakeups / alive < 6_000.0, "{t}");
}

/// The "bursts" child's requests per burst, and its sleep after each.
const BURST: u64 = 50;
const BURST_PAUSE: Duration = Duration::from_millis(3);

/// Runs the child for `test` and returns its result, its stderr and its stats document.
fn run(test: &str, how: &str, env: &[(&str, &str)]) -> (Value, String, Value) {
    run_under(&[], test, how, env)
}

/// [`run`] through the command `wrapper` (e.g. `taskset -c 0`).
fn run_under(
    wrapper: &[&str],
    test: &str,
    how: &str,
    env: &[(&str, &str)],
) -> (Value, String, Value) {
    let dir = target_dir().join(format!("ibjitter-line-busy-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let mut all = vec![
        ("IBJITTER_MODE", "line"),
        ("IBJITTER_STATS", stats.to_str().unwrap()),
    ];
    all.extend_from_slice(env);
    let out = child_command(test, CHILD, how, &all, wrapper)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let result = stdout
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no RESULT: {stdout}\n{stderr}"));
    let doc = std::fs::read_to_string(Path::new(&stats)).unwrap();
    // Kept only when the child failed (above): each run's directory is its own.
    let _ = std::fs::remove_dir_all(&dir);
    (
        serde_json::from_str(result).unwrap(),
        stderr,
        serde_json::from_str(&doc).unwrap(),
    )
}

fn scenario() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// On a full node (the shim's timer thread gets no core: here it shares the program's in
/// `SCHED_IDLE`), a program that posts, then busy-polls its CQ (as an MPI rank does), has
/// its due requests handed over by its own `ibv_poll_cq` calls, in order and never early;
/// the stats say who handed them over and how late.
#[test]
fn due_requests_leave_from_the_programs_own_polls() {
    if scenario().is_some() {
        return child("poll-full-node", 100, FULL_NODE_GAP);
    }
    programs_polls_hand_over(
        "due_requests_leave_from_the_programs_own_polls",
        "poll-full-node",
    );
}

/// The same with an extended CQ polled with `ibv_start_poll` (perftest's and UCX's newer
/// paths): its `start_poll` hands the line over too, and still reaches the provider's.
#[test]
fn due_requests_leave_from_the_programs_extended_polls() {
    if scenario().is_some() {
        return child("poll-full-node-ex", 100, FULL_NODE_GAP);
    }
    let r = programs_polls_hand_over(
        "due_requests_leave_from_the_programs_extended_polls",
        "poll-full-node-ex",
    );
    assert!(r["start_polls"].as_u64().unwrap() > 0, "{r}");
}

/// The full-node children's gap between posts. With none, all 100 requests fell due within
/// microseconds and one flush took them all: a fresh-clone suite saw the timer thread hand all
/// over once (at its 50 us backstop: the child's main thread, pinned to CPU 0, was off it at
/// the due time, another full-node child pinned there too). Spread over 2 ms, the due times
/// need the program's polls all along.
const FULL_NODE_GAP: Duration = Duration::from_micros(20);
/// The full-node children pin themselves to CPU 0: one at a time.
static FULL_NODE: Mutex<()> = Mutex::new(());

fn programs_polls_hand_over(test: &str, how: &str) -> Value {
    let (r, stderr, s) = {
        let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
        run(test, how, &[("IBJITTER_DELAY", "300us")])
    };
    let posted: Vec<u64> = serde_json::from_value(r["posted"].clone()).unwrap();
    let seen: Vec<(u64, u64)> = serde_json::from_value(r["seen"].clone()).unwrap();
    assert_eq!(seen.len(), 100, "{stderr}");
    for (k, &(id, t)) in seen.iter().enumerate() {
        assert_eq!(id, k as u64, "order");
        assert!(t - posted[k] >= 300_000, "request {k} left early");
    }
    let line = &s["line"];
    let (program, timer) = (
        line["handed_over_by_program_calls"].as_u64().unwrap(),
        line["handed_over_by_timer_thread"].as_u64().unwrap(),
    );
    eprintln!(
        "{how}: handed over by the program's polls {program}, by the timer thread {timer}; {line}"
    );
    assert_eq!(program + timer, 100, "{line}");
    assert!(
        program > 0,
        "the program's polls handed nothing over: {line}"
    );
    assert_eq!(line["late_ns"]["count"], 100, "{line}");
    assert_eq!(line["not_delivered"], 0, "{line}");
    r
}

/// Requests still in the line when the process ends (their delay runs past the 2 s drain)
/// never reach the provider: the exit line and the stats say so, and count them as not
/// delivered rather than delayed.
#[test]
fn requests_still_in_the_line_at_exit_are_said_not_delivered() {
    if scenario().is_some() {
        return child("exit", 10, Duration::ZERO);
    }
    let (r, stderr, s) = run(
        "requests_still_in_the_line_at_exit_are_said_not_delivered",
        "exit",
        &[("IBJITTER_DELAY", "5s")],
    );
    assert_eq!(r["seen"].as_array().unwrap().len(), 0, "{stderr}");
    let exit_line = stderr
        .lines()
        .find(|l| l.starts_with("ibjitter: delayed"))
        .unwrap_or_else(|| panic!("no exit line: {stderr}"));
    assert!(
        exit_line.starts_with("ibjitter: delayed 0 of 10 sends"),
        "{exit_line}"
    );
    assert!(exit_line.contains("not delivered 10"), "{exit_line}");
    assert!(
        stderr.contains("warning: 10 requests were still in the delay line"),
        "{stderr}"
    );
    assert_eq!(s["line"]["not_delivered"], 10, "{s}");
    assert_eq!(s["delays_injected"], 0, "{s}");
    warnings_read_as_sentences(&stderr);
}

/// The shim's warnings are prose wrapped in the source: no run of the source's indentation
/// may reach the user's terminal.
fn warnings_read_as_sentences(stderr: &str) {
    for w in stderr.lines().filter(|l| l.contains("warning:")) {
        assert!(
            !w.contains("  "),
            "a warning carries the source's indentation: {w:?}"
        );
    }
}

/// A line that hands requests over later than the table can account for (here a provider
/// whose post takes 5 ms, and requests falling due 1 ms apart) is said at exit: lateness
/// against the table's mean and largest, and why: the provider itself was the bottleneck
/// (its post_send busy nearly all the line's life), which the stats' `provider_post` shows
/// and `ibjitter inject status` says.
#[test]
fn a_late_line_is_said_at_exit() {
    if scenario().is_some() {
        PROVIDER_NS.store(5_000_000, Relaxed);
        return child("poll", 10, Duration::from_millis(1));
    }
    let (r, stderr, s) = run(
        "a_late_line_is_said_at_exit",
        "poll",
        &[("IBJITTER_DELAY", "100us")],
    );
    assert_eq!(r["seen"].as_array().unwrap().len(), 10, "{stderr}");
    assert!(
        stderr.contains("handed 10 requests to the provider late"),
        "{stderr}"
    );
    assert!(stderr.contains("line: handed over late by"), "{stderr}");
    warnings_read_as_sentences(&stderr);
    // Requests fell due while the provider was busy with an earlier one for 5 ms.
    assert!(
        s["line"]["late_ns"]["max"].as_u64().unwrap() >= 2_000_000,
        "{s}"
    );
    let p = &s["line"]["provider_post"];
    eprintln!("provider_post {p}\n{stderr}");
    // 5 ms a call, in which ~5 more requests fall due: they go as one list the next call,
    // so 10 requests take 2-3 calls, 10-15 ms of the line's ~15 ms life.
    assert!(p["ns"].as_u64().unwrap() >= 10_000_000, "{p}");
    assert!(p["per_request_ns"].as_u64().unwrap() >= 1_000_000, "{p}");
    assert!(p["busy_share"].as_f64().unwrap() >= 0.8, "{p}");
    // Each call's own time, as the provider took it (5 ms), for 2-10 lists.
    let calls = &p["call_ns"];
    assert!((2..=10).contains(&calls["count"].as_u64().unwrap()), "{p}");
    assert!(calls["p50"].as_u64().unwrap() >= 4_900_000, "{p}");
    assert!(
        stderr.contains("Why: the provider's post_send was busy"),
        "{stderr}"
    );
    // `ibjitter inject status` says the same while the process runs.
    let status = r["status"].as_str().unwrap();
    assert!(
        status.contains("line handed 10 requests over late by")
            && status.contains("later than the table accounts for: the provider's post_send"),
        "{status}"
    );
}

/// A program that posts in bursts (busy between its posts for 1 ms), then sleeps without a
/// call into the shim (a completion channel's wait) while its requests fall due: the timer
/// thread hands them over on time. Its wake-ups while the program was posting (and handing
/// nothing over: nothing was due yet) must not leave it asleep past the due times once the
/// program is quiet.
#[test]
fn requests_of_a_program_gone_quiet_leave_on_time() {
    if scenario().is_some() {
        return child("bursts", 20 * BURST, Duration::from_micros(20));
    }
    let (r, stderr, s) = run(
        "requests_of_a_program_gone_quiet_leave_on_time",
        "bursts",
        &[("IBJITTER_DELAY", "1200us")],
    );
    assert_eq!(r["seen"].as_array().unwrap().len(), 1000, "{stderr}");
    let late = &s["line"]["late_ns"];
    eprintln!("lateness {late}; {}", s["line"]);
    assert!(late["p50"].as_u64().unwrap() < 100_000, "{late}");
    // The timer thread did the hand-overs: the stats say what it cost.
    let t = &s["line"]["timer_thread"];
    let (wakeups, cpu, alive) = (
        t["wakeups"].as_u64().unwrap(),
        t["cpu_ns"].as_u64().unwrap(),
        t["alive_ns"].as_u64().unwrap(),
    );
    // 20 bursts, each about 1 ms of posting and 3 ms asleep, then the last 1.2 ms delay.
    assert!(alive >= 80_000_000, "{t}");
    assert!(wakeups >= 20 && cpu > 0 && cpu <= alive, "{t}");
}

/// A rank bound to one CPU (`mpirun --bind-to core`, `srun --cpu-bind`; here `taskset -c
/// 0`), busy between its posts with no call into the provider: the shim's timer thread,
/// which inherits that one CPU, never spins to a due time there (it sleeps to it), so it
/// takes little of the rank's CPU. Before, it spun the last 150 us before each due time on
/// the rank's own core: a quarter to a third of it.
#[test]
fn the_timer_thread_of_a_rank_bound_to_one_cpu_never_spins_on_it() {
    const NAME: &str = "the_timer_thread_of_a_rank_bound_to_one_cpu_never_spins_on_it";
    if scenario().is_some() {
        return child("poll-pinned", 1000, Duration::from_micros(400));
    }
    let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let (r, stderr, s) = run_under(
        &["taskset", "-c", "0"],
        NAME,
        "poll-pinned",
        &[("IBJITTER_DELAY", "1ms")],
    );
    assert_eq!(r["seen"].as_array().unwrap().len(), 1000, "{stderr}");
    let t = &s["line"]["timer_thread"];
    eprintln!("timer thread {t}; lateness {}", s["line"]["late_ns"]);
    assert_eq!(t["one_cpu"], true, "{t}");
    let share = t["cpu_ns"].as_f64().unwrap() / t["alive_ns"].as_f64().unwrap();
    assert!(
        share < 0.10,
        "the timer thread took {:.1} % of the CPU: {t}",
        100.0 * share
    );
}

/// On one CPU the timer thread looks for new requests only once per longest backstop (1 ms
/// or more): a program that posts a request due sooner than those in the line and then
/// sleeps on a completion rings it awake, so the request leaves on time rather than at the
/// end of that nap (up to 1 ms late).
#[test]
fn a_sooner_request_wakes_the_timer_thread_napping_on_one_cpu() {
    const NAME: &str = "a_sooner_request_wakes_the_timer_thread_napping_on_one_cpu";
    if scenario().is_some() {
        return sooner_child();
    }
    let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let (r, stderr, s) = run_under(
        &["taskset", "-c", "0"],
        NAME,
        "sooner",
        &[("IBJITTER_DELAY", "20ms"), ("IBJITTER_CONTROL", "1")],
    );
    let mut late: Vec<u64> = serde_json::from_value(r["late"].clone()).unwrap();
    late.sort_unstable();
    eprintln!(
        "sooner requests late (ns): {late:?}; {}",
        s["line"]["timer_thread"]
    );
    assert_eq!(s["line"]["timer_thread"]["one_cpu"], true, "{stderr}");
    // Three in four: a nap's end is 0-1 ms away, and without the ring most were 0.7-1 ms
    // late (in two runs 4 and 7 of 8 past 700 us; after it, all 19-43 us).
    assert!(late[late.len() * 3 / 4] < 200_000, "{late:?}\n{stderr}");
}

/// A process started with a large timer slack (systemd's `TimerSlackNSec=`, or the program's
/// own `prctl`; here 20 ms) in a sandbox that refuses `prctl(PR_SET_TIMERSLACK)`: the timer
/// thread cannot lower its slack to 1 ns, and each of its sleeps wakes up to 20 ms late. It
/// reads the slack back, says it once (the stats' `timer_thread.timer_slack_ns` too), and
/// wakes that much earlier to spin to each due time. Refused `prctl` altogether, it cannot
/// read the slack either: the lateness warning at exit (a 1 ms table, requests posted into
/// an idle line) names the timer slack as the likely cause. Both were ignored: no warning,
/// requests late by up to the slack, and the warning blamed busy cores.
#[test]
fn a_timer_slack_the_timer_thread_cannot_lower_is_said_and_allowed_for() {
    const NAME: &str = "a_timer_slack_the_timer_thread_cannot_lower_is_said_and_allowed_for";
    if let Some(how) = scenario() {
        return sleeper_child(&how);
    }
    let sandbox = build_c("sandboxed", "sandboxed", &[]);
    let sandbox = sandbox.to_str().unwrap();
    const SLACK: (&str, &str) = ("SANDBOXED_TIMERSLACK_NS", "20000000");

    // PR_SET_TIMERSLACK refused, PR_GET_TIMERSLACK allowed: the slack is known.
    let (r, stderr, s) = run_under(
        &[sandbox, "prctl_set_timerslack"],
        NAME,
        "quiet",
        &[("IBJITTER_DELAY", "100ms"), SLACK],
    );
    let late = lateness_of(&r, SLEEPER_ROUNDS as usize, 100_000_000);
    let t = &s["line"]["timer_thread"];
    eprintln!("slack known: lateness {late:?} ns; timer thread {t}\n{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("cannot lower its timer slack"))
        .collect();
    assert!(
        said.len() == 1 && said[0].contains("20.000 ms") && said[0].contains("spins"),
        "{stderr}"
    );
    warnings_read_as_sentences(&stderr);
    assert_eq!(t["timer_slack_ns"], 20_000_000, "{t}");
    // Woken 20.15 ms before each due time, it spins to it: on an idle host 17 us late at
    // the median, against 4.6 ms with the slack left alone (up to the 20 ms, as the
    // interrupts on its CPU fall). Not asserted: on a loaded host the spinning thread is
    // preempted for milliseconds either way.

    // prctl refused altogether: the slack is unknown.
    let (r, stderr, s) = run_under(
        &[sandbox, "prctl"],
        NAME,
        "quiet",
        &[("IBJITTER_DELAY", "1ms"), SLACK],
    );
    let late = lateness_of(&r, SLEEPER_ROUNDS as usize, 1_000_000);
    let t = &s["line"]["timer_thread"];
    eprintln!("slack unknown: lateness {late:?} ns; timer thread {t}\n{stderr}");
    assert!(t["timer_slack_ns"].is_null(), "{t}");
    assert!(
        stderr.contains(
            "Why: the shim's timer thread could neither lower its timer slack nor read it"
        ),
        "{stderr}"
    );
    warnings_read_as_sentences(&stderr);
}

/// A second fake QP on `ctx`, made through the shim (kept alive by the caller), and the QP.
fn another_qp(shim: &Shim, ctx: *mut ibv_context) -> (Box<ibv_qp_ex>, *mut ibv_qp) {
    let mut q = fake_qp(ctx);
    let qx: *mut ibv_qp_ex = &mut *q;
    // SAFETY: the stub's ibv_create_qp returns its pd argument: our fake QP.
    let qp = unsafe { (shim.create_qp)(qx as *mut _, std::ptr::null_mut()) };
    (q, qp)
}

/// A SEND of 17 scatter entries, one more than a slot of the line holds (`wr_id` `k`).
fn uncopyable_send(k: u64, list: &mut [ibv_sge; 17]) -> ibv_send_wr {
    let mut wr = inline_send(k, &mut list[0]);
    wr.num_sge = 17;
    wr.send_flags = 0;
    wr
}

/// Polls the patched fake context's CQ until the provider saw `n` requests (or 10 s).
fn poll_until_seen(ctx: *mut ibv_context, n: u64) {
    // SAFETY: all-zero is a valid ibv_cq and ibv_wc array.
    let mut cq: Box<ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = ctx;
    // SAFETY: as above.
    let mut wc: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
    let since = now_ns();
    while !all_seen_or_timed_out(n, since) {
        // SAFETY: as verbs.h's inline ibv_poll_cq, on the patched fake context.
        unsafe { (*ctx).ops.poll_cq.unwrap()(&mut *cq, 4, wc.as_mut_ptr()) };
    }
}

/// The "direct" child, its timer thread starved (a full node): posts request 0 on one QP,
/// is busy 100 us, posts request 1 of 17 scatter entries (more than a slot holds: it waits
/// its delay in the posting thread) on a second QP, then is busy 20 ms without a call into
/// the shim before it polls until both were seen. Emits when each was posted and when the
/// second post returned.
fn direct_child() {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    let (ctx, _q, qp) = open_and_create_qp(&shim, &mut fc);
    let (_q2, qp2) = another_qp(&shim, ctx);
    starve_the_timer_thread();
    let byte = [7u8; 8];
    let mut sge = byte_sge(&byte);
    let mut first = inline_send(0, &mut sge);
    let mut many = [byte_sge(&byte); 17];
    let mut second = uncopyable_send(1, &mut many);
    let t0 = now_ns();
    post_send(qp, &mut first);
    busy_until(now_ns() + 100_000);
    let t1 = now_ns();
    post_send(qp2, &mut second);
    let returned = now_ns();
    busy_until(now_ns() + 20_000_000);
    poll_until_seen(ctx, 2);
    let seen = SEEN.lock().unwrap().clone();
    println!(
        "RESULT {}",
        serde_json::json!({ "posted": [t0, t1], "returned": returned, "seen": seen })
    );
}

/// The "direct-order" child, its timer thread starved and every provider call 400 us: posts
/// request 0 on QP A, is busy 200 us, then request 1 of 17 scatter entries on QP B, which
/// waits 300 us in place and hands request 0 over meanwhile (a call that runs past its own
/// due time); during that call another thread (on the other CPU) posts request 2 on QP B,
/// due before the call ends. Then polls until all three were seen.
fn direct_order_child() {
    let shim = load_child_shim();
    let mut fc = FakeContext::new(provider_post_send);
    fc.set_poll_cq(empty_poll_cq);
    let (ctx, _q, qp_a) = open_and_create_qp(&shim, &mut fc);
    let (_q2, qp_b) = another_qp(&shim, ctx);
    let qp_b = qp_b as usize;
    // The other thread starts first, on CPU 1 (the main thread is pinned to CPU 0 below), and
    // spins there until it is told when request 1 was posted.
    static SECOND_POSTED: AtomicU64 = AtomicU64::new(0);
    let other = std::thread::spawn(move || {
        // SAFETY: plain affinity call on this thread: off the CPU the main thread spins on.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(1, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
        }
        let t1 = loop {
            match SECOND_POSTED.load(Acquire) {
                0 => std::hint::spin_loop(),
                t => break t,
            }
        };
        // Inside the hand-over's provider call (t1 + 100 .. 500 us): due at t1 + 450 us.
        busy_until(t1 + 150_000);
        let byte = [9u8; 8];
        let mut sge = byte_sge(&byte);
        let mut third = inline_send(2, &mut sge);
        let before = now_ns();
        post_send(qp_b as *mut ibv_qp, &mut third);
        (before, now_ns())
    });
    starve_the_timer_thread();
    PROVIDER_NS.store(400_000, Relaxed);
    let byte = [7u8; 8];
    let mut sge = byte_sge(&byte);
    let mut first = inline_send(0, &mut sge);
    post_send(qp_a, &mut first);
    busy_until(now_ns() + 200_000);
    let mut many = [byte_sge(&byte); 17];
    let mut second = uncopyable_send(1, &mut many);
    let t1 = now_ns();
    SECOND_POSTED.store(t1, Release);
    post_send(qp_b as *mut ibv_qp, &mut second);
    let third_posted = other.join().unwrap();
    poll_until_seen(ctx, 3);
    let seen = SEEN.lock().unwrap().clone();
    println!(
        "RESULT {}",
        serde_json::json!({ "second_posted": t1, "third_posted": third_posted, "seen": seen })
    );
}

/// A post that waits in place hands over what falls due meanwhile, but never its own QP's
/// later requests: request 2 on QP B, entered by another thread during request 1's wait and
/// due before the hand-over's slow provider call ends, still reaches the provider after
/// request 1 (an RC QP keeps its order).
#[test]
fn a_post_waiting_in_place_never_hands_over_its_own_qps_later_requests() {
    if scenario().is_some() {
        return direct_order_child();
    }
    let (r, stderr, s) = {
        let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
        run(
            "a_post_waiting_in_place_never_hands_over_its_own_qps_later_requests",
            "direct-order",
            &[("IBJITTER_DELAY", "300us")],
        )
    };
    let seen: Vec<(u64, u64)> = serde_json::from_value(r["seen"].clone()).unwrap();
    eprintln!("{r}; {}", s["line"]);
    let ids: Vec<u64> = seen.iter().map(|x| x.0).collect();
    assert_eq!(ids, [0, 1, 2], "{stderr}");
}

/// On a full node, a request the line cannot copy waits its delay in the posting thread;
/// what falls due meanwhile on other QPs leaves from that wait, not at the program's next
/// call (the timer thread gets no core while the thread spins).
#[test]
fn requests_due_while_a_post_waits_in_place_leave_from_that_wait() {
    if scenario().is_some() {
        return direct_child();
    }
    let (r, stderr, s) = {
        let _one_at_a_time = FULL_NODE.lock().unwrap_or_else(|e| e.into_inner());
        run(
            "requests_due_while_a_post_waits_in_place_leave_from_that_wait",
            "direct",
            &[("IBJITTER_DELAY", "300us")],
        )
    };
    let posted: Vec<u64> = serde_json::from_value(r["posted"].clone()).unwrap();
    let returned = r["returned"].as_u64().unwrap();
    let mut seen: Vec<(u64, u64)> = serde_json::from_value(r["seen"].clone()).unwrap();
    eprintln!(
        "posted {posted:?}, second returned {returned}, seen {seen:?}; {}",
        s["line"]
    );
    // By request: before, request 0 reached the provider after request 1.
    seen.sort();
    assert_eq!(
        seen.iter().map(|x| x.0).collect::<Vec<_>>(),
        [0, 1],
        "{stderr}"
    );
    assert_eq!(s["line"]["posted_directly"], 1, "{}", s["line"]);
    assert!(seen[0].1 - posted[0] >= 300_000, "request 0 left early");
    assert!(seen[1].1 - posted[1] >= 300_000, "request 1 left early");
    assert!(
        seen[0].1 < returned,
        "request 0 (due {} ns before the wait ended) left {} ns after it",
        posted[1] - posted[0],
        seen[0].1 - returned
    );
}

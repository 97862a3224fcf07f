//! The injector's cost and accuracy, in-process over a stub provider: run with
//! `cargo bench -p ibjitter-shim --bench hotpath`.
//!
//! Each configuration runs in a child process that dlopens the release libibjitter.so (so
//! the figures include the cdylib's real TLS access), with the `IBJITTER_*` environment of
//! that configuration. Inside the child, calls through a patched context and through an
//! unpatched one (the provider directly) alternate round by round.
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use support::*;

const ROUNDS: usize = 31;
const CALLS: u64 = 200_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn load() -> Shim {
    Shim::load(
        Path::new(&std::env::var("IBJITTER_BENCH_SO").unwrap()),
        Path::new(&std::env::var("IBJITTER_BENCH_STUB").unwrap()),
    )
}

/// The least any interposer can add: one more indirect hop, through a pointer loaded from
/// memory (as the shim loads the provider's original).
static TRAMPOLINE_TARGET: std::sync::atomic::AtomicPtr<()> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn trampoline(
    qp: *mut verbs_abi::ibv_qp,
    wr: *mut verbs_abi::ibv_send_wr,
    bad: *mut *mut verbs_abi::ibv_send_wr,
) -> std::ffi::c_int {
    let f = TRAMPOLINE_TARGET.load(std::sync::atomic::Ordering::Acquire);
    std::mem::transmute::<*mut (), verbs_abi::PostSendFn>(f)(qp, wr, bad)
}

/// ns per call of `ibv_post_send` on the provider directly and through the shim (or, for
/// role "trampoline", through the minimal interposer above).
fn child_cost(trampoline_only: bool) {
    let shim = load();
    let mut direct = FakeContext::new(bare_post_send);
    let mut patched = FakeContext::new(bare_post_send);
    let pctx = if trampoline_only {
        TRAMPOLINE_TARGET.store(
            bare_post_send as *mut (),
            std::sync::atomic::Ordering::Release,
        );
        patched = FakeContext::new(trampoline);
        patched.ctx()
    } else {
        // SAFETY: the stub returns the fake context passed as the device.
        unsafe { (shim.open_device)(patched.ctx() as *mut _) }
    };
    let mut qd = fake_qp(direct.ctx());
    let mut qp = fake_qp(pctx);
    let time = |q: &mut verbs_abi::ibv_qp_ex| {
        let t0 = now_ns();
        for _ in 0..CALLS {
            // SAFETY: fake QP of a live fake context.
            unsafe { ibv_post_send(&mut q.qp_base) };
        }
        (now_ns() - t0) as f64 / CALLS as f64
    };
    alternate(|| time(&mut qd), || time(&mut qp));
}

/// ns per call of `ibv_post_send` with a real one-entry RDMA WRITE, directly and through
/// the shim, in bursts of 1,000 with a pause between (so that `IBJITTER_MODE=line`'s pool,
/// drained by its timer thread meanwhile, never fills: the post path's own cost).
/// `IBJITTER_BENCH_PAUSE_US` (default 500) and `IBJITTER_BENCH_BURSTS` (default
/// CALLS / 1000) set the pause and the bursts per round: with a pause longer than the line's
/// delay, and a delay longer than a burst, nothing falls due during a burst (entry only).
/// `IBJITTER_BENCH_BURST_LEN` (default 1000) sets the posts per burst: the shim's state is
/// cold at a burst's start (the direct calls' is not), a cost per burst that longer bursts
/// spread thinner. With `IBJITTER_BENCH_POLL_PAUSE=1` the pause is spent polling the QP's
/// (empty) CQ rather than asleep, as a busy-polling rank: in line mode the program's own
/// polls then hand the requests over, on the posting thread's core, not the timer thread.
fn child_cost_wr(copy_floor: bool) {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let pause = std::time::Duration::from_micros(env("IBJITTER_BENCH_PAUSE_US", 500));
    let bursts = env("IBJITTER_BENCH_BURSTS", CALLS / 1000);
    let blen = env("IBJITTER_BENCH_BURST_LEN", 1000);
    let poll_pause = env("IBJITTER_BENCH_POLL_PAUSE", 0) != 0;
    let shim = load();
    let mut direct = FakeContext::new(bare_post_send);
    let mut patched = FakeContext::new(if copy_floor {
        copy_into_ring
    } else {
        bare_post_send
    });
    direct.set_poll_cq(empty_poll_cq);
    patched.set_poll_cq(empty_poll_cq);
    let pctx = if copy_floor {
        patched.ctx()
    } else {
        // SAFETY: the stub returns the fake context passed as the device.
        unsafe { (shim.open_device)(patched.ctx() as *mut _) }
    };
    let mut qd = fake_qp(direct.ctx());
    let mut qp = fake_qp(pctx);
    let buf = [0u8; 64];
    let time = |q: &mut verbs_abi::ibv_qp_ex| {
        // SAFETY: all-zero is a valid ibv_cq; its context is the QP's.
        let mut cq: verbs_abi::ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = q.qp_base.context;
        let mut sge = verbs_abi::ibv_sge {
            addr: buf.as_ptr() as u64,
            length: 64,
            lkey: 1,
        };
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut wr: verbs_abi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = verbs_abi::ibv_wr_opcode_IBV_WR_RDMA_WRITE;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut spent = 0;
        for _ in 0..bursts {
            let t0 = now_ns();
            for _ in 0..blen {
                // SAFETY: as verbs.h's inline ibv_post_send, on a fake QP of a live context.
                unsafe {
                    let f = (*q.qp_base.context).ops.post_send.unwrap();
                    let mut bad = std::ptr::null_mut();
                    f(&mut q.qp_base, &mut wr, &mut bad);
                }
            }
            spent += now_ns() - t0;
            if poll_pause {
                let until = now_ns() + pause.as_nanos() as u64;
                while now_ns() < until {
                    // SAFETY: as verbs.h's inline ibv_poll_cq, on a CQ of a live context.
                    unsafe {
                        let f = (*cq.context).ops.poll_cq.unwrap();
                        let mut wc: verbs_abi::ibv_wc = std::mem::zeroed();
                        f(&mut cq, 1, &mut wc);
                    }
                }
            } else {
                std::thread::sleep(pause);
            }
        }
        spent as f64 / (bursts * blen) as f64
    };
    alternate(|| time(&mut qd), || time(&mut qp));
}

/// What any entry into a delay line must keep of a post: its QP, when it was posted (its
/// delay counts from then), the request and its scatter entry (the caller may reuse both
/// once the post returns).
#[repr(C, align(64))]
struct RingRecord {
    qp: *mut verbs_abi::ibv_qp,
    posted: u64,
    wr: verbs_abi::ibv_send_wr,
    sge: verbs_abi::ibv_sge,
}

/// Enough records for a burst of the entry rows (1,000 posts, all in flight at once).
const RING_RECORDS: usize = 1024;

struct Ring(std::cell::UnsafeCell<[std::mem::MaybeUninit<RingRecord>; RING_RECORDS]>);
// SAFETY: only the bench child's one posting thread writes it.
unsafe impl Sync for Ring {}
static RING: Ring = Ring(std::cell::UnsafeCell::new(
    [const { std::mem::MaybeUninit::uninit() }; RING_RECORDS],
));
static RING_TAIL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The floor of a copying entry (role "copy-floor"): the post's clock read, its request and
/// scatter entry copied into the next record of a ring with one writer, the record published
/// by one store. No shim, no table, no per-QP order, no free-slot bookkeeping, never handed
/// over: not a delay line, the least one's entry can cost. A one-entry request only.
unsafe extern "C" fn copy_into_ring(
    qp: *mut verbs_abi::ibv_qp,
    wr: *mut verbs_abi::ibv_send_wr,
    _bad: *mut *mut verbs_abi::ibv_send_wr,
) -> std::ffi::c_int {
    use std::sync::atomic::Ordering::{Relaxed, Release};
    let t = RING_TAIL.load(Relaxed);
    let r = (*RING.0.get())[t % RING_RECORDS].as_mut_ptr();
    (*r).qp = qp;
    // The shim's clock where it runs on the TSC.
    #[cfg(target_arch = "x86_64")]
    let now = core::arch::x86_64::_rdtsc();
    #[cfg(not(target_arch = "x86_64"))]
    let now = now_ns();
    (*r).posted = now;
    (*r).wr = *wr;
    (*r).wr.next = std::ptr::null_mut();
    (*r).sge = *(*wr).sg_list;
    (*r).wr.sg_list = std::ptr::addr_of_mut!((*r).sge);
    RING_TAIL.store(t.wrapping_add(1), Release);
    0
}

unsafe extern "C" fn empty_poll_cq(
    _cq: *mut verbs_abi::ibv_cq,
    _n: std::ffi::c_int,
    _wc: *mut verbs_abi::ibv_wc,
) -> std::ffi::c_int {
    0
}

/// ns per call of `ucp_tag_send_nbx` on a stand-in libucp directly and through the shim's
/// UCP wrapper.
fn child_ucp_cost() {
    type SendNbx = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;
    let stub_ucp = std::env::var("IBJITTER_BENCH_UCP").unwrap();
    let sym = |lib: &str, flags: i32| -> SendNbx {
        let lib = std::ffi::CString::new(lib).unwrap();
        // SAFETY: valid C strings; the symbol has this type (stub_ucp.c, the shim's ucp.rs).
        unsafe {
            let h = libc::dlopen(lib.as_ptr(), flags);
            assert!(!h.is_null(), "dlopen {lib:?}");
            let p = libc::dlsym(h, c"ucp_tag_send_nbx".as_ptr());
            assert!(!p.is_null());
            std::mem::transmute::<*mut std::ffi::c_void, SendNbx>(p)
        }
    };
    let direct = sym(&stub_ucp, libc::RTLD_NOW);
    let _shim = load();
    let wrapped = sym(
        &std::env::var("IBJITTER_BENCH_SO").unwrap(),
        libc::RTLD_NOW | libc::RTLD_NOLOAD,
    );
    let time = |f: SendNbx| {
        let t0 = now_ns();
        for i in 0..CALLS {
            // SAFETY: the stub only computes with its arguments.
            std::hint::black_box(unsafe { f(1, 2, i, 4, 5) });
        }
        (now_ns() - t0) as f64 / CALLS as f64
    };
    alternate(|| time(direct), || time(wrapped));
}

/// The delay line's timer thread with the line empty: one WRITE (1 us, which starts the line
/// and leaves it at once), then 1 s asleep. The stats (`IBJITTER_STATS`, written at exit) say
/// what the timer thread cost meanwhile: the idle cost of line mode on this host.
fn child_line_idle() {
    let shim = load();
    let mut patched = FakeContext::new(bare_post_send);
    // SAFETY: the stub returns the fake context passed as the device.
    let pctx = unsafe { (shim.open_device)(patched.ctx() as *mut _) };
    let mut qp = fake_qp(pctx);
    // SAFETY: fake QP of a live fake context.
    unsafe { ibv_post_send(&mut qp.qp_base) };
    std::thread::sleep(std::time::Duration::from_secs(1));
    println!("RESULT 0");
}

/// Runs `direct` and `shim` (each returning ns per call) once to warm up, then alternately
/// for ROUNDS rounds; prints "RESULT direct shim added min_added" (medians but the last).
fn alternate(mut direct: impl FnMut() -> f64, mut shim: impl FnMut() -> f64) {
    direct();
    shim();
    let (mut d, mut p, mut diff) = (vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let a = direct();
        let b = shim();
        d.push(a);
        p.push(b);
        diff.push(b - a);
    }
    let min_diff = diff.iter().copied().fold(f64::MAX, f64::min);
    println!(
        "RESULT {:.2} {:.2} {:.2} {:.2}",
        median(&mut d),
        median(&mut p),
        median(&mut diff),
        min_diff
    );
}

/// Errors of the actual wait for the configured constant delay.
fn child_accuracy(delay_ns: f64, samples: usize) {
    let shim = load();
    let mut patched = FakeContext::new(bare_post_send);
    let mut direct = FakeContext::new(bare_post_send);
    // SAFETY: as above.
    let pctx = unsafe { (shim.open_device)(patched.ctx() as *mut _) };
    let mut qp = fake_qp(pctx);
    let mut qd = fake_qp(direct.ctx());
    // The cost of timing one direct call: how much of the error is the measurement itself.
    let mut overhead: Vec<f64> = (0..1000)
        .map(|_| {
            let t0 = now_ns();
            // SAFETY: as above.
            unsafe { ibv_post_send(&mut qd.qp_base) };
            (now_ns() - t0) as f64
        })
        .collect();
    let overhead = median(&mut overhead);
    let mut err: Vec<f64> = (0..samples + samples / 10)
        .map(|_| {
            let t0 = now_ns();
            // SAFETY: as above.
            unsafe { ibv_post_send(&mut qp.qp_base) };
            (now_ns() - t0) as f64 - delay_ns
        })
        .skip(samples / 10)
        .collect();
    let mut abs: Vec<f64> = err.iter().map(|e| e.abs()).collect();
    println!(
        "RESULT {:.1} {:.1} {:.1} {:.1} {:.1}",
        median(&mut err),
        quantile(&mut abs, 0.5),
        quantile(&mut abs, 0.99),
        quantile(&mut err, 0.999),
        overhead
    );
}

/// What one `pause` (`spin_loop` hint) costs on this machine, in ns: the least of a few batches.
fn pause_ns() -> f64 {
    const BATCH: u64 = 10_000;
    (0..7)
        .map(|_| {
            let t0 = now_ns();
            for _ in 0..BATCH {
                std::hint::spin_loop();
            }
            (now_ns() - t0) as f64 / BATCH as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// What one TSC read costs on this machine, in ns (the least of a few batches): the delay
/// line's entry reads the clock once for its due time, the zero-delay path never does.
fn clock_read_ns() -> f64 {
    const BATCH: u64 = 100_000;
    (0..7)
        .map(|_| {
            let t0 = now_ns();
            let mut x = 0u64;
            for _ in 0..BATCH {
                // SAFETY: rdtsc has no preconditions on x86_64.
                x = x.wrapping_add(unsafe { core::arch::x86_64::_rdtsc() });
            }
            std::hint::black_box(x);
            (now_ns() - t0) as f64 / BATCH as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn run_child(so: &Path, stub: &Path, role: &str, env: &[(&str, &str)]) -> Vec<f64> {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // Built once for all children.
    static STUB_UCP: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let stub_ucp = STUB_UCP.get_or_init(build_stub_ucp);
    cmd.args(["--child", role])
        .env("IBJITTER_BENCH_SO", so)
        .env("IBJITTER_BENCH_STUB", stub)
        .env("IBJITTER_BENCH_UCP", stub_ucp)
        .env("IBJITTER_QUIET", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn bench child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench child {role} {env:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("child printed no RESULT")
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        match args[i + 1].as_str() {
            "cost" => child_cost(false),
            "trampoline" => child_cost(true),
            "cost-wr" => child_cost_wr(false),
            "copy-floor" => child_cost_wr(true),
            "ucp" => child_ucp_cost(),
            "line-idle" => child_line_idle(),
            role => {
                let (d, n) = role.split_once(':').unwrap();
                child_accuracy(d.parse().unwrap(), n.parse().unwrap());
            }
        }
        return;
    }
    let so = build_shim();
    let stub = build_stub();
    let stats = std::env::temp_dir().join(format!("ibjitter-bench-{}.json", std::process::id()));
    let stats = stats.to_str().unwrap();
    println!("libibjitter.so hot path ({CALLS} calls × {ROUNDS} rounds, medians; ns per call)");
    println!(
        "{:<38} {:>8} {:>8} {:>8} {:>8}",
        "configuration", "direct", "shim", "added", "min add"
    );
    // The entry rows and their spin yardsticks: bursts of 1,000 posts 6 ms apart, a delay and
    // what else the row sets.
    let same_bursts = |delay, more: &[(&'static str, &'static str)]| {
        let mut env = vec![
            ("IBJITTER_DELAY", delay),
            ("IBJITTER_BENCH_PAUSE_US", "6000"),
            ("IBJITTER_BENCH_BURSTS", "20"),
        ];
        env.extend_from_slice(more);
        env
    };
    for (name, role, env) in [
        ("floor: one extra indirect hop", "trampoline", vec![]),
        ("no table, live control on (passes)", "cost", vec![]),
        (
            "IBJITTER_CONTROL=0 (not patched)",
            "cost",
            vec![("IBJITTER_CONTROL", "0")],
        ),
        (
            "counting only (IBJITTER_STATS)",
            "cost",
            vec![("IBJITTER_STATS", stats)],
        ),
        ("zero-delay table", "cost", vec![("IBJITTER_DELAY", "0ns")]),
        (
            "zero-delay table + IBJITTER_STATS",
            "cost",
            vec![("IBJITTER_DELAY", "0ns"), ("IBJITTER_STATS", stats)],
        ),
        (
            "1-SGE WRITE, zero-delay table",
            "cost-wr",
            vec![("IBJITTER_DELAY", "0ns")],
        ),
        (
            // 1 us: every post is copied into the line (a zero delay with nothing of its QP
            // in the line goes straight to the provider, as the row above).
            "1-SGE WRITE, line (1 us delay)",
            "cost-wr",
            vec![("IBJITTER_DELAY", "1us"), ("IBJITTER_MODE", "line")],
        ),
        (
            // Entry only: bursts of 1,000 posts (well under 5 ms) with 6 ms between them, in
            // which the timer thread hands the burst over.
            "1-SGE WRITE, line entry (5 ms)",
            "cost-wr",
            same_bursts("5ms", &[("IBJITTER_MODE", "line")]),
        ),
        (
            // The same, the pause spent polling the CQ (a busy-polling rank): the program's
            // own polls hand the burst over, so its slots never leave the posting core.
            "1-SGE WRITE, line entry (5 ms), polled",
            "cost-wr",
            same_bursts(
                "5ms",
                &[
                    ("IBJITTER_MODE", "line"),
                    ("IBJITTER_BENCH_POLL_PAUSE", "1"),
                ],
            ),
        ),
        (
            "1-SGE WRITE, spin (0 ns), same bursts",
            "cost-wr",
            same_bursts("0ns", &[]),
        ),
        (
            // Draws from a table and reads the clock as the line's entry does (and waits
            // next to nothing): the line's own cost is its row's less this one.
            "1-SGE WRITE, spin (1 ns), same bursts",
            "cost-wr",
            same_bursts("1ns", &[]),
        ),
        (
            // Not the shim: a post copied into a ring and timed, nothing else (see
            // `copy_into_ring`). A copying line's entry costs at least this plus the
            // draw and the wrapper (the spin 0 ns row).
            "1-SGE WRITE, copy into a ring (floor)",
            "copy-floor",
            same_bursts("0ns", &[]),
        ),
        (
            "zero-delay table, QP selected",
            "cost",
            vec![("IBJITTER_DELAY", "0ns"), ("IBJITTER_QPN", "0")],
        ),
        (
            "zero-delay table, opcode left out",
            "cost",
            vec![("IBJITTER_DELAY", "0ns"), ("IBJITTER_OPS", "read")],
        ),
        (
            "UCP send, layer verbs (pass)",
            "ucp",
            vec![("IBJITTER_DELAY", "0ns"), ("IBJITTER_LAYER", "verbs")],
        ),
        (
            "UCP send, zero-delay table",
            "ucp",
            vec![("IBJITTER_DELAY", "0ns"), ("IBJITTER_LAYER", "ucp")],
        ),
    ] {
        // `cargo bench ... -- WORD`: only the configurations whose name holds WORD.
        if let Some(w) = args.get(1).filter(|a| !a.starts_with('-')) {
            if !name.contains(w.as_str()) {
                continue;
            }
        }
        let r = run_child(&so, &stub, role, &env);
        println!(
            "{name:<38} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r[0], r[1], r[2], r[3]
        );
    }
    let _ = std::fs::remove_file(stats);
    println!();
    println!(
        "delay accuracy (error = measured call time - delay, ns; measured with CLOCK_MONOTONIC)"
    );
    println!(
        "{:<10} {:<6} {:>8} {:>10} {:>10} {:>10} {:>12} {:>16}",
        "delay",
        "spin",
        "samples",
        "median err",
        "|err| p50",
        "|err| p99",
        "timing cost",
        "median err net"
    );
    // Each delay with both spin forms (IBJITTER_SPIN), one after the other.
    for (d, n) in [(1_000u64, 20_000usize), (10_000, 10_000), (100_000, 2_000)] {
        let delay = format!("{d}ns");
        for spin in ["plain", "pause"] {
            let r = run_child(
                &so,
                &stub,
                &format!("{d}:{n}"),
                &[("IBJITTER_DELAY", delay.as_str()), ("IBJITTER_SPIN", spin)],
            );
            // "net": less the cost of timing a direct call the same way (two clock reads).
            println!(
                "{:<10} {spin:<6} {n:>8} {:>10.1} {:>10.1} {:>10.1} {:>12.1} {:>16.1}",
                format!("{} us", d / 1000),
                r[0],
                r[1],
                r[2],
                r[4],
                r[0] - r[4]
            );
        }
    }
    println!();
    line_idle_cost(&so, &stub);
    println!("one pause instruction here: {:.1} ns", pause_ns());
    println!("one clock read (rdtsc) here: {:.1} ns", clock_read_ns());
}

/// Prints what the delay line's timer thread costs while the line is empty (its wake-ups and
/// its share of a core, from the stats' `line.timer_thread`): on a full node that core is a
/// rank's.
fn line_idle_cost(so: &Path, stub: &Path) {
    let stats = std::env::temp_dir().join(format!("ibjitter-idle-{}.json", std::process::id()));
    run_child(
        so,
        stub,
        "line-idle",
        &[
            ("IBJITTER_DELAY", "1us"),
            ("IBJITTER_MODE", "line"),
            ("IBJITTER_STATS", stats.to_str().unwrap()),
        ],
    );
    let text = std::fs::read_to_string(&stats).expect("the line-idle child wrote no stats");
    let _ = std::fs::remove_file(&stats);
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats are JSON");
    let t = &v["line"]["timer_thread"];
    let (wakeups, cpu, alive) = (
        t["wakeups"].as_f64().unwrap_or(0.0),
        t["cpu_ns"].as_f64().unwrap_or(0.0),
        t["alive_ns"].as_f64().unwrap_or(0.0),
    );
    println!(
        "line mode, empty line for 1 s: timer thread {:.0} wake-ups/s, {:.1} % of a core \
         ({:.1} us of CPU a wake-up)",
        wakeups / (alive / 1e9),
        100.0 * cpu / alive,
        cpu / wakeups.max(1.0) / 1e3
    );
}

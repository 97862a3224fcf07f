//! `IBJITTER_MODE=line`: a delay line. A post returns at once; its work requests are copied
//! and handed to the provider by the shim's timer thread when their delay has elapsed, so
//! delays overlap as packets in flight do, instead of adding up along the posting thread
//! (`spin`, the research's semantics and the default).
//!
//! - **Order.** An RC QP never reorders: a work request is due at its own delay or at its
//!   predecessor's due time on the same QP, whichever is later (a per-QP high-water mark).
//! - **Copies.** Each work request takes a slot of a pool allocated at load ([`SLOTS`]): the
//!   request, its scatter list, and its inline payload (the caller may reuse that buffer as
//!   soon as the post returns). A request the slot cannot hold (more than [`MAX_SGE`]
//!   entries, more than [`INLINE_BYTES`] inline bytes, memory-window and TSO opcodes) is
//!   posted directly, in order: the post waits until the QP's earlier requests have left the
//!   line, then for its own delay. A full pool makes a post wait for a free slot (a full
//!   wire queue).
//! - **Hand-off.** Slot indices go through two lock-free bounded queues (free, pending): the
//!   post path takes no lock and makes no syscall. The timer thread keeps the due requests
//!   in a heap, sleeps while the next one is more than [`SPIN_NS`] away (waking at least
//!   every [`IDLE_NS`] to see new ones) and spins the rest.
//! - **Posting from the timer thread** uses the provider's `post_send`, which takes the QP's
//!   send-queue lock (rxe: `qp->sq.lock`; mlx5: `qp->sq.lock`, unless `MLX5_SINGLE_THREADED`
//!   turns its locks off — do not combine that with this mode): the application's own posts
//!   on that QP (only the direct ones above) are serialized with it by the provider.
//! - **Errors** of deferred posts cannot reach the caller (its post returned 0): they are
//!   counted in the stats (`line.post_errors`) and said once on stderr. A QP destroyed with
//!   requests in the line drops them (counted as `line.dropped`).
//! - The `ibv_wr_*` API builds its requests inside the provider; its batches keep waiting in
//!   the posting thread (said once). A forked child has no timer thread: it spins.
use crate::abi::verbs::*;
use crate::sys::clock;
use crate::sys::say;
use crossbeam_queue::ArrayQueue;
use std::cell::UnsafeCell;
use std::collections::BinaryHeap;
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};

/// Work requests the line holds at once.
pub const SLOTS: usize = 4096;
/// Scatter entries a slot holds.
pub const MAX_SGE: usize = 16;
/// Inline payload bytes a slot holds.
pub const INLINE_BYTES: usize = 512;
/// The timer thread spins the last this many ns before a due time (sleeps overshoot).
pub const SPIN_NS: u64 = 150_000;
/// Longest sleep of the timer thread (how late a new request may be seen).
pub const IDLE_NS: u64 = 50_000;

/// One deferred work request.
struct Slot {
    qp: *mut ibv_qp,
    gen: u32,
    /// Due time in clock units ([`now_units`]), and the order of entry.
    due: u64,
    seq: u64,
    wr: ibv_send_wr,
    sge: [ibv_sge; MAX_SGE],
    inline: [u8; INLINE_BYTES],
}

struct Pool(Box<[UnsafeCell<Slot>]>);
// SAFETY: a slot is used by one thread at a time: the poster between taking its index from
// FREE and pushing it to PENDING, then the timer thread until it pushes it back to FREE. The
// raw pointers in it (the QP, the copies' own lists) are only dereferenced by that thread.
unsafe impl Sync for Pool {}
unsafe impl Send for Pool {}

struct Line {
    pool: Pool,
    free: ArrayQueue<u32>,
    pending: ArrayQueue<u32>,
}

static LINE: OnceLock<Line> = OnceLock::new();
/// The line is in use (the timer thread runs).
static ON: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Requests entered and not yet posted or dropped.
static IN_LINE: AtomicU64 = AtomicU64::new(0);
/// The QP the timer thread is posting to now (destroy waits for it to finish).
static POSTING: AtomicPtr<ibv_qp> = AtomicPtr::new(null_mut());
/// Counters for the stats.
static DEFERRED: AtomicU64 = AtomicU64::new(0);
static DIRECT: AtomicU64 = AtomicU64::new(0);
static POST_ERRORS: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// How late the timer thread posted (ns after the due time).
static LATE: Mutex<Option<hdrhistogram::Histogram<u64>>> = Mutex::new(None);

/// A QP's place in the line: its generation (bumped when it is destroyed: requests of an
/// earlier generation are dropped), requests in the line, and the latest due time given.
struct QpLine {
    key: AtomicUsize,
    gen: AtomicU32,
    pending: AtomicU32,
    last_due: AtomicU64,
}

const QP_SLOTS: usize = 8192;
#[allow(clippy::declare_interior_mutable_const)]
const QP_EMPTY: QpLine = QpLine {
    key: AtomicUsize::new(0),
    gen: AtomicU32::new(0),
    pending: AtomicU32::new(0),
    last_due: AtomicU64::new(0),
};
static QPS: [QpLine; QP_SLOTS] = [QP_EMPTY; QP_SLOTS];

/// A freed QP entry (probes go past it; a new QP may take it), and one being set up.
const TOMBSTONE: usize = 1;
const CLAIMING: usize = 2;
/// Generations are unique over the process: a new QP at a destroyed one's address never
/// takes over that QP's requests.
static GEN: AtomicU32 = AtomicU32::new(1);

fn probe(key: usize) -> impl Iterator<Item = usize> {
    crate::sys::addr_table::probe(key, QP_SLOTS)
}

/// The QP's entry, made on its first post (lock-free: a compare-and-swap on a free key).
fn entry(qp: *mut ibv_qp, insert: bool) -> Option<&'static QpLine> {
    let key = qp as usize;
    for i in probe(key).take(256) {
        let e = &QPS[i];
        let mut k = e.key.load(Acquire);
        // Another thread is setting this entry up: wait for its key.
        while k == CLAIMING {
            std::hint::spin_loop();
            k = e.key.load(Acquire);
        }
        match k {
            k if k == key => return Some(e),
            0 | TOMBSTONE if insert => {
                // Claim, set up, then publish the key: whoever finds the key finds it ready.
                if e.key.compare_exchange(k, CLAIMING, AcqRel, Acquire).is_ok() {
                    e.pending.store(0, Release);
                    e.last_due.store(0, Release);
                    e.gen.store(GEN.fetch_add(1, SeqCst), SeqCst);
                    e.key.store(key, Release);
                    return Some(e);
                }
                // Lost the slot: look at it again.
                let k2 = e.key.load(Acquire);
                if k2 == key || k2 == CLAIMING {
                    while e.key.load(Acquire) == CLAIMING {
                        std::hint::spin_loop();
                    }
                    if e.key.load(Acquire) == key {
                        return Some(e);
                    }
                }
            }
            0 => return None,
            _ => {}
        }
    }
    None
}

use clock::{now_units, units_to_ns};

/// Allocates the pool and starts the timer thread (once; when the process first opens a
/// device). Returns false if the line could not start (the caller then spins).
pub fn start() -> bool {
    // 0 not started, 1 starting, 2 on, 3 failed: a second opener waits for the first.
    static STARTED: AtomicU32 = AtomicU32::new(0);
    if STARTED.compare_exchange(0, 1, AcqRel, Acquire).is_err() {
        loop {
            match STARTED.load(Acquire) {
                1 => std::thread::yield_now(),
                s => return s == 2,
            }
        }
    }
    let ok = start_once();
    STARTED.store(if ok { 2 } else { 3 }, Release);
    ok
}

fn start_once() -> bool {
    // The pool (a few MiB) is reserved fallibly: under an address-space limit (`ulimit -v`)
    // the line does not start and posts wait in place, never an abort. (Its queues and the
    // histogram after it are small.)
    let mut pool: Vec<UnsafeCell<Slot>> = Vec::new();
    if pool.try_reserve_exact(SLOTS).is_err() {
        say::warn(&format!(
            "IBJITTER_MODE=line: cannot allocate the delay line's {} KiB (address space \
             limit?); posts wait in place (spin)",
            (SLOTS * std::mem::size_of::<Slot>()) >> 10
        ));
        return false;
    }
    pool.extend((0..SLOTS).map(|_| {
        UnsafeCell::new(Slot {
            qp: null_mut(),
            gen: 0,
            due: 0,
            seq: 0,
            // SAFETY: all-zero is a valid ibv_send_wr and ibv_sge (integers, pointers).
            wr: unsafe { std::mem::zeroed() },
            sge: unsafe { std::mem::zeroed() },
            inline: [0; INLINE_BYTES],
        })
    }));
    let pool = pool.into_boxed_slice();
    let free = ArrayQueue::new(SLOTS);
    for i in 0..SLOTS as u32 {
        let _ = free.push(i);
    }
    let _ = LINE.set(Line {
        pool: Pool(pool),
        free,
        pending: ArrayQueue::new(SLOTS),
    });
    *LATE.lock().unwrap_or_else(|e| e.into_inner()) =
        hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 2).ok();
    match std::thread::Builder::new()
        .name("ibjitter-line".into())
        .spawn(timer_thread)
    {
        Ok(_) => {
            ON.store(true, Release);
            true
        }
        Err(e) => {
            say::warn_once(&format!(
                "IBJITTER_MODE=line: cannot start the timer thread ({e}); posts wait in place (spin)"
            ));
            false
        }
    }
}

/// Whether the line takes posts.
#[inline]
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// Whether the slot can hold `wr`.
unsafe fn fits(wr: *const ibv_send_wr) -> bool {
    let w = &*wr;
    // SEND, WRITE, READ and the two atomics (their immediate and invalidate forms too).
    const DEFERRABLE: u32 = crate::config::select::opcodes(
        crate::config::select::SEND
            | crate::config::select::WRITE
            | crate::config::select::READ
            | crate::config::select::ATOMIC,
    ) & !(1 << ibv_wr_opcode_IBV_WR_TSO
        | 1 << ibv_wr_opcode_IBV_WR_ATOMIC_WRITE);
    let deferrable = w.opcode < 32 && DEFERRABLE & (1 << w.opcode) != 0;
    let n = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
    if !deferrable || n > MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return false;
    }
    if w.send_flags & ibv_send_flags_IBV_SEND_INLINE != 0 {
        let bytes: u64 = (0..n).map(|i| u64::from((*w.sg_list.add(i)).length)).sum();
        return bytes <= INLINE_BYTES as u64;
    }
    true
}

/// Copies `wr` (alone: `next` cleared) into `s`, its scatter list and inline payload too.
unsafe fn copy_into(s: &mut Slot, wr: *const ibv_send_wr) {
    s.wr = *wr;
    s.wr.next = null_mut();
    let n = s.wr.num_sge.max(0) as usize;
    let src = (*wr).sg_list;
    if s.wr.send_flags & ibv_send_flags_IBV_SEND_INLINE != 0 {
        // The payload itself: the caller may overwrite its buffer once the post returns.
        let mut len = 0usize;
        for i in 0..n {
            let e = &*src.add(i);
            let l = e.length as usize;
            std::ptr::copy_nonoverlapping(e.addr as *const u8, s.inline.as_mut_ptr().add(len), l);
            len += l;
        }
        s.sge[0] = ibv_sge {
            addr: s.inline.as_ptr() as u64,
            length: len as u32,
            lkey: 0,
        };
        s.wr.num_sge = i32::from(n > 0);
    } else {
        std::ptr::copy_nonoverlapping(src, s.sge.as_mut_ptr(), n);
    }
    s.wr.sg_list = if n > 0 {
        s.sge.as_mut_ptr()
    } else {
        null_mut()
    };
}

/// The line's `post_send`: each work request of the chain is due `units` (clock units) from
/// now, or at its predecessor's due time on the QP if later. Returns 0 once they are in the
/// line; a request that does not fit in a slot is posted directly, in order (see the module).
///
/// # Safety
/// The arguments of a provider's `post_send`.
pub unsafe fn post(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    units: u64,
) -> c_int {
    let (Some(line), Some(q)) = (LINE.get(), entry(qp, true)) else {
        return direct(qp, wr, bad, units, None);
    };
    if units == 0 && q.pending.load(Acquire) == 0 {
        // Nothing of this QP in the line, nothing to wait: straight to the provider.
        return crate::registry::post_send_orig(qp, wr, bad);
    }
    let mut due = now_units().saturating_add(units);
    due = due.max(q.last_due.fetch_max(due, AcqRel));
    let gen = q.gen.load(Acquire);
    let mut cur = wr;
    while !cur.is_null() {
        if !fits(cur) {
            return direct(qp, cur, bad, 0, Some((q, due)));
        }
        let i = loop {
            match line.free.pop() {
                Some(i) => break i,
                None => std::hint::spin_loop(),
            }
        };
        // SAFETY: index i was taken from the free queue: this thread owns the slot.
        let s = &mut *line.pool.0[i as usize].get();
        copy_into(s, cur);
        s.qp = qp;
        s.gen = gen;
        s.due = due;
        s.seq = SEQ.fetch_add(1, Relaxed);
        q.pending.fetch_add(1, AcqRel);
        IN_LINE.fetch_add(1, AcqRel);
        DEFERRED.fetch_add(1, Relaxed);
        // Cannot fail: there are SLOTS indices, and the queue holds SLOTS.
        let _ = line.pending.push(i);
        cur = (*cur).next;
    }
    0
}

/// Posts `wr` (and the rest of its chain) directly: after the QP's earlier requests left the
/// line (`after`: the QP and the due time they set), then after `units` more.
unsafe fn direct(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    units: u64,
    after: Option<(&QpLine, u64)>,
) -> c_int {
    // A constant: no allocation on the post path.
    say::warn_once(
        "IBJITTER_MODE=line: a work request the line cannot copy (more than 16 scatter \
         entries, more than 512 inline bytes, a memory-window or TSO opcode) or a full QP \
         table: such requests wait in the posting thread, in order",
    );
    DIRECT.fetch_add(1, Relaxed);
    let mut until = now_units().saturating_add(units);
    if let Some((q, due)) = after {
        while q.pending.load(Acquire) != 0 {
            std::hint::spin_loop();
        }
        until = until.max(due);
    }
    while now_units() < until {
        std::hint::spin_loop();
    }
    crate::registry::post_send_orig(qp, wr, bad)
}

fn timer_thread() {
    // SAFETY: prctl on the calling thread: sleeps wake within 1 us of their time.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    let Some(line) = LINE.get() else { return };
    let mut heap: BinaryHeap<std::cmp::Reverse<(u64, u64, u32)>> = BinaryHeap::with_capacity(SLOTS);
    let nap = |ns: u64| std::thread::sleep(std::time::Duration::from_nanos(ns));
    loop {
        while let Some(i) = line.pending.pop() {
            // SAFETY: pushed to pending by its poster: the timer thread owns it now.
            let s = unsafe { &*line.pool.0[i as usize].get() };
            heap.push(std::cmp::Reverse((s.due, s.seq, i)));
        }
        let now = now_units();
        match heap.peek() {
            Some(&std::cmp::Reverse((due, _, i))) if due <= now => {
                heap.pop();
                // SAFETY: the timer thread owns slot i until it frees it here.
                unsafe { post_due(line, i) };
            }
            Some(&std::cmp::Reverse((due, _, _))) => {
                let gap = units_to_ns(due - now);
                if gap > SPIN_NS {
                    nap((gap - SPIN_NS).min(IDLE_NS));
                } else {
                    std::hint::spin_loop();
                }
            }
            None => nap(IDLE_NS),
        }
    }
}

/// Posts slot `i` (unless its QP was destroyed meanwhile) and frees it.
unsafe fn post_due(line: &Line, i: u32) {
    let s = &mut *line.pool.0[i as usize].get();
    let q = entry(s.qp, false);
    // Announce the QP before checking its generation: a destroy either sees it and waits,
    // or bumped the generation first and this post is dropped.
    POSTING.store(s.qp, SeqCst);
    let live = q.is_some_and(|q| q.gen.load(SeqCst) == s.gen);
    if live {
        // Handed over now: how late, before the provider's own time to post.
        let late = units_to_ns(now_units().saturating_sub(s.due));
        let mut bad = null_mut();
        let rc = crate::registry::post_send_orig(s.qp, &mut s.wr, &mut bad);
        // Before POSTING clears: a destroy waiting on it then finds the count settled.
        if let Some(q) = q {
            q.pending.fetch_sub(1, AcqRel);
        }
        POSTING.store(null_mut(), SeqCst);
        if rc != 0 && POST_ERRORS.fetch_add(1, Relaxed) == 0 {
            say::warn(&format!(
                "IBJITTER_MODE=line: the provider refused a deferred work request ({}); \
                 the program's post had returned 0 (counted in the stats' line.post_errors)",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        if let Some(h) = LATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = h.record(late.max(1));
        }
    } else {
        POSTING.store(null_mut(), SeqCst);
        DROPPED.fetch_add(1, Relaxed);
    }
    IN_LINE.fetch_sub(1, AcqRel);
    let _ = line.free.push(i);
}

/// Before `ibv_destroy_qp`: the QP's requests still in the line are dropped, and a post to
/// it in progress finishes first.
///
/// # Safety
/// `qp` null or a live QP.
pub unsafe fn qp_destroyed(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    if let Some(q) = entry(qp, false) {
        q.gen.store(GEN.fetch_add(1, SeqCst), SeqCst);
        while POSTING.load(SeqCst) == qp {
            std::hint::spin_loop();
        }
        q.pending.store(0, Release);
        q.last_due.store(0, Release);
        // The entry is free for another QP; requests of this one still in the line find no
        // entry (or a new QP's, at this address, with another generation) and are dropped.
        q.key.store(TOMBSTONE, Release);
    }
}

/// At exit: waits (up to `limit_ns`) for the requests still in the line to be posted.
pub fn drain(limit_ns: u64) {
    let t0 = clock::monotonic_ns();
    while IN_LINE.load(Acquire) != 0 && clock::monotonic_ns() - t0 < limit_ns {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// fork() child: no timer thread here; the child's posts wait in place, and the parent's
/// requests in the line are not the child's to post.
pub fn after_fork_child() {
    ON.store(false, Release);
    IN_LINE.store(0, Release);
}

/// The stats' `line` object.
pub fn stats_json() -> serde_json::Value {
    let late = LATE.lock().unwrap_or_else(|e| e.into_inner());
    let q = |p: f64| late.as_ref().map(|h| h.value_at_quantile(p));
    serde_json::json!({
        "deferred": DEFERRED.load(Relaxed),
        "posted_directly": DIRECT.load(Relaxed),
        "post_errors": POST_ERRORS.load(Relaxed),
        "dropped": DROPPED.load(Relaxed),
        "in_line_now": IN_LINE.load(Relaxed),
        // How late the timer thread handed requests over, ns after their due time.
        "late_ns": { "p50": q(0.5), "p99": q(0.99), "max": late.as_ref().map(|h| h.max()) },
    })
}

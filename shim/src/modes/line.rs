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
//!   post path takes no lock and makes no syscall. Whoever flushes the line moves pending
//!   requests into a heap ordered by due time and hands the due ones to the provider.
//! - **Who flushes.** The program's own calls, first: each patched `ibv_post_send` and
//!   `ibv_poll_cq` hands over what is due ([`flush_if_due`]: one atomic load while the line
//!   is empty, a clock read and a compare while nothing is due; no syscall, no wait). On a
//!   busy node the ranks that fill the cores are the ones calling into the provider all the
//!   time. The timer thread is for programs that sleep (completion channels, idle phases):
//!   while the program's calls are flushing (one saw requests in the line within
//!   [`ACTIVE_NS`]) it only sleeps, to [`BACKSTOP_NS`] past the earliest due time, leaving
//!   the core to the program; otherwise it sleeps until [`EARLY_NS`] before the earliest due
//!   time (at most [`IDLE_NS`], so it sees new requests) and spins the rest. One thread
//!   flushes at a time (a try-flag: a thread that finds it taken goes on, never waits).
//! - **Posting from another thread** (the timer thread, or a thread polling a CQ) uses the
//!   provider's `post_send`, which takes the QP's
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
use std::sync::OnceLock;

/// Work requests the line holds at once.
pub const SLOTS: usize = 4096;
/// Scatter entries a slot holds.
pub const MAX_SGE: usize = 16;
/// Inline payload bytes a slot holds.
pub const INLINE_BYTES: usize = 512;
/// Longest sleep of the timer thread (how late a new request may be seen when the program
/// makes no call).
pub const IDLE_NS: u64 = 50_000;
/// The timer thread wakes this long before a due time and spins the rest, while the program
/// makes no calls: a sleep's wake-up is late by up to about this much on the bench.
pub const EARLY_NS: u64 = 150_000;
/// The program counts as calling (polling, posting) if one of its calls saw requests in the
/// line this recently: its calls then hand requests over at their due time, and the timer
/// thread only sleeps, as a backstop.
pub const ACTIVE_NS: u64 = 100_000;
/// While the program is calling, how long after its due time a request waits for the
/// program's calls before the timer thread hands it over.
pub const BACKSTOP_NS: u64 = 50_000;
/// The latest clock reading (units) of a program call that found requests in the line.
static PROGRAM_SEEN: AtomicU64 = AtomicU64::new(0);

/// One deferred work request.
struct Slot {
    qp: *mut ibv_qp,
    gen: u32,
    /// Due time in clock units ([`now_units`]), and the order of entry.
    due: u64,
    seq: u64,
    /// The request's own drawn delay (clock units): what it was not given if it is never
    /// handed over.
    units: u64,
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
/// Requests handed over by the program's own calls, and by the timer thread.
static BY_PROGRAM: AtomicU64 = AtomicU64::new(0);
static BY_TIMER: AtomicU64 = AtomicU64::new(0);
/// Requests still in the line when the process ended (never reached the provider), and the
/// sum of their own delays (ns).
static NOT_DELIVERED: AtomicU64 = AtomicU64::new(0);
static NOT_DELIVERED_NS: AtomicU64 = AtomicU64::new(0);
/// The earliest due time in the line (u64::MAX: none known): posters lower it, the flusher
/// sets it from its heap.
static NEXT_DUE: AtomicU64 = AtomicU64::new(u64::MAX);
/// Held by the thread flushing the line now; the [`Flusher`] is its.
static FLUSHING: AtomicBool = AtomicBool::new(false);

/// The flusher's state: the requests taken from `pending`, by due time, and how late they
/// were handed over (ns after the due time).
struct Flusher {
    heap: BinaryHeap<std::cmp::Reverse<(u64, u64, u32)>>,
    late: hdrhistogram::Histogram<u64>,
}

struct FlusherCell(UnsafeCell<Option<Flusher>>);
// SAFETY: only the holder of FLUSHING touches it.
unsafe impl Sync for FlusherCell {}
static FLUSHER: FlusherCell = FlusherCell(UnsafeCell::new(None));

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
            units: 0,
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
    let Ok(late) = hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 2) else {
        return false;
    };
    // SAFETY: no thread flushes before ON is set below.
    unsafe {
        *FLUSHER.0.get() = Some(Flusher {
            heap: BinaryHeap::with_capacity(SLOTS),
            late,
        })
    };
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
    // What is due leaves first (the program's own call hands it over). One clock read
    // serves both that check and this request's due time.
    let now = now_units();
    if IN_LINE.load(Relaxed) != 0 {
        PROGRAM_SEEN.store(now, Relaxed);
        if overdue(now) {
            flush(&BY_PROGRAM);
        }
    }
    let (Some(line), Some(q)) = (LINE.get(), entry(qp, true)) else {
        return direct(qp, wr, bad, units, None);
    };
    if units == 0 && q.pending.load(Acquire) == 0 {
        // Nothing of this QP in the line, nothing to wait: straight to the provider.
        return crate::registry::post_send_orig(qp, wr, bad);
    }
    let mut due = now.saturating_add(units);
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
        s.units = units;
        s.seq = SEQ.fetch_add(1, Relaxed);
        q.pending.fetch_add(1, AcqRel);
        IN_LINE.fetch_add(1, AcqRel);
        DEFERRED.fetch_add(1, Relaxed);
        // Cannot fail: there are SLOTS indices, and the queue holds SLOTS.
        let _ = line.pending.push(i);
        // After the push: a flusher that set NEXT_DUE before it either saw the request in
        // `pending` or sees this lower value (the read-modify-write only when it lowers it).
        if due < NEXT_DUE.load(SeqCst) {
            NEXT_DUE.fetch_min(due, SeqCst);
        }
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
            flush_if_due();
            std::hint::spin_loop();
        }
        until = until.max(due);
    }
    while now_units() < until {
        std::hint::spin_loop();
    }
    crate::registry::post_send_orig(qp, wr, bad)
}

/// Hands over what is due, unless nothing is, or another thread is at it: what the
/// program's patched calls do first. Cheap when there is nothing to do: one atomic load
/// while the line is empty, then a clock read while nothing is due; no syscall, no wait.
#[inline]
pub fn flush_if_due() {
    if IN_LINE.load(Relaxed) == 0 {
        return;
    }
    let now = now_units();
    PROGRAM_SEEN.store(now, Relaxed);
    if overdue(now) {
        flush(&BY_PROGRAM);
    }
}

/// Whether the earliest request is due at `now`.
#[inline(always)]
fn overdue(now: u64) -> bool {
    now >= NEXT_DUE.load(Acquire)
}

/// Moves pending requests to the heap and hands the due ones over, counting them in `by`;
/// false if another thread holds the line.
#[cold]
#[inline(never)]
fn flush(by: &AtomicU64) -> bool {
    let Some(line) = LINE.get() else { return false };
    if FLUSHING.swap(true, Acquire) {
        return false;
    }
    // SAFETY: FLUSHING is ours: so is the flusher's state.
    let Some(f) = (unsafe { &mut *FLUSHER.0.get() }) else {
        FLUSHING.store(false, Release);
        return false;
    };
    loop {
        while let Some(i) = line.pending.pop() {
            // SAFETY: pushed to pending by its poster: the flusher owns it now.
            let s = unsafe { &*line.pool.0[i as usize].get() };
            f.heap.push(std::cmp::Reverse((s.due, s.seq, i)));
        }
        let mut now = now_units();
        let mut list = List::new();
        while let Some(&std::cmp::Reverse((due, _, i))) = f.heap.peek() {
            if due > now {
                now = now_units();
                if due > now {
                    break;
                }
            }
            f.heap.pop();
            // SAFETY: the flusher owns slot i until post_list frees it.
            unsafe { add_to_list(line, &mut list, i, &mut f.late, by) };
        }
        if list.n > 0 {
            // SAFETY: as above.
            unsafe { post_list(line, &mut list, &mut f.late, by) };
        }
        let next = f.heap.peek().map_or(u64::MAX, |r| r.0 .0);
        NEXT_DUE.store(next, SeqCst);
        // A request pushed meanwhile lowered NEXT_DUE before this store, or is in pending.
        if line.pending.is_empty() {
            break;
        }
    }
    FLUSHING.store(false, Release);
    true
}

/// Hands requests over for programs that sleep (completion channels, idle phases), and as a
/// backstop for those that call. While the program's calls are flushing the line (one saw
/// requests in it within [`ACTIVE_NS`]) it only sleeps, to [`BACKSTOP_NS`] past the earliest
/// due time, and leaves the core to the program. Otherwise it sleeps until [`EARLY_NS`]
/// before the earliest due time (at most [`IDLE_NS`], so it sees new requests) and spins the
/// rest, unless a program call hands the request over first.
fn timer_thread() {
    // SAFETY: prctl on the calling thread: sleeps wake within 1 us of their time.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
    let units = |ns| clock::ns_to_units(ns, clock::kind());
    let (early, active, backstop) = (units(EARLY_NS), units(ACTIVE_NS), units(BACKSTOP_NS));
    loop {
        let nap = if IN_LINE.load(Acquire) == 0 {
            IDLE_NS
        } else {
            let (next, now) = (NEXT_DUE.load(Acquire), now_units());
            if now.saturating_sub(PROGRAM_SEEN.load(Relaxed)) < active {
                // The program's calls hand requests over: a backstop only.
                let wake = next.saturating_add(backstop);
                if now >= wake {
                    flush(&BY_TIMER);
                    continue;
                }
                units_to_ns(wake - now).min(ACTIVE_NS)
            } else if next <= now.saturating_add(early) {
                // Due within EARLY_NS: spin to it, unless someone hands it over first.
                while now_units() < next && NEXT_DUE.load(Acquire) == next {
                    std::hint::spin_loop();
                }
                flush(&BY_TIMER);
                continue;
            } else {
                (units_to_ns(next - now) - EARLY_NS).min(IDLE_NS)
            }
        };
        std::thread::sleep(std::time::Duration::from_nanos(nap.max(1)));
    }
}

/// Most requests handed over as one list, and most bytes in it (large READs posted as one
/// list made rxe retry).
const LIST_MAX: usize = 64;
const LIST_BYTES: u64 = 64 * 1024;

/// Due requests of one QP, in order, handed over as one list: one call of the provider's
/// `post_send` (on rxe one system call) for all of them.
struct List {
    slots: [u32; LIST_MAX],
    n: usize,
    bytes: u64,
}

impl List {
    const fn new() -> List {
        List {
            slots: [0; LIST_MAX],
            n: 0,
            bytes: 0,
        }
    }
}

/// The bytes slot `s`'s request carries.
fn bytes_of(s: &Slot) -> u64 {
    (0..s.wr.num_sge.clamp(0, MAX_SGE as i32) as usize)
        .map(|k| u64::from(s.sge[k].length))
        .sum()
}

/// Adds slot `i` to `list`, handing the list over first if `i` is another QP's or the list
/// is full.
unsafe fn add_to_list(
    line: &Line,
    list: &mut List,
    i: u32,
    late_hist: &mut hdrhistogram::Histogram<u64>,
    by: &AtomicU64,
) {
    let s = &*line.pool.0[i as usize].get();
    let bytes = bytes_of(s);
    if list.n > 0 {
        let first = &*line.pool.0[list.slots[0] as usize].get();
        if first.qp != s.qp || list.n == LIST_MAX || list.bytes + bytes > LIST_BYTES {
            post_list(line, list, late_hist, by);
        }
    }
    list.slots[list.n] = i;
    list.n += 1;
    list.bytes += bytes;
}

/// Hands `list` over (the requests of a destroyed QP are dropped) and frees its slots.
unsafe fn post_list(
    line: &Line,
    list: &mut List,
    late_hist: &mut hdrhistogram::Histogram<u64>,
    by: &AtomicU64,
) {
    let slots = &list.slots[..list.n];
    let qp = (*line.pool.0[slots[0] as usize].get()).qp;
    let q = entry(qp, false);
    // Announce the QP before checking its generation: a destroy either sees it and waits,
    // or bumped the generation first and these posts are dropped.
    POSTING.store(qp, SeqCst);
    let gen = q.map(|q| q.gen.load(SeqCst));
    // Link the live requests into one list, in order.
    let mut live = 0usize;
    let mut first: *mut ibv_send_wr = null_mut();
    let mut prev: *mut ibv_send_wr = null_mut();
    let now = now_units();
    for &i in slots {
        let s = &mut *line.pool.0[i as usize].get();
        if Some(s.gen) != gen {
            continue;
        }
        s.wr.next = null_mut();
        if prev.is_null() {
            first = &mut s.wr;
        } else {
            (*prev).next = &mut s.wr;
        }
        prev = &mut s.wr;
        live += 1;
        // Handed over now: how late, before the provider's own time to post.
        let _ = late_hist.record(units_to_ns(now.saturating_sub(s.due)).max(1));
    }
    if live > 0 {
        let mut bad = null_mut();
        let rc = crate::registry::post_send_orig(qp, first, &mut bad);
        if rc != 0 {
            // Those before `bad` were posted (as a provider's own post_send leaves them).
            let mut refused = live as u64;
            let mut cur = first;
            while !cur.is_null() && cur != bad {
                refused -= 1;
                cur = (*cur).next;
            }
            if POST_ERRORS.fetch_add(refused, Relaxed) == 0 {
                say::warn(&format!(
                    "IBJITTER_MODE=line: the provider refused a deferred work request ({}); \
                     the program's post had returned 0 (counted in the stats' line.post_errors)",
                    std::io::Error::from_raw_os_error(rc)
                ));
            }
        }
        by.fetch_add(live as u64, Relaxed);
    }
    // Before POSTING clears: a destroy waiting on it then finds the count settled.
    if let Some(q) = q.filter(|_| live > 0) {
        q.pending.fetch_sub(live as u32, AcqRel);
    }
    POSTING.store(null_mut(), SeqCst);
    DROPPED.fetch_add((list.n - live) as u64, Relaxed);
    IN_LINE.fetch_sub(list.n as u64, AcqRel);
    for &i in slots {
        let _ = line.free.push(i);
    }
    list.n = 0;
    list.bytes = 0;
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

/// At exit: hands over (up to `limit_ns` from now) the requests still in the line as they
/// fall due; those still in it then are counted as not delivered. Returns how many.
pub fn drain(limit_ns: u64) -> u64 {
    let t0 = clock::monotonic_ns();
    while IN_LINE.load(Acquire) != 0 && clock::monotonic_ns() - t0 < limit_ns {
        flush(&BY_PROGRAM);
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    let left = IN_LINE.load(Acquire);
    NOT_DELIVERED.store(left, Relaxed);
    if left > 0 {
        NOT_DELIVERED_NS.store(undelivered_ns(), Relaxed);
    }
    left
}

/// The sum of the own delays (ns) of the requests still in the line.
fn undelivered_ns() -> u64 {
    let Some(line) = LINE.get() else { return 0 };
    with_flusher(|f| {
        let mut sum = 0u64;
        // SAFETY: the flusher's state is ours, and so are the slots it and `pending` hold.
        unsafe {
            while let Some(i) = line.pending.pop() {
                let s = &*line.pool.0[i as usize].get();
                f.heap.push(std::cmp::Reverse((s.due, s.seq, i)));
            }
            for r in f.heap.iter() {
                let s = &*line.pool.0[r.0 .2 as usize].get();
                sum = sum.saturating_add(units_to_ns(s.units));
            }
        }
        sum
    })
    .unwrap_or(0)
}

/// Runs `f` on the flusher's state, holding the line as a flusher does; waits at most 10 ms
/// for a thread flushing now (off the post path: exit, stats, control answers). None when
/// the line has no state or stayed busy.
fn with_flusher<R>(f: impl FnOnce(&mut Flusher) -> R) -> Option<R> {
    for _ in 0..1000 {
        if !FLUSHING.swap(true, Acquire) {
            // SAFETY: FLUSHING is ours: so is the flusher's state.
            let r = unsafe { (*FLUSHER.0.get()).as_mut() }.map(f);
            FLUSHING.store(false, Release);
            return r;
        }
        std::thread::sleep(std::time::Duration::from_micros(10));
    }
    None
}

/// Requests never handed over (still in the line at exit) and their delays' sum (ns).
pub fn not_delivered() -> (u64, u64) {
    (NOT_DELIVERED.load(Relaxed), NOT_DELIVERED_NS.load(Relaxed))
}

/// How late requests were handed over (ns after their due time): (count, p50, p99, max).
/// None when nothing was handed over, or the line is busy (a thread flushing for over 10 ms).
pub fn lateness() -> Option<(u64, u64, u64, u64)> {
    with_flusher(|f| {
        let h = &f.late;
        (!h.is_empty()).then(|| {
            (
                h.len(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max(),
            )
        })
    })
    .flatten()
}

/// fork() child: no timer thread here; the child's posts wait in place, and the parent's
/// requests in the line are not the child's to post.
pub fn after_fork_child() {
    ON.store(false, Release);
    IN_LINE.store(0, Release);
    FLUSHING.store(false, Release);
}

/// The stats' `line` object.
pub fn stats_json() -> serde_json::Value {
    let late = lateness();
    let q = |k: usize| late.map(|l| [l.0, l.1, l.2, l.3][k]);
    serde_json::json!({
        "deferred": DEFERRED.load(Relaxed),
        "posted_directly": DIRECT.load(Relaxed),
        "post_errors": POST_ERRORS.load(Relaxed),
        "dropped": DROPPED.load(Relaxed),
        "in_line_now": IN_LINE.load(Relaxed),
        // Still in the line when the process ended: never reached the provider.
        "not_delivered": NOT_DELIVERED.load(Relaxed),
        // Who handed requests over: the program's own calls (posts and polls), or the
        // timer thread (a program that sleeps).
        "handed_over_by_program_calls": BY_PROGRAM.load(Relaxed),
        "handed_over_by_timer_thread": BY_TIMER.load(Relaxed),
        // How late requests reached the provider, ns after their due time.
        "late_ns": { "count": q(0), "p50": q(1), "p99": q(2), "max": q(3) },
    })
}

/// Requests in the line now (entered, not yet handed over or dropped): one atomic load, for
/// callers that may not allocate or lock (`_exit`, a signal handler).
pub fn in_line() -> u64 {
    IN_LINE.load(Acquire)
}

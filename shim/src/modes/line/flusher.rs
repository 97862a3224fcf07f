//! Handing the line's requests over: whoever flushes (the program's own calls, or the timer
//! thread: [`super::timer`]) takes what entered, orders it by due time and hands what is due
//! to the provider, a QP's due requests as one list. One thread flushes at a time (a
//! try-flag: a thread that finds it taken goes on, never waits). Also what the stats say of
//! the hand-over.
use super::lanes::{self, Line};
use super::qps;
use super::slots::{bytes_of, SLOTS};
use crate::abi::verbs::ibv_send_wr;
use crate::sys::clock::{self, now_units, units_to_ns};
use crate::sys::{rng, say, threads};
use std::cell::UnsafeCell;
use std::collections::BinaryHeap;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// The program counts as calling (polling, posting) if one of its calls saw requests in the
/// line this recently: its calls then hand requests over at their due time, and the timer
/// thread only sleeps, as a backstop.
pub const ACTIVE_NS: u64 = 100_000;

/// The earliest due time in the line (u64::MAX: the line is empty). Posters lower it
/// ([`announce`]), the flusher sets it from its heap.
static NEXT_DUE: AtomicU64 = AtomicU64::new(u64::MAX);
/// A clock reading (units) of a program call that found requests in the line, renewed at
/// most every [`ACTIVE_NS`] / 4 (a store each call would bounce its cache line between the
/// program's core and the timer thread's).
static PROGRAM_SEEN: AtomicU64 = AtomicU64::new(0);
static SEEN_STEP: AtomicU64 = AtomicU64::new(0);
/// The thread flushing the line now ([`rng::this_thread`]; 0: none); the [`Flusher`] is its.
/// Who, not only whether: a post its own signal handler makes while it flushes cannot wait
/// for the flush ([`flushing_here`]).
static FLUSHING: AtomicUsize = AtomicUsize::new(0);

/// The line's earliest due time (u64::MAX: empty), for the timer thread.
pub(super) fn next_due() -> u64 {
    NEXT_DUE.load(SeqCst)
}

/// Whether a thread holds the line (flushes now).
pub(super) fn line_taken() -> bool {
    FLUSHING.load(Relaxed) != 0
}

/// The latest clock reading of a program call that found requests in the line (units).
pub(super) fn program_seen() -> u64 {
    PROGRAM_SEEN.load(Relaxed)
}

/// The program is about to sleep: its calls hand nothing over meanwhile.
pub(super) fn program_quiet() {
    PROGRAM_SEEN.store(0, Relaxed);
}

/// Takes the line for flushing, unless a thread holds it.
#[inline]
fn take_line() -> bool {
    FLUSHING
        .compare_exchange(0, rng::this_thread(), Acquire, Relaxed)
        .is_ok()
}

#[inline]
fn release_line() {
    FLUSHING.store(0, Release);
}

/// Whether the calling thread is flushing the line: a post that finds it so was made inside
/// the flush (by a signal handler, or a provider's call back into verbs) and must not wait
/// for what only the flush it interrupted can give (a slot, a QP's earlier requests).
#[cold]
pub fn flushing_here() -> bool {
    FLUSHING.load(Relaxed) == rng::this_thread()
}

/// Requests taken out of the line (handed over or dropped), refused by the provider, dropped
/// (their QP was destroyed), and handed over by the program's calls and by the timer thread.
/// Only the thread flushing the line writes them (but POST_ERRORS, which says once).
static LEFT: AtomicU64 = AtomicU64::new(0);
/// Set in a fork child: the line (its lanes' rings, its slots) is the parent's, whose
/// requests are for the parent's QPs, whose queues the child may share; nothing of it is
/// ever handed over here ([`forget_after_fork`]).
static PARENTS_LINE: AtomicBool = AtomicBool::new(false);
static POST_ERRORS: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The draws the dropped requests carried, and their sum (ns, saturating): drawn, never
/// given.
static DROPPED_DRAWS: AtomicU64 = AtomicU64::new(0);
static DROPPED_NS: AtomicU64 = AtomicU64::new(0);
pub static BY_PROGRAM: AtomicU64 = AtomicU64::new(0);
pub static BY_TIMER: AtomicU64 = AtomicU64::new(0);

/// The provider's own time taking the line's requests (inside its `post_send`, summed), and
/// the span it falls in: from the first request handed over's entry (its due time less its
/// delay) to the end of the latest hand-over (all in clock units; 0: none yet). Their ratio
/// says whether the provider itself was the bottleneck: a software provider (rxe) does a
/// send's work in that call, tens of microseconds under the bench's emulated CPUs. Only the
/// thread flushing the line writes them.
static PROVIDER_UNITS: AtomicU64 = AtomicU64::new(0);
static FIRST_IN: AtomicU64 = AtomicU64::new(0);
static LAST_OUT: AtomicU64 = AtomicU64::new(0);

/// The flusher's state: the requests taken from the line, by due time, and what the
/// hand-overs measured.
pub struct Flusher {
    heap: BinaryHeap<std::cmp::Reverse<(u64, u32)>>,
    /// Due requests held back in one pass: their QP's request before them has not entered
    /// the line yet ([`in_order`]).
    held: Vec<u32>,
    times: Times,
}

/// How late requests were handed over (after their due time), and how long each call of
/// the provider's `post_send` took them: in clock units, converted to ns when read (a
/// conversion per request handed over cost a division, TSC ticks to ns).
struct Times {
    late: hdrhistogram::Histogram<u64>,
    provider_call: hdrhistogram::Histogram<u64>,
}

struct FlusherCell(UnsafeCell<Option<Flusher>>);
// SAFETY: only the holder of FLUSHING touches it.
unsafe impl Sync for FlusherCell {}
static FLUSHER: FlusherCell = FlusherCell(UnsafeCell::new(None));

/// Sets the flusher's state up (before the line takes its first request). False if its
/// memory cannot be had.
pub fn start() -> bool {
    // Up to an hour in TSC ticks of a 10 GHz clock.
    let hist = || hdrhistogram::Histogram::new_with_bounds(1, 36_000_000_000_000, 2).ok();
    let (Some(late), Some(provider_call)) = (hist(), hist()) else {
        return false;
    };
    let mut heap = BinaryHeap::new();
    let mut held = Vec::new();
    if heap.try_reserve_exact(SLOTS).is_err() || held.try_reserve_exact(SLOTS).is_err() {
        return false;
    }
    SEEN_STEP.store(clock::ns_to_units(ACTIVE_NS / 4, clock::kind()), Relaxed);
    // SAFETY: nothing flushes before the line is on.
    unsafe {
        *FLUSHER.0.get() = Some(Flusher {
            heap,
            held,
            times: Times {
                late,
                provider_call,
            },
        })
    };
    true
}

/// A request entered the line due at `due` (the earliest of its post call's): lowers the
/// line's earliest due time if it is earlier. After the request entered: a flusher that set
/// the earliest due time before either took the request or sees this lower value.
#[inline]
pub fn announce(due: u64) {
    // Orders the way in's store before the load below (the flusher orders its store of
    // NEXT_DUE before its look at the ways in the same way).
    std::sync::atomic::fence(SeqCst);
    if due < NEXT_DUE.load(Relaxed) {
        NEXT_DUE.fetch_min(due, SeqCst);
    }
}

/// Hands over what is due, unless nothing is, or another thread is at it: what the
/// program's calls do first (`now`: their clock reading, if they have one). One atomic load
/// while the line is empty, then a clock read and a compare while nothing is due; no
/// syscall, no wait.
#[inline]
pub fn flush_if_due(now: Option<u64>) {
    let next = NEXT_DUE.load(Acquire);
    if next == u64::MAX {
        return;
    }
    let now = now.unwrap_or_else(now_units);
    if now.wrapping_sub(PROGRAM_SEEN.load(Relaxed)) > SEEN_STEP.load(Relaxed) {
        PROGRAM_SEEN.store(now, Relaxed);
    }
    if now >= next {
        flush(&BY_PROGRAM, Some(now));
    }
}

/// Takes what entered into the heap and hands the due requests over, counting them in `by`;
/// false if another thread holds the line. `now`: the caller's clock reading, if it has one
/// (each read costs 10-20 ns, a good part of a hand-over's own cost).
#[cold]
#[inline(never)]
pub fn flush(by: &AtomicU64, now: Option<u64>) -> bool {
    flush_before(by, now, u64::MAX)
}

/// A thread that had a lane exited: a flush (if the line is free) takes that lane's slots
/// back and frees it for the next thread, even with nothing in the line.
pub fn after_lane_owner_exits() {
    if PARENTS_LINE.load(Acquire) {
        return;
    }
    // Another thread holding the line now (the timer thread's hand-over) would leave the lane
    // to its next flush, and a thread coming meanwhile (a pool's next worker) would find
    // none: the exiting thread waits a little for the line (at most 10 ms; not a post).
    let t0 = clock::monotonic_ns();
    while !flush(&BY_PROGRAM, None) && clock::monotonic_ns().saturating_sub(t0) < 10_000_000 {
        std::thread::yield_now();
    }
}

/// Hands over what is due and due before `ceiling`, when the line is not empty and its
/// earliest request is due: a post waiting in place for its own due time hands over what
/// falls due meanwhile, but never a request due after its own (its QP's later ones, which
/// must leave after it).
#[inline]
pub fn flush_if_due_before(now: u64, ceiling: u64) {
    let next = NEXT_DUE.load(Acquire);
    if next != u64::MAX && now >= next && next < ceiling {
        flush_before(&BY_PROGRAM, Some(now), ceiling);
    }
}

/// [`flush`], handing over only requests due before `ceiling`.
#[cold]
#[inline(never)]
fn flush_before(by: &AtomicU64, now: Option<u64>, ceiling: u64) -> bool {
    let Some(line) = lanes::line() else {
        return false;
    };
    if PARENTS_LINE.load(Acquire) {
        return false;
    }
    // Marked before the line is taken and released after it (its drop at the end): a
    // handler's post while this thread holds the line always finds itself nested.
    let _nested_posts = lanes::hold_while_flushing();
    if !take_line() {
        return false;
    }
    // Not cancelled while it holds the line (the provider's call may be a cancellation
    // point): allowed again at the end, once the line is released.
    let _not_cancelled = crate::sys::threads::NoCancel::hold();
    // SAFETY: FLUSHING is ours: so is the flusher's state.
    let Some(f) = (unsafe { &mut *FLUSHER.0.get() }) else {
        release_line();
        return false;
    };
    let mut given = now;
    loop {
        // SAFETY: FLUSHING is ours; each slot taken is the flusher's until given back.
        unsafe {
            line.take_entered(|i| f.heap.push(std::cmp::Reverse((line.pool.slot(i).due, i))))
        };
        // Those held back last time are looked at again, with what entered since.
        for i in f.held.drain(..) {
            // SAFETY: slot i is still the flusher's.
            f.heap
                .push(std::cmp::Reverse((unsafe { line.pool.slot(i) }.due, i)));
        }
        let mut now = given.take().unwrap_or_else(now_units);
        let hold = clock::ns_to_units(HOLD_NS, clock::kind());
        let mut list = List::new();
        while let Some(&std::cmp::Reverse((due, i))) = f.heap.peek() {
            // `now` is the caller's reading or the latest provider call's return: a request
            // that fell due since leaves at the next call (no second clock read here).
            if due > now || due >= ceiling {
                break;
            }
            f.heap.pop();
            // SAFETY: the flusher owns slot i until post_list gives it back.
            unsafe {
                if in_order(line, &list, i) {
                    add_to_list(line, &mut list, i, &mut f.times, by, &mut now);
                } else if now >= due.saturating_add(hold) {
                    // Its predecessor did not come within HOLD_NS: it leaves (out of order,
                    // counted) rather than hold its QP up.
                    OUT_OF_ORDER.fetch_add(1, Relaxed);
                    add_to_list(line, &mut list, i, &mut f.times, by, &mut now);
                } else {
                    f.held.push(i);
                }
            }
        }
        if list.n > 0 {
            // SAFETY: as above.
            unsafe { post_list(line, &mut list, &mut f.times, by, &mut now) };
        }
        // The earliest due time, or the time a held request stops waiting for its
        // predecessor (whose own entry lowers NEXT_DUE to its due time meanwhile): never a
        // held request's due time, which is past and would have every call flush again.
        let held_until = f
            .held
            .iter()
            // SAFETY: slot i is still the flusher's.
            .map(|&i| unsafe { line.pool.slot(i) }.due.saturating_add(hold))
            .min();
        let next = f
            .heap
            .peek()
            .map_or(u64::MAX, |r| r.0 .0)
            .min(held_until.unwrap_or(u64::MAX));
        // The fence orders this store before the look at the ways below (as `announce`
        // orders a post's): a store that is itself a barrier is not needed.
        NEXT_DUE.store(next, Relaxed);
        std::sync::atomic::fence(SeqCst);
        // A request that entered meanwhile lowered NEXT_DUE after this store, or is seen here.
        if !line.entered_waiting() {
            break;
        }
    }
    release_line();
    true
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

/// How long a due request waits for the request before it on its QP to enter the line
/// ([`in_order`]): an entry is a few hundred ns, or a preemption's length on a busy node; a
/// signal handler that posts inside the entry it interrupted, on the same QP, and then waits
/// for its own request's completion gets it this much later, out of order, rather than never.
const HOLD_NS: u64 = 5_000_000;
/// Requests handed over before the request before them on their QP ([`HOLD_NS`]).
static OUT_OF_ORDER: AtomicU64 = AtomicU64::new(0);

/// Requests handed over before their QP's previous request: it had not entered the line
/// within [`HOLD_NS`] of their due time.
pub fn out_of_order() -> u64 {
    OUT_OF_ORDER.load(Relaxed)
}

/// Whether the due request in slot `i` may be handed over now: the request before it on its
/// QP was (or ends `list`). A QP's requests take their due times in order but may enter the
/// line out of it: a thread (or a signal handler) between taking its due time and entering,
/// while a later request of the QP entered by another way, read after the first by the
/// flusher. Handed over at its due time, the later one went first (a signal handler's post
/// inside the entry it interrupted, lingering past its due time: always; a handler posting
/// every 2 us under load: now and then).
///
/// # Safety
/// The flusher owns slot `i` and the slots of `list`.
unsafe fn in_order(line: &Line, list: &List, i: u32) -> bool {
    let s = line.pool.slot(i);
    if list.n > 0 {
        let last = line.pool.slot(list.slots[list.n - 1]);
        if last.qp == s.qp && last.gen == s.gen && last.due == s.before {
            return true;
        }
    }
    match qps::entry(s.qp) {
        // Its QP was destroyed or reset since: dropped when handed over, whatever the order.
        Some(q) if q.gen() == s.gen => q.may_follow(s.before),
        _ => true,
    }
}

/// Adds slot `i` to `list`, handing the list over first if `i` is another QP's or the list
/// is full (`now`: as [`post_list`]'s).
unsafe fn add_to_list(
    line: &Line,
    list: &mut List,
    i: u32,
    times: &mut Times,
    by: &AtomicU64,
    now: &mut u64,
) {
    let s = line.pool.slot(i);
    let bytes = bytes_of(s);
    let qp = s.qp;
    if list.n > 0 {
        let first = line.pool.slot(list.slots[0]);
        if first.qp != qp || list.n == LIST_MAX || list.bytes + bytes > LIST_BYTES {
            post_list(line, list, times, by, now);
        }
    }
    list.slots[list.n] = i;
    list.n += 1;
    list.bytes += bytes;
}

/// Hands `list` over (the requests of a destroyed QP are dropped) and gives its slots back.
/// Its requests' lateness is taken from a clock reading of its own, just before the
/// provider's call (not from the reading that found them due: the flusher's own work since
/// is part of how late they reach the provider). `now`: set to the time the provider's call
/// returned, the flusher's latest reading.
unsafe fn post_list(
    line: &Line,
    list: &mut List,
    times: &mut Times,
    by: &AtomicU64,
    now: &mut u64,
) {
    let slots = &list.slots[..list.n];
    let qp = line.pool.slot(slots[0]).qp;
    let (q, gen) = qps::posting(qp);
    // Link the live requests into one list, in order.
    let mut live = 0usize;
    let mut last_due = 0;
    let mut first: *mut ibv_send_wr = null_mut();
    let mut prev: *mut ibv_send_wr = null_mut();
    let now_in = now_units();
    for &i in slots {
        let s = line.pool.slot(i);
        if Some(s.gen) != gen {
            if s.units > 0 {
                add(&DROPPED_DRAWS, 1);
                add(&DROPPED_NS, units_to_ns(s.units));
            }
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
        last_due = s.due;
        // Handed over now: how late, before the provider's own time to post.
        let _ = times.late.record(now_in.saturating_sub(s.due).max(1));
    }
    if live > 0 {
        if FIRST_IN.load(Relaxed) == 0 {
            let s = line.pool.slot(slots[0]);
            FIRST_IN.store(s.due.saturating_sub(s.units).max(1), Relaxed);
        }
        let mut bad = null_mut();
        let rc = crate::registry::post_send_orig(qp, first, &mut bad);
        let out = now_units();
        *now = out;
        let took = out.saturating_sub(now_in);
        add(&PROVIDER_UNITS, took);
        let _ = times.provider_call.record(took.max(1));
        LAST_OUT.store(out, Release);
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
        add(by, live as u64);
        // Before the destroy's wait ends: it then finds the QP's hand-over settled.
        if let Some(q) = q {
            q.handed(last_due);
        }
    }
    qps::done_posting();
    if live < list.n {
        add(&DROPPED, (list.n - live) as u64);
    }
    add(&LEFT, list.n as u64);
    for &i in slots {
        line.give_back(line.pool.slot(i).lane, i);
    }
    list.n = 0;
    list.bytes = 0;
}

/// Adds `n` to a count only the thread flushing the line writes (flushers take turns
/// under FLUSHING): no read-modify-write needed.
fn add(count: &AtomicU64, n: u64) {
    // Saturating: a sum of delays (clock units) never wraps to a small one.
    count.store(count.load(Relaxed).saturating_add(n), Release);
}

/// Requests in the line now (entered, not yet handed over or dropped): atomic loads only, for
/// callers that may not allocate or lock (`_exit`, a signal handler).
pub fn in_line() -> u64 {
    let left = LEFT.load(Acquire);
    lanes::entered().saturating_sub(left)
}

/// A fork child: the parent's requests in the line are not the child's (it has no timer
/// thread, and its posts wait in place), nor are its counts and times (the child's exit
/// line and stats said the parent's lateness).
pub fn forget_after_fork() {
    for parents in [
        &PROVIDER_UNITS,
        &FIRST_IN,
        &LAST_OUT,
        &POST_ERRORS,
        &DROPPED,
        &DROPPED_DRAWS,
        &DROPPED_NS,
        &BY_PROGRAM,
        &BY_TIMER,
        &OUT_OF_ORDER,
    ] {
        parents.store(0, Relaxed);
    }
    // SAFETY: the child has one thread, this one: whoever held the flusher's state in the
    // parent is not here (FLUSHING is released below). Clearing allocates nothing.
    if let Some(f) = unsafe { (*FLUSHER.0.get()).as_mut() } {
        f.heap.clear();
        f.held.clear();
        f.times.late.reset();
        f.times.provider_call.reset();
    }
    LEFT.store(lanes::entered(), Release);
    NEXT_DUE.store(u64::MAX, Release);
    // The lanes' rings may still hold requests the parent's flusher had not taken yet: a
    // flush here (the lane-giving destructor of a thread ending by pthread_exit) would hand
    // them over a second time, from the child.
    PARENTS_LINE.store(true, Release);
    release_line();
}

/// Runs `f` on the flusher's state, holding the line as a flusher does; waits at most 10 ms
/// for a thread flushing now (off the post path: exit, stats, control answers). None when
/// the line has no state or stayed busy.
fn with_flusher<R>(f: impl FnOnce(&mut Flusher) -> R) -> Option<R> {
    for _ in 0..1000 {
        let _nested_posts = lanes::hold_while_flushing();
        if take_line() {
            // SAFETY: FLUSHING is ours: so is the flusher's state.
            let r = unsafe { (*FLUSHER.0.get()).as_mut() }.map(f);
            release_line();
            return r;
        }
        if !threads::nap(10_000) {
            std::hint::spin_loop();
        }
    }
    None
}

/// The draws the requests still in the line carry, and their sum (ns).
pub fn undelivered_draws() -> (u64, u64) {
    let Some(line) = lanes::line() else {
        return (0, 0);
    };
    with_flusher(|f| {
        let (mut draws, mut sum) = (0u64, 0u64);
        // SAFETY: the flusher's state is ours, and so are the slots it and the ways hold.
        unsafe {
            line.take_entered(|i| f.heap.push(std::cmp::Reverse((line.pool.slot(i).due, i))));
            for i in f.heap.iter().map(|r| r.0 .1).chain(f.held.iter().copied()) {
                let units = line.pool.slot(i).units;
                if units > 0 {
                    draws += 1;
                    sum = sum.saturating_add(units_to_ns(units));
                }
            }
        }
        (draws, sum)
    })
    .unwrap_or((0, 0))
}

/// How late requests were handed over (ns after their due time): (count, p50, p99, max).
/// None when nothing was handed over, or the line is busy (a thread flushing for over 10 ms).
pub fn lateness() -> Option<(u64, u64, u64, u64)> {
    with_flusher(|f| summary(&f.times.late)).flatten()
}

/// (count, p50, p99, max) of `h` (clock units) in ns; None if empty.
fn summary(h: &hdrhistogram::Histogram<u64>) -> Option<(u64, u64, u64, u64)> {
    (!h.is_empty()).then(|| {
        (
            h.len(),
            units_to_ns(h.value_at_quantile(0.5)),
            units_to_ns(h.value_at_quantile(0.99)),
            units_to_ns(h.max()),
        )
    })
}

/// How busy the line's hand-overs kept the provider: its time inside `post_send` for them
/// (ns), that time's share of the span from the first request's entry to the latest
/// hand-over (0..=1), and its time per request handed over (ns). None before a hand-over.
pub fn provider_busy() -> Option<(u64, f64, u64)> {
    let (first, last) = (FIRST_IN.load(Relaxed), LAST_OUT.load(Acquire));
    let handed = BY_PROGRAM.load(Relaxed) + BY_TIMER.load(Relaxed);
    if first == 0 || last <= first || handed == 0 {
        return None;
    }
    let ns = units_to_ns(PROVIDER_UNITS.load(Relaxed));
    let share = (ns as f64 / units_to_ns(last - first).max(1) as f64).min(1.0);
    Some((ns, share, ns / handed))
}

/// How long the provider's `post_send` took the hand-overs, per call (ns): (calls, p50, p99,
/// max). None as for [`lateness`].
pub fn provider_call_times() -> Option<(u64, u64, u64, u64)> {
    with_flusher(|f| summary(&f.times.provider_call)).flatten()
}

/// Provider refusals and dropped requests, for the stats.
pub fn errors() -> (u64, u64) {
    (POST_ERRORS.load(Relaxed), DROPPED.load(Relaxed))
}

/// Requests dropped (their QP was destroyed while they were in the line).
pub fn dropped() -> u64 {
    DROPPED.load(Acquire)
}

/// The draws the dropped requests carried, and their sum (ns).
pub fn dropped_draws() -> (u64, u64) {
    (DROPPED_DRAWS.load(Acquire), DROPPED_NS.load(Acquire))
}

//! `IBJITTER_MODE=line`: a delay line. A post returns at once; its work requests are copied
//! and handed to the provider when their delay has elapsed, so delays overlap as packets in
//! flight do, instead of adding up along the posting thread (`spin`, the research's
//! semantics and the default).
//!
//! - **Order.** An RC QP never reorders: a work request is due at its own delay or just after
//!   its predecessor's due time on the same QP, whichever is later ([`qps`]), and leaves only
//!   after that predecessor, which may enter the line later (a thread or signal handler
//!   stopped between taking its due time and entering): it waits for it up to 5 ms past its
//!   own due time, then leaves, counted (`line.out_of_order`).
//! - **Copies** ([`slots`]). Each work request takes a slot of a pool allocated when the line
//!   starts: the request, its scatter list, and its inline payload (the caller may reuse that
//!   buffer as soon as the post returns). A request the slot cannot hold (more than
//!   [`slots::MAX_SGE`] entries, more than [`slots::INLINE_BYTES`] inline bytes,
//!   memory-window and TSO opcodes) is posted directly, in order: the post waits until the
//!   QP's earlier requests have left the line, then for its own delay, handing over what
//!   falls due meanwhile. When no slot is free
//!   the post waits for one (a full wire queue), handing over what is due meanwhile.
//! - **Entry** ([`lanes`]). A posting thread has a lane of its own: a slot comes off its way
//!   back and goes in by its way in, each a ring with one writer and one reader. The entry
//!   reads the clock once, takes the QP's due time with one compare-and-swap, and announces
//!   the earliest due time with one fence: no lock, no syscall, no allocation. The slots a
//!   lane takes a few posts later are asked for, for writing, as it takes one: their lines,
//!   last written by the flusher's core, come over meanwhile rather than at the fence.
//!   A signal handler that posts on a thread it interrupted inside an entry takes the
//!   shared way instead (a lane's rings have one writer). A post made inside the thread's
//!   own flush (its handler's) would leave the line only once the handler returned: on a
//!   QP with nothing in the line it waits in place and posts itself, as in spin mode
//!   (`line.posted_in_place`); on another it enters the line, but cannot wait for what only
//!   that flush gives back: when the line is full it is refused with `ENOMEM` (a full send
//!   queue, which a program retries), counted (`line.refused`) and said at exit. A
//!   handler's request the line cannot copy, on a QP with requests in the line, is refused
//!   so too, whatever it interrupted: it would wait for them, one of which may be the
//!   interrupted entry's, not yet in. On the interrupted post's own QP a handler's request
//!   waits for the interrupted one as above (5 ms at most: a handler that waits for its own
//!   request's completion gets it that much later, out of order, not never).
//! - **Hand-off** ([`flusher`]). Whoever flushes the line takes what entered into a heap
//!   ordered by due time and hands the due ones to the provider, a QP's as one list.
//! - **Who flushes.** The program's own calls, first: each patched `ibv_post_send`,
//!   `ibv_poll_cq` and `ibv_start_poll` hands over what is due ([`flush_if_due`]: one atomic
//!   load while the line is empty, a clock read and a compare while nothing is due; no
//!   syscall, no wait). On a busy node the ranks that fill the cores are the ones calling
//!   into the provider all the time. The timer thread ([`timer`]) is for programs that sleep
//!   (completion channels, idle phases): while the program's calls are flushing it only
//!   sleeps, as a backstop, leaving the core to the program; otherwise it sleeps until just
//!   before the earliest due time and spins the rest. Once the line has been empty a while
//!   its sleeps lengthen (to [`timer::IDLE_MAX_NS`]); a program about to sleep on a completion
//!   (`ibv_req_notify_cq`, `ibv_get_cq_event`) wakes it ([`program_may_sleep`]). One thread
//!   flushes at a time.
//! - **Posting from another thread** (the timer thread, or a thread polling a CQ) uses the
//!   provider's `post_send`, which takes the QP's send-queue lock (rxe: `qp->sq.lock`; mlx5:
//!   `qp->sq.lock`, unless `MLX5_SINGLE_THREADED` turns its locks off — do not combine that
//!   with this mode): the application's own posts on that QP (only the direct ones above)
//!   are serialized with it by the provider.
//! - **Errors** of deferred posts cannot reach the caller (its post returned 0): they are
//!   counted in the stats (`line.post_errors`) and said once on stderr. A QP destroyed with
//!   requests in the line drops them (counted as `line.dropped`).
//! - The `ibv_wr_*` API builds its requests inside the provider; its batches keep waiting in
//!   the posting thread (said once). A forked child has no timer thread: it spins.
use crate::abi::verbs::*;
use crate::sys::clock::{self, now_units};
use crate::sys::say;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering::*};

pub mod flusher;
pub mod lanes;
pub mod qps;
pub mod slots;
pub mod thread_domains;
pub mod timer;

pub use flusher::{in_line, lateness, provider_busy, provider_call_times};

/// Requests posted directly (the slot cannot hold them, or the QP table is full).
static DIRECT: AtomicU64 = AtomicU64::new(0);
/// Requests refused (`ENOMEM`) because they were posted inside the thread's own flush and
/// would have had to wait for it; the draws lost with them (a post's, when its chain's first
/// request was refused) and their sum (clock units).
static REFUSED: AtomicU64 = AtomicU64::new(0);
static REFUSED_DRAWS: AtomicU64 = AtomicU64::new(0);
static REFUSED_UNITS: AtomicU64 = AtomicU64::new(0);
/// Posts made inside the thread's own flush on a QP with nothing in the line, which waited
/// in place ([`in_place`]).
static IN_PLACE: AtomicU64 = AtomicU64::new(0);
/// Posts on a QP in a thread domain, which waited in place ([`in_thread_domain`]).
static IN_THREAD_DOMAIN: AtomicU64 = AtomicU64::new(0);
/// Posts that found no free slot and waited for one (the line full).
static WAITED_FOR_SLOT: AtomicU64 = AtomicU64::new(0);
/// Requests still in the line when the process ended (never reached the provider), the
/// draws they carried and their sum (ns).
static NOT_DELIVERED: AtomicU64 = AtomicU64::new(0);
static NOT_DELIVERED_DRAWS: AtomicU64 = AtomicU64::new(0);
static NOT_DELIVERED_NS: AtomicU64 = AtomicU64::new(0);

/// Allocates the pool and starts the timer thread (at the process's first use, which runs
/// once). Returns false if the line could not start: the caller turns the mode off
/// ([`crate::state::set_line`]) and posts wait in place (spin).
pub fn start() -> bool {
    // The pool (a few MiB) is reserved fallibly: under an address-space limit (`ulimit -v`)
    // the line does not start and posts wait in place, never an abort.
    if !lanes::start(flusher::after_lane_owner_exits) || !flusher::start() {
        say::warn(&format!(
            "IBJITTER_MODE=line: cannot allocate the delay line's {} KiB (address space \
             limit?); posts wait in place (spin)",
            lanes::BYTES >> 10
        ));
        return false;
    }
    crate::sys::threads::spawn_or_say(
        "ibjitter-line",
        "IBJITTER_MODE=line has no timer thread; posts wait in place (spin)",
        timer::timer_thread,
    )
}

/// The line's `post_send`: each work request of the chain is due `units` (clock units) from
/// now, or just after its predecessor on the QP if later. Returns 0 once they are in the
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
    flusher::flush_if_due(Some(now));
    let (Some(line), Some(q)) = (lanes::line(), qps::entry_made(qp)) else {
        return direct(qp, wr, bad, units, None);
    };
    if q.in_thread_domain() {
        return in_thread_domain(qp, wr, bad, units);
    }
    if units == 0 && q.idle() {
        // Nothing of this QP in the line, nothing to wait: straight to the provider.
        return crate::registry::post_send_orig(qp, wr, bad);
    }
    let hold = lanes::hold_my_lane();
    if hold.nested() && q.idle() && flusher::flushing_here() {
        return in_place(qp, wr, bad, units);
    }
    let lane = hold.lane;
    let gen = q.gen();
    let mut first_due = None;
    let mut cur = wr;
    while !cur.is_null() {
        if !slots::fits(cur) {
            if let Some(d) = first_due {
                flusher::announce(d);
            }
            if hold.nested() && !q.idle() {
                // A handler's: its turn comes after requests only the code it interrupted
                // can let go (a flush in progress, or an entry that took its due time and
                // has not put its request in yet).
                return refuse(cur, bad, carried(cur, wr, units));
            }
            let (due, before) = q.next_due(now.saturating_add(units));
            return direct(qp, cur, bad, 0, Some((q, before, due)));
        }
        let i = match line.take_slot(lane) {
            Some(i) => i,
            None => match wait_for_slot(line, lane, first_due) {
                Some(i) => i,
                None => return refuse(cur, bad, carried(cur, wr, units)),
            },
        };
        let (due, before) = q.next_due(now.saturating_add(units));
        let s = line.pool.slot(i);
        slots::copy_into(s, cur);
        s.qp = qp;
        s.gen = gen;
        s.lane = lane;
        s.due = due;
        s.before = before;
        s.units = carried(cur, wr, units);
        line.enter(lane, i);
        first_due.get_or_insert(due);
        cur = (*cur).next;
    }
    if let Some(d) = first_due {
        flusher::announce(d);
    }
    0
}

/// The draw request `cur` of the chain `wr` carries: the post's on its first request, none
/// on the rest (the stats count a post's draw once, and so must what subtracts the draws of
/// requests never handed over).
#[inline(always)]
fn carried(cur: *mut ibv_send_wr, wr: *mut ibv_send_wr, units: u64) -> u64 {
    if cur == wr {
        units
    } else {
        0
    }
}

/// No slot is free: the wire is full. Hands over what is due (announcing this call's own
/// requests first, so they count) until a slot comes back. None if this post was made
/// inside the calling thread's own flush (its signal handler's): only that flush, which
/// cannot go on meanwhile, would give a slot back.
#[cold]
#[inline(never)]
fn wait_for_slot(line: &lanes::Line, lane: u32, entered_due: Option<u64>) -> Option<u32> {
    WAITED_FOR_SLOT.fetch_add(1, Relaxed);
    if let Some(d) = entered_due {
        flusher::announce(d);
    }
    if flusher::flushing_here() {
        return None;
    }
    loop {
        flusher::flush_if_due(None);
        if let Some(i) = line.take_slot(lane) {
            return Some(i);
        }
        std::hint::spin_loop();
    }
}

/// A post made inside the calling thread's own flush (its signal handler's) on a QP with
/// nothing in the line waits its delay in place and goes to the provider itself, as in spin
/// mode: entered into the line, it would leave only once the handler returned, and a
/// handler that waits for its completion would wait for ever.
#[cold]
#[inline(never)]
unsafe fn in_place(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    units: u64,
) -> c_int {
    IN_PLACE.fetch_add(1, Relaxed);
    spin_until(now_units().saturating_add(units));
    crate::registry::post_send_orig(qp, wr, bad)
}

/// A post on a QP whose provider takes no lock on it (a thread domain's): the line's hand-over
/// from another thread would race the program's own calls on that QP, or on another QP of
/// its thread domain (mlx5: their shared doorbell). The post waits its delay in place,
/// handing over what falls due meanwhile, and goes to the provider from this thread.
#[cold]
#[inline(never)]
unsafe fn in_thread_domain(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    units: u64,
) -> c_int {
    say::warn_once!(
        "IBJITTER_MODE=line: a QP of a thread domain (ibv_alloc_td: its provider takes no \
         lock on it) is posted to only by the program's own threads: its posts wait in \
         place (spin)",
    );
    IN_THREAD_DOMAIN.fetch_add(1, Relaxed);
    wait_handing_over(now_units().saturating_add(units));
    crate::registry::post_send_orig(qp, wr, bad)
}

/// Waits in place until the clock reads `until` (units).
fn spin_until(until: u64) {
    while now_units() < until {
        std::hint::spin_loop();
    }
}

/// Refuses `wr` and the rest of its chain as a full send queue does (`ENOMEM`, `*bad` at
/// `wr`; those before it are in the line): a post inside the thread's own flush that would
/// have to wait for it. `units`: the draw `wr` carries ([`carried`]). Counted; said at exit.
/// Async-signal-safe: atomics only.
#[cold]
#[inline(never)]
unsafe fn refuse(wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr, units: u64) -> c_int {
    let mut n = 0u64;
    let mut cur = wr;
    while !cur.is_null() {
        n += 1;
        cur = (*cur).next;
    }
    REFUSED.fetch_add(n, Relaxed);
    if units > 0 {
        REFUSED_DRAWS.fetch_add(1, Relaxed);
        REFUSED_UNITS.fetch_add(units, Relaxed);
    }
    if !bad.is_null() {
        *bad = wr;
    }
    libc::ENOMEM
}

/// Posts `wr` (and the rest of its chain) directly: after the QP's earlier requests left the
/// line (`after`: the QP, the due time of the request before, this one's), then after
/// `units` more.
#[cold]
#[inline(never)]
unsafe fn direct(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    units: u64,
    after: Option<(&qps::QpLine, u64, u64)>,
) -> c_int {
    // A constant: no allocation on the post path.
    say::warn_once!(
        "IBJITTER_MODE=line: a work request the line cannot copy (more than 16 scatter \
         entries, more than 512 inline bytes, a memory-window or TSO opcode) or a full QP \
         table: such requests wait in the posting thread, in order",
    );
    DIRECT.fetch_add(1, Relaxed);
    let until = now_units().saturating_add(units);
    if let Some((q, before, due)) = after {
        // Not cancelled until the QP's due time is marked handed (the provider's call may be
        // a cancellation point): the QP's next direct post waits for that mark.
        let _not_cancelled = crate::sys::threads::NoCancel::hold();
        let gen = q.gen();
        // The QP's earlier requests leave first (unless it is destroyed meanwhile).
        while !q.handed_through(before) && q.gen() == gen {
            flusher::flush_if_due(None);
            std::hint::spin_loop();
        }
        wait_handing_over(until.max(due));
        let rc = crate::registry::post_send_orig(qp, wr, bad);
        q.handed(due);
        return rc;
    }
    wait_handing_over(until);
    crate::registry::post_send_orig(qp, wr, bad)
}

/// Waits in place until the clock reads `until` (units), handing over what falls due
/// meanwhile: on a full node the timer thread gets no core while this thread spins, and
/// other QPs' requests would wait for the program's next call. Only what is due before
/// `until`: this request's QP's later requests (another thread's, a handler's) are due after
/// it and must leave after it, even if a provider call of the hand-over runs past `until`.
fn wait_handing_over(until: u64) {
    loop {
        let now = now_units();
        if now >= until {
            return;
        }
        flusher::flush_if_due_before(now, until);
        std::hint::spin_loop();
    }
}

/// Hands over what is due, unless nothing is, or another thread is at it: what the
/// program's patched calls do first. Cheap when there is nothing to do: one atomic load
/// while the line is empty, then a clock read while nothing is due; no syscall, no wait.
#[inline]
pub fn flush_if_due() {
    flusher::flush_if_due(None);
}

/// The program is about to sleep for a completion: see [`timer::program_may_sleep`].
#[inline]
pub fn program_may_sleep() {
    timer::program_may_sleep();
}

/// A QP was created: its entry is made now, while line mode is on, rather than at its first
/// post, where the threads of a program that share it might wait for each other's insertion
/// ([`qps::entry_made`]).
///
/// # Safety
/// `qp` null or a live QP.
pub unsafe fn qp_created(qp: *mut ibv_qp) {
    if !qp.is_null() && crate::state::line_mode() {
        let _ = qps::entry_made(qp);
    }
}

/// Whether `ibv_destroy_qp` may go on: not when the calling thread is itself inside a
/// hand-over to that QP (a signal handler that interrupted it, e.g. one calling `exit` whose
/// cleanup destroys QPs): the hand-over cannot finish while it waits, and the provider's
/// call it interrupted would go on with a freed QP. The destroy then fails with `EBUSY`.
pub fn may_destroy(qp: *mut ibv_qp) -> bool {
    qp.is_null() || qps::posting_now() != qp || !flusher::flushing_here()
}

/// Before `ibv_destroy_qp`: the QP's requests still in the line are dropped, and a hand-over
/// to it in progress finishes first.
///
/// # Safety
/// `qp` null or a live QP.
pub unsafe fn qp_destroyed(qp: *mut ibv_qp) {
    if !qp.is_null() {
        qps::destroyed(qp);
    }
}

/// Before `ibv_modify_qp(qp, attr, mask)`: a QP moved to RESET loses its requests in the line
/// (dropped, counted), as the reset discards its send queue ([`qps::reset`]).
///
/// # Safety
/// `qp` null or a live QP; `attr` null or readable.
pub unsafe fn before_modify_qp(qp: *mut ibv_qp, attr: *const ibv_qp_attr, mask: c_int) {
    let state = ibv_qp_attr_mask_IBV_QP_STATE as c_int;
    if qp.is_null() || attr.is_null() || mask & state == 0 {
        return;
    }
    // Before the real modify (after it, a hand-over could reach the QP while it is reset, or
    // once connected again): a modify to RESET that then fails, rare (it needs only the
    // state), has dropped requests the QP would have sent (counted).
    if (*attr).qp_state == ibv_qp_state_IBV_QPS_RESET && may_destroy(qp) {
        qps::reset(qp);
    }
}

/// Before `ibv_close_device(ctx)`: the requests in the line of its QPs still alive are
/// dropped (counted), never handed to a closed device ([`qps::context_closed`]).
pub fn context_closed(ctx: *mut ibv_context) {
    // A hand-over this thread's own signal handler interrupted: not waited for.
    let mine = if flusher::flushing_here() {
        qps::posting_now()
    } else {
        std::ptr::null_mut()
    };
    qps::context_closed(ctx, mine);
}

/// At exit: hands over (up to `limit_ns` from now) the requests still in the line as they
/// fall due; those still in it then are counted as not delivered. Returns how many.
pub fn drain(limit_ns: u64) -> u64 {
    let t0 = clock::monotonic_ns();
    while in_line() != 0 && clock::monotonic_ns() - t0 < limit_ns {
        flusher::flush(&flusher::BY_PROGRAM, None);
        if !crate::sys::threads::nap(100_000) {
            std::hint::spin_loop();
        }
    }
    let left = in_line();
    // All three each time: an exec's drain that left some, then a failed exec and an exit
    // that leaves none, must not keep the first one's draws.
    let (draws, ns) = if left > 0 {
        flusher::undelivered_draws()
    } else {
        (0, 0)
    };
    NOT_DELIVERED.store(left, Relaxed);
    NOT_DELIVERED_DRAWS.store(draws, Relaxed);
    NOT_DELIVERED_NS.store(ns, Relaxed);
    left
}

/// Requests in this process's own delay line now: 0 when the line is off (never started, or
/// a fork child) or is a `vfork` parent's. Atomic loads and `getpid` only (`_exit` and a
/// signal handler call it).
pub fn own_requests() -> u64 {
    if !crate::state::line_mode() || !crate::state::owns_threads() {
        return 0;
    }
    in_line()
}

/// The process ends now without a drain (`call`: `_exit`, `quick_exit`, a signal's default
/// action): one write says how many requests of its own line are lost, if any.
/// Async-signal-safe: no drain, no lock, no allocation.
pub fn say_lost_at_end(call: &str) {
    let n = own_requests();
    if n == 0 {
        return;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut v = n;
    while v > 0 || at == digits.len() {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let mut msg = [0u8; 128];
    let mut len = 0;
    for part in [
        b"ibjitter: warning: ".as_slice(),
        call.as_bytes(),
        b": ",
        &digits[at..],
        b" requests still in the delay line were not delivered\n",
    ] {
        let k = part.len().min(msg.len() - len);
        msg[len..len + k].copy_from_slice(&part[..k]);
        len += k;
    }
    say::write_to_stderr(&[libc::iovec {
        iov_base: msg.as_mut_ptr().cast(),
        iov_len: len,
    }]);
}

/// Requests never handed over (still in the line at exit).
pub fn not_delivered() -> u64 {
    NOT_DELIVERED.load(Relaxed)
}

pub use flusher::dropped;

/// Requests refused inside the posting thread's own flush ([`refuse`]).
pub fn refused() -> u64 {
    REFUSED.load(Relaxed)
}

/// The draws whose post never reached the provider (a chain's first request not delivered,
/// dropped with its QP, or refused), and their sum (ns): they count as delayed nowhere. In
/// draws, as the stats count them (one a post, or one a request under `IBJITTER_PER=wr`),
/// not in requests: a chain of four under one draw is one delay not given, not four.
pub fn draws_never_given() -> (u64, u64) {
    let (dropped, dropped_ns) = flusher::dropped_draws();
    let refused_ns = clock::units_to_ns(REFUSED_UNITS.load(Relaxed));
    (
        NOT_DELIVERED_DRAWS.load(Relaxed) + dropped + REFUSED_DRAWS.load(Relaxed),
        NOT_DELIVERED_NS
            .load(Relaxed)
            .saturating_add(dropped_ns)
            .saturating_add(refused_ns),
    )
}

/// fork() child: no timer thread here (the state's mode is spin again); the parent's
/// requests in the line are not the child's to post.
pub fn after_fork_child() {
    for parents in [
        &DIRECT,
        &NOT_DELIVERED,
        &NOT_DELIVERED_DRAWS,
        &NOT_DELIVERED_NS,
        &REFUSED,
        &REFUSED_DRAWS,
        &REFUSED_UNITS,
        &IN_PLACE,
        &IN_THREAD_DOMAIN,
    ] {
        parents.store(0, Relaxed);
    }
    flusher::forget_after_fork();
    timer::forget_after_fork();
    qps::forget_after_fork();
}

/// The stats' `line` object.
pub fn stats_json() -> serde_json::Value {
    let (post_errors, dropped) = flusher::errors();
    let timer = timer::timer_cost();
    serde_json::json!({
        "deferred": lanes::entered(),
        "posted_directly": DIRECT.load(Relaxed),
        "post_errors": post_errors,
        "dropped": dropped,
        // Posted inside the thread's own hand-over (a signal handler's) when they would have
        // had to wait for it: refused with ENOMEM, never delayed.
        "refused": REFUSED.load(Relaxed),
        // Posts made inside the thread's own hand-over on a QP with nothing in the line:
        // they waited in place, as in spin mode, and went to the provider at once.
        "posted_in_place": IN_PLACE.load(Relaxed),
        // Handed over before the request before them on their QP, which had not entered the
        // line 5 ms after their due time (a thread or handler stopped inside its entry).
        "out_of_order": flusher::out_of_order(),
        // Posts on QPs whose provider takes no lock (a thread domain's): they waited in
        // place, in the posting thread.
        "in_thread_domain": IN_THREAD_DOMAIN.load(Relaxed),
        "in_line_now": in_line(),
        // Posts that found every slot taken and waited for one to come back (the line
        // holds 4,096 requests), lanes of threads that exited whose slots came back, and
        // requests of threads that had no lane (more than 16 posting at once).
        "waited_for_a_slot": WAITED_FOR_SLOT.load(Relaxed),
        "lanes_given_up": lanes::lanes_given_up(),
        "entered_without_a_lane": lanes::entered_without_a_lane(),
        // Still in the line when the process ended: never reached the provider.
        "not_delivered": NOT_DELIVERED.load(Relaxed),
        // Who handed requests over: the program's own calls (posts and polls), or the
        // timer thread (a program that sleeps).
        "handed_over_by_program_calls": flusher::BY_PROGRAM.load(Relaxed),
        "handed_over_by_timer_thread": flusher::BY_TIMER.load(Relaxed),
        // What the timer thread cost the host (on a full node it takes cores from the
        // program): its wake-ups and CPU time over its life (null: no timer thread), and how
        // often the program's calls before it slept woke it from its sleep on an empty line.
        "timer_thread": timer.map(|(wakeups, cpu_ns, alive_ns)| {
            // `backstop_longest_ns`: its longest sleep while the program's calls hand
            // requests over, longer than 1 ms where its wake-ups cost much (emulated CPUs).
            serde_json::json!({ "wakeups": wakeups, "cpu_ns": cpu_ns, "alive_ns": alive_ns,
                                "woken_by_program": timer::timer_rung(),
                                // Allowed one CPU (a pinned rank's): it never spins.
                                "one_cpu": timer::timer_on_one_cpu(),
                                // 1: it lowered its timer slack to 1 ns; else the slack it
                                // could not lower (null: nor read), by which its sleeps
                                // wake late.
                                "timer_slack_ns": match timer::timer_slack_kept() {
                                    None => Some(1),
                                    Some(timer::SLACK_UNKNOWN) => None,
                                    kept => kept,
                                },
                                "backstop_longest_ns": timer::backstop_longest_ns() })
        }),
        // How late requests reached the provider, ns after their due time.
        "late_ns": summary_json(lateness()),
        // The provider's own time taking the hand-overs (inside its post_send), its share of
        // the line's life (first entry to latest hand-over) and per request: near 1, the line
        // offered requests as fast as the provider takes them (lateness is then queueing).
        // `call_ns`: each call's time (a list of a QP's due requests per call); its tail is
        // the provider's own (a software provider preempted in its kernel work), which the
        // requests due meanwhile wait out as late.
        "provider_post": provider_busy().map(|(ns, share, per_request_ns)| {
            serde_json::json!({ "ns": ns, "busy_share": (share * 1000.0).round() / 1000.0,
                                "per_request_ns": per_request_ns,
                                "call_ns": summary_json(provider_call_times()) })
        }),
    })
}

/// A (count, p50, p99, max) summary as the stats write it (nulls when there is none).
fn summary_json(s: Option<(u64, u64, u64, u64)>) -> serde_json::Value {
    let q = |k: usize| s.map(|s| [s.0, s.1, s.2, s.3][k]);
    serde_json::json!({ "count": q(0), "p50": q(1), "p99": q(2), "max": q(3) })
}

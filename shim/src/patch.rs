//! Pointer swapping in provider structures, and the registries that remember the provider's
//! originals (to call them, and to restore contexts on close).
//!
//! The post wrappers find the original without a lock: while every patched context (QP) had
//! the same original — one provider, the usual case — it sits in one atomic; a process mixing
//! providers looks the object up in a fixed open-addressing table (hash of its address, a
//! few probes). Registration takes a lock (open, close, QP creation and destruction only) and
//! never allocates.
use crate::coverage;
use crate::cq::{self, PollCqFn};
use crate::cq_ex::{self, CreateCqExFn};
use crate::inject;
use crate::line;
use crate::real::{address, FnSlot, QP_TO_QP_EX};
use crate::rng;
use crate::say;
use crate::select;
use crate::stats::Hook;
use crate::verbs_abi::*;
use crate::wr_ops;
use std::ffi::{c_int, c_void};
use std::ptr::{addr_of_mut, null_mut};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};

/// Most contexts tracked at once (a process opens a handful). Table sizes are powers of two.
pub const MAX_CONTEXTS: usize = 256;
/// Most QPs tracked when QPs with different `wr_start` originals coexist.
pub const MAX_QPS: usize = 4096;

/// The original of every patched object while they all agree (one provider: the usual
/// case); "mixed" once two differ, and the wrappers then look the object up.
struct Single<F>(FnSlot<F>);

/// A [`Single`] address meaning "originals differ: scan".
const MIXED: *mut c_void = std::ptr::dangling_mut::<c_void>();

impl<F: Copy> Single<F> {
    const fn new() -> Single<F> {
        Single(FnSlot::empty())
    }

    /// The common original, None while there is none yet or once they differ.
    #[inline(always)]
    fn get(&self) -> Option<F> {
        if self.0.raw(Acquire) == MIXED {
            return None;
        }
        self.0.get(Acquire)
    }

    fn is(&self, orig: *mut c_void) -> bool {
        self.0.raw(Acquire) == orig
    }

    /// Records `orig` as the original of one more object: stays single while all agree.
    fn note(&self, orig: *mut c_void) {
        let cur = self.0.raw(Acquire);
        if cur.is_null() {
            self.0.set_raw(orig, Release);
        } else if cur != orig {
            self.0.set_raw(MIXED, Release);
        }
    }
}

struct CtxEntry {
    ctx: AtomicPtr<ibv_context>,
    post_send: FnSlot<PostSendFn>,
    create_qp_ex: FnSlot<CreateQpExFn>,
    poll_cq: FnSlot<PollCqFn>,
    create_cq_ex: FnSlot<CreateCqExFn>,
}

struct QpEntry {
    qp: AtomicPtr<ibv_qp_ex>,
    ctx: AtomicPtr<ibv_context>,
    wr_start: FnSlot<WrStartFn>,
}

#[allow(clippy::declare_interior_mutable_const)]
const CTX_EMPTY: CtxEntry = CtxEntry {
    ctx: AtomicPtr::new(null_mut()),
    post_send: FnSlot::empty(),
    create_qp_ex: FnSlot::empty(),
    poll_cq: FnSlot::empty(),
    create_cq_ex: FnSlot::empty(),
};
#[allow(clippy::declare_interior_mutable_const)]
const QP_EMPTY: QpEntry = QpEntry {
    qp: AtomicPtr::new(null_mut()),
    ctx: AtomicPtr::new(null_mut()),
    wr_start: FnSlot::empty(),
};

static CONTEXTS: [CtxEntry; MAX_CONTEXTS] = [CTX_EMPTY; MAX_CONTEXTS];
static QPS: [QpEntry; MAX_QPS] = [QP_EMPTY; MAX_QPS];

/// A key meaning "removed": lookups probe past it, insertions reuse it.
const REMOVED: usize = 1;

/// Slots of a `len`-slot table (a power of two) in probe order for `key`: its hash, then on.
/// Every open-addressing table of the shim (contexts, QPs, selected QPs, the line's QPs, CQ
/// rings) probes with this.
pub(crate) fn probe(key: usize, len: usize) -> impl Iterator<Item = usize> {
    // Fibonacci hashing of the address without its always-zero low bits.
    let h = ((key >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) & (len - 1);
    (0..len).map(move |i| (h + i) & (len - 1))
}

/// The slot holding `key`; stops at the first never-used slot.
fn find<T>(table: &'static [T], key: usize, key_of: impl Fn(&T) -> usize) -> Option<&'static T> {
    for i in probe(key, table.len()) {
        match key_of(&table[i]) {
            k if k == key => return Some(&table[i]),
            0 => return None,
            _ => {}
        }
    }
    None
}

/// A free slot for `key` (never used, or removed); call under the lock, after [`find`].
fn free_slot<T>(
    table: &'static [T],
    key: usize,
    key_of: impl Fn(&T) -> usize,
) -> Option<&'static T> {
    probe(key, table.len())
        .map(|i| &table[i])
        .find(|e| matches!(key_of(e), 0 | REMOVED))
}

fn ctx_key(e: &CtxEntry) -> usize {
    e.ctx.load(Acquire) as usize
}

fn qp_key(e: &QpEntry) -> usize {
    e.qp.load(Acquire) as usize
}
static SINGLE_POST_SEND: Single<PostSendFn> = Single::new();
static SINGLE_POLL_CQ: Single<PollCqFn> = Single::new();
static SINGLE_WR_START: Single<WrStartFn> = Single::new();
/// Serializes registration (open, close, QP creation and destruction; never a post). A spin
/// lock rather than a mutex so that fork can hold it across the fork ([`lock_for_fork`]): a
/// child forked while another thread registered would otherwise inherit it held, and hang at
/// its next device open.
static LOCK: AtomicBool = AtomicBool::new(false);

struct Registering;

impl Drop for Registering {
    fn drop(&mut self) {
        LOCK.store(false, Release);
    }
}

fn lock() -> Registering {
    while LOCK
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    Registering
}

/// fork() prepare handler: no registration is half done while the process forks.
pub fn lock_for_fork() {
    std::mem::forget(lock());
}

/// fork() parent and child handler: releases what [`lock_for_fork`] took.
pub extern "C" fn unlock_after_fork() {
    LOCK.store(false, Release);
}

/// Releases the registry entry of a QP being destroyed (its `ibv_qp_ex` starts with the
/// `ibv_qp`, so both have one address).
///
/// # Safety
/// `qp` must be null or a QP about to be destroyed.
pub unsafe fn forget_qp(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    let _g = lock();
    if let Some(q) = find(&QPS, qp as usize, qp_key) {
        q.qp.store(REMOVED as *mut _, Release);
    }
}

/// The context's registry entry (under or outside the lock).
fn find_ctx(ctx: *mut ibv_context) -> Option<&'static CtxEntry> {
    find(&CONTEXTS, ctx as usize, ctx_key)
}

/// Patches a freshly opened context: `ops.post_send`, and `create_qp_ex` when the
/// `verbs_context` has one. Returns false if it was left alone (null, already patched,
/// registry full).
///
/// # Safety
/// `ctx` must be null or a live `ibv_context` not yet used by other threads for posting.
pub unsafe fn patch_context(ctx: *mut ibv_context) -> bool {
    if ctx.is_null() || !inject::wants_patching() {
        return false;
    }
    let _g = lock();
    if find_ctx(ctx).is_some() {
        return false;
    }
    let Some(slot) = free_slot(&CONTEXTS, ctx as usize, ctx_key) else {
        say::warn_once("more than 256 open contexts; new ones are not delayed");
        return false;
    };
    let ops = addr_of_mut!((*ctx).ops);
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    // Never record our own wrapper as an original: that would recurse forever.
    let ours_ps: PostSendFn = if inject::per_wr_asked() {
        post_send_per_wr_hook
    } else {
        post_send_hook
    };
    let ours_cqe: CreateQpExFn = create_qp_ex_hook;
    let orig_ps = (*ops).post_send.filter(|&f| {
        let (ours_a, ours_b): (PostSendFn, PostSendFn) = (post_send_hook, post_send_per_wr_hook);
        address(f) != address(ours_a) && address(f) != address(ours_b)
    });
    let orig_cqe = if vctx.is_null() {
        None
    } else {
        (*vctx)
            .create_qp_ex
            .filter(|&f| address(f) != address(ours_cqe))
    };
    if orig_ps.is_none() && orig_cqe.is_none() {
        return false;
    }
    let ours_poll: PollCqFn = poll_cq_hook;
    let orig_poll = if cq::on() {
        (*ops).poll_cq.filter(|&f| address(f) != address(ours_poll))
    } else {
        None
    };
    let ours_ccqe: CreateCqExFn = create_cq_ex_hook;
    let cq_vctx = verbs_ctx_for_create_cq_ex(ctx);
    let orig_ccqe = if cq::on() && !cq_vctx.is_null() {
        (*cq_vctx)
            .create_cq_ex
            .filter(|&f| address(f) != address(ours_ccqe))
    } else {
        None
    };
    // Originals first, then the key, then the pointer swap: a wrapper can always find them.
    slot.create_cq_ex.set(orig_ccqe, Relaxed);
    slot.poll_cq.set(orig_poll, Relaxed);
    slot.post_send.set(orig_ps, Relaxed);
    slot.create_qp_ex.set(orig_cqe, Relaxed);
    slot.ctx.store(ctx, Release);
    if let Some(orig) = orig_ps {
        SINGLE_POST_SEND.note(address(orig));
        std::ptr::write_volatile(addr_of_mut!((*ops).post_send), Some(ours_ps));
    }
    if orig_cqe.is_some() {
        let f: CreateQpExFn = create_qp_ex_hook;
        std::ptr::write_volatile(addr_of_mut!((*vctx).create_qp_ex), Some(f));
    }
    if let Some(orig) = orig_poll {
        SINGLE_POLL_CQ.note(address(orig));
        std::ptr::write_volatile(addr_of_mut!((*ops).poll_cq), Some(ours_poll));
    }
    if orig_ccqe.is_some() {
        std::ptr::write_volatile(addr_of_mut!((*cq_vctx).create_cq_ex), Some(ours_ccqe));
    }
    true
}

/// Our `verbs_context.create_cq_ex` (`IBJITTER_CQ_TABLE`): the provider's, then the new CQ
/// gets its ring and our poll calls ([`cq_ex`]).
unsafe extern "C" fn create_cq_ex_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let orig = {
        let _g = lock();
        find_ctx(ctx).and_then(|e| e.create_cq_ex.get(Relaxed))
    };
    let Some(orig) = orig else {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    };
    let cq = orig(ctx, attr);
    cq_ex::created(cq);
    cq
}

/// Our `ops.poll_cq` (`IBJITTER_CQ_TABLE`): completions wait in [`cq`]'s ring.
///
/// # Safety
/// Called by libibverbs' inline `ibv_poll_cq` with its arguments.
pub unsafe extern "C" fn poll_cq_hook(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let orig = match SINGLE_POLL_CQ.get() {
        Some(f) => f,
        None => match find_ctx((*cq).context).and_then(|e| e.poll_cq.get(Relaxed)) {
            Some(f) => f,
            None => return -libc::EINVAL,
        },
    };
    cq::poll(cq, n, wc, orig)
}

/// Restores a context's originals (before the real `ibv_close_device` frees it) and forgets
/// its QPs.
///
/// # Safety
/// `ctx` must be null or a live `ibv_context`.
pub unsafe fn unpatch_context(ctx: *mut ibv_context) {
    if ctx.is_null() {
        return;
    }
    let _g = lock();
    let Some(e) = find_ctx(ctx) else { return };
    if let Some(f) = e.post_send.get(Relaxed) {
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.post_send), Some(f));
    }
    if let Some(f) = e.poll_cq.get(Relaxed) {
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.poll_cq), Some(f));
    }
    let cq_vctx = verbs_ctx_for_create_cq_ex(ctx);
    if let (Some(f), false) = (e.create_cq_ex.get(Relaxed), cq_vctx.is_null()) {
        std::ptr::write_volatile(addr_of_mut!((*cq_vctx).create_cq_ex), Some(f));
    }
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    if let (Some(f), false) = (e.create_qp_ex.get(Relaxed), vctx.is_null()) {
        std::ptr::write_volatile(addr_of_mut!((*vctx).create_qp_ex), Some(f));
    }
    e.ctx.store(REMOVED as *mut _, Release);
    for q in &QPS {
        if q.ctx.load(Relaxed) == ctx && qp_key(q) > REMOVED {
            q.qp.store(REMOVED as *mut _, Release);
        }
    }
}

/// Patches a QP's `wr_start` (the `ibv_wr_*` API). Returns false if left alone.
///
/// # Safety
/// `qpx` must be null or a live `ibv_qp_ex`, not yet posting.
pub unsafe fn patch_qp(qpx: *mut ibv_qp_ex) -> bool {
    if qpx.is_null() {
        return false;
    }
    let ours: WrStartFn = wr_start_hook;
    let Some(orig) = (*qpx).wr_start else {
        return false;
    };
    if address(orig) == address(ours) || !inject::wants_patching() {
        return false;
    }
    let ctx = (*qpx).qp_base.context;
    let _g = lock();
    // A QP destroyed without ibv_destroy_qp may have left its address registered: reuse.
    let slot = find(&QPS, qpx as usize, qp_key).or_else(|| free_slot(&QPS, qpx as usize, qp_key));
    match slot {
        Some(q) => {
            q.wr_start.set(Some(orig), Relaxed);
            q.ctx.store(ctx, Relaxed);
            q.qp.store(qpx, Release);
        }
        // Without an entry only the single-provider shortcut can find the original.
        None if SINGLE_WR_START.is(address(orig)) => {}
        None => {
            say::warn_once("too many QPs with differing providers; new ones are not delayed");
            return false;
        }
    }
    SINGLE_WR_START.note(address(orig));
    if inject::per_wr_asked() || select::by_opcode() {
        wr_ops::patch(qpx);
    }
    let f: WrStartFn = wr_start_hook;
    std::ptr::write_volatile(addr_of_mut!((*qpx).wr_start), Some(f));
    true
}

/// Our `ops.post_send`: one delay per call, then the provider's.
///
/// # Safety
/// Called by libibverbs' inline `ibv_post_send` with its arguments.
pub unsafe extern "C" fn post_send_hook(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let mode = inject::mode();
    if mode == 0 {
        // Pass-through needs no stack frame: two loads, two compares and a tail jump.
        return post_send_orig(qp, wr, bad);
    }
    post_send_delayed(qp, wr, bad, mode)
}

#[inline(never)]
unsafe extern "C" fn post_send_delayed(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    mode: u8,
) -> c_int {
    if mode & inject::SLOW != 0 {
        // A tail call: the usual path stays frameless.
        return post_send_slow(qp, wr, bad, mode);
    }
    let Some(wait) = inject::draw(mode, Hook::PostSend) else {
        return post_send_first(qp, wr, bad, mode);
    };
    if wait != 0 {
        return post_send_after_wait(qp, wr, bad, wait);
    }
    // Zero entry: no stack frame, no clock read.
    post_send_orig(qp, wr, bad)
}

/// With a selection (`IBJITTER_OPS`/`_QPN`/`_DEST`: a post it leaves out is counted only)
/// or a shaped source (episodes, correlation, trace).
#[inline(never)]
unsafe extern "C" fn post_send_slow(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    mode: u8,
) -> c_int {
    let mode = if mode & inject::SELECT != 0 && !select::post_selected(qp, wr) {
        inject::unselected(mode)
    } else {
        mode
    };
    if mode & inject::LINE != 0 && line::on() {
        let units = inject::draw_units(mode, Hook::PostSend);
        return line::post(qp, wr, bad, units);
    }
    inject::delay(mode, Hook::PostSend);
    post_send_orig(qp, wr, bad)
}

/// Our `ops.post_send` under `IBJITTER_PER=wr` (chosen when the context is patched, so the
/// default wrapper carries no test for it): a chain goes to [`post_send_each_wr`].
///
/// # Safety
/// Called by libibverbs' inline `ibv_post_send` with its arguments.
pub unsafe extern "C" fn post_send_per_wr_hook(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let mode = inject::mode();
    if mode == 0 {
        return post_send_orig(qp, wr, bad);
    }
    if !wr.is_null() && !(*wr).next.is_null() {
        return post_send_each_wr(qp, wr, bad, mode);
    }
    post_send_delayed(qp, wr, bad, mode)
}

/// `IBJITTER_PER=wr`, a chain of work requests: each waits its own draw and is posted
/// alone, as a copy that ends the chain there (the application's list is never written). On
/// a failure `*bad` names the application's work request; those before it were posted, as
/// the provider's own `post_send` leaves them.
#[inline(never)]
unsafe extern "C" fn post_send_each_wr(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    mode: u8,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        let mut one = *cur;
        one.next = null_mut();
        let rc = post_send_delayed(qp, &mut one, bad, mode);
        if rc != 0 {
            if !bad.is_null() {
                *bad = cur;
            }
            return rc;
        }
        cur = (*cur).next;
    }
    0
}

/// The calling thread's first post: give it a stream, then post as usual.
#[cold]
#[inline(never)]
unsafe extern "C" fn post_send_first(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    mode: u8,
) -> c_int {
    inject::first_post_of_thread();
    post_send_delayed(qp, wr, bad, mode)
}

#[inline(never)]
unsafe extern "C" fn post_send_after_wait(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    wait: u64,
) -> c_int {
    inject::wait(wait);
    post_send_orig(qp, wr, bad)
}

/// The provider's `post_send` for `qp` (the delay line posts through it too).
#[inline(always)]
pub(crate) unsafe fn post_send_orig(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    match SINGLE_POST_SEND.get() {
        Some(f) => f(qp, wr, bad),
        None => post_send_scan(qp, wr, bad),
    }
}

#[cold]
#[inline(never)]
unsafe extern "C" fn post_send_scan(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    match find_ctx((*qp).context).and_then(|e| e.post_send.get(Relaxed)) {
        Some(f) => f(qp, wr, bad),
        None => {
            // Unreachable unless the application posts on a context it already closed.
            if !bad.is_null() {
                *bad = wr;
            }
            libc::EINVAL
        }
    }
}

/// Our `ibv_qp_ex.wr_start`: one delay per batch of `ibv_wr_*` work requests, then the
/// provider's. Waiting here, before the provider's `wr_start` takes its send-queue lock
/// (rxe and mlx5 take it there and release it in `wr_complete`), keeps other threads posting
/// on the QP from stalling behind this delay, as on the `ibv_post_send` path.
///
/// # Safety
/// Called by the inline `ibv_wr_start` with its argument.
pub unsafe extern "C" fn wr_start_hook(qpx: *mut ibv_qp_ex) {
    let mode = inject::mode();
    if mode == 0 {
        return wr_start_orig(qpx);
    }
    wr_start_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_start_delayed(qpx: *mut ibv_qp_ex, mode: u8) {
    let mode = if mode & inject::SELECT != 0 {
        rng::take_batch_open();
        if !select::qp_selected(qpx.cast()) {
            inject::unselected(mode)
        } else if select::by_opcode() {
            // The opcodes come in the work-request calls: one draw per batch waits in the
            // first selected one (wr_ops); with IBJITTER_PER=wr each counts and draws there.
            if mode & inject::PER_WR == 0 {
                inject::count_only(mode, Hook::WrBatch);
                rng::set_batch_open();
            }
            return wr_start_orig(qpx);
        } else {
            mode
        }
    } else {
        mode
    };
    if mode & inject::PER_WR != 0 {
        // The batch's first work request is waited for here, before the provider's lock.
        rng::set_batch_paid();
    }
    if mode & inject::LINE != 0 {
        say::warn_once(
            "IBJITTER_MODE=line: the ibv_wr_* API builds its requests inside the provider; \
             its batches wait in the posting thread (spin)",
        );
    }
    if mode & inject::SHAPED != 0 {
        inject::delay(mode, Hook::WrBatch);
        return wr_start_orig(qpx);
    }
    let Some(wait) = inject::draw(mode, Hook::WrBatch) else {
        return wr_start_first(qpx, mode);
    };
    if wait != 0 {
        return wr_start_after_wait(qpx, wait);
    }
    wr_start_orig(qpx)
}

#[cold]
#[inline(never)]
unsafe extern "C" fn wr_start_first(qpx: *mut ibv_qp_ex, mode: u8) {
    inject::first_post_of_thread();
    wr_start_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_start_after_wait(qpx: *mut ibv_qp_ex, wait: u64) {
    inject::wait(wait);
    wr_start_orig(qpx)
}

#[inline(always)]
unsafe fn wr_start_orig(qpx: *mut ibv_qp_ex) {
    match SINGLE_WR_START.get() {
        Some(f) => f(qpx),
        None => wr_start_scan(qpx),
    }
}

#[cold]
#[inline(never)]
unsafe extern "C" fn wr_start_scan(qpx: *mut ibv_qp_ex) {
    // A QP always has its entry while patched (unless the registry was full and it shares
    // the single original, which the fast path found).
    if let Some(f) = find(&QPS, qpx as usize, qp_key).and_then(|q| q.wr_start.get(Relaxed)) {
        f(qpx)
    }
}

/// Our `verbs_context.create_qp_ex`: the provider's, then patch the new QP's `wr_start`.
unsafe extern "C" fn create_qp_ex_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let orig = {
        let _g = lock();
        find_ctx(ctx).and_then(|e| e.create_qp_ex.get(Relaxed))
    };
    let Some(orig) = orig else {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    };
    let qp = orig(ctx, attr);
    if !qp.is_null() {
        coverage::qp_created();
    }
    patch_qp_ex_of(qp);
    qp
}

/// Patches the `ibv_qp_ex` of `qp`, if it has one (created with send ops flags; a provider
/// may give legacy QPs one too).
///
/// # Safety
/// `qp` must be null or a live QP.
pub unsafe fn patch_qp_ex_of(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    if let Some(to_qpx) = QP_TO_QP_EX.get() {
        patch_qp(to_qpx(qp));
    }
}

/// How many contexts are patched now (for tests).
pub fn patched_contexts() -> usize {
    CONTEXTS.iter().filter(|e| ctx_key(e) > REMOVED).count()
}

//! Layer 5: the process's patched verbs objects and the provider's originals, to call them
//! (the post wrappers, and the delay line posting when due) and to restore contexts on
//! close.
//!
//! The post wrappers find the original without a lock: while every patched context (QP) had
//! the same original — one provider, the usual case — it sits in one atomic; a process mixing
//! providers looks the object up in a fixed open-addressing table ([`crate::sys::addr_table`]).
//! Registration takes a fork-safe spin lock (open, close, QP creation and destruction only)
//! and never allocates.
use crate::abi::verbs::*;
use crate::sys::addr_table::{self, EMPTY, REMOVED};
use crate::sys::spin_lock::{Guard, SpinLock};
use crate::sys::symbols::FnSlot;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// Most contexts tracked at once (a process opens a handful). Table sizes are powers of two.
pub const MAX_CONTEXTS: usize = 256;
/// Most QPs tracked when QPs with different `wr_start` originals coexist.
pub const MAX_QPS: usize = 4096;

/// The original of every patched object while they all agree (one provider: the usual
/// case); "mixed" once two differ, and the wrappers then look the object up.
pub struct Single<F>(FnSlot<F>);

/// A [`Single`] address meaning "originals differ: scan".
const MIXED: *mut c_void = std::ptr::dangling_mut::<c_void>();

impl<F: Copy> Single<F> {
    const fn new() -> Single<F> {
        Single(FnSlot::empty())
    }

    /// The common original, None while there is none yet or once they differ.
    #[inline(always)]
    pub fn get(&self) -> Option<F> {
        if self.0.raw(Acquire) == MIXED {
            return None;
        }
        self.0.get(Acquire)
    }

    pub fn is(&self, orig: *mut c_void) -> bool {
        self.0.raw(Acquire) == orig
    }

    /// Records `orig` as the original of one more object: stays single while all agree.
    pub fn note(&self, orig: *mut c_void) {
        let cur = self.0.raw(Acquire);
        if cur.is_null() {
            self.0.set_raw(orig, Release);
        } else if cur != orig {
            self.0.set_raw(MIXED, Release);
        }
    }
}

/// A patched context and its provider's originals.
pub struct CtxEntry {
    key: AtomicUsize,
    pub post_send: FnSlot<PostSendFn>,
    pub create_qp_ex: FnSlot<CreateQpExFn>,
    pub poll_cq: FnSlot<PollCqFn>,
    pub req_notify_cq: FnSlot<ReqNotifyCqFn>,
    pub create_cq_ex: FnSlot<CreateCqExFn>,
    pub alloc_parent_domain: FnSlot<AllocParentDomainFn>,
}

/// A QP whose `wr_start` is patched, its context and its provider's original.
pub struct QpEntry {
    key: AtomicUsize,
    ctx: AtomicPtr<ibv_context>,
    pub wr_start: FnSlot<WrStartFn>,
}

#[allow(clippy::declare_interior_mutable_const)]
const CTX_EMPTY: CtxEntry = CtxEntry {
    key: AtomicUsize::new(EMPTY),
    post_send: FnSlot::empty(),
    create_qp_ex: FnSlot::empty(),
    poll_cq: FnSlot::empty(),
    req_notify_cq: FnSlot::empty(),
    create_cq_ex: FnSlot::empty(),
    alloc_parent_domain: FnSlot::empty(),
};
#[allow(clippy::declare_interior_mutable_const)]
const QP_EMPTY: QpEntry = QpEntry {
    key: AtomicUsize::new(EMPTY),
    ctx: AtomicPtr::new(null_mut()),
    wr_start: FnSlot::empty(),
};

static CONTEXTS: [CtxEntry; MAX_CONTEXTS] = [CTX_EMPTY; MAX_CONTEXTS];
static QPS: [QpEntry; MAX_QPS] = [QP_EMPTY; MAX_QPS];

fn ctx_key(e: &CtxEntry) -> &AtomicUsize {
    &e.key
}

fn qp_key(e: &QpEntry) -> &AtomicUsize {
    &e.key
}

pub static SINGLE_POST_SEND: Single<PostSendFn> = Single::new();
pub static SINGLE_POLL_CQ: Single<PollCqFn> = Single::new();
pub static SINGLE_WR_START: Single<WrStartFn> = Single::new();
/// Serializes registration (open, close, QP creation and destruction; never a post), held
/// across fork ([`lock_for_fork`]).
static LOCK: SpinLock = SpinLock::new();

/// Registration in progress: the registry's writers take it.
pub fn lock() -> Guard<'static> {
    LOCK.lock()
}

/// fork() prepare handler: no registration is half done while the process forks.
pub fn lock_for_fork() {
    LOCK.hold_for_fork();
}

/// fork() parent handler: releases what [`lock_for_fork`] took.
pub fn release_in_parent() {
    LOCK.release_in_parent();
}

/// fork() child handler: releases what [`lock_for_fork`] took, or another thread held.
pub fn release_in_child() {
    LOCK.release_in_child();
}

/// The context's entry (under or outside the lock).
pub fn find_ctx(ctx: *mut ibv_context) -> Option<&'static CtxEntry> {
    addr_table::find(&CONTEXTS, ctx as usize, MAX_CONTEXTS, ctx_key)
}

/// A new entry for `ctx` (under the lock, after [`find_ctx`] found none). The caller sets
/// its originals before it patches the context's pointers: until then no wrapper looks for
/// them. None when the registry is full.
pub fn claim_ctx(ctx: *mut ibv_context, _locked: &Guard<'_>) -> Option<&'static CtxEntry> {
    addr_table::claim(&CONTEXTS, ctx as usize, MAX_CONTEXTS, ctx_key)
}

/// Forgets a closed context and its QPs (under the lock).
pub fn forget_ctx(e: &CtxEntry, ctx: *mut ibv_context, _locked: &Guard<'_>) {
    e.key.store(REMOVED, Release);
    for q in &QPS {
        if q.ctx.load(Relaxed) == ctx && q.key.load(Relaxed) > REMOVED {
            q.key.store(REMOVED, Release);
        }
    }
}

/// Registers the original `wr_start` of `qpx` (under the lock). False when the registry
/// is full.
pub fn register_qp(
    qpx: *mut ibv_qp_ex,
    ctx: *mut ibv_context,
    orig: WrStartFn,
    _locked: &Guard<'_>,
) -> bool {
    // A QP destroyed without ibv_destroy_qp may have left its address registered: reuse.
    let key = qpx as usize;
    let slot = addr_table::find(&QPS, key, MAX_QPS, qp_key)
        .or_else(|| addr_table::claim(&QPS, key, MAX_QPS, qp_key));
    match slot {
        Some(q) => {
            q.wr_start.set(Some(orig), Relaxed);
            q.ctx.store(ctx, Release);
            true
        }
        None => false,
    }
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
    addr_table::remove(&QPS, qp as usize, MAX_QPS, qp_key);
}

/// The provider's `post_send` for `qp` (the post wrappers and the delay line post through it).
///
/// # Safety
/// The arguments of `ibv_post_send`.
#[inline(always)]
pub unsafe fn post_send_orig(
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

/// The provider's `wr_start` for `qpx`.
///
/// # Safety
/// The argument of `ibv_wr_start`.
#[inline(always)]
pub unsafe fn wr_start_orig(qpx: *mut ibv_qp_ex) {
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
    if let Some(f) =
        addr_table::find(&QPS, qpx as usize, MAX_QPS, qp_key).and_then(|q| q.wr_start.get(Relaxed))
    {
        f(qpx)
    }
}

/// The provider's `poll_cq` for `cq`.
///
/// # Safety
/// `cq` a live CQ.
#[inline]
pub unsafe fn poll_cq_orig(cq: *mut ibv_cq) -> Option<PollCqFn> {
    SINGLE_POLL_CQ
        .get()
        .or_else(|| find_ctx((*cq).context).and_then(|e| e.poll_cq.get(Relaxed)))
}

/// How many contexts are patched now (for tests).
pub fn patched_contexts() -> usize {
    CONTEXTS
        .iter()
        .filter(|e| e.key.load(Acquire) > REMOVED)
        .count()
}

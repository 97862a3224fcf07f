//! Pointer swapping in provider structures, and the registries that remember the provider's
//! originals (to call them, and to restore contexts on close).
//!
//! The post wrappers find the original without a lock: while every patched context (QP) had
//! the same original — one provider, the usual case — it sits in one atomic; only a process
//! mixing providers falls back to scanning a fixed table. Registration takes a mutex (open,
//! close and QP creation only) and never allocates.
use crate::stats::Hook;
use crate::verbs_abi::*;
use std::ffi::{c_int, c_void};
use std::ptr::{addr_of_mut, null_mut};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// Most contexts tracked at once (a process opens a handful).
pub const MAX_CONTEXTS: usize = 256;
/// Most QPs tracked when QPs with different `wr_complete` originals coexist.
pub const MAX_QPS: usize = 4096;

/// A `SINGLE_*` value meaning "originals differ: scan".
const MIXED: *mut c_void = std::ptr::dangling_mut::<c_void>();

struct CtxEntry {
    ctx: AtomicPtr<ibv_context>,
    post_send: AtomicPtr<c_void>,
    create_qp_ex: AtomicPtr<c_void>,
}

struct QpEntry {
    qp: AtomicPtr<ibv_qp_ex>,
    ctx: AtomicPtr<ibv_context>,
    wr_complete: AtomicPtr<c_void>,
}

#[allow(clippy::declare_interior_mutable_const)]
const CTX_EMPTY: CtxEntry = CtxEntry {
    ctx: AtomicPtr::new(null_mut()),
    post_send: AtomicPtr::new(null_mut()),
    create_qp_ex: AtomicPtr::new(null_mut()),
};
#[allow(clippy::declare_interior_mutable_const)]
const QP_EMPTY: QpEntry = QpEntry {
    qp: AtomicPtr::new(null_mut()),
    ctx: AtomicPtr::new(null_mut()),
    wr_complete: AtomicPtr::new(null_mut()),
};

static CONTEXTS: [CtxEntry; MAX_CONTEXTS] = [CTX_EMPTY; MAX_CONTEXTS];
static QPS: [QpEntry; MAX_QPS] = [QP_EMPTY; MAX_QPS];
static SINGLE_POST_SEND: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static SINGLE_WR_COMPLETE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static NQPS: AtomicUsize = AtomicUsize::new(0);
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    // A panic while holding it cannot leave the tables inconsistent in a harmful way.
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `orig` as the original of one more object: stays "single" while all agree.
fn note_single(single: &AtomicPtr<c_void>, orig: *mut c_void) {
    let cur = single.load(Acquire);
    if cur.is_null() {
        single.store(orig, Release);
    } else if cur != orig {
        single.store(MIXED, Release);
    }
}

/// The context's registry entry (under or outside the lock).
fn find_ctx(ctx: *mut ibv_context) -> Option<&'static CtxEntry> {
    CONTEXTS.iter().find(|e| e.ctx.load(Acquire) == ctx)
}

/// Patches a freshly opened context: `ops.post_send`, and `create_qp_ex` when the
/// `verbs_context` has one. Returns false if it was left alone (null, already patched,
/// registry full).
///
/// # Safety
/// `ctx` must be null or a live `ibv_context` not yet used by other threads for posting.
pub unsafe fn patch_context(ctx: *mut ibv_context) -> bool {
    if ctx.is_null() || !crate::wants_patching() {
        return false;
    }
    let _g = lock();
    if find_ctx(ctx).is_some() {
        return false;
    }
    let Some(slot) = CONTEXTS.iter().find(|e| e.ctx.load(Relaxed).is_null()) else {
        crate::warn_once("more than 256 open contexts; new ones are not delayed");
        return false;
    };
    let ops = addr_of_mut!((*ctx).ops);
    let orig_ps = (*ops).post_send.map_or(null_mut(), |f| f as *mut c_void);
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    let orig_cqe = if vctx.is_null() {
        null_mut()
    } else {
        (*vctx)
            .create_qp_ex
            .map_or(null_mut(), |f| f as *mut c_void)
    };
    // Never record our own wrapper as an original: that would recurse forever.
    let ours_ps = post_send_hook as *mut c_void;
    let ours_cqe = create_qp_ex_hook as *mut c_void;
    let patch_ps = !orig_ps.is_null() && orig_ps != ours_ps;
    let patch_cqe = !orig_cqe.is_null() && orig_cqe != ours_cqe;
    if !patch_ps && !patch_cqe {
        return false;
    }
    // Originals first, then the key, then the pointer swap: a wrapper can always find them.
    slot.post_send
        .store(if patch_ps { orig_ps } else { null_mut() }, Relaxed);
    slot.create_qp_ex
        .store(if patch_cqe { orig_cqe } else { null_mut() }, Relaxed);
    slot.ctx.store(ctx, Release);
    if patch_ps {
        note_single(&SINGLE_POST_SEND, orig_ps);
        let f: PostSendFn = post_send_hook;
        std::ptr::write_volatile(addr_of_mut!((*ops).post_send), Some(f));
    }
    if patch_cqe {
        let f: CreateQpExFn = create_qp_ex_hook;
        std::ptr::write_volatile(addr_of_mut!((*vctx).create_qp_ex), Some(f));
    }
    true
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
    let ps = e.post_send.load(Relaxed);
    if !ps.is_null() {
        let f: PostSendFn = std::mem::transmute::<*mut c_void, PostSendFn>(ps);
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.post_send), Some(f));
    }
    let cqe = e.create_qp_ex.load(Relaxed);
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    if !cqe.is_null() && !vctx.is_null() {
        let f: CreateQpExFn = std::mem::transmute::<*mut c_void, CreateQpExFn>(cqe);
        std::ptr::write_volatile(addr_of_mut!((*vctx).create_qp_ex), Some(f));
    }
    e.ctx.store(null_mut(), Release);
    for q in &QPS[..NQPS.load(Relaxed)] {
        if q.ctx.load(Relaxed) == ctx {
            q.qp.store(null_mut(), Release);
        }
    }
}

/// Patches a QP's `wr_complete` (the `ibv_wr_*` API). Returns false if left alone.
///
/// # Safety
/// `qpx` must be null or a live `ibv_qp_ex`, not yet posting.
pub unsafe fn patch_qp(qpx: *mut ibv_qp_ex) -> bool {
    if qpx.is_null() {
        return false;
    }
    let orig = (*qpx).wr_complete.map_or(null_mut(), |f| f as *mut c_void);
    let ours = wr_complete_hook as *mut c_void;
    if orig.is_null() || orig == ours || !crate::wants_patching() {
        return false;
    }
    let ctx = (*qpx).qp_base.context;
    let _g = lock();
    let n = NQPS.load(Relaxed);
    // A destroyed QP's address may come back: reuse its entry.
    let slot = QPS[..n]
        .iter()
        .find(|q| q.qp.load(Relaxed) == qpx)
        .or_else(|| QPS[..n].iter().find(|q| q.qp.load(Relaxed).is_null()))
        .or_else(|| {
            (n < MAX_QPS).then(|| {
                NQPS.store(n + 1, Release);
                &QPS[n]
            })
        });
    match slot {
        Some(q) => {
            q.wr_complete.store(orig, Relaxed);
            q.ctx.store(ctx, Relaxed);
            q.qp.store(qpx, Release);
        }
        // Without an entry only the single-provider shortcut can find the original.
        None if SINGLE_WR_COMPLETE.load(Acquire) == orig => {}
        None => {
            crate::warn_once("too many QPs with differing providers; new ones are not delayed");
            return false;
        }
    }
    note_single(&SINGLE_WR_COMPLETE, orig);
    let f: WrCompleteFn = wr_complete_hook;
    std::ptr::write_volatile(addr_of_mut!((*qpx).wr_complete), Some(f));
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
    let mode = crate::mode();
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
    let Some(wait) = crate::draw(mode, Hook::PostSend) else {
        return post_send_first(qp, wr, bad, mode);
    };
    if wait != 0 {
        return post_send_after_wait(qp, wr, bad, wait);
    }
    // Zero entry: no stack frame, no clock read.
    post_send_orig(qp, wr, bad)
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
    crate::rng::init_current_thread();
    post_send_delayed(qp, wr, bad, mode)
}

#[inline(never)]
unsafe extern "C" fn post_send_after_wait(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    wait: u64,
) -> c_int {
    crate::clock::wait(wait);
    post_send_orig(qp, wr, bad)
}

#[inline(always)]
unsafe fn post_send_orig(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let f = SINGLE_POST_SEND.load(Acquire);
    if f == MIXED || f.is_null() {
        return post_send_scan(qp, wr, bad);
    }
    std::mem::transmute::<*mut c_void, PostSendFn>(f)(qp, wr, bad)
}

#[cold]
#[inline(never)]
unsafe extern "C" fn post_send_scan(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let f = find_ctx((*qp).context).map_or(null_mut(), |e| e.post_send.load(Relaxed));
    if f.is_null() {
        // Unreachable unless the application posts on a context it already closed.
        if !bad.is_null() {
            *bad = wr;
        }
        return libc::EINVAL;
    }
    std::mem::transmute::<*mut c_void, PostSendFn>(f)(qp, wr, bad)
}

/// Our `ibv_qp_ex.wr_complete`: one delay per call, then the provider's.
///
/// # Safety
/// Called by the inline `ibv_wr_complete` with its argument.
pub unsafe extern "C" fn wr_complete_hook(qpx: *mut ibv_qp_ex) -> c_int {
    let mode = crate::mode();
    if mode == 0 {
        return wr_complete_orig(qpx);
    }
    wr_complete_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_complete_delayed(qpx: *mut ibv_qp_ex, mode: u8) -> c_int {
    let Some(wait) = crate::draw(mode, Hook::WrComplete) else {
        return wr_complete_first(qpx, mode);
    };
    if wait != 0 {
        return wr_complete_after_wait(qpx, wait);
    }
    wr_complete_orig(qpx)
}

#[cold]
#[inline(never)]
unsafe extern "C" fn wr_complete_first(qpx: *mut ibv_qp_ex, mode: u8) -> c_int {
    crate::rng::init_current_thread();
    wr_complete_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_complete_after_wait(qpx: *mut ibv_qp_ex, wait: u64) -> c_int {
    crate::clock::wait(wait);
    wr_complete_orig(qpx)
}

#[inline(always)]
unsafe fn wr_complete_orig(qpx: *mut ibv_qp_ex) -> c_int {
    let f = SINGLE_WR_COMPLETE.load(Acquire);
    if f == MIXED || f.is_null() {
        return wr_complete_scan(qpx);
    }
    std::mem::transmute::<*mut c_void, WrCompleteFn>(f)(qpx)
}

#[cold]
#[inline(never)]
unsafe extern "C" fn wr_complete_scan(qpx: *mut ibv_qp_ex) -> c_int {
    let f = QPS[..NQPS.load(Acquire)]
        .iter()
        .find(|q| q.qp.load(Acquire) == qpx)
        .map_or(null_mut(), |q| q.wr_complete.load(Relaxed));
    if f.is_null() {
        return libc::EINVAL;
    }
    std::mem::transmute::<*mut c_void, WrCompleteFn>(f)(qpx)
}

/// Our `verbs_context.create_qp_ex`: the provider's, then patch the new QP's `wr_complete`.
unsafe extern "C" fn create_qp_ex_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let orig = {
        let _g = lock();
        find_ctx(ctx).map_or(null_mut(), |e| e.create_qp_ex.load(Relaxed))
    };
    if orig.is_null() {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    }
    let qp = std::mem::transmute::<*mut c_void, CreateQpExFn>(orig)(ctx, attr);
    crate::hooks::patch_qp_ex_of(qp);
    qp
}

/// How many contexts are patched now (for tests).
pub fn patched_contexts() -> usize {
    CONTEXTS
        .iter()
        .filter(|e| !e.ctx.load(Relaxed).is_null())
        .count()
}

//! Pointer swapping in provider structures: a context's `ops.post_send` (and with a
//! completion table `ops.poll_cq` and `create_cq_ex`), its `create_qp_ex`, and each QP's
//! `wr_start`. The originals go to the [`crate::registry`] first, then the pointer is
//! swapped, so a wrapper can always find them; closing a context restores them.
use crate::abi::verbs::*;
use crate::modes::{cq, cq_ex, line, select};
use crate::registry::{self, SINGLE_POLL_CQ, SINGLE_POST_SEND, SINGLE_WR_START};
use crate::state;
use crate::sys::say;
use crate::sys::symbols::{address, QP_TO_QP_EX};
use crate::wrappers::post::{post_send_hook, post_send_per_wr_hook, wr_start_hook};
use crate::wrappers::wr_ops;
use std::ffi::c_int;
use std::ptr::{addr_of_mut, null_mut};
use std::sync::atomic::Ordering::*;

/// Whether new contexts need patching: not when the configuration is loaded and asks for
/// nothing (no table, no stats, no control, no completion table): then posts go straight
/// to the provider at no cost.
fn wanted() -> bool {
    state::send_side_wants_patching() || state::cq_delay()
}

/// Patches a freshly opened context: `ops.post_send`, and `create_qp_ex` when the
/// `verbs_context` has one. Returns false if it was left alone (null, already patched,
/// registry full).
///
/// # Safety
/// `ctx` must be null or a live `ibv_context` not yet used by other threads for posting.
pub unsafe fn patch_context(ctx: *mut ibv_context) -> bool {
    if ctx.is_null() || !wanted() {
        return false;
    }
    let g = registry::lock();
    if registry::find_ctx(ctx).is_some() {
        return false;
    }
    let ops = addr_of_mut!((*ctx).ops);
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    // Never record our own wrapper as an original: that would recurse forever.
    let ours_ps: PostSendFn = if state::per_wr_asked() {
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
    // Completion-side delay holds completions in our poll; the delay line hands due
    // requests over from it (the program's own calls first).
    let orig_poll = if state::cq_delay() || state::line_mode() {
        (*ops).poll_cq.filter(|&f| address(f) != address(ours_poll))
    } else {
        None
    };
    // The delay line wakes its timer thread when the program arms a CQ to sleep on.
    let ours_notify: ReqNotifyCqFn = req_notify_cq_hook;
    let orig_notify = if state::line_mode() {
        (*ops)
            .req_notify_cq
            .filter(|&f| address(f) != address(ours_notify))
    } else {
        None
    };
    let ours_ccqe: CreateCqExFn = create_cq_ex_hook;
    let cq_vctx = verbs_ctx_for_create_cq_ex(ctx);
    // Extended CQs: completion-side delay swaps their poll calls; the delay line has their
    // start_poll hand over what is due.
    let orig_ccqe = if (state::cq_delay() || state::line_mode()) && !cq_vctx.is_null() {
        (*cq_vctx)
            .create_cq_ex
            .filter(|&f| address(f) != address(ours_ccqe))
    } else {
        None
    };
    // The delay line must know which PDs are thread domains' (their QPs take no lock).
    let ours_apd: AllocParentDomainFn = alloc_parent_domain_hook;
    let apd_vctx = verbs_ctx_for_alloc_parent_domain(ctx);
    let orig_apd = if state::line_mode() && !apd_vctx.is_null() {
        (*apd_vctx)
            .alloc_parent_domain
            .filter(|&f| address(f) != address(ours_apd))
    } else {
        None
    };
    let Some(slot) = registry::claim_ctx(ctx, &g) else {
        say::warn_once!("more than 256 open contexts; new ones are not delayed");
        return false;
    };
    // Originals first, then the pointer swap: a wrapper can always find them.
    slot.create_cq_ex.set(orig_ccqe, Release);
    slot.poll_cq.set(orig_poll, Release);
    slot.req_notify_cq.set(orig_notify, Release);
    slot.post_send.set(orig_ps, Release);
    slot.create_qp_ex.set(orig_cqe, Release);
    slot.alloc_parent_domain.set(orig_apd, Release);
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
    if orig_notify.is_some() {
        std::ptr::write_volatile(addr_of_mut!((*ops).req_notify_cq), Some(ours_notify));
    }
    if orig_ccqe.is_some() {
        std::ptr::write_volatile(addr_of_mut!((*cq_vctx).create_cq_ex), Some(ours_ccqe));
    }
    if orig_apd.is_some() {
        std::ptr::write_volatile(
            addr_of_mut!((*apd_vctx).alloc_parent_domain),
            Some(ours_apd),
        );
    }
    true
}

/// The provider's original of a patched context's op, looked up under the registry's lock
/// (a close may be restoring it).
fn original<F>(
    ctx: *mut ibv_context,
    pick: impl FnOnce(&registry::CtxEntry) -> Option<F>,
) -> Option<F> {
    let _g = registry::lock();
    registry::find_ctx(ctx).and_then(pick)
}

/// Our `verbs_context.alloc_parent_domain` (`IBJITTER_MODE=line`): the provider's, then a
/// domain made with a thread domain is noted ([`line::thread_domains`]).
unsafe extern "C" fn alloc_parent_domain_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    let Some(orig) = original(ctx, |e| e.alloc_parent_domain.get(Relaxed)) else {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    };
    let pd = orig(ctx, attr);
    if !pd.is_null() && !attr.is_null() && !(*attr).td.is_null() {
        line::thread_domains::made(pd);
    }
    pd
}

/// Our `verbs_context.create_cq_ex` (`IBJITTER_CQ_TABLE`): the provider's, then the new CQ
/// gets its ring and our poll calls ([`cq_ex`]).
unsafe extern "C" fn create_cq_ex_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let Some(orig) = original(ctx, |e| e.create_cq_ex.get(Relaxed)) else {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    };
    let cq = orig(ctx, attr);
    cq_ex::created(cq);
    cq
}

/// Our `ops.poll_cq`: first hands over what the delay line has due (`IBJITTER_MODE=line`),
/// then polls; with `IBJITTER_CQ_TABLE` completions wait in [`cq`]'s ring.
///
/// # Safety
/// Called by libibverbs' inline `ibv_poll_cq` with its arguments.
pub unsafe extern "C" fn poll_cq_hook(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    line::flush_if_due();
    match registry::poll_cq_orig(cq) {
        Some(orig) if state::cq_delay() => cq::poll(cq, n, wc, orig),
        Some(orig) => orig(cq, n, wc),
        None => -libc::EINVAL,
    }
}

/// Our `ops.req_notify_cq` (`IBJITTER_MODE=line`): the program arms a CQ, most often to
/// sleep on its completion channel next: the delay line hands over what is due and wakes its
/// timer thread for the requests still in it ([`line::program_may_sleep`]), then the
/// provider's.
///
/// # Safety
/// Called by libibverbs' inline `ibv_req_notify_cq` with its arguments.
pub unsafe extern "C" fn req_notify_cq_hook(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    line::program_may_sleep();
    match registry::find_ctx((*cq).context).and_then(|e| e.req_notify_cq.get(Relaxed)) {
        Some(orig) => orig(cq, solicited_only),
        None => libc::EINVAL,
    }
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
    let g = registry::lock();
    let Some(e) = registry::find_ctx(ctx) else {
        return;
    };
    if let Some(f) = e.post_send.get(Relaxed) {
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.post_send), Some(f));
    }
    if let Some(f) = e.poll_cq.get(Relaxed) {
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.poll_cq), Some(f));
    }
    if let Some(f) = e.req_notify_cq.get(Relaxed) {
        std::ptr::write_volatile(addr_of_mut!((*ctx).ops.req_notify_cq), Some(f));
    }
    let cq_vctx = verbs_ctx_for_create_cq_ex(ctx);
    if let (Some(f), false) = (e.create_cq_ex.get(Relaxed), cq_vctx.is_null()) {
        std::ptr::write_volatile(addr_of_mut!((*cq_vctx).create_cq_ex), Some(f));
    }
    let vctx = verbs_ctx_for_create_qp_ex(ctx);
    if let (Some(f), false) = (e.create_qp_ex.get(Relaxed), vctx.is_null()) {
        std::ptr::write_volatile(addr_of_mut!((*vctx).create_qp_ex), Some(f));
    }
    let apd_vctx = verbs_ctx_for_alloc_parent_domain(ctx);
    if let (Some(f), false) = (e.alloc_parent_domain.get(Relaxed), apd_vctx.is_null()) {
        std::ptr::write_volatile(addr_of_mut!((*apd_vctx).alloc_parent_domain), Some(f));
    }
    registry::forget_ctx(e, ctx, &g);
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
    if address(orig) == address(ours) || !wanted() {
        return false;
    }
    let ctx = (*qpx).qp_base.context;
    let g = registry::lock();
    // Without an entry only the single-provider shortcut can find the original.
    if !registry::register_qp(qpx, ctx, orig, &g) && !SINGLE_WR_START.is(address(orig)) {
        say::warn_once!("too many QPs with differing providers; new ones are not delayed");
        return false;
    }
    SINGLE_WR_START.note(address(orig));
    if state::per_wr_asked() || select::by_opcode() {
        wr_ops::patch(qpx);
    }
    let f: WrStartFn = wr_start_hook;
    std::ptr::write_volatile(addr_of_mut!((*qpx).wr_start), Some(f));
    true
}

/// Our `verbs_context.create_qp_ex`: the provider's, then, for a QP created for the
/// `ibv_wr_*` API, patch its `wr_start`.
unsafe extern "C" fn create_qp_ex_hook(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let Some(orig) = original(ctx, |e| e.create_qp_ex.get(Relaxed)) else {
        *libc::__errno_location() = libc::EOPNOTSUPP;
        return null_mut();
    };
    // Read before the provider's call, which may write the attributes back.
    let send_ops = !attr.is_null()
        && (*attr).comp_mask & ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    let qp = orig(ctx, attr);
    if !qp.is_null() {
        state::note_qp_created();
        crate::modes::line::qp_created(qp);
        if send_ops {
            patch_qp_ex_of(qp);
        }
    }
    qp
}

/// Patches the `ibv_qp_ex` of `qp`, created with send ops flags (the only QPs that have one:
/// `ibv_qp_to_qp_ex` reads a `verbs_qp`'s `comp_mask`, past the end of the QP objects of
/// providers that give legacy QPs a plain `ibv_qp`, as siw, erdma and hfi1 do).
///
/// # Safety
/// `qp` must be a live QP created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
unsafe fn patch_qp_ex_of(qp: *mut ibv_qp) {
    if let Some(to_qpx) = QP_TO_QP_EX.get() {
        patch_qp(to_qpx(qp));
    }
}

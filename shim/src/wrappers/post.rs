//! The post wrappers: our `ops.post_send` (one delay per call, or per work request with
//! `IBJITTER_PER=wr`) and our `ibv_qp_ex.wr_start` (one delay per batch of `ibv_wr_*`
//! requests). The default path reads the mode byte, draws, waits and tail-calls the
//! provider's function, with no stack frame, lock, syscall or allocation; everything else
//! (selection, shapes, the delay line) goes out of line.
use crate::abi::verbs::*;
use crate::draw::{self, counts::Hook};
use crate::modes::{line, select};
use crate::registry::{post_send_orig, wr_start_orig};
use crate::state::{self, LINE, PER_WR, SELECT, SHAPED, SLOW};
use crate::sys::{rng, say};
use std::ffi::c_int;
use std::ptr::null_mut;

/// Our `ops.post_send`: one delay per call, then the provider's.
///
/// # Safety
/// Called by libibverbs' inline `ibv_post_send` with its arguments.
pub unsafe extern "C" fn post_send_hook(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let mode = state::mode();
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
    if mode & SLOW != 0 {
        // A tail call: the usual path stays frameless.
        return post_send_slow(qp, wr, bad, mode);
    }
    let Some(wait) = draw::draw(mode, Hook::PostSend) else {
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
    let mode = if mode & SELECT != 0 && !select::post_selected(qp, wr) {
        state::unselected(mode)
    } else {
        mode
    };
    if mode & LINE != 0 {
        let units = draw::draw_units(mode, Hook::PostSend);
        return line::post(qp, wr, bad, units);
    }
    draw::delay(mode, Hook::PostSend);
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
    let mode = state::mode();
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
    draw::first_post_of_thread();
    post_send_delayed(qp, wr, bad, mode)
}

#[inline(never)]
unsafe extern "C" fn post_send_after_wait(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
    wait: u64,
) -> c_int {
    draw::wait(wait);
    post_send_orig(qp, wr, bad)
}

/// Our `ibv_qp_ex.wr_start`: one delay per batch of `ibv_wr_*` work requests, then the
/// provider's. Waiting here, before the provider's `wr_start` takes its send-queue lock
/// (rxe and mlx5 take it there and release it in `wr_complete`), keeps other threads posting
/// on the QP from stalling behind this delay, as on the `ibv_post_send` path.
///
/// # Safety
/// Called by the inline `ibv_wr_start` with its argument.
pub unsafe extern "C" fn wr_start_hook(qpx: *mut ibv_qp_ex) {
    let mode = state::mode();
    if mode == 0 {
        return wr_start_orig(qpx);
    }
    wr_start_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_start_delayed(qpx: *mut ibv_qp_ex, mode: u8) {
    // A batch starts with nothing paid: an earlier one that ended without a work request
    // (empty, aborted) must not lend its paid first request to this one.
    rng::take_batch_paid();
    let mode = if mode & SELECT != 0 {
        rng::take_batch_open();
        if !select::qp_selected(qpx.cast()) {
            state::unselected(mode)
        } else if select::by_opcode() {
            // The opcodes come in the work-request calls: one draw per batch waits in the
            // first selected one (wr_ops); with IBJITTER_PER=wr each counts and draws there.
            if mode & PER_WR == 0 {
                draw::count_only(mode, Hook::WrBatch);
                rng::set_batch_open();
            }
            return wr_start_orig(qpx);
        } else {
            mode
        }
    } else {
        mode
    };
    if mode & PER_WR != 0 {
        // The batch's first work request is waited for here, before the provider's lock.
        rng::set_batch_paid();
    }
    if mode & LINE != 0 {
        say::warn_once!(
            "IBJITTER_MODE=line: the ibv_wr_* API builds its requests inside the provider; \
             its batches wait in the posting thread (spin)",
        );
    }
    if mode & SHAPED != 0 {
        draw::delay(mode, Hook::WrBatch);
        return wr_start_orig(qpx);
    }
    let Some(wait) = draw::draw(mode, Hook::WrBatch) else {
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
    draw::first_post_of_thread();
    wr_start_delayed(qpx, mode)
}

#[inline(never)]
unsafe extern "C" fn wr_start_after_wait(qpx: *mut ibv_qp_ex, wait: u64) {
    draw::wait(wait);
    wr_start_orig(qpx)
}

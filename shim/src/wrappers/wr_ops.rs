//! `IBJITTER_PER=wr` on the `ibv_wr_*` API: the work-request calls of a batch
//! (`ibv_wr_send`, `ibv_wr_rdma_write`, ...) each wait their own draw. And `IBJITTER_OPS`:
//! a batch's opcodes are known only in these calls, so its one delay waits in its first
//! selected work request (with the provider's send-queue lock held, see below), or in each
//! selected one under `IBJITTER_PER=wr`.
//!
//! A batch's work requests exist only between `ibv_wr_start` and `ibv_wr_complete`, and the
//! providers (rxe, mlx5) hold the QP's send-queue lock in between. So the first work
//! request's delay is waited in `wr_start`, before the lock (as in the default mode); each
//! further one waits in its own call, *with* the provider's lock held: other threads posting
//! on that QP wait too. A batch of one (the common case) never waits under the lock.
//!
//! The provider's originals sit in one slot per call: every QP of a process normally has the
//! same provider. A QP whose provider has different functions (a second provider using the
//! `ibv_wr_*` API in one process) keeps its own calls, with one delay per batch, and the
//! shim says so once. `ibv_wr_atomic_write` (newer than the other calls, and maybe beyond the
//! end of an older provider's struct) is not hooked: it shares its batch's delay.
use crate::abi::verbs::*;
use crate::draw::{self, counts::Hook};
use crate::modes::select;
use crate::state;
use crate::sys::rng;
use crate::sys::say;
use crate::sys::symbols::{address, FnSlot};
use std::ptr::addr_of_mut;
use std::sync::atomic::Ordering::*;

/// Waits for one work request of a batch, unless `wr_start` already waited for it; with
/// `IBJITTER_OPS`, only a selected one waits.
///
/// # Safety
/// `qpx` is the live QP of the call.
#[inline(always)]
unsafe fn before_work_request(qpx: *mut ibv_qp_ex, opcode: ibv_wr_opcode) {
    let mode = state::mode();
    let selected = || {
        mode & state::SELECT == 0
            || (select::opcode_selected(opcode) && select::qp_selected(qpx.cast()))
    };
    if mode & state::PER_WR != 0 {
        if !rng::take_batch_paid() {
            let m = if selected() {
                mode
            } else {
                state::unselected(mode)
            };
            draw::delay(m, Hook::WrBatch);
        }
    } else if mode & state::SELECT != 0 && selected() && rng::take_batch_open() {
        draw::delay_drawn_only(mode);
    }
}

/// For each hooked call: its field in `ibv_qp_ex`, the original's slot, and our wrapper.
macro_rules! work_request_calls {
    ($($field:ident = $opcode:ident: fn($($arg:ident: $ty:ty),*);)*) => {
        /// The providers' originals, one slot per call.
        mod originals {
            use super::*;
            $(
                #[allow(non_upper_case_globals)]
                pub static $field: FnSlot<unsafe extern "C" fn(*mut ibv_qp_ex $(, $ty)*)> =
                    FnSlot::empty();
            )*
        }

        /// Our wrappers: wait, then the provider's call.
        mod wrappers {
            use super::*;
            $(
                pub unsafe extern "C" fn $field(qpx: *mut ibv_qp_ex $(, $arg: $ty)*) {
                    before_work_request(qpx, $opcode);
                    // Set before the QP's pointer was swapped to this wrapper.
                    if let Some(f) = originals::$field.get(Acquire) {
                        f(qpx $(, $arg)*)
                    }
                }
            )*
        }

        /// Points `qpx`'s work-request calls at our wrappers, when its provider's originals
        /// are the ones already recorded (or the first). Returns false if it left them.
        ///
        /// # Safety
        /// `qpx` must be a live `ibv_qp_ex` not yet posting; call under the registry lock.
        pub unsafe fn patch(qpx: *mut ibv_qp_ex) -> bool {
            // First check every call, then swap: a QP gets all wrappers or none.
            $(
                if let Some(orig) = (*qpx).$field {
                    let ours: unsafe extern "C" fn(*mut ibv_qp_ex $(, $ty)*) = wrappers::$field;
                    let known = originals::$field.raw(Acquire);
                    if address(orig) != address(ours)
                        && !known.is_null()
                        && known != address(orig)
                    {
                        say::warn_once!(
                            "IBJITTER_PER=wr: the ibv_wr_* calls of a second provider are not \
                             hooked; its batches get one delay each",
                        );
                        return false;
                    }
                }
            )*
            $(
                if let Some(orig) = (*qpx).$field {
                    let ours: unsafe extern "C" fn(*mut ibv_qp_ex $(, $ty)*) = wrappers::$field;
                    if address(orig) != address(ours) {
                        originals::$field.set(Some(orig), Release);
                        std::ptr::write_volatile(addr_of_mut!((*qpx).$field), Some(ours));
                    }
                }
            )*
            true
        }
    };
}

work_request_calls! {
    wr_atomic_cmp_swp = ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP:
        fn(rkey: u32, remote_addr: u64, compare: u64, swap: u64);
    wr_atomic_fetch_add = ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD:
        fn(rkey: u32, remote_addr: u64, add: u64);
    wr_bind_mw = ibv_wr_opcode_IBV_WR_BIND_MW:
        fn(mw: *mut ibv_mw, rkey: u32, bind_info: *const ibv_mw_bind_info);
    wr_local_inv = ibv_wr_opcode_IBV_WR_LOCAL_INV: fn(invalidate_rkey: u32);
    wr_rdma_read = ibv_wr_opcode_IBV_WR_RDMA_READ: fn(rkey: u32, remote_addr: u64);
    wr_rdma_write = ibv_wr_opcode_IBV_WR_RDMA_WRITE: fn(rkey: u32, remote_addr: u64);
    wr_rdma_write_imm = ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM:
        fn(rkey: u32, remote_addr: u64, imm_data: __be32);
    wr_send = ibv_wr_opcode_IBV_WR_SEND: fn();
    wr_send_imm = ibv_wr_opcode_IBV_WR_SEND_WITH_IMM: fn(imm_data: __be32);
    wr_send_inv = ibv_wr_opcode_IBV_WR_SEND_WITH_INV: fn(invalidate_rkey: u32);
    wr_send_tso = ibv_wr_opcode_IBV_WR_TSO: fn(hdr: *mut std::ffi::c_void, hdr_sz: u16, mss: u16);
}

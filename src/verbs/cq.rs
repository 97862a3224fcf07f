//! Completion queues.
use super::{Context, Error, Result};
use std::mem::MaybeUninit;
use std::sync::Arc;

pub struct CompletionQueue {
    raw: *mut rdma_sys::ibv_cq,
    _ctx: Arc<Context>,
}

// SAFETY: libibverbs CQs may be polled from any thread (one at a time here).
unsafe impl Send for CompletionQueue {}
unsafe impl Sync for CompletionQueue {}

/// The parts of an `ibv_wc` the generator uses.
#[derive(Debug, Clone, Copy)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub qp_num: u32,
}

impl WorkCompletion {
    /// A blank entry, to size the arrays completions are polled into.
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: 0,
        opcode: 0,
        byte_len: 0,
        qp_num: 0,
    };

    pub fn ok(&self) -> bool {
        self.status == rdma_sys::ibv_wc_status::IBV_WC_SUCCESS
    }
}

impl CompletionQueue {
    pub fn new(ctx: &Arc<Context>, entries: i32) -> Result<Arc<CompletionQueue>> {
        // SAFETY: no completion channel, no context pointer.
        let raw = unsafe {
            rdma_sys::ibv_create_cq(
                ctx.as_raw(),
                entries,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if raw.is_null() {
            return Err(Error::last("ibv_create_cq"));
        }
        Ok(Arc::new(CompletionQueue {
            raw,
            _ctx: ctx.clone(),
        }))
    }
    pub fn as_raw(&self) -> *mut rdma_sys::ibv_cq {
        self.raw
    }

    /// Polls up to `out.len()` completions (at most 64 per call) into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        const BATCH: usize = 64;
        let mut wc: [MaybeUninit<rdma_sys::ibv_wc>; BATCH] =
            [const { MaybeUninit::uninit() }; BATCH];
        let want = out.len().min(BATCH) as i32;
        // SAFETY: wc has room for `want` entries; the provider fills the first n.
        let n = unsafe { rdma_sys::ibv_poll_cq(self.raw, want, wc.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(Error::code("ibv_poll_cq", n));
        }
        for (slot, raw) in out.iter_mut().zip(&wc[..n as usize]) {
            // SAFETY: the first n entries were written by ibv_poll_cq.
            let w = unsafe { raw.assume_init_ref() };
            *slot = WorkCompletion {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                qp_num: w.qp_num,
            };
        }
        Ok(n as usize)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold an Arc to it, so they are gone.
        unsafe { rdma_sys::ibv_destroy_cq(self.raw) };
    }
}

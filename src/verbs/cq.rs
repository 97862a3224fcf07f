//! Completion queues.
use super::context::Context;
use super::error::{Error, Result};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Duration;

pub struct CompletionQueue {
    raw: *mut rdma_sys::ibv_cq,
    /// The completion channel of a CQ made with [`CompletionQueue::with_events`].
    channel: *mut rdma_sys::ibv_comp_channel,
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

    /// A receive completed (a SEND arrived), as opposed to one of our own operations.
    pub fn is_recv(&self) -> bool {
        self.opcode == rdma_sys::ibv_wc_opcode::IBV_WC_RECV
    }

    /// An RDMA WRITE with immediate landed here and took one of our receives.
    pub fn is_recv_imm(&self) -> bool {
        self.opcode == rdma_sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    }
}

impl CompletionQueue {
    /// A CQ that is only polled.
    pub fn new(ctx: &Arc<Context>, entries: i32) -> Result<Arc<CompletionQueue>> {
        Self::create(ctx, entries, std::ptr::null_mut())
    }

    /// A CQ that can also be waited on ([`CompletionQueue::arm`], [`CompletionQueue::wait`]),
    /// for a consumer that should sleep rather than spin while nothing completes.
    pub fn with_events(ctx: &Arc<Context>, entries: i32) -> Result<Arc<CompletionQueue>> {
        // SAFETY: ctx is an open context.
        let channel = unsafe { rdma_sys::ibv_create_comp_channel(ctx.as_raw()) };
        if channel.is_null() {
            return Err(Error::last("ibv_create_comp_channel"));
        }
        Self::create(ctx, entries, channel).inspect_err(|_| unsafe {
            // SAFETY: the channel has no CQ yet.
            rdma_sys::ibv_destroy_comp_channel(channel);
        })
    }

    fn create(
        ctx: &Arc<Context>,
        entries: i32,
        channel: *mut rdma_sys::ibv_comp_channel,
    ) -> Result<Arc<CompletionQueue>> {
        // SAFETY: the channel is null or belongs to ctx; no context pointer.
        let raw = unsafe {
            rdma_sys::ibv_create_cq(ctx.as_raw(), entries, std::ptr::null_mut(), channel, 0)
        };
        if raw.is_null() {
            return Err(Error::last("ibv_create_cq"));
        }
        Ok(Arc::new(CompletionQueue {
            raw,
            channel,
            _ctx: ctx.clone(),
        }))
    }

    /// Asks for an event at the next completion. A completion that arrived before arming
    /// raises none: poll once more after arming, before waiting.
    pub fn arm(&self) -> Result<()> {
        if self.channel.is_null() {
            return Err(Error::other("ibv_req_notify_cq", "CQ made without events"));
        }
        // SAFETY: raw is a live CQ with a completion channel.
        let rc = unsafe { rdma_sys::ibv_req_notify_cq(self.raw, 0) };
        if rc != 0 {
            return Err(Error::code("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Waits up to `timeout` for the event of an armed CQ; false when none came.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        if self.channel.is_null() {
            return Err(Error::other("ibv_get_cq_event", "CQ made without events"));
        }
        // SAFETY: the channel is live.
        let fd = unsafe { (*self.channel).fd };
        if !super::event_fd::readable(fd, timeout, "poll(completion channel)")? {
            return Ok(false);
        }
        let mut cq = std::ptr::null_mut();
        let mut cq_context = std::ptr::null_mut();
        // SAFETY: the channel is readable, so this does not block; the event is acknowledged
        // at once (destroying the CQ waits for every event to be).
        unsafe {
            if rdma_sys::ibv_get_cq_event(self.channel, &mut cq, &mut cq_context) != 0 {
                return Err(Error::last("ibv_get_cq_event"));
            }
            rdma_sys::ibv_ack_cq_events(cq, 1);
        }
        Ok(true)
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
        // SAFETY: QPs using this CQ hold an Arc to it, so they are gone; the channel goes
        // after its only CQ.
        unsafe {
            rdma_sys::ibv_destroy_cq(self.raw);
            if !self.channel.is_null() {
                rdma_sys::ibv_destroy_comp_channel(self.channel);
            }
        }
    }
}

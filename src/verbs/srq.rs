//! Shared receive queues: one pool of receive buffers for many RC flows.
use super::error::{Error, Result};
use super::mr::Sge;
use super::pd::ProtectionDomain;
use std::sync::Arc;

pub struct SharedReceiveQueue {
    raw: *mut rdma_sys::ibv_srq,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs SRQs are thread-safe.
unsafe impl Send for SharedReceiveQueue {}
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32) -> Result<Arc<SharedReceiveQueue>> {
        let mut attr = rdma_sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: rdma_sys::ibv_srq_attr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: attr is fully initialized.
        let raw = unsafe { rdma_sys::ibv_create_srq(pd.as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last("ibv_create_srq"));
        }
        Ok(Arc::new(SharedReceiveQueue {
            raw,
            _pd: pd.clone(),
        }))
    }
    pub fn as_raw(&self) -> *mut rdma_sys::ibv_srq {
        self.raw
    }
    /// Posts one receive buffer identified by `wr_id`.
    pub fn post_recv(&self, wr_id: u64, local: Sge) -> Result<()> {
        // SAFETY: the SRQ is alive; the work request is valid for the call.
        super::mr::post_recv_with("ibv_post_srq_recv", wr_id, local, |wr, bad| unsafe {
            rdma_sys::ibv_post_srq_recv(self.raw, wr, bad)
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: QPs attached to it hold an Arc, so they are gone.
        unsafe { rdma_sys::ibv_destroy_srq(self.raw) };
    }
}

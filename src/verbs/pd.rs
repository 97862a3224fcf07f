//! Protection domains.
use super::context::Context;
use super::error::{Error, Result};
use std::sync::Arc;

pub struct ProtectionDomain {
    raw: *mut rdma_sys::ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for ProtectionDomain {}
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: ctx is an open context.
        let raw = unsafe { rdma_sys::ibv_alloc_pd(ctx.as_raw()) };
        if raw.is_null() {
            return Err(Error::last("ibv_alloc_pd"));
        }
        Ok(Arc::new(ProtectionDomain {
            raw,
            ctx: ctx.clone(),
        }))
    }
    pub fn as_raw(&self) -> *mut rdma_sys::ibv_pd {
        self.raw
    }
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: MRs, QPs and SRQs hold an Arc to their PD, so none is left.
        unsafe { rdma_sys::ibv_dealloc_pd(self.raw) };
    }
}

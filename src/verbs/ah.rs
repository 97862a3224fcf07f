//! Address handles: where a UD datagram goes (the peer's LID, GID and our port), made once per
//! destination and named by each SEND.
use super::endpoint::{ah_attr, Endpoint};
use super::error::{Error, Result};
use super::pd::ProtectionDomain;
use std::sync::Arc;

pub struct AddressHandle {
    raw: *mut rdma_sys::ibv_ah,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an address handle is read-only once made; libibverbs lets any thread use it.
unsafe impl Send for AddressHandle {}
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// The route to `remote` from `port`, from our GID at `gid_index` to the peer's GID (or
    /// to its LID when it has none), in `traffic_class`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        port: u8,
        (gid_index, traffic_class): (i32, u8),
        remote: &Endpoint,
    ) -> Result<AddressHandle> {
        let mut attr = ah_attr(port, gid_index, traffic_class, remote);
        // SAFETY: attr is fully initialized; the PD outlives the handle through the Arc.
        let raw = unsafe { rdma_sys::ibv_create_ah(pd.as_raw(), &mut attr) };
        if raw.is_null() {
            return Err(Error::last("ibv_create_ah"));
        }
        Ok(AddressHandle {
            raw,
            _pd: pd.clone(),
        })
    }

    pub fn as_raw(&self) -> *mut rdma_sys::ibv_ah {
        self.raw
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: the sends naming it have completed or been flushed with their QP.
        unsafe { rdma_sys::ibv_destroy_ah(self.raw) };
    }
}

//! Registered memory: a page-aligned, zeroed buffer and its registration.
use super::error::{Error, Result};
use super::pd::ProtectionDomain;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

/// A piece of registered memory to send from or receive into (an `ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Posts one receive of `local`, identified by `wr_id`, through `post` (ibv_post_recv on a
/// QP, ibv_post_srq_recv on an SRQ: same work request, different queue).
pub(crate) fn post_recv_with(
    call: &'static str,
    wr_id: u64,
    local: Sge,
    post: impl FnOnce(*mut rdma_sys::ibv_recv_wr, *mut *mut rdma_sys::ibv_recv_wr) -> i32,
) -> Result<()> {
    let mut sge = rdma_sys::ibv_sge {
        addr: local.addr,
        length: local.len,
        lkey: local.lkey,
    };
    let mut wr = rdma_sys::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = std::ptr::null_mut();
    // wr and sge live across the call; the provider copies them.
    let rc = post(&mut wr, &mut bad);
    if rc != 0 {
        return Err(Error::code(call, rc));
    }
    Ok(())
}

pub struct MemoryRegion {
    raw: *mut rdma_sys::ibv_mr,
    buf: *mut u8,
    layout: Layout,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is owned; concurrent access to its bytes is the caller's concern (the
// NIC writes into it asynchronously anyway).
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Allocates `len` bytes and registers them for local write and remote read/write.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<MemoryRegion> {
        Self::register(pd, len, false)
    }

    /// The same, and a target of remote atomics too (a device without atomics refuses the
    /// registration, so only a run that uses them asks for it).
    pub fn with_remote_atomics(pd: &Arc<ProtectionDomain>, len: usize) -> Result<MemoryRegion> {
        Self::register(pd, len, true)
    }

    fn register(pd: &Arc<ProtectionDomain>, len: usize, atomics: bool) -> Result<MemoryRegion> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| Error::other("ibv_reg_mr", format!("bad buffer size {len}")))?;
        // SAFETY: layout has a non-zero size.
        let buf = unsafe { alloc_zeroed(layout) };
        if buf.is_null() {
            return Err(Error::other(
                "ibv_reg_mr",
                format!("cannot allocate {len} bytes"),
            ));
        }
        let mut access = rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        if atomics {
            access |= rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        // SAFETY: buf is valid for layout.size() bytes for as long as the registration lives.
        let raw = unsafe {
            rdma_sys::ibv_reg_mr(pd.as_raw(), buf.cast(), layout.size(), access.0 as i32)
        };
        if raw.is_null() {
            let err = Error::last("ibv_reg_mr");
            unsafe { dealloc(buf, layout) };
            return Err(err);
        }
        Ok(MemoryRegion {
            raw,
            buf,
            layout,
            _pd: pd.clone(),
        })
    }
    pub fn addr(&self) -> u64 {
        self.buf as u64
    }
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    /// `len` bytes at `offset` of this region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset + len as usize <= self.len(),
            "sge outside the region"
        );
        Sge {
            addr: self.addr() + offset as u64,
            len,
            lkey: self.lkey(),
        }
    }
    pub fn lkey(&self) -> u32 {
        unsafe { (*self.raw).lkey }
    }
    pub fn rkey(&self) -> u32 {
        unsafe { (*self.raw).rkey }
    }
    /// Reads the byte at `offset` as the NIC may have written it (volatile: never cached).
    pub fn read_byte(&self, offset: usize) -> u8 {
        assert!(offset < self.len());
        // SAFETY: in bounds; volatile because the NIC writes behind the compiler's back.
        unsafe { std::ptr::read_volatile(self.buf.add(offset)) }
    }
    /// Reads the 8-byte word at `offset` (8-aligned) as the NIC may have written it: an
    /// atomic's target or result (host byte order, as the device keeps it).
    pub fn read_u64(&self, offset: usize) -> u64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.len());
        // SAFETY: in bounds and aligned (the buffer is page-aligned); volatile as read_byte.
        unsafe { std::ptr::read_volatile(self.buf.add(offset).cast::<u64>()) }
    }
    pub fn write_byte(&self, offset: usize, value: u8) {
        assert!(offset < self.len());
        // SAFETY: in bounds.
        unsafe { std::ptr::write_volatile(self.buf.add(offset), value) }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: deregister before freeing the memory it covers.
        unsafe {
            rdma_sys::ibv_dereg_mr(self.raw);
            dealloc(self.buf, self.layout);
        }
    }
}

//! Safe wrappers over libibverbs (through `rdma-sys`): one module per verbs object, each
//! owning its object and destroying it on drop. Objects hold an `Arc` of what they were made
//! from, so drop order is always right (QP before CQ before PD before context).
//!
//! Only what the traffic generator needs: RC and UD queue pairs, SEND, RDMA WRITE (with
//! immediate), RDMA READ and 8-byte atomics, address handles, CQ polling, SRQ, and rdma_cm
//! connection setup ([`cm`]).
//!
//! Below the objects, what several of them share: `error` (every call's [`Error`]),
//! `endpoint` (a QP's address, for QPs and address handles), `gid` and `event_fd`. The
//! objects import each other's modules directly, not the re-exports here, so that this file
//! depends on them and never the other way round.

mod ah;
pub mod cm;
mod context;
mod cq;
mod device;
mod endpoint;
mod error;
mod event_fd;
mod gid;
mod mr;
mod pd;
mod qp;
mod srq;

pub use ah::AddressHandle;
pub use context::{mtu_bytes, Context, DeviceLimits, PortInfo};
pub use cq::{CompletionQueue, WorkCompletion};
pub use device::{device_names, open_device};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use mr::{MemoryRegion, Sge};
pub use pd::ProtectionDomain;
pub use qp::{
    AtomicOp, AtomicTarget, QpConfig, QueuePair, RemoteBuffer, SendKind, SendWr, POST_LIST_MAX,
    UD_QKEY,
};
pub use srq::SharedReceiveQueue;

/// libibverbs' name for a completion status ("success", "transport retry counter exceeded", ...).
pub fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let s = unsafe { rdma_sys::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_string_lossy()
        .into_owned()
}

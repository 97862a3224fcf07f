//! Safe wrappers over libibverbs (through `rdma-sys`): one module per verbs object, each
//! owning its object and destroying it on drop. Objects hold an `Arc` of what they were made
//! from, so drop order is always right (QP before CQ before PD before context).
//!
//! Only what the traffic generator needs: RC and UD queue pairs, SEND, RDMA WRITE (with
//! immediate), RDMA READ and 8-byte atomics, address handles, CQ polling, SRQ, and rdma_cm
//! connection setup ([`cm`]).

mod ah;
pub mod cm;
mod context;
mod cq;
mod device;
mod mr;
mod pd;
mod qp;
mod srq;

pub use ah::AddressHandle;
pub use context::{mtu_bytes, Context, DeviceLimits, PortInfo};
pub use cq::{CompletionQueue, WorkCompletion};
pub use device::{device_names, open_device};
pub use mr::{MemoryRegion, Sge};
pub use pd::ProtectionDomain;
pub use qp::{
    AtomicOp, AtomicTarget, Endpoint, QpConfig, QueuePair, RemoteBuffer, SendKind, SendWr,
    POST_LIST_MAX, UD_QKEY,
};
pub use srq::SharedReceiveQueue;

use std::fmt;

/// A failed verbs call: which call, and the errno it left.
#[derive(Debug)]
pub struct Error {
    pub call: &'static str,
    pub errno: i32,
    pub detail: String,
}

impl Error {
    pub(crate) fn last(call: &'static str) -> Error {
        Error {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            detail: String::new(),
        }
    }
    /// For calls that return an errno value instead of setting errno.
    pub(crate) fn code(call: &'static str, rc: i32) -> Error {
        Error {
            call,
            errno: rc.abs(),
            detail: String::new(),
        }
    }
    /// `call` was not made: a stop was asked for (Ctrl-C).
    pub fn interrupted(call: &'static str) -> Error {
        Error::other(call, "not called: interrupted")
    }
    pub(crate) fn other(call: &'static str, detail: impl Into<String>) -> Error {
        Error {
            call,
            errno: 0,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        if self.errno != 0 {
            write!(f, ": {}", std::io::Error::from_raw_os_error(self.errno))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Waits until `fd` (an event channel's descriptor) is readable, at most `timeout`; false on
/// timeout or when a signal interrupted the wait (so callers can look for Ctrl-C).
pub(crate) fn readable(fd: i32, timeout: std::time::Duration, call: &'static str) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut pfd, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let err = Error::last(call);
            if err.errno == libc::EINTR {
                Ok(false)
            } else {
                Err(err)
            }
        }
    }
}

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

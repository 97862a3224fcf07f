//! Waiting on the descriptor of an event channel (rdma_cm's, a completion channel's), shared
//! by [`super::cm`] and [`super::cq`].
use super::error::{Error, Result};

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

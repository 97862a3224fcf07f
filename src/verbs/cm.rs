//! rdma_cm (librdmacm): address and route resolution, connect/listen/accept with private data,
//! and the event channel that reports each step. QPs on a [`CmId`] must live on librdmacm's
//! own device context (`rdma_create_qp` checks), so code that connects through rdma_cm opens
//! its device with [`open_device`] here instead of `verbs::open_device`.
use super::context::Context;
use super::error::{Error, Result};
pub use super::gid::gid_ipv4;
use rdma_sys::rdma_cm_event_type as Ev;
use std::ffi::CStr;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Opens the device called `name` (or the first one) among librdmacm's contexts.
pub fn open_device(name: Option<&str>) -> Result<Arc<Context>> {
    let mut n = 0;
    // SAFETY: the list is NULL-terminated with `n` entries; it is freed when the context drops
    // (or here when nothing matches).
    unsafe {
        let list = rdma_sys::rdma_get_devices(&mut n);
        if list.is_null() {
            return Err(Error::last("rdma_get_devices"));
        }
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            let ctx = *list.add(i);
            let dev_name = CStr::from_ptr(rdma_sys::ibv_get_device_name((*ctx).device))
                .to_string_lossy()
                .into_owned();
            if name.is_none_or(|want| want == dev_name) {
                return Ok(Arc::new(Context::from_rdmacm(ctx, dev_name, list)));
            }
            names.push(dev_name);
        }
        rdma_sys::rdma_free_devices(list);
        Err(Error::other(
            "rdma_get_devices",
            if names.is_empty() {
                "no RDMA devices found (is the rdma_ucm module loaded?)".to_string()
            } else {
                format!(
                    "no device named {} (have: {})",
                    name.unwrap_or(""),
                    names.join(", ")
                )
            },
        ))
    }
}

/// Where rdma_cm reports resolutions, connection requests and connection state changes.
pub struct EventChannel {
    raw: *mut rdma_sys::rdma_event_channel,
}

// SAFETY: librdmacm event channels may be used from any thread.
unsafe impl Send for EventChannel {}
unsafe impl Sync for EventChannel {}

/// One event, copied out and acknowledged (so an id can be destroyed at any time after).
pub struct Event {
    pub kind: u32,
    /// Errno-style status, or the IB CM reject reason for `REJECTED`.
    pub status: i32,
    /// The `context` the id was created with (client ids: the flow index).
    pub context: usize,
    pub private_data: Vec<u8>,
    /// A connection request's new id, owned by whoever takes it.
    pub new_id: Option<CmId>,
}

impl Event {
    pub fn name(&self) -> String {
        event_name(self.kind)
    }
    pub fn is(&self, kind: u32) -> bool {
        self.kind == kind
    }
}

pub use rdma_sys::rdma_cm_event_type::{
    RDMA_CM_EVENT_ADDR_RESOLVED as ADDR_RESOLVED, RDMA_CM_EVENT_CONNECT_REQUEST as CONNECT_REQUEST,
    RDMA_CM_EVENT_ESTABLISHED as ESTABLISHED, RDMA_CM_EVENT_REJECTED as REJECTED,
    RDMA_CM_EVENT_ROUTE_RESOLVED as ROUTE_RESOLVED,
};

pub fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    let s = unsafe { rdma_sys::rdma_event_str(kind) };
    if s.is_null() {
        return format!("event {kind}");
    }
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl EventChannel {
    pub fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: plain constructor.
        let raw = unsafe { rdma_sys::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(Error::last("rdma_create_event_channel"));
        }
        let channel = EventChannel { raw };
        // Non-blocking: librdmacm may swallow an event and read again, which would otherwise
        // block past our timeout (a listener could then never see its stop flag).
        // SAFETY: fd is the channel's own descriptor.
        unsafe {
            let fd = (*raw).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(Error::last("fcntl(rdma_cm event channel, O_NONBLOCK)"));
            }
        }
        Ok(Arc::new(channel))
    }

    /// The next event, waiting at most `timeout`; `None` when nothing came (or a signal
    /// interrupted the wait, so callers can check for Ctrl-C).
    pub fn next(self: &Arc<Self>, timeout: Duration) -> Result<Option<Event>> {
        // SAFETY: raw is a live channel.
        let fd = unsafe { (*self.raw).fd };
        if !super::event_fd::readable(fd, timeout, "poll(rdma_cm event channel)")? {
            return Ok(None);
        }
        let mut ev = std::ptr::null_mut();
        // SAFETY: the channel is non-blocking; an event read is copied and acknowledged below.
        if unsafe { rdma_sys::rdma_get_cm_event(self.raw, &mut ev) } != 0 {
            let err = Error::last("rdma_get_cm_event");
            return if err.errno == libc::EAGAIN {
                Ok(None)
            } else {
                Err(err)
            };
        }
        // SAFETY: ev is valid until acknowledged; the connection parameters are the union
        // member for every connected-mode event.
        let event = unsafe {
            let e = &*ev;
            let conn = &e.param.conn;
            let private_data = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data as *const u8,
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            let new_id = (e.event == Ev::RDMA_CM_EVENT_CONNECT_REQUEST).then(|| CmId {
                raw: e.id,
                _channel: self.clone(),
            });
            Event {
                kind: e.event,
                status: e.status,
                context: (*e.id).context as usize,
                private_data,
                new_id,
            }
        };
        // SAFETY: ev came from rdma_get_cm_event and is acknowledged once.
        unsafe { rdma_sys::rdma_ack_cm_event(ev) };
        Ok(Some(event))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id holds an Arc to its channel, so none is left.
        unsafe { rdma_sys::rdma_destroy_event_channel(self.raw) };
    }
}

/// An rdma_cm identifier (the CM's analogue of a socket), in the TCP port space.
pub struct CmId {
    raw: *mut rdma_sys::rdma_cm_id,
    _channel: Arc<EventChannel>,
}

// SAFETY: librdmacm ids may be used from any thread; each is used by one at a time here.
unsafe impl Send for CmId {}
unsafe impl Sync for CmId {}

/// What a connection asks of the QPs on both ends.
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    /// Local ACK timeout exponent (4.096 µs × 2^n); rdma_cm would otherwise derive it from
    /// the path's packet lifetime.
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    /// The accepting QP receives through an SRQ.
    pub srq: bool,
    /// RDMA READs/atomics outstanding as initiator, and accepted as target (the device's
    /// limits: rdma_cm settles each side's on the lower of the two).
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

impl CmId {
    /// A new id reporting on `channel`; `context` comes back in every event for it.
    pub fn new(channel: &Arc<EventChannel>, context: usize) -> Result<CmId> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw is an out-parameter; context is an opaque integer to librdmacm.
        let rc = unsafe {
            rdma_sys::rdma_create_id(
                channel.raw,
                &mut raw,
                context as *mut libc::c_void,
                rdma_sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::last("rdma_create_id"));
        }
        Ok(CmId {
            raw,
            _channel: channel.clone(),
        })
    }

    pub fn as_raw(&self) -> *mut rdma_sys::rdma_cm_id {
        self.raw
    }

    /// Moves the id's events to `channel` (waiting until those read on the old one are
    /// acknowledged), so that only the new channel's owner ever touches the id: librdmacm
    /// itself changes an id's QP while it reads some events.
    pub fn migrate(self, channel: &Arc<EventChannel>) -> Result<CmId> {
        // SAFETY: both are live; the id now reports to `channel`, whose Arc it holds.
        let rc = unsafe { rdma_sys::rdma_migrate_id(self.raw, channel.raw) };
        check(rc, "rdma_migrate_id")?;
        // The id lives on under the new channel: not destroyed here, only the old channel's
        // reference is let go.
        let old = std::mem::ManuallyDrop::new(self);
        // SAFETY: the Arc is read out exactly once and `old` is never dropped.
        drop(unsafe { std::ptr::read(&old._channel) });
        Ok(CmId {
            raw: old.raw,
            _channel: channel.clone(),
        })
    }

    /// The device context the id is bound to (null until an address is bound or resolved).
    pub fn verbs(&self) -> *mut rdma_sys::ibv_context {
        // SAFETY: raw is a live id.
        unsafe { (*self.raw).verbs }
    }

    /// Starts resolving `dst` (from `src` when given: with several local devices, the source
    /// address picks the device). Completes with ADDR_RESOLVED or ADDR_ERROR.
    pub fn resolve_addr(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut dst = sockaddr(dst);
        let mut src = src.map(|ip| sockaddr(SocketAddr::new(ip, 0)));
        let src_ptr = src
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s as *mut _ as *mut libc::sockaddr);
        // SAFETY: both addresses live across the call (librdmacm copies them).
        let rc = unsafe {
            rdma_sys::rdma_resolve_addr(
                self.raw,
                src_ptr,
                &mut dst as *mut _ as *mut libc::sockaddr,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        check(rc, "rdma_resolve_addr")
    }

    /// Starts resolving the route; completes with ROUTE_RESOLVED or ROUTE_ERROR.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: raw is a live id with a resolved address.
        let rc = unsafe {
            rdma_sys::rdma_resolve_route(self.raw, timeout.as_millis().min(i32::MAX as u128) as i32)
        };
        check(rc, "rdma_resolve_route")
    }

    /// Binds to `addr` and listens; connection requests arrive as CONNECT_REQUEST events.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> Result<()> {
        let mut a = sockaddr(addr);
        // SAFETY: a lives across the call.
        let rc = unsafe { rdma_sys::rdma_bind_addr(self.raw, &mut a as *mut _ as *mut _) };
        check(rc, "rdma_bind_addr")?;
        // SAFETY: raw is bound.
        check(
            unsafe { rdma_sys::rdma_listen(self.raw, backlog) },
            "rdma_listen",
        )
    }

    /// The QP's local ACK timeout exponent, applied when the QP moves to RTS.
    fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        const RDMA_OPTION_ID: i32 = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
        let mut value = exponent;
        // SAFETY: the option is a u8 passed by pointer with its length.
        let rc = unsafe {
            rdma_sys::rdma_set_option(
                self.raw,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                &mut value as *mut u8 as *mut libc::c_void,
                1,
            )
        };
        check(rc, "rdma_set_option(ACK_TIMEOUT)")
    }

    /// Sends the connection request carrying `private_data`; completes with ESTABLISHED
    /// (the QP is then in RTS), or REJECTED / UNREACHABLE / CONNECT_ERROR.
    pub fn connect(&self, private_data: &[u8], p: ConnParams) -> Result<()> {
        self.set_ack_timeout(p.ack_timeout)?;
        let mut param = conn_param(private_data, p);
        // SAFETY: param and the private data live across the call (librdmacm copies them).
        check(
            unsafe { rdma_sys::rdma_connect(self.raw, &mut param) },
            "rdma_connect",
        )
    }

    /// Accepts a connection request (this id came with the request); its QP goes to RTS.
    pub fn accept(&self, p: ConnParams) -> Result<()> {
        self.set_ack_timeout(p.ack_timeout)?;
        let mut param = conn_param(&[], p);
        // SAFETY: param lives across the call.
        check(
            unsafe { rdma_sys::rdma_accept(self.raw, &mut param) },
            "rdma_accept",
        )
    }

    /// Refuses a connection request; `reason` travels back to the requester (truncated to the
    /// 148 bytes a reject can carry).
    pub fn reject(&self, reason: &str) -> Result<()> {
        let bytes = &reason.as_bytes()[..reason.len().min(148)];
        // SAFETY: bytes live across the call.
        let rc = unsafe {
            rdma_sys::rdma_reject(self.raw, bytes.as_ptr() as *const _, bytes.len() as u8)
        };
        check(rc, "rdma_reject")
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: a QP made on this id is destroyed first (QueuePair owns its id); events are
        // acknowledged as they are read, so this does not wait.
        unsafe { rdma_sys::rdma_destroy_id(self.raw) };
    }
}

fn check(rc: i32, call: &'static str) -> Result<()> {
    if rc != 0 {
        return Err(Error::last(call));
    }
    Ok(())
}

fn conn_param(private_data: &[u8], p: ConnParams) -> rdma_sys::rdma_conn_param {
    rdma_sys::rdma_conn_param {
        private_data: if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr() as *const _
        },
        private_data_len: private_data.len().min(255) as u8,
        responder_resources: p.responder_resources.max(1),
        initiator_depth: p.initiator_depth.max(1),
        flow_control: 1,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry.min(7),
        srq: u8::from(p.srq),
        qp_num: 0,
    }
}

/// A socket address in the C layout librdmacm takes.
fn sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage; the family's struct is written over it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
        }
    }
    storage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_are_laid_out_for_c() {
        let s = sockaddr("10.0.0.2:18515".parse().unwrap());
        let sin = unsafe { &*(&s as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 18515);
        assert_eq!(u32::from_be(sin.sin_addr.s_addr), 0x0a00_0002);
        let s = sockaddr("[fe80::1]:7".parse().unwrap());
        let sin6 = unsafe { &*(&s as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(sin6.sin6_addr.s6_addr[0], 0xfe);
        assert_eq!(u16::from_be(sin6.sin6_port), 7);
    }
}

//! `--cm`: flows connected by rdma_cm instead of the TCP exchange of QP numbers, PSNs and
//! GIDs. The TCP control channel stays (run request, buffers, start barrier, final counts);
//! rdma_cm resolves the address and route of every flow and runs the CM handshake that moves
//! both QPs to RTS. Each connection request carries the session's token and the flow's index
//! in its private data, so the server knows which session and flow a request belongs to.
//!
//! Client: [`resolve_flows`] (an id per flow, address and route resolved), QPs made on those
//! ids, then [`connect_flows`] once the server has accepted the run.
//! Server: one [`Listener`] per `serve --cm`; its thread hands each request to the session
//! that registered the token ([`Listener::register`]).
use crate::verbs::cm::{self, CmId, ConnParams, Event, EventChannel};
use crate::verbs::Context;
use crossbeam::channel::{self, Receiver, Sender};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Marks our private data (a connection request from something else is refused).
const MAGIC: [u8; 4] = *b"IBJ1";
/// Wait per poll of an event channel, so Ctrl-C and deadlines are noticed.
const POLL: Duration = Duration::from_millis(100);

/// A flow's connection request payload: magic, flow index, session token (16 bytes; a
/// RoCE/IB connection request carries up to 56).
pub fn encode_private(token: u64, flow: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&MAGIC);
    b[4..8].copy_from_slice(&flow.to_be_bytes());
    b[8..].copy_from_slice(&token.to_be_bytes());
    b
}

/// (token, flow) from a connection request's private data; None if it is not ours. The CM
/// may pad private data with zeros, so longer is fine.
pub fn decode_private(data: &[u8]) -> Option<(u64, u32)> {
    if data.len() < 16 || data[..4] != MAGIC {
        return None;
    }
    let flow = u32::from_be_bytes(data[4..8].try_into().ok()?);
    let token = u64::from_be_bytes(data[8..16].try_into().ok()?);
    Some((token, flow))
}

/// Waits for one event on `channel` until `deadline`; `what` names the wait in errors.
fn next_event(
    channel: &Arc<EventChannel>,
    deadline: Instant,
    what: &str,
    interrupted: &dyn Fn() -> bool,
) -> Result<Event, String> {
    loop {
        if interrupted() {
            return Err(format!("interrupted while {what}"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("rdma_cm: timed out {what}"));
        }
        if let Some(ev) = channel.next(left.min(POLL)).map_err(|e| e.to_string())? {
            return Ok(ev);
        }
    }
}

/// Describes a failed CM step for flow `flow`.
fn failure(flow: usize, ev: &Event) -> String {
    let mut s = format!("flow {flow}: rdma_cm {}", ev.name());
    if ev.is(cm::REJECTED) {
        let reason: String = String::from_utf8_lossy(&ev.private_data)
            .trim_end_matches('\0')
            .to_string();
        if reason.is_empty() {
            s += &format!(" (reject reason {})", ev.status);
        } else {
            s += &format!(" by the server: {reason}");
        }
    } else if ev.status != 0 {
        s += &format!(": {}", std::io::Error::from_raw_os_error(ev.status.abs()));
    }
    s
}

/// Makes an id per flow and resolves `server`'s address and route for each, from `source`
/// (the device's own address, so that with several local devices the right one is used).
/// Every id must land on `ctx`, the device the QPs will be made on.
pub fn resolve_flows(
    ctx: &Context,
    source: Option<IpAddr>,
    server: SocketAddr,
    flows: u32,
    timeout: Duration,
    interrupted: &dyn Fn() -> bool,
) -> Result<(Arc<EventChannel>, Vec<CmId>), String> {
    let channel = EventChannel::new().map_err(|e| e.to_string())?;
    let step = timeout.min(Duration::from_secs(5));
    let mut ids = Vec::with_capacity(flows as usize);
    for i in 0..flows as usize {
        let id = CmId::new(&channel, i).map_err(|e| e.to_string())?;
        id.resolve_addr(source, server, step)
            .map_err(|e| format!("flow {i}: {e}"))?;
        ids.push(id);
    }
    let deadline = Instant::now() + timeout;
    let mut routed = 0;
    while routed < ids.len() {
        let what = format!(
            "resolving {server} for {} of {} flows",
            ids.len() - routed,
            ids.len()
        );
        let ev = next_event(&channel, deadline, &what, interrupted)?;
        let Some(id) = ids.get(ev.context) else {
            continue;
        };
        match ev.kind {
            cm::ADDR_RESOLVED => id
                .resolve_route(step)
                .map_err(|e| format!("flow {}: {e}", ev.context))?,
            cm::ROUTE_RESOLVED => {
                if id.verbs() != ctx.as_raw() {
                    return Err(format!(
                        "rdma_cm routes {server} through another device than {}: choose the device with --dev, or a server address reached through it",
                        ctx.name()
                    ));
                }
                routed += 1;
            }
            _ => {
                return Err(format!(
                    "{}; with --cm the server's address must be its address on the RDMA network, reachable from {}{}",
                    failure(ev.context, &ev),
                    ctx.name(),
                    source.map_or(String::new(), |ip| format!(" ({ip})"))
                ))
            }
        }
    }
    Ok((channel, ids))
}

/// Connects every flow (`(flow index, its id with a QP)`), carrying the session token, and
/// waits until all are established.
pub fn connect_flows<'a>(
    channel: &Arc<EventChannel>,
    flows: impl Iterator<Item = (u32, &'a CmId)>,
    token: u64,
    params: ConnParams,
    timeout: Duration,
    interrupted: &dyn Fn() -> bool,
) -> Result<(), String> {
    let mut pending = 0usize;
    for (flow, id) in flows {
        id.connect(&encode_private(token, flow), params)
            .map_err(|e| format!("flow {flow}: {e}"))?;
        pending += 1;
    }
    let total = pending;
    let deadline = Instant::now() + timeout;
    while pending > 0 {
        let what = format!("connecting {pending} of {total} flows");
        let ev = next_event(channel, deadline, &what, interrupted)?;
        match ev.kind {
            cm::ESTABLISHED => pending -= 1,
            _ => return Err(failure(ev.context, &ev)),
        }
    }
    Ok(())
}

/// A connection request for a registered session.
pub struct Incoming {
    pub flow: u32,
    pub id: CmId,
}

type Registry = Mutex<HashMap<u64, Sender<Incoming>>>;

/// `serve --cm`: the listening id and the thread that routes requests to sessions.
pub struct Listener {
    sessions: Arc<Registry>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub addr: SocketAddr,
}

/// Unregisters a session's token when the session ends.
pub struct Registration {
    sessions: Arc<Registry>,
    token: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.sessions.lock().unwrap().remove(&self.token);
    }
}

impl Listener {
    /// Listens on `addr` (rdma_cm's TCP port space, apart from kernel TCP ports).
    pub fn start(ctx: &Context, addr: SocketAddr) -> Result<Listener, String> {
        let channel = EventChannel::new().map_err(|e| e.to_string())?;
        let id = CmId::new(&channel, 0).map_err(|e| e.to_string())?;
        id.listen(addr, 1024)
            .map_err(|e| format!("rdma_cm cannot listen on {addr}: {e}"))?;
        if !id.verbs().is_null() && id.verbs() != ctx.as_raw() {
            return Err(format!(
                "rdma_cm listener on {addr} is bound to another device than {}",
                ctx.name()
            ));
        }
        let sessions: Arc<Registry> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (sessions, stop) = (sessions.clone(), stop.clone());
            let device = ctx.as_raw() as usize;
            std::thread::Builder::new()
                .name("rdma_cm listener".into())
                .spawn(move || dispatch(id, channel, &sessions, &stop, device))
                .map_err(|e| e.to_string())?
        };
        Ok(Listener {
            sessions,
            stop,
            thread: Some(thread),
            addr,
        })
    }

    /// Routes requests carrying `token` to the returned receiver until the registration drops.
    pub fn register(&self, token: u64) -> (Receiver<Incoming>, Registration) {
        let (tx, rx) = channel::unbounded();
        self.sessions.lock().unwrap().insert(token, tx);
        (
            rx,
            Registration {
                sessions: self.sessions.clone(),
                token,
            },
        )
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener thread: every connection request goes to its session or is refused with a
/// reason; other events (established, disconnected) need nothing from us.
fn dispatch(
    listen_id: CmId,
    channel: Arc<EventChannel>,
    sessions: &Registry,
    stop: &AtomicBool,
    device: usize,
) {
    while !stop.load(Ordering::Relaxed) {
        let ev = match channel.next(POLL) {
            Ok(Some(ev)) => ev,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("ibjitter serve: rdma_cm listener: {e}");
                std::thread::sleep(POLL);
                continue;
            }
        };
        let Some(id) = ev.new_id else {
            continue;
        };
        let refuse = |reason: &str| {
            if let Err(e) = id.reject(reason) {
                eprintln!("ibjitter serve: rdma_cm reject: {e}");
            }
        };
        if id.verbs() as usize != device {
            refuse("request arrived on another device than the server's");
            continue;
        }
        let Some((token, flow)) = decode_private(&ev.private_data) else {
            refuse("not an ibjitter connection request");
            continue;
        };
        let tx = sessions.lock().unwrap().get(&token).cloned();
        match tx {
            Some(tx) => {
                if let Err(channel::SendError(incoming)) = tx.send(Incoming { flow, id }) {
                    let _ = incoming.id.reject("session ended");
                }
            }
            None => refuse("unknown or finished session"),
        }
    }
    drop(listen_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_round_trips_and_rejects_strangers() {
        let b = encode_private(0x0123_4567_89ab_cdef, 999);
        assert_eq!(decode_private(&b), Some((0x0123_4567_89ab_cdef, 999)));
        let mut padded = b.to_vec();
        padded.extend_from_slice(&[0; 40]);
        assert_eq!(decode_private(&padded), Some((0x0123_4567_89ab_cdef, 999)));
        assert_eq!(decode_private(&b[..15]), None);
        let mut other = b;
        other[0] = b'X';
        assert_eq!(decode_private(&other), None);
    }
}

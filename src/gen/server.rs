//! `ibjitter serve`: accepts clients, gives each client's flows a QP and a buffer, holds every
//! client of a group at the start barrier until all are ready, then absorbs or echoes traffic.
use super::cm::{Incoming, Listener};
use super::responder::{self, EchoFlow, Received, RecvPool};
use super::shard::{initial_psn, slot_size};
use super::wire::{self, FlowEndpoint, Message, Op, RunRequest, PROTOCOL_VERSION};
use crate::verbs::cm::{self as verbs_cm, ConnParams, EventChannel};
use crate::verbs::{
    self, CompletionQueue, Context, Endpoint, MemoryRegion, ProtectionDomain, QpConfig, QueuePair,
    RemoteBuffer, SharedReceiveQueue,
};
use crossbeam::channel::Receiver;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub device: Option<String>,
    pub ib_port: u8,
    pub gid_index: Option<i32>,
    /// Also accept flows connected through rdma_cm (`run --cm`), on the same port number in
    /// rdma_cm's own port space.
    pub cm: bool,
    pub bind: String,
    pub port: u16,
    /// Clients that start together (the start barrier's size).
    pub clients: u32,
    /// Exit after one group of clients has finished.
    pub once: bool,
    pub qp_timeout: u8,
    pub setup_timeout: Duration,
    pub start_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            device: None,
            ib_port: 1,
            gid_index: None,
            cm: false,
            bind: "0.0.0.0".into(),
            port: 18515,
            clients: 1,
            once: false,
            qp_timeout: 18,
            setup_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(120),
        }
    }
}

/// What is shared by every session: the device and the start barrier.
struct Shared {
    cfg: ServeConfig,
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    lid: u16,
    gid: [u8; 16],
    gid_index: i32,
    mtu: u32,
    max_srq_wr: u32,
    barrier: StartBarrier,
    /// The rdma_cm listener, with `cm`.
    cm: Option<Listener>,
}

/// Releases a group of `size` sessions together.
struct StartBarrier {
    size: u32,
    state: Mutex<(u64, u32)>, // (generation, waiting)
    cv: Condvar,
}

impl StartBarrier {
    /// Waits until `size` sessions are ready, or `timeout`: then the sessions that are ready
    /// start without the missing ones (a sender that died must not hold up the others).
    fn wait(&self, timeout: Duration) {
        let mut s = self.state.lock().unwrap();
        let generation = s.0;
        s.1 += 1;
        if s.1 == self.size {
            *s = (generation + 1, 0);
            self.cv.notify_all();
            return;
        }
        let deadline = Instant::now() + timeout;
        while s.0 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!(
                    "ibjitter serve: start: only {} of {} clients ready after {timeout:?}; starting without the others",
                    s.1, self.size
                );
                *s = (generation + 1, 0);
                self.cv.notify_all();
                return;
            }
            s = self.cv.wait_timeout(s, left).unwrap().0;
        }
    }
}

/// Why `serve` ended badly.
#[derive(Debug)]
pub enum ServeError {
    /// The device or the port could not be used.
    Setup(String),
    /// With `once`: this many sessions failed (each already reported on stderr).
    Sessions(usize),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Setup(e) => f.write_str(e),
            ServeError::Sessions(n) => write!(f, "{n} session(s) failed"),
        }
    }
}

/// Opens the device, listens, and serves until stopped (or after one group with `once`).
pub fn serve(cfg: ServeConfig) -> Result<(), ServeError> {
    let setup = ServeError::Setup;
    // rdma_cm QPs must live on librdmacm's context of the device, so with --cm every QP does.
    let ctx = if cfg.cm {
        verbs_cm::open_device(cfg.device.as_deref())
    } else {
        verbs::open_device(cfg.device.as_deref())
    }
    .map_err(|e| setup(e.to_string()))?;
    let port = ctx.port(cfg.ib_port).map_err(|e| setup(e.to_string()))?;
    if !port.active {
        return Err(setup(format!(
            "{} port {} is not active",
            ctx.name(),
            cfg.ib_port
        )));
    }
    let gid_index = match cfg.gid_index {
        Some(i) => i,
        None => ctx
            .default_gid_index(cfg.ib_port)
            .map_err(|e| setup(e.to_string()))?,
    };
    let gid = ctx
        .gid(cfg.ib_port, gid_index)
        .map_err(|e| setup(e.to_string()))?;
    let limits = ctx.limits().map_err(|e| setup(e.to_string()))?;
    let pd = ProtectionDomain::new(&ctx).map_err(|e| setup(e.to_string()))?;
    let listener = TcpListener::bind((cfg.bind.as_str(), cfg.port))
        .map_err(|e| setup(format!("cannot listen on {}:{}: {e}", cfg.bind, cfg.port)))?;
    let cm = if cfg.cm {
        let addr = cm_address(&cfg, &gid).map_err(setup)?;
        Some(Listener::start(&ctx, addr).map_err(setup)?)
    } else {
        None
    };
    eprintln!(
        "ibjitter serve: listening on {}:{}{}, device {} port {} GID index {gid_index}, {} client(s) per start",
        cfg.bind,
        cfg.port,
        cm.as_ref()
            .map_or(String::new(), |l| format!(" and rdma_cm {}", l.addr)),
        ctx.name(),
        cfg.ib_port,
        cfg.clients
    );
    let shared = Arc::new(Shared {
        barrier: StartBarrier {
            size: cfg.clients.max(1),
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        },
        cfg,
        ctx,
        pd,
        lid: port.lid,
        gid,
        gid_index,
        mtu: port.active_mtu,
        max_srq_wr: limits.max_srq_wr.max(1) as u32,
        cm,
    });
    let mut sessions = Vec::new();
    let mut failures = 0;
    for (n, stream) in listener.incoming().enumerate() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ibjitter serve: accept failed: {e}");
                continue;
            }
        };
        let sh = shared.clone();
        let id = n + 1;
        sessions.push(std::thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            match session(stream, &sh, id) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("ibjitter serve: session {id} ({peer}): {e}");
                    false
                }
            }
        }));
        if shared.cfg.once && sessions.len() as u32 >= shared.cfg.clients {
            break;
        }
    }
    for s in sessions {
        if !s.join().unwrap_or(false) {
            failures += 1;
        }
    }
    if failures > 0 {
        return Err(ServeError::Sessions(failures));
    }
    Ok(())
}

/// Where the rdma_cm listener binds: `--bind` if it names an address, else the device's own
/// IPv4 address (from its GID), so requests are taken on this device only.
fn cm_address(cfg: &ServeConfig, gid: &[u8; 16]) -> Result<SocketAddr, String> {
    let bind: IpAddr = cfg
        .bind
        .parse()
        .map_err(|_| format!("--cm needs --bind to be an IP address, not {:?}", cfg.bind))?;
    let ip = match verbs_cm::gid_ipv4(gid) {
        Some(v4) if bind.is_unspecified() => IpAddr::V4(v4),
        _ => bind,
    };
    Ok(SocketAddr::new(ip, cfg.port))
}

/// How often a set-up wait looks at the client's control connection.
const CLIENT_CHECK: Duration = Duration::from_millis(200);

/// The client closed its control connection (it gave up or died).
fn closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let gone = matches!(stream.peek(&mut [0u8; 1]), Ok(0));
    let _ = stream.set_nonblocking(false);
    gone
}

/// A session token nobody can guess by accident: a connection request must name its session.
fn session_token(id: usize) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(id);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn session(mut stream: TcpStream, sh: &Shared, id: usize) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let cfg = &sh.cfg;
    let run = match wire::recv(&mut stream, Some(cfg.setup_timeout), "Hello")
        .map_err(|e| e.to_string())?
    {
        Message::Hello { version, run } if version == PROTOCOL_VERSION => run,
        Message::Hello { version, .. } => {
            let reason = format!("protocol version {version}, this server speaks {PROTOCOL_VERSION}: use the same ibjitter on both sides");
            let _ = wire::send(
                &mut stream,
                &Message::Reject {
                    reason: reason.clone(),
                },
            );
            return Err(reason);
        }
        other => return Err(format!("expected Hello, got {other:?}")),
    };
    let check = wire::validate(&run).and_then(|()| {
        if run.cm && sh.cm.is_none() {
            Err("this server does not take rdma_cm connections: start it with `ibjitter serve --cm`".into())
        } else {
            Ok(())
        }
    });
    if let Err(reason) = check {
        let _ = wire::send(
            &mut stream,
            &Message::Reject {
                reason: reason.clone(),
            },
        );
        return Err(reason);
    }
    let mut res = match Resources::new(sh, &run) {
        Ok(r) => r,
        Err(e) => {
            let reason = format!("server could not set up {} flows: {e}", run.flows.len());
            let _ = wire::send(
                &mut stream,
                &Message::Reject {
                    reason: reason.clone(),
                },
            );
            return Err(reason);
        }
    };
    // --cm: the client connects each flow through rdma_cm with this session's token; the
    // listener hands us the requests and we make and accept a QP for each.
    let cm = match &sh.cm {
        Some(listener) if run.cm => {
            let token = session_token(id);
            Some((token, listener.register(token)))
        }
        _ => None,
    };
    wire::send(
        &mut stream,
        &Message::Accept {
            flows: res.endpoints(sh),
            cm_token: cm.as_ref().map(|(token, _)| *token),
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some((_, (requests, registration))) = cm {
        res.accept_cm(sh, &requests, run.flows.len(), &stream)?;
        // Set up: a later request with this token is refused at once, not queued unread.
        drop(registration);
    }
    match wire::recv(&mut stream, Some(cfg.setup_timeout), "Ready").map_err(|e| e.to_string())? {
        Message::Ready => {}
        other => return Err(format!("expected Ready, got {other:?}")),
    }
    sh.barrier.wait(cfg.start_timeout);
    wire::send(&mut stream, &Message::Go).map_err(|e| e.to_string())?;

    let stop = AtomicBool::new(false);
    let (received, done) = std::thread::scope(|scope| {
        let data = scope.spawn(|| res.data_path(&run, &stop));
        let done = wire::recv(&mut stream, None, "Done");
        stop.store(true, Ordering::Relaxed);
        (data.join().unwrap_or_default(), done)
    });
    let summary = format!(
        "session {id} ({}): {} {} flows x {} B{}: received {} messages, {} bytes, {} errors",
        run.client,
        run.op.name(),
        run.flows.len(),
        run.size,
        if run.pingpong { " ping-pong" } else { "" },
        received.messages,
        received.bytes,
        received.errors
    );
    match done {
        Ok(Message::Done { .. }) => {
            let _ = wire::send(
                &mut stream,
                &Message::Bye {
                    received_messages: received.messages,
                    received_bytes: received.bytes,
                },
            );
            println!("{summary}");
            Ok(())
        }
        Ok(other) => Err(format!("expected Done, got {other:?}; {summary}")),
        Err(e) => Err(format!("client lost: {e}; {summary}")),
    }
}

/// One session's verbs objects: a CQ, optionally an SRQ with its receive pool, one buffer
/// (a slot per flow, then the pool), and a QP per flow connected to the client's.
struct Resources {
    cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    mr: MemoryRegion,
    qps: Vec<QueuePair>,
    psns: Vec<u32>,
    clients: Vec<FlowEndpoint>,
    slot: usize,
    pool: usize,
    qp_cfg: QpConfig,
    /// With rdma_cm: where this session's ids report (after the QPs: dropped last).
    cm_channel: Option<Arc<EventChannel>>,
}

/// The SEND receive pool: enough for every flow's depth, within the device limit and 256 MiB.
fn pool_size(run: &RunRequest, slot: usize, max_srq_wr: u32) -> usize {
    let want = run.flows.len() * run.depth as usize + 16;
    want.min(max_srq_wr as usize).min((256 << 20) / slot).max(1)
}

impl Resources {
    fn new(sh: &Shared, run: &RunRequest) -> verbs::Result<Resources> {
        let flows = run.flows.len();
        let slot = slot_size(run.size);
        let pool = if run.op == Op::Send {
            pool_size(run, slot, sh.max_srq_wr)
        } else {
            0
        };
        let echo = if run.pingpong { flows * 16 } else { 0 };
        let entries = (pool + echo + 16) as i32;
        // The SEND sink sleeps on CQ events when idle; the ping-pong echo spins (it is timed).
        let cq = if run.op == Op::Send && !run.pingpong {
            CompletionQueue::with_events(&sh.ctx, entries)?
        } else {
            CompletionQueue::new(&sh.ctx, entries)?
        };
        let srq = if run.op == Op::Send {
            Some(SharedReceiveQueue::new(&sh.pd, pool as u32)?)
        } else {
            None
        };
        let mr = MemoryRegion::new(&sh.pd, slot * (flows + pool))?;
        if let Some(srq) = &srq {
            RecvPool {
                srq,
                mr: &mr,
                offset: slot * flows,
                slot,
                count: pool,
            }
            .post_all()?;
        }
        let qp_cfg = QpConfig {
            max_send_wr: 16,
            max_recv_wr: 1,
            port: sh.cfg.ib_port,
            gid_index: sh.gid_index,
            mtu: sh.mtu,
            timeout: sh.cfg.qp_timeout,
            ..QpConfig::default()
        };
        let mut qps = Vec::with_capacity(flows);
        let mut psns = Vec::with_capacity(flows);
        // With rdma_cm the QPs come with the connection requests (accept_cm).
        let exchanged = if run.cm { &[][..] } else { &run.flows[..] };
        for (i, client) in exchanged.iter().enumerate() {
            let qp = QueuePair::new_rc(&sh.pd, &cq, &cq, srq.as_ref(), qp_cfg)?;
            let psn = initial_psn(0x5e4e_u64 ^ u64::from(client.qp.qpn), i as u32);
            qp.connect(&client.qp, psn)?;
            qps.push(qp);
            psns.push(psn);
        }
        Ok(Resources {
            cq,
            srq,
            mr,
            qps,
            psns,
            clients: run.flows.clone(),
            slot,
            pool,
            qp_cfg,
            cm_channel: None,
        })
    }

    /// Makes and accepts a QP for each of the session's `flows` rdma_cm requests, within the
    /// set-up timeout, giving up early if the client's control connection closes. Each id
    /// moves to this session's own event channel first: from then on only this thread
    /// touches it (the listener thread reading its events could race our QP's destruction).
    fn accept_cm(
        &mut self,
        sh: &Shared,
        requests: &Receiver<Incoming>,
        flows: usize,
        client: &TcpStream,
    ) -> Result<(), String> {
        self.cm_channel = Some(EventChannel::new().map_err(|e| e.to_string())?);
        let channel = self.cm_channel.as_ref().expect("just made");
        let params = ConnParams {
            ack_timeout: self.qp_cfg.timeout,
            retry_count: self.qp_cfg.retry_cnt,
            rnr_retry: self.qp_cfg.rnr_retry,
            srq: self.srq.is_some(),
        };
        let mut slots: Vec<Option<QueuePair>> = (0..flows).map(|_| None).collect();
        let deadline = Instant::now() + sh.cfg.setup_timeout;
        let mut accepted = 0;
        while accepted < flows {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "rdma_cm: {accepted} of {flows} flows connected after {:?}",
                    sh.cfg.setup_timeout
                ));
            }
            let Ok(Incoming { flow, id }) = requests.recv_timeout(left.min(CLIENT_CHECK)) else {
                if closed(client) {
                    return Err(format!(
                        "client left after {accepted} of {flows} flows connected"
                    ));
                }
                continue;
            };
            let id = id
                .migrate(channel)
                .map_err(|e| format!("flow {flow}: {e}"))?;
            let Some(slot) = slots.get_mut(flow as usize).filter(|s| s.is_none()) else {
                let _ = id.reject("flow index out of range or already connected");
                return Err(format!("rdma_cm: bad or repeated flow index {flow}"));
            };
            let qp = QueuePair::new_rc_cm(
                id,
                &sh.pd,
                &self.cq,
                &self.cq,
                self.srq.as_ref(),
                self.qp_cfg,
            )
            .map_err(|e| format!("flow {flow}: {e}"))?;
            let cm_id = qp.cm_id().expect("made on an rdma_cm id");
            cm_id
                .accept(params)
                .map_err(|e| format!("flow {flow}: {e}"))?;
            *slot = Some(qp);
            accepted += 1;
        }
        self.qps = slots
            .into_iter()
            .map(|q| q.expect("all accepted"))
            .collect();
        Ok(())
    }

    fn endpoints(&self, sh: &Shared) -> Vec<FlowEndpoint> {
        (0..self.clients.len())
            .map(|i| FlowEndpoint {
                qp: Endpoint {
                    qpn: self.qps.get(i).map_or(0, |qp| qp.qpn()),
                    psn: self.psns.get(i).copied().unwrap_or(0),
                    lid: sh.lid,
                    gid: sh.gid,
                },
                buf: RemoteBuffer {
                    addr: self.mr.addr() + (i * self.slot) as u64,
                    rkey: self.mr.rkey(),
                    len: self.slot as u64,
                },
            })
            .collect()
    }

    fn data_path(&self, run: &RunRequest, stop: &AtomicBool) -> Received {
        let pool = self.srq.as_deref().map(|srq| RecvPool {
            srq,
            mr: &self.mr,
            offset: self.slot * self.qps.len(),
            slot: self.slot,
            count: self.pool,
        });
        if run.pingpong {
            let flows: Vec<EchoFlow> = self
                .qps
                .iter()
                .zip(&self.clients)
                .enumerate()
                .map(|(i, (qp, c))| EchoFlow {
                    qp,
                    offset: i * self.slot,
                    remote_addr: c.buf.addr,
                    remote_rkey: c.buf.rkey,
                })
                .collect();
            return responder::echo(&self.cq, &self.mr, &flows, run.size, pool.as_ref(), stop);
        }
        match &pool {
            Some(pool) => responder::sink_sends(&self.cq, pool, stop),
            None => {
                // WRITEs land without us; just wait.
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Received::default()
            }
        }
    }
}

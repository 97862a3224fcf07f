//! One client's session on the server: its run checked, its flows' QPs and buffer
//! ([`Resources`]), the start barrier, then the data path until the client is done.
use super::responder::{self, EchoFlow, Received, RecvPool};
use super::Shared;
use crate::gen::cm::Incoming;
use crate::gen::shard::{initial_psn, slot_size};
use crate::gen::wire::{self, Control, FlowEndpoint, Op, RunRequest};
use crate::verbs::cm::{ConnParams, EventChannel};
use crate::verbs::{
    self, CompletionQueue, Endpoint, MemoryRegion, QpConfig, QueuePair, RemoteBuffer,
    SharedReceiveQueue,
};
use crossbeam::channel::Receiver;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a set-up wait looks at the client's control connection.
const CLIENT_CHECK: Duration = Duration::from_millis(200);

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

/// Serves one client from Hello to Bye. Errors are reported by the caller.
pub fn session(stream: TcpStream, sh: &Shared, id: usize) -> Result<(), String> {
    let mut control = Control::new(stream);
    let cfg = &sh.cfg;
    let run = control.await_hello(cfg.setup_timeout)?;
    let check = wire::validate(&run).and_then(|()| {
        if run.cm && sh.cm.is_none() {
            Err("this server does not take rdma_cm connections: start it with `ibjitter serve --cm`".into())
        } else {
            Ok(())
        }
    });
    if let Err(reason) = check {
        return Err(control.reject(reason));
    }
    let mut res = Resources::new(sh, &run).map_err(|e| {
        control.reject(format!(
            "server could not set up {} flows: {e}",
            run.flows.len()
        ))
    })?;
    // --cm: the client connects each flow through rdma_cm with this session's token; the
    // listener hands us the requests and we make and accept a QP for each.
    let cm = match &sh.cm {
        Some(listener) if run.cm => {
            let token = session_token(id);
            Some((token, listener.register(token)))
        }
        _ => None,
    };
    control.accept(res.endpoints(sh), cm.as_ref().map(|(token, _)| *token))?;
    if let Some((_, (requests, registration))) = cm {
        res.accept_cm(sh, &requests, run.flows.len(), &control)?;
        // Set up: a later request with this token is refused at once, not queued unread.
        drop(registration);
    }
    control.await_ready(cfg.setup_timeout)?;
    sh.barrier.wait(cfg.start_timeout);
    control.go()?;

    let stop = AtomicBool::new(false);
    let (received, done) = std::thread::scope(|scope| {
        let data = scope.spawn(|| res.data_path(&run, &stop));
        let done = control.await_done();
        stop.store(true, Ordering::Relaxed);
        (data.join().unwrap_or_default(), done)
    });
    let what = format!(
        "session {id} ({}): {} {} flows x {} B{}",
        run.client,
        run.op.name(),
        run.flows.len(),
        run.size,
        if run.pingpong { " ping-pong" } else { "" },
    );
    let received_here = format!(
        "received {} messages, {} bytes, {} errors",
        received.messages, received.bytes, received.errors
    );
    let (client_ops, client_bytes) = done.map_err(|e| format!("{e}; {what}: {received_here}"))?;
    // A WRITE lands in this memory without a completion here: only the client's count (of
    // the writes whose completion it saw, i.e. that reached this memory) says what arrived.
    let wrote_into_us = run.op == Op::Write && !run.pingpong;
    if wrote_into_us {
        control.bye(client_ops, client_bytes);
        println!(
            "{what}: the client wrote {client_ops} operations, {client_bytes} bytes into this \
             server's memory (completed at the client: a WRITE raises no completion here), {} errors",
            received.errors
        );
    } else {
        control.bye(received.messages, received.bytes);
        println!("{what}: {received_here}");
    }
    Ok(())
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
        client: &Control,
    ) -> Result<(), String> {
        self.cm_channel = Some(EventChannel::new().map_err(|e| e.to_string())?);
        let channel = self.cm_channel.as_ref().expect("just made");
        let params = ConnParams {
            ack_timeout: self.qp_cfg.timeout,
            retry_count: self.qp_cfg.retry_cnt,
            rnr_retry: self.qp_cfg.rnr_retry,
            srq: self.srq.is_some(),
            initiator_depth: self.qp_cfg.max_rd_atomic,
            responder_resources: self.qp_cfg.max_dest_rd_atomic,
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
                if client.peer_gone() {
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
                    rd_atomic: self.qp_cfg.max_dest_rd_atomic,
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

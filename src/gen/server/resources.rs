//! One session's verbs objects on the server ([`Resources`]): its CQ, the shared receive
//! queue and its pool when the run's ops raise receives, one buffer (a slot per flow, the
//! flows' atomic words, the pool), and a QP per flow (RC connected to the client's, or UD).
use super::responder::{self, EchoFlow, Finish, Received, RecvPool};
use super::shared::Shared;
use crate::gen::cm::Incoming;
use crate::gen::ops::GRH_BYTES;
use crate::gen::shard::{initial_psn, slot_size};
use crate::gen::wire::{Control, FlowEndpoint, Op, QpType, RunRequest};
use crate::verbs::cm::{ConnParams, EventChannel};
use crate::verbs::{
    self, CompletionQueue, Endpoint, MemoryRegion, QpConfig, QueuePair, RemoteBuffer,
    SharedReceiveQueue,
};
use crossbeam::channel::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a set-up wait looks at the client's control connection.
const CLIENT_CHECK: Duration = Duration::from_millis(200);

/// A deep pool holds at least this many receives. The senders' completions do not wait for
/// this server to re-post what they consumed (a SEND's ACK leaves before the receive is
/// reaped; a UD datagram has none), so a sink descheduled for milliseconds lets them run the
/// pool dry: UD datagrams are then dropped unannounced, RC ones NAKed (RNR) and retried
/// after a pause. Deep where it costs little: UD, and WRITE_IMM without SEND (its receives
/// hold no data).
const DEEP_POOL: usize = 4096;

/// One session's verbs objects: a CQ, optionally an SRQ with its receive pool, one buffer
/// (a slot per flow, the flows' atomic words, then the pool), and a QP per flow.
pub struct Resources {
    cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    mr: MemoryRegion,
    qps: Vec<QueuePair>,
    psns: Vec<u32>,
    clients: Vec<FlowEndpoint>,
    slot: usize,
    /// With atomics: where flow i's two words start (fetch_add's, then cmp_swap's).
    atomic_off: Option<usize>,
    /// The receive pool: where it starts, its buffers' size (UD: room for the GRH), how many.
    pool_off: usize,
    pool_slot: usize,
    pool: usize,
    qp_cfg: QpConfig,
    /// With rdma_cm: where this session's ids report (after the QPs: dropped last).
    cm_channel: Option<Arc<EventChannel>>,
}

/// The receive pool (SEND, WRITE_IMM): enough for every flow's depth (UD, and WRITE_IMM
/// without SEND: at least [`DEEP_POOL`]), within the device limit and 256 MiB.
fn pool_size(run: &RunRequest, slot: usize, max_srq_wr: u32) -> usize {
    let mut want = run.flows.len() * run.depth as usize + 16;
    if run.qp_type == QpType::Ud || !run.mix.contains(Op::Send) {
        want = want.max(DEEP_POOL);
    }
    want.min(max_srq_wr as usize).min((256 << 20) / slot).max(1)
}

impl Resources {
    pub fn new(sh: &Shared, run: &RunRequest) -> verbs::Result<Resources> {
        let flows = run.flows.len();
        let slot = slot_size(run.size);
        let ud = run.qp_type == QpType::Ud;
        let receives = run.mix.needs_receives();
        let atomics = run.mix.has_atomics();
        // Buffer: the flows' slots, their atomic words (16 bytes each), the receive pool: a
        // SEND's size (UD: and its GRH), or a line when only WRITE_IMMs take receives (their
        // data lands in the flow's slot).
        let pool_slot = if ud {
            slot_size(run.size + GRH_BYTES)
        } else if run.mix.contains(Op::Send) {
            slot
        } else {
            64
        };
        let pool = if receives {
            pool_size(run, pool_slot, sh.max_srq_wr)
        } else {
            0
        };
        // Fewer receives than the SENDs the flows may have in flight: a burst finds the pool
        // empty, the sender gets RNR NAKs and retries (throughput dips, nothing is lost).
        let in_flight = flows * run.depth as usize;
        if receives && run.mix.contains(Op::Send) && !run.pingpong && pool < in_flight {
            eprintln!(
                "ibjitter serve: warning: {pool} receives pooled for {flows} flows x depth {} = \
                 {in_flight} SENDs in flight (limit: the device's max_srq_wr {} and 256 MiB of \
                 buffers): senders may be slowed by RNR NAKs (see their port counters)",
                run.depth, sh.max_srq_wr
            );
        }
        let atomic_off = slot * flows;
        let pool_off = atomic_off
            + if atomics {
                (16 * flows).div_ceil(64) * 64
            } else {
                0
            };
        let echo = if run.pingpong { flows * 16 } else { 0 };
        let entries = (pool + echo + 16) as i32;
        // The receive sink sleeps on CQ events when idle; the ping-pong echo spins (it is timed).
        let cq = if receives && !run.pingpong {
            CompletionQueue::with_events(&sh.ctx, entries)?
        } else {
            CompletionQueue::new(&sh.ctx, entries)?
        };
        let srq = if receives {
            Some(SharedReceiveQueue::new(&sh.pd, pool as u32)?)
        } else {
            None
        };
        let len = pool_off + pool_slot * pool;
        let mr = if atomics {
            MemoryRegion::with_remote_atomics(&sh.pd, len)?
        } else {
            MemoryRegion::new(&sh.pd, len)?
        };
        if let Some(srq) = &srq {
            RecvPool {
                srq,
                mr: &mr,
                offset: pool_off,
                slot: pool_slot,
                count: pool,
            }
            .post_all()?;
        }
        let (max_rd_atomic, max_dest_rd_atomic) = sh.limits.rd_atomic();
        let qp_cfg = QpConfig {
            max_send_wr: 16,
            max_recv_wr: 1,
            port: sh.cfg.ib_port,
            gid_index: sh.gid_index,
            mtu: sh.mtu,
            timeout: sh.cfg.qp_timeout,
            max_rd_atomic,
            max_dest_rd_atomic,
            remote_atomic: atomics,
            ..QpConfig::default()
        };
        let mut qps = Vec::with_capacity(flows);
        let mut psns = Vec::with_capacity(flows);
        // With rdma_cm the QPs come with the connection requests (accept_cm).
        let exchanged = if run.cm { &[][..] } else { &run.flows[..] };
        for (i, client) in exchanged.iter().enumerate() {
            let psn = initial_psn(0x5e4e_u64 ^ u64::from(client.qp.qpn), i as u32);
            let qp = if ud {
                // Datagrams: ready at once, nothing to connect.
                QueuePair::new_ud(&sh.pd, &cq, &cq, srq.as_ref(), qp_cfg, psn)?
            } else {
                let qp = QueuePair::new_rc(&sh.pd, &cq, &cq, srq.as_ref(), qp_cfg)?;
                qp.connect(&client.qp, psn)?;
                qp
            };
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
            atomic_off: atomics.then_some(atomic_off),
            pool_off,
            pool_slot,
            pool,
            qp_cfg,
            cm_channel: None,
        })
    }

    /// The sum of every flow's word for `op` (fetch_add or cmp_swap), read now (after the
    /// client is done: every atomic it saw complete has executed); None without atomics.
    pub fn atomic_sum(&self, op: Op) -> Option<u64> {
        let base = self.atomic_off?;
        let word = match op {
            Op::FetchAdd => 0,
            Op::CmpSwap => 8,
            _ => return None,
        };
        Some(
            (0..self.clients.len())
                .map(|i| self.mr.read_u64(base + 16 * i + word))
                .fold(0u64, u64::wrapping_add),
        )
    }

    /// Makes and accepts a QP for each of the session's `flows` rdma_cm requests, within the
    /// set-up timeout, giving up early if the client's control connection closes. Each id
    /// moves to this session's own event channel first: from then on only this thread
    /// touches it (the listener thread reading its events could race our QP's destruction).
    pub fn accept_cm(
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

    pub fn endpoints(&self, sh: &Shared) -> Vec<FlowEndpoint> {
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
                atomic_addr: self
                    .atomic_off
                    .map_or(0, |base| self.mr.addr() + (base + 16 * i) as u64),
            })
            .collect()
    }

    /// Absorbs or echoes the session's traffic until the client is done (`finish`).
    pub fn data_path(&self, run: &RunRequest, finish: &Finish) -> Received {
        let pool = self.srq.as_deref().map(|srq| RecvPool {
            srq,
            mr: &self.mr,
            offset: self.pool_off,
            slot: self.pool_slot,
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
            return responder::echo(&self.cq, &self.mr, &flows, run.size, pool.as_ref(), finish);
        }
        let grh = if run.qp_type == QpType::Ud {
            GRH_BYTES
        } else {
            0
        };
        match &pool {
            Some(pool) => responder::sink_receives(&self.cq, pool, finish, grh),
            None => {
                // WRITEs, READs and atomics are served without us; just wait.
                finish.wait();
                Received::default()
            }
        }
    }
}

//! One sending thread's resources: its own CQ (perftest's one CQ shared by every QP is its
//! known many-QP failure), one registered buffer, and its flows' QPs.
use super::wire::FlowEndpoint;
use crate::verbs::{
    self, CompletionQueue, Context, Endpoint, MemoryRegion, ProtectionDomain, QueuePair,
    RemoteBuffer,
};
use rand_core::{Rng, SeedableRng};
use std::sync::Arc;

/// A flow on the sending side.
pub struct ClientFlow {
    /// Index among all the run's flows.
    pub id: u32,
    pub qp: QueuePair,
    pub psn: u32,
    /// Where this flow's send data starts in the shard's buffer.
    pub send_off: usize,
    /// Where the peer writes back to (ping-pong), and what we advertise as our buffer.
    pub recv_off: usize,
    /// The server's side, once accepted.
    pub remote: Option<FlowEndpoint>,
}

pub struct Shard {
    pub cq: Arc<CompletionQueue>,
    pub mr: MemoryRegion,
    pub flows: Vec<ClientFlow>,
    /// Bytes reserved per message in the buffer (size rounded up to a cache line).
    pub slot: usize,
}

/// Message slots are cache-line aligned so flows never share a line.
pub fn slot_size(size: u32) -> usize {
    (size as usize).div_ceil(64) * 64
}

/// A random 24-bit starting PSN, repeatable from the run's seed.
pub fn initial_psn(seed: u64, flow: u32) -> u32 {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (u64::from(flow) << 32) ^ 0x9e37_79b9);
    (rng.next_u64() & 0xff_ffff) as u32
}

impl Shard {
    /// Makes a CQ, a buffer with a send and a receive slot per flow, and one RC QP per flow id
    /// (`make_qp(flow id, the shard's CQ)`: plain verbs or on an rdma_cm id).
    /// `cq_entries` must cover every completion that can be outstanding at once.
    pub fn new(
        ctx: &Arc<Context>,
        pd: &Arc<ProtectionDomain>,
        ids: &[u32],
        size: u32,
        cq_entries: i32,
        seed: u64,
        make_qp: &mut dyn FnMut(u32, &Arc<CompletionQueue>) -> verbs::Result<QueuePair>,
    ) -> verbs::Result<Shard> {
        let cq = CompletionQueue::new(ctx, cq_entries)?;
        let slot = slot_size(size);
        let mr = MemoryRegion::new(pd, 2 * slot * ids.len())?;
        let mut flows = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            let qp = make_qp(id, &cq)?;
            flows.push(ClientFlow {
                id,
                qp,
                psn: initial_psn(seed, id),
                send_off: 2 * i * slot,
                recv_off: (2 * i + 1) * slot,
                remote: None,
            });
        }
        Ok(Shard {
            cq,
            mr,
            flows,
            slot,
        })
    }

    /// Our side of flow `i`, to send to the server.
    pub fn endpoint(&self, i: usize, lid: u16, gid: [u8; 16]) -> FlowEndpoint {
        let f = &self.flows[i];
        FlowEndpoint {
            qp: Endpoint {
                qpn: f.qp.qpn(),
                psn: f.psn,
                lid,
                gid,
                rd_atomic: 1,
            },
            buf: RemoteBuffer {
                addr: self.mr.addr() + f.recv_off as u64,
                rkey: self.mr.rkey(),
                len: self.slot as u64,
            },
        }
    }
}

//! One sending thread's resources: its own CQ (perftest's one CQ shared by every QP is its
//! known many-QP failure), one registered buffer, and its flows' QPs.
use super::wire::FlowEndpoint;
use crate::verbs::{
    self, AddressHandle, CompletionQueue, Context, Endpoint, MemoryRegion, ProtectionDomain,
    QueuePair, RemoteBuffer,
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
    /// Where the peer writes back to (ping-pong), where our READs land, and what we
    /// advertise as our buffer.
    pub recv_off: usize,
    /// Where our atomics' results land: an 8-byte word per slot (depth) of the flow.
    pub atomic_off: usize,
    /// The server's side, once accepted.
    pub remote: Option<FlowEndpoint>,
    /// UD: the route to the server's flow QP (shared by flows with the same destination).
    pub ah: Option<Arc<AddressHandle>>,
}

pub struct Shard {
    pub cq: Arc<CompletionQueue>,
    pub mr: MemoryRegion,
    pub flows: Vec<ClientFlow>,
    /// Bytes reserved per message in the buffer (size rounded up to a cache line).
    pub slot: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_takes_two_message_slots_and_its_result_words() {
        let plain = FlowLayout {
            size: 100,
            atomic_words: 0,
        };
        assert_eq!((plain.slot(), plain.flow_bytes()), (128, 256));
        // 8-byte atomics at depth 9: 2 x 64 + 72 bytes of results, rounded to a line.
        let atomics = FlowLayout {
            size: 8,
            atomic_words: 9,
        };
        assert_eq!(atomics.flow_bytes(), 128 + 128);
    }
}

/// Makes flow `id`'s QP, with its initial PSN, on the shard's CQ.
pub type MakeQp<'a> = dyn FnMut(u32, u32, &Arc<CompletionQueue>) -> verbs::Result<QueuePair> + 'a;

/// Message slots are cache-line aligned so flows never share a line.
pub fn slot_size(size: u32) -> usize {
    (size as usize).div_ceil(64) * 64
}

/// How much of a shard's buffer one flow takes: a send and a receive slot of the message
/// size, and with atomics a result word per outstanding operation.
#[derive(Debug, Clone, Copy)]
pub struct FlowLayout {
    pub size: u32,
    /// Result words per flow: its depth with atomics in the run, else 0.
    pub atomic_words: u32,
}

impl FlowLayout {
    pub fn slot(&self) -> usize {
        slot_size(self.size)
    }
    /// Bytes per flow, a multiple of 64.
    pub fn flow_bytes(&self) -> usize {
        2 * self.slot() + (8 * self.atomic_words as usize).div_ceil(64) * 64
    }
}

/// A random 24-bit starting PSN, repeatable from the run's seed.
pub fn initial_psn(seed: u64, flow: u32) -> u32 {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (u64::from(flow) << 32) ^ 0x9e37_79b9);
    (rng.next_u64() & 0xff_ffff) as u32
}

impl Shard {
    /// Makes a CQ, a buffer laid out per flow as `layout` says, and one QP per flow id
    /// (`make_qp(flow id, its PSN, the shard's CQ)`: RC or UD, plain verbs or on an rdma_cm
    /// id). `cq_entries` must cover every completion that can be outstanding at once.
    pub fn new(
        ctx: &Arc<Context>,
        pd: &Arc<ProtectionDomain>,
        ids: &[u32],
        layout: FlowLayout,
        cq_entries: i32,
        seed: u64,
        make_qp: &mut MakeQp,
    ) -> verbs::Result<Shard> {
        let cq = CompletionQueue::new(ctx, cq_entries)?;
        let slot = layout.slot();
        let per_flow = layout.flow_bytes();
        let mr = MemoryRegion::new(pd, per_flow * ids.len())?;
        let mut flows = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            let psn = initial_psn(seed, id);
            let qp = make_qp(id, psn, &cq)?;
            flows.push(ClientFlow {
                id,
                qp,
                psn,
                send_off: i * per_flow,
                recv_off: i * per_flow + slot,
                atomic_off: i * per_flow + 2 * slot,
                remote: None,
                ah: None,
            });
        }
        Ok(Shard {
            cq,
            mr,
            flows,
            slot,
        })
    }

    /// Our side of flow `i`, to send to the server (`rd_atomic`: the READs/atomics our QP
    /// accepts at once).
    pub fn endpoint(&self, i: usize, lid: u16, gid: [u8; 16], rd_atomic: u8) -> FlowEndpoint {
        let f = &self.flows[i];
        FlowEndpoint {
            qp: Endpoint {
                qpn: f.qp.qpn(),
                psn: f.psn,
                lid,
                gid,
                rd_atomic,
            },
            buf: RemoteBuffer {
                addr: self.mr.addr() + f.recv_off as u64,
                rkey: self.mr.rkey(),
                len: self.slot as u64,
            },
            atomic_addr: 0,
        }
    }
}

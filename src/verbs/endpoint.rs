//! A QP's address as its peer sees it ([`Endpoint`], exchanged out of band) and the address
//! vector toward one: what a connected QP ([`super::qp`]) and an address handle
//! ([`super::ah`]) are both made from.
use serde::{Deserialize, Serialize};
use std::mem::MaybeUninit;

/// What the peer needs to connect to one of our QPs (exchanged out of band).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// RDMA READs and atomics this QP accepts at once (its max_dest_rd_atomic): the peer's
    /// max_rd_atomic must not exceed it. 0 from an older peer: 1.
    #[serde(default)]
    pub rd_atomic: u8,
}

/// The address vector toward `remote` from `port`: its LID, and with a GID (RoCE, or IB
/// across subnets) a global route from our GID at `gid_index` in `traffic_class`.
pub(super) fn ah_attr(
    port: u8,
    gid_index: i32,
    traffic_class: u8,
    remote: &Endpoint,
) -> rdma_sys::ibv_ah_attr {
    // SAFETY: plain data; all-zero is a valid starting point.
    let mut ah: rdma_sys::ibv_ah_attr = unsafe { MaybeUninit::zeroed().assume_init() };
    ah.dlid = remote.lid;
    ah.port_num = port;
    if remote.gid != [0; 16] {
        ah.is_global = 1;
        ah.grh.dgid.raw = remote.gid;
        ah.grh.sgid_index = gid_index as u8;
        ah.grh.hop_limit = 64;
        ah.grh.traffic_class = traffic_class;
    }
    ah
}

//! What every session shares (the device, the start barrier, the rdma_cm listener): made by
//! [`super::serve`], read by each [`super::session`] and its [`super::resources`].
use super::barrier::StartBarrier;
use super::serve_config::ServeConfig;
use crate::gen::cm::Listener;
use crate::verbs::{Context, DeviceLimits, ProtectionDomain};
use std::sync::Arc;

/// What is shared by every session: the device and the start barrier.
pub(super) struct Shared {
    pub(super) cfg: ServeConfig,
    pub(super) ctx: Arc<Context>,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    pub(super) gid_index: i32,
    pub(super) mtu: u32,
    pub(super) max_srq_wr: u32,
    /// READ/atomic depths and whether the device does atomics at all.
    pub(super) limits: DeviceLimits,
    pub(super) barrier: StartBarrier,
    /// The rdma_cm listener, with `cm`.
    pub(super) cm: Option<Listener>,
}

//! Queue pairs: reliable-connected (creation, the INIT → RTR → RTS walk) and unreliable
//! datagram (ready at once, addressed per post through an [`AddressHandle`]); posting every
//! verb the generator uses.
use super::ah::AddressHandle;
use super::cm::CmId;
use super::cq::CompletionQueue;
use super::endpoint::{ah_attr, Endpoint};
use super::error::{Error, Result};
use super::mr::Sge;
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use rdma_sys::{
    ibv_qp_attr_mask as Mask, ibv_qp_state as State, ibv_qp_type as Type, ibv_wr_opcode as Opcode,
};
use serde::{Deserialize, Serialize};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// A registered buffer on the peer, for RDMA WRITE and READ.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteBuffer {
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// How QPs are made and connected.
#[derive(Debug, Clone, Copy)]
pub struct QpConfig {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_inline: u32,
    pub port: u8,
    pub gid_index: i32,
    /// Path MTU as libibverbs' enum (5 = 4096).
    pub mtu: u32,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout. Queueing delay in an incast can reach
    /// tens of ms, beyond the 67 ms of perftest's default 14, so ours defaults higher.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// RDMA READs/atomics outstanding as initiator (max_rd_atomic, capped by the peer's
    /// [`Endpoint::rd_atomic`]) and accepted as target (max_dest_rd_atomic): the device's
    /// limits ([`super::DeviceLimits::rd_atomic`]).
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// Let the peer's atomics at this QP (IBV_ACCESS_REMOTE_ATOMIC).
    pub remote_atomic: bool,
    /// The GRH traffic class of what this QP sends: on RoCEv2 the IP header's DSCP and ECN
    /// bits (2: ECN-capable, ECT(0), so a switch marks CE instead of dropping).
    pub traffic_class: u8,
}

/// The Q_Key of the generator's UD QPs (any value both sides agree on; the high bit clear:
/// a set high bit means a privileged Q_Key).
pub const UD_QKEY: u32 = 0x1b1_7e12;

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_inline: 0,
            port: 1,
            gid_index: 0,
            mtu: rdma_sys::ibv_mtu::IBV_MTU_1024,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            remote_atomic: false,
            traffic_class: 0,
        }
    }
}

pub struct QueuePair {
    raw: *mut rdma_sys::ibv_qp,
    /// The rdma_cm id that made and connects this QP (`--cm`); destroyed after the QP.
    cm: Option<CmId>,
    cfg: QpConfig,
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _srq: Option<Arc<SharedReceiveQueue>>,
}

// SAFETY: libibverbs QPs are thread-safe; each is posted to by one thread here.
unsafe impl Send for QueuePair {}
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC QP in the RESET state and moves it to INIT.
    pub fn new_rc(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        cfg: QpConfig,
    ) -> Result<QueuePair> {
        let qp = QueuePair::create(pd, send_cq, recv_cq, srq, cfg, Type::IBV_QPT_RC)?;
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = cfg.port;
        let mut access = rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        if cfg.remote_atomic {
            access |= rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        attr.qp_access_flags = access.0;
        qp.modify(
            &mut attr,
            Mask::IBV_QP_STATE
                | Mask::IBV_QP_PKEY_INDEX
                | Mask::IBV_QP_PORT
                | Mask::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        Ok(qp)
    }

    /// Creates a UD QP and walks it to RTS at once (a datagram QP has no peer: each SEND
    /// names its destination through an [`AddressHandle`]), with Q_Key [`UD_QKEY`].
    pub fn new_ud(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        cfg: QpConfig,
        psn: u32,
    ) -> Result<QueuePair> {
        let qp = QueuePair::create(pd, send_cq, recv_cq, srq, cfg, Type::IBV_QPT_UD)?;
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = cfg.port;
        attr.qkey = UD_QKEY;
        qp.modify(
            &mut attr,
            Mask::IBV_QP_STATE | Mask::IBV_QP_PKEY_INDEX | Mask::IBV_QP_PORT | Mask::IBV_QP_QKEY,
            "ibv_modify_qp(INIT)",
        )?;
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_RTR;
        qp.modify(&mut attr, Mask::IBV_QP_STATE, "ibv_modify_qp(RTR)")?;
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_RTS;
        attr.sq_psn = psn;
        qp.modify(
            &mut attr,
            Mask::IBV_QP_STATE | Mask::IBV_QP_SQ_PSN,
            "ibv_modify_qp(RTS)",
        )?;
        Ok(qp)
    }

    /// `ibv_create_qp` of `kind`, in the RESET state.
    fn create(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        cfg: QpConfig,
        kind: rdma_sys::ibv_qp_type::Type,
    ) -> Result<QueuePair> {
        let mut init = init_attr(send_cq, recv_cq, srq, &cfg, kind);
        // SAFETY: init is fully initialized; CQs/SRQ outlive the QP through the Arcs kept.
        let raw = unsafe { rdma_sys::ibv_create_qp(pd.as_raw(), &mut init) };
        if raw.is_null() {
            return Err(Error::last("ibv_create_qp"));
        }
        Ok(QueuePair::holding(
            raw, None, cfg, pd, send_cq, recv_cq, srq,
        ))
    }

    /// Creates an RC QP on an rdma_cm id (`rdma_create_qp`: it starts in INIT); the id's
    /// connect or accept then moves it to RTS. The PD must be on the id's device context.
    pub fn new_rc_cm(
        id: CmId,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        cfg: QpConfig,
    ) -> Result<QueuePair> {
        let mut init = init_attr(send_cq, recv_cq, srq, &cfg, Type::IBV_QPT_RC);
        // SAFETY: as in create; librdmacm stores the QP in the id.
        let rc = unsafe { rdma_sys::rdma_create_qp(id.as_raw(), pd.as_raw(), &mut init) };
        if rc != 0 {
            return Err(Error::last("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so the id holds the new QP.
        let raw = unsafe { (*id.as_raw()).qp };
        Ok(QueuePair::holding(
            raw,
            Some(id),
            cfg,
            pd,
            send_cq,
            recv_cq,
            srq,
        ))
    }

    /// Wraps a new QP, keeping what it was made from alive as long as it is.
    fn holding(
        raw: *mut rdma_sys::ibv_qp,
        cm: Option<CmId>,
        cfg: QpConfig,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
    ) -> QueuePair {
        QueuePair {
            raw,
            cm,
            cfg,
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
        }
    }

    /// The rdma_cm id of a QP made with [`QueuePair::new_rc_cm`].
    pub fn cm_id(&self) -> Option<&CmId> {
        self.cm.as_ref()
    }

    pub fn qpn(&self) -> u32 {
        unsafe { (*self.raw).qp_num }
    }

    /// Connects to `remote`: INIT → RTR (receive side ready) → RTS with our send PSN.
    pub fn connect(&self, remote: &Endpoint, local_psn: u32) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_RTR;
        attr.path_mtu = self.cfg.mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = self.cfg.max_dest_rd_atomic.max(1);
        attr.min_rnr_timer = 12;
        attr.ah_attr = ah_attr(
            self.cfg.port,
            self.cfg.gid_index,
            self.cfg.traffic_class,
            remote,
        );
        self.modify(
            &mut attr,
            Mask::IBV_QP_STATE
                | Mask::IBV_QP_AV
                | Mask::IBV_QP_PATH_MTU
                | Mask::IBV_QP_DEST_QPN
                | Mask::IBV_QP_RQ_PSN
                | Mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | Mask::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_RTS;
        attr.sq_psn = local_psn;
        attr.timeout = self.cfg.timeout;
        attr.retry_cnt = self.cfg.retry_cnt;
        attr.rnr_retry = self.cfg.rnr_retry;
        // No more READs/atomics outstanding than the peer's QP accepts at once.
        attr.max_rd_atomic = self.cfg.max_rd_atomic.min(remote.rd_atomic.max(1)).max(1);
        self.modify(
            &mut attr,
            Mask::IBV_QP_STATE
                | Mask::IBV_QP_SQ_PSN
                | Mask::IBV_QP_TIMEOUT
                | Mask::IBV_QP_RETRY_CNT
                | Mask::IBV_QP_RNR_RETRY
                | Mask::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    fn modify(
        &self,
        attr: &mut rdma_sys::ibv_qp_attr,
        mask: Mask,
        call: &'static str,
    ) -> Result<()> {
        // SAFETY: attr is initialized for every field the mask names.
        let rc = unsafe { rdma_sys::ibv_modify_qp(self.raw, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(Error::code(call, rc));
        }
        Ok(())
    }

    /// Posts one RDMA WRITE of `local` to the peer's `remote_addr` (registered under `rkey`).
    pub fn post_write(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<()> {
        let kind = SendKind::Write { remote_addr, rkey };
        self.post_one(SendWr::new(wr_id, local, signaled, kind))
    }

    /// Posts one SEND of `local` (an RC QP: to its peer).
    pub fn post_send(&self, wr_id: u64, local: Sge, signaled: bool) -> Result<()> {
        self.post_one(SendWr::new(wr_id, local, signaled, SendKind::Send))
    }

    fn post_one(&self, wr: SendWr) -> Result<()> {
        self.post_list(std::iter::once(wr)).map_err(|(_, e)| e)
    }

    /// Posts `wrs` as one linked list: one call into the provider, so one doorbell (on rxe,
    /// one system call, where a call per request costs one each). 1 to [`POST_LIST_MAX`]
    /// requests. On failure: how many went in before the one refused.
    pub fn post_list<'a>(
        &self,
        wrs: impl ExactSizeIterator<Item = SendWr<'a>>,
    ) -> std::result::Result<(), (usize, Error)> {
        let n = wrs.len();
        assert!(
            (1..=POST_LIST_MAX).contains(&n),
            "post_list takes 1..={POST_LIST_MAX} requests"
        );
        // Only the first n entries are written and used (zeroing all 32 would cost every
        // single post).
        let mut sges = [const { MaybeUninit::<rdma_sys::ibv_sge>::uninit() }; POST_LIST_MAX];
        let mut list = [const { MaybeUninit::<rdma_sys::ibv_send_wr>::uninit() }; POST_LIST_MAX];
        for (k, req) in wrs.enumerate() {
            let sge = sges[k].write(rdma_sys::ibv_sge {
                addr: req.local.addr,
                length: req.local.len,
                lkey: req.local.lkey,
            });
            // SAFETY: an all-zero ibv_send_wr is valid; fill sets the fields used.
            let wr = list[k].write(unsafe { MaybeUninit::zeroed().assume_init() });
            self.fill(wr, &req, sge);
        }
        let first = list[0].as_mut_ptr();
        for k in 1..n {
            let next = list[k].as_mut_ptr();
            // SAFETY: entries 0..n were written above.
            unsafe { (*list[k - 1].as_mut_ptr()).next = next };
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the list's n entries and their scatter entries live across the call; the
        // provider copies them. On failure `bad` points at the refused entry.
        let rc = unsafe { rdma_sys::ibv_post_send(self.raw, first, &mut bad) };
        if rc != 0 {
            let went_in = if bad.is_null() {
                0
            } else {
                // SAFETY: bad and first point into the same array.
                let k = unsafe { bad.cast_const().offset_from(first) };
                k.clamp(0, n as isize) as usize
            };
            return Err((went_in, Error::code("ibv_post_send", rc)));
        }
        Ok(())
    }

    /// Sets `wr` (all zero) from `req`, its one scatter entry `sge`.
    #[inline]
    fn fill(&self, wr: &mut rdma_sys::ibv_send_wr, req: &SendWr, sge: &mut rdma_sys::ibv_sge) {
        let opcode = match req.kind {
            SendKind::Write { remote_addr, rkey } => {
                wr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
                Opcode::IBV_WR_RDMA_WRITE
            }
            SendKind::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                wr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                Opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            }
            SendKind::Read { remote_addr, rkey } => {
                wr.wr.rdma = rdma_sys::rdma_t { remote_addr, rkey };
                Opcode::IBV_WR_RDMA_READ
            }
            SendKind::Atomic(target) => {
                let (opcode, compare_add, swap) = match target.op {
                    AtomicOp::FetchAdd(add) => (Opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, add, 0),
                    AtomicOp::CmpSwap { compare, swap } => {
                        (Opcode::IBV_WR_ATOMIC_CMP_AND_SWP, compare, swap)
                    }
                };
                wr.wr.atomic = rdma_sys::atomic_t {
                    remote_addr: target.addr,
                    compare_add,
                    swap,
                    rkey: target.rkey,
                };
                opcode
            }
            SendKind::Send => Opcode::IBV_WR_SEND,
            SendKind::SendUd { ah, remote_qpn } => {
                wr.wr.ud = rdma_sys::ud_t {
                    ah: ah.as_raw(),
                    remote_qpn,
                    remote_qkey: UD_QKEY,
                };
                Opcode::IBV_WR_SEND
            }
        };
        let mut flags = 0;
        if req.signaled {
            flags |= rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // Inline data is for what we send (a READ or an atomic brings data back).
        let sends_data = matches!(
            opcode,
            Opcode::IBV_WR_SEND | Opcode::IBV_WR_RDMA_WRITE | Opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        );
        let len = req.local.len;
        if sends_data && len <= self.cfg.max_inline && len > 0 {
            flags |= rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.wr_id = req.wr_id;
        wr.sg_list = sge;
        wr.num_sge = i32::from(len != 0);
        wr.opcode = opcode;
        wr.send_flags = flags;
    }

    /// Posts one receive buffer on this QP's own receive queue (QPs without an SRQ).
    pub fn post_recv(&self, wr_id: u64, local: Sge) -> Result<()> {
        // SAFETY: the QP is alive; the work request is valid for the call.
        super::mr::post_recv_with("ibv_post_recv", wr_id, local, |wr, bad| unsafe {
            rdma_sys::ibv_post_recv(self.raw, wr, bad)
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: outstanding work requests are flushed by the provider. The cm id (a field)
        // is destroyed after this, once its QP is gone.
        match &self.cm {
            Some(id) => unsafe { rdma_sys::rdma_destroy_qp(id.as_raw()) },
            None => unsafe {
                rdma_sys::ibv_destroy_qp(self.raw);
            },
        }
    }
}

/// Which atomic, at which 8-byte word of the peer.
#[derive(Debug, Clone, Copy)]
pub struct AtomicTarget {
    pub addr: u64,
    pub rkey: u32,
    pub op: AtomicOp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    FetchAdd(u64),
    CmpSwap { compare: u64, swap: u64 },
}

/// The most work requests [`QueuePair::post_list`] takes in one call.
pub const POST_LIST_MAX: usize = 32;

/// One send-queue work request, as [`QueuePair::post_list`] takes them.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    /// What it sends, or where a READ's or atomic's data lands (an atomic: 8 bytes).
    pub local: Sge,
    /// Unless set, it completes without a completion of its own (except on an error).
    pub signaled: bool,
    pub kind: SendKind<'a>,
}

impl<'a> SendWr<'a> {
    pub fn new(wr_id: u64, local: Sge, signaled: bool, kind: SendKind<'a>) -> SendWr<'a> {
        SendWr {
            wr_id,
            local,
            signaled,
            kind,
        }
    }
}

/// A work request's verb and where it goes.
#[derive(Clone, Copy)]
pub enum SendKind<'a> {
    /// RDMA WRITE to the peer's `remote_addr` (registered under `rkey`).
    Write { remote_addr: u64, rkey: u32 },
    /// As a WRITE, and the peer's receive queue gives up one receive for it, completing with
    /// `imm`.
    WriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// RDMA READ of the peer's `remote_addr` into `local`.
    Read { remote_addr: u64, rkey: u32 },
    /// An 8-byte atomic at the peer's word; the word's value before it lands in `local`.
    Atomic(AtomicTarget),
    /// SEND on an RC QP: to its peer.
    Send,
    /// SEND from a UD QP to QP `remote_qpn` behind the address handle `ah` (Q_Key
    /// [`UD_QKEY`]); `local` is at most the path MTU.
    SendUd {
        ah: &'a AddressHandle,
        remote_qpn: u32,
    },
}

fn init_attr(
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    srq: Option<&Arc<SharedReceiveQueue>>,
    cfg: &QpConfig,
    kind: rdma_sys::ibv_qp_type::Type,
) -> rdma_sys::ibv_qp_init_attr {
    rdma_sys::ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: send_cq.as_raw(),
        recv_cq: recv_cq.as_raw(),
        srq: srq.map_or(std::ptr::null_mut(), |s| s.as_raw()),
        cap: rdma_sys::ibv_qp_cap {
            max_send_wr: cfg.max_send_wr,
            max_recv_wr: if srq.is_some() { 0 } else { cfg.max_recv_wr },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.max_inline,
        },
        qp_type: kind,
        sq_sig_all: 0,
    }
}

fn zeroed_attr() -> rdma_sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data; all-zero is its documented starting point.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

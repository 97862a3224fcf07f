//! Reliable-connected queue pairs: creation, the INIT → RTR → RTS walk, posting.
use super::cm::CmId;
use super::{CompletionQueue, Error, ProtectionDomain, Result, Sge, SharedReceiveQueue};
use rdma_sys::{ibv_qp_attr_mask as Mask, ibv_qp_state as State};
use serde::{Deserialize, Serialize};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// What the peer needs to connect to one of our QPs (exchanged out of band).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
}

/// A registered buffer on the peer, for RDMA WRITE.
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
}

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
        let mut init = init_attr(send_cq, recv_cq, srq, &cfg);
        // SAFETY: init is fully initialized; CQs/SRQ outlive the QP through the Arcs kept.
        let raw = unsafe { rdma_sys::ibv_create_qp(pd.as_raw(), &mut init) };
        if raw.is_null() {
            return Err(Error::last("ibv_create_qp"));
        }
        let qp = QueuePair::holding(raw, None, cfg, pd, send_cq, recv_cq, srq);
        let mut attr = zeroed_attr();
        attr.qp_state = State::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = cfg.port;
        attr.qp_access_flags = (rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
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
        let mut init = init_attr(send_cq, recv_cq, srq, &cfg);
        // SAFETY: as in new_rc; librdmacm stores the QP in the id.
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
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 12;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.port_num = self.cfg.port;
        if remote.gid != [0; 16] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = self.cfg.gid_index as u8;
            attr.ah_attr.grh.hop_limit = 64;
        }
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
        attr.max_rd_atomic = 1;
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
        let rdma = rdma_sys::rdma_t { remote_addr, rkey };
        self.post(
            wr_id,
            rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            local,
            rdma,
            signaled,
        )
    }

    /// Posts one SEND of `local`.
    pub fn post_send(&self, wr_id: u64, local: Sge, signaled: bool) -> Result<()> {
        let none = rdma_sys::rdma_t {
            remote_addr: 0,
            rkey: 0,
        };
        self.post(
            wr_id,
            rdma_sys::ibv_wr_opcode::IBV_WR_SEND,
            local,
            none,
            signaled,
        )
    }

    fn post(
        &self,
        wr_id: u64,
        opcode: u32,
        local: Sge,
        rdma: rdma_sys::rdma_t,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = rdma_sys::ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut flags = 0;
        if signaled {
            flags |= rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if local.len <= self.cfg.max_inline && local.len > 0 {
            flags |= rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // SAFETY: an all-zero ibv_send_wr is valid; the fields used are set below.
        let mut wr: rdma_sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = if local.len == 0 { 0 } else { 1 };
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.wr.rdma = rdma;
        let mut bad = std::ptr::null_mut();
        // SAFETY: wr and sge live across the call; the provider copies them.
        let rc = unsafe { rdma_sys::ibv_post_send(self.raw, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::code("ibv_post_send", rc));
        }
        Ok(())
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

fn init_attr(
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    srq: Option<&Arc<SharedReceiveQueue>>,
    cfg: &QpConfig,
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
        qp_type: rdma_sys::ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: 0,
    }
}

fn zeroed_attr() -> rdma_sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data; all-zero is its documented starting point.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

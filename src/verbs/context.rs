//! An open device: port and device queries, GID selection.
use super::error::{Error, Result};
use std::mem::MaybeUninit;

/// An open RDMA device (`ibv_context`).
pub struct Context {
    raw: *mut rdma_sys::ibv_context,
    name: String,
    owner: Owner,
}

/// Who closes the device: us, or librdmacm (whose contexts stay open for the process).
enum Owner {
    Us,
    /// From `rdma_get_devices`; the list is kept until the context is dropped.
    Rdmacm(*mut *mut rdma_sys::ibv_context),
}

// SAFETY: libibverbs contexts are thread-safe.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

/// What a port says about itself.
#[derive(Debug, Clone)]
pub struct PortInfo {
    pub active: bool,
    pub lid: u16,
    /// The active MTU as libibverbs' enum (1 = 256 ... 5 = 4096; bytes: [`mtu_bytes`]).
    pub active_mtu: u32,
    pub gid_table_len: i32,
    /// Link rate from active width and speed, in Gb/s (0 when unknown).
    pub link_gbps: f64,
}

/// Device limits that size queues.
#[derive(Debug, Clone, Copy)]
pub struct DeviceLimits {
    pub phys_port_cnt: u8,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_srq_wr: i32,
    pub max_mr_size: u64,
    /// RDMA READs and atomics one QP accepts at once as their target (its max_dest_rd_atomic
    /// at most), and may have outstanding as their initiator (its max_rd_atomic at most).
    pub max_qp_rd_atom: i32,
    pub max_qp_init_rd_atom: i32,
    /// Whether the device executes atomics at all (atomic_cap is not IBV_ATOMIC_NONE).
    pub atomics: bool,
}

/// A path MTU as libibverbs' enum (1 = 256 ... 5 = 4096), in bytes.
pub fn mtu_bytes(mtu: u32) -> u32 {
    128 << mtu.clamp(1, 5)
}

impl Context {
    pub(super) fn from_raw(raw: *mut rdma_sys::ibv_context, name: String) -> Context {
        Context {
            raw,
            name,
            owner: Owner::Us,
        }
    }
    /// One of librdmacm's contexts (`list` from `rdma_get_devices`, freed on drop).
    pub(super) fn from_rdmacm(
        raw: *mut rdma_sys::ibv_context,
        name: String,
        list: *mut *mut rdma_sys::ibv_context,
    ) -> Context {
        Context {
            raw,
            name,
            owner: Owner::Rdmacm(list),
        }
    }
    pub fn as_raw(&self) -> *mut rdma_sys::ibv_context {
        self.raw
    }
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self, port: u8) -> Result<PortInfo> {
        let mut attr = MaybeUninit::<rdma_sys::ibv_port_attr>::zeroed();
        // SAFETY: attr is a valid, zeroed ibv_port_attr.
        let rc = unsafe { rdma_sys::___ibv_query_port(self.raw, port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::code("ibv_query_port", rc));
        }
        let a = unsafe { attr.assume_init() };
        Ok(PortInfo {
            active: a.state == rdma_sys::ibv_port_state::IBV_PORT_ACTIVE,
            lid: a.lid,
            active_mtu: a.active_mtu,
            gid_table_len: a.gid_tbl_len,
            link_gbps: link_gbps(a.active_width, a.active_speed),
        })
    }

    pub fn limits(&self) -> Result<DeviceLimits> {
        let mut attr = MaybeUninit::<rdma_sys::ibv_device_attr>::zeroed();
        // SAFETY: attr is a valid, zeroed ibv_device_attr.
        let rc = unsafe { rdma_sys::ibv_query_device(self.raw, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::code("ibv_query_device", rc));
        }
        let a = unsafe { attr.assume_init() };
        Ok(DeviceLimits {
            phys_port_cnt: a.phys_port_cnt,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_srq_wr: a.max_srq_wr,
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            atomics: a.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
        })
    }

    pub fn gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
        let mut gid = MaybeUninit::<rdma_sys::ibv_gid>::zeroed();
        // SAFETY: gid is a valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_gid(self.raw, port, index, gid.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::code("ibv_query_gid", rc));
        }
        Ok(unsafe { gid.assume_init().raw })
    }

    /// The GID index to use on `port`: the first RoCEv2 GID holding an IPv4-mapped address
    /// (what perftest's `-x` is usually set to), else the first RoCEv2 GID, else 0 (InfiniBand).
    pub fn default_gid_index(&self, port: u8) -> Result<i32> {
        let len = self.port(port)?.gid_table_len;
        let mut first_v2 = None;
        for index in 0..len {
            let Ok(gid) = self.gid(port, index) else {
                continue;
            };
            if gid == [0; 16] {
                continue;
            }
            let kind = std::fs::read_to_string(format!(
                "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
                self.name
            ))
            .unwrap_or_default();
            if !kind.contains("RoCE v2") {
                continue;
            }
            if super::gid::gid_ipv4(&gid).is_some() {
                return Ok(index);
            }
            first_v2.get_or_insert(index);
        }
        Ok(first_v2.unwrap_or(0))
    }
}

impl DeviceLimits {
    /// What a QP may set as max_rd_atomic / max_dest_rd_atomic (a u8 in ibv_qp_attr), at
    /// least 1.
    pub fn rd_atomic(&self) -> (u8, u8) {
        let fit = |n: i32| n.clamp(1, 255) as u8;
        (fit(self.max_qp_init_rd_atom), fit(self.max_qp_rd_atom))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object made from this context holds an Arc to it, so none is left.
        match self.owner {
            Owner::Us => unsafe {
                rdma_sys::ibv_close_device(self.raw);
            },
            Owner::Rdmacm(list) => unsafe { rdma_sys::rdma_free_devices(list) },
        }
    }
}

/// IB link rate: lanes (active_width) × per-lane rate (active_speed), in Gb/s of data.
fn link_gbps(width: u8, speed: u8) -> f64 {
    let lanes = match width {
        1 => 1.0,
        2 => 4.0,
        4 => 8.0,
        8 => 12.0,
        16 => 2.0,
        _ => return 0.0,
    };
    let per_lane = match speed {
        1 => 2.0,     // SDR 2.5 Gb/s signalling, 8b/10b
        2 => 4.0,     // DDR
        4 | 8 => 8.0, // QDR / FDR10
        16 => 13.64,  // FDR
        32 => 25.0,   // EDR
        64 => 50.0,   // HDR
        128 => 100.0, // NDR
        _ => return 0.0,
    };
    lanes * per_lane
}

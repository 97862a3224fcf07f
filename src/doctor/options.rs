//! What the doctor was asked to do: read by [`super::run`] and by the ping-pongs
//! ([`super::paths`]), so its own module below both.
use std::path::PathBuf;

/// What the doctor was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The RDMA device (None: the first one).
    pub device: Option<String>,
    pub port: u8,
    /// The constant delay injected in the ping-pongs, ns.
    pub delay_ns: u64,
    /// libibjitter.so.
    pub shim: PathBuf,
    /// Round trips per ping-pong run.
    pub iters: u32,
    /// Clean/delayed pairs per path (the fastest of each side counts).
    pub rounds: u32,
    /// Where the children's outputs and stats files go (created, emptied by the caller).
    pub work_dir: PathBuf,
}

//! The device flags `run` and `serve` share.
use clap::Args;

/// Which RDMA device, port and GID `run` and `serve` use.
#[derive(Args)]
pub(super) struct RdmaArgs {
    /// RDMA device (default: $IBJITTER_DEV, else the first one)
    #[arg(long = "dev", short = 'd', env = "IBJITTER_DEV")]
    pub(super) device: Option<String>,
    /// Device port
    #[arg(long, default_value_t = 1)]
    pub(super) ib_port: u8,
    /// GID index (default: the first RoCEv2 IPv4 GID, else 0)
    #[arg(long)]
    pub(super) gid_index: Option<i32>,
}

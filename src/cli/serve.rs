//! `ibjitter serve`: argument parsing; the server is `ibjitter::gen::server`.
use super::{units, RdmaArgs};
use clap::Args;
use ibjitter::gen::server::{serve, ServeConfig, ServeError};
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Exit status: 0 when stopped or (with --once) every session succeeded; \
1 when a session failed; 2 when the device or the port cannot be used."
)]
pub struct ServeArgs {
    #[command(flatten)]
    rdma: RdmaArgs,
    /// TCP port for the out-of-band exchange
    #[arg(long, short = 'p', default_value_t = 18515)]
    port: u16,
    /// Address to listen on
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Also accept `run --cm` clients: an rdma_cm listener on the same port number (bound to
    /// the device's IPv4 address unless --bind names one)
    #[arg(long)]
    cm: bool,
    /// Clients that start together: the start barrier waits for this many
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Exit after one group of clients has finished
    #[arg(long)]
    once: bool,
    /// QP local ACK timeout exponent (4.096 us x 2^N)
    #[arg(long, default_value_t = 18)]
    qp_timeout: u8,
    /// How long a client group may take to gather at the start barrier; then the clients that
    /// are ready start without the missing ones
    #[arg(long, default_value = "120s", value_parser = units::duration)]
    start_timeout: Duration,
}

pub fn run(a: ServeArgs) -> i32 {
    let cfg = ServeConfig {
        device: a.rdma.device,
        ib_port: a.rdma.ib_port,
        gid_index: a.rdma.gid_index,
        cm: a.cm,
        bind: a.bind,
        port: a.port,
        clients: a.clients.max(1),
        once: a.once,
        qp_timeout: a.qp_timeout,
        start_timeout: a.start_timeout,
        ..ServeConfig::default()
    };
    match serve(cfg) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ibjitter serve: {e}");
            match e {
                ServeError::Sessions(_) => 1,
                ServeError::Setup(_) => 2,
            }
        }
    }
}

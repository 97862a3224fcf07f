//! `ibjitter serve`: accepts clients, gives each client's flows a QP and a buffer, holds every
//! client of a group at the start barrier until all are ready, then absorbs or echoes traffic
//! and reports what reached it, by op.
//! This file: the device and the listener; [`barrier`] the start barrier; one thread per client runs its
//! [`session`] over its [`resources`] and what all sessions share ([`shared`]); [`responder`]
//! is the data path, [`counts`] what reached the server.
mod barrier;
mod counts;
mod resources;
mod responder;
mod serve_config;
mod session;
mod shared;

use super::cm::Listener;
use crate::verbs::cm as verbs_cm;
use crate::verbs::{self, ProtectionDomain};
use barrier::StartBarrier;
pub use barrier::READY_LINE;
pub use serve_config::ServeConfig;
use session::session;
use shared::Shared;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;

/// Why `serve` ended badly.
#[derive(Debug)]
pub enum ServeError {
    /// The device or the port could not be used.
    Setup(String),
    /// With `once`: this many sessions failed (each already reported on stderr).
    Sessions(usize),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Setup(e) => f.write_str(e),
            ServeError::Sessions(n) => write!(f, "{n} session(s) failed"),
        }
    }
}

/// Opens the device, listens, and serves until stopped (or after one group with `once`).
pub fn serve(cfg: ServeConfig) -> Result<(), ServeError> {
    let setup = ServeError::Setup;
    // rdma_cm QPs must live on librdmacm's context of the device, so with --cm every QP does.
    let ctx = if cfg.cm {
        verbs_cm::open_device(cfg.device.as_deref())
    } else {
        verbs::open_device(cfg.device.as_deref())
    }
    .map_err(|e| setup(e.to_string()))?;
    let port = ctx.port(cfg.ib_port).map_err(|e| setup(e.to_string()))?;
    if !port.active {
        return Err(setup(format!(
            "{} port {} is not active",
            ctx.name(),
            cfg.ib_port
        )));
    }
    let gid_index = match cfg.gid_index {
        Some(i) => i,
        None => ctx
            .default_gid_index(cfg.ib_port)
            .map_err(|e| setup(e.to_string()))?,
    };
    let gid = ctx
        .gid(cfg.ib_port, gid_index)
        .map_err(|e| setup(e.to_string()))?;
    let limits = ctx.limits().map_err(|e| setup(e.to_string()))?;
    let pd = ProtectionDomain::new(&ctx).map_err(|e| setup(e.to_string()))?;
    let listener = TcpListener::bind((cfg.bind.as_str(), cfg.port))
        .map_err(|e| setup(format!("cannot listen on {}:{}: {e}", cfg.bind, cfg.port)))?;
    let cm = if cfg.cm {
        let addr = cm_address(&cfg, &gid).map_err(setup)?;
        Some(Listener::start(&ctx, addr).map_err(setup)?)
    } else {
        None
    };
    eprintln!(
        "ibjitter serve: listening on {}:{}{}, device {} port {} GID index {gid_index}, {} client(s) per start",
        cfg.bind,
        cfg.port,
        cm.as_ref()
            .map_or(String::new(), |l| format!(" and rdma_cm {}", l.addr)),
        ctx.name(),
        cfg.ib_port,
        cfg.clients
    );
    let shared = Arc::new(Shared {
        barrier: StartBarrier::new(cfg.clients, cfg.hold),
        cfg,
        ctx,
        pd,
        lid: port.lid,
        gid,
        gid_index,
        mtu: port.active_mtu,
        max_srq_wr: limits.max_srq_wr.max(1) as u32,
        limits,
        cm,
    });
    let mut sessions = Vec::new();
    let mut failures = 0;
    for (n, stream) in listener.incoming().enumerate() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ibjitter serve: accept failed: {e}");
                continue;
            }
        };
        let sh = shared.clone();
        let id = n + 1;
        sessions.push(std::thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            match session(stream, &sh, id) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("ibjitter serve: session {id} ({peer}): {e}");
                    false
                }
            }
        }));
        if shared.cfg.once && sessions.len() as u32 >= shared.cfg.clients {
            break;
        }
    }
    for s in sessions {
        if !s.join().unwrap_or(false) {
            failures += 1;
        }
    }
    if failures > 0 {
        return Err(ServeError::Sessions(failures));
    }
    Ok(())
}

/// Where the rdma_cm listener binds: `--bind` if it names an address, else the device's own
/// IPv4 address (from its GID), so requests are taken on this device only.
fn cm_address(cfg: &ServeConfig, gid: &[u8; 16]) -> Result<SocketAddr, String> {
    let bind: IpAddr = cfg
        .bind
        .parse()
        .map_err(|_| format!("--cm needs --bind to be an IP address, not {:?}", cfg.bind))?;
    let ip = match verbs_cm::gid_ipv4(gid) {
        Some(v4) if bind.is_unspecified() => IpAddr::V4(v4),
        _ => bind,
    };
    Ok(SocketAddr::new(ip, cfg.port))
}

//! The client's side before any message: the device, how flows spread over threads, one
//! [`Shard`] per thread with its flows' QPs (RC not connected yet, UD ready), and with `--cm`
//! an rdma_cm id per flow, already resolved toward the server.
use super::super::cm;
use super::super::fct::FctParams;
use super::super::ops::QpType;
use super::super::pacing::Arrival;
use super::super::pingpong;
use super::super::run_config::{Load, RunConfig};
use super::super::shard::{FlowLayout, Shard};
use super::super::stop::StopToken;
use super::super::wire::{FlowEndpoint, RunRequest};
use super::report::{rss_bytes, MemoryAtSetup};
use crate::verbs::cm::{ConnParams, EventChannel};
use crate::verbs::{
    self, mtu_bytes, AddressHandle, CompletionQueue, Context, DeviceLimits, PortInfo,
    ProtectionDomain, QpConfig, QueuePair,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

/// Everything the client made before meeting the server.
pub struct Local {
    pub ctx: Arc<Context>,
    /// UD's address handles are made on it once the server's QPs are known.
    pd: Arc<ProtectionDomain>,
    lid: u16,
    gid: [u8; 16],
    qp_cfg: QpConfig,
    /// One per thread; flow i is on shard i mod threads.
    pub shards: Vec<Shard>,
    /// With `--cm`: the channel the flows' rdma_cm ids report to.
    cm_channel: Option<Arc<EventChannel>>,
    /// Where the control connection goes (with `--cm`, the address the flows resolved).
    pub server_host: String,
    /// Open loop: operations per second per flow, and their arrival process.
    pub rate: Option<(f64, Arrival)>,
    /// Resident memory around the making of the flows.
    pub memory: MemoryAtSetup,
    /// `--fct`: the line rate (`--line-rate`, else the port's) and base latency.
    pub fct: Option<FctParams>,
}

/// Flow ids per thread (flow i on thread i mod T), send-queue depth, and the CQ entries each
/// thread's CQ needs.
struct Sizing {
    ids: Vec<Vec<u32>>,
    sq: u32,
    cqe: i64,
}

fn sizing(cfg: &RunConfig, max_cqe: i32) -> Result<Sizing, String> {
    let threads = cfg.threads.clamp(1, cfg.flows.max(1));
    let ids: Vec<Vec<u32>> = (0..threads)
        .map(|t| (t..cfg.flows).step_by(threads as usize).collect())
        .collect();
    let sq = cfg.depth.max(if cfg.pingpong {
        pingpong::MAX_UNREAPED_SENDS + 1
    } else {
        1
    });
    let per_flow_cqe = sq + u32::from(cfg.pingpong);
    let busiest = ids.iter().map(Vec::len).max().unwrap_or(0) as i64;
    let cqe = busiest * i64::from(per_flow_cqe) + 16;
    if cqe > i64::from(max_cqe) {
        return Err(format!(
            "{busiest} flows x depth {} need a {cqe}-entry CQ per thread, the device allows {max_cqe}: use more --threads or a lower --depth",
            cfg.depth
        ));
    }
    Ok(Sizing { ids, sq, cqe })
}

impl Local {
    /// Opens the device and makes every flow's QP and buffer. Set-up errors only.
    pub fn prepare(cfg: &RunConfig, stop: StopToken) -> Result<Local, String> {
        let ctx = if cfg.cm {
            verbs::cm::open_device(cfg.device.as_deref())
        } else {
            verbs::open_device(cfg.device.as_deref())
        }
        .map_err(|e| e.to_string())?;
        cfg.mix.validate(cfg.size, cfg.qp_type, cfg.pingpong)?;
        let limits = ctx.limits().map_err(|e| e.to_string())?;
        check_limits(cfg, ctx.name(), &limits)?;
        let port = ctx.port(cfg.ib_port).map_err(|e| e.to_string())?;
        if !port.active {
            return Err(format!("{} port {} is not active", ctx.name(), cfg.ib_port));
        }
        check_port(cfg, ctx.name(), &port)?;
        let gid_index = match cfg.gid_index {
            Some(i) => i,
            None => ctx
                .default_gid_index(cfg.ib_port)
                .map_err(|e| e.to_string())?,
        };
        let gid = ctx.gid(cfg.ib_port, gid_index).map_err(|e| e.to_string())?;
        // --line-rate stands in for the port's rate (--load, --fct).
        let line_gbps = cfg.line_gbps.unwrap_or(port.link_gbps);
        let rate = resolve_rate(cfg, line_gbps)?;
        let fct =
            match cfg.fct_base {
                None => None,
                Some(_) if line_gbps <= 0.0 => return Err(
                    "--fct needs the line rate, which this port does not report: give --line-rate"
                        .into(),
                ),
                Some(base) => Some(FctParams {
                    line_gbps,
                    base_ns: base.as_nanos() as u64,
                }),
            };
        let Sizing { ids, sq, cqe } = sizing(cfg, limits.max_cqe)?;
        let (max_rd_atomic, max_dest_rd_atomic) = limits.rd_atomic();
        let qp_cfg = QpConfig {
            max_send_wr: sq,
            max_recv_wr: 2,
            port: cfg.ib_port,
            gid_index,
            mtu: port.active_mtu,
            timeout: cfg.qp_timeout,
            max_rd_atomic,
            max_dest_rd_atomic,
            traffic_class: cfg.traffic_class,
            ..QpConfig::default()
        };
        // --cm: an rdma_cm id per flow, resolved toward the server's address from this
        // device's own address; the control connection then goes to that same address.
        // Nothing here needs the server up yet.
        let mut cm_flows = None;
        let mut server_host = cfg.server.clone();
        if cfg.cm {
            let ip = server_ip(&cfg.server)?;
            server_host = ip.to_string();
            let source = verbs::cm::gid_ipv4(&gid).map(IpAddr::V4);
            let interrupted = || stop.is_set();
            let (channel, cm_ids) = cm::resolve_flows(
                &ctx,
                source,
                SocketAddr::new(ip, cfg.port),
                cfg.flows,
                cfg.setup_timeout,
                &interrupted,
            )?;
            cm_flows = Some((channel, cm_ids.into_iter().map(Some).collect::<Vec<_>>()));
        }
        let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
        let ud = cfg.qp_type == QpType::Ud;
        let mut make_qp = |flow: u32, psn: u32, cq: &Arc<CompletionQueue>| match &mut cm_flows {
            // Ctrl-C: no further QP (thousands take seconds).
            _ if stop.is_set() => Err(verbs::Error::interrupted("ibv_create_qp")),
            Some((_, cm_ids)) => {
                let id = cm_ids[flow as usize].take().expect("one QP per flow");
                QueuePair::new_rc_cm(id, &pd, cq, cq, None, qp_cfg)
            }
            None if ud => QueuePair::new_ud(&pd, cq, cq, None, qp_cfg, psn),
            None => QueuePair::new_rc(&pd, cq, cq, None, qp_cfg),
        };
        let layout = flow_layout(cfg);
        let before_flows = rss_bytes();
        let shards = ids
            .iter()
            .map(|flow_ids| {
                Shard::new(
                    &ctx,
                    &pd,
                    flow_ids,
                    layout,
                    cqe as i32,
                    cfg.seed,
                    &mut make_qp,
                )
                .map_err(|e| format!("setting up {} flows: {e}", cfg.flows))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let memory = MemoryAtSetup {
            before_flows,
            after_flows: rss_bytes(),
            buffers: shards.iter().map(|s| s.mr.len() as u64).sum(),
        };
        Ok(Local {
            memory,
            lid: port.lid,
            gid,
            qp_cfg,
            shards,
            cm_channel: cm_flows.map(|(channel, _)| channel),
            server_host,
            rate,
            ctx,
            pd,
            fct,
        })
    }

    /// What we ask the server for: the run, and our endpoints in flow order.
    pub fn request(&self, cfg: &RunConfig, client: String) -> RunRequest {
        let mut ours = vec![None; cfg.flows as usize];
        for shard in &self.shards {
            for (i, f) in shard.flows.iter().enumerate() {
                let rd_atomic = self.qp_cfg.max_dest_rd_atomic;
                ours[f.id as usize] = Some(shard.endpoint(i, self.lid, self.gid, rd_atomic));
            }
        }
        RunRequest {
            client,
            mix: cfg.mix,
            qp_type: cfg.qp_type,
            size: cfg.size,
            depth: cfg.depth,
            pingpong: cfg.pingpong,
            cm: cfg.cm,
            flows: ours
                .into_iter()
                .map(|e| e.expect("every flow has a shard"))
                .collect(),
        }
    }

    /// Connects every flow's QP to the server's: through rdma_cm (with the session's
    /// `token`), or with the endpoints it sent (`theirs`, in flow order); UD QPs are ready
    /// already and get an address handle toward theirs. Then records where each flow writes.
    pub fn connect(
        &mut self,
        cfg: &RunConfig,
        theirs: &[FlowEndpoint],
        token: Option<u64>,
        stop: StopToken,
    ) -> Result<(), String> {
        let mut flows = self.shards.iter().flat_map(|s| &s.flows);
        match (&self.cm_channel, token) {
            (Some(channel), Some(token)) => {
                let params = ConnParams {
                    ack_timeout: cfg.qp_timeout,
                    retry_count: self.qp_cfg.retry_cnt,
                    rnr_retry: self.qp_cfg.rnr_retry,
                    srq: false,
                    initiator_depth: self.qp_cfg.max_rd_atomic,
                    responder_resources: self.qp_cfg.max_dest_rd_atomic,
                };
                let ids = flows.map(|f| {
                    let id = f.qp.cm_id().expect("--cm QPs are made on rdma_cm ids");
                    (f.id, id)
                });
                let interrupted = || stop.is_set();
                cm::connect_flows(channel, ids, token, params, cfg.setup_timeout, &interrupted)?;
            }
            (Some(_), None) => {
                return Err("the server accepted --cm without a session token".into())
            }
            (None, _) if cfg.qp_type == QpType::Ud => self.address_flows(theirs)?,
            (None, _) => flows.try_for_each(|f| {
                if stop.is_set() {
                    return Err(format!("interrupted while connecting flow {}", f.id));
                }
                f.qp.connect(&theirs[f.id as usize].qp, f.psn)
                    .map_err(|e| format!("connecting flow {}: {e}", f.id))
            })?,
        }
        for f in self.shards.iter_mut().flat_map(|s| &mut s.flows) {
            f.remote = Some(theirs[f.id as usize]);
        }
        Ok(())
    }

    /// UD: an address handle per distinct destination among the server's flow QPs (one
    /// server device: usually one for all), shared by the flows going there.
    fn address_flows(&mut self, theirs: &[FlowEndpoint]) -> Result<(), String> {
        let mut made: HashMap<(u16, [u8; 16]), Arc<AddressHandle>> = HashMap::new();
        for f in self.shards.iter_mut().flat_map(|s| &mut s.flows) {
            let peer = &theirs[f.id as usize].qp;
            let ah = match made.get(&(peer.lid, peer.gid)) {
                Some(ah) => ah.clone(),
                None => {
                    let (port, cfg) = (self.qp_cfg.port, &self.qp_cfg);
                    let ah = AddressHandle::new(
                        &self.pd,
                        port,
                        (cfg.gid_index, cfg.traffic_class),
                        peer,
                    )
                    .map(Arc::new)
                    .map_err(|e| format!("flow {}: {e}", f.id))?;
                    made.insert((peer.lid, peer.gid), ah.clone());
                    ah
                }
            };
            f.ah = Some(ah);
        }
        Ok(())
    }
}

/// A flow's share of its shard's buffer: with atomics, a result word per outstanding op.
fn flow_layout(cfg: &RunConfig) -> FlowLayout {
    FlowLayout {
        size: cfg.size,
        atomic_words: if cfg.mix.has_atomics() { cfg.depth } else { 0 },
    }
}

/// What the run asks of the port: a UD datagram fits one packet of its path MTU.
fn check_port(cfg: &RunConfig, device: &str, port: &PortInfo) -> Result<(), String> {
    let mtu = mtu_bytes(port.active_mtu);
    if cfg.qp_type == QpType::Ud && cfg.size > mtu {
        return Err(format!(
            "--qp-type ud: --size {} exceeds the path MTU of {device} port {}, {mtu} bytes \
             (active_mtu): a datagram is one packet",
            cfg.size, cfg.ib_port
        ));
    }
    Ok(())
}

/// The run against the device's limits, before anything is made on it: each error names the
/// limit (a QP beyond them failed deep in set-up, as "Invalid argument" or "Cannot allocate
/// memory", after minutes with thousands of flows).
fn check_limits(cfg: &RunConfig, device: &str, l: &DeviceLimits) -> Result<(), String> {
    if cfg.ib_port == 0 || cfg.ib_port > l.phys_port_cnt {
        return Err(format!(
            "--ib-port {}: {device} has port(s) 1..={}",
            cfg.ib_port, l.phys_port_cnt
        ));
    }
    if i64::from(cfg.flows) > i64::from(l.max_qp) {
        return Err(format!(
            "--flows {}: {device} allows at most {} QPs (max_qp)",
            cfg.flows, l.max_qp
        ));
    }
    if i64::from(cfg.depth) > i64::from(l.max_qp_wr) {
        return Err(format!(
            "--depth {}: {device} allows at most {} work requests per QP (max_qp_wr)",
            cfg.depth, l.max_qp_wr
        ));
    }
    let threads = cfg.threads.min(cfg.flows);
    if i64::from(threads) > i64::from(l.max_cq) {
        return Err(format!(
            "--threads {threads}: {device} allows at most {} CQs (max_cq), one per thread",
            l.max_cq
        ));
    }
    // Each thread registers one buffer: a send and a receive slot per flow (and with
    // atomics, a result word per outstanding op).
    let flows_per_thread = u64::from(cfg.flows.div_ceil(threads.max(1)));
    let per_flow = flow_layout(cfg).flow_bytes() as u64;
    let buffer = per_flow * flows_per_thread;
    if buffer > l.max_mr_size {
        return Err(format!(
            "{flows_per_thread} flows x {per_flow} B (2 x --size {}) per thread need a \
             {buffer}-byte memory region, {device} allows {} (max_mr_size): use more \
             --threads or a smaller --size",
            cfg.size, l.max_mr_size
        ));
    }
    if let Some(atomic) = cfg
        .mix
        .ops()
        .find(|op| op.is_atomic())
        .filter(|_| !l.atomics)
    {
        return Err(format!(
            "--op {}: {device} does not execute atomics (atomic_cap IBV_ATOMIC_NONE)",
            atomic.key()
        ));
    }
    Ok(())
}

/// Open-loop rate per flow, if any: `--rate` directly, or `--load` of the link shared by all flows.
fn resolve_rate(cfg: &RunConfig, link_gbps: f64) -> Result<Option<(f64, Arrival)>, String> {
    Ok(match cfg.load {
        Load::Closed => None,
        Load::Open { ops_per_s, arrival } => Some((ops_per_s, arrival)),
        Load::LinkFraction { fraction, arrival } => {
            if link_gbps <= 0.0 {
                return Err(
                    "--load needs the link rate, which this port does not report: use --rate or --line-rate"
                        .into(),
                );
            }
            let mean_size = cfg.sizes.as_ref().map_or(f64::from(cfg.size), |s| s.mean());
            let total_ops = fraction * link_gbps * 1e9 / 8.0 / mean_size;
            Some((total_ops / f64::from(cfg.flows), arrival))
        }
    })
}

/// The server's address for rdma_cm: the name's first IPv4 address, else its first address.
fn server_ip(server: &str) -> Result<IpAddr, String> {
    let addrs: Vec<IpAddr> = (server, 0)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {server}: {e}"))?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{server} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_spread_round_robin_and_the_cq_is_sized_for_the_busiest_thread() {
        let cfg = RunConfig {
            flows: 10,
            threads: 4,
            depth: 8,
            ..RunConfig::default()
        };
        let s = sizing(&cfg, 1 << 20).unwrap();
        assert_eq!(
            s.ids,
            [vec![0, 4, 8], vec![1, 5, 9], vec![2, 6], vec![3, 7]]
        );
        assert_eq!((s.sq, s.cqe), (8, 3 * 8 + 16));
        // More threads than flows: one flow each.
        let few = RunConfig {
            flows: 2,
            threads: 8,
            ..RunConfig::default()
        };
        assert_eq!(sizing(&few, 1 << 20).unwrap().ids.len(), 2);
        let err = sizing(&cfg, 20).err().unwrap();
        assert!(
            err.contains("40-entry CQ") && err.contains("--threads"),
            "{err}"
        );
    }
}

//! `ibjitter run`: sets up every flow, meets the server, starts all flows together, watches
//! for Ctrl-C and a lost peer while the threads work, and gathers what they measured.
use super::cm;
use super::progress::{self, Counters};
use super::shard::Shard;
use super::stats::{merge_into, new_histogram, FlowStats};
use super::stop::{self, Reason};
use super::wire::{self, FlowEndpoint, Message, RunRequest, PROTOCOL_VERSION};
use super::worker::{self, WorkerOutput, WorkerParams};
use super::{pingpong, Load, RunConfig, StopAt};
use crate::report::{gbps, hist, jain, spread_us, FlowReport, Latency, Outcome, RunReport, Totals};
use crate::verbs::cm::{ConnParams, EventChannel};
use crate::verbs::{self, CompletionQueue, ProtectionDomain, QpConfig, QueuePair};
use hdrhistogram::Histogram;
use std::io::{IsTerminal, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

/// A run's report plus the raw data the exports need.
pub struct RunOutput {
    pub report: RunReport,
    pub flows: Vec<FlowStats>,
    /// Latency over all flows, one histogram per `hdr_interval`.
    pub intervals: Vec<Histogram<u64>>,
    /// Wall-clock time of the common start, for the HdrHistogram log.
    pub start_time: std::time::SystemTime,
}

/// Runs the configured traffic. Errors are set-up failures (nothing measured yet); once
/// traffic has started, every ending — complete, Ctrl-C, lost peer, QP errors — is a report.
pub fn run(cfg: &RunConfig) -> Result<RunOutput, String> {
    let t_begin = Instant::now();
    stop::reset();
    let ctx = if cfg.cm {
        verbs::cm::open_device(cfg.device.as_deref())
    } else {
        verbs::open_device(cfg.device.as_deref())
    }
    .map_err(|e| e.to_string())?;
    let port = ctx.port(cfg.ib_port).map_err(|e| e.to_string())?;
    if !port.active {
        return Err(format!("{} port {} is not active", ctx.name(), cfg.ib_port));
    }
    let gid_index = match cfg.gid_index {
        Some(i) => i,
        None => ctx
            .default_gid_index(cfg.ib_port)
            .map_err(|e| e.to_string())?,
    };
    let gid = ctx.gid(cfg.ib_port, gid_index).map_err(|e| e.to_string())?;
    let limits = ctx.limits().map_err(|e| e.to_string())?;
    let rate = resolve_rate(cfg, port.link_gbps)?;

    // Flow i goes to thread i mod T: each thread owns its flows and their CQ.
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
    if cqe > i64::from(limits.max_cqe) {
        return Err(format!(
            "{busiest} flows x depth {} need a {cqe}-entry CQ per thread, the device allows {}: use more --threads or a lower --depth",
            cfg.depth, limits.max_cqe
        ));
    }
    let qp_cfg = QpConfig {
        max_send_wr: sq,
        max_recv_wr: 2,
        port: cfg.ib_port,
        gid_index,
        mtu: port.active_mtu,
        timeout: cfg.qp_timeout,
        ..QpConfig::default()
    };
    let interrupted = || stop::requested().is_some();
    // --cm: an rdma_cm id per flow, resolved toward the server's address from this device's
    // own address; the control connection then goes to that same address. Nothing here
    // needs the server up yet, and the server's wait for Hello starts only once all is made.
    let mut cm_flows = None;
    let mut server_host = cfg.server.clone();
    if cfg.cm {
        let ip = server_ip(&cfg.server)?;
        server_host = ip.to_string();
        let server = SocketAddr::new(ip, cfg.port);
        let source = verbs::cm::gid_ipv4(&gid).map(IpAddr::V4);
        let (channel, cm_ids) = cm::resolve_flows(
            &ctx,
            source,
            server,
            cfg.flows,
            cfg.setup_timeout,
            &interrupted,
        )?;
        cm_flows = Some((channel, cm_ids.into_iter().map(Some).collect::<Vec<_>>()));
    }
    let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
    let mut make_qp = |flow: u32, cq: &Arc<CompletionQueue>| match &mut cm_flows {
        Some((_, cm_ids)) => {
            let id = cm_ids[flow as usize].take().expect("one QP per flow");
            QueuePair::new_rc_cm(id, &pd, cq, cq, None, qp_cfg)
        }
        None => QueuePair::new_rc(&pd, cq, cq, None, qp_cfg),
    };
    let mut shards = Vec::with_capacity(ids.len());
    for flow_ids in &ids {
        let shard = Shard::new(
            &ctx,
            &pd,
            flow_ids,
            cfg.size,
            cqe as i32,
            cfg.seed,
            &mut make_qp,
        )
        .map_err(|e| format!("setting up {} flows: {e}", cfg.flows))?;
        shards.push(shard);
    }

    let mut stream = connect(&server_host, cfg.port, cfg.setup_timeout)?;
    // The exchange: our endpoints in flow order, the server's back in the same order.
    let mut ours = vec![None; cfg.flows as usize];
    for shard in &shards {
        for (i, f) in shard.flows.iter().enumerate() {
            ours[f.id as usize] = Some(shard.endpoint(i, port.lid, gid));
        }
    }
    let request = RunRequest {
        client: format!("{}:{}", hostname(), std::process::id()),
        op: cfg.op,
        size: cfg.size,
        depth: cfg.depth,
        pingpong: cfg.pingpong,
        cm: cfg.cm,
        flows: ours
            .into_iter()
            .map(|e| e.expect("every flow has a shard"))
            .collect(),
    };
    wire::send(
        &mut stream,
        &Message::Hello {
            version: PROTOCOL_VERSION,
            run: request,
        },
    )
    .map_err(|e| format!("sending to the server: {e}"))?;
    let (theirs, token) = match wire::recv(&mut stream, Some(cfg.setup_timeout), "Accept")
        .map_err(|e| e.to_string())?
    {
        Message::Accept { flows, cm_token } if flows.len() == cfg.flows as usize => {
            (flows, cm_token)
        }
        Message::Accept { flows, .. } => {
            return Err(format!(
                "server accepted {} flows, we asked for {}",
                flows.len(),
                cfg.flows
            ))
        }
        Message::Reject { reason } => return Err(format!("server refused the run: {reason}")),
        other => return Err(format!("expected Accept from the server, got {other:?}")),
    };
    let channel = cm_flows.as_ref().map(|(channel, _)| channel);
    connect_qps(&shards, &theirs, channel, token, cfg, &qp_cfg)?;
    for f in shards.iter_mut().flat_map(|s| &mut s.flows) {
        f.remote = Some(theirs[f.id as usize]);
    }
    wire::send(&mut stream, &Message::Ready).map_err(|e| format!("sending to the server: {e}"))?;

    // Threads wait at a barrier; the server's Go releases them all at once.
    let params = WorkerParams {
        op: cfg.op,
        size: cfg.size,
        depth: cfg.depth,
        stop: cfg.stop,
        rate,
        interval_ns: cfg.interval.as_nanos().max(1) as u64,
        hdr_interval_ns: cfg.hdr_interval.as_nanos().max(1) as u64,
        warmup_ns: cfg.warmup.as_nanos() as u64,
        seed: cfg.seed,
    };
    let counters: Vec<Counters> = shards.iter().map(|_| Counters::default()).collect();
    let release = Barrier::new(shards.len() + 1);
    let t0: OnceLock<(Instant, std::time::SystemTime)> = OnceLock::new();
    let mut setup_s = 0.0;
    let mut go_error = None;
    let outputs: Vec<WorkerOutput> = std::thread::scope(|scope| {
        let handles: Vec<_> = shards
            .iter()
            .zip(&counters)
            .map(|(shard, c)| {
                let (release, t0, params) = (&release, &t0, &params);
                let pingpong = cfg.pingpong;
                scope.spawn(move || {
                    release.wait();
                    let Some(&(start, _)) = t0.get() else {
                        return WorkerOutput {
                            flows: Vec::new(),
                            intervals: Vec::new(),
                        };
                    };
                    if pingpong {
                        pingpong::run(shard, params, start, c)
                    } else {
                        worker::run(shard, params, start, c)
                    }
                })
            })
            .collect();
        match wire::recv(&mut stream, Some(cfg.start_timeout), "Go") {
            Ok(Message::Go) => {
                let _ = t0.set((Instant::now(), std::time::SystemTime::now()));
                setup_s = t_begin.elapsed().as_secs_f64();
                release.wait();
                monitor(&mut stream, &handles, &counters, cfg);
            }
            other => {
                go_error = Some(match other {
                    Ok(m) => format!("expected Go from the server, got {m:?}"),
                    Err(e) => e.to_string(),
                });
                release.wait(); // t0 unset: the threads return at once
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    });
    if let Some(e) = go_error {
        return Err(e);
    }
    let (_, start_time) = *t0.get().expect("started");

    let mut flows: Vec<FlowStats> = Vec::with_capacity(cfg.flows as usize);
    let mut intervals: Vec<Histogram<u64>> = Vec::new();
    for out in outputs {
        flows.extend(out.flows);
        for (k, h) in out.intervals.into_iter().enumerate() {
            if k >= intervals.len() {
                intervals.resize_with(k + 1, new_histogram);
            }
            intervals[k].add(&h).expect("same histogram bounds");
        }
    }
    flows.sort_by_key(|f| f.flow);

    let (ops, bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
    let server_received = if stop::requested() == Some(Reason::PeerLost) {
        None
    } else {
        farewell(&mut stream, ops, bytes)
    };
    let measured_s = flows
        .iter()
        .map(|f| f.last_completion_ns)
        .max()
        .unwrap_or(0) as f64
        / 1e9;
    let run = Measured {
        setup_s,
        measured_s: measured_s.max(f64::MIN_POSITIVE),
        rss: peak_rss_bytes(),
        server_received_bytes: server_received,
        start: start_time,
    };
    let report = build_report(cfg, ctx.name(), &flows, &run);
    Ok(RunOutput {
        report,
        flows,
        intervals,
        start_time,
    })
}

/// Connects every flow's QP to the server's: through rdma_cm (`channel`, with the session's
/// `token`), or with the endpoints it sent (`theirs`, in flow order).
fn connect_qps(
    shards: &[Shard],
    theirs: &[FlowEndpoint],
    channel: Option<&Arc<EventChannel>>,
    token: Option<u64>,
    cfg: &RunConfig,
    qp_cfg: &QpConfig,
) -> Result<(), String> {
    let mut flows = shards.iter().flat_map(|s| &s.flows);
    match (channel, token) {
        (Some(channel), Some(token)) => {
            let params = ConnParams {
                ack_timeout: cfg.qp_timeout,
                retry_count: qp_cfg.retry_cnt,
                rnr_retry: qp_cfg.rnr_retry,
                srq: false,
            };
            let ids = flows.map(|f| {
                let id = f.qp.cm_id().expect("--cm QPs are made on rdma_cm ids");
                (f.id, id)
            });
            let interrupted = || stop::requested().is_some();
            cm::connect_flows(channel, ids, token, params, cfg.setup_timeout, &interrupted)
        }
        (Some(_), None) => Err("the server accepted --cm without a session token".into()),
        (None, _) => flows.try_for_each(|f| {
            f.qp.connect(&theirs[f.id as usize].qp, f.psn)
                .map_err(|e| format!("connecting flow {}: {e}", f.id))
        }),
    }
}

/// Open-loop rate per flow, if any: `--rate` directly, or `--load` of the link shared by all flows.
fn resolve_rate(
    cfg: &RunConfig,
    link_gbps: f64,
) -> Result<Option<(f64, super::pacing::Arrival)>, String> {
    Ok(match cfg.load {
        Load::Closed => None,
        Load::Open { ops_per_s, arrival } => Some((ops_per_s, arrival)),
        Load::LinkFraction { fraction, arrival } => {
            if link_gbps <= 0.0 {
                return Err(
                    "--load needs the link rate, which this port does not report: use --rate"
                        .into(),
                );
            }
            let total_ops = fraction * link_gbps * 1e9 / 8.0 / f64::from(cfg.size);
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

/// Connects to the server, retrying until `timeout`: in an incast the receiver may still be
/// starting when the senders are launched.
fn connect(server: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let addrs: Vec<_> = (server, port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {server}: {e}"))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() >= deadline || stop::requested().is_some() {
            return Err(format!(
                "cannot connect to ibjitter serve at {server}:{port} (tried for {timeout:?}): {}",
                last.map_or("no address".into(), |e| e.to_string())
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// While the threads work: watch the server's connection (it only closes if the server dies)
/// and draw the progress line on a terminal.
fn monitor<T>(
    stream: &mut TcpStream,
    handles: &[std::thread::ScopedJoinHandle<'_, T>],
    counters: &[Counters],
    cfg: &RunConfig,
) {
    let started = Instant::now();
    let show = cfg.progress && std::io::stderr().is_terminal() && expected_long(cfg);
    let mut last = (0u64, Instant::now());
    let mut shown = false;
    let _ = stream.set_nonblocking(true);
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        let mut probe = [0u8; 1];
        match stream.peek(&mut probe) {
            Ok(0) => stop::request(Reason::PeerLost),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => stop::request(Reason::PeerLost),
            _ => {}
        }
        if show && last.1.elapsed() >= Duration::from_millis(500) {
            let (ops, bytes) = progress::totals(counters);
            let rate = gbps(bytes - last.0, last.1.elapsed().as_secs_f64());
            eprint!(
                "{}",
                progress::line(started.elapsed().as_secs_f64(), ops, rate, cfg.flows)
            );
            let _ = std::io::stderr().flush();
            last = (bytes, Instant::now());
            shown = true;
        }
    }
    if shown {
        eprintln!();
    }
    let _ = stream.set_nonblocking(false);
    // Drain anything unexpected the server wrote.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1)));
    let _ = stream.read(&mut [0u8; 0]);
}

fn expected_long(cfg: &RunConfig) -> bool {
    match cfg.stop {
        StopAt::Duration(d) => d > Duration::from_secs(2),
        StopAt::Iters(_) => true,
    }
}

/// Tells the server we are done and returns the bytes it received, if it answers.
fn farewell(stream: &mut TcpStream, ops: u64, bytes: u64) -> Option<u64> {
    wire::send(stream, &Message::Done { ops, bytes }).ok()?;
    match wire::recv(stream, Some(Duration::from_secs(10)), "Bye") {
        Ok(Message::Bye { received_bytes, .. }) => Some(received_bytes),
        _ => None,
    }
}

/// What the run measured besides the flows themselves.
struct Measured {
    setup_s: f64,
    measured_s: f64,
    rss: u64,
    server_received_bytes: Option<u64>,
    start: std::time::SystemTime,
}

fn build_report(cfg: &RunConfig, device: &str, flows: &[FlowStats], run: &Measured) -> RunReport {
    let &Measured {
        setup_s,
        measured_s,
        rss,
        server_received_bytes,
        start,
    } = run;
    let mut all = new_histogram();
    for f in flows {
        merge_into(&mut all, &f.latency);
    }
    let firsts: Vec<u64> = flows.iter().filter_map(|f| f.first_post_ns).collect();
    let skew = spread_us(&firsts);
    let per_flow: Vec<FlowReport> = flows
        .iter()
        .map(|f| FlowReport {
            flow: f.flow,
            ops: f.ops,
            bytes: f.bytes,
            gbps: gbps(f.bytes, measured_s),
            status: f.error.clone().unwrap_or_else(|| "ok".into()),
            first_post_ns: f.first_post_ns,
            latency: Latency::of(&f.latency),
            series: cfg.json_series.then(|| f.series.clone()),
        })
        .collect();
    let rates: Vec<f64> = per_flow.iter().map(|f| f.gbps).collect();
    let (ops, bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
    let outcome = match stop::requested() {
        Some(Reason::Interrupted) => Outcome::Interrupted,
        Some(Reason::PeerLost) => Outcome::PeerLost,
        None if flows.iter().any(|f| f.error.is_some()) => Outcome::FlowErrors,
        None => Outcome::Completed,
    };
    RunReport {
        tool: format!("ibjitter {}", crate::VERSION),
        device: device.to_string(),
        server: format!("{}:{}", cfg.server, cfg.port),
        op: cfg.op.name().to_string(),
        mode: if cfg.pingpong {
            "pingpong".into()
        } else if matches!(cfg.load, Load::Closed) {
            "closed".into()
        } else {
            "open".into()
        },
        size: cfg.size,
        depth: cfg.depth,
        threads: cfg.threads,
        flows_requested: cfg.flows,
        flows_started: flows.iter().filter(|f| f.first_post_ns.is_some()).count() as u32,
        connection: if cfg.cm { "rdma_cm" } else { "tcp" }.into(),
        setup_s,
        start_skew_us: skew,
        start_unix_ns: start
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        series_interval_s: cfg.interval.as_secs_f64(),
        warmup_s: cfg.warmup.as_secs_f64(),
        duration_s: measured_s,
        outcome,
        total: Totals::new(ops, bytes, measured_s, &all),
        fairness: jain(&rates),
        rss_per_flow_bytes: rss / u64::from(cfg.flows.max(1)),
        server_received_bytes,
        histogram: hist::encode(&all),
        flows: per_flow,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// This process's peak resident memory (VmHWM), in bytes: buffers, QPs, and the histograms
/// and time series as they grew during the run.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

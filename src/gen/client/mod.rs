//! `ibjitter run`, as its pipeline: set up every flow ([`setup`]), exchange endpoints with
//! the server, start all flows together and watch them ([`threads`]), gather what they
//! measured into the report ([`report`]).
mod report;
mod setup;
mod threads;

use super::cpus;
use super::fct::FctBuckets;
use super::intervals::Outputs;
use super::port_counters::PortCounters;
pub use super::run_config::steady_window_ns;
use super::run_config::RunConfig;
use super::stats::{new_histogram, ByOp, FlowStats};
use super::stop::{Reason, StopToken};
use super::wire::{Control, OpCount};
use super::worker::WorkerParams;
use crate::report::fct::FctReport;
use crate::report::{hist, RunReport, ThreadReport};
use setup::Local;
use std::path::Path;
use std::time::{Instant, SystemTime};

/// A run's report plus the raw data the exports need.
pub struct RunOutput {
    pub report: RunReport,
    pub flows: Vec<FlowStats>,
    /// Wall-clock time of the common start.
    pub start_time: SystemTime,
    /// Writing the streamed time series or HdrHistogram log failed (the run went on).
    pub stream_error: Option<String>,
}

/// Why a run measured nothing.
#[derive(Debug)]
pub enum RunError {
    /// Set-up failed: the device, the server (unreachable, or it refused the run), a QP.
    Setup(String),
    /// Ctrl-C came before the start.
    Interrupted(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Setup(e) | RunError::Interrupted(e) => f.write_str(e),
        }
    }
}

/// Runs the configured traffic, streaming the time series and latency log to `outputs` as
/// it goes. Errors mean nothing was measured; once traffic has started, every ending —
/// complete, Ctrl-C or a lost peer (on `stop`), QP errors — is a report.
pub fn run(cfg: &RunConfig, stop: StopToken, outputs: Outputs) -> Result<RunOutput, RunError> {
    let t_begin = Instant::now();
    let cpus = cpus::allowed().len() as u32;
    let threads = cfg.threads.clamp(1, cfg.flows.max(1));
    if threads > cpus {
        eprintln!(
            "ibjitter run: warning: {threads} polling threads on {cpus} CPU(s): they take turns, \
             and latencies include waiting for a CPU (--threads auto takes one per CPU)"
        );
    }
    let why = |e: String| {
        if stop.requested() == Some(Reason::Interrupted) {
            RunError::Interrupted(e)
        } else {
            RunError::Setup(e)
        }
    };
    let mut local = Local::prepare(cfg, stop).map_err(why)?;
    let interrupted = || stop.is_set();
    let mut control = Control::connect(
        &local.server_host,
        cfg.port,
        cfg.setup_timeout,
        &interrupted,
    )
    .map_err(why)?
    .stop_on(stop);
    exchange(cfg, &mut local, &mut control, stop).map_err(why)?;
    let params = worker_params(cfg, &local, stop);
    // The NIC's counters over the measured phase (and every interval with --counters).
    let port = PortCounters::open(Path::new("/sys"), local.ctx.name(), cfg.ib_port);
    let before = port.read();
    let finished =
        threads::start_and_watch(cfg, &local.shards, &params, &mut control, outputs, &port)
            .map_err(why)?;
    let after = port.read();
    let setup_s = finished.start.duration_since(t_begin).as_secs_f64();
    let mut out = gather(cfg, &local, &mut control, finished, setup_s, stop);
    out.report.port_counters = port.deltas(&before, &after);
    Ok(out)
}

/// Our endpoints out, the server's back; our QPs connected to its; then Ready.
fn exchange(
    cfg: &RunConfig,
    local: &mut Local,
    control: &mut Control,
    stop: StopToken,
) -> Result<(), String> {
    let client = format!("{}:{}", report::hostname(), std::process::id());
    let (theirs, token) = control.hello(local.request(cfg, client), cfg.setup_timeout)?;
    local.connect(cfg, &theirs, token, stop)?;
    control.ready()
}

fn worker_params(cfg: &RunConfig, local: &Local, stop: StopToken) -> WorkerParams {
    WorkerParams {
        mix: cfg.mix,
        size: cfg.size,
        depth: cfg.depth,
        stop: cfg.stop,
        rate: local.rate,
        signal_every: cfg.signal_every,
        kept_series_ns: cfg
            .json_series
            .then(|| cfg.interval.as_nanos().max(1) as u64),
        warmup_ns: cfg.warmup.as_nanos() as u64,
        steady_ns: steady_window_ns(cfg),
        seed: cfg.seed,
        stop_token: stop,
        sizes: cfg.sizes.clone(),
        fct: local.fct,
    }
}

/// Merges the threads' flows, asks the server what it received (unless it is gone), and
/// builds the report.
fn gather(
    cfg: &RunConfig,
    local: &Local,
    control: &mut Control,
    finished: threads::Finished,
    setup_s: f64,
    stop: StopToken,
) -> RunOutput {
    let threads::Finished {
        outputs,
        pinned,
        start_time,
        stream_error,
        latency_intervals,
        ..
    } = finished;
    let mut flows: Vec<FlowStats> = Vec::with_capacity(cfg.flows as usize);
    let mut latency = new_histogram();
    let mut by_op = ByOp::default();
    let mut steady_spans = Vec::with_capacity(outputs.len());
    let mut per_thread = Vec::with_capacity(outputs.len());
    let mut fct: Option<FctBuckets> = None;
    for (t, (out, cpu)) in outputs.into_iter().zip(pinned).enumerate() {
        steady_spans.push(out.steady);
        if let Some(b) = &out.fct {
            fct.get_or_insert_with(FctBuckets::default).add(b);
        }
        let (ops, bytes) = (out.flows.iter()).fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
        per_thread.push(ThreadReport {
            thread: t as u32,
            cpu,
            flows: out.flows.len() as u32,
            ops,
            bytes,
            gbps: 0.0, // once the measured time is known
        });
        flows.extend(out.flows);
        latency.add(&out.latency).expect("histograms grow to fit");
        for (all, thread) in by_op.iter_mut().zip(&out.by_op) {
            all.add(thread);
        }
    }
    flows.sort_by_key(|f| f.flow);

    let (ops, bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
    let counts = cfg
        .mix
        .ops()
        .map(|op| OpCount {
            op,
            ops: by_op[op.index()].ops,
            bytes: by_op[op.index()].bytes,
        })
        .collect();
    let answer = if stop.requested() == Some(Reason::PeerLost) {
        None
    } else {
        control.done(ops, bytes, counts)
    };
    let (server_received, server_counts) = match answer {
        Some((bytes, counts)) => (Some(bytes), counts),
        None => (None, None),
    };
    let measured_s = flows
        .iter()
        .map(|f| f.last_completion_ns)
        .max()
        .unwrap_or(0) as f64
        / 1e9;
    let measured = report::Measured {
        setup_s,
        measured_s: measured_s.max(f64::MIN_POSITIVE),
        rss: report::peak_rss_bytes(),
        memory: local.memory,
        server_received_bytes: server_received,
        server_counts,
        start: start_time,
        rate_per_flow: local.rate.map(|(ops_per_s, _)| ops_per_s),
        steady_spans,
        per_thread: per_thread
            .into_iter()
            .map(|t| ThreadReport {
                gbps: crate::report::gbps(t.bytes, measured_s.max(f64::MIN_POSITIVE)),
                ..t
            })
            .collect(),
        cpus: cpus::allowed().len() as u32,
        fct: local.fct.zip(fct).map(|(p, b)| FctReport::of(p, &b)),
    };
    let mut report = report::build_report(
        cfg,
        local.ctx.name(),
        &flows,
        (&latency, &by_op),
        &measured,
        stop,
    );
    if cfg.json_series {
        report.latency_interval_s = cfg.hdr_interval.as_secs_f64();
        report.latency_intervals = Some(latency_intervals.iter().map(hist::encode).collect());
    }
    RunOutput {
        report,
        flows,
        start_time,
        stream_error,
    }
}

//! The run's report from what the flows measured.
use super::super::stats::FlowStats;
use super::super::stop::{Reason, StopToken};
use super::super::{Load, RunConfig};
use crate::report::{
    gbps, hist, jain, spread_us, FlowReport, Latency, MemoryPerFlow, OpenLoop, Outcome, RunReport,
    Steady, Totals,
};
use hdrhistogram::Histogram;

/// Resident memory before and after the flows' verbs objects were made, and what of it is
/// the flows' registered buffers (ours, by construction).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryAtSetup {
    pub before_flows: u64,
    pub after_flows: u64,
    pub buffers: u64,
}

impl MemoryAtSetup {
    /// Per flow: the provider's queues (what making the QPs and CQs added, less our buffers),
    /// our buffers, and what the run itself added by its peak (our histograms, counters,
    /// streams).
    fn per_flow(&self, peak: u64, flows: u32) -> MemoryPerFlow {
        let n = u64::from(flows.max(1));
        let made = self.after_flows.saturating_sub(self.before_flows);
        MemoryPerFlow {
            baseline_bytes: self.before_flows / n,
            provider_queues_bytes: made.saturating_sub(self.buffers) / n,
            buffers_bytes: self.buffers / n,
            run_state_bytes: peak.saturating_sub(self.after_flows) / n,
        }
    }
}

/// What the run measured besides the flows themselves.
pub struct Measured {
    pub setup_s: f64,
    pub measured_s: f64,
    pub rss: u64,
    /// Resident memory around the set-up of the flows.
    pub memory: MemoryAtSetup,
    pub server_received_bytes: Option<u64>,
    pub start: std::time::SystemTime,
    /// Open loop: the rate each flow was paced at (`--rate`, or `--load` resolved).
    pub rate_per_flow: Option<f64>,
}

pub fn build_report(
    cfg: &RunConfig,
    device: &str,
    flows: &[FlowStats],
    all: &Histogram<u64>,
    run: &Measured,
    stop: StopToken,
) -> RunReport {
    let &Measured {
        setup_s,
        measured_s,
        rss,
        memory,
        server_received_bytes,
        start,
        rate_per_flow,
    } = run;
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
            in_flight: f.in_flight,
            missed: f.missed,
            series: cfg.json_series.then(|| f.series.clone()),
        })
        .collect();
    let rates: Vec<f64> = per_flow.iter().map(|f| f.gbps).collect();
    let (ops, bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
    let (steady_ops, steady_bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.steady_ops, b + f.steady_bytes));
    let (from_ns, until_ns) = super::steady_window_ns(cfg);
    let steady = Steady::new(
        from_ns as f64 / 1e9,
        (until_ns as f64 / 1e9).min(measured_s),
        steady_ops,
        steady_bytes,
    );
    let open_loop = rate_per_flow
        .filter(|_| !cfg.pingpong)
        .map(|rate| OpenLoop::new(rate, &per_flow, measured_s));
    let outcome = match stop.requested() {
        Some(Reason::Interrupted) => Outcome::Interrupted,
        Some(Reason::PeerLost) => Outcome::PeerLost,
        None if flows.iter().any(|f| f.error.is_some()) => Outcome::FlowErrors,
        None if open_loop.as_ref().is_some_and(OpenLoop::overloaded) => Outcome::Overloaded,
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
        signal_every: cfg.signal_every,
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
        open_loop,
        total: Totals::new(ops, bytes, measured_s, all),
        steady,
        fairness: jain(&rates),
        rss_per_flow_bytes: rss / u64::from(cfg.flows.max(1)),
        memory_per_flow: memory.per_flow(rss, cfg.flows),
        server_received_bytes,
        histogram: hist::encode(all),
        latency_intervals: None,
        latency_interval_s: 0.0,
        flows: per_flow,
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// This process's peak resident memory (VmHWM), in bytes: buffers, QPs, and the histograms
/// and time series as they grew during the run.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// This process's resident memory now (VmRSS), in bytes.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// A `/proc/self/status` field in KiB (0 if unreadable).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

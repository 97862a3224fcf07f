//! The run's report from what the flows measured (and the server said).
use super::super::ops::{Op, QpType, FETCH_ADD_ADDEND};
use super::super::run_config::{steady_window_ns, Load, RunConfig};
use super::super::stats::{ByOp, FlowStats, SteadySpan};
use super::super::stop::{Reason, StopToken};
use super::super::wire::{CountedAt, ServerCounts};
use crate::report::fct::{FctReport, SizesReport};
use crate::report::ops::{CmpSwapCheck, FetchAddCheck, OpReport, ServerOpReport, ServerReport};
use crate::report::{
    gbps, hist, jain, spread_us, FlowReport, Latency, MemoryPerFlow, OpenLoop, Outcome, RunReport,
    Steady, ThreadReport, Totals,
};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

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
    /// The server's counts by op and its atomic words (a server that answered).
    pub server_counts: Option<ServerCounts>,
    pub start: std::time::SystemTime,
    /// Open loop: the rate each flow was paced at (`--rate`, or `--load` resolved).
    pub rate_per_flow: Option<f64>,
    /// Each thread's completions in the steady-state window, between completion events.
    pub steady_spans: Vec<SteadySpan>,
    /// Each thread's flows and CPU.
    pub per_thread: Vec<ThreadReport>,
    /// CPUs the process may run on.
    pub cpus: u32,
    /// `--fct`: the threads' buckets, merged.
    pub fct: Option<FctReport>,
}

/// `latency`: every operation's, and by op type.
pub fn build_report(
    cfg: &RunConfig,
    device: &str,
    flows: &[FlowStats],
    latency: (&Histogram<u64>, &ByOp),
    run: &Measured,
    stop: StopToken,
) -> RunReport {
    let (all, by_op) = latency;
    let &Measured {
        setup_s,
        measured_s,
        rss,
        memory,
        server_received_bytes,
        ref server_counts,
        start,
        rate_per_flow,
        ..
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
    let (from_ns, until_ns) = steady_window_ns(cfg);
    let steady = Steady::new(
        from_ns as f64 / 1e9,
        (until_ns as f64 / 1e9).min(measured_s),
        steady_ops,
        steady_bytes,
    )
    .between_completions(&run.steady_spans);
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
        op: cfg.mix.name(),
        qp_type: cfg.qp_type.key().into(),
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
        threads: run.per_thread.len() as u32,
        cpus: run.cpus,
        per_thread: run.per_thread.clone(),
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
        ops: op_reports(cfg, by_op),
        server_counts: server_counts
            .as_ref()
            .map(|counts| server_report(cfg, by_op, counts)),
        histogram: hist::encode(all),
        latency_intervals: None,
        latency_interval_s: 0.0,
        port_counters: BTreeMap::new(),
        sizes: cfg.sizes.as_ref().map(|d| SizesReport {
            spec: d.dist.describe(),
            scale: d.scale,
            mean_bytes: d.mean(),
            max_bytes: d.max(),
            drawn_mean_bytes: bytes as f64 / (ops as f64).max(1.0),
        }),
        fct: run.fct.clone(),
        flows: per_flow,
    }
}

/// Every op of the run's mix, by key: an op drawn but never completed shows its zero.
fn op_reports(cfg: &RunConfig, by_op: &ByOp) -> BTreeMap<String, OpReport> {
    let mixed = cfg.mix.only().is_none();
    cfg.mix
        .ops()
        .map(|op| {
            let t = &by_op[op.index()];
            let report = OpReport {
                count: t.ops,
                bytes: t.bytes,
                latency: Latency::of(&t.latency),
                swapped: (op == Op::CmpSwap).then_some(t.swapped),
                histogram: if mixed {
                    hist::encode(&t.latency)
                } else {
                    String::new()
                },
            };
            (op.key().to_string(), report)
        })
        .collect()
}

/// The server's counts, with the checks they allow against ours.
fn server_report(cfg: &RunConfig, by_op: &ByOp, counts: &ServerCounts) -> ServerReport {
    let ops = counts
        .ops
        .iter()
        .map(|(c, at)| {
            let counted_at = match at {
                CountedAt::Server => "server",
                CountedAt::Client => "client",
            };
            let r = ServerOpReport {
                ops: c.ops,
                bytes: c.bytes,
                counted_at: counted_at.into(),
            };
            (c.op.key().to_string(), r)
        })
        .collect::<BTreeMap<_, _>>();
    let ours = |op: Op| &by_op[op.index()];
    let datagrams_lost = (cfg.qp_type == QpType::Ud).then(|| {
        let received = ops.get(Op::Send.key()).map_or(0, |r| r.ops);
        ours(Op::Send).ops.saturating_sub(received)
    });
    ServerReport {
        fetch_add: counts
            .fetch_add_sum
            .map(|sum| FetchAddCheck::new(ours(Op::FetchAdd).ops, FETCH_ADD_ADDEND, sum)),
        cmp_swap: counts.cmp_swap_sum.map(|sum| {
            let t = ours(Op::CmpSwap);
            CmpSwapCheck::new(t.ops, t.swapped, sum)
        }),
        ops,
        datagrams_lost,
        errors: counts.errors,
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

#[cfg(test)]
mod tests {
    use super::super::super::stats::{new_histogram, record};
    use super::super::super::wire::OpCount;
    use super::super::super::{Op, OpMix};
    use super::*;

    fn tallied(ops: &[(Op, u64)]) -> ByOp {
        let mut by_op = ByOp::default();
        for &(op, n) in ops {
            let t = &mut by_op[op.index()];
            t.ops = n;
            t.bytes = 8 * n;
            for k in 0..n {
                record(&mut t.latency, 1_000 + k);
            }
        }
        by_op
    }

    fn report(cfg: &RunConfig, by_op: &ByOp, counts: Option<ServerCounts>) -> RunReport {
        let measured = Measured {
            setup_s: 0.1,
            measured_s: 1.0,
            rss: 0,
            memory: MemoryAtSetup::default(),
            server_received_bytes: None,
            server_counts: counts,
            start: std::time::UNIX_EPOCH,
            rate_per_flow: None,
            steady_spans: Vec::new(),
            per_thread: Vec::new(),
            cpus: 1,
            fct: None,
        };
        let stop = StopToken::new();
        build_report(cfg, "dev", &[], (&new_histogram(), by_op), &measured, stop)
    }

    #[test]
    fn a_mix_reports_every_op_and_the_servers_checks() {
        let cfg = RunConfig {
            mix: OpMix::parse("write:6,read:2,fetch_add:1,cmp_swap:1,send:0").unwrap(),
            size: 8,
            ..RunConfig::default()
        };
        let mut by_op = tallied(&[(Op::Write, 60), (Op::Read, 0), (Op::FetchAdd, 9)]);
        by_op[Op::CmpSwap.index()].ops = 10;
        by_op[Op::CmpSwap.index()].swapped = 10;
        let told = |op, ops| {
            (
                OpCount {
                    op,
                    ops,
                    bytes: 8 * ops,
                },
                CountedAt::Client,
            )
        };
        let counts = ServerCounts {
            ops: vec![
                told(Op::Write, 60),
                told(Op::Read, 0),
                told(Op::FetchAdd, 9),
                told(Op::CmpSwap, 10),
            ],
            fetch_add_sum: Some(9 * FETCH_ADD_ADDEND),
            cmp_swap_sum: Some(10),
            errors: 0,
        };
        let r = report(&cfg, &by_op, Some(counts));
        assert_eq!(r.op, "MIX(write:6,read:2,fetch_add:1,cmp_swap:1)");
        let keys: Vec<&str> = r.ops.keys().map(String::as_str).collect();
        assert_eq!(keys, ["cmp_swap", "fetch_add", "read", "write"]);
        assert_eq!(
            (r.ops["write"].count, r.ops["write"].latency.count),
            (60, 60)
        );
        assert_eq!(r.ops["cmp_swap"].swapped, Some(10));
        assert_eq!(r.ops["write"].swapped, None);
        let s = r.server_counts.as_ref().unwrap();
        assert!(s.fetch_add.as_ref().unwrap().exact);
        assert!(s.cmp_swap.as_ref().unwrap().exact);
        assert_eq!(s.ops["read"].counted_at, "client");
        assert_eq!(s.datagrams_lost, None);

        // The table: a line per op; the one that completed nothing says so; the checks.
        let mut text = Vec::new();
        crate::report::export::text::write(&r, false, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let line = |start: &str| text.lines().find(|l| l.starts_with(start)).unwrap_or("");
        assert!(line(" read ").ends_with("none completed"), "{text}");
        assert!(line(" write ").contains("60"), "{text}");
        assert!(
            text.contains(" fetch_add: the server's words sum to 2313 = 9 x 257: exact"),
            "{text}"
        );
        assert!(
            text.contains(" cmp_swap: 10 of 10 swapped, the server's words sum to 10: exact"),
            "{text}"
        );
        // JSON: the per-op map and the server's checks, under their names.
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ops"]["fetch_add"]["count"], 9);
        assert_eq!(json["server_counts"]["fetch_add"]["sum"], 2313);
    }

    #[test]
    fn ud_reports_the_datagrams_that_never_arrived() {
        let cfg = RunConfig {
            mix: OpMix::single(Op::Send),
            qp_type: QpType::Ud,
            size: 1024,
            ..RunConfig::default()
        };
        let by_op = tallied(&[(Op::Send, 100)]);
        let counts = ServerCounts {
            ops: vec![(
                OpCount {
                    op: Op::Send,
                    ops: 97,
                    bytes: 97 * 1024,
                },
                CountedAt::Server,
            )],
            ..ServerCounts::default()
        };
        let r = report(&cfg, &by_op, Some(counts));
        assert_eq!((r.op.as_str(), r.qp_type.as_str()), ("SEND", "ud"));
        assert_eq!(r.server_counts.as_ref().unwrap().datagrams_lost, Some(3));
        let mut text = Vec::new();
        crate::report::export::text::write(&r, false, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(" ibjitter SEND over UD closed"), "{text}");
        assert!(
            text.contains(" UD: 3 of 100 datagrams sent never reached the server"),
            "{text}"
        );
    }
}

//! What `ibjitter run` is asked to do ([`RunConfig`]) and what follows from it alone (the
//! steady-state window): read by the client and by the threads' patterns, so below both.
use super::ops::{Op, OpMix, QpType};
use super::pacing::Arrival;
use super::sizes::Sizes;
use std::time::Duration;

/// When each flow stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StopAt {
    /// Stop posting after this long (then drain what is outstanding).
    Duration(Duration),
    /// Each flow completes this many operations (round trips with `--pingpong`).
    Iters(u64),
}

/// How operations are issued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Keep `depth` operations outstanding per flow: as fast as the fabric allows.
    Closed,
    /// Post at `ops_per_s` per flow (at most `depth` outstanding); latency counts from the
    /// intended send time, so a stalled sender does not hide its own queueing
    /// (coordinated omission).
    Open { ops_per_s: f64, arrival: Arrival },
    /// A fraction of the port's link rate shared by all flows; resolved to `Open` once the
    /// device is open.
    LinkFraction { fraction: f64, arrival: Arrival },
}

/// Everything `ibjitter run` needs to know.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub server: String,
    pub port: u16,
    pub device: Option<String>,
    pub ib_port: u8,
    pub gid_index: Option<i32>,
    /// GRH traffic class of the flows' packets (RoCEv2: the IP DSCP and ECN bits).
    pub traffic_class: u8,
    /// Connect the flows through rdma_cm instead of exchanging QP numbers over TCP.
    pub cm: bool,
    pub flows: u32,
    /// The operations and their weights (`--op` is one op alone).
    pub mix: OpMix,
    pub qp_type: QpType,
    /// The message size, or with `sizes` the largest one drawn (buffers are sized to it).
    pub size: u32,
    /// Sizes drawn per message from a distribution.
    pub sizes: Option<Sizes>,
    /// Line rate in Gb/s for `--load` and `--fct`, instead of the port's.
    pub line_gbps: Option<f64>,
    /// `--fct`: record each message's completion time; the ideal adds this base latency.
    pub fct_base: Option<Duration>,
    pub depth: u32,
    pub threads: u32,
    /// Pin thread t to the t-th CPU of the process's affinity mask.
    pub pin: bool,
    pub stop: StopAt,
    pub load: Load,
    pub pingpong: bool,
    /// Bucket width of the per-flow throughput time series.
    pub interval: Duration,
    /// Interval of the HdrHistogram log.
    pub hdr_interval: Duration,
    /// Operations posted in this first part of the run are left out of latency, and their
    /// completions out of the steady-state throughput.
    pub warmup: Duration,
    /// Completions in this last part of a timed run are left out of the steady-state
    /// throughput (the ramp down: flows stopping, the drain).
    pub cooldown: Duration,
    pub qp_timeout: u8,
    /// How long to wait for the server at each step of the exchange.
    pub setup_timeout: Duration,
    /// How long to wait for the common start (other clients may be slower to set up).
    pub start_timeout: Duration,
    pub progress: bool,
    pub seed: u64,
    /// Put each flow's time series into the JSON report (for merging several senders).
    pub json_series: bool,
    /// Closed loop: signal one operation in this many (1: all, each timed exactly).
    pub signal_every: u32,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            server: String::new(),
            port: 18515,
            device: None,
            ib_port: 1,
            gid_index: None,
            traffic_class: 0,
            cm: false,
            flows: 1,
            mix: OpMix::single(Op::Write),
            qp_type: QpType::Rc,
            size: 65536,
            sizes: None,
            line_gbps: None,
            fct_base: None,
            depth: 1,
            threads: 1,
            pin: false,
            stop: StopAt::Duration(Duration::from_secs(5)),
            load: Load::Closed,
            pingpong: false,
            interval: Duration::from_millis(10),
            hdr_interval: Duration::from_secs(1),
            warmup: Duration::ZERO,
            cooldown: Duration::ZERO,
            signal_every: 1,
            qp_timeout: 18,
            setup_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(120),
            progress: false,
            seed: 1,
            json_series: false,
        }
    }
}

/// The steady-state window, ns since the start: after the warm-up, before the cool-down of a
/// timed run (a run of `--iters` has no known end: its window runs to its last completion).
pub fn steady_window_ns(cfg: &RunConfig) -> (u64, u64) {
    let from = cfg.warmup.as_nanos() as u64;
    let until = match cfg.stop {
        StopAt::Duration(d) => d.saturating_sub(cfg.cooldown).as_nanos() as u64,
        StopAt::Iters(_) => u64::MAX,
    };
    (from, until.max(from))
}

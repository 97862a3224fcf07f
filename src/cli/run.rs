//! `ibjitter run`: argument parsing and output files; the generator is `ibjitter::gen`.
use super::output_path::{check_writable, create};
use super::rdma_args::RdmaArgs;
use super::size_spec::{self, SizeSpec};
use super::{exit, units};
use clap::{Args, ValueEnum};
use ibjitter::gen::client::{self, RunOutput};
use ibjitter::gen::cpus;
use ibjitter::gen::intervals::{Outputs, MIN_HDR_INTERVAL_NS, MIN_INTERVAL_NS};
use ibjitter::gen::pacing::Arrival;
use ibjitter::gen::sizes::{SizeDist, Sizes};
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::gen::wire::{MAX_DEPTH, MAX_SIZE};
use ibjitter::gen::{Load, Op, OpMix, QpType, RunConfig, StopAt};
use ibjitter::report::export::{fct as fct_export, json, text};
use ibjitter::report::Outcome;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Exit status: 0 every flow completed; 1 some flows ended with a QP error \
(the others finished; each error is in the report); 2 bad arguments or set-up failed (nothing \
measured); 3 the server was lost mid-run (partial results written); 4 open loop overloaded: \
more than 5 % of the sends the --rate/--load schedule made due were never posted (offered and \
achieved rates in the report); 130 interrupted by Ctrl-C (partial results written)."
)]
pub struct RunArgs {
    /// Host running `ibjitter serve`
    server: String,
    /// TCP port of the server's out-of-band exchange
    #[arg(long, short = 'p', default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    rdma: RdmaArgs,
    /// Connect the flows through rdma_cm (address/route resolution and the CM handshake, from
    /// the device's own address) instead of exchanging QP numbers over TCP; the server must
    /// run `ibjitter serve --cm`
    #[arg(long)]
    cm: bool,
    /// Number of flows (queue pairs)
    #[arg(long, default_value_t = 1)]
    flows: u32,
    /// Operation: fetch_add and cmp_swap are 8-byte atomics on the flow's own word at the
    /// server (--size 8)
    #[arg(long, value_enum, default_value_t = OpArg::Write)]
    op: OpArg,
    /// Several operations, weighted: each flow draws its next one from a seeded PRNG
    /// (write:70,read:20,send:10); the report has figures per op
    #[arg(long, value_parser = OpMix::parse, conflicts_with = "op")]
    mix: Option<OpMix>,
    /// Queue pair type: rc, or ud (SEND only, datagrams of at most the path MTU)
    #[arg(long, value_enum, default_value_t = QpTypeArg::Rc)]
    qp_type: QpTypeArg,
    /// Message size: 65536, 64K, 1M (default 65536; 2 with --pingpong; 8 with atomics), or a
    /// distribution each message draws from (per flow, seeded): uniform:MIN-MAX,
    /// lognormal:MEDIAN,SIGMA (clipped at its 99.99th percentile), or a CDF file (cdf:FILE or
    /// its path; SIZE PROBABILITY per line, e.g. distributions/websearch.cdf)
    #[arg(long, short = 's', value_parser = size_spec::parse)]
    size: Option<SizeSpec>,
    /// Multiply the sizes drawn by this (a workload of the literature on a slower link)
    #[arg(long)]
    size_scale: Option<f64>,
    /// Flow-level workload: every message is a flow, its size drawn from this CDF file, and
    /// the report has flow completion times and slowdowns by size (as --size cdf:FILE plus
    /// FCT figures); with --load and --flow-arrival poisson, Poisson flow arrivals at a load
    #[arg(long, conflicts_with = "size")]
    flow_sizes: Option<PathBuf>,
    /// Each message's flow completion time (from when it was due to its completion), ideal
    /// FCT and slowdown, one CSV row per message, here; the figures by size bucket go to
    /// FILE's stem + "-buckets.csv" and ".svg", and to the report
    #[arg(long)]
    fct: Option<PathBuf>,
    /// Line rate for --load and the ideal FCT (25G, 200mbit), instead of the port's
    #[arg(long, value_parser = units::bit_rate)]
    line_rate: Option<f64>,
    /// Added to every message's ideal FCT, e.g. the unloaded round trip (default 0: the
    /// message at line rate alone)
    #[arg(long, value_parser = units::duration)]
    base_latency: Option<Duration>,
    /// Operations outstanding per flow
    #[arg(long, default_value_t = 1)]
    depth: u32,
    /// Run this long (default 5s unless --iters)
    #[arg(long, short = 'D', value_parser = units::duration, conflicts_with = "iters")]
    duration: Option<Duration>,
    /// Operations (round trips with --pingpong) per flow
    #[arg(long, short = 'n')]
    iters: Option<u64>,
    /// Leave operations posted in this first part of the run out of the latency figures
    /// (they still count in throughput): with hundreds of flows, first operations wait for
    /// everyone's start-up
    #[arg(long, default_value = "0s", value_parser = units::duration_or_zero)]
    warmup: Duration,
    /// Leave completions of this last part of a timed run out of the steady-state throughput
    /// (flows stopping, the drain); default: as long as --warmup
    #[arg(long, value_parser = units::duration_or_zero)]
    cooldown: Option<Duration>,
    /// Threads, or "auto": as many as the CPUs this process may run on (its affinity mask),
    /// at most one per flow; flows are spread over them, each with its own CQ
    #[arg(long, short = 't', default_value = "1", value_parser = parse_threads)]
    threads: Threads,
    /// Pin thread t to the t-th CPU of the affinity mask (polling threads neither migrate nor
    /// share a core while another is idle)
    #[arg(long)]
    pin: bool,
    /// Open loop: messages per second per flow (10k, 2.5M)
    #[arg(long, value_parser = units::rate, conflicts_with = "load")]
    rate: Option<f64>,
    /// Open loop: this fraction of the port's link rate, shared by all flows
    #[arg(long, value_parser = units::fraction)]
    load: Option<f64>,
    /// Gaps between open-loop sends (--flow-arrival is the same)
    #[arg(long, alias = "flow-arrival", value_enum, default_value_t = ArrivalArg::Fixed)]
    arrival: ArrivalArg,
    /// Round trips like ib_write_lat/ib_send_lat instead of throughput
    #[arg(long, conflicts_with_all = ["rate", "load"])]
    pingpong: bool,
    /// Closed loop: ask for a completion on one operation in N (and on each that fills the
    /// depth), like perftest's --cq-mod; an unsignaled operation's latency then runs to the
    /// completion that covers it (an upper bound). Default 1: every operation timed exactly
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096),
          conflicts_with_all = ["rate", "load", "pingpong"])]
    signal_every: u32,
    /// Write the report as JSON ("-": to stdout, instead of the table)
    #[arg(long)]
    json: Option<PathBuf>,
    /// Include each flow's time series in the JSON (for merging several senders' reports)
    #[arg(long)]
    json_series: bool,
    /// Write per-flow throughput over time as CSV
    #[arg(long)]
    timeseries: Option<PathBuf>,
    /// Write the device port's own counters (sysfs counters/ and hw_counters/: packets,
    /// retransmissions, out-of-sequence, RNR NAKs, CNPs, ECN marks where the device has
    /// them) as CSV rows t_s,counter,delta every --interval (at least 10 ms), aligned with
    /// --timeseries; the report has their totals over the run either way
    #[arg(long, value_name = "FILE")]
    counters: Option<PathBuf>,
    /// Time-series interval
    #[arg(long, default_value = "10ms", value_parser = units::duration)]
    interval: Duration,
    /// Write an HdrHistogram interval log of per-operation latency
    #[arg(long)]
    hdr_log: Option<PathBuf>,
    /// HdrHistogram log interval
    #[arg(long, default_value = "1s", value_parser = units::duration)]
    hdr_interval: Duration,
    /// Print a line per flow
    #[arg(long)]
    per_flow: bool,
    /// QP local ACK timeout exponent (4.096 us x 2^N, 0..=31; 0: no timeout); above the worst
    /// queueing delay
    #[arg(long, default_value_t = 18, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// GRH traffic class of the flows' packets (perftest's --tclass): on RoCEv2 the IP
    /// header's DSCP and ECN bits; 2 marks them ECN-capable (ECT(0)), so an ECN switch marks
    /// them CE instead of dropping (see `ibjitter pcap`'s congestion signals)
    #[arg(long, default_value_t = 0)]
    tclass: u8,
    /// Seed for PSNs, Poisson gaps and --mix draws
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No live progress line
    #[arg(long)]
    no_progress: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum OpArg {
    Send,
    Write,
    Read,
    #[value(name = "write_imm", alias = "write-imm")]
    WriteImm,
    #[value(name = "fetch_add", alias = "fetch-add")]
    FetchAdd,
    #[value(name = "cmp_swap", alias = "cmp-swap")]
    CmpSwap,
}

impl OpArg {
    fn op(self) -> Op {
        match self {
            OpArg::Send => Op::Send,
            OpArg::Write => Op::Write,
            OpArg::Read => Op::Read,
            OpArg::WriteImm => Op::WriteImm,
            OpArg::FetchAdd => Op::FetchAdd,
            OpArg::CmpSwap => Op::CmpSwap,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum QpTypeArg {
    Rc,
    Ud,
}

#[derive(Clone, Copy, ValueEnum)]
enum ArrivalArg {
    Fixed,
    Poisson,
}

impl RunArgs {
    fn config(&self) -> Result<RunConfig, String> {
        if self.flows == 0 {
            return Err("--flows must be at least 1".into());
        }
        if self.depth == 0 || self.depth > MAX_DEPTH {
            return Err(format!("--depth must be 1..={MAX_DEPTH}"));
        }
        let mix = self.mix.unwrap_or(OpMix::single(self.op.op()));
        let qp_type = match self.qp_type {
            QpTypeArg::Rc => QpType::Rc,
            QpTypeArg::Ud => QpType::Ud,
        };
        let spec = match &self.flow_sizes {
            Some(path) => Some(SizeSpec::Drawn(SizeDist::cdf_file(path)?)),
            None => self.size.clone(),
        };
        let sizes = match spec {
            Some(SizeSpec::Drawn(dist)) => {
                if self.pingpong || mix.has_atomics() {
                    return Err("a size distribution needs WRITE, WRITE_IMM, READ or SEND \
                        throughput (atomics move 8 bytes; --pingpong one size)"
                        .into());
                }
                let scale = self.size_scale.unwrap_or(1.0);
                if !(scale > 0.0 && scale.is_finite()) {
                    return Err(format!("--size-scale must be positive, got {scale}"));
                }
                // Sizes::max clamps to a u32; a larger largest size would be cut silently.
                let largest = dist.max() * scale;
                if largest > f64::from(u32::MAX) {
                    return Err(format!(
                        "{} scaled by {scale} reaches {largest:.3e} bytes: at most {} (4G - 1)",
                        dist.describe(),
                        u32::MAX
                    ));
                }
                Some(Sizes { dist, scale })
            }
            _ if self.size_scale.is_some() => {
                return Err("--size-scale scales a size distribution: give one with --size".into())
            }
            _ => None,
        };
        let size = match (&sizes, &self.size) {
            (Some(d), _) => d.max(),
            (None, Some(SizeSpec::Fixed(n))) => *n,
            _ if self.pingpong => 2,
            _ if mix.has_atomics() => 8,
            _ => 65536,
        };
        let fct = self.fct.is_some() || self.flow_sizes.is_some();
        if fct && (self.pingpong || self.signal_every > 1) {
            return Err(
                "--fct times every message to its own completion: not with --pingpong \
                or --signal-every"
                    .into(),
            );
        }
        if self.base_latency.is_some() && !fct {
            return Err(
                "--base-latency is part of the ideal FCT: give --fct or --flow-sizes".into(),
            );
        }
        if self.line_rate.is_some() && !fct && self.load.is_none() {
            return Err("--line-rate is for --load and --fct".into());
        }
        if size == 0 || size > MAX_SIZE {
            return Err(format!(
                "--size must be 1 byte to {} MiB (the protocol's limit), got {size}",
                MAX_SIZE >> 20
            ));
        }
        mix.validate(size, qp_type, self.pingpong)?;
        if qp_type == QpType::Ud && self.cm {
            return Err("--qp-type ud does not connect: use it without --cm".into());
        }
        let arrival = match self.arrival {
            ArrivalArg::Fixed => Arrival::Fixed,
            ArrivalArg::Poisson => Arrival::Poisson,
        };
        let load = match (self.rate, self.load) {
            (Some(ops_per_s), _) => Load::Open { ops_per_s, arrival },
            (None, Some(fraction)) => Load::LinkFraction { fraction, arrival },
            (None, None) => Load::Closed,
        };
        let stop = match (self.iters, self.duration) {
            (Some(0), _) => return Err("--iters must be at least 1".into()),
            (Some(n), _) => StopAt::Iters(n),
            (None, Some(d)) => StopAt::Duration(d),
            (None, None) => StopAt::Duration(Duration::from_secs(5)),
        };
        let cooldown = match stop {
            StopAt::Duration(_) => self.cooldown.unwrap_or(self.warmup),
            StopAt::Iters(_) if self.cooldown.is_some() => {
                return Err(
                    "--cooldown needs --duration (a run of --iters has no known end)".into(),
                )
            }
            StopAt::Iters(_) => Duration::ZERO,
        };
        if let StopAt::Duration(d) = stop {
            if self.warmup + cooldown >= d {
                return Err(format!(
                    "--warmup {:?} and --cooldown {cooldown:?} leave nothing of --duration {d:?} \
                     to measure: make them shorter",
                    self.warmup
                ));
            }
        }
        for (name, d, floor) in [
            ("--interval", self.interval, MIN_INTERVAL_NS),
            ("--hdr-interval", self.hdr_interval, MIN_HDR_INTERVAL_NS),
        ] {
            let floor = Duration::from_nanos(floor);
            if d < floor {
                return Err(format!("{name} {d:?} is below the floor of {floor:?}"));
            }
        }
        Ok(RunConfig {
            server: self.server.clone(),
            port: self.port,
            device: self.rdma.device.clone(),
            ib_port: self.rdma.ib_port,
            gid_index: self.rdma.gid_index,
            traffic_class: self.tclass,
            cm: self.cm,
            flows: self.flows,
            mix,
            qp_type,
            size,
            sizes,
            line_gbps: self.line_rate,
            fct_base: fct.then(|| self.base_latency.unwrap_or(Duration::ZERO)),
            depth: self.depth,
            threads: match self.threads {
                Threads::Count(n) => n,
                Threads::Auto => (cpus::allowed().len() as u32).min(self.flows.max(1)),
            },
            pin: self.pin,
            stop,
            load,
            pingpong: self.pingpong,
            interval: self.interval,
            hdr_interval: self.hdr_interval,
            qp_timeout: self.qp_timeout,
            progress: !self.no_progress,
            seed: self.seed,
            json_series: self.json_series,
            warmup: self.warmup,
            cooldown,
            signal_every: self.signal_every,
            ..RunConfig::default()
        })
    }
}

/// An incast sender's arguments after `ibjitter run` (spelled here, beside the flags): `flows`
/// flows to `server:port`, the report with its time series as JSON on stdout, no progress
/// line. The user's own `run` options follow them.
pub(super) fn sender_args(server: &str, port: u16, flows: u32) -> Vec<String> {
    [
        server,
        "--port",
        &port.to_string(),
        "--flows",
        &flows.to_string(),
        "--json",
        "-",
        "--json-series",
        "--no-progress",
    ]
    .map(String::from)
    .into()
}

/// Whether `ibjitter run SERVER EXTRA…` connects its flows through rdma_cm, as `run` itself
/// parses EXTRA (so its receiver must `serve --cm`); a clear error if `run` would refuse them.
pub(super) fn uses_cm(extra: &[String]) -> Result<bool, String> {
    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }
    let argv = ["run", "SERVER"].into_iter().map(String::from);
    <Run as clap::Parser>::try_parse_from(argv.chain(extra.iter().cloned()))
        .map(|r| r.args.cm)
        .map_err(|e| format!("the arguments for `ibjitter run` after --: {e}"))
}

pub fn run(a: RunArgs) -> i32 {
    let cfg = match a.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ibjitter run: {e}");
            return exit::SETUP;
        }
    };
    // Every output is opened (the streams, the JSON report) or checked (the FCT figures)
    // before any device: a path that cannot be written is a bad argument, found before
    // minutes of set-up, not after the measurement.
    let (outputs, json_file) = match open_streams(&a, &cfg).and_then(|o| {
        let json = open_json(&a)?;
        check_fct_figures(&a)?;
        Ok((o, json))
    }) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ibjitter run: {e}");
            return exit::SETUP;
        }
    };
    stop::install_signal_handlers();
    let out = match client::run(&cfg, StopToken::process(), outputs) {
        Ok(o) => o,
        Err(e) => {
            if let Some(j) = json_file {
                j.discard();
            }
            eprintln!("ibjitter run: {e}");
            return exit::run_error(&e);
        }
    };
    match out.report.outcome {
        Outcome::PeerLost => {
            eprintln!("ibjitter run: lost the server mid-run; writing what was measured")
        }
        Outcome::Interrupted => eprintln!("ibjitter run: interrupted; writing what was measured"),
        Outcome::Overloaded => {
            if let Some(o) = &out.report.open_loop {
                eprintln!(
                    "ibjitter run: overloaded: offered {:.0} ops/s, achieved {:.0} ops/s; {} of {} sends due ({:.1} %) were never posted",
                    o.offered_ops_per_s,
                    o.achieved_ops_per_s,
                    o.missed,
                    o.due,
                    o.missed_share * 100.0
                )
            }
        }
        Outcome::Completed | Outcome::FlowErrors => {}
    }
    let mut code = exit::outcome(out.report.outcome);
    if let Some(e) = &out.stream_error {
        eprintln!("ibjitter run: {e}");
        code = exit::with_write_failure(code);
    }
    if let Some(json_out) = json_file {
        let write = |w: &mut dyn Write| json::write(&out.report, w);
        if let Err(e) = json_out.write_or_save_elsewhere(&write, &std::env::temp_dir()) {
            eprintln!("ibjitter run: {e}");
            code = exit::with_write_failure(code);
        }
    }
    if let Err(e) = write_fct_figures(&a, &out) {
        eprintln!("ibjitter run: {e}");
        code = exit::with_write_failure(code);
    }
    let to_stdout = a.json.as_deref() == Some(Path::new("-"));
    let written = if to_stdout {
        json::write(&out.report, std::io::stdout().lock())
    } else {
        text::write(&out.report, a.per_flow, std::io::stdout().lock())
    };
    if let Err(e) = written {
        eprintln!("ibjitter run: writing the report: {e}");
    }
    code
}

/// `--json FILE`, created before the run (so that a bad path is found before it).
struct JsonOut {
    path: PathBuf,
    file: BufWriter<std::fs::File>,
    /// It did not exist before: removed if the run measures nothing.
    created: bool,
}

impl JsonOut {
    /// Writes the report; if that fails, writes it to a new `ibjitter-run-PID.N.json` in
    /// `fallback_dir`, or failing that to stderr, so that a finished measurement is never
    /// lost. The error says what failed and where the report went.
    fn write_or_save_elsewhere(
        mut self,
        write: &dyn Fn(&mut dyn Write) -> std::io::Result<()>,
        fallback_dir: &Path,
    ) -> Result<(), String> {
        // Emptied only now (an earlier file survives a run that measured nothing); flushed
        // here, as a BufWriter's flush on drop loses its error (a full disk).
        let regular = self.file.get_ref().metadata().is_ok_and(|m| m.is_file());
        let emptied = if regular {
            self.file.get_ref().set_len(0)
        } else {
            Ok(())
        };
        let written = emptied
            .and_then(|()| write(&mut self.file))
            .and_then(|()| self.file.flush());
        let Err(e) = written else {
            return Ok(());
        };
        let failed = format!("writing {}: {e}", self.path.display());
        // A new file of its own: the fallback is a shared directory (/tmp).
        let saved = ibjitter::temp_files::new_file(
            fallback_dir,
            &format!("ibjitter-run-{}", std::process::id()),
            "json",
        )
        .map_err(|e| format!("cannot save it elsewhere: {e}"))
        .and_then(|(f, fallback)| {
            let mut f = BufWriter::new(f);
            write(&mut f)
                .and_then(|()| f.flush())
                .map(|()| fallback.clone())
                .map_err(|e| format!("writing {}: {e}", fallback.display()))
        });
        Err(match saved {
            Ok(fallback) => format!(
                "{failed}; the JSON report is in {} instead",
                fallback.display()
            ),
            Err(e2) => {
                let _ = write(&mut std::io::stderr().lock());
                format!("{failed}; {e2}; the JSON report is above, on stderr")
            }
        })
    }

    /// Nothing was measured: a file this run created is removed, not left empty.
    fn discard(self) {
        if self.created {
            drop(self.file);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn open_json(a: &RunArgs) -> Result<Option<JsonOut>, String> {
    match a.json.as_deref().filter(|p| *p != Path::new("-")) {
        Some(path) => {
            let created = !path.exists();
            // Not truncated yet: see write_or_save_elsewhere.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(Some(JsonOut {
                path: path.to_path_buf(),
                file: BufWriter::new(file),
                created,
            }))
        }
        None => Ok(None),
    }
}

/// The FCT figures beside `--fct FILE`, written after the run: checked before it.
fn check_fct_figures(a: &RunArgs) -> Result<(), String> {
    if let Some(path) = &a.fct {
        for suffix in ["-buckets.csv", ".svg"] {
            check_writable(&fct_export::beside(path, suffix))?;
        }
    }
    Ok(())
}

fn write_fct_figures(a: &RunArgs, out: &RunOutput) -> Result<(), String> {
    if let (Some(path), Some(f)) = (&a.fct, &out.report.fct) {
        fct_export::buckets_csv(f, &fct_export::beside(path, "-buckets.csv"))?;
        fct_export::slowdown_svg(f, &fct_export::beside(path, ".svg"))?;
    }
    Ok(())
}

/// The time series and latency log files, written as the run goes.
fn open_streams(a: &RunArgs, cfg: &RunConfig) -> Result<Outputs, String> {
    let open = |path: &Option<PathBuf>| -> Result<Option<Box<dyn std::io::Write + Send>>, String> {
        Ok(match path {
            Some(p) => Some(Box::new(create(p)?)),
            None => None,
        })
    };
    Ok(Outputs {
        series: open(&a.timeseries)?,
        series_interval_s: cfg.interval.as_secs_f64(),
        latency: open(&a.hdr_log)?,
        latency_interval: cfg.hdr_interval,
        keep_latency: cfg.json_series,
        counters: open(&a.counters)?,
        fct: open(&a.fct)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    #[test]
    fn sender_args_parse_back() {
        let argv = std::iter::once("run".to_string()).chain(sender_args("10.0.0.9", 19000, 7));
        let a = Run::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{e}"))
            .args;
        assert_eq!((a.server.as_str(), a.port, a.flows), ("10.0.0.9", 19000, 7));
        assert_eq!(a.json.as_deref(), Some(Path::new("-")));
        assert!(a.json_series && a.no_progress);
        assert!(a.config().is_ok());
    }

    #[test]
    fn a_report_that_cannot_be_written_is_saved_elsewhere_and_said() {
        let dir = std::env::temp_dir().join(format!("ibjitter-run-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |w: &mut dyn Write| w.write_all(b"{\"report\": 1}\n");
        // /dev/full opens, and every write to it fails (ENOSPC), like a full disk.
        let full = || JsonOut {
            path: PathBuf::from("/dev/full"),
            file: create(Path::new("/dev/full")).unwrap(),
            created: false,
        };
        let e = full().write_or_save_elsewhere(&write, &dir).unwrap_err();
        let fallback = dir.join(format!("ibjitter-run-{}.0.json", std::process::id()));
        assert!(e.starts_with("writing /dev/full: "), "{e}");
        assert!(
            e.contains(&format!("is in {} instead", fallback.display())),
            "{e}"
        );
        assert_eq!(std::fs::read(&fallback).unwrap(), b"{\"report\": 1}\n");
        // No fallback directory either: on stderr, and said.
        let e = full()
            .write_or_save_elsewhere(&write, Path::new("/nonexistent"))
            .unwrap_err();
        assert!(e.ends_with("on stderr"), "{e}");
        // A good file: nothing to say.
        let good = dir.join("good.json");
        let out = JsonOut {
            file: create(&good).unwrap(),
            path: good.clone(),
            created: true,
        };
        assert_eq!(out.write_or_save_elsewhere(&write, &dir), Ok(()));
        assert_eq!(std::fs::read(&good).unwrap(), b"{\"report\": 1}\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cm_is_read_as_run_reads_it() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(uses_cm(&args(&["--op", "send", "--cm"])), Ok(true));
        assert_eq!(uses_cm(&args(&["--op", "send"])), Ok(false));
        assert!(uses_cm(&args(&["--no-such-flag"]))
            .unwrap_err()
            .contains("after --"));
    }
}

/// `--threads N` or `--threads auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Threads {
    Count(u32),
    Auto,
}

fn parse_threads(s: &str) -> Result<Threads, String> {
    if s == "auto" {
        return Ok(Threads::Auto);
    }
    match s.parse::<u32>() {
        Ok(0) => Err("at least 1 thread (or auto)".into()),
        Ok(n) => Ok(Threads::Count(n)),
        Err(_) => Err(format!("expected a number of threads or auto, got {s:?}")),
    }
}

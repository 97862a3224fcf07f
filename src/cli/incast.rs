//! `ibjitter incast`: argument parsing and output files; the driver is `ibjitter::incast`.
use super::{create, exit, units};
use clap::Args;
use ibjitter::gen::server::ServeConfig;
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::incast::{run_step, IncastConfig, Step};
use ibjitter::report::export::{hdrlog, timeseries};
use ibjitter::report::plot::{line_chart, Series};
use ibjitter::report::us;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Everything after -- goes to every sender's `ibjitter run` (e.g. \
-- --op send --size 64K --duration 10s --depth 4).\n\nExit status: 0 every sender ran and every \
flow completed; 1 a sender failed or died, or flows ended with errors (the report says which \
and why); 2 bad arguments or the receiver could not be launched; 130 interrupted (partial \
results written)."
)]
pub struct IncastArgs {
    /// The receiving host, and the address senders connect to if it differs: HOST[:ADDR]
    #[arg(long)]
    receiver: String,
    /// Sending hosts, comma separated
    #[arg(long, value_delimiter = ',', required = true)]
    senders: Vec<String>,
    /// Flows (QPs) started by each sender
    #[arg(long, default_value_t = 10)]
    flows_per_sender: u32,
    /// A series of flows-per-sender values, one incast each: 10,20,30
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<u32>,
    /// How to run a command on a host; {host} is replaced (srun, mpirun, ip netns exec fit too)
    #[arg(long, default_value = "ssh {host}")]
    launcher: String,
    /// The ibjitter executable on the hosts (default: this one's path)
    #[arg(long)]
    bin: Option<String>,
    /// TCP port of the receiver's out-of-band exchange
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// How long the receiver waits for all senders before starting those that are ready
    #[arg(long, default_value = "60s", value_parser = units::duration)]
    start_timeout: Duration,
    /// Where the merged report, time series and logs go
    #[arg(long, default_value = "incast-out")]
    out: PathBuf,
    /// Also write SVG figures: per-flow throughput over time, latency percentiles
    #[arg(long)]
    plot: bool,
    /// Options for every sender's `ibjitter run`
    #[arg(last = true)]
    run_args: Vec<String>,
}

pub fn run(a: IncastArgs) -> i32 {
    let (host, addr) = match a.receiver.split_once(':') {
        Some((h, addr)) => (h.to_string(), addr.to_string()),
        None => (a.receiver.clone(), a.receiver.clone()),
    };
    let bin = match a.bin.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .map(|p| p.display().to_string())
    }) {
        Some(b) => b,
        None => {
            eprintln!("ibjitter incast: cannot tell where ibjitter is: give --bin");
            return exit::SETUP;
        }
    };
    if a.senders.iter().any(|s| s.is_empty()) {
        eprintln!("ibjitter incast: empty host name in --senders");
        return exit::SETUP;
    }
    let cm = match super::run::uses_cm(&a.run_args) {
        Ok(cm) => cm,
        Err(e) => {
            eprintln!("ibjitter incast: {e}");
            return exit::SETUP;
        }
    };
    let cfg = IncastConfig {
        receiver_host: host,
        receiver_addr: addr,
        senders: a.senders.clone(),
        launcher: a.launcher.clone(),
        bin,
        serve_args: super::serve::to_args(&ServeConfig {
            port: a.port,
            clients: a.senders.len() as u32,
            once: true,
            start_timeout: a.start_timeout,
            // Senders connecting through rdma_cm need a receiver that listens for it.
            cm,
            ..ServeConfig::default()
        }),
        port: a.port,
        sender_args: super::run::sender_args,
        run_args: a.run_args.clone(),
    };
    stop::install_signal_handlers();
    let steps = if a.sweep.is_empty() {
        vec![a.flows_per_sender]
    } else {
        a.sweep.clone()
    };
    let mut rows = Vec::new();
    let mut code = exit::OK;
    for &n in &steps {
        let dir = if a.sweep.is_empty() {
            a.out.clone()
        } else {
            a.out.join(format!("flows-{n}"))
        };
        let step = match run_step(&cfg, n, &dir, StopToken::process()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ibjitter incast: {e}");
                return exit::SETUP;
            }
        };
        if let Err(e) = write_step(&step, &dir, a.plot) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        print_step(&step, &dir);
        if !step.clean() {
            code = code.max(exit::PARTLY);
        }
        rows.push(SweepRow::of(n, &step));
        if step.interrupted {
            code = exit::INTERRUPTED;
            break;
        }
    }
    if !a.sweep.is_empty() {
        if let Err(e) = write_sweep(&rows, &a.out.join("sweep.csv")) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        print_sweep(&rows);
    }
    code
}

/// Turns an I/O error on `path` into the CLI's message.
fn io(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("writing {}: {e}", path.display())
}

fn write_step(step: &Step, dir: &Path, plot: bool) -> Result<(), String> {
    let m = &step.merged;
    let path = dir.join("incast.json");
    let mut w = create(&path)?;
    serde_json::to_writer_pretty(&mut w, &m.report)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    writeln!(w).map_err(io(&path))?;
    let path = dir.join("timeseries.csv");
    let series: Vec<&[u64]> = m.series.iter().map(Vec::as_slice).collect();
    timeseries::write(&m.ids, &series, m.series_interval_s, create(&path)?).map_err(io(&path))?;
    let path = dir.join("latency.hlog");
    let whole = Duration::from_secs_f64(m.report.duration_s);
    hdrlog::write(
        std::slice::from_ref(&m.latency),
        whole,
        std::time::SystemTime::now(),
        create(&path)?,
    )
    .map_err(io(&path))?;
    if plot {
        plot_step(step, dir)?;
    }
    Ok(())
}

/// Per-flow throughput over time (one line per flow) and the latency percentile plot.
fn plot_step(step: &Step, dir: &Path) -> Result<(), String> {
    let m = &step.merged;
    // Rebin so each point averages several messages per flow (at the CSV's 10 ms, a flow that
    // completes a few large messages a second draws a comb of spikes), but keep >= 8 points.
    let len = m.series.iter().map(Vec::len).max().unwrap_or(0);
    let r = &m.report;
    let msg = r.total.bytes as f64 / r.total.ops.max(1) as f64;
    let per_flow_bucket = r.total.bytes as f64 / m.series.len().max(1) as f64 / len.max(1) as f64;
    let for_messages = (4.0 * msg / per_flow_bucket.max(1.0)).ceil() as usize;
    let per_bin = (len / 40).max(for_messages).min(len / 8).max(1);
    let dt = m.series_interval_s * per_bin as f64;
    let lines: Vec<Series> = m
        .ids
        .iter()
        .zip(&m.series)
        .map(|(id, s)| Series {
            name: format!("flow {id}"),
            points: s
                .chunks(per_bin)
                .enumerate()
                .map(|(k, c)| (k as f64 * dt, c.iter().sum::<u64>() as f64 * 8.0 / dt / 1e6))
                .collect(),
        })
        .collect();
    let title = format!(
        "{} flows into {}: throughput per flow",
        m.report.flows_requested, m.report.receiver
    );
    line_chart(
        &dir.join("throughput.svg"),
        &title,
        "time [s]",
        "Mb/s",
        &lines,
    )?;
    // HdrHistogram's percentile plot: x in "nines" (1 = 90%, 2 = 99%, 3 = 99.9%) shows the tail.
    let mut points = Vec::new();
    for v in m.latency.iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        if q < 1.0 {
            points.push((-(1.0 - q).log10(), v.value_iterated_to() as f64 / 1e3));
        }
    }
    let cdf = [Series {
        name: "all flows".into(),
        points,
    }];
    line_chart(
        &dir.join("latency.svg"),
        "operation latency by percentile",
        "percentile [nines: 1=90%, 2=99%, 3=99.9%]",
        "latency [us]",
        &cdf,
    )
}

fn print_step(step: &Step, dir: &Path) {
    let r = &step.merged.report;
    let l = &r.total.latency;
    println!(
        "incast into {}: {} flows ({} per sender x {}), started {}, {:.3} Gb/s, fairness {:.4}, latency p50 {:.1} us p99 {:.1} us p99.9 {:.1} us; launch to first byte {:.2} s, start skew {:.1} ms",
        r.receiver,
        r.flows_requested,
        r.flows_per_sender,
        r.senders.len(),
        r.flows_started,
        r.total.gbps,
        r.fairness,
        us(l.p50_ns),
        us(l.p99_ns),
        us(l.p999_ns),
        r.launch_to_first_byte_s,
        r.start_skew_us / 1e3
    );
    for s in r.senders.iter().filter(|s| s.status != "ok") {
        println!(
            "  sender {}: {}{}",
            s.host,
            s.status,
            if s.stderr_tail.is_empty() {
                String::new()
            } else {
                format!(": {}", s.stderr_tail.replace('\n', " | "))
            }
        );
    }
    let failed = r.flows.iter().filter(|f| f.status != "ok").count();
    if failed > 0 {
        println!("  {failed} flows ended with errors (see incast.json)");
    }
    println!("  report: {}", dir.join("incast.json").display());
}

/// One step of a sweep, as the thesis tabulated it by hand.
struct SweepRow {
    per_sender: u32,
    requested: u32,
    started: u32,
    gbps: f64,
    fairness: f64,
    /// p50, p99, p99.9 in µs.
    latency_us: [f64; 3],
}

impl SweepRow {
    fn of(per_sender: u32, step: &Step) -> SweepRow {
        let r = &step.merged.report;
        let l = &r.total.latency;
        SweepRow {
            per_sender,
            requested: r.flows_requested,
            started: r.flows_started,
            gbps: r.total.gbps,
            fairness: r.fairness,
            latency_us: [us(l.p50_ns), us(l.p99_ns), us(l.p999_ns)],
        }
    }
}

fn write_sweep(rows: &[SweepRow], path: &Path) -> Result<(), String> {
    let mut w = create(path)?;
    let io = &io(path);
    writeln!(
        w,
        "flows_per_sender,flows_requested,flows_started,total_gbps,fairness,p50_us,p99_us,p999_us"
    )
    .map_err(io)?;
    for r in rows {
        let [p50, p99, p999] = r.latency_us;
        writeln!(
            w,
            "{},{},{},{:.6},{:.6},{p50:.3},{p99:.3},{p999:.3}",
            r.per_sender, r.requested, r.started, r.gbps, r.fairness
        )
        .map_err(io)?;
    }
    Ok(())
}

fn print_sweep(rows: &[SweepRow]) {
    println!(
        " {:>9} {:>9} {:>10} {:>9} {:>11} {:>11} {:>11}",
        "requested", "started", "Gb/s", "fairness", "p50[us]", "p99[us]", "p99.9[us]"
    );
    for r in rows {
        let [p50, p99, p999] = r.latency_us;
        println!(
            " {:>9} {:>9} {:>10.3} {:>9.4} {p50:>11.1} {p99:>11.1} {p999:>11.1}",
            r.requested, r.started, r.gbps, r.fairness
        );
    }
}

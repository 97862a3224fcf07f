//! `ibjitter incast`: argument parsing; the driver is `ibjitter::incast`, the report
//! `ibjitter::report::incast`, its files `ibjitter::report::export::incast`.
use super::{exit, units};
use clap::Args;
use ibjitter::gen::server::ServeConfig;
use ibjitter::gen::stop::{self, StopToken};
use ibjitter::incast::{run_step, IncastConfig};
use ibjitter::report::export::incast as export;
use ibjitter::report::incast::SweepRow;
use std::path::PathBuf;
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
        if let Err(e) = export::step_files(&step.merged, &dir, a.plot) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        let report_path = dir.join("incast.json");
        let _ = export::step_summary(&step.merged.report, &report_path, std::io::stdout().lock());
        if !step.clean() {
            code = code.max(exit::PARTLY);
        }
        rows.push(SweepRow::of(n, &step.merged.report));
        if step.interrupted {
            code = exit::INTERRUPTED;
            break;
        }
    }
    if !a.sweep.is_empty() {
        if let Err(e) = export::sweep_csv(&rows, &a.out.join("sweep.csv")) {
            eprintln!("ibjitter incast: {e}");
            code = exit::with_write_failure(code);
        }
        let _ = export::sweep_table(&rows, std::io::stdout().lock());
    }
    code
}

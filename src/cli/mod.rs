//! Command-line parsing (clap) and dispatch. Each subcommand has its own file; the logic it
//! calls lives in the library, so it can be tested without a process.
use clap::{Args, Parser, Subcommand};

mod exit;
mod incast;
mod inject;
mod pcap;
mod run;
mod serve;
mod size_spec;
mod study;
mod table;
mod units;

#[derive(Parser)]
#[command(name = "ibjitter", version = ibjitter::VERSION, about = "RDMA latency and latency-variation toolkit")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Delay tables: make (lognormal, uniform, normal, …), fit, family, stats, seed
    Table(table::TableArgs),
    /// Receive traffic: any number of clients and flows (the other side of `run`)
    Serve(serve::ServeArgs),
    /// Generate RC SEND / RDMA WRITE traffic over many flows, timing every operation
    Run(run::RunArgs),
    /// Many senders into one receiver, launched through ssh/srun/mpirun, results merged
    Incast(incast::IncastArgs),
    /// Live control of running processes under libibjitter.so: status, set, pause, resume
    Inject(inject::InjectArgs),
    /// Per-flow and inter-packet-delay analysis of RoCEv2 / InfiniBand captures (pcap, pcapng)
    Pcap(pcap::PcapArgs),
    /// How sensitive is a program to latency variation and congestion: runs it clean and
    /// perturbed, interleaved, and reports slowdowns, correlations and a verdict
    Study(study::StudyArgs),
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Table(args) => table::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Run(args) => run::run(args),
        Command::Incast(args) => incast::run(args),
        Command::Pcap(args) => pcap::run(args),
        Command::Inject(args) => inject::run(args),
        Command::Study(args) => study::run(args),
    }
}

/// A buffered output file, or the error naming it.
fn create(path: &std::path::Path) -> Result<std::io::BufWriter<std::fs::File>, String> {
    std::fs::File::create(path)
        .map(std::io::BufWriter::new)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Which RDMA device, port and GID `run` and `serve` use.
#[derive(Args)]
struct RdmaArgs {
    /// RDMA device (default: $IBJITTER_DEV, else the first one)
    #[arg(long = "dev", short = 'd', env = "IBJITTER_DEV")]
    device: Option<String>,
    /// Device port
    #[arg(long, default_value_t = 1)]
    ib_port: u8,
    /// GID index (default: the first RoCEv2 IPv4 GID, else 0)
    #[arg(long)]
    gid_index: Option<i32>,
}

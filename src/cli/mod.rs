//! Command-line parsing (clap) and dispatch. Each subcommand has its own file; the logic it
//! calls lives in the library, so it can be tested without a process. What several share has
//! a file of its own (`exit`, `units`, `output_path`, `rdma_args`), below the subcommands and
//! this dispatch.
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::{Path, PathBuf};

mod doctor;
mod exec;
mod exit;
mod incast;
mod inject;
mod output_path;
mod pcap;
mod rdma_args;
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
    /// Run a program under libibjitter.so: mpirun -np 4 ibjitter exec --delay 50us -- ./app
    Exec(exec::ExecArgs),
    /// Is this machine ready for injection: device, clock, shim, a delayed ping-pong per path
    Doctor(doctor::DoctorArgs),
    /// Write a man page for ibjitter and each subcommand into DIR (used by tools/install)
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Write the shell completion script for SHELL into DIR (used by tools/install)
    #[command(hide = true)]
    Completions {
        shell: clap_complete::Shell,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    use_installed_distributions();
    let matches = Cli::command().get_matches();
    let cli =
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    match cli.command {
        Command::Table(args) => table::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Run(args) => run::run(args),
        Command::Incast(args) => incast::run(args),
        Command::Pcap(args) => pcap::run(args),
        Command::Inject(args) => inject::run(args),
        Command::Study(args) => study::run(args, matches.subcommand_matches("study")),
        Command::Exec(args) => exec::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Man { out } => write_docs("man pages", &out, |dir| {
            clap_mangen::generate_to(Cli::command(), dir)
        }),
        Command::Completions { shell, out } => write_docs("completions", &out, |dir| {
            clap_complete::generate_to(shell, &mut Cli::command(), "ibjitter", dir).map(|_| ())
        }),
    }
}

/// An installed ibjitter (PREFIX/bin) names its tables (PREFIX/share/ibjitter/distributions)
/// to itself and to what it starts (the shim under `exec` and `study`), unless the user
/// chose a directory with IBJITTER_DISTRIBUTIONS.
fn use_installed_distributions() {
    let var = ibjitter::table::format::DISTRIBUTIONS_ENV;
    if std::env::var_os(var).is_some() {
        return;
    }
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| ibjitter::inject_env::installed_distributions(&exe));
    if let Some(dir) = dir {
        // Still single-threaded: nothing else reads the environment yet.
        std::env::set_var(var, dir);
    }
}

/// Writes generated documentation into `dir`, created if need be.
fn write_docs(what: &str, dir: &Path, write: impl Fn(&Path) -> std::io::Result<()>) -> i32 {
    match std::fs::create_dir_all(dir).and_then(|()| write(dir)) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("ibjitter: cannot write {what} into {}: {e}", dir.display());
            exit::SETUP
        }
    }
}

//! Command-line parsing (clap) and dispatch. Each subcommand has its own file; the logic it
//! calls lives in the library, so it can be tested without a process.
use clap::{Parser, Subcommand};

mod table;

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
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Table(args) => table::run(args),
    }
}

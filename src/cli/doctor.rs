//! `ibjitter doctor`: is this machine ready for a trustworthy injection? Prints a verdict
//! per check as it goes; the library (ibjitter::doctor) decides them.
use super::exit;
use clap::Args;
use ibjitter::doctor::{self, Options, Verdict};
use std::io::Write;
use std::path::PathBuf;

/// The longest delay the ping-pongs accept: every round trip waits it, `--iters` x
/// `--rounds` times.
const MAX_DELAY_NS: u64 = 100_000_000;

#[derive(Args)]
#[command(
    after_help = "Each line: ok / warn / FAIL, the check, what was found, and (-> ) what to do. \
The ping-pongs run server and client on one port of the device (loopback through the NIC), \
clean and with the client under libibjitter.so with a constant delay D, through each post \
path: ibv_post_send, the ibv_wr_* API, and UCP when UCX is installed. A round trip should \
grow by D.\n\nExit status: 0 when nothing FAILed (every path that could be tried showed its \
delay), 1 when a check FAILed, 2 on bad arguments."
)]
pub struct DoctorArgs {
    /// RDMA device (default: the first one)
    #[arg(long, short = 'd')]
    device: Option<String>,
    /// Device port
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// The constant delay injected in the ping-pongs (at most 100ms)
    #[arg(long, default_value = "100us", value_parser = super::units::duration)]
    delay: std::time::Duration,
    /// Round trips per ping-pong run
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    iters: u32,
    /// Clean/delayed pairs of runs per program (the fastest of each side counts)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// libibjitter.so (default: PREFIX/lib/ibjitter/ when installed, else beside this binary)
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Write every check, with its figures, as JSON
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the programs' outputs and stats files (kept anyway when a check FAILs)
    #[arg(long)]
    keep: bool,
}

pub fn run(a: DoctorArgs) -> i32 {
    match doctor_run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ibjitter doctor: {e}");
            exit::SETUP
        }
    }
}

fn doctor_run(a: DoctorArgs) -> Result<i32, String> {
    let delay_ns = u64::try_from(a.delay.as_nanos()).unwrap_or(u64::MAX);
    if delay_ns > MAX_DELAY_NS {
        return Err(format!(
            "--delay {:?}: at most 100ms (every round trip of every run waits it)",
            a.delay
        ));
    }
    if let Some(p) = &a.json {
        super::output_path::check_writable(p)?;
    }
    let shim = match a.shim {
        Some(p) => p,
        // Where `exec` finds it: the installed layout, then beside the binary. A shim that
        // is nowhere is the doctor's first finding, not a usage error.
        None => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find this program's path: {e}"))?;
            ibjitter::inject_env::find_shim(&exe)
                .unwrap_or_else(|_| exe.with_file_name("libibjitter.so"))
        }
    };
    let shim = std::fs::canonicalize(&shim).unwrap_or(shim);
    // Its own new directory: a name another user could have made first is never used.
    let work_dir = ibjitter::temp_files::private_dir("ibjitter-doctor").map_err(|e| {
        format!(
            "cannot create a directory in {}: {e}",
            std::env::temp_dir().display()
        )
    })?;
    let opts = Options {
        device: a.device,
        port: a.port,
        delay_ns,
        shim,
        iters: a.iters,
        rounds: a.rounds,
        work_dir: work_dir.clone(),
    };
    let mut stdout = std::io::stdout();
    let report = doctor::run(&opts, |c| {
        let _ = writeln!(stdout, "{}", c.line());
        let _ = stdout.flush();
    });
    let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
    let mut code = if failed.is_empty() {
        exit::OK
    } else {
        exit::PARTLY
    };
    if let Some(p) = &a.json {
        let written = super::output_path::create(p).and_then(|mut f| {
            serde_json::to_writer_pretty(&mut f, &report)
                .map_err(|e| e.to_string())
                .and_then(|_| f.flush().map_err(|e| e.to_string()))
                .map_err(|e| format!("cannot write {}: {e}", p.display()))
        });
        if let Err(e) = written {
            eprintln!("ibjitter doctor: {e}");
            code = exit::with_write_failure(code);
        }
    }
    if failed.is_empty() {
        let warned = report
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::Warn)
            .count();
        println!(
            "doctor: nothing failed ({} checks, {warned} warnings)",
            report.checks.len()
        );
    } else {
        eprintln!(
            "ibjitter doctor: {} check(s) FAILED: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    if a.keep || !failed.is_empty() {
        eprintln!(
            "ibjitter doctor: the programs' outputs and stats are in {}",
            work_dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    Ok(code)
}

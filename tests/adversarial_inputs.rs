//! Adversarial input for every subcommand: endless (/dev/zero, a FIFO whose writer never
//! stops), huge, truncated, crafted and overflowing files and arguments, and outputs that
//! cannot be written. Each case runs the real binary under an address-space limit (setrlimit
//! RLIMIT_AS before exec) and a time bound, and must end in a clear error (naming the file and
//! the limit) or a bounded run: never a hang (the case fails at its time bound), a panic, or
//! memory growing until the OOM killer (the limit turns that into a failed allocation).
mod common;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Address space of each run: the readers' caps (64 MiB a file) fit well within it; reading
/// /dev/zero or an endless FIFO whole does not.
const MEMORY_LIMIT: u64 = 256 << 20;
/// Longest a case may take (a debug build reads 64 MiB in well under this).
const TIME_LIMIT: Duration = Duration::from_secs(60);

use common::Ran;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ibjitter-adv-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `ibjitter ARGS` under [`MEMORY_LIMIT`] and [`TIME_LIMIT`]; output goes to files (a
/// pipe left unread could block the child).
fn ibjitter(args: &[&str]) -> Ran {
    // Cases run in parallel threads: each its own directory.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = TempDir::new(&format!("out{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let ran = common::ibjitter_bounded(args, &dir.0, MEMORY_LIMIT, TIME_LIMIT);
    assert!(
        !ran.stderr.contains("panicked") && !ran.stderr.contains("memory allocation"),
        "ibjitter {args:?}: {}",
        ran.stderr
    );
    assert!(
        ran.code.is_some(),
        "ibjitter {args:?}: killed by a signal: {}",
        ran.stderr
    );
    ran
}

/// The run fails (exit status `code`) and its stderr says every one of `says`.
fn refused(args: &[&str], code: i32, says: &[&str]) -> Ran {
    let ran = ibjitter(args);
    assert_eq!(ran.code, Some(code), "ibjitter {args:?}: {}", ran.stderr);
    for s in says {
        assert!(
            ran.stderr.contains(s),
            "ibjitter {args:?}: expected {s:?} in: {}",
            ran.stderr
        );
    }
    ran
}

/// A FIFO with a writer that never stops (until dropped): `line` again and again. The writer
/// holds it read-write, so its open never waits for a reader, and non-blocking, so that it
/// sees the stop flag while the pipe is full.
struct EndlessFifo {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl EndlessFifo {
    fn new(path: PathBuf, line: &str) -> EndlessFifo {
        let c = std::ffi::CString::new(path.display().to_string()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut w = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let chunk = line.repeat(4096 / line.len().max(1) + 1).into_bytes();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let writer = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if w.write(&chunk).is_err() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        EndlessFifo {
            path,
            stop,
            writer: Some(writer),
        }
    }
    fn arg(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for EndlessFifo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// A file of `len` bytes that takes no disk (a hole), as a huge input.
fn sparse(path: &Path, len: u64) -> String {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
    path.display().to_string()
}

fn write(path: &Path, bytes: &[u8]) -> String {
    std::fs::write(path, bytes).unwrap();
    path.display().to_string()
}

const TABLE: i32 = 1;
const SETUP: i32 = 2;

#[test]
fn table_readers_refuse_endless_and_huge_input() {
    let dir = TempDir::new("table");
    let out = dir.path("out");
    let out = out.to_str().unwrap();
    // Endless: a device is refused before it is read.
    for args in [
        &["table", "empirical", "--samples", "/dev/zero"][..],
        &["table", "fit", "--samples", "/dev/zero"],
        &["table", "family", "--from", "/dev/zero", "-o", out],
        &["table", "episodes", "--from", "/dev/zero", "--out-dir", out],
    ] {
        refused(args, TABLE, &["/dev/zero", "found a device"]);
    }
    // Endless: a FIFO is read up to the limit, then refused.
    let fifo = EndlessFifo::new(dir.path("samples.fifo"), "1.5\n");
    let f = fifo.arg();
    refused(
        &["table", "empirical", "--samples", &f],
        TABLE,
        &[&f, "limit of 64 MiB"],
    );
    refused(
        &["table", "fit", "--samples", &f, "--unit", "us"],
        TABLE,
        &[&f, "limit of 64 MiB"],
    );
    drop(fifo);
    let fifo = EndlessFifo::new(dir.path("series.fifo"), "0.001 5000\n");
    let f = fifo.arg();
    refused(
        &["table", "episodes", "--from", &f, "--out-dir", out],
        TABLE,
        &[&f, "limit of 64 MiB"],
    );
    drop(fifo);
    // Huge: a file over the limit is refused from its size; a line over 1 MiB at its line.
    let huge = sparse(&dir.path("huge.txt"), (64 << 20) + 1);
    refused(
        &["table", "fit", "--samples", &huge],
        TABLE,
        &[&huge, "limit of 64 MiB"],
    );
    let mut long = b"1\n2\n".to_vec();
    long.extend(std::iter::repeat_n(b'7', (1 << 20) + 1));
    let long = write(&dir.path("long.txt"), &long);
    refused(
        &["table", "empirical", "--samples", &long],
        TABLE,
        &[&format!("{long}:3:1048577: "), "limit of 1 MiB"],
    );
    // Nothing was written for any of them.
    assert!(!Path::new(out).exists());
}

#[test]
fn table_readers_refuse_truncated_and_crafted_input() {
    let dir = TempDir::new("crafted");
    // Truncated in the middle of a UTF-8 character.
    let cut = write(&dir.path("cut.txt"), b"12\n3\xe2\x82");
    refused(
        &["table", "empirical", "--samples", &cut],
        TABLE,
        &[&format!("{cut}:2:2: "), "UTF-8"],
    );
    // A number that overflows f64, and one that is not a number.
    let inf = write(&dir.path("inf.txt"), b"1\n2\n1e400\n");
    refused(
        &["table", "fit", "--samples", &inf],
        TABLE,
        &[&format!("{inf}:3:1: "), "1e400"],
    );
    let nan = write(&dir.path("nan.txt"), b"1\n2\nNaN\n");
    refused(
        &["table", "empirical", "--samples", &nan],
        TABLE,
        &[&format!("{nan}:3")],
    );
    // A series that is one line of a hundred thousand fields.
    let wide = write(&dir.path("wide.txt"), "1 ".repeat(100_000).as_bytes());
    refused(
        &[
            "table",
            "episodes",
            "--from",
            &wide,
            "--out-dir",
            dir.path("ep").to_str().unwrap(),
        ],
        TABLE,
        &[&wide],
    );
}

#[test]
fn table_generators_refuse_moments_a_table_cannot_hold() {
    let dir = TempDir::new("moments");
    let t = dir.path("t.dist");
    let t = t.to_str().unwrap();
    // sd 1000 x the mean: the table's mean and sd are far from those asked.
    let ran = refused(
        &[
            "table",
            "lognormal",
            "--mean",
            "10us",
            "--sd",
            "10ms",
            "-o",
            t,
        ],
        TABLE,
        &["mean is 6.09us", "-39.1 %", "--allow-approx"],
    );
    assert!(ran.stdout.is_empty());
    assert!(!Path::new(t).exists(), "a refused table is not written");
    refused(
        &["table", "lognormal", "--mean", "10us", "--sd", "1e30s"],
        TABLE,
        &["mean is 0.00ns", "-100.0 %"],
    );
    // Allowed: written, said on stderr and in the header.
    let ran = ibjitter(&[
        "table",
        "lognormal",
        "--mean",
        "10us",
        "--sd",
        "10ms",
        "--allow-approx",
        "-o",
        t,
    ]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(ran.stderr.contains("warning: the table's mean is 6.09us"));
    let text = std::fs::read_to_string(t).unwrap();
    assert!(text.contains("# approximate (--allow-approx)"), "{text}");
    // Overflowing durations and seeds.
    refused(
        &["table", "constant", "--value", "1e300s"],
        SETUP,
        &["finite"],
    );
    refused(
        &["table", "constant", "--value", "1e20s"],
        TABLE,
        &["does not fit"],
    );
    refused(
        &["table", "seed", "--value", "18446744073709551616"],
        SETUP,
        &["too large"],
    );
}

#[test]
fn run_refuses_bad_sizes_and_paths_before_any_device() {
    let dir = TempDir::new("run");
    // Endless and huge size CDFs.
    refused(
        &["run", "h", "--size", "cdf:/dev/zero"],
        SETUP,
        &["/dev/zero", "found a device"],
    );
    let fifo = EndlessFifo::new(dir.path("sizes.fifo"), "65536 0.5\n");
    let f = fifo.arg();
    refused(
        &["run", "h", "--flow-sizes", &f],
        SETUP,
        &[&f, "limit of 64 MiB"],
    );
    drop(fifo);
    let huge = sparse(&dir.path("huge.cdf"), 1 << 30);
    refused(
        &["run", "h", "--flow-sizes", &huge],
        SETUP,
        &[&huge, "limit of 64 MiB"],
    );
    // Crafted: a size no message can have.
    let big = write(&dir.path("big.cdf"), b"4096 0.5\n1e20 1\n");
    refused(
        &["run", "h", "--size", &format!("cdf:{big}")],
        SETUP,
        &[&format!("{big}:2: "), "at most 4294967295"],
    );
    // Overflowing numbers: refused, not wrapped or saturated.
    for size in [
        "18014398509482048K",
        "17179869185G",
        "99999999999999999999999",
    ] {
        refused(&["run", "h", "--size", size], SETUP, &[size, "too large"]);
    }
    refused(&["run", "h", "-D", "1e30s"], SETUP, &["too long"]);
    refused(&["run", "h", "--warmup", "1e30s"], SETUP, &["too long"]);
    refused(&["run", "h", "--rate", "1e308k"], SETUP, &["finite"]);
    // Outputs that cannot be written: refused before any device is opened.
    for (flag, path) in [
        ("--json", "/nonexistent/r.json"),
        ("--fct", "/nonexistent/f.csv"),
        ("--timeseries", "/nonexistent/t.csv"),
    ] {
        let ran = refused(
            &["run", "h", flag, path],
            SETUP,
            &["cannot write /nonexistent/"],
        );
        assert!(!ran.stderr.contains("ibv_"), "{}", ran.stderr);
    }
}

#[test]
fn serve_incast_and_study_refuse_before_they_start() {
    let dir = TempDir::new("others");
    refused(&["serve", "--start-timeout", "1e30s"], SETUP, &["too long"]);
    // Addressing one process: the argument is refused before it is looked up.
    refused(
        &["inject", "set", "--delay", "1e30s", "1"],
        SETUP,
        &["too long"],
    );
    let base = [
        "incast",
        "--receiver",
        "a:10.0.0.1",
        "--senders",
        "b:10.0.0.2",
    ];
    refused(
        &[&base[..], &["--start-timeout", "1e30s"]].concat(),
        SETUP,
        &["too long"],
    );
    refused(
        &[&base[..], &["--out", "/dev/null/x"]].concat(),
        SETUP,
        &["cannot write into /dev/null/x"],
    );
    let out = dir.path("study");
    let out = out.to_str().unwrap();
    refused(
        &["study", "--out", out, "--family", "/dev/zero", "--", "true"],
        SETUP,
        &["/dev/zero", "found a device"],
    );
    for var in ["IBJITTER_STATS", "IBJITTER_TABLE", "IBJITTER_SEED"] {
        let kv = format!("{var}=/tmp/x");
        refused(
            &[
                "study",
                "--out",
                out,
                "--congestor",
                "run",
                "--shim-env",
                &kv,
                "--",
                "true",
            ],
            SETUP,
            &[var, "set by study itself"],
        );
    }
    // Counts that would wrap the number of runs (2^63 rounds ran once, then said
    // "--until-ci: not every 95 % CI is within the target", never asked for).
    let table = dir.path("t.dist");
    let t = table.to_str().unwrap();
    assert_eq!(
        ibjitter(&["table", "constant", "--value", "5us", "-o", t]).code,
        Some(0)
    );
    for (flag, n) in [
        ("--reps", "9223372036854775808"),
        ("--warmup", "18446744073709551615"),
    ] {
        refused(
            &["study", "--out", out, "--tables", t, flag, n, "--", "true"],
            SETUP,
            &[&format!("{flag} {n}: at most 100000")],
        );
    }
    // A study's CSV grown beyond the limit (crafted: a hole) is refused, naming it.
    std::fs::create_dir_all(dir.path("study")).unwrap();
    let csv = sparse(&dir.path("study").join("study.csv"), (64 << 20) + 1);
    refused(
        &["study", "--out", out, "--congestor", "run", "--", "true"],
        SETUP,
        &[&csv, "limit of 64 MiB"],
    );
}

/// An output that is a FIFO nobody reads is refused at once, naming it: `table -o` waited
/// for a reader before any work (for ever), and a study's `study.csv` made a FIFO waited in
/// its open, restarted after Ctrl-C and SIGTERM (only SIGKILL ended it).
#[test]
fn outputs_that_are_fifos_nobody_reads_are_refused_at_once() {
    let dir = TempDir::new("fifo-out");
    let fifo = dir.path("out.fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    for args in [
        &["table", "constant", "--value", "5us", "-o", f][..],
        &["table", "seed", "-o", f][..],
    ] {
        refused(args, 1, &[f, "FIFO nobody reads"]);
    }
    let out = dir.path("study");
    std::fs::create_dir_all(&out).unwrap();
    mkfifo(&out.join("study.csv"));
    let o = out.to_str().unwrap();
    // (A congestor study: no injector needed, as in a debug build's tests.)
    refused(
        &["study", "--out", o, "--congestor", "run", "--", "true"],
        SETUP,
        &["study.csv", "not a regular file"],
    );
}

/// A table or seed that cannot be written whole (here `ulimit -f`, as a full disk or a quota
/// would) leaves the file that was there as it was, and says so: the table was truncated to
/// the limit (a 4,096-byte table, that netem and the injector would take for a short one).
#[test]
fn an_output_that_cannot_be_written_whole_leaves_the_old_file() {
    let dir = TempDir::new("fsize");
    let table = dir.path("t.dist");
    let t = table.to_str().unwrap();
    let made = ibjitter(&[
        "table",
        "lognormal",
        "--shape",
        "0.5",
        "--scale",
        "10us",
        "-o",
        t,
    ]);
    assert_eq!(made.code, Some(0), "{}", made.stderr);
    let before = std::fs::read(&table).unwrap();
    assert!(before.len() > 8192, "{}", before.len());
    let seed = dir.path("seed");
    std::fs::write(&seed, "12345\n").unwrap();
    for (args, file, old) in [
        (
            vec!["table", "constant", "--value", "5us", "-o", t],
            &table,
            &before[..],
        ),
        (
            vec![
                "table",
                "seed",
                "--value",
                "123456789",
                "-o",
                seed.to_str().unwrap(),
            ],
            &seed,
            &b"12345\n"[..],
        ),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
        cmd.args(&args).stdin(Stdio::null());
        // SAFETY: signal and setrlimit are async-signal-safe; this child's own settings.
        unsafe {
            cmd.pre_exec(|| {
                // EFBIG instead of SIGXFSZ's death, as a full disk gives ENOSPC.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit {
                    rlim_cur: 4,
                    rlim_max: 4,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("left as it was"), "{args:?}: {err}");
        assert_eq!(
            std::fs::read(file).unwrap(),
            old,
            "{args:?}: the old file changed"
        );
        let left: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("ibjitter-new"))
            .collect();
        assert!(left.is_empty(), "{args:?}: {left:?} left behind");
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn study_reads_a_huge_output_in_bounded_memory() {
    let dir = TempDir::new("study-out");
    // 300 MB of output, more than the memory limit: held whole, the metric would be lost.
    let script = write(
        &dir.path("loud.sh"),
        b"#!/bin/sh\nyes 'Loop time 1.25 step' | head -c 300000000\necho 'Loop time 2.5'\n",
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.path("st");
    let ran = ibjitter(&[
        "study",
        "--out",
        out.to_str().unwrap(),
        "--congestor",
        "run",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--metric",
        "Loop time ([0-9.]+)",
        "--",
        &script,
    ]);
    // The congestor (`ibjitter run` without a server) ends at once: that run does not count.
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let csv = std::fs::read_to_string(out.join("study.csv")).unwrap();
    let clean = csv
        .lines()
        .find(|l| l.contains(",clean,clean,"))
        .unwrap_or_else(|| panic!("{csv}"));
    let fields: Vec<&str> = clean.split(',').collect();
    assert_eq!((fields[6], fields[9]), ("1", "2.5"), "{clean}");
    assert!(
        std::fs::metadata(out.join("runs/0000-clean.log"))
            .unwrap()
            .len()
            > 300_000_000,
        "the output is kept whole in its file"
    );
}

#[test]
fn pcap_refuses_endless_and_truncated_captures() {
    let dir = TempDir::new("pcap");
    refused(&["pcap", "/dev/zero"], SETUP, &["/dev/zero"]);
    // A pcap header cut after its magic and part of its version.
    let cut = write(&dir.path("cut.pcap"), b"\xd4\xc3\xb2\xa1\x02\x00");
    refused(&["pcap", &cut], SETUP, &[&cut]);
}

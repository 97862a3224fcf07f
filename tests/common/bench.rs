//! Runs commands in the Soft-RoCE bench VM (`tools/softroce-vm`) from `cargo test`.
//!
//! A bench test that cannot get its VM fails with the reason: it never skips. Only one VM runs
//! at a time (TCG uses both cores), across test threads and test processes alike: `run` holds
//! an exclusive `flock` on `build/vm/bench.lock` while its VM is up.
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The checkout's root (the VM runs commands there, so scripts can use relative paths).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, empty directory `<target>/bench-scratch/NAME`, for sharing read-write with the VM.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("bench-scratch").join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// What a VM run produced.
#[derive(Debug)]
pub struct VmOutput {
    /// The command's exit status (124: timeout; 125: the VM itself failed).
    pub status: i32,
    /// The command's stdout and stderr, as written in the VM.
    pub output: String,
    /// The launcher's own messages (timing summary, VM failures).
    pub log: String,
}

impl VmOutput {
    /// Fails the test unless the command exited 0, showing everything it printed.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert_eq!(
            self.status, 0,
            "bench command failed (status {}).\n--- output:\n{}\n--- launcher:\n{}",
            self.status, self.output, self.log
        );
        self
    }
}

/// A bench VM to run one script in. Defaults: two rxe devices, 300 s limit.
pub struct Vm {
    devices: u8,
    hosts: Option<u8>,
    bottleneck: Option<String>,
    timeout_s: u32,
    memory_mib: Option<u32>,
    env: Vec<(String, String)>,
    writable: Vec<PathBuf>,
}

impl Default for Vm {
    fn default() -> Self {
        Vm {
            devices: 2,
            hosts: None,
            bottleneck: None,
            timeout_s: 300,
            memory_mib: None,
            env: Vec::new(),
            writable: Vec::new(),
        }
    }
}

impl Vm {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn devices(mut self, n: u8) -> Self {
        self.devices = n;
        self
    }
    /// N emulated hosts h0..h(N-1) behind one bridge instead of the two devices.
    pub fn hosts(mut self, n: u8) -> Self {
        self.hosts = Some(n);
        self
    }
    /// With `hosts`: rate-limit the switch port toward h0 (a tc rate such as "100mbit").
    pub fn bottleneck(mut self, rate: &str) -> Self {
        self.bottleneck = Some(rate.into());
        self
    }
    pub fn timeout(mut self, secs: u32) -> Self {
        self.timeout_s = secs;
        self
    }
    /// Guest memory (the launcher's default is 2 GiB).
    pub fn memory(mut self, mib: u32) -> Self {
        self.memory_mib = Some(mib);
        self
    }
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    pub fn writable(mut self, dir: impl AsRef<Path>) -> Self {
        self.writable.push(dir.as_ref().to_path_buf());
        self
    }

    /// Runs `script` with bash in a fresh VM, in the checkout's root. Panics (fails the test)
    /// when the VM cannot boot or times out, with the launcher's explanation.
    pub fn run(&self, script: &str) -> VmOutput {
        let root = repo_root();
        let launcher = root.join("tools/softroce-vm");
        let mut cmd = Command::new(&launcher);
        cmd.current_dir(&root)
            .arg("-t")
            .arg(self.timeout_s.to_string())
            .arg("-n")
            .arg(self.devices.to_string());
        if let Some(n) = self.hosts {
            cmd.arg("--hosts").arg(n.to_string());
        }
        if let Some(rate) = &self.bottleneck {
            cmd.arg("--bottleneck").arg(rate);
        }
        if let Some(mib) = self.memory_mib {
            cmd.arg("-m").arg(mib.to_string());
        }
        for dir in &self.writable {
            cmd.arg("-w").arg(dir);
        }
        for (k, v) in &self.env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.arg("-c").arg(script);

        let _lock = BenchLock::acquire(&root);
        let started = Instant::now();
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", launcher.display()));
        record_vm_seconds(started.elapsed().as_secs_f64());
        let result = VmOutput {
            status: out.status.code().unwrap_or(-1),
            output: String::from_utf8_lossy(&out.stdout).into_owned(),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        // Shown by the test harness on failure, and with --nocapture.
        println!(
            "--- bench VM ({:.1}s) ---\n{}--- launcher ---\n{}",
            started.elapsed().as_secs_f64(),
            result.output,
            result.log
        );
        match result.status {
            124 => panic!(
                "the bench VM timed out after {} s:\n{}",
                self.timeout_s, result.log
            ),
            125 => panic!(
                "the bench VM could not run (did tools/setup run?):\n{}",
                result.log
            ),
            _ => result,
        }
    }
}

/// Appends "TEST<TAB>SECONDS" to `<target>/bench-vm-seconds.tsv` for one VM run of the calling
/// test (`tools/test` empties the file first and prints the table at the end). A test that
/// runs several VMs writes several lines; tools/test adds them up.
pub fn record_vm_seconds(secs: f64) {
    use std::io::Write;
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/shim_bench-0123abcd → shim_bench
    let stem = exe.file_stem().unwrap_or_default().to_string_lossy();
    let binary = stem.rsplit_once('-').map_or(&*stem, |(name, _)| name);
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let path = target_dir().join("bench-vm-seconds.tsv");
    // One short write per line with O_APPEND: lines of concurrent tests never interleave.
    let line = format!("{binary}::{test}\t{secs:.1}\n");
    let written = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("warning: cannot record VM time in {}: {e}", path.display());
    }
}

/// Holds `build/vm/bench.lock` exclusively; released when dropped (or when the process dies).
struct BenchLock(File);

impl BenchLock {
    fn acquire(root: &Path) -> BenchLock {
        let dir = root.join("build/vm");
        fs::create_dir_all(&dir).expect("creating build/vm");
        let file = File::create(dir.join("bench.lock")).expect("creating build/vm/bench.lock");
        // SAFETY: flock on a file descriptor we own; blocks until no other VM run holds it.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(
            rc,
            0,
            "flock(build/vm/bench.lock): {}",
            std::io::Error::last_os_error()
        );
        BenchLock(file)
    }
}

/// The MPI workload `tools/mpi/pingpong.c`, compiled with mpicc (Open MPI, the default MPI)
/// into `<target>/bench-bin/` when missing or older than its source. Returns the binary's path.
pub fn mpi_pingpong() -> PathBuf {
    mpi_pingpong_with("mpicc", "pingpong")
}

/// The same workload built with MPICH's `mpicc.mpich`, for its `mpirun.mpich`.
pub fn mpich_pingpong() -> PathBuf {
    mpi_pingpong_with("mpicc.mpich", "pingpong-mpich")
}

fn mpi_pingpong_with(mpicc: &str, name: &str) -> PathBuf {
    let root = repo_root();
    let src = root.join("tools/mpi/pingpong.c");
    let dir = target_dir().join("bench-bin");
    let bin = dir.join(name);
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&bin).is_some() && modified(&bin) >= modified(&src) {
        return bin;
    }
    fs::create_dir_all(&dir).expect("creating target/bench-bin");
    // Build under a per-process, per-call name, then rename: concurrent test processes, and
    // tests of one process running in parallel threads, never see half a binary.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        "{name}.{}.{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let status = Command::new(mpicc)
        .args(["-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{mpicc} not found ({e}): run tools/setup"));
    assert!(status.success(), "{mpicc} failed on {}", src.display());
    fs::rename(&tmp, &bin).expect("installing the MPI pingpong binary");
    bin
}

/// The cargo target directory this test was built in (`target/`, or `$CARGO_TARGET_DIR`):
/// test executables live in `<target>/<profile>/deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<test>")
        .to_path_buf()
}

/// Builds the workspace in release mode (timing comparisons need optimized code, and `cargo
/// test` builds debug) and returns `<target>/release/<file>`, which `package` makes.
///
/// The whole workspace, as `tools/test` builds it, never one package: cargo unifies features
/// per invocation, so `-p ibjitter-shim` alone builds another variant of the shim, and the
/// cdylib's file name has no hash to keep both: each switch between the two rebuilt it, and
/// `-p ibjitter` alone rebuilt the binary (80 s) after the suite's workspace build.
pub fn release_artifact(package: &str, file: &str) -> PathBuf {
    let root = repo_root();
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "--workspace"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
    assert!(
        status.success(),
        "cargo build --release --workspace failed (for {package})"
    );
    let path = target_dir().join("release").join(file);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

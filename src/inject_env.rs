//! The environment that puts a program under libibjitter.so: which `IBJITTER_*` variable each
//! `ibjitter exec` flag sets (one table, [`SETTINGS`]), where the shim is, the `LD_PRELOAD`
//! that loads it, and the check that the shim accepts the settings before the program starts.
//! `ibjitter exec` and `ibjitter study` build their programs' environments here.
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One injector setting: the flag of `ibjitter exec` and the variable the shim reads.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The long flag, without `--`.
    pub flag: &'static str,
    pub var: &'static str,
    /// The value's grammar, as the shim reads it.
    pub value: &'static str,
    /// A switch (`--quiet`) means `VAR=1`; `--quiet=0` still passes a value.
    pub switch: bool,
    pub help: &'static str,
}

const fn value(
    flag: &'static str,
    var: &'static str,
    value: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        flag,
        var,
        value,
        switch: false,
        help,
    }
}

const fn switch(flag: &'static str, var: &'static str, help: &'static str) -> Setting {
    Setting {
        flag,
        var,
        value: "0|1",
        switch: true,
        help,
    }
}

/// Every variable libibjitter.so reads, as a flag of `ibjitter exec`. The grammar is the
/// shim's own: the value is passed through verbatim and the shim judges it (see [`probe`]).
pub const SETTINGS: &[Setting] = &[
    value("table", "IBJITTER_TABLE", "FILE", "Absolute table: 4096 delays in ns (absolute path)"),
    value("dist", "IBJITTER_DIST", "NAME|FILE", "netem-style table (normal, pareto, paretonormal, a distributions/ name, or a path), scaled by --delay and --jitter"),
    value("delay", "IBJITTER_DELAY", "D", "Mean delay (100us, 1.5ms); alone: a constant delay"),
    value("jitter", "IBJITTER_JITTER", "D", "Spread of --dist (without --dist: uniform over delay ± jitter)"),
    value("seed", "IBJITTER_SEED", "N|FILE", "Seed of the draws (same seed, same delay sequence per thread)"),
    switch("seed-per-rank", "IBJITTER_SEED_PER_RANK", "Each MPI/Slurm rank draws its own sequence: seed + rank"),
    value("unit", "IBJITTER_UNIT", "ns|loops", "What a table entry counts"),
    value("max-delay", "IBJITTER_MAX_DELAY", "D", "Longest delay accepted (default 10s)"),
    value("mode", "IBJITTER_MODE", "spin|line", "spin: the poster busy-waits; line: posts return at once and a shim thread posts when due"),
    value("layer", "IBJITTER_LAYER", "auto|verbs|ucp", "Where a message waits: verbs posts, UCP sends, or auto (UCP for UCX, verbs for the rest)"),
    value("per", "IBJITTER_PER", "post|wr", "One delay per post call or batch, or per work request"),
    value("spin", "IBJITTER_SPIN", "auto|plain|pause", "Whether the busy-wait pauses between clock reads"),
    value("prob", "IBJITTER_PROB", "P", "Delay a post with probability P (0 < P <= 1)"),
    value("ranks", "IBJITTER_RANKS", "LIST", "Only these MPI/Slurm ranks inject (0,3-5)"),
    value("ops", "IBJITTER_OPS", "LIST", "Only these opcode classes: send,write,read,atomic"),
    value("qpn", "IBJITTER_QPN", "LIST", "Only sends on these local QP numbers (17,0x1a)"),
    value("dest", "IBJITTER_DEST", "LIST", "Only sends to these destinations (10.0.0.2,fe80::1,qpn:0x98,lid:5)"),
    value("start", "IBJITTER_START", "D", "Inject from D after load"),
    value("stop", "IBJITTER_STOP", "D", "Inject until D after load"),
    value("episodes", "IBJITTER_EPISODES", "CALM:CONGESTED:MEAN:MEAN", "Bursty congestion: two absolute tables and the mean dwell time of each state"),
    switch("episodes-sync", "IBJITTER_EPISODES_SYNC", "Every process with the same seed follows one wall-clock schedule of --episodes (congested at the same moments)"),
    value("correlation", "IBJITTER_CORRELATION", "RHO", "A thread's draw repeats its last with probability RHO (0.5 or 50%)"),
    value("trace", "IBJITTER_TRACE", "FILE", "Write the draws to FILE at exit (%p: the pid, %h: the host)"),
    value("trace-max", "IBJITTER_TRACE_MAX", "N", "How many draws the trace keeps"),
    value("cq-table", "IBJITTER_CQ_TABLE", "FILE", "Hold completions in ibv_poll_cq for delays drawn from this absolute table"),
    value("cq-delay", "IBJITTER_CQ_DELAY", "D", "Hold completions in ibv_poll_cq for a constant D"),
    value("stats", "IBJITTER_STATS", "FILE", "JSON statistics at exit (%p: the pid, %h: the host)"),
    value("control", "IBJITTER_CONTROL", "0|1", "0: no live control (ibjitter inject)"),
    switch("quiet", "IBJITTER_QUIET", "No start-up or coverage line (warnings still print)"),
    value("distributions", ibjitter_table::format::DISTRIBUTIONS_ENV, "DIR", "Directory of named tables searched first by --dist"),
];

/// Variables the shim reads that are its own business, not the user's: it sets
/// `IBJITTER_STATS_OWNER` itself so that processes a program execs never overwrite its stats.
pub const INTERNAL_VARS: &[&str] = &["IBJITTER_STATS_OWNER"];

/// Where libibjitter.so is for the `ibjitter` binary at `exe`: the installed layout
/// (`PREFIX/bin/ibjitter`, `PREFIX/lib/ibjitter/libibjitter.so`) first, then the build
/// layout (`target/<profile>/libibjitter.so` beside the binary). Err says where it looked.
pub fn find_shim(exe: &Path) -> Result<PathBuf, String> {
    let candidates = shim_candidates(exe);
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            format!(
                "no libibjitter.so at {} (install with tools/install, build it with \
                 cargo build --release -p ibjitter-shim, or give --shim)",
                looked.join(" nor ")
            )
        })
}

fn shim_candidates(exe: &Path) -> Vec<PathBuf> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    vec![
        dir.join("../lib/ibjitter/libibjitter.so"),
        dir.join("libibjitter.so"),
    ]
}

/// The installed tables (`PREFIX/share/ibjitter/distributions`) for the binary at `exe`,
/// if it is installed.
pub fn installed_distributions(exe: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(exe.parent()?.join("../share/ibjitter/distributions"))
        .ok()
        .filter(|d| d.is_dir())
}

/// The `LD_PRELOAD` that loads `shim` first and then what was preloaded already, without
/// another `libibjitter.so` (an installed one under a build tree's, say): a second copy
/// would only stand aside (it says so), and this run's shim is the one asked for.
pub fn preload_value(shim: &Path, existing: Option<&OsStr>) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    let mut v = OsString::from(shim.as_os_str());
    let entries = existing.map_or(&[][..], |e| e.as_bytes());
    // The loader splits the list at spaces and colons.
    for entry in entries.split(|&b| b == b' ' || b == b':') {
        let name = Path::new(OsStr::from_bytes(entry)).file_name();
        if entry.is_empty() || name == Some(OsStr::new("libibjitter.so")) {
            continue;
        }
        v.push(" ");
        v.push(OsStr::from_bytes(entry));
    }
    v
}

/// The environment a program under the injector gets on top of its own.
#[derive(Debug, Clone)]
pub struct InjectorEnv {
    pub shim: PathBuf,
    /// `IBJITTER_*` settings, later ones overriding earlier ones of the same name.
    pub vars: Vec<(String, OsString)>,
}

impl InjectorEnv {
    pub fn new(shim: PathBuf) -> InjectorEnv {
        InjectorEnv {
            shim,
            vars: Vec::new(),
        }
    }

    pub fn set(&mut self, var: impl Into<String>, value: impl AsRef<OsStr>) -> &mut Self {
        let var = var.into();
        self.vars.retain(|(k, _)| *k != var);
        self.vars.push((var, value.as_ref().to_owned()));
        self
    }

    /// Every variable to set, `LD_PRELOAD` included (prepended to this process's own).
    pub fn pairs(&self) -> Vec<(OsString, OsString)> {
        let preload = preload_value(&self.shim, std::env::var_os("LD_PRELOAD").as_deref());
        std::iter::once((OsString::from("LD_PRELOAD"), preload))
            .chain(
                self.vars
                    .iter()
                    .map(|(k, v)| (OsString::from(k), v.clone())),
            )
            .collect()
    }

    /// Puts the environment on `cmd`.
    pub fn apply(&self, cmd: &mut Command) {
        for (k, v) in self.pairs() {
            cmd.env(k, v);
        }
    }

    /// Runs `probe_program` once under the shim with these settings (and this process's
    /// environment, as the program will have it) and returns what the shim refused: its
    /// `ibjitter: warning:` lines at load (it says one for every configuration it refuses),
    /// or the loader's when the shim cannot be preloaded at all.
    pub fn check(&self, probe_program: &Path) -> Result<(), String> {
        if !self.shim.is_file() {
            return Err(format!("no injector at {}", self.shim.display()));
        }
        let mut cmd = Command::new(probe_program);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        self.apply(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start {} to check the settings: {e}",
                probe_program.display()
            )
        })?;
        // The probe does nothing but load the shim: its stderr (bounded) read aside while
        // its end is awaited, bounded too.
        let pipe = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut err = String::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(64 * 1024).read_to_string(&mut err);
            }
            err
        });
        let status = wait_bounded(&mut child, PROBE_TIMEOUT);
        let err = reader.join().unwrap_or_default();
        let status = status.ok_or_else(|| {
            format!(
                "checking the settings: {} under the shim did not end within {:?}",
                probe_program.display(),
                PROBE_TIMEOUT
            )
        })?;
        // The loader's complaint about another preloaded object is not ours to judge.
        let shim = self.shim.to_string_lossy();
        let refused: Vec<&str> = err
            .lines()
            .filter(|l| {
                l.starts_with("ibjitter: warning:")
                    || (l.contains("cannot be preloaded") && l.contains(shim.as_ref()))
            })
            .collect();
        if !refused.is_empty() {
            return Err(refused.join("\n"));
        }
        if !status.success() {
            return Err(format!(
                "checking the settings: {} under the shim failed ({status}){}",
                probe_program.display(),
                if err.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", err.trim())
                }
            ));
        }
        Ok(())
    }
}

/// How long the check's probe may take: it only loads the shim (and reads its tables).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why the dynamic loader will not load `LD_PRELOAD` into `program` (as `execvp` finds it on
/// `PATH`), if it can tell: nothing would be injected into that process (its children, if
/// dynamically linked and not privileged, still load the shim).
pub fn preload_ignored_by(program: &OsStr) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let path = resolve_program(program)?;
    let name = path.display();
    if is_static_elf(&path) {
        return Some(format!(
            "{name} is statically linked: no dynamic loader runs in it, so LD_PRELOAD (the \
             injector) is not loaded and nothing is injected into it"
        ));
    }
    let m = std::fs::metadata(&path).ok()?;
    // SAFETY: geteuid/getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let setuid = m.mode() & 0o4000 != 0 && m.uid() != euid;
    let setgid = m.mode() & 0o2000 != 0 && m.gid() != egid;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path and name; a null buffer of size 0 asks for the size.
    let caps = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    } > 0;
    let why = if setuid {
        "set-user-ID"
    } else if setgid {
        "set-group-ID"
    } else if caps {
        "given file capabilities"
    } else {
        return None;
    };
    Some(format!(
        "{name} is {why}: the dynamic loader runs it in secure mode and ignores LD_PRELOAD (the \
         injector), so nothing is injected into it"
    ))
}

/// `program` as `execvp` finds it: as given if it has a slash, else the first executable
/// file of that name in `PATH`.
fn resolve_program(program: &OsStr) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether `path` is an ELF executable without a program interpreter (`PT_INTERP`): one the
/// kernel starts itself, with no dynamic loader. Reads the ELF header and program headers
/// only (a check this small needs no ELF crate); anything unreadable or not ELF is "no".
fn is_static_elf(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    const PT_INTERP: u32 = 3;
    // Never waiting on a FIFO put in the program's place.
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut h = [0u8; 64];
    if f.read_exact(&mut h).is_err() || &h[..4] != b"\x7fELF" {
        return false;
    }
    // 64-bit little-endian only (x86_64, aarch64): others are "can't tell".
    if h[4] != 2 || h[5] != 1 {
        return false;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let e_type = u16_at(&h, 16);
    // ET_EXEC or ET_DYN (a static PIE is ET_DYN without PT_INTERP; a shared library
    // run directly is not a program anyone passes here).
    if e_type != 2 && e_type != 3 {
        return false;
    }
    let phoff = u64::from_le_bytes(h[32..40].try_into().unwrap());
    let (phentsize, phnum) = (u16_at(&h, 54) as usize, u16_at(&h, 56) as usize);
    if phentsize < 4 || phnum == 0 || phnum > 4096 {
        return false;
    }
    let mut ph = vec![0u8; phentsize * phnum];
    use std::io::{Seek, SeekFrom};
    if f.seek(SeekFrom::Start(phoff)).is_err() || f.read_exact(&mut ph).is_err() {
        return false;
    }
    !ph.chunks(phentsize)
        .any(|p| u32::from_le_bytes(p[..4].try_into().unwrap()) == PT_INTERP)
}

/// A program that does nothing, to load the shim in for [`InjectorEnv::check`].
pub fn probe_program() -> Result<PathBuf, String> {
    ["/bin/true", "/usr/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| "no /bin/true to check the settings with".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_variables_are_each_named_once() {
        let mut flags: Vec<_> = SETTINGS.iter().map(|s| s.flag).collect();
        let mut vars: Vec<_> = SETTINGS.iter().map(|s| s.var).collect();
        flags.sort();
        flags.dedup();
        vars.sort();
        vars.dedup();
        assert_eq!(flags.len(), SETTINGS.len());
        assert_eq!(vars.len(), SETTINGS.len());
    }

    #[test]
    fn the_shim_goes_before_what_was_preloaded() {
        let shim = Path::new("/p/lib/ibjitter/libibjitter.so");
        assert_eq!(preload_value(shim, None), shim.as_os_str());
        assert_eq!(preload_value(shim, Some(OsStr::new(""))), shim.as_os_str());
        assert_eq!(
            preload_value(shim, Some(OsStr::new("/x/libother.so"))),
            OsStr::new("/p/lib/ibjitter/libibjitter.so /x/libother.so")
        );
        // Another copy of the shim already preloaded (colon- or space-separated) is left
        // out: it would only stand aside.
        assert_eq!(
            preload_value(
                shim,
                Some(OsStr::new("/opt/lib/libibjitter.so:/x/liba.so  /x/libb.so"))
            ),
            OsStr::new("/p/lib/ibjitter/libibjitter.so /x/liba.so /x/libb.so")
        );
    }

    #[test]
    fn a_later_setting_replaces_an_earlier_one() {
        let mut e = InjectorEnv::new("/s.so".into());
        e.set("IBJITTER_SEED", "1").set("IBJITTER_DELAY", "1ms");
        e.set("IBJITTER_SEED", "2");
        assert_eq!(
            e.vars,
            vec![
                ("IBJITTER_DELAY".to_string(), "1ms".into()),
                ("IBJITTER_SEED".to_string(), "2".into())
            ]
        );
    }

    #[test]
    fn the_installed_layout_is_found_before_the_build_layout() {
        let dir = std::env::temp_dir().join(format!("ibjitter-find-shim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("lib/ibjitter")).unwrap();
        let exe = dir.join("bin/ibjitter");
        let err = find_shim(&exe).unwrap_err();
        assert!(err.contains("lib/ibjitter/libibjitter.so"), "{err}");
        std::fs::write(dir.join("bin/libibjitter.so"), "").unwrap();
        let real = |p: &str| std::fs::canonicalize(dir.join(p)).unwrap();
        assert_eq!(find_shim(&exe).unwrap(), real("bin/libibjitter.so"));
        std::fs::write(dir.join("lib/ibjitter/libibjitter.so"), "").unwrap();
        assert_eq!(
            find_shim(&exe).unwrap(),
            real("lib/ibjitter/libibjitter.so")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `ibjitter doctor`: what this machine needs for a trustworthy injection, each a verdict.
//!
//! One file per group of checks: [`device`] (devices, ports, GIDs, MTU, counters), [`clock`]
//! (TSC, calibration, busy-wait error), [`software`] (UCX, libfabric, /dev/shm), [`shim`]
//! (the injector loads; its stats), [`paths`] (a loopback ping-pong, clean and delayed, per
//! post path). [`child`] runs the programs those use, each bounded in time. Nothing here is
//! specific to one provider: the device, its GID and the hooks a program went through are
//! all found, not assumed.
use serde::Serialize;
use std::path::PathBuf;

pub mod child;
pub mod clock;
pub mod device;
pub mod paths;
pub mod shim;
pub mod software;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// Works, but something deserves a look (or a path could not be tried).
    Warn,
    /// Injection on this machine cannot be trusted until this is fixed.
    Fail,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Which group of checks (device, clock, software, shim, path).
    pub group: &'static str,
    pub name: String,
    pub verdict: Verdict,
    /// What was found, and why the verdict.
    pub detail: String,
    /// What to do about it (empty when nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub advice: String,
    /// The figures behind the verdict, for the JSON.
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl Check {
    pub fn new(group: &'static str, name: impl Into<String>, verdict: Verdict) -> Check {
        Check {
            group,
            name: name.into(),
            verdict,
            detail: String::new(),
            advice: String::new(),
            data: serde_json::Value::Null,
        }
    }
    pub fn verdict(mut self, v: Verdict) -> Check {
        self.verdict = v;
        self
    }
    pub fn detail(mut self, d: impl Into<String>) -> Check {
        self.detail = d.into();
        self
    }
    pub fn advice(mut self, a: impl Into<String>) -> Check {
        self.advice = a.into();
        self
    }
    pub fn data(mut self, d: serde_json::Value) -> Check {
        self.data = d;
        self
    }
    /// The report's line: verdict, group, name, detail; advice on its own line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:<4}  {:<8}  {}: {}",
            self.verdict.label(),
            self.group,
            self.name,
            self.detail
        );
        if !self.advice.is_empty() {
            s += &format!("\n                -> {}", self.advice);
        }
        s
    }
}

/// What the doctor was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The RDMA device (None: the first one).
    pub device: Option<String>,
    pub port: u8,
    /// The constant delay injected in the ping-pongs, ns.
    pub delay_ns: u64,
    /// libibjitter.so.
    pub shim: PathBuf,
    /// Round trips per ping-pong run.
    pub iters: u32,
    /// Clean/delayed pairs per path (the fastest of each side counts).
    pub rounds: u32,
    /// Where the children's outputs and stats files go (created, emptied by the caller).
    pub work_dir: PathBuf,
}

/// Everything the doctor found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub version: &'static str,
    pub device: Option<String>,
    pub delay_us: f64,
    pub checks: Vec<Check>,
}

impl Report {
    /// The worst verdict of all checks.
    pub fn worst(&self) -> Verdict {
        worst(&self.checks)
    }
    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.verdict == Verdict::Fail)
    }
}

/// The worst verdict among `checks` (Ok when there are none).
pub fn worst(checks: &[Check]) -> Verdict {
    checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Ok)
}

/// Runs every check, in order, calling `progress` with each one as it is decided (the CLI
/// prints them as they come: the ping-pongs take seconds).
pub fn run(opts: &Options, mut progress: impl FnMut(&Check)) -> Report {
    let mut checks: Vec<Check> = Vec::new();
    let mut add = |c: Check, checks: &mut Vec<Check>| {
        progress(&c);
        checks.push(c);
    };
    let (found, dev_checks) = device::check(opts.device.as_deref(), opts.port);
    for c in dev_checks {
        add(c, &mut checks);
    }
    for c in clock::check() {
        add(c, &mut checks);
    }
    let sw = software::check();
    for c in sw.checks.iter().cloned() {
        add(c, &mut checks);
    }
    let loads = shim::check_loads(&opts.shim, &opts.work_dir);
    let shim_ok = loads.verdict != Verdict::Fail;
    add(loads, &mut checks);
    match (&found, shim_ok) {
        (Some(target), true) => {
            for c in paths::check(opts, target, sw.ucx.is_some()) {
                add(c, &mut checks);
            }
        }
        (None, _) => add(
            Check::new("path", "ping-pong", Verdict::Fail)
                .detail("no usable RDMA port: no path could be tried")
                .advice("fix the device checks above first"),
            &mut checks,
        ),
        (_, false) => add(
            Check::new("path", "ping-pong", Verdict::Fail)
                .detail("the injector does not load: no path could be tried")
                .advice("fix the shim check above first"),
            &mut checks,
        ),
    }
    Report {
        version: crate::VERSION,
        device: found.map(|t| t.device),
        delay_us: opts.delay_ns as f64 / 1000.0,
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_verdict_decides_and_no_check_is_ok() {
        let c = |v| Check::new("x", "y", v);
        assert_eq!(worst(&[]), Verdict::Ok);
        assert_eq!(worst(&[c(Verdict::Ok), c(Verdict::Warn)]), Verdict::Warn);
        assert_eq!(
            worst(&[c(Verdict::Fail), c(Verdict::Ok), c(Verdict::Warn)]),
            Verdict::Fail
        );
    }

    #[test]
    fn a_line_carries_verdict_group_detail_and_advice() {
        let l = Check::new("clock", "tsc", Verdict::Fail)
            .detail("not constant")
            .advice("use a bare-metal node")
            .line();
        assert!(l.starts_with("FAIL  clock"), "{l}");
        assert!(l.contains("tsc: not constant"), "{l}");
        assert!(l.contains("-> use a bare-metal node"), "{l}");
    }
}

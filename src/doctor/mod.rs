//! `ibjitter doctor`: what this machine needs for a trustworthy injection, each a verdict.
//!
//! One file per group of checks: [`device`] (devices, ports, GIDs, MTU, counters), [`clock`]
//! (TSC, calibration, busy-wait error), [`software`] (UCX, libfabric, /dev/shm), [`shim`]
//! (the injector loads; its stats), [`paths`] (a loopback ping-pong, clean and delayed, per
//! post path). [`child`] runs the programs those use, each bounded in time. Each check ends in
//! a [`verdict`], under the [`options`] asked for. Nothing here is specific to one provider:
//! the device, its GID and the hooks a program went through are all found, not assumed.
use serde::Serialize;

pub mod child;
pub mod clock;
pub mod device;
pub mod options;
pub mod paths;
pub mod shim;
pub mod software;
pub mod verdict;

pub use options::Options;
pub use verdict::{Check, Verdict};

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

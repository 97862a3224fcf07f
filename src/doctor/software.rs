//! UCX and libfabric (present? which version?) and /dev/shm space.
use super::child::run_bounded;
use super::verdict::{Check, Verdict};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

const GROUP: &str = "software";
/// Below this much free in /dev/shm, MPI's and UCX's shared-memory transports may fail to
/// start (each rank maps a few MiB per peer).
const SHM_LOW: u64 = 256 << 20;

/// What was found, with the checks saying so.
pub struct Software {
    /// UCX's version when `ucx_info` runs (the UCP path needs its `ucx_perftest`).
    pub ucx: Option<String>,
    pub checks: Vec<Check>,
}

pub fn check() -> Software {
    let ucx = version_of("ucx_info", &["-v"], parse_ucx_version);
    let fabric = version_of("fi_info", &["--version"], parse_libfabric_version);
    let checks = vec![
        library_check(
            "UCX",
            &ucx,
            "ucx_info",
            "the UCP path (UCX_TLS=rc/dc/ud over this device) is not checked; \
         install UCX (ucx-utils) if your MPI uses it",
        ),
        library_check(
            "libfabric",
            &fabric,
            "fi_info",
            "only needed when your MPI runs over libfabric (its verbs provider posts through \
         the same hooks)",
        ),
        shm_check(statvfs_free("/dev/shm")),
    ];
    Software {
        ucx: ucx.ok(),
        checks,
    }
}

fn version_of(
    tool: &str,
    args: &[&str],
    parse: fn(&str) -> Option<String>,
) -> Result<String, String> {
    let out = run_bounded(Command::new(tool).args(args), Duration::from_secs(20), None)?;
    parse(&out.output).ok_or_else(|| {
        format!(
            "`{tool} {}` said no version:\n{}",
            args.join(" "),
            out.output.trim()
        )
    })
}

fn library_check(name: &str, found: &Result<String, String>, tool: &str, missing: &str) -> Check {
    match found {
        Ok(v) => Check::new(GROUP, name, Verdict::Ok)
            .detail(format!("version {v} ({tool})"))
            .data(json!({ "version": v })),
        Err(e) => Check::new(GROUP, name, Verdict::Warn)
            .detail(format!("not found: {e}"))
            .advice(missing),
    }
}

/// `ucx_info -v`: "# Version 1.13.1".
pub fn parse_ucx_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim_start_matches('#').trim().strip_prefix("Version "))
        .map(|v| v.trim().to_string())
}

/// `fi_info --version`: "fi_info: 1.17.0\nlibfabric: 1.17.0\nlibfabric api: 1.17".
pub fn parse_libfabric_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("libfabric:"))
        .map(|v| v.trim().to_string())
}

/// Free bytes for an unprivileged user in the file system holding `path`.
fn statvfs_free(path: &str) -> Result<u64, String> {
    let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a valid path and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) } != 0 {
        return Err(format!("{path}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: statvfs succeeded and filled it.
    let s = unsafe { s.assume_init() };
    // The field types differ between targets (u32 on some 32-bit ones).
    #[allow(clippy::unnecessary_cast)]
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

/// /dev/shm carries the injector's live-control segments (`ibjitter inject`) and MPI's and
/// UCX's shared-memory transports.
pub fn shm_check(free: Result<u64, String>) -> Check {
    let c = Check::new(GROUP, "/dev/shm", Verdict::Ok);
    match free {
        Err(e) => c
            .verdict(Verdict::Warn)
            .detail(format!("cannot stat: {e}"))
            .advice("`ibjitter inject` (live control) needs /dev/shm; injection itself does not"),
        Ok(b) if b < SHM_LOW => c
            .verdict(Verdict::Warn)
            .detail(format!("{} MiB free", b >> 20))
            .advice(format!(
                "under {} MiB: shared-memory transports of MPI/UCX may fail to start",
                SHM_LOW >> 20
            ))
            .data(json!({ "free_bytes": b })),
        Ok(b) => c
            .detail(format!("{} MiB free", b >> 20))
            .data(json!({ "free_bytes": b })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_tools_outputs() {
        let ucx = "# Version 1.13.1\n# Git branch '<unknown>', revision 0000000\n# Configured with: --prefix=/usr\n";
        assert_eq!(parse_ucx_version(ucx).as_deref(), Some("1.13.1"));
        assert_eq!(parse_ucx_version("ucx_info: command not found"), None);
        let fi = "fi_info: 1.17.0\nlibfabric: 1.17.0\nlibfabric api: 1.17\n";
        assert_eq!(parse_libfabric_version(fi).as_deref(), Some("1.17.0"));
        assert_eq!(parse_libfabric_version("fi_info: 1.17.0\n"), None);
    }

    #[test]
    fn shm_verdicts() {
        assert_eq!(shm_check(Ok(4 << 30)).verdict, Verdict::Ok);
        assert_eq!(shm_check(Ok(10 << 20)).verdict, Verdict::Warn);
        assert_eq!(shm_check(Err("gone".into())).verdict, Verdict::Warn);
    }
}

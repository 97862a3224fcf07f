//! Running the programs the checks use: each bounded in time (a hung child is killed and
//! said so), output kept in a file (bounded when read back), servers started before their
//! clients and waited for until their TCP port listens.
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How much of a child's output is read back.
const MAX_OUTPUT: u64 = 1 << 20;
/// How long a server may take to listen, and to finish after its client.
const SERVER_GRACE: Duration = Duration::from_secs(20);

/// How a child ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its exit status (None: killed by a signal, or by us on timeout).
    pub code: Option<i32>,
    pub timed_out: bool,
    /// Its stdout and stderr, interleaved (the first MiB).
    pub output: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    /// "exit 1", "killed after 60 s", ...
    pub fn how(&self) -> String {
        match (self.code, self.timed_out) {
            (_, true) => "did not finish in time: killed".into(),
            (Some(c), _) => format!("exit status {c}"),
            (None, _) => "killed by a signal".into(),
        }
    }
}

/// Runs `cmd` to its end or `timeout`, its output into `log` (a temporary file when None).
/// Err when it cannot start.
pub fn run_bounded(
    cmd: &mut Command,
    timeout: Duration,
    log: Option<&Path>,
) -> Result<Finished, String> {
    let (child, path) = spawn_logged(cmd, log)?;
    let f = wait_bounded(child, timeout, &path);
    if log.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    Ok(f)
}

/// A server and its client: the server started, waited for until it listens on TCP `port`,
/// then the client run to its end or `timeout`, then the server waited for. Outputs in
/// `dir/LABEL.server.out` and `dir/LABEL.client.out`. Err when either cannot start, or the
/// server never listened.
pub fn pair(
    server: &mut Command,
    client: &mut Command,
    port: u16,
    timeout: Duration,
    dir: &Path,
    label: &str,
) -> Result<(Finished, Finished), String> {
    let spath = dir.join(format!("{label}.server.out"));
    let (mut s, spath) = spawn_logged(server, Some(&spath))?;
    let start = Instant::now();
    loop {
        if listening(port) {
            break;
        }
        if let Ok(Some(_)) = s.try_wait() {
            let f = wait_bounded(s, SERVER_GRACE, &spath);
            return Err(format!(
                "the server ended ({}) before listening on port {port}:\n{}",
                f.how(),
                f.output.trim()
            ));
        }
        if start.elapsed() > SERVER_GRACE {
            let f = wait_bounded(s, Duration::ZERO, &spath);
            return Err(format!(
                "the server did not listen on port {port} within {} s:\n{}",
                SERVER_GRACE.as_secs(),
                f.output.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpath = dir.join(format!("{label}.client.out"));
    let c = match spawn_logged(client, Some(&cpath)) {
        Ok((c, _)) => wait_bounded(c, timeout, &cpath),
        Err(e) => {
            wait_bounded(s, Duration::ZERO, &spath);
            return Err(e);
        }
    };
    let s = wait_bounded(s, SERVER_GRACE, &spath);
    Ok((c, s))
}

/// A TCP port nobody listens on now (the kernel's pick; free again when we return).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free TCP port: {e}"))
}

/// Whether some socket listens on TCP `port` (IPv4 or IPv6), from /proc/net. Looking, not
/// connecting: perftest's servers take the first connection as their client.
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|p| {
        std::fs::read_to_string(p)
            .map(|t| listening_in(&t, port))
            .unwrap_or(false)
    })
}

/// Whether a /proc/net/tcp{,6} table has a LISTEN (state 0A) socket on `port`.
pub fn listening_in(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.len() > 3
            && w[3] == "0A"
            && w[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port)
    })
}

fn spawn_logged(cmd: &mut Command, log: Option<&Path>) -> Result<(Child, PathBuf), String> {
    let (out, path) = match log {
        Some(p) => {
            let out = File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            (out, p.to_path_buf())
        }
        // A new file of its own in the shared temporary directory.
        None => crate::temp_files::new_file(
            &std::env::temp_dir(),
            &format!("ibjitter-doctor.{}", std::process::id()),
            "out",
        )
        .map_err(|e| format!("cannot write a temporary file: {e}"))?,
    };
    let prog = cmd.get_program().to_string_lossy().into_owned();
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    match cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn() {
        Ok(child) => Ok((child, path)),
        Err(e) => {
            if log.is_none() {
                // Nothing will write it: the temporary log goes (it was left empty in /tmp).
                let _ = std::fs::remove_file(&path);
            }
            Err(format!("cannot run {prog}: {e}"))
        }
    }
}

fn wait_bounded(mut child: Child, timeout: Duration, log: &Path) -> Finished {
    let start = Instant::now();
    let (code, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(st)) => break (st.code(), false),
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break (None, true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => {
                let _ = child.kill();
                break (None, false);
            }
        }
    };
    let mut output = String::new();
    if let Ok(f) = File::open(log) {
        let mut bytes = Vec::new();
        let _ = f.take(MAX_OUTPUT).read_to_end(&mut bytes);
        output = String::from_utf8_lossy(&bytes).into_owned();
    }
    Finished {
        code,
        timed_out,
        output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_found_by_port_and_state() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
                 0: 00000000:4A64 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1\n   \
                 1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 2 1\n";
        assert!(listening_in(t, 0x4A64));
        // Port 8080 (1F90) is an established connection, not a listener.
        assert!(!listening_in(t, 0x1F90));
        assert!(!listening_in(t, 1));
    }

    #[test]
    fn a_hung_child_is_killed_and_said_so() {
        let start = Instant::now();
        let f = run_bounded(
            Command::new("sleep").arg("30"),
            Duration::from_millis(200),
            None,
        )
        .unwrap();
        assert!(f.timed_out && !f.ok(), "{f:?}");
        assert!(f.how().contains("killed"), "{}", f.how());
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn output_and_status_come_back_and_a_missing_program_is_an_error() {
        let f = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
            None,
        )
        .unwrap();
        assert_eq!(f.code, Some(3));
        assert!(
            f.output.contains("out") && f.output.contains("err"),
            "{f:?}"
        );
        let e = run_bounded(
            &mut Command::new("/nonexistent/ibjitter-no-such-tool"),
            Duration::from_secs(1),
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("cannot run /nonexistent/ibjitter-no-such-tool"),
            "{e}"
        );
    }
}

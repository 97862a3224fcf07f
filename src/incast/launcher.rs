//! Starting a process "on" a host through the cluster's own launcher: a template such as
//! `ssh {host}`, `srun -w {host} -N1`, or `tools/vm/on-host {host}` on the bench, followed by
//! the command. No daemon of our own: placement is the launcher's business.
use std::collections::HashSet;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// Quotes one argument for `sh` (arguments pass through the local shell, and through the
/// remote one with ssh).
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b))
    {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The shell command line that runs `args` on `host` through `template`.
pub fn command_line(template: &str, host: &str, args: &[String]) -> String {
    let prefix = template.replace("{host}", host);
    let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    format!("{prefix} {}", quoted.join(" "))
}

/// Starts it in its own process group (so Ctrl-C reaches it only through us, and reaches
/// everything the launcher started).
pub fn spawn(line: &str, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .arg("-c")
        .arg(line)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
}

/// A command started by [`spawn`] and everything it started: its process group, led by our
/// child. The group may outlive its leader (a launcher that forks and exits, a wrapper shell
/// stopped before its command). The group's id is the leader's pid, which stays ours until
/// the leader is reaped (a zombie holds it): so the leader is reaped only by [`Group::reap`],
/// and the group is signalled only before that. Signalled later, its id may be another
/// group's.
pub struct Group {
    child: Child,
    reaped: Option<ExitStatus>,
}

impl Group {
    /// [`spawn`]s `line` as a group.
    pub fn spawn(line: &str, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> io::Result<Group> {
        let child = spawn(line, stdin, stdout, stderr)?;
        Ok(Group {
            child,
            reaped: None,
        })
    }

    /// Starts `cmd` as a group: in a process group of its own (`process_group(0)`), led by
    /// it. Whatever else `cmd` was given (environment, `pre_exec`, output) is kept.
    pub fn start(cmd: &mut Command) -> io::Result<Group> {
        use std::os::unix::process::CommandExt;
        let child = cmd.process_group(0).spawn()?;
        Ok(Group {
            child,
            reaped: None,
        })
    }

    /// The group's id: its leader's pid.
    pub fn id(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// How the leader ended (`None`: it runs), as `Child::try_wait` says it, but leaving it
    /// unreaped.
    pub fn exited(&self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.reaped {
            return Ok(Some(status));
        }
        // SAFETY: all zeroes is a valid siginfo_t; waitid(2) with WNOWAIT on our own child
        // only reads its state.
        let info = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            if libc::waitid(libc::P_PID, self.child.id(), &mut info, options) != 0 {
                return Err(io::Error::last_os_error());
            }
            info
        };
        // SAFETY: waitid filled in a child's state, or left si_pid zero (it runs).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        // As waitpid(2) would have said it: an exit code, or the signal that ended it.
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        Ok(Some(ExitStatus::from_raw(raw)))
    }

    /// Whether the leader still runs (an error reading it counts as no).
    pub fn running(&self) -> bool {
        matches!(self.exited(), Ok(None))
    }

    /// Sends `signal` to every process of the group; nothing once the leader is reaped.
    pub fn signal(&self, signal: i32) {
        if self.reaped.is_none() {
            // SAFETY: kill(2) on the group of our unreaped child: its id is still ours.
            unsafe {
                libc::kill(-self.id(), signal);
            }
        }
    }

    /// SIGKILL to the group, and to the leader itself should it have left it (setsid).
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if self.reaped.is_none() {
            let _ = self.child.kill();
        }
    }

    /// Waits for the leader and reaps it: the group is not signalled after this.
    pub fn reap(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.child.wait().ok();
        }
        self.reaped
    }

    pub fn is_reaped(&self) -> bool {
        self.reaped.is_some()
    }
}

/// Whether a process of any of `groups` still runs: a leader, or what one left running in its
/// group when it exited (kill(-pgid, 0) would count the unreaped leader itself), as /proc lists
/// them (if it cannot be read: yes). Leaders are looked at first: one that forks and exits
/// while /proc is read would leave its new process unlisted. A member that does the same is
/// missed, and only the grace before SIGKILL is shortened.
/// The processes `/proc` lists now, with their entries (None when it cannot be read).
pub fn processes() -> Option<impl Iterator<Item = (u32, std::fs::DirEntry)>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    Some(dir.flatten().filter_map(|entry| {
        let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
        Some((pid, entry))
    }))
}

pub fn any_running<'a>(groups: impl IntoIterator<Item = &'a Group> + Clone) -> bool {
    if groups.clone().into_iter().any(Group::running) {
        return true;
    }
    let Some(processes) = processes() else {
        return true;
    };
    let ours: HashSet<i32> = groups
        .into_iter()
        .filter(|g| !g.is_reaped())
        .map(Group::id)
        .collect();
    for (pid, _) in processes {
        // Gone since it was listed: not running.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name in parentheses: state, parent, group. A zombie only waits to
        // be reaped.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (state, group) = (fields.next(), fields.nth(1));
        let group = group.and_then(|g| g.parse::<i32>().ok());
        if !matches!(state, Some("Z" | "X" | "x")) && group.is_some_and(|g| ours.contains(&g)) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_quoting() {
        let args: Vec<String> = ["ibjitter", "run", "10.0.0.1", "--flows", "100"]
            .map(String::from)
            .into();
        assert_eq!(
            command_line("ssh {host}", "node7", &args),
            "ssh node7 ibjitter run 10.0.0.1 --flows 100"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn spawned_command_runs_through_the_template() {
        let args: Vec<String> = ["echo", "hello world"].map(String::from).into();
        let line = command_line("env HOST={host}", "h1", &args);
        let out = spawn(&line, Stdio::null(), Stdio::piped(), Stdio::null())
            .unwrap()
            .wait_with_output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world\n");
    }

    #[test]
    fn a_group_outlives_its_leader_until_it_is_stopped() {
        // The leader exits at once, its background sleep stays in the group.
        let mut g = Group::spawn(
            "sleep 30 >/dev/null 2>&1 & exit 3",
            Stdio::null(),
            Stdio::null(),
            Stdio::null(),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while g.running() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Read twice: the leader is not reaped by reading how it ended.
        assert_eq!(g.exited().unwrap().and_then(|s| s.code()), Some(3));
        assert_eq!(g.exited().unwrap().and_then(|s| s.code()), Some(3));
        assert!(any_running([&g]));
        g.signal(libc::SIGKILL);
        while any_running([&g]) {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(g.reap().and_then(|s| s.code()), Some(3));
        assert!(!any_running([&g]));
    }
}

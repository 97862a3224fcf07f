//! Starting a process "on" a host through the cluster's own launcher: a template such as
//! `ssh {host}`, `srun -w {host} -N1`, or `tools/vm/on-host {host}` on the bench, followed by
//! the command. No daemon of our own: placement is the launcher's business.
use std::process::{Child, Command, Stdio};

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

/// Sends `signal` to a child's whole process group.
pub fn signal_group(child: &Child, signal: i32) {
    // SAFETY: kill(2) on a process group we created; a group that is gone gives ESRCH.
    unsafe {
        libc::kill(-(child.id() as i32), signal);
    }
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
}

//! `ibjitter exec` on the host, with the real release libibjitter.so: a refused setting stops
//! everything with the shim's own message; an accepted one replaces ibjitter by the program
//! (same pid, its environment, exit status and signal); every variable the shim reads has a
//! flag; an installed layout finds its shim without --shim.
mod common;
use common::bench::{release_artifact, repo_root, scratch_dir};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn shim() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| release_artifact("ibjitter-shim", "libibjitter.so"))
        .clone()
}

/// Runs `cmd` to its end, killed (and the test failed) after 60 s.
fn bounded(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn exec(args: &[&str], program: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.arg("exec")
        .arg("--shim")
        .arg(shim())
        .args(args)
        .arg("--")
        .args(program)
        .env_remove("LD_PRELOAD");
    bounded(cmd)
}

/// A script that says its pid (the `ibjitter exec` pid must be the same) and its
/// environment, then leaves a mark that it ran.
fn reporter(dir: &Path) -> PathBuf {
    let script = dir.join("report.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"pid $$\"\nenv | grep -E '^(LD_PRELOAD|IBJITTER_)' | sort\n\
         touch \"$(dirname \"$0\")/ran\"\n",
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    script
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_refused_setting_is_the_shims_message_exit_2_and_nothing_runs() {
    let dir = scratch_dir("exec-refused");
    let script = reporter(&dir);
    for (flag, value, said) in [
        ("--delay", "100ux", "IBJITTER_DELAY=\"100ux\""),
        ("--mode", "lines", "IBJITTER_MODE=lines"),
        (
            "--table",
            "relative.dist",
            "IBJITTER_TABLE=relative.dist: give an absolute path",
        ),
    ] {
        let out = exec(&[flag, value], &[script.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains("ibjitter: warning:") && err.contains(said),
            "{flag} {value}: the shim's message expected, got: {err}"
        );
        assert!(
            out.stdout.is_empty(),
            "the program ran: {}",
            text(&out.stdout)
        );
        assert!(
            !dir.join("ran").exists(),
            "the program ran after {flag} {value}"
        );
    }
    // Settings that only conflict together are judged together, as the shim would.
    let out = exec(
        &["--table", "/nonexistent/t.dist", "--delay", "1ms"],
        &[script.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("do not combine"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("ran").exists());
}

#[test]
fn an_accepted_setting_runs_the_program_in_the_same_process_under_the_shim() {
    let dir = scratch_dir("exec-accepted");
    let script = reporter(&dir);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.arg("exec")
        .arg("--shim")
        .arg(shim())
        .args([
            "--delay", "100us", "--jitter", "20us", "--seed", "7", "--quiet",
        ])
        .arg("--")
        .arg(&script)
        .env("LD_PRELOAD", "/nonexistent/libother.so");
    let child_pid;
    let out = {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child_pid = child.id();
        child.wait_with_output().unwrap()
    };
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!("pid {child_pid}\n")),
        "the program must be the process ibjitter exec was (pid {child_pid}): {stdout}"
    );
    let shim = std::fs::canonicalize(shim()).unwrap();
    for line in [
        format!("LD_PRELOAD={} /nonexistent/libother.so", shim.display()),
        "IBJITTER_DELAY=100us".to_string(),
        "IBJITTER_JITTER=20us".to_string(),
        "IBJITTER_SEED=7".to_string(),
        "IBJITTER_QUIET=1".to_string(),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in: {stdout}"
        );
    }
    assert!(dir.join("ran").exists());
}

/// A program the dynamic loader will not preload into (statically linked; set-user-ID to
/// another user) runs, but with a warning that nothing is injected into it: it ran silently
/// uninjected before. A dynamically linked one (the `sh` of the other tests) gets none.
#[test]
fn a_program_the_loader_will_not_preload_into_is_said() {
    let dir = scratch_dir("exec-unpreloadable");
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 0; }\n",
    )
    .unwrap();
    let fixed = dir.join("hello-static");
    let cc = Command::new("cc")
        .arg("-static")
        .arg("-o")
        .arg(&fixed)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(cc.success(), "cc -static (libc6-dev's libc.a)");
    let out = exec(&["--delay", "10us"], &[fixed.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout), "ran\n");
    assert!(
        err.contains("warning")
            && err.contains("is statically linked")
            && err.contains("nothing is injected"),
        "{err}"
    );
    // Set-user-ID to another user (root makes it, as CI runs the tests).
    let privileged = dir.join("true-setuid");
    std::fs::copy(true_program(), &privileged).unwrap();
    let own = Command::new("sh")
        .arg("-c")
        .arg("chown 65534 \"$0\" && chmod 4755 \"$0\"")
        .arg(&privileged)
        .status()
        .unwrap();
    assert!(own.success(), "chown/chmod (needs root)");
    let out = exec(&["--delay", "10us"], &[privileged.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("is set-user-ID") && err.contains("ignores LD_PRELOAD"),
        "{err}"
    );
    let out = exec(&["--delay", "10us"], &["sh", "-c", "true"]);
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
}

/// `true`, a dynamically linked program every Debian machine has.
fn true_program() -> &'static str {
    ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("a true program")
}

#[test]
fn exit_status_and_signal_death_are_the_programs() {
    let out = exec(&["--delay", "10us"], &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let out = exec(&["--delay", "10us"], &["sh", "-c", "kill -USR1 $$"]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGUSR1),
        "{:?} {}",
        out.status,
        text(&out.stderr)
    );
    let out = exec(&["--delay", "10us"], &["/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot run /nonexistent/program"));
}

#[test]
fn every_variable_the_shim_reads_has_a_flag() {
    use ibjitter::inject_env::{INTERNAL_VARS, SETTINGS};
    // Every "IBJITTER_…" string literal in the shim's sources is a variable it reads or says.
    let mut read = std::collections::BTreeSet::new();
    let mut files = vec![repo_root().join("shim/src")];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|e| e == "rs") {
            let src = std::fs::read_to_string(&p).unwrap();
            for piece in src.split("\"IBJITTER_").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                if piece[name.len()..].starts_with('"') && !name.is_empty() {
                    read.insert(format!("IBJITTER_{name}"));
                }
            }
        }
    }
    // The table crate's named-table directory, read by the shim through it.
    read.insert(ibjitter::table::format::DISTRIBUTIONS_ENV.to_string());
    assert!(read.len() > 20, "found only {read:?}");
    let flagged: std::collections::BTreeSet<_> = SETTINGS.iter().map(|s| s.var).collect();
    let missing: Vec<_> = read
        .iter()
        .filter(|v| !flagged.contains(v.as_str()) && !INTERNAL_VARS.contains(&v.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "shim variables without an exec flag: {missing:?}"
    );
    // And each flag is accepted by `ibjitter exec` and named in its help.
    let help = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(["exec", "--help"])
        .output()
        .unwrap();
    let help = text(&help.stdout);
    for s in SETTINGS {
        assert!(
            help.contains(&format!("--{}", s.flag)) && help.contains(&format!("[{}]", s.var)),
            "--{} [{}] not in exec --help",
            s.flag,
            s.var
        );
    }
}

#[test]
fn an_installed_layout_finds_its_shim_and_tables() {
    let prefix = scratch_dir("exec-installed");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib/ibjitter")).unwrap();
    std::fs::create_dir_all(prefix.join("share/ibjitter/distributions")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_ibjitter"), prefix.join("bin/ibjitter")).unwrap();
    std::fs::copy(shim(), prefix.join("lib/ibjitter/libibjitter.so")).unwrap();
    // A table only the installed directory has.
    std::fs::copy(
        repo_root().join("distributions/normal.dist"),
        prefix.join("share/ibjitter/distributions/only-installed.dist"),
    )
    .unwrap();
    let run = |dist: &str| {
        let mut cmd = Command::new(prefix.join("bin/ibjitter"));
        cmd.args(["exec", "--dist", dist, "--delay", "50us", "--jitter", "5us"])
            .args(["--", "sh", "-c", "echo \"$LD_PRELOAD\""])
            .env_remove("LD_PRELOAD")
            .env_remove("IBJITTER_DISTRIBUTIONS");
        bounded(cmd)
    };
    let out = run("only-installed");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let want = std::fs::canonicalize(prefix.join("lib/ibjitter/libibjitter.so")).unwrap();
    assert_eq!(text(&out.stdout).trim(), want.to_str().unwrap());
    let out = run("no-such-table");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no such named distribution"));
}

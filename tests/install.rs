//! The offline source bundle (tools/release) builds and installs with no network: unpacked in a
//! temporary directory, built by `cargo build --offline` with `CARGO_NET_OFFLINE=true` and an
//! empty `CARGO_HOME` (so only its vendored crates can be used), installed by `tools/install
//! --prefix`, and the installed `ibjitter` runs a program under its own installed shim.
//! It builds the project once, in release (a few minutes on 2 cores).
mod common;
use common::bench::{repo_root, scratch_dir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(what: &str, cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Only the bundle and the toolchain: an empty cargo home, no network, a private target dir,
/// this test's cargo (not a rustup proxy that would look in the cargo home) first in PATH.
fn offline<'a>(cmd: &'a mut Command, tmp: &Path) -> &'a mut Command {
    let cargo = PathBuf::from(env!("CARGO"));
    let path = format!(
        "{}:{}",
        cargo.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.env("CARGO_HOME", tmp.join("cargo-home"))
        .env("CARGO_NET_OFFLINE", "true")
        .env("CARGO_TARGET_DIR", tmp.join("target"))
        // No debug info: the build from scratch is this test's time.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("PATH", path)
        .env_remove("RUSTC_WRAPPER")
        .env_remove("LD_PRELOAD")
        .env_remove("IBJITTER_DISTRIBUTIONS")
}

#[test]
fn the_offline_bundle_builds_installs_and_runs_without_network() {
    let tmp = scratch_dir("install-offline");
    std::fs::create_dir_all(tmp.join("cargo-home")).unwrap();
    let out = run(
        "tools/release",
        Command::new(repo_root().join("tools/release"))
            .arg("--out")
            .arg(tmp.join("dist")),
    );
    let bundle = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(bundle.is_file(), "no bundle at {}", bundle.display());
    run(
        "unpacking the bundle",
        Command::new("tar")
            .arg("-xzf")
            .arg(&bundle)
            .arg("-C")
            .arg(&tmp),
    );
    let name = bundle
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .trim_end_matches(".tar.gz");
    let src = tmp.join(name);
    for part in [
        "Cargo.lock",
        "vendor",
        ".cargo/config.toml",
        "tools/install",
    ] {
        assert!(src.join(part).exists(), "the bundle has no {part}");
    }

    run(
        "cargo build --offline in the bundle",
        offline(&mut Command::new(env!("CARGO")), &tmp)
            .current_dir(&src)
            .args([
                "build",
                "--offline",
                "--release",
                "-p",
                "ibjitter",
                "-p",
                "ibjitter-shim",
            ]),
    );
    // Nothing came from a registry: the empty cargo home stayed without one.
    assert!(
        !tmp.join("cargo-home/registry").exists(),
        "cargo fetched into the empty CARGO_HOME"
    );
    let prefix = tmp.join("prefix");
    run(
        "tools/install --prefix",
        offline(&mut Command::new(src.join("tools/install")), &tmp)
            .arg("--prefix")
            .arg(&prefix),
    );
    for f in [
        "bin/ibjitter",
        "lib/ibjitter/libibjitter.so",
        "share/ibjitter/distributions/normal.dist",
        "share/man/man1/ibjitter.1",
        "share/man/man1/ibjitter-exec.1",
        "share/man/man1/ibjitter-study.1",
        "share/bash-completion/completions/ibjitter",
        "share/zsh/site-functions/_ibjitter",
        "share/fish/vendor_completions.d/ibjitter.fish",
    ] {
        assert!(prefix.join(f).is_file(), "not installed: {f}");
    }

    // The installed binary, away from both trees, uses its installed shim.
    let ibj = prefix.join("bin/ibjitter");
    let out = run(
        "PREFIX/bin/ibjitter exec --delay 100us -- /bin/true",
        Command::new(&ibj)
            .args(["exec", "--delay", "100us", "--", "/bin/true"])
            .env_remove("LD_PRELOAD")
            .current_dir("/"),
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        "PREFIX/bin/ibjitter exec -- sh",
        Command::new(&ibj)
            .args([
                "exec",
                "--delay",
                "100us",
                "--",
                "sh",
                "-c",
                "echo $LD_PRELOAD",
            ])
            .env_remove("LD_PRELOAD"),
    );
    let shim = std::fs::canonicalize(prefix.join("lib/ibjitter/libibjitter.so")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        shim.to_str().unwrap()
    );
    let out = run(
        "PREFIX/bin/ibjitter --help",
        Command::new(&ibj).arg("--help"),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("exec"));
    let _ = std::fs::remove_dir_all(&tmp);
}

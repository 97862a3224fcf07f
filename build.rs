//! Records the version string that tables and reports stamp into their headers
//! ("ibjitter 0.1.0 (git abc1234)"), so every generated file says what made it.
use std::process::Command;

fn main() {
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let version = env!("CARGO_PKG_VERSION");
    let full = if git.is_empty() {
        version.to_string()
    } else {
        format!("{version} (git {git})")
    };
    println!("cargo:rustc-env=IBJITTER_VERSION={full}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}

//! Helpers for `ibjitter study`'s tests: the independent recomputation and the run order.
use std::path::Path;
use std::process::Command;

/// Runs tests/common/study_check.py on a study's directory (every figure of summary.json
/// recomputed from study.csv with Python's statistics module); fails the test on any
/// disagreement and returns what it printed.
pub fn check(dir: &Path) -> String {
    let out = Command::new("python3")
        .arg(super::bench::repo_root().join("tests/common/study_check.py"))
        .arg(dir)
        .output()
        .expect("python3");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {text}", dir.display());
    text
}

/// The order-deciding columns of study.csv: run, round, config, kind, warmup, seed.
pub fn schedule(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("study.csv"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(',').take(6).collect::<Vec<_>>().join(","))
        .collect()
}

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

/// The counted runs' metrics (not warm-up, ok) of each configuration in a study's study.csv.
pub fn metrics(dir: &Path) -> std::collections::BTreeMap<String, Vec<f64>> {
    let text = std::fs::read_to_string(dir.join("study.csv")).unwrap_or_default();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (config, warmup, ok, metric) = (col("config"), col("warmup"), col("ok"), col("metric"));
    let mut by = std::collections::BTreeMap::<String, Vec<f64>>::new();
    for l in lines {
        let c: Vec<&str> = l.split(',').collect();
        if c[warmup] == "0" && c[ok] == "1" {
            by.entry(c[config].to_string())
                .or_default()
                .push(c[metric].parse().unwrap());
        }
    }
    by
}

/// The median of `xs` (mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    assert!(n > 0, "median of nothing");
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The configurations' names in a summary.json, in its order.
pub fn configuration_names(summary: &serde_json::Value) -> Vec<String> {
    summary["configurations"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

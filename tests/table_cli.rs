//! `ibjitter table …` end to end: files in, files out, one-line errors with positions and
//! non-zero exit codes, never a panic.

use ibjitter::table::dist::{std_normal_quantile, LogNormal};
use ibjitter::table::stats::Stats;
use ibjitter::table::{read, Kind};
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ibjitter-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ibjitter(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    out
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Latencies in microseconds, one per line.
fn write_samples(path: &Path, truth: &LogNormal, n: usize) {
    let mut rng = Pcg64::seed_from_u64(99);
    let text: String = (0..n)
        .map(|_| {
            let u = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let ns = truth.loc_ns + truth.scale_ns * (truth.shape * std_normal_quantile(u)).exp();
            format!("{}\n", ns / 1000.0)
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn bad_table_is_one_line_with_position_and_exit_1() {
    let d = TempDir::new("bad");
    let f = d.path("bad.dist");
    std::fs::write(&f, "1 2 3\n4 five 6\n").unwrap();
    let out = ibjitter(&["table", "stats", p(&f)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{}:2:3: expected", f.display())),
        "{err}"
    );
    // A netem table read as absolute says how to read it.
    let out = ibjitter(&["table", "stats", "/usr/lib/x86_64-linux-gnu/tc/normal.dist"]);
    if Path::new("/usr/lib/x86_64-linux-gnu/tc/normal.dist").exists() {
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--netem"));
    }
    let out = ibjitter(&["table", "stats", p(&d.path("missing.dist"))]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn argument_errors_exit_non_zero() {
    let out = ibjitter(&["table", "lognormal", "--shape", "0.5", "--scale", "3"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no unit"));
    let out = ibjitter(&["table", "lognormal", "--shape", "0.5"]);
    assert_eq!(out.status.code(), Some(1));
    let out = ibjitter(&[
        "table", "normal", "--mu", "5us", "--sigma", "1us", "--format", "netem",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let out = ibjitter(&["table", "normal"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "absolute normal needs mu and sigma"
    );
}

#[test]
fn lognormal_table_to_file_and_stats_json() {
    let d = TempDir::new("logn");
    let f = d.path("t.dist");
    let out = ibjitter(&[
        "table",
        "lognormal",
        "--mean",
        "12us",
        "--sd",
        "5us",
        "--loc",
        "4us",
        "-o",
        p(&f),
    ]);
    assert!(out.status.success());
    let t = read(&f, Kind::Absolute).unwrap();
    assert!(t.comments.iter().any(|c| c.contains("lognormal")));
    let out = ibjitter(&["table", "stats", p(&f), "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mean = v["stats"]["mean"].as_f64().unwrap();
    assert!((mean / 12_000.0 - 1.0).abs() < 0.005, "{v}");
    assert_eq!(mean, Stats::of_i64(&t.entries).mean);
}

#[test]
fn fit_prints_parameters_and_writes_the_table() {
    let d = TempDir::new("fit");
    let samples = d.path("lat.txt");
    let truth = LogNormal::new(0.6, 2_000.0, 5_000.0).unwrap();
    write_samples(&samples, &truth, 20_000);
    let table = d.path("fit.dist");
    let out = ibjitter(&[
        "table",
        "fit",
        "--samples",
        p(&samples),
        "--unit",
        "us",
        "--json",
        "-o",
        p(&table),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        (v["shape"].as_f64().unwrap() / 0.6 - 1.0).abs() < 0.05,
        "{v}"
    );
    assert!(
        (v["loc_ns"].as_f64().unwrap() / 5_000.0 - 1.0).abs() < 0.05,
        "{v}"
    );
    assert!(v["ks_distance"].as_f64().unwrap() < 0.02);
    let t = read(&table, Kind::Absolute).unwrap();
    assert!(t
        .comments
        .iter()
        .any(|c| c.contains("fitted by maximum likelihood")));
    // Text output names every figure.
    let out = ibjitter(&["table", "fit", "--samples", p(&samples), "--unit", "us"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["shape", "loc", "scale", "mean", "sd", "KS distance"] {
        assert!(text.contains(word), "{word} missing: {text}");
    }
    // Without a unit the plain file is refused, with a position.
    let out = ibjitter(&["table", "fit", "--samples", p(&samples)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":1:1: expected a unit"));
}

#[test]
fn perftest_dump_and_empirical() {
    let d = TempDir::new("perftest");
    let dump = d.path("ib_write_lat.txt");
    let mut text = String::from(" #bytes #iterations    t_min[usec]\n#, usec\n");
    for i in 0..5000 {
        text.push_str(&format!("{}, {}\n", i + 1, 6.0 + (i % 100) as f64 * 0.01));
    }
    text.push_str(" 2       5000          6.00\n");
    std::fs::write(&dump, text).unwrap();
    let table = d.path("emp.dist");
    let out = ibjitter(&["table", "empirical", "--samples", p(&dump), "-o", p(&table)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = Stats::of_i64(&read(&table, Kind::Absolute).unwrap().entries);
    assert!(s.min >= 6_000.0 && s.max <= 6_990.0, "{s:?}");
    assert!((s.mean - 6_495.0).abs() < 5.0, "{s:?}");
}

#[test]
fn family_from_samples_writes_all_tables() {
    let d = TempDir::new("family");
    let samples = d.path("lat.txt");
    write_samples(
        &samples,
        &LogNormal::new(0.5, 1_400.0, 5_000.0).unwrap(),
        5_000,
    );
    let dir = d.path("fam");
    let out = ibjitter(&[
        "table",
        "family",
        "--from",
        p(&samples),
        "--unit",
        "us",
        "--prefix",
        "lvl",
        "-o",
        p(&dir),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut means = Vec::new();
    for name in [
        "lvl",
        "lvl-scale75",
        "lvl-scale50",
        "lvl-scale25",
        "lvl-uniform",
    ] {
        let t = read(&dir.join(format!("{name}.dist")), Kind::Absolute).unwrap();
        means.push(Stats::of_i64(&t.entries).mean);
    }
    for m in &means {
        assert!((m / means[0] - 1.0).abs() < 1e-3, "{means:?}");
    }
}

#[test]
fn seed_and_netem_stats() {
    let d = TempDir::new("seed");
    let f = d.path("seed");
    assert!(ibjitter(&["table", "seed", "--value", "42", "-o", p(&f)])
        .status
        .success());
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "42\n");
    let out = ibjitter(&["table", "seed"]);
    let v: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(v < 1 << 32);
    let n = d.path("normal.dist");
    assert!(
        ibjitter(&["table", "normal", "--format", "netem", "-o", p(&n)])
            .status
            .success()
    );
    let out = ibjitter(&[
        "table",
        "stats",
        p(&n),
        "--netem",
        "--mu",
        "10us",
        "--sigma",
        "2us",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        (v["stats"]["mean"].as_f64().unwrap() - 10_000.0).abs() < 5.0,
        "{v}"
    );
    assert!(
        (v["stats"]["sd"].as_f64().unwrap() / 2_000.0 - 1.0).abs() < 0.01,
        "{v}"
    );
}

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

/// A family's file names come from its fractions and --prefix: two fractions that name one
/// file (0.5 and 0.5000000001; 1, the base's) are refused, as is a prefix that is a path;
/// nothing is written then. Before: 6 rows printed, 4 files written (the base's overwritten by
/// the 1.0 member), or every table written outside -o.
#[test]
fn family_names_never_collide_or_leave_the_output_directory() {
    let d = TempDir::new("family-names");
    let dir = d.path("fam");
    let base = [
        "table",
        "family",
        "--shape",
        "0.5",
        "--scale",
        "10us",
        "-o",
        p(&dir),
    ];
    for fractions in ["0.5,0.5000000001", "0.5,1"] {
        let out = ibjitter(&[&base[..], &["--fractions", fractions]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{fractions}: {err}");
        assert!(err.contains("two members would both be"), "{err}");
        assert!(!dir.exists(), "{fractions}: nothing written");
    }
    let elsewhere = d.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let prefix = format!("{}/pwn", p(&elsewhere));
    let out = ibjitter(&[&base[..], &["--fractions", "0.5", "--prefix", &prefix]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("expected a file name"), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

/// A location (or netem's mu) may be negative, as documented: "--loc -1us" was refused by
/// the argument parser ("unexpected argument '-1' found"); only "--loc=-1us" worked.
#[test]
fn a_negative_location_is_a_value_not_a_flag() {
    let d = TempDir::new("negative-loc");
    let t = d.path("t.dist");
    for args in [
        &[
            "lognormal",
            "--shape",
            "0.5",
            "--scale",
            "10us",
            "--loc",
            "-1us",
        ][..],
        &["exponential", "--mean", "10us", "--loc", "-1us"][..],
    ] {
        let out = ibjitter(&[&["table"][..], args, &["-o", p(&t)]].concat());
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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

/// A calm/congested series of known parameters (50 ms calm, 10 ms congested; latencies around
/// 5 us and 200 us), sampled every 100 us for 10 s: `TIME LATENCY` lines, latency in us.
fn write_episode_series(path: &Path) {
    use ibjitter::table::episodes::Model;
    let model = Model {
        calm: LogNormal::new(0.3, 5_000.0, 0.0).unwrap(),
        congested: LogNormal::new(0.4, 200_000.0, 0.0).unwrap(),
        mean_calm_ns: 50e6,
        mean_congested_ns: 10e6,
    };
    let mut text = String::from("# synthetic\ntime_s,latency_us\n");
    for pt in model.sample(100e3, 10e9, 11) {
        text.push_str(&format!(
            "{:.6},{:.3}\n",
            pt.time_ns / 1e9,
            pt.latency_ns / 1e3
        ));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn episodes_writes_both_tables_and_the_injector_line() {
    use ibjitter::table::duration::parse_duration;
    let d = TempDir::new("episodes");
    let series = d.path("series.csv");
    write_episode_series(&series);
    let dir = d.path("out");
    let args = [
        "table",
        "episodes",
        "--from",
        p(&series),
        "--unit",
        "us",
        "--out-dir",
        p(&dir),
        "--prefix",
        "rc",
    ];
    let out = ibjitter(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!text.contains("warning"), "{text}");
    for word in [
        "threshold",
        "sampling interval",
        "calm",
        "congested",
        "mean dwell",
    ] {
        assert!(text.contains(word), "{word} missing: {text}");
    }
    let (calm, congested) = (dir.join("rc-calm.dist"), dir.join("rc-congested.dist"));
    let env_line = text
        .lines()
        .find(|l| l.starts_with("IBJITTER_EPISODES="))
        .unwrap_or_else(|| panic!("no IBJITTER_EPISODES line: {text}"));
    let value = env_line.strip_prefix("IBJITTER_EPISODES=").unwrap();
    let fields: Vec<&str> = value.split(':').collect();
    assert_eq!(fields.len(), 4, "{env_line}");
    assert_eq!(&fields[..2], [p(&calm), p(&congested)]);
    let dwell = |s: &str| parse_duration(s).unwrap();
    assert!((dwell(fields[2]) / 50e6 - 1.0).abs() < 0.25, "{env_line}");
    assert!((dwell(fields[3]) / 10e6 - 1.0).abs() < 0.25, "{env_line}");

    // Both tables are absolute tables of their state's latencies, saying how they were made.
    for (path, median, state) in [
        (&calm, 5_000.0, "calm"),
        (&congested, 200_000.0, "congested"),
    ] {
        let t = read(path, Kind::Absolute).unwrap();
        let s = Stats::of_i64(&t.entries);
        assert!((s.p50 / median - 1.0).abs() < 0.1, "{state}: {s:?}");
        assert!(
            t.comments
                .iter()
                .any(|c| c.contains(&format!("{state} state of a two-state episode model"))),
            "{:?}",
            t.comments
        );
        assert!(t.comments.iter().any(|c| c.contains(p(&series))));
    }

    // --json: the same fit as data, the same line.
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = ibjitter(&json_args);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["env"].as_str().unwrap(), env_line, "{v}");
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["samples"].as_u64().unwrap(), 100_000, "{v}");
    let mean_calm = v["calm"]["mean_dwell_ns"].as_f64().unwrap();
    assert_eq!(dwell(fields[2]), mean_calm.round(), "{v}");
    assert!(v["congested"]["episodes"].as_u64().unwrap() > 100, "{v}");
    assert!(v["threshold_ns"].as_f64().unwrap() > 10_000.0, "{v}");
}

#[test]
fn episodes_refuses_short_one_state_and_bad_series() {
    let d = TempDir::new("episodes-bad");
    let dir = d.path("out");
    let run = |name: &str, text: &str| {
        let f = d.path(name);
        std::fs::write(&f, text).unwrap();
        let out = ibjitter(&["table", "episodes", "--from", p(&f), "--out-dir", p(&dir)]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        (f, err)
    };
    let (_, err) = run("short.txt", "0 5000\n0.001 200000\n0.002 5000\n");
    assert!(err.contains("at least 10 samples"), "{err}");
    let constant: String = (0..50)
        .map(|i| format!("{} 5000\n", i as f64 * 1e-3))
        .collect();
    let (_, err) = run("constant.txt", &constant);
    assert!(
        err.contains("two states") && err.contains("found one"),
        "{err}"
    );
    let (f, err) = run("bad.txt", "time latency\n0 5000\n0.001 5e3x\n");
    assert!(
        err.contains(&format!("{}:3:7: expected a latency", f.display())),
        "{err}"
    );
    let (_, err) = run(
        "tput.csv",
        "time_s,flow,bytes,gbps\n0.000000,0,125,0.001000\n",
    );
    assert!(err.contains("--hdr-log"), "{err}");
    assert!(!dir.exists(), "nothing is written when the fit fails");
}

/// `-o /dev/stdout` (or `/dev/fd/N`) with that descriptor appended to a file by the shell:
/// the output goes after what the file held. Opened again by its name, the file was emptied
/// first (O_TRUNC) and written from its start: `>> results` lost every earlier result.
#[test]
fn an_output_named_by_our_descriptor_is_appended_where_the_shell_appends() {
    let d = TempDir::new("append");
    let log = d.path("results.txt");
    for (name, redirect) in [("/dev/stdout", ">>"), ("/dev/fd/3", "3>>")] {
        std::fs::write(&log, "an earlier result\n").unwrap();
        let line = format!(
            "exec \"$0\" table uniform --mean 5us -o {name} {redirect} {}",
            p(&log)
        );
        let out = Command::new("sh")
            .args(["-c", &line, env!("CARGO_BIN_EXE_ibjitter")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.starts_with("an earlier result\n"),
            "{name}: {text:.200}"
        );
        let table = d.path("t.dist");
        std::fs::write(&table, &text["an earlier result\n".len()..]).unwrap();
        let t = read(&table, Kind::Absolute).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.entries.len(), ibjitter::table::ENTRIES, "{name}");
    }
}

//! `ibjitter study` on the host, end to end: a real program under the real libibjitter.so,
//! whose sends go to a stand-in libucp (shim/tests/support/stub_ucp.c), so every injected
//! delay is a real busy-wait in the program. The program's time is the sum of its delays, so
//! it follows the injected mean, not the sd: the verdict must say so, and an independent
//! recomputation of the CSV (tests/common/study_check.py) must agree with the summary.
mod common;
use common::bench::{release_artifact, repo_root, scratch_dir, target_dir};
use common::read_json;
use common::study::{check, schedule};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The stand-in libucp and `ucp_probe N` (3 UCP sends per iteration) linked against it,
/// built once per test process.
fn probe() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_probe).clone()
}

fn build_probe() -> PathBuf {
    let dir = target_dir().join("study-host-bin");
    std::fs::create_dir_all(&dir).unwrap();
    let support = repo_root().join("shim/tests/support");
    let tag = std::process::id();
    let lib = dir.join("libucp.so.0");
    let tmp = dir.join(format!("libucp.so.0.{tag}"));
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wl,-soname,libucp.so.0", "-o"])
        .arg(&tmp)
        .arg(support.join("stub_ucp.c"))
        .status()
        .expect("cc");
    assert!(ok.success());
    std::fs::rename(&tmp, &lib).unwrap();
    let bin = dir.join("ucp_probe");
    let tmp = dir.join(format!("ucp_probe.{tag}"));
    let ok = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&tmp)
        .arg(support.join("ucp_probe.c"))
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .expect("cc");
    assert!(ok.success());
    std::fs::rename(&tmp, &bin).unwrap();
    bin
}

/// The tests' programs busy-wait: one study at a time, or they would share the cores and
/// lengthen each other's delays.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn shim() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| release_artifact("ibjitter-shim", "libibjitter.so"))
        .clone()
}

/// `ibjitter study` with the family of a 200 µs lognormal at means 200 and 400 µs, over
/// `ucp_probe ITERS`.
fn study(out: &Path, iters: u32, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.args([
        "study",
        "--no-progress",
        "--family",
        "shape=0.5,scale=200us",
    ])
    .args(["--family-means", "200us,400us", "--family-fractions", "0.5"])
    .arg("--shim")
    .arg(shim())
    .arg("--out")
    .arg(out)
    .args(extra)
    .arg("--")
    .arg(probe())
    .arg(iters.to_string());
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run ibjitter study");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn a_program_whose_time_is_its_delays_follows_the_mean() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-mean");
    let out = run(&mut study(&dir, 100, &["--reps", "3"]));
    assert_eq!(out.status.code(), Some(0));
    let s = read_json(&dir.join("summary.json"));
    // clean + 2 means x (lognormal, scale50, uniform).
    assert_eq!(s["configurations"].as_array().unwrap().len(), 7, "{s}");
    assert!(
        s["verdict"]
            .as_str()
            .unwrap()
            .starts_with("more sensitive to mean latency"),
        "{s}"
    );
    assert!(s["r_mean"].as_f64().unwrap() > 0.7, "{s}");
    for c in s["configurations"].as_array().unwrap() {
        assert_eq!(c["runs"], 3, "{c}");
        if c["kind"] == "table" {
            // Three messages per iteration, every one delayed.
            assert_eq!(c["delayed_per_run"].as_f64(), Some(300.0), "{c}");
            // Busy-waits add up: a run takes at least the sum of the delays it drew.
            let floor_s = 300.0 * c["injected_mean_us"].as_f64().unwrap() * 1e-6;
            assert!(c["mean"].as_f64().unwrap() >= floor_s, "{c}");
            assert!(c["slowdown"].as_f64().unwrap() > 1.0, "{c}");
        }
    }
    println!("{}", check(&dir));
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        md.contains("**Verdict:** more sensitive to mean latency"),
        "{md}"
    );
    for svg in ["sd.svg", "mean.svg", "runs.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(text.contains("<circle"), "{svg}");
    }
    // Each table run's injector stats are kept beside its output.
    let stats = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".stats.")
        })
        .count();
    assert_eq!(stats, 18);
}

#[test]
fn a_killed_study_resumes_into_the_rows_of_an_uninterrupted_one() {
    let _serial = one_at_a_time();
    let whole = scratch_dir("study-whole");
    assert_eq!(
        run(&mut study(&whole, 150, &["--reps", "3", "--seed", "9"]))
            .status
            .code(),
        Some(0)
    );

    // SIGKILL mid-study (no chance to clean up), then the same command again.
    let cut = scratch_dir("study-killed");
    let mut child = study(&cut, 150, &["--reps", "3", "--seed", "9"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while schedule(&cut).len() < 1 + 8 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the study made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Complete rows only (a row torn by the kill is dropped when the study resumes).
    let before = std::fs::read_to_string(cut.join("study.csv"))
        .unwrap()
        .matches('\n')
        .count()
        - 1;
    assert!(before < 22, "killed too late: {before} runs");
    let out = run(&mut study(&cut, 150, &["--reps", "3", "--seed", "9"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("after {before} runs")));
    assert_eq!(schedule(&cut), schedule(&whole));
    check(&cut);

    // Ctrl-C: exit 130, the rows so far summarized, the summary says it is incomplete.
    let int = scratch_dir("study-sigint");
    let child = study(&int, 150, &["--reps", "3"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::fs::read_to_string(int.join("study.csv")).map_or(0, |t| t.lines().count()) < 4 {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(5));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t1 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(t1.elapsed() < Duration::from_secs(3), "{:?}", t1.elapsed());
    let md = std::fs::read_to_string(int.join("summary.md")).unwrap();
    assert!(md.contains("**Incomplete:**"), "{md}");
    // And another seed in the same directory is refused, naming the difference.
    let out = run(&mut study(&int, 150, &["--reps", "3", "--seed", "2"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the seed (1 there, 2 now)"));
}

#[test]
fn runs_that_do_not_count_say_why_and_bad_arguments_are_refused() {
    let _serial = one_at_a_time();
    let ibj = env!("CARGO_BIN_EXE_ibjitter");
    let dir = scratch_dir("study-args");
    let refuse = |args: &[&str], want: &str| {
        let out = Command::new(ibj).arg("study").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    let o = dir.join("x").display().to_string();
    refuse(&["--out", &o, "--", "true"], "nothing to compare");
    refuse(
        &["--out", &o, "--tables", "/no/such.dist", "--", "true"],
        "/no/such.dist",
    );
    refuse(
        &[
            "--out",
            &o,
            "--congestor",
            "run",
            "--until-ci",
            "150%",
            "--",
            "true",
        ],
        "between 0 and 100",
    );
    refuse(
        &[
            "--out",
            &o,
            "--congestor",
            "run",
            "--shim-env",
            "FOO=1",
            "--",
            "true",
        ],
        "IBJITTER_NAME=VALUE",
    );
    refuse(
        &[
            "--out",
            &o,
            "--congestor",
            "run",
            "--metric",
            "(",
            "--",
            "true",
        ],
        "--metric",
    );

    // A metric that is not in the output, and a program that fails: rows that do not count,
    // each with its reason, and exit 1.
    let out = run(&mut study(
        &dir.join("metric"),
        10,
        &["--reps", "2", "--metric", "Loop time ([0-9.]+)"],
    ));
    assert_eq!(out.status.code(), Some(1));
    let s = read_json(&dir.join("metric/summary.json"));
    assert_eq!(s["runs_failed"], 15, "{s}");
    assert!(
        s["warnings"][0]
            .as_str()
            .unwrap()
            .contains("found no number"),
        "{s}"
    );
    let mut cmd = Command::new(ibj);
    cmd.args([
        "study",
        "--no-progress",
        "--reps",
        "2",
        "--congestor",
        "--version",
    ])
    .args(["--congestor-settle", "10ms", "--out"])
    .arg(dir.join("fails"))
    .args(["--", "sh", "-c", "exit 3"]);
    let out = run(&mut cmd);
    assert_eq!(out.status.code(), Some(1));
    let csv = std::fs::read_to_string(dir.join("fails/study.csv")).unwrap();
    for line in csv.lines().skip(1) {
        if line.contains(",clean,") {
            assert!(line.contains(",0,3,"), "{line}");
        } else {
            // The congestor (`ibjitter --version` ends at once) was not running: said so.
            assert!(
                line.contains("congestor ended before the program started"),
                "{line}"
            );
        }
    }
}

/// `--until-ci`: a 30 % target is met within the cap, every interval then within it (the
/// program's time is the sum of 300 draws); an impossible 0.001 % target runs to the cap,
/// says so, and exits 1.
#[test]
fn until_ci_stops_when_intervals_are_narrow_or_at_its_cap() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-until-ci");
    let out = run(&mut study(
        &dir.join("easy"),
        100,
        &["--until-ci", "30%", "--max-reps", "15"],
    ));
    assert_eq!(out.status.code(), Some(0));
    let s = read_json(&dir.join("easy/summary.json"));
    assert_eq!(s["complete"], true, "{s}");
    for c in s["configurations"].as_array().unwrap() {
        let (mean, ci) = (c["mean"].as_f64().unwrap(), c["ci95"].as_f64().unwrap());
        assert!(ci <= 0.3 * mean, "{c}");
        assert!(c["runs"].as_u64().unwrap() >= 3, "{c}");
    }
    let out = run(&mut study(
        &dir.join("hard"),
        20,
        &["--until-ci", "0.001%", "--min-reps", "2", "--max-reps", "3"],
    ));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("not every 95 % CI is within the target after 3 rounds"));
    let s = read_json(&dir.join("hard/summary.json"));
    assert_eq!(s["complete"], false, "{s}");
    assert_eq!(s["runs_total"], 1 + 3 * 7, "{s}");
}

//! `ibjitter study` on the host, end to end: a real program under the real libibjitter.so,
//! whose sends go to a stand-in libucp (shim/tests/support/stub_ucp.c), so every injected
//! delay is a real busy-wait in the program. The program's time is the sum of its delays, so
//! it follows the injected mean, not the sd: the verdict must say so, and an independent
//! recomputation of the CSV (tests/common/study_check.py) must agree with the summary.
mod common;
use common::bench::{release_artifact, repo_root, scratch_dir, target_dir};
use common::read_json;
use common::study::{check, configuration_names, schedule};
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

/// tests/support/tolerance_probe.c linked against the same stand-in libucp: a program whose
/// runtime's dependence on the injected latency is known exactly.
fn tolerance_probe() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let lib = probe().with_file_name("libucp.so.0");
            let bin = lib.with_file_name("tolerance_probe");
            let tmp = lib.with_file_name(format!("tolerance_probe.{}", std::process::id()));
            let ok = Command::new("cc")
                .args(["-O2", "-Wall", "-o"])
                .arg(&tmp)
                .arg(repo_root().join("tests/support/tolerance_probe.c"))
                .arg(&lib)
                .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
                .arg("-lm")
                .status()
                .expect("cc");
            assert!(ok.success());
            std::fs::rename(&tmp, &bin).unwrap();
            bin
        })
        .clone()
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
    // Settled long enough for `ibjitter --version` to have ended even on a loaded host (at
    // 10 ms it was sometimes still running: "ended during the run").
    .args(["--congestor-settle", "1s", "--out"])
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

/// `--episodes`: a configuration for each sharing, each run's injector given the episodes
/// (and the shared one IBJITTER_EPISODES_SYNC=1: its stats say so), its mean and sd those of
/// the delay over time (calm 50 us and congested 450 us, 4 ms dwells each: 250 us and 200
/// us), the drawn mean between the two tables'; the summary agrees with its recomputation.
/// Bad specifications and a --shim-env that would override the sharing are refused.
#[test]
fn episodes_run_shared_and_independent_and_bad_ones_are_refused() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-episodes");
    let table = |name: &str, ns: u64| {
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!("{}\n", vec![ns.to_string(); 8].join(" ")).repeat(512),
        )
        .unwrap();
        p
    };
    let (calm, congested) = (table("calm.dist", 50_000), table("cong.dist", 450_000));
    let spec = format!("{}:{}:4ms:4ms", calm.display(), congested.display());
    let ibj = env!("CARGO_BIN_EXE_ibjitter");
    let mut cmd = Command::new(ibj);
    cmd.args(["study", "--no-progress", "--reps", "2", "--episodes", &spec])
        .arg("--shim")
        .arg(shim())
        .arg("--out")
        .arg(dir.join("st"))
        .arg("--")
        .arg(probe())
        .arg("100");
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    let out = run(&mut cmd);
    assert_eq!(out.status.code(), Some(0));
    let s = read_json(&dir.join("st/summary.json"));
    assert_eq!(
        configuration_names(&s),
        ["clean", "episodes-shared", "episodes-independent"],
        "{s}"
    );
    for c in &s["configurations"].as_array().unwrap()[1..] {
        assert_eq!(c["kind"], "episodes", "{c}");
        assert_eq!(c["runs"], 2, "{c}");
        assert_eq!(c["table_mean_us"].as_f64(), Some(250.0), "{c}");
        assert_eq!(c["table_sd_us"].as_f64(), Some(200.0), "{c}");
        let drawn = c["injected_mean_us"].as_f64().unwrap();
        assert!((50.0..=450.0).contains(&drawn), "{c}");
        assert!(c["slowdown"].as_f64().unwrap() > 1.0, "{c}");
    }
    // Each episodes run's stats: the sharing asked, and when each state was set.
    let csv = std::fs::read_to_string(dir.join("st/study.csv")).unwrap();
    let mut seen = 0;
    for e in std::fs::read_dir(dir.join("st/runs")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some((run, _)) = name.split_once(".stats.") else {
            continue;
        };
        let run: usize = run.parse().unwrap();
        let row = csv
            .lines()
            .find(|l| l.split(',').next() == Some(&run.to_string()))
            .unwrap();
        let st = read_json(&path);
        let e = &st["episodes"];
        assert_eq!(e["shared"], row.contains("episodes-shared"), "{row}: {e}");
        assert!(e["states_set"].as_u64().unwrap() >= 1, "{e}");
        assert_eq!(e["states_set_at"][0].as_array().unwrap().len(), 2, "{e}");
        seen += 1;
    }
    assert_eq!(seen, 4);
    println!("{}", check(&dir.join("st")));

    let o = dir.join("x").display().to_string();
    let calm_only = format!("{}:4ms", calm.display());
    refuse(
        &["--out", &o, "--episodes", &calm_only, "--", "true"],
        "expected CALM.dist",
    );
    let fifo = dir.join("fifo.dist");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let fifo_spec = format!("{}:{}:4ms:4ms", fifo.display(), congested.display());
    refuse(
        &["--out", &o, "--episodes", &fifo_spec, "--", "true"],
        "found a FIFO",
    );
    let no_table = format!("{}:/no/such.dist:4ms:4ms", calm.display());
    refuse(
        &["--out", &o, "--episodes", &no_table, "--", "true"],
        "congested table",
    );
    for dwell in ["0ms", "-4ms", "1e30s", "4"] {
        let bad = format!("{}:{}:{dwell}:4ms", calm.display(), congested.display());
        refuse(
            &["--out", &o, "--episodes", &bad, "--", "true"],
            "calm dwell",
        );
    }
    let so = shim().display().to_string();
    // With the injector at hand (a debug build's own directory has none): the refusal is
    // the variable's, not the missing injector's.
    refuse(
        &[
            "--out",
            &o,
            "--shim",
            &so,
            "--episodes",
            &spec,
            "--shim-env",
            "IBJITTER_EPISODES_SYNC=0",
            "--",
            "true",
        ],
        "--episodes-sharing",
    );
    refuse(
        &[
            "--out",
            &o,
            "--tables",
            &calm.display().to_string(),
            "--episodes-sharing",
            "shared",
            "--",
            "true",
        ],
        "--episodes",
    );
}

/// `ibjitter study ARGS` exits 2 saying `want`.
fn refuse(args: &[&str], want: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .arg("study")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
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

/// `ibjitter study --tolerance` over `tolerance_probe ARGS`, its metric the probe's
/// `runtime_us`.
fn tolerance_study(out: &Path, extra: &[&str], args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
    cmd.args(["study", "--no-progress", "--tolerance"])
        .args(["--metric", r"runtime_us ([0-9.]+)", "--metric-unit", "us"])
        .arg("--shim")
        .arg(shim())
        .arg("--out")
        .arg(out)
        .args(extra)
        .arg("--")
        .arg(tolerance_probe())
        .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A line of a tolerance summary: (slope in µs per µs and its interval, crossings as
/// (target, at, low, high, reached)).
type Line = ((f64, f64, f64), Vec<(f64, f64, f64, f64, bool)>);

fn line(s: &serde_json::Value, which: &str) -> Line {
    let a = &s["tolerance"][which];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let slope = (
        f(&a["slope_us_per_us"]),
        f(&a["slope_us_per_us_ci95"][0]),
        f(&a["slope_us_per_us_ci95"][1]),
    );
    let crossings = a["crossings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                f(&c["target"]),
                f(&c["at_us"]),
                f(&c["ci95"][0]),
                f(&c["ci95"][1]),
                c["reached"] == true,
            )
        })
        .collect();
    (slope, crossings)
}

/// The real injector busy-waits 50 constant delays per run in a program whose runtime is
/// 5000 µs plus their time: the fitted slope is 50 µs per µs added, and 1, 5 and 10 % are
/// crossed at 1, 5 and 10 µs (target × 5000 / 50), each inside its interval up to the
/// injector's own accuracy; every figure agrees with study_check.py's recomputation.
#[test]
fn a_tolerance_sweep_finds_the_slope_and_crossings_of_a_known_program() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-tolerance-timed");
    let out = run(&mut tolerance_study(
        &dir,
        &["--kind", "mean", "--reps", "4"],
        &["timed", "5000", "50"],
    ));
    assert_eq!(out.status.code(), Some(0));
    let s = read_json(&dir.join("summary.json"));
    println!(
        "{}",
        std::fs::read_to_string(dir.join("summary.md")).unwrap()
    );
    println!("{}", check(&dir));
    assert!(s["tolerance"]["sd"].is_null(), "{s}");
    // A sweep's delays are its design: no correlation of the metric with them, no verdict.
    for absent in ["verdict", "r_mean", "r_sd", "fisher_z"] {
        assert!(s.get(absent).is_none(), "{absent}: {s}");
    }
    assert_eq!(
        (&s["ending"], &s["complete"]),
        (&"complete".into(), &true.into())
    );
    for c in s["configurations"].as_array().unwrap() {
        // Clean and the zero delay in every round of the sweep's steps, each point in the
        // rounds of its own.
        assert_eq!(c["runs"].as_u64().unwrap() % 4, 0, "{c}");
        // Every send delayed (the set-up send and 50 timed ones), but under the zero delay,
        // whose runs count because the injector drew for them.
        let delayed = if c["table_mean_us"] == 0.0 { 0.0 } else { 51.0 };
        if c["kind"] == "table" {
            assert_eq!(c["delayed_per_run"].as_f64(), Some(delayed), "{c}");
        }
    }
    // The runs are tight (the median send is not preempted), so tight that the injector's
    // own accuracy shows: slopes of 49.87-49.96 measured, a zero delay's send some 40 ns
    // dearer than the line through the others says (docs/measurements.md: overshoots of
    // 12-29 ns per delay). Each interval, widened by 1 % of what it holds, must hold the
    // answer, and be narrow enough for that to mean something.
    let near = |want: f64, lo: f64, hi: f64| lo - 0.01 * want <= want && want <= hi + 0.01 * want;
    let ((k, k_lo, k_hi), crossings) = line(&s, "mean");
    eprintln!("slope {k} [{k_lo}, {k_hi}]; crossings {crossings:?}");
    assert!(near(50.0, k_lo, k_hi), "slope {k} [{k_lo}, {k_hi}]");
    assert!(k_hi - k_lo < 5.0, "slope {k} [{k_lo}, {k_hi}]");
    // The base: the zero delay's runtime, 5000 µs and 50 zero-delay sends.
    let base = s["tolerance"]["mean"]["base"].as_f64().unwrap();
    assert!((base / 5000.0 - 1.0).abs() < 0.01, "base {base}");
    assert_eq!(crossings.len(), 3);
    for (p, at, lo, hi, reached) in crossings {
        let want = p * 5000.0 / 50.0;
        assert!(
            reached && near(want, lo, hi) && hi - lo < 0.2 * want,
            "{p}: {at} [{lo}, {hi}], want {want}"
        );
    }
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("**Tolerance (mean):** Tolerates +"), "{md}");
    assert!(
        !md.contains("**Verdict:**") && !md.contains("r_mean"),
        "{md}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ibjitter study: Tolerates +"), "{err}");
    assert!(!err.contains("sensitive"), "{err}");
    let svg = std::fs::read_to_string(dir.join("tolerance.svg")).unwrap();
    assert!(
        svg.contains("<circle") && svg.contains("10 % slower"),
        "tolerance.svg"
    );
}

/// A modelled program (runtime 10000 + 50 × mean + 5 × sd µs, and a little noise fixed by
/// each run's seed: the same rows in every execution) gives both lines' slopes and crossings;
/// killed with SIGKILL mid-sweep and run again, it has the rows of the uninterrupted study,
/// decisions of the sweep included; another sweep in the same directory is refused.
#[test]
fn a_killed_tolerance_sweep_resumes_into_the_rows_of_an_uninterrupted_one() {
    let _serial = one_at_a_time();
    let model = ["model", "10000", "50", "5", "20", "15"];
    let args = ["--reps", "3", "--seed", "9"];
    let whole = scratch_dir("study-tolerance-whole");
    let out = run(&mut tolerance_study(&whole, &args, &model));
    assert_eq!(out.status.code(), Some(0));
    println!(
        "{}",
        std::fs::read_to_string(whole.join("summary.md")).unwrap()
    );
    println!("{}", check(&whole));
    let s = read_json(&whole.join("summary.json"));
    let ((k, k_lo, k_hi), mean) = line(&s, "mean");
    assert!(
        k_lo <= 50.0 && 50.0 <= k_hi,
        "mean slope {k} [{k_lo}, {k_hi}]"
    );
    for &(p, at, lo, hi, reached) in &mean {
        let want = p * 10000.0 / 50.0;
        assert!(
            reached && lo <= want && want <= hi,
            "{p}: {at} [{lo}, {hi}], want {want}"
        );
    }
    // Over the constant delay at 20 µs (10000 + 50 × 20): 1, 5 and 10 % at sd 22, 110, 220.
    let ((j, j_lo, j_hi), sd) = line(&s, "sd");
    assert!(j_lo <= 5.0 && 5.0 <= j_hi, "sd slope {j} [{j_lo}, {j_hi}]");
    for &(p, at, lo, hi, reached) in &sd {
        let want = p * 11000.0 / 5.0;
        assert!(
            reached && lo <= want && want <= hi,
            "{p}: {at} [{lo}, {hi}], want {want}"
        );
    }

    // SIGKILL in the second step (after 1 warm-up and 3 rounds of clean, the zero delay,
    // the sd sweep's constant 20 µs, 10 µs and the sd sweep's base: 16 runs), then the same
    // command again: its replay crosses the first step's decision.
    let all = schedule(&whole).len() - 1;
    let cut = scratch_dir("study-tolerance-killed");
    let mut child = tolerance_study(&cut, &args, &model)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while schedule(&cut).len() < 1 + 18 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the study made no progress"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = schedule(&cut).len() - 1;
    eprintln!("killed after {before} of {all} runs");
    assert!(
        16 < before && before < all,
        "killed after {before} of {all} runs"
    );
    // What a run killed in flight may leave: its injector stats (the run at index `before`,
    // and one further on). They are not the re-run's: its counts must be its own.
    let stale = r#"{"unit":"ns","draws":1000,"delays_injected":1000,"sum_ns":5000000}"#;
    for index in [before, before + 3] {
        let path = cut.join(format!("runs/{index:04}.stats.999999.json"));
        std::fs::write(path, stale).unwrap();
    }
    let out = run(&mut tolerance_study(&cut, &args, &model));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("after {before} runs")));
    // Every column but the wall time: the order, the configurations the sweep chose, and
    // what each run measured and injected.
    let rows = |dir: &Path| -> Vec<String> {
        std::fs::read_to_string(dir.join("study.csv"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut c: Vec<&str> = l.split(',').collect();
                c.remove(8);
                c.join(",")
            })
            .collect()
    };
    assert_eq!(rows(&cut), rows(&whole));
    check(&cut);
    let out = run(&mut tolerance_study(
        &cut,
        &["--reps", "3", "--seed", "9", "--target", "2%"],
        &model,
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the tolerance sweep"));
}

/// A study killed (SIGKILL: a job's end) while its program is a launcher leaves the ranks
/// it launched running: the launcher gets the study's SIGTERM, they do not. The resumed study
/// stops those it can find (the next test); one it cannot (on another node, or started
/// without the environment: here the rank drops IBJITTER_STUDY_RUN) ends later and writes
/// its injector stats then, into the runs directory the resumed study fills, under the index
/// it is running again. Those counts are the killed attempt's, not the re-run's.
#[test]
fn a_run_left_running_by_a_killed_study_is_not_counted_in_its_rerun() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-left-running");
    let table = dir.join("t.dist");
    let made = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(["table", "constant", "--value", "10us", "-o"])
        .arg(&table)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let out = dir.join("st");
    // `sh` forks the probe (a launcher's rank): 5 sends, then 1.5 s asleep.
    let rank = r#"env -u IBJITTER_STUDY_RUN "$0" model 10000 0 0 5 1500; exit $?"#;
    let study = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
        cmd.args(["study", "--no-progress", "--reps", "1", "--warmup", "0"])
            .arg("--tables")
            .arg(&table)
            .arg("--shim")
            .arg(shim())
            .arg("--out")
            .arg(&out)
            .args(["--", "sh", "-c", rank])
            .arg(tolerance_probe());
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        cmd
    };
    let mut child = study().stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    let table_log = |name: &str| name.ends_with("-t.log");
    let table_run = loop {
        let started = std::fs::read_dir(out.join("runs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .find(|n| table_log(n));
        if let Some(name) = started {
            break name[..4].parse::<usize>().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no table run began");
        std::thread::sleep(Duration::from_millis(2));
    };
    // Its sends made, the rank asleep: the study dies.
    std::thread::sleep(Duration::from_millis(400));
    child.kill().unwrap();
    child.wait().unwrap();
    let out_again = run(&mut study());
    assert_eq!(out_again.status.code(), Some(0));

    let csv = std::fs::read_to_string(out.join("study.csv")).unwrap();
    let row = csv
        .lines()
        .find(|l| l.split(',').nth(2) == Some("t"))
        .unwrap();
    let delayed: u64 = row.split(',').nth(13).unwrap().parse().unwrap();
    // The rank left running did write its stats (so this could have gone wrong).
    let prefix = format!("{table_run:04}.stats.");
    let files = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .count();
    assert_eq!(files, 2, "the killed run's rank and the re-run's");
    assert_eq!(delayed, 5, "{row}");
}

/// A process by pid and start time: the same process, not the pid recycled.
struct Process {
    pid: u32,
    start: String,
}

impl Process {
    /// State and start time (fields 3 and 22 of /proc/PID/stat).
    fn stat(pid: u32) -> Option<(String, String)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        Some((fields.first()?.to_string(), fields.get(19)?.to_string()))
    }

    fn new(pid: u32) -> Process {
        let (_, start) = Process::stat(pid).expect("the process runs");
        Process { pid, start }
    }

    /// Whether it runs (a zombie, waiting for whoever inherited it to reap it, has ended).
    fn runs(&self) -> bool {
        Process::stat(self.pid).is_some_and(|(state, start)| start == self.start && state != "Z")
    }
}

impl Drop for Process {
    /// A test that failed leaves nothing running.
    fn drop(&mut self) {
        if self.runs() {
            // SAFETY: kill(2) on the process just seen to be ours.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
        }
    }
}

/// The rank a killed study left running would take a core from the resumed study's first
/// runs (and distort their times): the resumed study stops it before its first run, and says
/// so on stderr.
#[test]
fn a_run_left_running_by_a_killed_study_is_stopped_before_its_resume_runs() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-stragglers");
    let table = dir.join("t.dist");
    let made = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(["table", "constant", "--value", "10us", "-o"])
        .arg(&table)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let out = dir.join("st");
    let sleep_ms = dir.join("sleep_ms");
    let pid_file = dir.join("rank.pid");
    // `sh` starts the probe in the background (a launcher's rank), says its pid and waits for
    // it: 5 sends, then as long asleep as `sleep_ms` says.
    let rank = r#""$0" model 10000 0 0 5 "$(cat "$1")" &
        echo $! > "$2.new" && mv "$2.new" "$2"; wait $!"#;
    let study = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ibjitter"));
        cmd.args(["study", "--no-progress", "--reps", "1", "--warmup", "0"])
            .arg("--tables")
            .arg(&table)
            .arg("--shim")
            .arg(shim())
            .arg("--out")
            .arg(&out)
            .args(["--", "sh", "-c", rank])
            .arg(tolerance_probe())
            .arg(&sleep_ms)
            .arg(&pid_file);
        for (k, _) in std::env::vars() {
            if k.starts_with("IBJITTER_") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        cmd
    };
    let rank_started = |since: Instant| -> u32 {
        loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                return pid;
            }
            assert!(since.elapsed() < Duration::from_secs(60), "no run began");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // The first run's rank sleeps a minute; the study dies while it does.
    std::fs::write(&sleep_ms, "60000").unwrap();
    let mut child = study().stderr(Stdio::null()).spawn().unwrap();
    let straggler = Process::new(rank_started(Instant::now()));
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(straggler.runs(), "the rank outlives its study");

    // Resumed, with short runs.
    std::fs::remove_file(&pid_file).unwrap();
    std::fs::write(&sleep_ms, "100").unwrap();
    let mut resumed = study()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = resumed.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        text
    });
    let first = rank_started(Instant::now());
    assert!(
        !straggler.runs(),
        "the killed study's rank {} still runs while the resumed study's first run (rank {first}) goes",
        straggler.pid
    );
    let status = resumed.wait().unwrap();
    let said = said.join().unwrap();
    eprintln!("{said}");
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "ibjitter study: stopped 1 process an earlier, killed invocation of this study left \
             running on this host (pid {})",
            straggler.pid
        )),
        "{said}"
    );
    let csv = std::fs::read_to_string(out.join("study.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "a header and both runs: {csv}");
}

/// The model of the resume test on a machine that became 5 % slower at everything from the
/// sweep's second step on (run 16): each run over its own round's references, the lines
/// still hold the program's slopes and crossings. (Fitted over the runs as they were, with
/// the references in the first step only, the change read as latency: the sd line's 1 % came
/// out at 17.3 µs [15.3, 19.7] and its 5 % at 86.3 µs [76.4, 98.7], for 22 and 110.)
#[test]
fn a_machine_whose_speed_changed_between_steps_does_not_move_the_lines() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-tolerance-drift");
    let model = [
        "model",
        "10000",
        "50",
        "5",
        "20",
        "0",
        "seed=9",
        "jump=16:1.05",
    ];
    let out = run(&mut tolerance_study(
        &dir,
        &["--reps", "3", "--seed", "9"],
        &model,
    ));
    assert_eq!(out.status.code(), Some(0));
    println!(
        "{}",
        std::fs::read_to_string(dir.join("summary.md")).unwrap()
    );
    println!("{}", check(&dir));
    let s = read_json(&dir.join("summary.json"));
    // The rows do show the change: the zero delay's runs, 10000 µs, then 10500.
    let zero = &common::study::metrics(&dir)["const-0.00ns"];
    assert!(
        zero[0] < 10030.0 && zero[zero.len() - 1] > 10470.0,
        "{zero:?}"
    );
    // The slowdown per µs: 50 over 10000 for the mean, 5 over 11000 for the sd.
    for (which, want, base) in [("mean", 50.0, 10000.0), ("sd", 5.0, 11000.0)] {
        let a = &s["tolerance"][which];
        let (lo, hi) = (
            a["slope_ci95"][0].as_f64().unwrap(),
            a["slope_ci95"][1].as_f64().unwrap(),
        );
        assert!(
            lo <= want / base && want / base <= hi,
            "{which}: [{lo}, {hi}]"
        );
        for c in a["crossings"].as_array().unwrap() {
            let at = c["target"].as_f64().unwrap() * base / want;
            let (lo, hi) = (
                c["ci95"][0].as_f64().unwrap(),
                c["ci95"][1].as_f64().unwrap(),
            );
            assert!(lo <= at && at <= hi, "{which}: {c}, want {at}");
        }
    }
}

/// A runtime flat up to 5 µs of added delay, then 50 µs per µs (LLAMP's piecewise-linear
/// case): the line through the points is off them, and the summary and stderr say so.
#[test]
fn points_off_a_straight_line_are_said_to_be() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-tolerance-knee");
    let model = ["model", "10000", "50", "5", "20", "0", "knee=5"];
    let out = run(&mut tolerance_study(
        &dir,
        &["--kind", "mean", "--reps", "3", "--seed", "9"],
        &model,
    ));
    assert_eq!(out.status.code(), Some(0));
    println!(
        "{}",
        std::fs::read_to_string(dir.join("summary.md")).unwrap()
    );
    println!("{}", check(&dir));
    let s = read_json(&dir.join("summary.json"));
    let lack = &s["tolerance"]["mean"]["lack_of_fit"];
    assert_eq!(lack["off_line"], true, "{s}");
    assert!(lack["p"].as_f64().unwrap() < 0.05, "{lack}");
    let said = |text: &str| text.contains("mean line: the points are off a straight line");
    assert!(
        s["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| said(w.as_str().unwrap())),
        "{s}"
    );
    assert!(said(&String::from_utf8_lossy(&out.stderr)));
    assert!(said(
        &std::fs::read_to_string(dir.join("summary.md")).unwrap()
    ));
}

/// `--until-ci` on the model's seeded noise (the same numbers in every execution): each step
/// stops when its own intervals are narrow, or at the cap; killed mid-sweep and run again, the
/// sweep has the uninterrupted one's rows. A cap reached makes the summary incomplete (exit
/// 1), naming only what it left wide.
#[test]
fn an_until_ci_sweep_resumes_exactly_and_its_cap_is_said() {
    let _serial = one_at_a_time();
    let model = ["model", "10000", "50", "5", "20", "15"];
    let args = [
        "--until-ci",
        "0.17%",
        "--min-reps",
        "3",
        "--max-reps",
        "6",
        "--seed",
        "8",
    ];
    let whole = scratch_dir("study-tolerance-ci-whole");
    let out = run(&mut tolerance_study(&whole, &args, &model));
    let code = out.status.code();
    println!(
        "{}",
        std::fs::read_to_string(whole.join("summary.md")).unwrap()
    );
    println!("{}", check(&whole));
    let s = read_json(&whole.join("summary.json"));
    // The steps stopped at different rounds: the rule depended on the data.
    let rows = schedule(&whole);
    let mut per_config = std::collections::BTreeMap::<String, usize>::new();
    for r in rows.iter().skip(2) {
        *per_config
            .entry(r.split(',').nth(2).unwrap().to_string())
            .or_default() += 1;
    }
    let mut counts: Vec<usize> = per_config
        .iter()
        .filter(|(n, _)| !["clean", "const-0.00ns", "20.0us-uniform"].contains(&n.as_str()))
        .map(|(_, &k)| k)
        .collect();
    counts.sort();
    counts.dedup();
    assert!(
        counts.len() >= 2,
        "every point ran as many rounds: {per_config:?}"
    );
    // With this seed one step reaches the cap: the exit status and the summary agree, and
    // only the one configuration left wide is named (not its step's others, which were
    // narrow: the references, the sd sweep's point).
    assert_eq!(code, Some(1));
    assert!(
        s["complete"] == false && s["ending"] == "cap_reached",
        "{s}"
    );
    assert_eq!(s["capped"], serde_json::json!(["const-2.00us"]), "{s}");
    let md = std::fs::read_to_string(whole.join("summary.md")).unwrap();
    assert!(
        md.contains("reached its cap before these intervals were within the target: const-2.00us."),
        "{md}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("after 6 rounds (const-2.00us)"), "{err}");
    let cut = scratch_dir("study-tolerance-ci-cut");
    let mut child = tolerance_study(&cut, &args, &model)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while schedule(&cut).len() < 1 + 30 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = schedule(&cut).len() - 1;
    assert!(
        before < rows.len() - 1,
        "killed after {before} runs: too late"
    );
    let again = run(&mut tolerance_study(&cut, &args, &model));
    assert_eq!(again.status.code(), code);
    let without_wall_time = |dir: &Path| -> Vec<String> {
        std::fs::read_to_string(dir.join("study.csv"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut c: Vec<&str> = l.split(',').collect();
                c.remove(8);
                c.join(",")
            })
            .collect()
    };
    assert_eq!(without_wall_time(&cut), without_wall_time(&whole));
    assert_eq!(read_json(&cut.join("summary.json"))["capped"], s["capped"]);
}

/// Ctrl-C mid-sweep: exit 130, and the summary opens with why its figures are of the runs so
/// far; a target not reached is not reached so far.
#[test]
fn an_interrupted_sweep_says_first_that_it_is_incomplete() {
    let _serial = one_at_a_time();
    let dir = scratch_dir("study-tolerance-sigint");
    // Runs of 100 ms: Ctrl-C lands in the run after the one awaited.
    let model = ["model", "10000", "50", "5", "20", "100"];
    let child = tolerance_study(&dir, &["--kind", "mean", "--reps", "3"], &model)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // The first step (warm-up, 3 rounds of clean, the zero delay and 10 µs) and a run more.
    while schedule(&dir).len() < 1 + 11 {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(2));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    let first = md.lines().find(|l| l.starts_with("**")).unwrap_or_default();
    assert!(
        first.starts_with("**Incomplete:** the study was interrupted"),
        "{md}"
    );
    let s = read_json(&dir.join("summary.json"));
    assert_eq!(
        (&s["ending"], &s["complete"]),
        (&"interrupted".into(), &false.into())
    );
    // Over 10000 at 50 per µs, 10 µs is 5 %: 10 % is not reached, so far.
    let sentence = s["tolerance"]["mean"]["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("10 %: not reached so far, within +10.0 µs"),
        "{sentence}"
    );
    check(&dir);
}

#[test]
fn tolerance_arguments_are_checked() {
    let ibj = env!("CARGO_BIN_EXE_ibjitter");
    let dir = scratch_dir("study-tolerance-args");
    let o = dir.join("x").display().to_string();
    let refuse = |args: &[&str], want: &str| {
        let out = Command::new(ibj)
            .args(["study", "--out", &o])
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    refuse(
        &["--tolerance", "--target", "0%"],
        "--target: expected a share between 0 and 100 %, found \"0%\"",
    );
    refuse(&["--tolerance", "--target", "5%,150%"], "found \"150%\"");
    refuse(
        &["--tolerance", "--target", "five"],
        "--target: expected a percentage like 5%",
    );
    refuse(
        &["--tolerance", "--kind", "bogus"],
        "possible values: mean, sd, both",
    );
    refuse(&["--kind", "mean", "--congestor", "run"], "--tolerance");
    refuse(
        &["--tolerance", "--tables", "a.dist"],
        "--tolerance cannot be used with --tables",
    );
    refuse(
        &["--tolerance", "--congestor", "run"],
        "cannot be used with --congestor",
    );
    refuse(
        &["--tolerance", "--episodes", "a.dist:b.dist:1ms:1ms"],
        "cannot be used with --episodes",
    );
    refuse(
        &["--tolerance", "--higher-is-better"],
        "give a time as the metric",
    );
    refuse(
        &["--tolerance", "--family", "lat.txt", "--kind", "mean"],
        "--kind mean has none",
    );
    refuse(
        &[
            "--tolerance",
            "--family",
            "shape=1,scale=1us",
            "--family-means",
            "5us",
        ],
        "--tolerance-mean",
    );
    refuse(&["--tolerance", "--reps", "1"], "--reps 2 or more");
    // Given, even as its default's value: the sweep chooses the members itself.
    refuse(
        &[
            "--tolerance",
            "--family",
            "shape=1,scale=1us",
            "--family-fractions",
            "0.75,0.5,0.25",
        ],
        "cannot be used with --family-fractions",
    );
    refuse(
        &["--tolerance", "--tolerance-start", "2ms"],
        "must be below --tolerance-max",
    );
    refuse(
        &["--tolerance", "--tolerance-mean", "500ns"],
        "expected at least 1us",
    );
    refuse(&["--tolerance", "--metric-unit", "ms"], "--metric");
}

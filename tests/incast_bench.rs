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

    let mut p99 = Vec::new();
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
        p99.push(r["total"]["latency"]["p99_ns"].as_u64().unwrap());
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
    assert!(
        p99[0] > p99[1],
        "p99 with the bottleneck ({} ns) should exceed p99 without ({} ns)",
        p99[0],
        p99[1]
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
    for port in ["cm_vb1", "cm_vb2", "cm_vb3"] {
        let packets = field(&out.output, port).expect("counter line");
        assert!(
            packets > 1000.0,
            "{port}: {packets} packets\n{}",
            out.output
        );
    }
}

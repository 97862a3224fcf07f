//! `ibjitter pcap` against the wire of the Soft-RoCE bench: tcpdump on veth0 (rxe0's side,
//! both directions cross it) while the generator or perftest runs. Captures stay in the VM's
//! tmpfs and are analysed there by the release binary; only JSON comes back through the share.
mod common;
use common::bench::{release_artifact, scratch_dir, Vm};
use common::perftest::field;
use common::read_json;
use serde_json::Value;

fn ibjitter() -> String {
    release_artifact("ibjitter", "ibjitter")
        .display()
        .to_string()
}

/// Shell functions for the scripts: `capture FILE` starts tcpdump on veth0 (RoCEv2 only, 128-byte
/// snap length: the decoder reads lengths from the UDP header) and waits until it listens;
/// `uncapture NAME` stops it and prints `NAME_dropped=N` (dropped by the kernel) and
/// `NAME_captured=N` (written to the file). tcpdump hands packets over in blocks retired after
/// its 1 s buffer timeout and drops the unretired ones when interrupted, hence the wait before
/// SIGINT. (Its "received by filter" is no loss measure: it also counts packets libpcap
/// flushed while installing the filter — one run showed 4,002 received for the 4,000 captured
/// that were all of the expected ones.)
const CAPTURE: &str = r#"
capture() {
    tcpdump -i veth0 -w "$1" -s 128 -B 16384 udp port 4791 2> /tmp/tcpdump.log & TD=$!
    wait_until 10 grep -q listening /tmp/tcpdump.log
}
uncapture() {
    sleep 1.5; kill -INT $TD; wait $TD
    cat /tmp/tcpdump.log
    n() { sed -n "s/^\([0-9]*\) packets\{0,1\} $1\$/\1/p" /tmp/tcpdump.log; }
    echo "$1_dropped=$(n 'dropped by kernel')"
    echo "$1_captured=$(n captured)"
}
"#;

/// Sums `key` over the flows that `pick` selects.
fn sum(flows: &[Value], pick: impl Fn(&Value) -> bool, key: &str) -> u64 {
    flows
        .iter()
        .filter(|f| pick(f))
        .map(|f| f[key].as_u64().unwrap())
        .sum()
}

#[test]
fn sixteen_write_flows_on_the_wire_match_the_generator_and_rxe_counters() {
    let bin = ibjitter();
    let out_dir = scratch_dir("pcap-gen");
    let o = out_dir.display();
    // Open loop at 100 messages/s per flow: well under what tcpdump keeps up with under TCG
    // (closed loop, ~4k messages/s here, also captured without drops), so the counts can be
    // compared exactly; the script still checks tcpdump's drop count.
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {CAPTURE}
        {bin} serve --dev rxe1 > /tmp/serve.log 2>&1 & SV=$!
        wait_until 20 tcp_listening 18515 || exit 1
        capture /tmp/gen.pcap
        s0=$(rxe_counter rxe0 sent_pkts); r0=$(rxe_counter rxe0 rcvd_pkts)
        {bin} run 10.0.0.2 --dev rxe0 --flows 16 --op write --size 4K --duration 3s --rate 100 \
            --json {o}/run.json --no-progress
        echo "run_rc=$?"
        s1=$(rxe_counter rxe0 sent_pkts); r1=$(rxe_counter rxe0 rcvd_pkts)
        uncapture gen
        echo "rxe0_sent=$((s1 - s0))"
        echo "rxe0_rcvd=$((r1 - r0))"
        {bin} pcap /tmp/gen.pcap --flows --json {o}/pcap.json --timeseries {o}/pcap.csv --interval 100ms
        echo "pcap_rc=$?"
        kill $SV; wait $SV
        cat /tmp/serve.log"#
    ));
    out.assert_success();
    let text = &out.output;
    assert_eq!(field(text, "run_rc"), Some(0.0), "{text}");
    assert_eq!(field(text, "pcap_rc"), Some(0.0), "{text}");
    assert_eq!(
        field(text, "gen_dropped"),
        Some(0.0),
        "tcpdump dropped packets:\n{text}"
    );

    let run = read_json(&out_dir.join("run.json"));
    let pcap = read_json(&out_dir.join("pcap.json"));
    assert_eq!(pcap["undecodable"], 0, "{text}");
    assert!(pcap["truncated"].is_null(), "{text}");
    let flows = pcap["flows"].as_array().unwrap();
    let data: Vec<&Value> = flows.iter().filter(|f| f["data"] == true).collect();
    assert_eq!(data.len(), 16, "{text}");
    // Every data flow is a requester QP of rxe0 writing to a responder QP of rxe1; each has its
    // ACK flow in the other direction.
    for f in &data {
        assert_eq!(
            (f["src"].as_str(), f["dst"].as_str()),
            (Some("10.0.0.1"), Some("10.0.0.2")),
            "{f}"
        );
        assert_eq!(f["naks"], 0, "{f}");
    }
    let acks = flows
        .iter()
        .filter(|f| f["data"] == false && f["src"] == "10.0.0.2")
        .count();
    assert_eq!(acks, 16, "{text}");

    // Per flow: the payload that crossed the wire once (retransmissions aside) is what the
    // generator counted, message for message. Flows are matched by sorting: the generator
    // does not report QP numbers.
    let mut wire: Vec<(u64, u64)> = data
        .iter()
        .map(|f| {
            let ops = &f["opcodes"];
            let messages = ops["RC RDMA WRITE First"].as_u64().unwrap_or(0)
                + ops["RC RDMA WRITE Only"].as_u64().unwrap_or(0);
            let unique =
                f["payload_bytes"].as_u64().unwrap() - f["retransmitted_bytes"].as_u64().unwrap();
            (
                unique,
                messages - f["retransmissions"].as_u64().unwrap().min(messages),
            )
        })
        .collect();
    let mut generated: Vec<(u64, u64)> = run["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["bytes"].as_u64().unwrap(), f["ops"].as_u64().unwrap()))
        .collect();
    wire.sort();
    generated.sort();
    assert_eq!(
        wire, generated,
        "wire (bytes, messages) vs generator\n{text}"
    );
    assert_eq!(
        Some(
            sum(flows, |f| f["data"] == true, "payload_bytes")
                - sum(flows, |_| true, "retransmitted_bytes")
        ),
        run["total"]["bytes"].as_u64()
    );

    // Header arithmetic: each data packet is Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4
    // around its payload, plus a 16-byte RETH on each message's first (or only) packet.
    for f in &data {
        let (packets, payload) = (
            f["packets"].as_u64().unwrap(),
            f["payload_bytes"].as_u64().unwrap(),
        );
        let ops = &f["opcodes"];
        let reths = ops["RC RDMA WRITE First"].as_u64().unwrap_or(0)
            + ops["RC RDMA WRITE Only"].as_u64().unwrap_or(0);
        assert_eq!(
            f["wire_bytes"].as_u64().unwrap(),
            payload + packets * 58 + reths * 16,
            "{f}"
        );
    }

    // rxe's own counters: what rxe0 sent is every packet from 10.0.0.1 on the wire, what it
    // received every packet from 10.0.0.2 (the ACKs).
    let from = |a: &'static str| sum(flows, move |f| f["src"] == a, "packets") as f64;
    assert_eq!(field(text, "rxe0_sent"), Some(from("10.0.0.1")), "{text}");
    assert_eq!(field(text, "rxe0_rcvd"), Some(from("10.0.0.2")), "{text}");

    // The time series: the generator's CSV shape, one series per data flow, bytes adding up.
    let csv = std::fs::read_to_string(out_dir.join("pcap.csv")).unwrap();
    assert!(csv.starts_with("time_s,flow,bytes,gbps\n"));
    let mut ids = std::collections::HashSet::new();
    let mut bytes = 0u64;
    for line in csv.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        ids.insert(cols[1].to_string());
        bytes += cols[2].parse::<u64>().unwrap();
    }
    assert_eq!(ids.len(), 16);
    assert_eq!(bytes, sum(flows, |f| f["data"] == true, "payload_bytes"));
}

#[test]
fn injected_constant_delay_shows_in_the_request_to_request_gap() {
    let bin = ibjitter();
    let shim = release_artifact("ibjitter-shim", "libibjitter.so");
    let shim = shim.display();
    let out_dir = scratch_dir("pcap-inject");
    let o = out_dir.display();
    const D_US: u64 = 500;
    // ib_write_lat's client posts its next WRITE when the server's arrives: its request-to-
    // request gap is one round trip, plus D when every post waits D. Both modes alternate three
    // times in one VM and each keeps its best 10th percentile: under TCG, with both sides busy-polling
    // and tcpdump running, a whole run sometimes falls into a mode where every round trip
    // waits for the 4 ms scheduler tick (perftest's own t_typical shows ~4000 us then, so the
    // capture is right), and one such run must not decide the test.
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {CAPTURE}
        {bin} table constant --value {D_US}us -o /tmp/d.tbl || exit 1
        for i in 1 2 3; do
            for mode in base inject; do
                pre=""
                [ $mode = inject ] && pre="env LD_PRELOAD={shim} IBJITTER_TABLE=/tmp/d.tbl"
                capture /tmp/$mode.pcap
                pair $mode.$i "tcp_listening 18515" "ib_write_lat -d rxe1 -x 1 -n 1000 > /dev/null" \
                    "$pre ib_write_lat -d rxe0 -x 1 -n 1000 10.0.0.2" || exit 1
                uncapture $mode.$i
                {bin} pcap /tmp/$mode.pcap --ipd --ipd-bin 1us --ipd-bins 2000 --json {o}/$mode.$i.json > /tmp/$mode.txt
                echo "$mode.${{i}}_pcap_rc=$?"
                head -3 /tmp/$mode.txt
            done
        done"#
    ));
    out.assert_success();
    let text = &out.output;
    // Each run's 10th percentile, by mode, in run order (base.i and inject.i ran side by side).
    let mut p10: Vec<Vec<f64>> = Vec::new();
    for mode in ["base", "inject"] {
        let mut lows = Vec::new();
        for i in 1..=3 {
            let run = format!("{mode}.{i}");
            assert_eq!(field(text, &format!("{run}_pcap_rc")), Some(0.0), "{text}");
            assert_eq!(field(text, &format!("{run}_dropped")), Some(0.0), "{text}");
            // Nothing lost: ib_write_lat -n 1000 is 1,000 WRITEs each way and their ACKs.
            let captured = field(text, &format!("{run}_captured")).unwrap_or(0.0);
            assert!(
                captured >= 4000.0,
                "{run}: {captured} packets captured\n{text}"
            );
            let r = read_json(&out_dir.join(format!("{run}.json")));
            // The client's flow: rxe0's WRITEs to the server's QP (it also carries rxe0's
            // ACKs of the server's WRITEs, which the request gap leaves out).
            let flows = r["flows"].as_array().unwrap();
            let client: Vec<&Value> = flows
                .iter()
                .filter(|f| {
                    f["src"] == "10.0.0.1"
                        && f["opcodes"]["RC RDMA WRITE Only"].as_u64().unwrap_or(0) >= 1000
                })
                .collect();
            assert_eq!(client.len(), 1, "{run}: {r}");
            let gaps = &client[0]["ipd_requests"];
            assert!(gaps["gaps"].as_u64().unwrap() >= 999, "{run}: {gaps}");
            let low = tenth_percentile_us(gaps);
            println!("{run}: 10th percentile of the request gap {low:.1} us");
            lows.push(low);
        }
        p10.push(lows);
    }
    // Growth per interleaved pair, and the middle of the three. The gap's median grew by D +
    // 20 % of D in one run (the bench's two speeds, and what a busy-waiting vCPU costs the
    // rest of the VM). Its fast end moves by D less what the busy-waiting vCPU saves: a
    // vCPU that spins is not woken: the injected runs' floor beyond D (94-120 us) stayed
    // there while base runs in the bench's slow speed read 145-210 us. Five bench runs, D =
    // 500 us, pairs grew 448/503/520, 434/443/571, 528/522/514, 432/505/473, 506/473/570 us.
    // So not the best run of each mode against the other (448 and 434 in the first two),
    // and at least 0.8 D, not 0.9 D. A shim that did nothing
    // (grew ≈ 0), half of D, or waited twice (≈ 2D) fails: at least 0.8 D, under 1.5 D.
    let mut grew: Vec<f64> = p10[1].iter().zip(&p10[0]).map(|(i, b)| i - b).collect();
    grew.sort_by(f64::total_cmp);
    let middle = grew[1];
    let d = D_US as f64;
    assert!(
        (0.8 * d..1.5 * d).contains(&middle),
        "10th percentile of the request gap {:?} us -> {:?} us: pairs grew {grew:?} us \
         (middle {middle:.1}), injected {D_US} us\n{text}",
        p10[0],
        p10[1]
    );
}

/// The 10th percentile (µs, middle of its 1 µs interval) from the report's fixed-width gap
/// table: low enough that the bench's stalls, which only lengthen gaps, do not reach it, and
/// high enough that a stray short gap (a retransmitted request) does not decide it.
fn tenth_percentile_us(gaps: &Value) -> f64 {
    let rows = gaps["table"].as_array().expect("ipd table");
    let total: u64 = rows
        .iter()
        .map(|r| r["occurrences"].as_u64().unwrap())
        .sum();
    let mut seen = 0;
    for r in rows {
        seen += r["occurrences"].as_u64().unwrap();
        if seen * 10 >= total {
            let from = r["from_ns"].as_u64().unwrap() as f64;
            let to = r["to_ns"]
                .as_u64()
                .expect("10th percentile beyond the table") as f64;
            return (from + to) / 2000.0;
        }
    }
    panic!("empty gap table: {gaps}")
}

/// Congestion signals on the wire: the bench's bottleneck port toward h0 made a RED queue that
/// marks ECN-capable packets CE instead of dropping them; 8 WRITE flows from h1 sent as ECT(0)
/// (`run --tclass 2`) fill it. tcpdump on h0's side (after the queue) sees the marks, and
/// `ibjitter pcap` counts as many CE-marked packets as the qdisc says it marked (±1 %). The
/// same run's port counters (rxe's hw_counters) stream to `--counters` and add up to the
/// report's totals over the run.
#[test]
fn ce_marks_of_a_red_bottleneck_are_counted_as_the_qdisc_marked_them() {
    let bin = ibjitter();
    let out_dir = scratch_dir("pcap-ecn");
    let o = out_dir.display();
    let out = Vm::new().hosts(2).bottleneck("50mbit").timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        tc qdisc del dev vb0 parent 1:1 handle 10:
        tc qdisc add dev vb0 parent 1:1 handle 20: red limit 4000000 min 30000 max 90000 \
            avpkt 4200 burst 15 probability 0.2 bandwidth 50mbit ecn || exit 1
        tools/vm/on-host h0 {bin} serve > /tmp/serve.log 2>&1 & SV=$!
        wait_until 20 tcp_listening 18515 || exit 1
        tcpdump -i vh0 -w /tmp/ecn.pcap -s 128 -B 16384 udp port 4791 2> /tmp/tcpdump.log & TD=$!
        wait_until 10 grep -q listening /tmp/tcpdump.log
        tools/vm/on-host h1 {bin} run 10.0.0.1 --flows 8 --depth 4 --op write --size 16K \
            --duration 4s --tclass 2 --json {o}/run.json --counters {o}/counters.csv \
            --interval 100ms --no-progress
        echo "run_rc=$?"
        sleep 1.5; kill -INT $TD; wait $TD
        cat /tmp/tcpdump.log
        echo "ecn_dropped=$(sed -n 's/^\([0-9]*\) packets\{{0,1\}} dropped by kernel$/\1/p' /tmp/tcpdump.log)"
        tc -s qdisc show dev vb0
        echo "marked=$(tc -s qdisc show dev vb0 | sed -n 's/.*marked \([0-9]*\).*/\1/p' | head -n1)"
        {bin} pcap /tmp/ecn.pcap --json {o}/pcap.json --timeseries {o}/pcap.csv --interval 100ms \
            --plot {o}/figs
        echo "pcap_rc=$?"
        kill $SV; wait $SV; true"#
    ));
    out.assert_success();
    let text = &out.output;
    assert_eq!(field(text, "run_rc"), Some(0.0), "{text}");
    assert_eq!(field(text, "pcap_rc"), Some(0.0), "{text}");
    assert_eq!(
        field(text, "ecn_dropped"),
        Some(0.0),
        "tcpdump dropped packets:\n{text}"
    );
    let marked = field(text, "marked").expect("the qdisc's marked count") as u64;
    let pcap = read_json(&out_dir.join("pcap.json"));
    let c = &pcap["congestion"];
    let ce = c["ce_marked"].as_u64().unwrap();
    eprintln!(
        "qdisc marked {marked}, the capture has {ce} CE-marked packets of {}",
        c["ip_packets"]
    );
    assert!(
        marked > 100,
        "the queue should have marked many packets:\n{text}"
    );
    assert!(
        (ce as f64 - marked as f64).abs() <= 0.01 * marked as f64,
        "qdisc marked {marked}, pcap counted {ce}:\n{text}"
    );
    // Every data packet was sent ECN-capable (marked or not); the ACKs back were not.
    let flows = pcap["flows"].as_array().unwrap();
    let data_packets = sum(flows, |f| f["data"] == true, "packets");
    assert_eq!(
        sum(flows, |f| f["data"] == true, "ect") + ce,
        data_packets,
        "{c}"
    );
    assert_eq!(sum(flows, |f| f["data"] == true, "ce_marked"), ce);
    let series_ce: u64 = c["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ce_marked"].as_u64().unwrap())
        .sum();
    assert_eq!(series_ce, ce, "the signals over time add up to the total");
    let svg = std::fs::read_to_string(out_dir.join("figs/signals.svg")).expect("signals.svg");
    assert!(
        svg.contains("CE-marked packets"),
        "signals.svg without its series"
    );

    // rxe's counters: the stream's rows add up to the report's totals over the run.
    let run = read_json(&out_dir.join("run.json"));
    let totals = &run["port_counters"];
    let sent = totals["hw_counters/sent_pkts"]
        .as_u64()
        .expect("rxe's sent_pkts in the report");
    let csv = std::fs::read_to_string(out_dir.join("counters.csv")).unwrap();
    let streamed: u64 = csv
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1) == Some("hw_counters/sent_pkts"))
        .map(|l| l.rsplit(',').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(streamed, sent, "{csv}");
    // At least one packet per 4 KiB of payload written (the path MTU).
    let bytes = run["total"]["bytes"].as_u64().unwrap();
    assert!(
        sent >= bytes / 4096,
        "sent {sent} packets for {bytes} bytes"
    );
}

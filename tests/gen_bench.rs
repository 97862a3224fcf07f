//! The traffic generator against the real Soft-RoCE stack: `ibjitter serve` on rxe1
//! (10.0.0.2), `ibjitter run` on rxe0. Release binaries: the latency comparisons with
//! perftest need optimized code.
mod common;
use common::bench::{release_artifact, scratch_dir, Vm};
use common::perftest::{field, latency_rows};
use common::read_json;
use serde_json::Value;

fn ibjitter() -> String {
    release_artifact("ibjitter", "ibjitter")
        .display()
        .to_string()
}

/// Checks a many-flow report: every flow moved data and has latencies; fairness is sane.
fn assert_every_flow_moved(report: &Value, flows: usize) {
    let list = report["flows"].as_array().expect("flows array");
    assert_eq!(list.len(), flows);
    assert_eq!(report["flows_started"], flows);
    for f in list {
        assert!(f["ops"].as_u64().unwrap() > 0, "flow moved nothing: {f}");
        assert!(
            f["latency"]["count"].as_u64().unwrap() > 0,
            "empty histogram: {f}"
        );
        assert_eq!(f["status"], "ok", "{f}");
    }
    let fairness = report["fairness"].as_f64().unwrap();
    assert!(
        fairness > 0.0 && fairness <= 1.0 + 1e-9,
        "fairness {fairness}"
    );
    assert_eq!(report["outcome"], "completed");
}

#[test]
fn five_hundred_twelve_flows_of_write_and_send() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-512");
    let o = out_dir.display();
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --flows 512 --threads auto --pin --op write --size 4K --duration 3s \
            --json {o}/write.json --timeseries {o}/write.csv --hdr-log {o}/write.hlog --no-progress
        echo "write_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --flows 512 --threads 2 --op send --size 4K --depth 2 --duration 3s \
            --json {o}/send.json --no-progress
        echo "send_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --flows 64 --op write --size 4K --depth 8 --signal-every 4 \
            --iters 101 --json {o}/sig.json --no-progress > /dev/null
        echo "sig_rc=$?"
        kill $server; wait $server
        cat {o}/serve.log"#
    ));
    out.assert_success();
    assert_eq!(field(&out.output, "write_rc"), Some(0.0), "{}", out.output);
    assert_eq!(field(&out.output, "send_rc"), Some(0.0), "{}", out.output);

    let write = read_json(&out_dir.join("write.json"));
    assert_every_flow_moved(&write, 512);
    // --threads auto --pin: one thread per CPU of the VM (2), each on its own CPU, the flows
    // dealt out evenly; the threads' figures add up to the run's.
    assert_eq!(
        (&write["threads"], &write["cpus"]),
        (&2.into(), &2.into()),
        "{write}"
    );
    let threads = write["per_thread"].as_array().unwrap();
    let cpus: Vec<u64> = threads.iter().map(|t| t["cpu"].as_u64().unwrap()).collect();
    assert_eq!(cpus, [0, 1]);
    let sum = |k: &str| threads.iter().map(|t| t[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("flows"), 512);
    assert_eq!(sum("ops"), write["total"]["ops"].as_u64().unwrap());
    assert_eq!(sum("bytes"), write["total"]["bytes"].as_u64().unwrap());
    assert!(threads
        .iter()
        .all(|t| t["flows"] == 256 && t["gbps"].as_f64() > Some(0.0)));
    // One WRITE in 4 signaled (and each flow's last): every operation is still counted once.
    assert_eq!(field(&out.output, "sig_rc"), Some(0.0), "{}", out.output);
    let sig = read_json(&out_dir.join("sig.json"));
    assert_every_flow_moved(&sig, 64);
    assert_eq!(sig["signal_every"], 4);
    for f in sig["flows"].as_array().unwrap() {
        assert_eq!(
            (&f["ops"], &f["in_flight"]),
            (&101.into(), &0.into()),
            "{f}"
        );
        assert_eq!(f["latency"]["count"], 101, "{f}");
    }
    assert_eq!(sig["server_received_bytes"], sig["total"]["bytes"]);
    let send = read_json(&out_dir.join("send.json"));
    assert_every_flow_moved(&send, 512);
    // Every SEND the client counted as complete arrived at the server; for WRITE the server
    // reports the client's count (a WRITE raises no completion at the target).
    assert_eq!(
        send["server_received_bytes"], send["total"]["bytes"],
        "{}",
        out.output
    );
    assert_eq!(write["server_received_bytes"], write["total"]["bytes"]);
    let wrote = format!(
        "the client wrote {} operations, {} bytes into this server's memory",
        write["total"]["ops"], write["total"]["bytes"]
    );
    assert!(out.output.contains(&wrote), "{wrote}:\n{}", out.output);
    // Steady state: the window after the (zero) warm-up and before the (zero) cool-down is
    // the whole 3 s; the whole-run figure also counts the drain after it.
    let steady = &write["steady"];
    assert_eq!(
        (steady["from_s"].as_f64(), steady["until_s"].as_f64()),
        (Some(0.0), Some(3.0))
    );
    let (sb, tb) = (
        steady["bytes"].as_u64().unwrap(),
        write["total"]["bytes"].as_u64().unwrap(),
    );
    assert!(sb > 0 && sb <= tb, "steady {sb} of {tb} bytes");

    // The time series covers all 512 flows; its bytes add up to the report's.
    let csv = std::fs::read_to_string(out_dir.join("write.csv")).unwrap();
    let mut flows = std::collections::HashSet::new();
    let mut bytes = 0u64;
    for line in csv.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        flows.insert(cols[1].to_string());
        bytes += cols[2].parse::<u64>().unwrap();
    }
    assert_eq!(flows.len(), 512);
    assert_eq!(Some(bytes), write["total"]["bytes"].as_u64());
    let hlog = std::fs::read_to_string(out_dir.join("write.hlog")).unwrap();
    assert!(
        hlog.contains("#[StartTime:") && hlog.lines().filter(|l| !l.starts_with('#')).count() >= 3,
        "{hlog}"
    );
}

#[test]
fn pingpong_times_whole_round_trips_like_ib_write_lat() {
    let bin = ibjitter();
    // Alternate the two tools six times in one VM and compare the fastest round trip (perftest's
    // t_min) of each over all its runs: that we time one whole round trip, as perftest does.
    // The bench flips between two speeds, and each tool's floor flips with it, independently:
    // one run's t_min was 18.3..27.8 us for ib_write_lat and 19.2..42.7 for ours in one VM,
    // and in another VM all six of ib_write_lat's were 28.2..40.1 while ours reached 20.5. The
    // ratio of the two floors measured 0.73..1.26 over suite runs, so it is held to what a
    // wrong measurement would give: half a round trip (0.5) or two (2.0). How fast our loop is
    // against perftest is a benchmark's question (tools/bench-gen), not this test's.
    let out = Vm::new().timeout(600).run(&format!(
        r#". tools/vm/lib.sh
        for i in 1 2 3 4 5 6; do
            echo "@@ ib_write_lat"
            pair lat "tcp_listening 18515" "ib_write_lat -d rxe1 -x 1 -n 2000 > /dev/null" \
                "ib_write_lat -d rxe0 -x 1 -n 2000 10.0.0.2" || exit 1
            echo "@@ ibjitter"
            {bin} serve --dev rxe1 --once > /tmp/serve.log 2>&1 &
            wait_until 20 tcp_listening 18515
            {bin} run 10.0.0.2 --dev rxe0 --pingpong --iters 2000 --no-progress || exit 1
            wait
        done
        # SEND ping-pong (receives on the client's own QPs, the server's SRQ) over 4 flows.
        {bin} serve --dev rxe1 --once > /tmp/serve.log 2>&1 &
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --pingpong --op send --flows 4 --iters 500 --no-progress > /tmp/send.txt || exit 1
        wait
        grep -q "outcome Completed" /tmp/send.txt && echo "send_pingpong=ok""#
    ));
    out.assert_success();
    assert!(out.output.contains("send_pingpong=ok"), "{}", out.output);
    let (mut theirs, mut ours) = (Vec::new(), Vec::new());
    for section in out.output.split("@@ ").skip(1) {
        let t_min = latency_rows(section)
            .first()
            .map(|r| r[2])
            .expect("no latency row");
        if section.starts_with("ib_write_lat") {
            theirs.push(t_min);
        } else {
            ours.push(t_min);
        }
    }
    assert_eq!((theirs.len(), ours.len()), (6, 6), "{}", out.output);
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let ratio = best(&ours) / best(&theirs);
    println!("t_min: ibjitter {ours:?} us, ib_write_lat {theirs:?} us, ratio of best {ratio:.3}");
    assert!(
        ratio > 0.5 && ratio < 2.0,
        "fastest ping-pong round trip {ours:?} vs ib_write_lat {theirs:?}"
    );
}

#[test]
fn lost_server_and_ctrl_c_keep_partial_results() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-partial");
    let o = out_dir.display();
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > /dev/null 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --flows 8 --duration 60s --json {o}/lost.json --no-progress & client=$!
        sleep 4; kill -9 $server; t0=$(date +%s.%N)
        wait $client; rc=$?
        echo "lost_rc=$rc lost_after_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {{ print b - a }}')"

        {bin} serve --dev rxe1 > /dev/null 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --flows 8 --duration 60s --json {o}/int.json --no-progress & client=$!
        sleep 4; kill -INT $client
        wait $client; echo "int_rc=$?"
        kill $server"#
    ));
    out.assert_success();
    assert_eq!(field(&out.output, "lost_rc"), Some(3.0), "{}", out.output);
    let after = field(&out.output, "lost_after_s").expect("timing line");
    assert!(
        after < 10.0,
        "client took {after} s to notice the lost server"
    );
    let lost = read_json(&out_dir.join("lost.json"));
    assert_eq!(lost["outcome"], "peer_lost");
    assert!(
        lost["total"]["ops"].as_u64().unwrap() > 0,
        "nothing measured before the loss"
    );

    assert_eq!(field(&out.output, "int_rc"), Some(130.0), "{}", out.output);
    let int = read_json(&out_dir.join("int.json"));
    assert_eq!(int["outcome"], "interrupted");
    assert!(int["total"]["ops"].as_u64().unwrap() > 0);
    assert_eq!(int["flows"].as_array().unwrap().len(), 8);
}

#[test]
fn injected_delay_shows_in_pingpong_round_trips() {
    let bin = ibjitter();
    let shim = release_artifact("ibjitter-shim", "libibjitter.so")
        .display()
        .to_string();
    let out_dir = scratch_dir("gen-shim");
    let o = out_dir.display();
    const D_US: f64 = 300.0;
    // Baseline and injected runs interleaved three times in one VM; the client's every post
    // waits D. (With two pairs both baselines once fell in the bench's slow speed and both
    // injected runs in its fast one: the fastest round trip grew by only 0.77 D.)
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} table constant --value {D_US}us -o {o}/d.dist || exit 1
        one() {{  # one NAME [env ...]
            local name=$1; shift
            {bin} serve --dev rxe1 --once > /dev/null 2>&1 &
            wait_until 20 tcp_listening 18515
            env "$@" {bin} run 10.0.0.2 --dev rxe0 --pingpong --iters 1000 --json {o}/$name.json > /dev/null || exit 1
            wait
        }}
        for i in 1 2 3; do
            one base$i
            one shim$i LD_PRELOAD={shim} IBJITTER_TABLE={o}/d.dist IBJITTER_STATS={o}/stats$i.json
        done"#
    ));
    out.assert_success();
    // The fastest round trip of each mode: a constant delay shifts every round trip by D,
    // while the bench's noise (its two speeds, a busy host) only lengthens some. Medians
    // swing by 30 % of D between runs here; the minimum moved by D + 0.4..3 % (noise only adds:
    // at least 0.9 D, under 1.5 D, which twice the delay would not be).
    let fastest = |mode: &str| {
        (1..=3)
            .map(|i| {
                read_json(&out_dir.join(format!("{mode}{i}.json")))["total"]["latency"]["min_ns"]
                    .as_f64()
                    .unwrap()
                    / 1e3
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (base, shim) = (fastest("base"), fastest("shim"));
    let growth = shim - base;
    println!("fastest round trip {base:.1} -> {shim:.1} us: +{growth:.1} us with D = {D_US} us");
    // The floor is the delay itself, not the clean runs plus it: a fresh-clone run had all
    // three clean runs in the slow speed (fastest 129.7 us) and grew only +242 of 300.
    assert!(
        shim >= 0.97 * D_US && growth < 1.5 * D_US,
        "fastest round trip {shim:.1} us, +{growth:.1} over clean, with D = {D_US} us (>= 0.97 D, growth < 1.5 D)"
    );
    for i in 1..=3 {
        let stats = read_json(&out_dir.join(format!("stats{i}.json")));
        // One delayed post per round trip: the client posts exactly its 1000 writes.
        assert_eq!(stats["posts_total"], 1000, "{stats}");
    }
}

#[test]
fn rdma_cm_connects_every_flow() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-cm");
    let o = out_dir.display();
    // One `serve --cm` takes rdma_cm clients (WRITE, SEND through its SRQ, ping-pong), a
    // stranger's connection request, and a TCP-exchange client; then a server without --cm
    // refuses a --cm client.
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 --cm > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515 && wait_until 20 cm_listening 18515 || exit 1
        {bin} run 10.0.0.2 --dev rxe0 --cm --flows 128 --threads 2 --op write --size 4K \
            --duration 4s --json {o}/write.json --no-progress > /dev/null & client=$!
        sleep 2.5
        rdma res show cm_id > {o}/cm_ids.txt
        wait $client; echo "write_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --cm --flows 128 --threads 2 --op send --size 4K --depth 2 \
            --duration 3s --json {o}/send.json --no-progress > /dev/null
        echo "send_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --cm --pingpong --iters 1000 --json {o}/pp.json --no-progress > /dev/null
        echo "pp_rc=$?"
        timeout 10 rping -c -a 10.0.0.2 -p 18515 -C 1 > {o}/rping.log 2>&1
        echo "rping_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --flows 4 --duration 1s --json {o}/tcp.json --no-progress > /dev/null
        echo "tcp_rc=$?"
        kill $server; wait $server
        # No host at this address: rdma_cm cannot resolve it, and says what to give instead.
        {bin} run 10.0.0.99 --dev rxe0 --cm --flows 2 --duration 1s --no-progress 2> {o}/unreachable.err
        echo "unreachable_rc=$?"
        {bin} serve --dev rxe1 --once > /dev/null 2>&1 &
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --cm --flows 2 --duration 1s --no-progress 2> {o}/refused.err
        echo "refused_rc=$?"
        wait
        cat {o}/serve.log"#
    ));
    out.assert_success();
    for (name, flows) in [("write", 128), ("send", 128), ("pp", 1)] {
        assert_eq!(
            field(&out.output, &format!("{name}_rc")),
            Some(0.0),
            "{}",
            out.output
        );
        let report = read_json(&out_dir.join(format!("{name}.json")));
        assert_every_flow_moved(&report, flows);
        assert_eq!(report["connection"], "rdma_cm");
    }
    // Mid-run, the kernel's rdma_cm lists every flow as a connected id on both devices.
    let ids = std::fs::read_to_string(out_dir.join("cm_ids.txt")).unwrap();
    let connected = |dev: &str, addr: &str| {
        ids.lines()
            .filter(|l| l.starts_with(&format!("link {dev}/1 ")))
            .filter(|l| l.contains("state CONNECT ") && l.contains(addr))
            .count()
    };
    assert_eq!(
        connected("rxe0", "dst-addr 10.0.0.2:18515"),
        128,
        "client ids:\n{ids}"
    );
    assert_eq!(
        connected("rxe1", "src-addr 10.0.0.2:18515"),
        128,
        "server ids:\n{ids}"
    );
    let send = read_json(&out_dir.join("send.json"));
    assert_eq!(send["server_received_bytes"], send["total"]["bytes"]);
    let pp = read_json(&out_dir.join("pp.json"));
    assert_eq!(pp["total"]["ops"], 1000);

    // A connection request without our private data is refused; the server carries on.
    let rping = std::fs::read_to_string(out_dir.join("rping.log")).unwrap();
    assert_ne!(field(&out.output, "rping_rc"), Some(0.0), "{rping}");
    assert!(rping.contains("REJECTED"), "{rping}");
    assert_eq!(field(&out.output, "tcp_rc"), Some(0.0), "{}", out.output);
    assert_eq!(read_json(&out_dir.join("tcp.json"))["connection"], "tcp");

    let unreachable = std::fs::read_to_string(out_dir.join("unreachable.err")).unwrap();
    assert_eq!(
        field(&out.output, "unreachable_rc"),
        Some(2.0),
        "{unreachable}"
    );
    assert!(unreachable.contains("RDMA network"), "{unreachable}");

    let refused = std::fs::read_to_string(out_dir.join("refused.err")).unwrap();
    assert_eq!(field(&out.output, "refused_rc"), Some(2.0), "{refused}");
    assert!(refused.contains("serve --cm"), "{refused}");
}

/// Open loop, asked for far more than the bench can carry (4 flows x 200k ops/s of 4 KiB
/// WRITEs; rxe under TCG carries some thousands): the run says it was overloaded (stderr,
/// outcome, exit 4), and its offered rate, achieved rate and the sends it never posted add
/// up. A rate well within capacity is offered and says so.
#[test]
fn open_loop_says_when_it_cannot_offer_its_rate() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-open");
    let o = out_dir.display();
    let out = Vm::new().timeout(300).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --flows 4 --op write --size 4K --duration 3s --rate 200k \
            --json {o}/over.json --no-progress 2> {o}/over.err
        echo "over_rc=$?"
        {bin} run 10.0.0.2 --dev rxe0 --flows 4 --op write --size 4K --duration 3s --rate 200 \
            --json {o}/fine.json --no-progress
        echo "fine_rc=$?"
        kill $server; wait $server
        cat {o}/over.err"#
    ));
    out.assert_success();
    assert_eq!(field(&out.output, "over_rc"), Some(4.0), "{}", out.output);
    assert_eq!(field(&out.output, "fine_rc"), Some(0.0), "{}", out.output);

    let check = |name: &str| -> Value {
        let r = read_json(&out_dir.join(format!("{name}.json")));
        let ol = &r["open_loop"];
        let flows = r["flows"].as_array().unwrap();
        let posted: u64 = flows
            .iter()
            .map(|f| f["ops"].as_u64().unwrap() + f["in_flight"].as_u64().unwrap())
            .sum();
        let missed: u64 = flows.iter().map(|f| f["missed"].as_u64().unwrap()).sum();
        assert_eq!(ol["missed"].as_u64(), Some(missed), "{name}: {ol}");
        assert_eq!(ol["due"].as_u64(), Some(posted + missed), "{name}: {ol}");
        let share = ol["missed_share"].as_f64().unwrap();
        assert!(
            (share - missed as f64 / (posted + missed) as f64).abs() < 1e-9,
            "{name}: {ol}"
        );
        let achieved = ol["achieved_ops_per_s"].as_f64().unwrap();
        let ops = r["total"]["ops"].as_f64().unwrap();
        let secs = r["duration_s"].as_f64().unwrap();
        assert!(
            (achieved - ops / secs).abs() < 1e-6 * achieved.max(1.0),
            "{name}: {ol}"
        );
        eprintln!("{name}: {ol}");
        r
    };
    let over = check("over");
    let ol = &over["open_loop"];
    assert_eq!(over["outcome"], "overloaded");
    assert_eq!(ol["offered_ops_per_s"].as_f64(), Some(800_000.0));
    let achieved = ol["achieved_ops_per_s"].as_f64().unwrap();
    assert!(achieved < 0.95 * 800_000.0, "{ol}");
    // A 3 s schedule of 200k/s per flow: about 600k sends due per flow.
    let due = ol["due"].as_u64().unwrap();
    assert!((4 * 590_000..=4 * 600_001).contains(&due), "{ol}");
    assert!(ol["missed_share"].as_f64().unwrap() > 0.05, "{ol}");
    assert!(
        out.output
            .contains("ibjitter run: overloaded: offered 800000 ops/s"),
        "{}",
        out.output
    );

    let fine = check("fine");
    let ol = &fine["open_loop"];
    assert_eq!(fine["outcome"], "completed");
    assert_eq!(ol["offered_ops_per_s"].as_f64(), Some(800.0));
    assert!(ol["missed_share"].as_f64().unwrap() < 0.05, "{ol}");
    let achieved = ol["achieved_ops_per_s"].as_f64().unwrap();
    assert!((0.85 * 800.0..=1.05 * 800.0).contains(&achieved), "{ol}");
}

/// Bounded memory: the time series streams to its file, so 1,000 flows for 20 s with a 1 ms
/// series (and a 10 ms latency log) peak at no more than 1.2 x the same run for 5 s; without
/// a series the RSS sampled every 0.5 s stays flat once the flows' histograms have grown to
/// the run's latency range (the first 2 s: they grow with the largest latency, not with
/// time). Also the steady-state window of a run with a warm-up (and the cool-down it implies).
#[test]
fn memory_stays_bounded_whatever_the_duration() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-memory");
    let o = out_dir.display();
    let out = Vm::new().timeout(900).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        common="10.0.0.2 --dev rxe0 --flows 1000 --threads 2 --size 4K --no-progress"
        {bin} run $common --duration 5s --timeseries {o}/a5.csv --interval 1ms --json {o}/a5.json > /dev/null; echo "a5_rc=$?"
        {bin} run $common --duration 20s --timeseries {o}/a20.csv --interval 1ms --hdr-log {o}/a20.hlog \
            --hdr-interval 10ms --json {o}/a20.json > /dev/null; echo "a20_rc=$?"
        {bin} run $common --duration 12s --warmup 1s --json {o}/b.json > /dev/null & pid=$!
        # Sampled with bash builtins (only sleep forks): under TCG each process started
        # takes a few hundred ms, which stretched the 0.5 s period to 1.7 s.
        t0=${{EPOCHREALTIME/./}}
        while kill -0 $pid 2>/dev/null; do
            rss=
            while read -r k v _; do [ "$k" = VmRSS: ] && {{ rss=$v; break; }}; done < /proc/$pid/status 2>/dev/null
            t=${{EPOCHREALTIME/./}}
            [ -n "$rss" ] && echo "rss $(( (t - t0) / 1000 )) $rss"
            sleep 0.5
        done
        wait $pid; echo "b_rc=$?"
        kill $server; wait $server
        exit 0"#
    ));
    out.assert_success();
    for run in ["a5", "a20", "b"] {
        assert_eq!(
            field(&out.output, &format!("{run}_rc")),
            Some(0.0),
            "{}",
            out.output
        );
    }
    let peak = |run: &str| {
        let r = read_json(&out_dir.join(format!("{run}.json")));
        assert_every_flow_moved(&r, 1000);
        r["rss_per_flow_bytes"].as_u64().unwrap() * 1000
    };
    let (p5, p20) = (peak("a5"), peak("a20"));
    eprintln!(
        "peak RSS: 5 s {:.1} MB, 20 s {:.1} MB (x{:.2})",
        p5 as f64 / 1e6,
        p20 as f64 / 1e6,
        p20 as f64 / p5 as f64
    );
    assert!(
        p20 as f64 <= 1.2 * p5 as f64,
        "20 s peaked at {p20} B, 5 s at {p5} B"
    );
    // The 20 s series streamed: its rows add up to the report's bytes.
    let a20 = read_json(&out_dir.join("a20.json"));
    let csv = std::fs::read_to_string(out_dir.join("a20.csv")).unwrap();
    let bytes: u64 = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(Some(bytes), a20["total"]["bytes"].as_u64());
    assert!(std::fs::metadata(out_dir.join("a20.hlog")).unwrap().len() > 0);

    // Without a series: RSS over the run, from 2 s after its start to its end.
    let b = read_json(&out_dir.join("b.json"));
    let start_ms = b["setup_s"].as_f64().unwrap() * 1e3;
    let samples: Vec<(f64, u64)> = out
        .output
        .lines()
        .filter_map(|l| l.strip_prefix("rss "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .filter(|&(t, _)| t >= start_ms + 2_000.0 && t <= start_ms + 12_000.0)
        .collect();
    // At least 5 samples over at least 6 of those 10 s (the period stretches on a busy host).
    let span_ms = samples.last().map_or(0.0, |l| l.0) - samples.first().map_or(0.0, |f| f.0);
    assert!(samples.len() >= 5 && span_ms >= 6_000.0, "{samples:?}");
    let first = samples[0].1;
    let max = samples.iter().map(|s| s.1).max().unwrap();
    eprintln!("no series: RSS {first} KiB at 2 s, at most {max} KiB until 12 s");
    assert!(
        max as f64 <= first as f64 * 1.02,
        "RSS grew from {first} to {max} KiB: {samples:?}"
    );
    let steady = &b["steady"];
    assert_eq!(
        (steady["from_s"].as_f64(), steady["until_s"].as_f64()),
        (Some(1.0), Some(11.0))
    );
}

/// Validation against the device (a port it lacks), then Ctrl-C at any phase: 1 s into the set-up of 4,000 flows the run exits 130 within 2 s and
/// nothing was posted (rxe0 sent no packet: QP set-up and the TCP exchange send none); during
/// the traffic of 1,000 flows the last completion comes within 1 s of the signal.
#[test]
fn ctrl_c_stops_set_up_and_traffic_within_a_second() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-ctrl-c");
    let o = out_dir.display();
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        now() {{ date +%s.%N; }}
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --ib-port 2 --no-progress; echo "port_rc=$?"
        p0=$(rxe_counter rxe0 sent_pkts)
        {bin} run 10.0.0.2 --dev rxe0 --flows 4000 --threads 2 --depth 4 --size 4K --duration 30s \
            --no-progress --json {o}/setup.json > /dev/null 2> {o}/setup.err & pid=$!
        sleep 1; t=$(now); kill -INT $pid; wait $pid; rc=$?
        echo "setup_rc=$rc setup_exit_s=$(awk -v a=$t -v b=$(now) 'BEGIN {{ print b - a }}')"
        echo "setup_packets=$(( $(rxe_counter rxe0 sent_pkts) - p0 ))"
        cat {o}/setup.err

        {bin} run 10.0.0.2 --dev rxe0 --flows 1000 --threads 2 --depth 4 --size 4K --duration 60s \
            --no-progress --json {o}/run.json > /dev/null 2> {o}/run.err & pid=$!
        p0=$(rxe_counter rxe0 sent_pkts)
        wait_until 60 sh -c "[ \$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts) -gt $((p0 + 20000)) ]"
        t=$(now); kill -INT $pid; wait $pid; rc=$?
        echo "run_rc=$rc run_sigint_unix_s=$t run_exit_s=$(awk -v a=$t -v b=$(now) 'BEGIN {{ print b - a }}')"
        cat {o}/run.err
        kill $server; wait $server
        exit 0"#
    ));
    out.assert_success();
    let o = &out.output;
    // A port the device does not have is named as such, before anything is set up.
    assert_eq!(field(o, "port_rc"), Some(2.0), "{o}");
    assert!(o.contains("--ib-port 2: rxe0 has port(s) 1..=1"), "{o}");
    assert_eq!(field(o, "setup_rc"), Some(130.0), "{o}");
    let exit_s = field(o, "setup_exit_s").expect("timing");
    eprintln!("SIGINT 1 s into the set-up of 4,000 flows: exit after {exit_s:.2} s");
    assert!(exit_s < 2.0, "{o}");
    assert_eq!(
        field(o, "setup_packets"),
        Some(0.0),
        "something was posted:\n{o}"
    );
    assert!(
        !out_dir.join("setup.json").exists(),
        "no report for a run that never started"
    );

    assert_eq!(field(o, "run_rc"), Some(130.0), "{o}");
    let r = read_json(&out_dir.join("run.json"));
    assert_eq!(r["outcome"], "interrupted");
    let start_s = r["start_unix_ns"].as_f64().unwrap() / 1e9;
    let last_s = start_s + r["duration_s"].as_f64().unwrap();
    let sigint_s = field(o, "run_sigint_unix_s").unwrap();
    eprintln!(
        "SIGINT during the traffic of 1,000 flows: last completion {:.3} s after it, exit after {:.2} s",
        last_s - sigint_s,
        field(o, "run_exit_s").unwrap()
    );
    assert!(
        last_s - sigint_s < 1.0,
        "traffic went on: {:.3} s",
        last_s - sigint_s
    );
    assert!(r["total"]["ops"].as_u64().unwrap() > 0);
}

/// Every verb beyond RC SEND and WRITE, in one VM, each counted at both ends: READ and
/// WRITE_IMM move data and the server's counts match the client's (READ from the client's
/// count, WRITE_IMM from the server's own receive completions); fetch_add's words sum to
/// fetch_adds x addend exactly; every cmp_swap swaps and the words add up to them; UD
/// datagrams (of the full 4 KiB MTU) all arrive, counted exactly and without their GRH (offered
/// well within the bench's slow speed: at depth 1 a rate of 1,000/s per flow left no room for a
/// completion slower than 1 ms, and one run came out `Overloaded`); a mix
/// reports each op type with a count above 0, the counts adding up to the total; all six
/// ops in one mix, atomics included, keep every one of these checks.
#[test]
fn every_verb_is_counted_at_both_ends() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-verbs");
    let o = out_dir.display();
    let out = Vm::new().timeout(600).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        one() {{  # one NAME ARGS...: a run against the server, its JSON in NAME.json
            local name=$1; shift
            {bin} run 10.0.0.2 --dev rxe0 --no-progress --json {o}/$name.json "$@" > {o}/$name.txt
            echo "${{name}}_rc=$?"
        }}
        one read  --op read --size 4K --flows 8 --depth 4 --duration 2s
        one imm   --op write_imm --size 4K --flows 8 --depth 4 --duration 2s
        one fa    --op fetch_add --flows 8 --depth 8 --iters 2000
        one cs    --op cmp_swap --flows 8 --depth 8 --signal-every 4 --iters 1001
        one ud    --qp-type ud --op send --size 4K --flows 4 --rate 250 --depth 4 --duration 2s
        one mix   --mix write:70,read:20,send:10 --size 4K --flows 8 --depth 2 --duration 2s
        one all   --mix write:5,read:1,write_imm:1,fetch_add:1,cmp_swap:1,send:1 --size 8 \
                  --flows 4 --depth 4 --iters 3000
        kill $server; wait $server
        cat {o}/serve.log"#
    ));
    out.assert_success();
    let log = &out.output;
    let runs = ["read", "imm", "fa", "cs", "ud", "mix", "all"];
    for name in runs {
        assert_eq!(
            field(log, &format!("{name}_rc")),
            Some(0.0),
            "{name}: {log}"
        );
    }
    let report = |name: &str| read_json(&out_dir.join(format!("{name}.json")));
    let u = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    // What the server says reached it of `op`, and whose count that is.
    let at_server = |r: &Value, op: &str| {
        let s = &r["server_counts"]["ops"][op];
        (
            u(&s["ops"]),
            u(&s["bytes"]),
            s["counted_at"].as_str().unwrap().to_string(),
        )
    };

    let read = report("read");
    assert_every_flow_moved(&read, 8);
    let (ops, bytes) = (u(&read["total"]["ops"]), u(&read["total"]["bytes"]));
    assert_eq!(read["op"], "RDMA_READ");
    assert_eq!(at_server(&read, "read"), (ops, bytes, "client".into()));
    assert_eq!(read["server_received_bytes"], read["total"]["bytes"]);
    assert!(
        log.contains(&format!(
            "read: {ops} operations, {bytes} bytes (the client's count"
        )),
        "{log}"
    );

    // WRITE_IMM: the server's own count of its receive completions equals the client's.
    let imm = report("imm");
    assert_every_flow_moved(&imm, 8);
    let (ops, bytes) = (u(&imm["total"]["ops"]), u(&imm["total"]["bytes"]));
    assert_eq!(at_server(&imm, "write_imm"), (ops, bytes, "server".into()));
    assert!(
        log.contains(&format!("write_imm: received {ops}, {bytes} bytes")),
        "{log}"
    );

    // fetch_add: 8 flows x 2000, each adding the addend to its flow's word.
    let fa = report("fa");
    assert_every_flow_moved(&fa, 8);
    assert_eq!(u(&fa["total"]["ops"]), 16_000);
    let check = &fa["server_counts"]["fetch_add"];
    let addend = u(&check["addend"]);
    assert!(addend > 1, "an addend of 1 hides width and order mistakes");
    assert_eq!(u(&check["ops"]), 16_000);
    assert_eq!(u(&check["sum"]), 16_000 * addend, "{check}");
    assert_eq!(check["exact"], true);
    assert!(
        log.contains(&format!(
            "fetch_add words sum to {} = 16000 x {addend}: exact",
            16_000 * addend
        )),
        "{log}"
    );

    // cmp_swap, one in 4 signaled: every one swapped, and the words count them.
    let cs = report("cs");
    assert_every_flow_moved(&cs, 8);
    assert_eq!(u(&cs["total"]["ops"]), 8_008);
    assert_eq!(u(&cs["ops"]["cmp_swap"]["swapped"]), 8_008);
    let check = &cs["server_counts"]["cmp_swap"];
    assert_eq!(
        (u(&check["swapped"]), u(&check["sum"])),
        (8_008, 8_008),
        "{check}"
    );
    assert_eq!(check["exact"], true);

    // UD at the MTU, paced within what the server reaps: every datagram arrives, counted
    // exactly, its bytes the payload alone (no GRH).
    let ud = report("ud");
    assert_every_flow_moved(&ud, 4);
    assert_eq!((&ud["qp_type"], &ud["op"]), (&"ud".into(), &"SEND".into()));
    let sent = u(&ud["total"]["ops"]);
    assert!(sent > 1_000, "{sent} datagrams");
    assert_eq!(at_server(&ud, "send"), (sent, sent * 4096, "server".into()));
    assert_eq!(ud["server_counts"]["datagrams_lost"], 0);
    assert!(
        log.contains(&format!(
            "received {sent} of the {sent} datagrams the client sent"
        )),
        "{log}"
    );

    // Mixes: every op of the mix completed some, the op counts and bytes add up to the
    // totals, and the ops counted at the server match the client's.
    for (name, flows, mix) in [
        ("mix", 8, &["write", "read", "send"][..]),
        (
            "all",
            4,
            &[
                "write",
                "read",
                "send",
                "write_imm",
                "fetch_add",
                "cmp_swap",
            ],
        ),
    ] {
        let r = report(name);
        assert_every_flow_moved(&r, flows);
        let ops = r["ops"].as_object().expect("ops map");
        let mut keys: Vec<&str> = ops.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = mix.to_vec();
        want.sort_unstable();
        assert_eq!(keys, want, "{name}");
        let (mut count, mut bytes) = (0, 0);
        for (op, o) in ops {
            assert!(u(&o["count"]) > 0, "{name}: {op} never completed: {o}");
            assert_eq!(o["latency"]["count"], o["count"], "{name}: {op}");
            count += u(&o["count"]);
            bytes += u(&o["bytes"]);
        }
        assert_eq!(count, u(&r["total"]["ops"]), "{name}");
        assert_eq!(bytes, u(&r["total"]["bytes"]), "{name}");
        for op in ["send", "write_imm"].iter().filter(|op| mix.contains(op)) {
            let o = &r["ops"][op];
            let at = at_server(&r, op);
            assert_eq!(
                at,
                (u(&o["count"]), u(&o["bytes"]), "server".into()),
                "{name}: {op}"
            );
        }
        eprintln!("{name}: {}", r["ops"]);
    }
    let all = report("all");
    assert_eq!(u(&all["total"]["ops"]), 12_000);
    let s = &all["server_counts"];
    let fa = u(&all["ops"]["fetch_add"]["count"]);
    assert_eq!(
        u(&s["fetch_add"]["sum"]),
        fa * u(&s["fetch_add"]["addend"]),
        "{s}"
    );
    let cs = u(&all["ops"]["cmp_swap"]["count"]);
    assert_eq!(
        (u(&s["cmp_swap"]["swapped"]), u(&s["cmp_swap"]["sum"])),
        (cs, cs),
        "{s}"
    );
    let table = std::fs::read_to_string(out_dir.join("all.txt")).unwrap();
    for op in [
        "write",
        "read",
        "send",
        "write_imm",
        "fetch_add",
        "cmp_swap",
    ] {
        assert!(
            table.lines().any(|l| l.starts_with(&format!(" {op} "))),
            "no line for {op}:\n{table}"
        );
    }
}

/// #18's scale: 10,000 flows (QPs) of 4 KiB WRITEs from one process, two threads: every flow
/// started and moved data, and our own memory per flow (the report's itemized buffers and
/// run state: resident memory, less the process before the flows and the provider's
/// queues) stays at or under 16 KiB. Set-up time and start skew are printed for the note.
#[test]
fn ten_thousand_flows_start_move_data_and_take_under_16_kib_each() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-10k");
    let o = out_dir.display();
    let out = Vm::new().memory(4096).timeout(900).writable(&out_dir).run(&format!(
        r#". tools/vm/lib.sh
        {bin} serve --dev rxe1 > {o}/serve.log 2>&1 & server=$!
        wait_until 20 tcp_listening 18515
        {bin} run 10.0.0.2 --dev rxe0 --flows 10000 --threads 2 --size 4K --duration 8s --warmup 2s \
            --no-progress --json {o}/run.json
        echo "run_rc=$?"
        kill $server; wait $server; true"#
    ));
    out.assert_success();
    assert_eq!(field(&out.output, "run_rc"), Some(0.0), "{}", out.output);
    let r = read_json(&out_dir.join("run.json"));
    assert_every_flow_moved(&r, 10_000);
    let m = &r["memory_per_flow"];
    let ours = m["buffers_bytes"].as_u64().unwrap() + m["run_state_bytes"].as_u64().unwrap();
    eprintln!(
        "10,000 flows: set-up {:.2} s, start skew {:.1} ms, memory per flow {m} (ours {:.1} KiB)",
        r["setup_s"].as_f64().unwrap(),
        r["start_skew_us"].as_f64().unwrap() / 1000.0,
        ours as f64 / 1024.0
    );
    assert!(ours <= 16 * 1024, "our memory per flow {ours} B: {m}");
}

/// Flow-level workload: the web-search CDF (scaled to a tenth, 300 B to 3 MB) with Poisson
/// flow arrivals at load 0.25 of a 200 Mbit bottleneck between two emulated hosts (at load 0.5
/// a CI run in the bench's slow speed could not offer the 100 Mbit, exit 4, overloaded; at 0.5
/// of 100 Mbit the achieved load was 0.38: the bottleneck's losses and RC's go-back-N
/// retransmissions leave well under the line rate). The report's
/// FCT and slowdown per size bucket are recomputed from the per-flow CSV and agree (within the
/// histograms' 3 significant digits); no flow beats what the bottleneck lets through (its
/// bucket, then the line rate), and the achieved load is near the one asked for.
#[test]
fn websearch_flows_at_quarter_load_report_slowdown_per_size_bucket() {
    let bin = ibjitter();
    let out_dir = scratch_dir("gen-fct");
    let o = out_dir.display();
    let out = Vm::new()
        .hosts(2)
        .bottleneck("200mbit")
        .timeout(600)
        .writable(&out_dir)
        .run(&format!(
            r#". tools/vm/lib.sh
        tools/vm/on-host h0 {bin} serve --once > {o}/serve.log 2>&1 &
        wait_until 20 tcp_listening 18515
        tools/vm/on-host h1 {bin} run 10.0.0.1 --no-progress --flows 8 --depth 16 \
            --flow-sizes distributions/websearch.cdf --size-scale 0.1 --flow-arrival poisson \
            --load 0.25 --line-rate 200mbit --duration 14s --warmup 1s \
            --fct {o}/fct.csv --json {o}/fct.json
        echo "fct_rc=$?"
        wait"#
        ));
    out.assert_success();
    assert_eq!(field(&out.output, "fct_rc"), Some(0.0), "{}", out.output);
    let r = read_json(&out_dir.join("fct.json"));
    let fct = &r["fct"];
    let line_gbps = fct["line_gbps"].as_f64().unwrap();
    assert_eq!(line_gbps, 0.2);
    assert_eq!(fct["base_latency_ns"], 0);

    // Recompute each bucket from the CSV: nearest-rank percentiles, as HdrHistogram ranks.
    let csv = std::fs::read_to_string(out_dir.join("fct.csv")).unwrap();
    let mut by_bucket: [Vec<(u64, f64)>; 4] = Default::default();
    // The fastest a flow can finish: a flow that finds the port idle sends htb's bucket (burst
    // 64k in tools/vm/net-hosts) at once and the rest at the line rate; htb may overdraw by
    // a frame, so 8 KiB of slack. The generator times a flow from before its first post (or
    // its scheduled arrival) to the completion it polled, so its FCT can only be longer.
    // (Two runs: the closest flow, 1.6 MB, took 1.025 of it; frames' headers add ~1.4 %.)
    const HTB_BURST: u64 = 64 * 1024 + 8 * 1024;
    let mut tightest: Option<(f64, String)> = None;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (size, fct_ns): (u64, u64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let ideal = size as f64 * 8.0 / line_gbps;
        let slowdown: f64 = f[5].parse().unwrap();
        assert!(
            (slowdown - fct_ns as f64 / ideal).abs() <= 1e-4 * (1.0 + slowdown),
            "{line}"
        );
        let fastest_ns = size.saturating_sub(HTB_BURST) as f64 * 8.0 / line_gbps;
        if fastest_ns > 0.0 {
            let ratio = fct_ns as f64 / fastest_ns;
            assert!(
                ratio >= 1.0,
                "{line}: faster than the bottleneck allows ({fastest_ns:.0} ns)"
            );
            if tightest.as_ref().is_none_or(|t| ratio < t.0) {
                tightest = Some((ratio, line.to_string()));
            }
        }
        let k = [10_000, 100_000, 1_000_000].partition_point(|&b| size >= b);
        by_bucket[k].push((fct_ns, slowdown));
    }
    let rank = |v: &mut Vec<f64>, q: f64| -> f64 {
        v.sort_by(f64::total_cmp);
        v[((q * v.len() as f64).ceil() as usize).max(1) - 1]
    };
    let close = |ours: f64, theirs: f64, unit: f64| (ours - theirs).abs() <= 0.002 * theirs + unit;
    let buckets = fct["buckets"].as_array().unwrap();
    let mut flows = 0;
    for (k, b) in buckets.iter().enumerate() {
        let rows = &by_bucket[k];
        assert_eq!(b["messages"].as_u64().unwrap() as usize, rows.len(), "{b}");
        flows += rows.len();
        if rows.is_empty() {
            continue;
        }
        let mut f: Vec<f64> = rows.iter().map(|r| r.0 as f64).collect();
        let mut s: Vec<f64> = rows.iter().map(|r| r.1).collect();
        for (q, fct_key, slow_key) in [
            (0.5, "fct_p50_ns", "slowdown_p50"),
            (0.99, "fct_p99_ns", "slowdown_p99"),
        ] {
            let (fq, sq) = (rank(&mut f, q), rank(&mut s, q));
            let (fj, sj) = (b[fct_key].as_f64().unwrap(), b[slow_key].as_f64().unwrap());
            assert!(
                close(fj, fq, 1.0),
                "{}: {fct_key} {fj} vs CSV {fq}",
                b["name"]
            );
            assert!(
                close(sj, sq, 0.001),
                "{}: {slow_key} {sj} vs CSV {sq}",
                b["name"]
            );
        }
        println!(
            "{:>11}: {:>4} flows, FCT p50 {:.0} us p99 {:.0} us, slowdown p50 {:.2} p99 {:.2}",
            b["name"].as_str().unwrap(),
            rows.len(),
            rank(&mut f, 0.5) / 1e3,
            rank(&mut f, 0.99) / 1e3,
            rank(&mut s, 0.5),
            rank(&mut s, 0.99)
        );
    }
    // Every bucket of the scaled web search has flows (>= 1 MB: 3 % of them).
    assert!(by_bucket.iter().all(|b| !b.is_empty()), "{buckets:?}");
    assert_eq!(flows as u64, fct["messages"].as_u64().unwrap());
    // Flows of 100 KB and more were held to the port's rate (checked per flow above); their
    // median slowdown goes below 1 only by htb's bucket (a fresh-clone run: 0.92-0.93 for
    // 100KB-1MB, whose flows take ~400 KB at the median).
    let (ratio, flow) = tightest.expect("flows larger than htb's bucket");
    println!("the flow closest to the bottleneck's limit took {ratio:.3} of it: {flow}");
    // The offered load: 0.25 of the line, Poisson arrivals of heavy-tailed sizes (the bytes
    // of ~370 flows vary by about 13 %): achieved 0.15 to 0.35 in the steady state.
    let load = r["steady"]["gbps"].as_f64().unwrap() / line_gbps;
    println!("achieved load {load:.3}, {flows} flows timed");
    assert!((0.15..=0.35).contains(&load), "load {load}");
    assert_eq!(r["outcome"], "completed", "{}", out.output);
    // The bucket figures and the plot beside the CSV.
    let buckets_csv = std::fs::read_to_string(out_dir.join("fct-buckets.csv")).unwrap();
    assert_eq!(buckets_csv.lines().count(), 5, "{buckets_csv}");
    assert!(std::fs::read_to_string(out_dir.join("fct.svg"))
        .unwrap()
        .contains("<svg"));
}

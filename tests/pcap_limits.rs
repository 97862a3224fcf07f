//! `ibjitter pcap` at its limits, on captures built here: flows beyond `--max-flows` are added
//! up in one "(other flows)" row that the report counts, and timestamps going backwards (a
//! merged capture) are counted, reported, and do not make the duration 0. (Memory with
//! hundreds of thousands of flows: `pcap_many_flows.rs`.)
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ibjitter-pcapl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ibjitter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(args)
        .output()
        .expect("running ibjitter")
}

/// Ethernet / IPv4 / UDP 4791 / BTH (RC RDMA WRITE Only with its RETH) and `payload` bytes,
/// from 10.0.0.1 to 10.0.0.2, QP `qp`.
fn write_only(qp: u32, psn: u32, payload: usize) -> Vec<u8> {
    let mut bth = vec![0x0a, 0, 0xff, 0xff, 0];
    bth.extend_from_slice(&qp.to_be_bytes()[1..]);
    bth.push(0);
    bth.extend_from_slice(&psn.to_be_bytes()[1..]);
    bth.extend_from_slice(&[0; 16]);
    bth.resize(bth.len() + payload + 4, 0xab);
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((20 + 8 + bth.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]);
    f.extend_from_slice(&((8 + bth.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&bth);
    f
}

/// A nanosecond pcap of (timestamp ns, frame).
fn pcap(path: &Path, frames: &[(u64, Vec<u8>)]) {
    let mut out = 0xa1b2_3c4du32.to_le_bytes().to_vec();
    out.extend_from_slice(&[
        2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
    ]);
    for (ts, f) in frames {
        for field in [
            (ts / 1_000_000_000) as u32,
            (ts % 1_000_000_000) as u32,
            f.len() as u32,
            f.len() as u32,
        ] {
            out.extend_from_slice(&field.to_le_bytes());
        }
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn flows_beyond_max_flows_are_added_up_and_counted() {
    let dir = scratch("max");
    let file = dir.join("ten.pcap");
    // Ten QPs, 3 packets each at 1 µs, 100 bytes of payload each.
    let mut frames = Vec::new();
    for round in 0..3u32 {
        for qp in 0..10u32 {
            let t = 1_000_000_000 + u64::from(round * 10 + qp) * 1000;
            frames.push((t, write_only(0x100 + qp, round, 100)));
        }
    }
    pcap(&file, &frames);
    let js = dir.join("r.json");
    let o = ibjitter(&[
        "pcap",
        file.to_str().unwrap(),
        "--max-flows",
        "4",
        "--flows",
        "--json",
        js.to_str().unwrap(),
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("flows: 5 (5 carrying data, the last adding up 6 flows beyond --max-flows 4); payload 3000 bytes"),
        "{out}"
    );
    assert!(
        err.contains("more than 4 flows: 6 later flows added up in one \"(other flows)\" row"),
        "{err}"
    );
    assert!(
        out.contains("(other flows)"),
        "the flow table's last row\n{out}"
    );
    let r = json(&js);
    assert_eq!(
        (r["max_flows"].as_u64(), r["aggregated_flows"].as_u64()),
        (Some(4), Some(6))
    );
    assert_eq!(r["aggregated_flows_exact"], true);
    let flows = r["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 5);
    assert_eq!(flows[3]["dest_qp"], 0x103);
    assert_eq!(flows[3]["packets"], 3);
    let other = &flows[4];
    assert_eq!(
        (other["src"].as_str(), other["aggregated_flows"].as_u64()),
        (Some("(other flows)"), Some(6))
    );
    assert_eq!(
        (other["packets"].as_u64(), other["payload_bytes"].as_u64()),
        (Some(18), Some(1800))
    );
    // Ten QPs' PSNs are not one sequence: the aggregate makes no PSN checks.
    assert_eq!(other["out_of_order"], 0);
    assert_eq!(r["flows"][0].get("aggregated_flows"), None);

    // Without the option, nothing is added up.
    let o = ibjitter(&["pcap", file.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("flows: 10 (10 carrying data); payload 3000"),
        "{out}"
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A limit of 0 is refused.
    let o = ibjitter(&["pcap", file.to_str().unwrap(), "--max-flows", "0"]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn timestamps_going_backwards_are_counted_and_the_duration_is_the_span() {
    let dir = scratch("back");
    let file = dir.join("merged.pcap");
    // A merged capture, appended (mergecap -a) instead of interleaved: interface B's QP 2
    // from 10 to 15 ms first, then interface A's QP 1 from 0 to 9 ms. (Before, the duration
    // ran from the first packet read to the latest: 5 ms, and A's times clamped to 0.)
    let t0 = 1_700_000_000_000_000_000u64;
    let mut frames = Vec::new();
    for k in 0..6u64 {
        frames.push((
            t0 + 10_000_000 + k * 1_000_000,
            write_only(2, k as u32, 1000),
        ));
    }
    for k in 0..10u64 {
        frames.push((t0 + k * 1_000_000, write_only(1, k as u32, 1000)));
    }
    pcap(&file, &frames);
    let js = dir.join("r.json");
    let o = ibjitter(&[
        "pcap",
        file.to_str().unwrap(),
        "--json",
        js.to_str().unwrap(),
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}{err}");
    // Every packet of A is stamped before B's last one, read earlier.
    assert!(
        err.contains("10 RoCE packets stamped before a packet read earlier"),
        "{err}"
    );
    assert!(
        out.contains("timestamps: 10 RoCE packets were stamped before"),
        "{out}"
    );
    assert!(out.contains(", 0.015000 s"), "the span\n{out}");
    let r = json(&js);
    assert_eq!(r["backwards_timestamps"], 10);
    assert!(r["timestamps"].as_str().unwrap().contains("monotonic view"));
    assert!(
        (r["duration_s"].as_f64().unwrap() - 0.015).abs() < 1e-9,
        "{r}"
    );
    assert!((r["start_epoch_s"].as_f64().unwrap() - t0 as f64 / 1e9).abs() < 1e-6);
    let (b, a) = (&r["flows"][0], &r["flows"][1]);
    assert!((b["first_s"].as_f64().unwrap() - 0.010).abs() < 1e-9, "{b}");
    // A on its own is in order: its times and gaps are its own.
    assert_eq!(a["backwards"], 0);
    assert!((a["first_s"].as_f64().unwrap()).abs() < 1e-9, "{a}");
    assert!((a["last_s"].as_f64().unwrap() - 0.009).abs() < 1e-9, "{a}");
    assert_eq!(a["ipd_requests"]["gaps"], 9);
    assert_eq!(a["ipd_requests"]["percentiles"]["max_ns"], 1_000_447);
    // The link-wide stream: A's packets come after B's latest, so each is a gap of 0.
    assert_eq!(r["ipd"]["backwards"], 10);
    assert_eq!(r["ipd"]["percentiles"]["max_ns"], 1_000_447);
    std::fs::remove_dir_all(&dir).unwrap();
}

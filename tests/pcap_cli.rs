//! `ibjitter pcap` on synthetic captures built here, byte by byte: RoCEv2 over IPv4 and IPv6
//! (pcap µs, pcapng ns, VLAN), ibdump's ERF InfiniBand records, a truncated tail, unsupported
//! link types, JSON / CSV / SVG outputs. (Bounded memory: `pcap_memory.rs`.)
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WRITE_FIRST: u8 = 0x06;
const WRITE_MIDDLE: u8 = 0x07;
const WRITE_LAST: u8 = 0x08;
const WRITE_ONLY: u8 = 0x0a;
const ACK: u8 = 0x11;
const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ibjitter-pcap-{}-{name}", std::process::id()));
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// BTH + extended headers + payload + ICRC: what follows UDP (or the LRH/GRH).
fn transport(opcode: u8, qp: u32, psn: u32, ext: &[u8], payload: usize) -> Vec<u8> {
    let mut t = vec![opcode, 0, 0xff, 0xff, 0];
    t.extend_from_slice(&qp.to_be_bytes()[1..]);
    t.push(0x80); // ack request
    t.extend_from_slice(&psn.to_be_bytes()[1..]);
    t.extend_from_slice(ext);
    t.resize(t.len() + payload + 4, 0xab);
    t
}

fn reth() -> Vec<u8> {
    vec![0; 16]
}

fn aeth(syndrome: u8) -> Vec<u8> {
    vec![syndrome, 0, 0, 1]
}

fn udp(t: &[u8]) -> Vec<u8> {
    let mut u = vec![0xc0, 0x00];
    u.extend_from_slice(&4791u16.to_be_bytes());
    u.extend_from_slice(&((t.len() + 8) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(t);
    u
}

fn ether(ethertype: u16, vlan: bool, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    if vlan {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn roce_v4(src: [u8; 4], dst: [u8; 4], t: &[u8]) -> Vec<u8> {
    let u = udp(t);
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((u.len() + 20) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&u);
    ether(0x0800, false, &ip)
}

fn roce_v6(src: u16, dst: u16, t: &[u8]) -> Vec<u8> {
    let u = udp(t);
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(u.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[17, 64]);
    for host in [src, dst] {
        ip.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ip.extend_from_slice(&host.to_be_bytes());
    }
    ip.extend_from_slice(&u);
    ether(0x86dd, true, &ip)
}

/// Legacy pcap, microsecond (`ns` false) or nanosecond timestamps; (ts_ns, frame).
fn pcap(linktype: u32, ns: bool, frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let magic: u32 = if ns { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
    let mut out = magic.to_le_bytes().to_vec();
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&linktype.to_le_bytes());
    for (ts, f) in frames {
        let frac = if ns {
            ts % 1_000_000_000
        } else {
            ts % 1_000_000_000 / 1000
        };
        out.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
        out.extend_from_slice(&(frac as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let len = (12 + body.len()) as u32;
    let mut b = kind.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(body);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

/// pcapng with one Ethernet interface stamped in ns (if_tsresol = 9).
fn pcapng(frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    let mut out = block(0x0a0d_0d0a, &shb);
    let mut idb = vec![1, 0, 0, 0];
    idb.extend_from_slice(&0u32.to_le_bytes());
    idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]); // if_tsresol 9, end
    out.extend(block(1, &idb));
    for (ts, f) in frames {
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(*ts as u32).to_le_bytes());
        epb.extend_from_slice(&(f.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(f.len() as u32).to_le_bytes());
        epb.extend_from_slice(f);
        epb.resize(epb.len().div_ceil(4) * 4, 0);
        out.extend(block(6, &epb));
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Two WRITE flows A→B (QPs 0x11, 0x12) of 3-packet 2 KiB messages at a 2 µs link gap,
/// alternating, each acknowledged per message B→A.
fn two_write_flows(messages: u32) -> Vec<(u64, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut t = 1_700_000_000_000_000_000u64;
    for m in 0..messages {
        for qp in [0x11u32, 0x12] {
            let psn = m * 3;
            for (k, op) in [WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST]
                .into_iter()
                .enumerate()
            {
                let ext = if op == WRITE_FIRST { reth() } else { vec![] };
                let payload = if op == WRITE_LAST { 48 } else { 1000 };
                frames.push((
                    t,
                    roce_v4(A, B, &transport(op, qp, psn + k as u32, &ext, payload)),
                ));
                t += 2000;
            }
            frames.push((
                t,
                roce_v4(B, A, &transport(ACK, qp + 0x100, psn + 2, &aeth(0x1f), 0)),
            ));
            t += 2000;
        }
    }
    frames
}

#[test]
fn rocev2_ipv4_flows_bytes_opcodes_ipd_json_and_timeseries() {
    let dir = scratch("v4");
    let file = write(&dir, "w.pcap", &pcap(1, false, &two_write_flows(100)));
    let (js, csv) = (dir.join("r.json"), dir.join("ts.csv"));
    let o = ibjitter(&[
        "pcap",
        &file,
        "--flows",
        "--ipd",
        "--json",
        js.to_str().unwrap(),
        "--timeseries",
        csv.to_str().unwrap(),
        "--interval",
        "100us",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("800 frames, 800 RoCE/IB transport packets"),
        "{out}"
    );
    assert!(
        out.contains("flows: 4 (2 carrying data); payload 409600 bytes"),
        "{out}"
    );
    // The talk's table: the link gap is 2 µs, each flow's request gap 2 µs within a message.
    assert!(out.contains("2-3          799     100.00%"), "{out}");

    let r = json(&js);
    assert_eq!(r["format"], "pcap");
    let flows = r["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 4);
    let f0 = &flows[0];
    assert_eq!(
        (f0["src"].as_str(), f0["dst"].as_str()),
        (Some("10.0.0.1"), Some("10.0.0.2"))
    );
    assert_eq!(f0["dest_qp"], 0x11);
    assert_eq!(f0["packets"], 300);
    assert_eq!(f0["payload_bytes"], 100 * 2048);
    // 14 Ethernet + 20 IPv4 + 8 UDP + 12 BTH + 4 ICRC per packet, plus RETH on the first.
    assert_eq!(f0["wire_bytes"], 100 * (2048 + 3 * 58 + 16));
    assert_eq!(f0["opcodes"]["RC RDMA WRITE First"], 100);
    assert_eq!(f0["opcodes"]["RC RDMA WRITE Last"], 100);
    assert_eq!(
        (f0["retransmissions"].as_u64(), f0["out_of_order"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(f0["ack_requests"], 300);
    assert_eq!(f0["first_s"], 0.0);
    let ack = &flows[1];
    assert_eq!(
        (ack["data"].as_bool(), ack["responses"].as_u64()),
        (Some(false), Some(100))
    );
    assert_eq!(ack["opcodes"]["RC Acknowledge"], 100);
    // Request gaps within a flow: 2 µs inside a message, 12 µs between messages.
    let p = &f0["ipd_requests"]["percentiles"];
    assert_eq!(f0["ipd_requests"]["gaps"], 299);
    assert!(
        (p["p50_ns"].as_u64().unwrap() as i64 - 2000).abs() <= 2,
        "{p}"
    );
    assert!(
        (p["max_ns"].as_u64().unwrap() as i64 - 12000).abs() <= 12,
        "{p}"
    );
    assert_eq!(r["ipd"]["gaps"], 799);

    // The time series: the generator's CSV shape, data flows only, bytes adding up.
    let csv = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("time_s,flow,bytes,gbps"));
    let mut per_flow = std::collections::BTreeMap::new();
    for l in lines {
        let c: Vec<&str> = l.split(',').collect();
        *per_flow.entry(c[1].to_string()).or_insert(0u64) += c[2].parse::<u64>().unwrap();
    }
    assert_eq!(per_flow.len(), 2, "{csv}");
    assert!(per_flow.values().all(|&b| b == 100 * 2048), "{per_flow:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A reader of stdout that stops early (`| head -1`) costs neither the files asked for nor
/// the exit status: stdout was written first, its EPIPE ended the run with exit 2 ("stdout:
/// Broken pipe", documented as "cannot be read") and the JSON was never written.
#[test]
fn a_closed_stdout_keeps_the_files_and_the_exit_status() {
    let dir = scratch("epipe");
    let file = write(&dir, "w.pcap", &pcap(1, false, &two_write_flows(100)));
    let js = dir.join("r.json");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(["pcap", &file, "--flows", "--ipd", "--json"])
        .arg(&js)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads its stdout: the first write fails with EPIPE.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {err}", o.status);
    assert_eq!(json(&js)["flows"].as_array().unwrap().len(), 4, "{err}");
}

#[test]
fn pcapng_ipv6_vlan_retransmission_gap_and_nak() {
    let dir = scratch("v6");
    let t0 = 1_000_000_000_123u64; // ns resolution must survive
    let psns = [7u32, 8, 9, 8, 9, 12];
    let mut frames: Vec<(u64, Vec<u8>)> = psns
        .iter()
        .enumerate()
        .map(|(k, &psn)| {
            (
                t0 + k as u64 * 1500,
                roce_v6(1, 2, &transport(WRITE_ONLY, 0x42, psn, &reth(), 64)),
            )
        })
        .collect();
    frames.push((
        t0 + 20_000,
        roce_v6(2, 1, &transport(ACK, 0x43, 9, &aeth(0x60), 0)),
    ));
    frames.push((
        t0 + 21_000,
        roce_v6(2, 1, &transport(ACK, 0x43, 9, &aeth(0x20), 0)),
    ));
    let file = write(&dir, "v6.pcapng", &pcapng(&frames));
    let js = dir.join("r.json");
    let o = ibjitter(&["pcap", &file, "--flows", "--json", js.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let r = json(&js);
    assert_eq!(r["format"], "pcapng");
    let f = &r["flows"][0];
    assert_eq!(
        (f["src"].as_str(), f["dst"].as_str()),
        (Some("fe80::1"), Some("fe80::2"))
    );
    assert_eq!(
        (f["retransmissions"].as_u64(), f["out_of_order"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (
            f["payload_bytes"].as_u64(),
            f["retransmitted_bytes"].as_u64()
        ),
        (Some(384), Some(128))
    );
    assert_eq!(f["ipd_requests"]["percentiles"]["min_ns"], 1500);
    let acks = &r["flows"][1];
    assert_eq!(
        (acks["naks"].as_u64(), acks["rnr_naks"].as_u64()),
        (Some(1), Some(1))
    );
    assert!((r["start_epoch_s"].as_f64().unwrap() - 1000.000000123).abs() < 1e-9);
    assert!((r["duration_s"].as_f64().unwrap() - 21e-6).abs() < 1e-12);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What ibdump writes for an InfiniBand port: link type ERF, each record an ERF header
/// (type 21) and the IB packet from the LRH through ICRC and VCRC.
fn ibdump_record(slid: u16, dlid: u16, grh: bool, t: &[u8], ts_ns: u64) -> (u64, Vec<u8>) {
    let mut ib = vec![0x00, if grh { 0x03 } else { 0x02 }];
    ib.extend_from_slice(&dlid.to_be_bytes());
    let words = (8 + if grh { 40 } else { 0 } + t.len()) / 4;
    ib.extend_from_slice(&(words as u16).to_be_bytes());
    ib.extend_from_slice(&slid.to_be_bytes());
    if grh {
        ib.extend_from_slice(&[0x60, 0, 0, 0]);
        ib.extend_from_slice(&(t.len() as u16).to_be_bytes());
        ib.extend_from_slice(&[0x1b, 64]);
        for lid in [slid, dlid] {
            ib.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            ib.extend_from_slice(&lid.to_be_bytes());
        }
    }
    ib.extend_from_slice(t);
    ib.extend_from_slice(&[0, 0]); // VCRC
    let mut rec = 0u64.to_le_bytes().to_vec();
    rec.extend_from_slice(&[21, 4]);
    rec.extend_from_slice(&((ib.len() + 16) as u16).to_be_bytes());
    rec.extend_from_slice(&[0, 0]);
    rec.extend_from_slice(&(ib.len() as u16).to_be_bytes());
    rec.extend_from_slice(&ib);
    (ts_ns, rec)
}

#[test]
fn ibdump_erf_infiniband_with_and_without_grh() {
    let dir = scratch("ib");
    let frames = vec![
        ibdump_record(
            3,
            5,
            false,
            &transport(WRITE_ONLY, 0x80, 1, &reth(), 256),
            1_000_000,
        ),
        ibdump_record(
            3,
            5,
            false,
            &transport(WRITE_ONLY, 0x80, 2, &reth(), 256),
            3_000_000,
        ),
        ibdump_record(5, 3, true, &transport(ACK, 0x81, 2, &aeth(0), 0), 4_000_000),
    ];
    let file = write(&dir, "ib.pcap", &pcap(197, false, &frames));
    let js = dir.join("r.json");
    let o = ibjitter(&["pcap", &file, "--json", js.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let r = json(&js);
    let f = &r["flows"][0];
    assert_eq!(
        (f["src"].as_str(), f["dst"].as_str(), f["dest_qp"].as_u64()),
        (Some("lid:3"), Some("lid:5"), Some(0x80))
    );
    assert_eq!(f["payload_bytes"], 512);
    assert_eq!(r["flows"][1]["src"], "fe80::5");
    assert_eq!(r["flows"][1]["opcodes"]["RC Acknowledge"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_last_packet_is_reported_not_fatal() {
    let dir = scratch("trunc");
    let mut bytes = pcap(1, false, &two_write_flows(2));
    bytes.truncate(bytes.len() - 30);
    let file = write(&dir, "cut.pcap", &bytes);
    let js = dir.join("r.json");
    let o = ibjitter(&["pcap", &file, "--json", js.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("truncated: the file ends inside a record"),
        "{out}"
    );
    let r = json(&js);
    assert_eq!(r["frames"], 15);
    assert!(
        r["truncated"].as_str().unwrap().contains("byte offset"),
        "{r}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_a_clear_error_naming_the_file() {
    let dir = scratch("bad");
    let cooked = write(&dir, "any.pcap", &pcap(113, false, &[(0, vec![0; 40])]));
    let o = ibjitter(&["pcap", &cooked]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "{cooked}: link type 113 (Linux cooked) is not Ethernet or InfiniBand"
        )),
        "{err}"
    );
    let junk = write(
        &dir,
        "junk.pcap",
        b"this is not a capture at all, just text\n",
    );
    let o = ibjitter(&["pcap", &junk]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("junk.pcap: not a pcap or pcapng capture"));
    let empty = write(&dir, "empty.pcap", b"");
    let o = ibjitter(&["pcap", &empty]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("empty.pcap: empty file"),
        "{}",
        text(&o)
    );
    let o = ibjitter(&["pcap", &dir.join("missing.pcap").display().to_string()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.pcap: No such file"));
    // Frames that claim RoCE but lie about their lengths are counted, not fatal.
    let mut lying = roce_v4(A, B, &transport(WRITE_ONLY, 1, 1, &reth(), 0));
    lying[14 + 20 + 4] = 0; // UDP length 0x00xx < 8 + BTH
    lying[14 + 20 + 5] = 4;
    let file = write(&dir, "lying.pcap", &pcap(1, false, &[(0, lying)]));
    let o = ibjitter(&["pcap", &file]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("1 undecodable")
            && out.contains("frame 1: inconsistent length in the UDP header"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plots_are_written() {
    let dir = scratch("plot");
    let file = write(&dir, "w.pcap", &pcap(1, true, &two_write_flows(50)));
    let plots = dir.join("plots");
    let o = ibjitter(&[
        "pcap",
        &file,
        "--plot",
        plots.to_str().unwrap(),
        "--interval",
        "50us",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let ipd = std::fs::read_to_string(plots.join("ipd.svg")).unwrap();
    assert!(ipd.contains("<svg") && ipd.contains("2-3"), "{ipd}");
    let tp = std::fs::read_to_string(plots.join("throughput.svg")).unwrap();
    assert!(
        tp.contains("flow 0 qp 0x11") && tp.contains("flow 2 qp 0x12"),
        "{tp}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `ibjitter pcap` with hundreds of thousands of flows stays under 1 GB: a capture of 200,000
//! QPs (three packets each, so every flow keeps gaps) and one of 1,000,000 QPs (one packet
//! each, as an incast's capture; those beyond the default `--max-flows` are added up). Each
//! run's own peak RSS is read with wait4, so the two tests do not see each other's.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ibjitter-pcapm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An Ethernet / IPv4 / UDP 4791 frame: RC RDMA WRITE Only to QP `qp`, PSN `psn`, 8 bytes.
fn write_only(qp: u32, psn: u32) -> Vec<u8> {
    let roce_len = 12 + 16 + 8 + 4;
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((20 + 8 + roce_len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]);
    f.extend_from_slice(&((8 + roce_len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x0a, 0, 0xff, 0xff, 0]);
    f.extend_from_slice(&qp.to_be_bytes()[1..]);
    f.push(0);
    f.extend_from_slice(&psn.to_be_bytes()[1..]);
    f.resize(f.len() + 16 + 8 + 4, 0);
    f
}

/// A µs pcap: `rounds` packets to each of `qps` QPs, round after round, 1 µs apart.
fn many_qps(path: &Path, qps: u32, rounds: u32) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    w.write_all(&0xa1b2_c3d4u32.to_le_bytes()).unwrap();
    w.write_all(&[
        2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
    ])
    .unwrap();
    let mut k = 0u64;
    for round in 0..rounds {
        for qp in 0..qps {
            let f = write_only(qp + 1, round);
            let fields = [
                (k / 1_000_000) as u32,
                (k % 1_000_000) as u32,
                f.len() as u32,
                f.len() as u32,
            ];
            for field in fields {
                w.write_all(&field.to_le_bytes()).unwrap();
            }
            w.write_all(&f).unwrap();
            k += 1;
        }
    }
}

/// Runs `ibjitter pcap FILE ARGS` and returns (its stdout + stderr, its peak RSS in MB).
#[allow(clippy::zombie_processes)] // reaped by wait4, which Child::wait does not offer
fn pcap_peak_rss(dir: &Path, file: &Path, args: &[&str]) -> (String, f64) {
    let out = dir.join("out.txt");
    let child = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .arg("pcap")
        .arg(file)
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    let mut status = 0;
    // SAFETY: wait4 fills the status and the rusage we pass, for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut ru) }, pid);
    let text = format!("{}{err}", std::fs::read_to_string(&out).unwrap());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}\n{text}"
    );
    (text, ru.ru_maxrss as f64 / 1024.0)
}

#[test]
fn two_hundred_thousand_flows_with_gaps_stay_under_1_gb() {
    let dir = scratch("200k");
    let file = dir.join("200k.pcap");
    many_qps(&file, 200_000, 3);
    // Every flow's row goes through the JSON report too.
    let (text, rss_mb) = pcap_peak_rss(&dir, &file, &["--json", "/dev/null"]);
    println!("200,000 flows x 3 packets: peak RSS {rss_mb:.0} MB");
    assert!(
        text.contains("600000 RoCE/IB transport packets")
            && text.contains("flows: 200000 (200000 carrying data); payload 4800000 bytes"),
        "{text}"
    );
    assert!(!text.contains("other flows"), "{text}");
    assert!(rss_mb < 1000.0, "peak RSS {rss_mb:.0} MB");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_million_flows_stay_under_1_gb_and_those_beyond_max_flows_are_counted() {
    let dir = scratch("1m");
    let file = dir.join("1m.pcap");
    let n = 1_000_000u64;
    many_qps(&file, n as u32, 1);
    // (No JSON here: writing 530,000 rows takes a minute in a debug build.)
    let (text, rss_mb) = pcap_peak_rss(&dir, &file, &[]);
    println!("1,000,000 flows x 1 packet: peak RSS {rss_mb:.0} MB");
    let max = ibjitter::pcap::flows::default_max_flows(&ibjitter::pcap::Options::default());
    assert!(max < n as usize, "the default must add some up here: {max}");
    let rows = max + 1;
    assert!(
        text.contains(&format!(
            "flows: {rows} ({rows} carrying data, the last adding up {} flows beyond --max-flows {max}); payload 8000000 bytes",
            n - max as u64
        )),
        "{text}"
    );
    assert!(rss_mb < 1000.0, "peak RSS {rss_mb:.0} MB");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `ibjitter pcap` streams: a capture far larger than the reader's buffer is analysed in a few
//! MB. Alone in its test binary because the peak RSS is read with getrusage(RUSAGE_CHILDREN),
//! which also counts the parent's memory at the child's exec (Rust spawns with vfork): other
//! tests' allocations in the same process would inflate it.
use std::io::Write;
use std::process::Command;

/// An Ethernet / IPv4 / UDP 4791 frame carrying RC RDMA WRITE Middle, 1 KiB payload, `psn`.
fn write_middle(psn: u32) -> Vec<u8> {
    let roce_len = 12 + 1024 + 4;
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((20 + 8 + roce_len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7]);
    f.extend_from_slice(&((8 + roce_len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x07, 0, 0xff, 0xff, 0, 0, 0, 9, 0]);
    f.extend_from_slice(&psn.to_be_bytes()[1..]);
    f.resize(f.len() + 1024 + 4, 0xab);
    f
}

#[test]
fn a_large_capture_is_streamed_in_bounded_memory() {
    let dir = std::env::temp_dir().join(format!("ibjitter-pcap-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.pcap");
    let n = 180_000u32;
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        w.write_all(&0xa1b2_c3d4u32.to_le_bytes()).unwrap();
        w.write_all(&[
            2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0,
        ])
        .unwrap();
        for k in 0..n {
            let f = write_middle(k);
            for field in [k / 1000, k % 1000 * 1000, f.len() as u32, f.len() as u32] {
                w.write_all(&field.to_le_bytes()).unwrap();
            }
            w.write_all(&f).unwrap();
        }
    }
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 180_000_000, "{size}");
    let o = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(["pcap", path.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("180000 RoCE/IB transport packets") && out.contains("payload 184320000 bytes"),
        "{out}"
    );
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) },
        0
    );
    let max_rss_mb = ru.ru_maxrss as f64 / 1024.0;
    assert!(
        max_rss_mb < 32.0,
        "peak RSS {max_rss_mb:.1} MB for a {} MB file",
        size >> 20
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

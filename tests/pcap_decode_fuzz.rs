//! A host-side stand-in for the cargo-fuzz target (fuzz/fuzz_targets/pcap_decode.rs), which
//! needs nightly: valid RoCE / InfiniBand frames and capture files, mutated from a fixed-seed
//! PRNG, thrown at the decoder and the streaming reader. No input may panic; decoded fields
//! stay in range; every frame read is accounted for exactly once.
use ibjitter::pcap::decode::{decode, Link};
use ibjitter::pcap::{reader, Analyzer, Options};
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64;

fn roce_v4(opcode: u8, ext: usize, payload: usize) -> Vec<u8> {
    let roce = 12 + ext + payload + 4;
    let mut f = vec![
        2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x81, 0, 0, 5, 0x08, 0x00, 0x45, 0,
    ];
    f.extend_from_slice(&((20 + 8 + roce) as u16).to_be_bytes());
    f.extend_from_slice(&[
        0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0xc0, 0, 0x12, 0xb7,
    ]);
    f.extend_from_slice(&((8 + roce) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, opcode, 0x30, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 7]);
    f.resize(f.len() + ext + payload + 4, 0x5a);
    f
}

fn ib_grh(opcode: u8, ext: usize) -> Vec<u8> {
    let t = 12 + ext + 4;
    let mut f = vec![0, 3, 0, 5];
    f.extend_from_slice(&(((8 + 40 + t) / 4) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 3, 0x60, 0, 0, 0]);
    f.extend_from_slice(&(t as u16).to_be_bytes());
    f.extend_from_slice(&[0x1b, 64]);
    f.resize(f.len() + 32, 0xfe);
    f.extend_from_slice(&[opcode, 0, 0xff, 0xff, 0, 0, 0, 0x22, 0, 0, 0, 9]);
    f.resize(f.len() + ext + 4, 0);
    f
}

fn pcap_file(linktype: u8, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![
        0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0,
    ];
    out.extend_from_slice(&[linktype, 0, 0, 0]);
    for (k, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(k as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

fn mutate(rng: &mut Pcg64, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.next_u32() % 6 {
        let at = (rng.next_u64() as usize) % v.len().max(1);
        match rng.next_u32() % 5 {
            0 if !v.is_empty() => v[at] = rng.next_u32() as u8,
            1 => v.truncate(at),
            2 if !v.is_empty() => v[at] ^= 1 << (rng.next_u32() % 8),
            3 if at < v.len() => {
                v.remove(at);
            }
            _ => v.insert(at.min(v.len()), rng.next_u32() as u8),
        }
    }
    v
}

fn check_frame(data: &[u8]) {
    for link in [Link::Ethernet, Link::Infiniband, Link::Erf] {
        if let Ok(Some(p)) = decode(link, data) {
            assert!(p.bth.dest_qp < 1 << 24 && p.bth.psn < 1 << 24, "{p:?}");
            assert!(p.payload.is_none_or(|n| n < 1 << 16), "{p:?}");
        }
    }
}

fn check_file(data: &[u8]) {
    let mut a = Analyzer::new(Options {
        interval_ns: Some(1000),
        ..Options::default()
    });
    if let Ok(summary) = reader::read_frames(data, |f| a.frame(f.ts_ns, f.link, f.data, f.orig_len))
    {
        let t = a.finish().totals;
        assert_eq!(t.frames, summary.frames);
        assert_eq!(t.roce + t.other + t.undecodable, t.frames);
    }
}

#[test]
fn mutated_frames_and_files_never_panic() {
    let frames: Vec<Vec<u8>> = vec![
        roce_v4(0x06, 16, 1024),
        roce_v4(0x0a, 16, 8),
        roce_v4(0x11, 4, 0),
        roce_v4(0x12, 12, 0),
        roce_v4(0x64, 8, 32),
        roce_v4(0xa6, 20, 64),
        roce_v4(0x81, 16, 0),
        ib_grh(0x0d, 4),
        ib_grh(0x13, 28),
    ];
    let mut rng = Pcg64::seed_from_u64(0x1b7e_0004);
    for f in &frames {
        check_frame(f);
        for _ in 0..3000 {
            check_frame(&mutate(&mut rng, f));
        }
    }
    for linktype in [1u8, 197, 247] {
        let file = pcap_file(linktype, &frames);
        check_file(&file);
        for _ in 0..1000 {
            check_file(&mutate(&mut rng, &file));
        }
    }
    for k in 0..3000 {
        let len = (rng.next_u32() % 200) as usize;
        let junk: Vec<u8> = (0..len).map(|_| rng.next_u32() as u8).collect();
        check_frame(&junk);
        if k % 2 == 0 {
            check_file(&junk);
        }
    }
}

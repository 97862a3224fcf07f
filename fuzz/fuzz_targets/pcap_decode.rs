//! Fuzz target: the capture decoder must never panic, whatever the bytes — as one frame of
//! each link type, and as a whole capture file streamed through the reader and the per-flow
//! analysis. Decoded fields must be in range.
#![no_main]

use ibjitter::pcap::decode::{decode, Link};
use ibjitter::pcap::{reader, Analyzer, Options};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for link in [Link::Ethernet, Link::Infiniband, Link::Erf] {
        if let Ok(Some(p)) = decode(link, data) {
            assert!(p.bth.dest_qp < 1 << 24 && p.bth.psn < 1 << 24);
            assert!(p.payload.is_none_or(|n| n < 1 << 16));
        }
    }
    let mut a = Analyzer::new(Options {
        interval_ns: Some(1000),
        ..Options::default()
    });
    if let Ok(summary) = reader::read_frames(data, |f| a.frame(f.ts_ns, f.link, f.data, f.orig_len))
    {
        let r = a.finish();
        assert_eq!(r.totals.frames, summary.frames);
        assert_eq!(
            r.totals.roce + r.totals.other + r.totals.undecodable,
            r.totals.frames
        );
    }
});

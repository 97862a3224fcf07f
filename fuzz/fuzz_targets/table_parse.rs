//! Fuzz target: `ibjitter::table::parse` must never panic, whatever the bytes; what it accepts
//! must be a full, in-range table that writes and reads back identically.
#![no_main]

use ibjitter::table::{parse, Kind, ENTRIES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for kind in [Kind::Absolute, Kind::Netem] {
        match parse(&text, kind, "fuzz") {
            Ok(table) => {
                assert_eq!(table.entries.len(), ENTRIES);
                let (lo, hi) = kind.range();
                assert!(table.entries.iter().all(|&e| e >= lo && e <= hi));
                let written = table.to_text().expect("a parsed table writes");
                let again = parse(&written, kind, "again").expect("a written table parses");
                assert_eq!(again.entries, table.entries);
            }
            Err(e) => assert!(e.line >= 1 && e.col >= 1),
        }
    }
});

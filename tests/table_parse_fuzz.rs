//! A host-side stand-in for the cargo-fuzz target (fuzz/fuzz_targets/table_parse.rs), which
//! needs nightly: many mutated and random inputs from a fixed-seed PRNG thrown at `parse`,
//! asserting no panic and well-formed results (Ok ⇒ 4096 entries in range; Err ⇒ a position).

use ibjitter::table::{parse, Kind, Table, ENTRIES};
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64;

fn valid_table(kind: Kind) -> Vec<u8> {
    let entries = (0..ENTRIES as i64)
        .map(|i| match kind {
            Kind::Absolute => i * 37 + 5000,
            Kind::Netem => i * 16 - 32768,
        })
        .collect();
    Table {
        kind,
        entries,
        comments: vec!["fuzz seed".into()],
    }
    .to_text()
    .unwrap()
    .into_bytes()
}

const TOKENS: &[&[u8]] = &[
    b"99999999999999999999999999",
    b"-9223372036854775809",
    b"9223372036854775807",
    b"-32769",
    b"32768",
    b"-",
    b"+",
    b"+-1",
    b"1e3",
    b"0x10",
    b"#",
    b"\n#c\n",
    b"\r\n",
    b"\t",
    b"\xc3\xa9",
    b"\xff\xfe",
    b"\xe2\x80\x83", // em space (Unicode whitespace)
    b"\0",
];

fn mutate(rng: &mut Pcg64, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    let rounds = 1 + rng.next_u32() % 8;
    for _ in 0..rounds {
        let len = v.len().max(1);
        let at = (rng.next_u64() as usize) % len;
        match rng.next_u32() % 6 {
            0 if !v.is_empty() => v[at] = rng.next_u32() as u8,
            1 => v.truncate(at),
            2 => {
                let t = TOKENS[(rng.next_u32() as usize) % TOKENS.len()];
                let at = at.min(v.len());
                v.splice(at..at, t.iter().copied());
            }
            3 if !v.is_empty() => {
                let end = (at + 1 + (rng.next_u32() as usize % 64)).min(v.len());
                v.drain(at..end);
            }
            4 => {
                // Duplicate a slice: too many values.
                let end = (at + (rng.next_u32() as usize % 200)).min(v.len());
                let dup: Vec<u8> = v[at.min(end)..end].to_vec();
                v.extend(dup);
            }
            _ => {
                let at = at.min(v.len());
                v.insert(at, b"0123456789 -\n"[rng.next_u32() as usize % 13]);
            }
        }
    }
    v
}

fn check(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for kind in [Kind::Absolute, Kind::Netem] {
        match parse(&text, kind, "fuzz") {
            Ok(t) => {
                assert_eq!(t.entries.len(), ENTRIES);
                let (lo, hi) = kind.range();
                assert!(t.entries.iter().all(|&e| e >= lo && e <= hi));
                // Whatever parsed writes and reads back the same.
                let again = parse(&t.to_text().unwrap(), kind, "again").unwrap();
                assert_eq!(again.entries, t.entries);
            }
            Err(e) => {
                assert!(e.line >= 1 && e.col >= 1, "{e}");
                assert!(e.to_string().starts_with("fuzz:"), "{e}");
                assert!(e.message.contains("expected"), "{e}");
            }
        }
    }
}

#[test]
fn mutated_tables_never_panic() {
    let mut rng = Pcg64::seed_from_u64(0x1b_1773);
    let bases = [valid_table(Kind::Absolute), valid_table(Kind::Netem)];
    for i in 0..600 {
        let m = mutate(&mut rng, &bases[i % 2]);
        check(&m);
    }
}

#[test]
fn random_short_inputs_never_panic() {
    let mut rng = Pcg64::seed_from_u64(42);
    for _ in 0..20_000 {
        let len = (rng.next_u32() % 64) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                // Bias toward the characters the parser cares about.
                let r = rng.next_u32();
                if r % 2 == 0 {
                    b"0123456789 -+#\n\r\t"[(r as usize >> 8) % 17]
                } else {
                    (r >> 8) as u8
                }
            })
            .collect();
        check(&bytes);
    }
}

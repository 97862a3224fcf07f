//! Our netem-format tables against the files iproute2 ships, and reading those files.

use ibjitter::table::dist::{iproute2_tables, Dist};
use ibjitter::table::format::iproute2_dist;
use ibjitter::table::generate::make_table;
use ibjitter::table::{parse, read, Kind, ENTRIES};

/// iproute2's copy of a table; tools/setup installs iproute2, so a missing one fails the test
/// (a comparison that quietly did not happen would pass as if it had).
fn installed(name: &str) -> std::path::PathBuf {
    iproute2_dist(name)
        .unwrap_or_else(|| panic!("iproute2's {name}.dist is not installed: run tools/setup"))
}

#[test]
fn ours_match_iproute2_within_one_per_entry() {
    for (name, dist) in iproute2_tables() {
        let ours = make_table(&dist, Kind::Netem).unwrap();
        assert_eq!(ours.entries.len(), ENTRIES);
        let path = installed(name);
        let theirs = read(&path, Kind::Netem).unwrap();
        let (k, max) = ours
            .entries
            .iter()
            .zip(&theirs.entries)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .max_by_key(|&(_, d)| d)
            .unwrap();
        eprintln!("{name}: max |diff| {max} (entry {k})");
        assert!(max <= 1, "{name}: entry {k} differs by {max}");
    }
}

#[test]
fn reads_every_iproute2_table_including_experimental() {
    for name in ["normal", "pareto", "paretonormal", "experimental"] {
        let t = read(&installed(name), Kind::Netem).unwrap();
        assert_eq!(t.entries.len(), ENTRIES);
        assert!(!t.comments.is_empty(), "{name}: header comment kept");
        // netem's tables are normalized: mean near 0 in units of 1/8192 sd.
        let mean = t.entries.iter().sum::<i64>() as f64 / ENTRIES as f64;
        assert!(mean.abs() < 1500.0, "{name}: mean {mean}");
    }
}

#[test]
fn netem_tables_written_by_us_read_back_identically() {
    let t = make_table(
        &Dist::ParetoNormal {
            mu_ns: 0.0,
            sigma_ns: 1.0,
        },
        Kind::Netem,
    )
    .unwrap();
    let text = t.to_text().unwrap();
    assert_eq!(parse(&text, Kind::Netem, "pn").unwrap(), t);
    // And they are valid for tc: every entry fits i16.
    assert!(t.entries.iter().all(|&e| i16::try_from(e).is_ok()));
}

//! The shipped tables in distributions/ regenerate byte for byte from the commands in
//! distributions/README.md, and every shipped table is made by one of those commands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `ibjitter table …` lines of the README's command block, as argument lists.
fn readme_commands() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(root().join("distributions/README.md")).unwrap();
    readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ibjitter "))
        .filter(|l| l.starts_with("table "))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

fn dist_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".dist"))
        .collect()
}

#[test]
fn shipped_tables_regenerate_byte_for_byte() {
    let commands = readme_commands();
    assert!(commands.len() >= 7, "README lists the commands");
    let out = std::env::temp_dir().join(format!("ibjitter-dists-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    for args in &commands {
        // Send the output to the temporary directory instead of distributions/.
        let args: Vec<String> = args
            .iter()
            .map(|a| match a.strip_prefix("distributions") {
                Some(rest) => format!("{}{rest}", out.display()),
                None => a.clone(),
            })
            .collect();
        let status = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "ibjitter {}", args.join(" "));
    }
    let shipped_dir = root().join("distributions");
    let made = dist_files(&out);
    let shipped = dist_files(&shipped_dir);
    assert_eq!(
        made, shipped,
        "README commands make exactly the shipped tables"
    );
    for name in &made {
        let a = std::fs::read(out.join(name)).unwrap();
        let b = std::fs::read(shipped_dir.join(name)).unwrap();
        assert!(a == b, "{name} differs from its regeneration");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn shipped_tables_parse_and_keep_their_family_means() {
    use ibjitter::table::stats::Stats;
    use ibjitter::table::{read, Kind};
    let dir = root().join("distributions");
    for name in ["normal", "pareto", "paretonormal"] {
        read(&dir.join(format!("{name}.dist")), Kind::Netem).unwrap();
    }
    for prefix in [
        "rc-baseline",
        "congestion-light",
        "congestion-moderate",
        "congestion-heavy",
    ] {
        let base = Stats::of_i64(
            &read(&dir.join(format!("{prefix}.dist")), Kind::Absolute)
                .unwrap()
                .entries,
        );
        for suffix in ["-scale75", "-scale50", "-scale25", "-uniform"] {
            let t = read(&dir.join(format!("{prefix}{suffix}.dist")), Kind::Absolute).unwrap();
            let s = Stats::of_i64(&t.entries);
            assert!(
                (s.mean / base.mean - 1.0).abs() < 1e-3,
                "{prefix}{suffix}: mean {} vs base {}",
                s.mean,
                base.mean
            );
        }
    }
    // The baseline's mode is about 6.1 µs: the densest stretch of the sorted table.
    let t = read(&dir.join("rc-baseline.dist"), Kind::Absolute).unwrap();
    let w = 200;
    let (i, _) = t
        .entries
        .windows(w)
        .map(|win| win[w - 1] - win[0])
        .enumerate()
        .min_by_key(|&(_, span)| span)
        .unwrap();
    let mode = t.entries[i + w / 2];
    assert!((5_900..=6_300).contains(&mode), "mode {mode} ns");
}

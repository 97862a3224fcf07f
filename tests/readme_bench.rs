//! The README's quick starts, as a user types them, in the Soft-RoCE bench: every ```sh block
//! that follows a `<!-- quickstart -->` line runs with `bash -e` (every command must exit 0)
//! and prints what the README says it prints.
//!
//! The only changes to the commands are the bench's names for a user's, listed in
//! `placeholders` (each must occur in some block, so the list stays minimal), and the
//! directory they run in (a scratch directory: the VM's root file system is read-only).
mod common;

use common::bench::{mpi_pingpong, release_artifact, repo_root, scratch_dir, Vm};
use std::fs;
use std::path::Path;

const MARK: &str = "<!-- quickstart -->";

/// The quick-start blocks of `readme`, in order.
fn quickstarts(readme: &str) -> Vec<String> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != MARK {
            continue;
        }
        assert_eq!(
            lines.get(i + 1).map(|l| l.trim()),
            Some("```sh"),
            "README.md:{}: {MARK} must be followed by a ```sh block",
            i + 2
        );
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| l.trim() != "```")
            .copied()
            .collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

/// A user's names → the bench's, applied in this order: the binary (not on PATH in the VM),
/// the launcher (Open MPI as root, over UCX on rxe, one device per rank: see shim_bench),
/// the program, the cluster's hosts and its ssh (the bench's emulated hosts and their launcher).
fn placeholders(bin: &Path, app: &Path, root: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("ibjitter ", format!("{} ", bin.display())),
        (
            "mpirun -np 2 ",
            format!(
                "mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ucx --mca btl self \
                 --mca osc ^ucx -x UCX_TLS=rc_verbs,ud_verbs:aux,self \
                 -x UCX_UD_VERBS_ETH_DGID_CHECK=n {}/tools/mpi/rank-device ",
                root.display()
            ),
        ),
        ("./app", app.display().to_string()),
        ("node0:192.168.1.10", "h0:10.0.0.1".into()),
        ("node1,node2,node3", "h1,h2,h3".into()),
        (
            "'ssh {host}'",
            format!("'{}/tools/vm/on-host {{host}}'", root.display()),
        ),
    ]
}

fn substitute(block: &str, table: &[(&'static str, String)], used: &mut [bool]) -> String {
    let mut s = block.to_string();
    for (i, (from, to)) in table.iter().enumerate() {
        if s.contains(from) {
            used[i] = true;
            s = s.replace(from, to);
        }
    }
    s
}

/// The injector's exit lines `ibjitter: delayed N of M sends…`, as (N, M).
fn coverage(output: &str) -> Vec<(u64, u64)> {
    output
        .lines()
        .filter_map(|l| {
            let rest = l.split("ibjitter: delayed ").nth(1)?;
            let mut w = rest.split_whitespace();
            let n = w.next()?.parse().ok()?;
            (w.next()? == "of").then_some(())?;
            let m = w.next()?.parse().ok()?;
            Some((n, m))
        })
        .collect()
}

/// Every rank of the 2-rank job said it delayed every one of its sends, and sent some.
#[track_caller]
fn both_ranks_fully_delayed(output: &str) {
    let lines = coverage(output);
    assert_eq!(lines.len(), 2, "one coverage line per rank:\n{output}");
    for (n, m) in lines {
        assert!(n > 0 && n == m, "delayed {n} of {m} sends:\n{output}");
    }
}

/// Latency samples for `table fit` (a user's measurements): 2000 lognormal draws around
/// 30 µs plus 20 µs, from a fixed LCG, one per line in µs.
fn write_samples(path: &Path) {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut uniform = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut text = String::new();
    for _ in 0..2000 {
        let z = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
        text.push_str(&format!("{:.3}\n", 20.0 + 30.0 * (0.5 * z).exp()));
    }
    fs::write(path, text).unwrap();
}

/// Runs `blocks` (index, substituted text) in one VM, each its own `bash -e` script in `dir`;
/// returns each block's status and output.
fn run_blocks(vm: Vm, dir: &Path, blocks: &[(usize, String)]) -> Vec<(usize, i32, String)> {
    let mut script = format!("cd {}\n", dir.display());
    for (i, text) in blocks {
        let file = dir.join(format!("quickstart-{i}.sh"));
        fs::write(&file, format!("{text}\n")).unwrap();
        script.push_str(&format!(
            "bash -e {f} > {f}.out 2>&1; echo $? > {f}.rc\n",
            f = file.display()
        ));
    }
    vm.writable(dir).run(&script).assert_success();
    blocks
        .iter()
        .map(|(i, _)| {
            let f = dir.join(format!("quickstart-{i}.sh"));
            let rc = fs::read_to_string(f.with_extension("sh.rc"))
                .unwrap_or_else(|e| panic!("quick start {}: no status ({e})", i + 1));
            let out = fs::read_to_string(f.with_extension("sh.out")).unwrap_or_default();
            (*i, rc.trim().parse().unwrap_or(-1), out)
        })
        .collect()
}

#[test]
fn the_readme_quick_starts_run_as_written() {
    let root = repo_root();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = quickstarts(&readme);
    assert_eq!(
        blocks.len(),
        3,
        "the README has three quick starts (exec, incast, table fit); each needs its checks here"
    );
    let bin = release_artifact("ibjitter", "ibjitter");
    release_artifact("ibjitter-shim", "libibjitter.so");
    let app = mpi_pingpong();
    let table = placeholders(&bin, &app, &root);
    let mut used = vec![false; table.len()];
    let subst: Vec<String> = blocks
        .iter()
        .map(|b| substitute(b, &table, &mut used))
        .collect();
    for ((from, _), used) in table.iter().zip(&used) {
        assert!(
            used,
            "placeholder {from:?} occurs in no quick start: drop it"
        );
    }

    let dir = scratch_dir("readme");
    write_samples(&dir.join("latencies.txt"));
    // The incast needs the bench's emulated hosts; the rest two devices.
    let (hosts, pair): (Vec<_>, Vec<_>) = subst
        .into_iter()
        .enumerate()
        .partition(|(_, s)| s.contains("tools/vm/on-host"));
    let mut results = run_blocks(Vm::new().timeout(600), &dir, &pair);
    results.extend(run_blocks(Vm::new().hosts(4).timeout(600), &dir, &hosts));
    results.sort_by_key(|r| r.0);

    for (i, rc, out) in &results {
        assert_eq!(
            *rc,
            0,
            "quick start {} failed:\n{}\n---\n{out}",
            i + 1,
            blocks[*i]
        );
    }
    // 1: exec under mpirun, every send of both ranks delayed.
    both_ranks_fully_delayed(&results[0].2);
    // 2: the incast's summary line as the README quotes it, and its report.
    let incast = &results[1].2;
    assert!(
        incast.contains("incast into h0 (10.0.0.1): 30 flows (10 per sender x 3), started 30,"),
        "{incast}"
    );
    assert!(dir.join("incast-results/incast.json").is_file(), "{incast}");
    // 3: the fit, the table's stats, then the table injected.
    let fit = &results[2].2;
    assert!(
        fit.contains("fit: lognormal, maximum likelihood with location"),
        "{fit}"
    );
    assert!(dir.join("mine.dist").is_file(), "{fit}");
    both_ranks_fully_delayed(fit);
}

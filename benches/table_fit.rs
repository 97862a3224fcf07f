//! Figures for the delay-table generators (issue 3), printed as plain text:
//! - max |difference| per entry between our netem-format normal/pareto/paretonormal tables
//!   and the files iproute2 ships (when installed);
//! - lognormal table mean/sd relative errors against the analytic values;
//! - recovery errors of `fit` on 100k synthetic samples, and the time to fit 1,000,000.
//!
//! Run: `cargo bench --bench table_fit` (release build).

use ibjitter::table::dist::{iproute2_tables, Dist, LogNormal};
use ibjitter::table::fit::{fit_lognormal, ks_distance};
use ibjitter::table::format::iproute2_dist;
use ibjitter::table::generate::make_table;
use ibjitter::table::stats::Stats;
use ibjitter::table::{read, Kind};
use std::time::Instant;

fn netem_vs_iproute2() {
    println!("== netem-format tables vs iproute2's files (max |diff| per entry) ==");
    for (name, dist) in iproute2_tables() {
        let Some(path) = iproute2_dist(name) else {
            println!("{name:>13}: iproute2's {name}.dist not installed, skipped");
            continue;
        };
        let theirs = read(&path, Kind::Netem).expect("iproute2 table parses");
        let ours = make_table(&dist, Kind::Netem).expect("netem table");
        let diffs: Vec<i64> = ours
            .entries
            .iter()
            .zip(&theirs.entries)
            .map(|(a, b)| (a - b).abs())
            .collect();
        let max = diffs.iter().max().unwrap();
        let differing = diffs.iter().filter(|&&d| d != 0).count();
        println!(
            "{name:>13}: max |diff| = {max}, entries differing = {differing}/4096  ({})",
            path.display()
        );
    }
}

fn lognormal_tables() {
    println!("== lognormal absolute tables: table vs analytic mean and sd ==");
    for shape in [0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5] {
        let l = LogNormal::new(shape, 10_000.0, 2_000.0).unwrap();
        let t = make_table(&Dist::LogNormal(l), Kind::Absolute).unwrap();
        let s = Stats::of_i64(&t.entries);
        println!(
            "shape {shape:>4}: mean err {:+.4}%  sd err {:+.4}%",
            (s.mean / l.mean() - 1.0) * 100.0,
            (s.sd / l.sd() - 1.0) * 100.0
        );
    }
}

fn fit_figures() {
    println!("== fit: recovery on 100k synthetic samples ==");
    for (shape, scale, loc) in [
        (0.5, 1_500.0, 5_000.0),
        (0.8, 5_000.0, 5_000.0),
        (1.2, 80_000.0, 5_000.0),
        (1.5, 10_000.0, 5_000.0),
    ] {
        let truth = LogNormal::new(shape, scale, loc).unwrap();
        let xs = truth.samples(100_000, 42);
        let f = fit_lognormal(&xs).unwrap();
        let l = f.lognormal;
        println!(
            "truth s={shape} scale={scale} loc={loc}: errors shape {:+.3}% scale {:+.3}% loc {:+.3}%  (KS {:.4}, {} passes)",
            (l.shape / shape - 1.0) * 100.0,
            (l.scale_ns / scale - 1.0) * 100.0,
            (l.loc_ns / loc - 1.0) * 100.0,
            ks_distance(&xs, &l),
            f.evaluations
        );
    }
    println!("== fit: time for 1,000,000 samples (release) ==");
    let truth = LogNormal::new(0.6, 2_000.0, 5_000.0).unwrap();
    let xs = truth.samples(1_000_000, 1);
    let mut times = Vec::new();
    let mut ks_times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let f = fit_lognormal(&xs).unwrap();
        times.push(t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        let d = ks_distance(&xs, &f.lognormal);
        ks_times.push(t1.elapsed().as_secs_f64());
        assert!(d < 0.01);
    }
    times.sort_by(f64::total_cmp);
    ks_times.sort_by(f64::total_cmp);
    println!(
        "fit 1M samples: median {:.1} ms (min {:.1}, max {:.1}) over 5 runs; KS distance: median {:.1} ms",
        times[2] * 1e3,
        times[0] * 1e3,
        times[4] * 1e3,
        ks_times[2] * 1e3
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too, quickly enough.
    netem_vs_iproute2();
    lognormal_tables();
    fit_figures();
}

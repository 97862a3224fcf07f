//! Absolute tables: lognormal tables reproduce the analytic mean and sd; stratified quantile
//! tables of other distributions behave as their definitions say.

use ibjitter::table::dist::{Dist, LogNormal};
use ibjitter::table::generate::make_table;
use ibjitter::table::stats::Stats;
use ibjitter::table::{Kind, ENTRIES};

fn stats(d: &Dist) -> Stats {
    Stats::of_i64(&make_table(d, Kind::Absolute).unwrap().entries)
}

#[test]
fn lognormal_mean_within_half_percent_up_to_shape_1_5() {
    for shape in [0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5] {
        let l = LogNormal::new(shape, 10_000.0, 2_000.0).unwrap();
        let s = stats(&Dist::LogNormal(l));
        let err = (s.mean / l.mean() - 1.0).abs();
        assert!(err < 0.005, "shape {shape}: mean error {:.3}%", err * 100.0);
    }
}

#[test]
fn lognormal_sd_within_two_percent_up_to_shape_1() {
    // The midpoint quantiles (k+0.5)/4096 leave out the tail beyond the last midpoint, which
    // for heavy shapes carries much of the variance: measured sd errors are -1.4% at shape 1,
    // -3.8% at 1.25 and -8.9% at 1.5 (see benches/table_fit.rs). 2% holds up to shape 1.
    for shape in [0.1, 0.25, 0.5, 0.75, 1.0] {
        let l = LogNormal::new(shape, 10_000.0, 2_000.0).unwrap();
        let s = stats(&Dist::LogNormal(l));
        let err = (s.sd / l.sd() - 1.0).abs();
        assert!(err < 0.02, "shape {shape}: sd error {:.3}%", err * 100.0);
    }
    // And the shortfall only grows with the shape (the table never overstates the sd).
    let err = |shape: f64| {
        let l = LogNormal::new(shape, 10_000.0, 0.0).unwrap();
        stats(&Dist::LogNormal(l)).sd / l.sd() - 1.0
    };
    assert!(err(1.5) < err(1.25) && err(1.25) < err(1.0) && err(1.0) < 0.0);
}

#[test]
fn lognormal_from_mean_and_sd() {
    let l = LogNormal::from_mean_sd(40_000.0, 30_000.0, 5_000.0).unwrap();
    let s = stats(&Dist::LogNormal(l));
    assert!((s.mean / 40_000.0 - 1.0).abs() < 0.005);
    assert!((s.sd / 30_000.0 - 1.0).abs() < 0.02);
    assert!(s.min > 5_000.0);
}

#[test]
fn table_median_is_the_distribution_median() {
    let l = LogNormal::new(0.8, 7_000.0, 1_000.0).unwrap();
    let s = stats(&Dist::LogNormal(l));
    let median = l.quantile(0.5);
    assert!(
        (s.p50 - median).abs() <= 0.02 * median,
        "{} vs {median}",
        s.p50
    );
}

#[test]
fn exponential_and_netem_shapes() {
    let s = stats(&Dist::Exponential {
        mean_ns: 20_000.0,
        loc_ns: 1_000.0,
    });
    assert!((s.mean / 21_000.0 - 1.0).abs() < 0.005);
    assert!((s.sd / 20_000.0 - 1.0).abs() < 0.02);
    // netem's pareto with mu/sigma: mean mu, sd sigma * 2/sqrt(3) (heavy tail: looser).
    let s = stats(&Dist::Pareto {
        mu_ns: 100_000.0,
        sigma_ns: 10_000.0,
    });
    assert!((s.mean / 100_000.0 - 1.0).abs() < 0.005);
    assert!(s.sd < 10_000.0 * 2.0 / 3f64.sqrt());
    let s = stats(&Dist::Normal {
        mu_ns: 50_000.0,
        sigma_ns: 5_000.0,
    });
    assert!((s.mean - 50_000.0).abs() < 1.0);
    assert!((s.sd / 5_000.0 - 1.0).abs() < 0.01);
}

#[test]
fn empirical_of_4096_samples_is_the_samples() {
    let samples: Vec<f64> = (0..ENTRIES).rev().map(|i| (i * 3 + 100) as f64).collect();
    let t = make_table(
        &Dist::empirical(samples.clone(), "t").unwrap(),
        Kind::Absolute,
    )
    .unwrap();
    let mut sorted: Vec<i64> = samples.iter().map(|&v| v as i64).collect();
    sorted.sort();
    assert_eq!(t.entries, sorted);
}

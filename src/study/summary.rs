//! What a study found, computed from its rows alone (so a finished, interrupted or resumed
//! study summarizes the same way): per configuration the runs' mean, sd, median, 95 % CI
//! and slowdown against the clean runs; over the clean and table runs, Pearson's r of the
//! metric against the injected mean and against the injected sd, and Fisher's z test of the
//! two, with a verdict in words; for a tolerance study, its fitted lines and crossings too.
use super::plan::Plan;
use super::record::Row;
use super::stats::{ci95_half, fisher_z, mean, median, pearson, pearson_p, ratio_ci95, sd, ALPHA};
use super::stopping::Ending;
use super::tolerance::ToleranceSummary;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    pub name: String,
    pub kind: String,
    /// Injected delay's mean and sd (the table's), µs; 0 for clean and congested runs.
    pub table_mean_us: f64,
    pub table_sd_us: f64,
    /// Runs that count (warm-up and failed runs excluded).
    pub runs: usize,
    pub failed: usize,
    pub mean: f64,
    pub sd: f64,
    pub median: f64,
    /// Half-width of the 95 % CI of the mean (Student's t).
    pub ci95: f64,
    /// Mean over the clean runs' mean (inverted for `--higher-is-better`): how much worse.
    /// For a congestor, GPCNeT's congestion impact factor.
    pub slowdown: f64,
    pub slowdown_ci95: [f64; 2],
    /// The same for `--tail-metric` (e.g. the program's p99 latency), where given.
    pub tail_mean: f64,
    pub tail_slowdown: f64,
    pub tail_slowdown_ci95: [f64; 2],
    /// Mean delay the injector actually drew over these runs, µs.
    pub injected_mean_us: f64,
    pub delayed_per_run: f64,
}

/// Over the clean and table runs of a study of given tables: the metric's correlation with
/// the injected mean and with the injected sd, and which is the stronger. Not for a tolerance
/// sweep, whose delays are chosen (constant delays of several means, sds at one mean): there
/// the two r's would describe the sweep's design, not the program.
#[derive(Debug, Clone, Serialize)]
pub struct Correlation {
    /// Pairs (clean and table runs) the correlations are over.
    pub correlation_runs: usize,
    /// Pearson r of the metric vs the injected mean, and its two-sided p-value.
    pub r_mean: f64,
    pub p_r_mean: f64,
    /// Pearson r of the metric vs the injected sd, and its two-sided p-value.
    pub r_sd: f64,
    pub p_r_sd: f64,
    /// Fisher's z of r_sd vs r_mean and its two-sided p-value.
    pub fisher_z: f64,
    pub p_value: f64,
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub command: String,
    pub metric: String,
    pub higher_is_better: bool,
    pub configurations: Vec<ConfigSummary>,
    /// The correlations and the verdict (absent for a tolerance sweep).
    #[serde(flatten)]
    pub correlation: Option<Correlation>,
    pub runs_total: usize,
    pub runs_failed: usize,
    pub warmup_runs: usize,
    /// How the study ended: `complete`, `cap_reached` (`--until-ci`'s cap, exit 1) or
    /// `interrupted` (exit 130).
    pub ending: Ending,
    /// Whether the stopping rule was met: `ending` is `complete`.
    pub complete: bool,
    /// The configurations whose interval `--until-ci` left wider than asked at its cap.
    pub capped: Vec<String>,
    pub warnings: Vec<String>,
    /// A tolerance study's fitted lines and crossings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<ToleranceSummary>,
}

/// The metric oriented so that larger is worse (the correlations' sign then reads alike for
/// runtimes and for rates).
fn badness(plan: &Plan, v: f64) -> f64 {
    if plan.higher_is_better {
        -v
    } else {
        v
    }
}

/// The summary of `rows`, which ended as `ending` with `capped` left wide by the cap.
pub fn summarize(plan: &Plan, rows: &[Row], ending: Ending, capped: Vec<String>) -> Summary {
    let counted = |r: &&Row| r.counts();
    let clean: Vec<f64> = rows
        .iter()
        .filter(counted)
        .filter(|r| r.kind == "clean")
        .map(|r| r.metric)
        .collect();
    let clean_tail: Vec<f64> = rows
        .iter()
        .filter(counted)
        .filter(|r| r.kind == "clean" && r.tail_metric.is_finite())
        .map(|r| r.tail_metric)
        .collect();
    let slow = |xs: &[f64], base: &[f64]| -> (f64, [f64; 2]) {
        if xs.is_empty() || base.is_empty() {
            return (f64::NAN, [f64::NAN; 2]);
        }
        let (r, lo, hi) = if plan.higher_is_better {
            ratio_ci95(base, xs)
        } else {
            ratio_ci95(xs, base)
        };
        (r, [lo, hi])
    };
    let mut configurations = Vec::new();
    let mut warnings = Vec::new();
    for c in &plan.configurations {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| !r.warmup && r.config == c.name)
            .collect();
        let good: Vec<f64> = mine.iter().filter(|r| r.ok).map(|r| r.metric).collect();
        let tail: Vec<f64> = mine
            .iter()
            .filter(|r| r.ok && r.tail_metric.is_finite())
            .map(|r| r.tail_metric)
            .collect();
        let (slowdown, slowdown_ci95) = slow(&good, &clean);
        let (tail_slowdown, tail_slowdown_ci95) = slow(&tail, &clean_tail);
        let (mean_us, sd_us) = c.perturbation.injected_us();
        let drawn: Vec<f64> = mine
            .iter()
            .filter(|r| r.ok && r.injected_mean_us.is_finite())
            .map(|r| r.injected_mean_us)
            .collect();
        let failed = mine.iter().filter(|r| !r.ok).count();
        if failed > 0 {
            warnings.push(format!(
                "{}: {failed} of {} runs did not count ({})",
                c.name,
                mine.len(),
                mine.iter()
                    .find(|r| !r.ok)
                    .map(|r| r.note.clone())
                    .unwrap_or_default()
            ));
        }
        configurations.push(ConfigSummary {
            name: c.name.clone(),
            kind: c.perturbation.kind().to_string(),
            table_mean_us: mean_us,
            table_sd_us: sd_us,
            runs: good.len(),
            failed,
            mean: mean(&good),
            sd: sd(&good),
            median: median(&good),
            ci95: ci95_half(&good),
            slowdown,
            slowdown_ci95,
            tail_mean: mean(&tail),
            tail_slowdown,
            tail_slowdown_ci95,
            injected_mean_us: mean(&drawn),
            delayed_per_run: mean(
                &mine
                    .iter()
                    .filter(|r| r.ok)
                    .map(|r| r.delayed as f64)
                    .collect::<Vec<_>>(),
            ),
        });
    }

    let tolerance = super::tolerance::summarize(plan, rows, ending != Ending::Interrupted);
    if let Some(t) = &tolerance {
        warnings.extend(t.warnings());
    }
    Summary {
        command: plan.command.join(" "),
        metric: plan
            .metric
            .clone()
            .unwrap_or_else(|| "wall time (s)".into()),
        higher_is_better: plan.higher_is_better,
        configurations,
        correlation: plan.tolerance.is_none().then(|| correlation(plan, rows)),
        runs_total: rows.len(),
        runs_failed: rows.iter().filter(|r| !r.ok).count(),
        warmup_runs: rows.iter().filter(|r| r.warmup).count(),
        ending,
        complete: ending == Ending::Complete,
        capped,
        warnings,
        tolerance,
    }
}

/// The correlations of the metric with the injected mean and sd, and the verdict.
fn correlation(plan: &Plan, rows: &[Row]) -> Correlation {
    let pairs: Vec<&Row> = rows
        .iter()
        .filter(|r| r.counts())
        .filter(|r| r.kind == "clean" || r.kind == "table")
        .collect();
    let y: Vec<f64> = pairs.iter().map(|r| badness(plan, r.metric)).collect();
    let xm: Vec<f64> = pairs.iter().map(|r| r.table_mean_us).collect();
    let xs: Vec<f64> = pairs.iter().map(|r| r.table_sd_us).collect();
    let n = pairs.len();
    let (r_mean, r_sd) = (pearson(&xm, &y), pearson(&xs, &y));
    let (fz, p) = fisher_z(r_sd, r_mean, n);
    let (p_r_mean, p_r_sd) = (pearson_p(r_mean, n), pearson_p(r_sd, n));
    Correlation {
        correlation_runs: n,
        r_mean,
        p_r_mean,
        r_sd,
        p_r_sd,
        fisher_z: fz,
        p_value: p,
        verdict: verdict(r_mean, p_r_mean, r_sd, p_r_sd, p, n, plan),
    }
}

/// The finding in one sentence, from the two correlations and Fisher's z test.
fn verdict(
    r_mean: f64,
    p_mean: f64,
    r_sd: f64,
    p_sd: f64,
    p: f64,
    n: usize,
    plan: &Plan,
) -> String {
    let tables = plan
        .configurations
        .iter()
        .filter(|c| c.perturbation.kind() == "table")
        .count();
    if tables == 0 {
        return "no delay tables in this study: no correlation to test (see the slowdowns)".into();
    }
    if n < 4 || !r_mean.is_finite() || !r_sd.is_finite() {
        return format!(
            "not enough varied runs to correlate ({n} usable runs; the injected means or sds do not vary)"
        );
    }
    let sig = |pv: f64| pv < ALPHA;
    if !sig(p_mean) && !sig(p_sd) {
        return format!(
            "not sensitive at α = {ALPHA}: neither the injected mean (r = {r_mean:.2}, p = {p_mean:.2}) \
             nor the injected sd (r = {r_sd:.2}, p = {p_sd:.2}) correlates with the metric"
        );
    }
    if sig(p) && r_sd > r_mean {
        format!(
            "more sensitive to latency variation than to mean latency: r_sd = {r_sd:.2} > r_mean = \
             {r_mean:.2}, significant by Fisher's z (p = {p:.3} < {ALPHA})"
        )
    } else if sig(p) {
        format!(
            "more sensitive to mean latency than to its variation: r_mean = {r_mean:.2} > r_sd = \
             {r_sd:.2}, significant by Fisher's z (p = {p:.3} < {ALPHA})"
        )
    } else {
        format!(
            "sensitive to latency, but mean and variation cannot be told apart: r_sd = {r_sd:.2}, \
             r_mean = {r_mean:.2}, Fisher's z p = {p:.2} ≥ {ALPHA}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::plan::{Configuration, Perturbation, Stopping};

    fn row(run: usize, config: &str, kind: &str, mean: f64, sd: f64, metric: f64) -> Row {
        Row {
            table_mean_us: mean,
            table_sd_us: sd,
            delayed: if kind == "table" { 10 } else { 0 },
            ..Row::counted(run, config, kind, metric)
        }
    }

    #[test]
    fn runtime_that_follows_the_sd_gets_that_verdict() {
        let cfg = |name: &str, mean_ns: f64, sd_ns: f64| Configuration {
            name: name.into(),
            perturbation: if mean_ns == 0.0 {
                Perturbation::Clean
            } else {
                Perturbation::Table {
                    path: "x".into(),
                    mean_ns,
                    sd_ns,
                }
            },
        };
        let plan = Plan {
            command: vec!["app".into()],
            configurations: vec![
                cfg("clean", 0.0, 0.0),
                cfg("u", 50e3, 29e3),
                cfg("s25", 50e3, 10e3),
                cfg("s100", 50e3, 200e3),
                cfg("m2", 100e3, 20e3),
            ],
            seed: 1,
            warmup: 0,
            stopping: Stopping::Reps(6),
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: None,
        };
        // Runtime = 10 + sd/10 (µs), a little noise; the mean does not matter past clean.
        let mut rows = Vec::new();
        for rep in 0..6 {
            for c in &plan.configurations {
                let (m, s) = c.perturbation.injected_us();
                let noise = [0.0, 0.3, -0.2, 0.1, -0.1, 0.2][rep];
                rows.push(row(
                    rows.len(),
                    &c.name,
                    c.perturbation.kind(),
                    m,
                    s,
                    10.0 + s / 10.0 + noise,
                ));
            }
        }
        let s = summarize(&plan, &rows, Ending::Complete, Vec::new());
        let c = s.correlation.as_ref().unwrap();
        assert!(c.r_sd > 0.95 && c.r_mean < 0.5, "{} {}", c.r_sd, c.r_mean);
        assert!(c.p_value < ALPHA);
        assert!(
            c.verdict.starts_with("more sensitive to latency variation"),
            "{}",
            c.verdict
        );
        let s100 = &s.configurations[3];
        assert_eq!(s100.runs, 6);
        assert!(
            (s100.slowdown - 30.0 / 10.0).abs() < 0.1,
            "{}",
            s100.slowdown
        );
        assert!(s100.slowdown_ci95[0] < s100.slowdown && s100.slowdown < s100.slowdown_ci95[1]);
        assert!(s.configurations[0].ci95 > 0.0);
        // In summary.json the correlations sit beside the configurations, as they always did.
        let json = serde_json::to_value(&s).unwrap();
        assert!(
            json["verdict"].is_string() && json["r_sd"].is_number(),
            "{json}"
        );
        assert_eq!(json["ending"], "complete");
    }

    #[test]
    fn a_tolerance_sweep_has_no_verdict_and_a_capped_study_is_not_complete() {
        let mut plan = Plan {
            command: vec!["app".into()],
            configurations: vec![Configuration {
                name: "clean".into(),
                perturbation: Perturbation::Clean,
            }],
            seed: 1,
            warmup: 0,
            stopping: Stopping::Reps(3),
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: None,
        };
        plan.tolerance = Some(crate::study::plan::Tolerance {
            targets: vec![0.05],
            sweep: crate::study::plan::Swept::Mean,
            mean_start_ns: 10e3,
            mean_max_ns: 100e3,
            sd_mean_ns: 20e3,
            sd_base_shape: 0.5,
            sd_base_scale_ns: 1e3,
            sd_base_loc_ns: 0.0,
            metric_unit_us: None,
        });
        let rows: Vec<Row> = (0..6)
            .map(|k| row(k, "const-0.00ns", "table", 0.0, 0.0, 10.0 + k as f64))
            .collect();
        let s = summarize(
            &plan,
            &rows,
            Ending::CapReached,
            vec!["const-0.00ns".into()],
        );
        assert!(s.correlation.is_none() && !s.complete);
        let json = serde_json::to_value(&s).unwrap();
        for absent in [
            "verdict",
            "r_mean",
            "r_sd",
            "fisher_z",
            "p_value",
            "correlation_runs",
        ] {
            assert!(json.get(absent).is_none(), "{absent}: {json}");
        }
        assert_eq!(json["ending"], "cap_reached");
        assert_eq!(json["capped"][0], "const-0.00ns");
    }
}

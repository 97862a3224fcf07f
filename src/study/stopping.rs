//! When a set of configurations run in rounds has measured enough: `--reps` rounds, or
//! `--until-ci`'s intervals all narrow (or its cap). A study's rounds use it once; a
//! tolerance sweep uses it for each of its steps.
use super::plan::Stopping;
use super::record::{counted_metrics, Row};
use super::stats;
use serde::Serialize;

/// How a study (or one step of a sweep) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The stopping rule was met.
    Complete,
    /// `--until-ci` reached its cap before every CI was narrow enough.
    CapReached,
    /// Ctrl-C: the run in flight was dropped; the rows before it are kept.
    Interrupted,
}

/// Whether `rows` — the runs of whole or partial rounds of the configurations `names`, and
/// nothing else (no warm-up) — meet `stopping`; checked at round boundaries only.
pub fn rounds_enough(stopping: Stopping, names: &[&str], rows: &[Row]) -> Option<Ending> {
    let n = names.len();
    if n == 0 || rows.len() % n != 0 {
        return None;
    }
    let rounds = rows.len() / n;
    match stopping {
        Stopping::Reps(r) => (rounds >= r).then_some(Ending::Complete),
        Stopping::UntilCi { fraction, min, max } => {
            if rounds < min.max(2) {
                return None;
            }
            if too_wide(fraction, names, rows).is_empty() {
                Some(Ending::Complete)
            } else if rounds >= max {
                Some(Ending::CapReached)
            } else {
                None
            }
        }
    }
}

/// Of `names`, the configurations whose runs in `rows` do not meet `stopping`'s intervals:
/// what `--until-ci` left wide when it reached its cap (none for `--reps`).
pub fn wide<'a>(stopping: Stopping, names: &[&'a str], rows: &[Row]) -> Vec<&'a str> {
    match stopping {
        Stopping::Reps(_) => Vec::new(),
        Stopping::UntilCi { fraction, .. } => too_wide(fraction, names, rows),
    }
}

/// The configurations whose 95 % interval is not within `fraction` of their mean (or that
/// have too few counted runs for one).
fn too_wide<'a>(fraction: f64, names: &[&'a str], rows: &[Row]) -> Vec<&'a str> {
    names
        .iter()
        .copied()
        .filter(|name| {
            let xs = counted_metrics(rows, name);
            let half = stats::ci95_half(&xs);
            !(half.is_finite() && half <= fraction * stats::mean(&xs).abs())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_configurations_left_wide_are_named() {
        let mut rows = Vec::new();
        for k in 0..4 {
            for (name, metric) in [("clean", 100.0 + k as f64), ("a", 50.0), ("b", 200.0)] {
                rows.push(Row::counted(rows.len(), name, "table", metric));
            }
        }
        rows[2].metric = 260.0; // b: one run far off
        let stop = Stopping::UntilCi {
            fraction: 0.01,
            min: 2,
            max: 4,
        };
        let names = ["clean", "a", "b"];
        assert_eq!(rounds_enough(stop, &names, &rows[..9]), None);
        assert_eq!(rounds_enough(stop, &names, &rows), Some(Ending::CapReached));
        assert_eq!(wide(stop, &names, &rows), ["clean", "b"]);
        assert!(wide(Stopping::Reps(4), &names, &rows).is_empty());
    }
}

//! When a set of configurations run in rounds has measured enough: `--reps` rounds, or
//! `--until-ci`'s intervals all narrow (or its cap). A study's rounds use it once; a
//! tolerance sweep uses it for each of its steps.
use super::plan::Stopping;
use super::record::{counted_metrics, Row};
use super::stats;

/// How a study (or one step of a sweep) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            let narrow = names.iter().all(|name| {
                let xs = counted_metrics(rows, name);
                let half = stats::ci95_half(&xs);
                half.is_finite() && half <= fraction * stats::mean(&xs).abs()
            });
            if narrow {
                Some(Ending::Complete)
            } else if rounds >= max {
                Some(Ending::CapReached)
            } else {
                None
            }
        }
    }
}

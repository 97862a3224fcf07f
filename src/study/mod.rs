//! `ibjitter study`: how sensitive is a program to latency variation and to congestion?
//! It runs an unmodified program (any launcher) again and again, clean and under
//! perturbations — delay tables injected through libibjitter.so, a congestor's traffic
//! alongside — in a seeded, interleaved order, and reports per configuration the runs'
//! spread and slowdown, and the correlation of the metric with the injected mean and sd.
//!
//! - [`plan`]: configurations and the order of runs (a pure function of the seed).
//! - [`stopping`]: when rounds have measured enough (`--reps`, `--until-ci`).
//! - [`sweep`]: a tolerance study's adaptive steps (`--tolerance`), decided from the rows.
//! - [`tables`]: the tables as configurations (files, a generated mean-preserving family,
//!   constant delays).
//! - [`runner`]: one run: environment, congestor, wall time, metric, what was injected.
//! - [`stragglers`]: what a killed invocation left running, stopped before a resume's runs.
//! - [`output`]: a run's output read for its metric from the end, in bounded memory.
//! - [`record`]: `study.csv`, appended as runs finish; read back to resume.
//! - [`stats`], [`summary`]: the figures and the verdict, from the rows alone.
//! - [`linefit`], [`tolerance`]: a tolerance study's slowdowns, fitted lines and crossings,
//!   likewise.
//!
//! Results directory: `plan.json`, `study.csv`, `runs/` (each run's output and the injector's
//! stats), `tables/` (generated tables), and `summary.md`, `summary.json`, `*.svg`
//! (`report::export::study`).
pub mod linefit;
pub mod output;
pub mod plan;
pub mod record;
pub mod runner;
pub mod stats;
pub mod stopping;
pub mod stragglers;
pub mod summary;
pub mod sweep;
pub mod tables;
pub mod tolerance;

use plan::Plan;
use record::{Row, Writer};
use runner::{Interrupted, Runner};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;
use summary::Summary;
use sweep::{Next, Sweep};

/// Reads a file of a study's directory within the limits of every reader of user files
/// ([`crate::table::input::LIMITS`]); `None` if there is no such file.
fn read_if_present(path: &Path, what: &str) -> Result<Option<String>, String> {
    crate::table::input::read_text_if_present(path, what, crate::table::input::LIMITS)
        .map_err(|e| e.to_string())
}

pub use stopping::Ending;

/// What decides the runs: a study's fixed rounds, or a tolerance sweep's steps.
pub enum Schedule {
    Rounds(Box<Plan>),
    Sweep(Box<Sweep>),
}

impl Schedule {
    /// The plan with every configuration run so far (a sweep's grows as it goes).
    pub fn plan(&self) -> &Plan {
        match self {
            Schedule::Rounds(p) => p,
            Schedule::Sweep(s) => s.plan(),
        }
    }

    /// The run after `rows`, or the end.
    fn next(&mut self, rows: &[Row]) -> Result<Next, String> {
        match self {
            Schedule::Rounds(plan) => Ok(match enough(plan, rows) {
                Some(e) => Next::Done(e),
                None if rows.len() >= plan.max_runs() => Next::Done(Ending::CapReached),
                None => Next::Run(plan.slot(rows.len())),
            }),
            Schedule::Sweep(s) => s.next(rows),
        }
    }
}

/// Reads `DIR/plan.json` if there is one: a study may continue only with the same plan.
/// Writes it otherwise. Returns the schedule and the rows already measured (a sweep has
/// replayed its decisions over them).
pub fn open(plan: &Plan, dir: &Path) -> Result<(Schedule, Vec<Row>), String> {
    std::fs::create_dir_all(dir.join("runs")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("plan.json");
    if let Some(text) = read_if_present(&path, "a study's plan")? {
        let stored: Plan = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a study's plan: {e}", path.display()))?;
        let d = plan.differences(&stored);
        if !d.is_empty() {
            return Err(format!(
                "{} holds another study (it differs in {}): continue it with the same \
                 arguments, or give a new --out",
                dir.display(),
                d.join("; ")
            ));
        }
    }
    let text = serde_json::to_string_pretty(plan).map_err(|e| e.to_string())?;
    std::fs::write(&path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    let csv = dir.join("study.csv");
    let rows = record::load(&csv)?;
    if plan.tolerance.is_some() {
        let mut sweep = Sweep::new(plan, &dir.join("tables"))?;
        sweep
            .replay(&rows)
            .map_err(|e| format!("{}: {e}", csv.display()))?;
        return Ok((Schedule::Sweep(Box::new(sweep)), rows));
    }
    for r in &rows {
        let want = &plan.configurations[plan.slot(r.run).config].name;
        if &r.config != want {
            return Err(format!(
                "{}: run {} is {:?}, but this plan's run {} is {want:?}: the CSV is from another study",
                csv.display(),
                r.run,
                r.config,
                r.run
            ));
        }
    }
    Ok((Schedule::Rounds(Box::new(plan.clone())), rows))
}

/// Whether the stopping rule is met by `rows` (checked at round boundaries).
fn enough(plan: &Plan, rows: &[Row]) -> Option<Ending> {
    if rows.len() < plan.warmup {
        return None;
    }
    let names: Vec<&str> = plan
        .configurations
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    stopping::rounds_enough(plan.stopping, &names, &rows[plan.warmup..])
}

/// The progress line's "run N of M (what)" for a study's fixed rounds.
fn rounds_progress(plan: &Plan, index: usize) -> String {
    let of = if plan.rounds_fixed().is_some() {
        format!("{}", plan.max_runs())
    } else {
        format!("at most {}", plan.max_runs())
    };
    let slot = plan.slot(index);
    let what = match slot.round {
        None => "warm-up".to_string(),
        Some(r) => format!("round {}", r + 1),
    };
    format!("run {} of {of} ({what})", index + 1)
}

/// Runs the study's remaining runs, appending each to `DIR/study.csv`.
pub fn run(
    schedule: &mut Schedule,
    dir: &Path,
    runner: &Runner,
    mut rows: Vec<Row>,
    progress: bool,
) -> Result<(Vec<Row>, Ending), String> {
    let mut csv = Writer::open(&dir.join("study.csv"))?;
    // First what a killed invocation left running (they write their stats as they end), then
    // the stats of the runs the CSV does not hold.
    runner.stop_left_running();
    runner.forget_unrecorded(rows.len())?;
    let tty = progress && std::io::stderr().is_terminal();
    let started = Instant::now();
    let resumed_at = rows.len();
    if resumed_at > 0 {
        eprintln!(
            "ibjitter study: continuing {} after {resumed_at} runs",
            dir.display()
        );
    }
    let ending = loop {
        let slot = match schedule.next(&rows)? {
            Next::Done(e) => break e,
            Next::Run(slot) => slot,
        };
        let plan = schedule.plan();
        let name = &plan.configurations[slot.config].name;
        if progress {
            let (head, eta) = match &*schedule {
                Schedule::Rounds(plan) => {
                    let done = rows.len() - resumed_at;
                    let left = plan.max_runs() - rows.len();
                    let eta = if done > 0 {
                        let per = started.elapsed().as_secs_f64() / done as f64;
                        format!(", ETA {}", clock(per * left as f64))
                    } else {
                        String::new()
                    };
                    (rounds_progress(plan, rows.len()), eta)
                }
                // A sweep's length is not known in advance: no ETA.
                Schedule::Sweep(s) => match slot.round {
                    None => (format!("run {} (warm-up)", rows.len() + 1), String::new()),
                    Some(r) => (
                        format!(
                            "run {} (sweep step {}, round {})",
                            rows.len() + 1,
                            s.steps(),
                            r + 1
                        ),
                        String::new(),
                    ),
                },
            };
            let line = format!("study: {head}: {name}{eta}");
            if tty {
                eprint!("\r\x1b[K{line}");
                let _ = std::io::stderr().flush();
            } else {
                eprintln!("{line}");
            }
        }
        match runner.run(plan, slot) {
            Err(Interrupted) => break Ending::Interrupted,
            Ok(row) => {
                csv.append(&row)
                    .map_err(|e| format!("{}: {e}", dir.join("study.csv").display()))?;
                if !row.ok {
                    if tty {
                        eprintln!();
                    }
                    eprintln!(
                        "ibjitter study: run {} ({}) does not count: exit {}; {}",
                        row.run, row.config, row.exit, row.note
                    );
                }
                rows.push(row);
            }
        }
    };
    if tty {
        eprintln!();
    }
    Ok((rows, ending))
}

/// Summarizes and writes `summary.md`, `summary.json` and the plots.
pub fn finish(
    schedule: &Schedule,
    dir: &Path,
    rows: &[Row],
    ending: Ending,
) -> Result<Summary, String> {
    let plan = schedule.plan();
    let summary = match schedule {
        Schedule::Rounds(_) => {
            let capped = if ending == Ending::CapReached {
                let names: Vec<&str> = plan
                    .configurations
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                let measured = &rows[plan.warmup.min(rows.len())..];
                stopping::wide(plan.stopping, &names, measured)
                    .iter()
                    .map(|n| n.to_string())
                    .collect()
            } else {
                Vec::new()
            };
            summary::summarize(plan, rows, ending, capped)
        }
        // A sweep whose step hit `--until-ci`'s cap went on from it: it ends as capped
        // (exit 1, not complete), naming what was left wide.
        Schedule::Sweep(s) => {
            let mut summary = summary::summarize(plan, rows, ending, s.capped());
            summary.warnings.extend(s.warnings());
            summary
        }
    };
    crate::report::export::study::write_all(&summary, plan, rows, dir)?;
    Ok(summary)
}

/// `1h02m`, `3m05s`, `12s`.
fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::{Configuration, Perturbation, Stopping};

    #[test]
    fn until_ci_stops_when_every_interval_is_narrow_or_at_the_cap() {
        let plan = Plan {
            command: vec!["x".into()],
            configurations: vec![
                Configuration {
                    name: "clean".into(),
                    perturbation: Perturbation::Clean,
                },
                Configuration {
                    name: "c".into(),
                    perturbation: Perturbation::Congestor { args: "run".into() },
                },
            ],
            seed: 3,
            warmup: 1,
            stopping: Stopping::UntilCi {
                fraction: 0.05,
                min: 3,
                max: 6,
            },
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: None,
        };
        let mut rows = Vec::new();
        let push = |rows: &mut Vec<Row>, metric: f64| {
            let slot = plan.slot(rows.len());
            rows.push(Row {
                round: slot.round,
                warmup: slot.round.is_none(),
                ..Row::counted(
                    rows.len(),
                    &plan.configurations[slot.config].name,
                    "clean",
                    metric,
                )
            });
        };
        push(&mut rows, 1.0);
        for _ in 0..4 {
            push(&mut rows, 10.0);
            push(&mut rows, 10.1);
            assert_ne!(enough(&plan, &rows), Some(Ending::CapReached));
        }
        // Tight runs: done at the first round boundary from the third round on.
        assert_eq!(enough(&plan, &rows[..5]), None);
        assert_eq!(enough(&plan, &rows[..7]), Some(Ending::Complete));
        // Wild runs: never narrow, the cap ends it.
        let mut wild = rows[..1].to_vec();
        for k in 0..12 {
            push(&mut wild, if k % 4 < 2 { 1.0 } else { 30.0 });
        }
        assert_eq!(enough(&plan, &wild[..12]), None);
        assert_eq!(enough(&plan, &wild[..13]), Some(Ending::CapReached));
        assert_eq!(clock(3725.0), "1h02m");
        assert_eq!(clock(185.0), "3m05s");
    }
}

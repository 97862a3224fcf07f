//! A tolerance study's adaptive sweep: which configurations it runs, chosen as it goes.
//!
//! The sweep is a series of steps. Each step is a small study of its own: the clean
//! configuration, the two references (the zero delay, the mean line's x = 0, and the constant
//! delay at the sd sweep's mean, the sd line's), and the step's new points, run in rounds
//! shuffled by (seed, round) as every study's are, until `--reps` rounds or `--until-ci`'s
//! intervals (or its cap). The references run in every round of every step, so each run's
//! slowdown is taken over a reference measured beside it (`study::tolerance`). Then the next
//! step's points are decided from every row so far:
//! - the **mean** sweep adds constant delays from a 1-2-5 grid (1, 2, 5, 10, … µs, with the
//!   start and the top themselves), the start first: upwards until the largest point's
//!   slowdown is above the largest target beyond its interval (jumping to 1.5 × the fitted
//!   crossing once the fitted slope is resolved, else two grid points at a time), then near
//!   each target's fitted crossing where no point lies within a factor of 2 of it;
//! - the **sd** sweep, at one mean, adds members of the mean-preserving lognormal family
//!   (scale fractions 1, 1/2, … 1/1024 of the base: sd growing), the base first, by the
//!   same rules.
//!
//! Both sweeps advance together, one point each per step. A sweep stops where its newest
//! point has fewer than two runs with a slowdown (its runs failed): climbing on from nothing
//! would only guess. Every decision is a function of the plan and the rows before it alone
//! (the rows' numbers read back from `study.csv` are the very numbers measured), so a resumed
//! sweep replays the decisions of the rows it finds and goes on exactly where an
//! uninterrupted one would.
use super::linefit::LineFit;
use super::plan::{round_order, Configuration, Plan, Slot, Tolerance};
use super::record::{counted, Row};
use super::stopping::{rounds_enough, wide, Ending};
use super::tables::{as_named, constant_at, family_at_mean, family_tables, fmt_mean, write_config};
use super::tolerance::{line_data, LineKind};
use crate::table::dist::LogNormal;
use crate::table::family::Family;
use crate::table::stats::Stats;
use std::path::{Path, PathBuf};

/// The sd sweep's scale fractions: 2^-k of the base scale for k = 0..SD_STEPS.
const SD_STEPS: usize = 11;
/// The smallest constant delay the mean sweep adds, ns (the injector's busy-wait is checked
/// down to 1 µs by `ibjitter doctor`).
const MEAN_FLOOR_NS: f64 = 1e3;
/// Runs with a slowdown a point needs for its sweep to go on from it.
const MIN_RUNS: usize = 2;

/// The mean sweep's candidate delays, ns, ascending: the 1-2-5 series from 1 µs up to `max`,
/// with `start` and `max` themselves as their names write them (so no two share a name).
pub fn mean_grid(start_ns: f64, max_ns: f64) -> Vec<f64> {
    let (start_ns, max_ns) = (as_named(start_ns), as_named(max_ns));
    let mut g = vec![start_ns, max_ns];
    let mut decade = MEAN_FLOOR_NS;
    while decade <= max_ns {
        for m in [1.0, 2.0, 5.0] {
            if m * decade <= max_ns {
                g.push(m * decade);
            }
        }
        decade *= 10.0;
    }
    g.sort_by(f64::total_cmp);
    g.dedup_by(|a, b| fmt_mean(*a) == fmt_mean(*b));
    g
}

/// What one sweep knows when it chooses its next point.
pub struct Axis<'a> {
    /// The candidate x values (µs), ascending.
    pub grid: &'a [f64],
    /// The grid indices measured so far.
    pub measured: &'a [usize],
    /// The line fitted over every run of this sweep's kind.
    pub fit: Option<&'a LineFit>,
    /// Whether the largest measured point's slowdown interval lies above the largest target.
    pub beyond_targets: bool,
    /// The targets, ascending.
    pub targets: &'a [f64],
}

/// The grid index to measure next, or `None` when this sweep is done.
pub fn next_point(a: &Axis) -> Option<usize> {
    let top = a.grid.len().checked_sub(1)?;
    let last = *a.measured.iter().max()?;
    let largest = *a.targets.last()?;
    if !a.beyond_targets {
        if last >= top {
            return None; // the top of the range: what is not crossed is not reached
        }
        let k = match a.fit.filter(|f| f.rises()) {
            Some(f) => {
                let want = 1.5 * largest / f.slope;
                (last + 1..=top).find(|&k| a.grid[k] >= want).unwrap_or(top)
            }
            None => last + 2,
        };
        return Some(k.clamp(last + 1, top));
    }
    // Bracketed: a point near every target's fitted crossing, so the line is measured where
    // it is read (runtime is piecewise linear in latency, not a line everywhere).
    let f = a.fit.filter(|f| f.slope > 0.0)?;
    for &p in a.targets {
        let x = p / f.slope;
        if !(x.is_finite() && x > 0.0) {
            continue;
        }
        let near = |k: usize| (0.5..=2.0).contains(&(a.grid[k] / x));
        if a.measured.iter().any(|&k| near(k)) {
            continue;
        }
        let closest = (0..=top).min_by(|&i, &j| {
            let d = |k: usize| (a.grid[k] / x).ln().abs();
            d(i).total_cmp(&d(j))
        })?;
        if !a.measured.contains(&closest) {
            return Some(closest);
        }
    }
    None
}

/// One step: the clean configuration, the references and the step's new points, in rounds.
#[derive(Debug, Clone)]
struct Step {
    first_run: usize,
    first_round: usize,
    /// Indices into the plan's configurations, the clean one first.
    configs: Vec<usize>,
}

/// A point of a sweep: a grid index of the mean sweep, or a member of the sd sweep's family
/// (index k: scale fraction 2^-k).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    Mean(usize),
    Sd(usize),
}

/// A line's reference: the zero delay, or the constant delay at the sd sweep's mean.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reference {
    ZeroDelay,
    ConstantAtSdMean,
}

/// What one sweep does after a step.
enum Choice {
    Point(usize),
    /// Its rules are met: it is done.
    Done,
    /// It cannot go on (why, for the summary's warnings).
    Stopped(String),
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    Run(Slot),
    Done(Ending),
}

/// One of the two sweeps: its grid, the points it measured, whether it is done.
struct Progress {
    kind: LineKind,
    /// Candidate x values, µs.
    grid: Vec<f64>,
    /// (grid index, configuration index) of each point measured, in the order added.
    points: Vec<(usize, usize)>,
    done: bool,
}

/// A tolerance sweep in progress.
pub struct Sweep {
    /// The plan with every configuration added so far (the stored plan has the clean one).
    plan: Plan,
    spec: Tolerance,
    tables: PathBuf,
    /// The family at the sd sweep's mean.
    family: Option<Family>,
    mean: Option<Progress>,
    sd: Option<Progress>,
    /// The references' configuration indices, run in every step.
    references: Vec<usize>,
    steps: Vec<Step>,
    /// Per step that reached `--until-ci`'s cap: its number and the configurations left wide.
    capped: Vec<(usize, Vec<String>)>,
    /// Why a sweep stopped before its rules ended it.
    stopped: Vec<String>,
    ended: Option<Ending>,
}

impl Sweep {
    /// The sweep of `plan` (a tolerance plan), its tables written to `tables`.
    pub fn new(plan: &Plan, tables: &Path) -> Result<Sweep, String> {
        let spec = plan
            .tolerance
            .clone()
            .ok_or("not a tolerance study: it has no sweep")?;
        let mean = spec.sweep.mean().then(|| Progress {
            kind: LineKind::Mean,
            grid: mean_grid(spec.mean_start_ns, spec.mean_max_ns)
                .iter()
                .map(|ns| ns / 1e3)
                .collect(),
            points: Vec::new(),
            done: false,
        });
        let (family, sd) = if spec.sweep.sd() {
            let fam = sd_family(&spec)?;
            let grid = fam
                .members
                .iter()
                .map(|m| Stats::of_i64(&m.table.entries).sd / 1e3)
                .collect();
            let progress = Progress {
                kind: LineKind::Sd {
                    at_mean_us: spec.sd_mean_ns / 1e3,
                },
                grid,
                points: Vec::new(),
                done: false,
            };
            (Some(fam), Some(progress))
        } else {
            (None, None)
        };
        Ok(Sweep {
            plan: plan.clone(),
            spec,
            tables: tables.to_path_buf(),
            family,
            mean,
            sd,
            references: Vec::new(),
            steps: Vec::new(),
            capped: Vec::new(),
            stopped: Vec::new(),
            ended: None,
        })
    }

    /// The plan with every configuration the sweep has added.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// How many steps have begun.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The configurations `--until-ci` left wide at its cap, each named once.
    pub fn capped(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for n in self.capped.iter().flat_map(|(_, n)| n) {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
    }

    /// What the sweep's own course warns about: steps that hit `--until-ci`'s cap (naming
    /// the configurations left wide), sweeps stopped at a point whose runs failed.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.capped.is_empty() {
            let steps: Vec<String> = self
                .capped
                .iter()
                .map(|(step, names)| format!("{} (step {step})", names.join(", ")))
                .collect();
            w.push(format!(
                "--until-ci: at the cap, these intervals were not within the target, and the \
                 sweep went on from them: {}",
                steps.join("; ")
            ));
        }
        w.extend(self.stopped.iter().cloned());
        w
    }

    /// Replays the decisions behind `rows` (a resumed study's CSV), checking that each row is
    /// the run this sweep makes there.
    pub fn replay(&mut self, rows: &[Row]) -> Result<(), String> {
        for (i, row) in rows.iter().enumerate() {
            match self.next(&rows[..i])? {
                Next::Run(slot) => {
                    let want = &self.plan.configurations[slot.config].name;
                    if &row.config != want {
                        return Err(format!(
                            "run {i} is {:?}, but this sweep's run {i} is {want:?}: the CSV is from another study",
                            row.config
                        ));
                    }
                }
                Next::Done(_) => {
                    return Err(format!(
                    "the sweep ends after {i} runs, but the CSV has {}: it is from another study",
                    rows.len()
                ))
                }
            }
        }
        Ok(())
    }

    /// The run after `rows`, or the end of the sweep.
    pub fn next(&mut self, rows: &[Row]) -> Result<Next, String> {
        let index = rows.len();
        if index < self.plan.warmup {
            return Ok(Next::Run(Slot {
                index,
                round: None,
                position: index,
                config: 0,
            }));
        }
        loop {
            if let Some(e) = self.ended {
                return Ok(Next::Done(e));
            }
            let (first_round, first_run) = match self.steps.last() {
                Some(step) => {
                    let names: Vec<&str> = step
                        .configs
                        .iter()
                        .map(|&c| self.plan.configurations[c].name.as_str())
                        .collect();
                    let mine = &rows[step.first_run..];
                    match rounds_enough(self.plan.stopping, &names, mine) {
                        None => return Ok(Next::Run(self.slot(step, index))),
                        Some(e) => {
                            if e == Ending::CapReached {
                                let left = wide(self.plan.stopping, &names, mine);
                                let left = left.iter().map(|n| n.to_string()).collect();
                                self.capped.push((self.steps.len(), left));
                            }
                            (step.first_round + mine.len() / step.configs.len(), index)
                        }
                    }
                }
                None => (0, index),
            };
            let points = self.decide(rows);
            if points.is_empty() {
                self.ended = Some(if self.capped.is_empty() {
                    Ending::Complete
                } else {
                    Ending::CapReached
                });
                continue;
            }
            if self.references.is_empty() {
                for r in self.reference_kinds() {
                    let c = self.add_reference(r)?;
                    self.references.push(c);
                }
            }
            let mut configs = vec![0];
            configs.extend(&self.references);
            for p in points {
                configs.push(self.add(p)?);
            }
            self.steps.push(Step {
                first_run,
                first_round,
                configs,
            });
        }
    }

    /// Run `index`, in `step`: its round and the configuration at its place in the round's
    /// seeded order.
    fn slot(&self, step: &Step, index: usize) -> Slot {
        let n = step.configs.len();
        let j = index - step.first_run;
        let round = step.first_round + j / n;
        let position = j % n;
        Slot {
            index,
            round: Some(round),
            position,
            config: step.configs[round_order(self.plan.seed, round, n)[position]],
        }
    }

    /// The references this sweep runs: both, whichever sweeps it makes, since each line's
    /// runs include the other's (the sd sweep's constant delay is on the mean line).
    fn reference_kinds(&self) -> Vec<Reference> {
        let mut r = vec![Reference::ZeroDelay];
        if self.sd.is_some() {
            r.push(Reference::ConstantAtSdMean);
        }
        r
    }

    /// The next step's points (none: the sweep is done).
    fn decide(&mut self, rows: &[Row]) -> Vec<Point> {
        let mut next = Vec::new();
        if let Some(k) = self.advance(rows, true) {
            next.push(Point::Mean(k));
        }
        if let Some(k) = self.advance(rows, false) {
            next.push(Point::Sd(k));
        }
        next
    }

    /// The next grid index of the mean sweep (`mean`) or of the sd sweep, if it goes on.
    fn advance(&mut self, rows: &[Row], mean: bool) -> Option<usize> {
        let progress = if mean {
            self.mean.as_ref()?
        } else {
            self.sd.as_ref()?
        };
        if progress.done {
            return None;
        }
        let choice = self.choose(progress, rows);
        let progress = if mean {
            self.mean.as_mut()?
        } else {
            self.sd.as_mut()?
        };
        match choice {
            Choice::Point(k) => Some(k),
            Choice::Done => {
                progress.done = true;
                None
            }
            Choice::Stopped(why) => {
                progress.done = true;
                self.stopped.push(why);
                None
            }
        }
    }

    /// What a sweep does next, from the rows so far.
    fn choose(&self, progress: &Progress, rows: &[Row]) -> Choice {
        let Some(&(_, newest)) = progress.points.last() else {
            // The first point: the start of the mean sweep, the base of the sd sweep.
            let start = fmt_mean(as_named(self.spec.mean_start_ns));
            return Choice::Point(match progress.kind {
                LineKind::Mean => progress
                    .grid
                    .iter()
                    .position(|&g| fmt_mean(g * 1e3) == start)
                    .unwrap_or(0),
                LineKind::Sd { .. } => 0,
            });
        };
        let data = line_data(progress.kind, rows);
        // The point of configuration `c` on this sweep's line.
        let point = |c: usize| {
            let (m, sd) = self.plan.configurations[c].perturbation.injected_us();
            let x = progress.kind.x(m, sd);
            data.points.iter().find(|p| Some(p.x) == x)
        };
        // Where the newest point's runs failed, the next one would be chosen from nothing.
        let with_slowdown = point(newest).map_or(0, |p| p.values.len());
        if with_slowdown < MIN_RUNS {
            let name = &self.plan.configurations[newest].name;
            return Choice::Stopped(format!(
                "the {} sweep stopped at {name}: {} of its runs counted, {with_slowdown} with \
                 their round's reference; {MIN_RUNS} are needed to go on",
                progress.kind.name(),
                counted(rows, name).count(),
            ));
        }
        let fit = LineFit::fit(&data.points);
        let targets = &self.spec.targets;
        let largest = targets.last().copied().unwrap_or(f64::NAN);
        let top = progress.points.iter().max_by_key(|p| p.0).map(|p| p.1);
        let beyond_targets = top.and_then(point).is_some_and(|p| p.low95() > largest);
        let measured: Vec<usize> = progress.points.iter().map(|p| p.0).collect();
        match next_point(&Axis {
            grid: &progress.grid,
            measured: &measured,
            fit: fit.as_ref(),
            beyond_targets,
            targets,
        }) {
            Some(k) => Choice::Point(k),
            None => Choice::Done,
        }
    }

    /// Writes a reference's table and adds it to the plan; returns its configuration index.
    fn add_reference(&mut self, r: Reference) -> Result<usize, String> {
        let config = match r {
            Reference::ZeroDelay => constant_at(0.0, &self.tables)?,
            Reference::ConstantAtSdMean => {
                let fam = self.family.as_ref().ok_or("the sd sweep has no family")?;
                let tables = family_tables(fam, self.spec.sd_mean_ns);
                let (name, table) = &tables[tables.len() - 1];
                write_config(&self.tables, name, table)?
            }
        };
        self.plan.configurations.push(config);
        Ok(self.plan.configurations.len() - 1)
    }

    /// Writes a point's table and adds it to the plan; returns its configuration index.
    fn add(&mut self, p: Point) -> Result<usize, String> {
        let config: Configuration = match p {
            Point::Mean(k) => {
                let grid = &self.mean.as_ref().ok_or("no mean sweep")?.grid;
                constant_at(grid[k] * 1e3, &self.tables)?
            }
            Point::Sd(k) => {
                let fam = self.family.as_ref().ok_or("the sd sweep has no family")?;
                let tables = family_tables(fam, self.spec.sd_mean_ns);
                let (name, table) = &tables[k];
                write_config(&self.tables, name, table)?
            }
        };
        self.plan.configurations.push(config);
        let c = self.plan.configurations.len() - 1;
        let (progress, k) = match p {
            Point::Mean(k) => (self.mean.as_mut(), k),
            Point::Sd(k) => (self.sd.as_mut(), k),
        };
        progress.ok_or("no such sweep")?.points.push((k, c));
        Ok(c)
    }
}

/// The sd sweep's family: the base lognormal scaled to the sd sweep's mean, at scale
/// fractions 1, 1/2, … (fewer when the smallest have no lognormal of that mean).
fn sd_family(spec: &Tolerance) -> Result<Family, String> {
    let base = LogNormal::new(
        spec.sd_base_shape,
        spec.sd_base_scale_ns,
        spec.sd_base_loc_ns,
    )
    .map_err(|e| format!("the sd sweep's base: {e}"))?;
    let source = format!("the tolerance sweep's base ({})", base.describe());
    let mut n = SD_STEPS;
    loop {
        let fractions: Vec<f64> = (1..n).map(|k| 0.5f64.powi(k as i32)).collect();
        match family_at_mean(&base, &source, spec.sd_mean_ns, &fractions) {
            Ok(f) => return Ok(f),
            Err(_) if n > 2 => n -= 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_grid_is_1_2_5_with_start_and_top() {
        assert_eq!(
            mean_grid(10e3, 1e6),
            vec![1e3, 2e3, 5e3, 10e3, 20e3, 50e3, 100e3, 200e3, 500e3, 1e6]
        );
        assert_eq!(
            mean_grid(7e3, 300e3),
            vec![1e3, 2e3, 5e3, 7e3, 10e3, 20e3, 50e3, 100e3, 200e3, 300e3]
        );
        // A start or top that names round to a grid point's name is that point: no two
        // configurations share a name.
        assert_eq!(
            mean_grid(10.04e3, 1.0004e6),
            vec![1e3, 2e3, 5e3, 10e3, 20e3, 50e3, 100e3, 200e3, 500e3, 1e6]
        );
        let g = mean_grid(12.345e3, 987.65e3);
        let names: Vec<String> = g.iter().map(|&ns| fmt_mean(ns)).collect();
        assert!(names.contains(&"12.3us".to_string()) && names.contains(&"988us".to_string()));
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique, names);
    }

    use crate::study::plan::{Perturbation, Stopping, Swept};

    fn plan(sweep: Swept, stopping: Stopping) -> Plan {
        Plan {
            command: vec!["app".into()],
            configurations: vec![Configuration {
                name: "clean".into(),
                perturbation: Perturbation::Clean,
            }],
            seed: 4,
            warmup: 1,
            stopping,
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: Some(Tolerance {
                targets: vec![0.01, 0.05, 0.10],
                sweep,
                mean_start_ns: 10e3,
                mean_max_ns: 1e6,
                sd_mean_ns: 20e3,
                sd_base_shape: 0.5,
                sd_base_scale_ns: 1e3,
                sd_base_loc_ns: 0.0,
                metric_unit_us: Some(1.0),
            }),
        }
    }

    /// A program of runtime 5000 + 25 × mean + 4 × sd µs, ± `noise` / 2 µs fixed by the run's
    /// seed; `jump.1` times slower from run `jump.0` on (a machine whose speed changed);
    /// failing from `fails_from` µs of mean.
    struct Model {
        noise: fn(&str) -> f64,
        jump: (usize, f64),
        fails_from: f64,
    }

    const STEADY: Model = Model {
        noise: |_| 5.0,
        jump: (0, 1.0),
        fails_from: f64::INFINITY,
    };

    impl Model {
        /// The row this program gives at `slot`.
        fn row(&self, plan: &Plan, slot: Slot) -> Row {
            let c = &plan.configurations[slot.config];
            let (m, sd) = c.perturbation.injected_us();
            let seed = plan.run_seed(slot.index);
            let u = ((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 1000) as f64 / 1000.0;
            let y = 5000.0 + 25.0 * m + 4.0 * sd + (self.noise)(&c.name) * (u - 0.5);
            Row {
                round: slot.round,
                warmup: slot.round.is_none(),
                seed,
                table_mean_us: m,
                table_sd_us: sd,
                delayed: 1,
                ok: m < self.fails_from,
                ..Row::counted(
                    slot.index,
                    &c.name,
                    c.perturbation.kind(),
                    y * if slot.index >= self.jump.0 {
                        self.jump.1
                    } else {
                        1.0
                    },
                )
            }
        }

        /// Runs a sweep from `rows` to its end.
        fn finish(&self, sweep: &mut Sweep, rows: &mut Vec<Row>) -> Ending {
            loop {
                match sweep.next(rows).unwrap() {
                    Next::Done(e) => return e,
                    Next::Run(slot) => rows.push(self.row(sweep.plan(), slot)),
                }
            }
        }
    }

    fn names(sweep: &Sweep, prefix: &str) -> Vec<String> {
        sweep
            .plan()
            .configurations
            .iter()
            .map(|c| c.name.clone())
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    fn scratch(what: &str) -> PathBuf {
        std::env::temp_dir().join(format!("ibjitter-sweep-{what}-{}", std::process::id()))
    }

    #[test]
    fn a_sweep_runs_its_references_in_every_round_and_resumes_from_any_row() {
        let dir = scratch("resume");
        let p = plan(Swept::Both, Stopping::Reps(3));
        let mut whole = Sweep::new(&p, &dir).unwrap();
        let mut rows = Vec::new();
        assert_eq!(STEADY.finish(&mut whole, &mut rows), Ending::Complete);
        // The first step: the references (the zero delay, the constant 20 µs), then the
        // first point of each sweep: 10 µs and the base lognormal at 20 µs.
        assert_eq!(
            names(&whole, "")[..5],
            [
                "clean",
                "const-0.00ns",
                "20.0us-uniform",
                "const-10.0us",
                "20.0us-lognormal"
            ]
        );
        // At 25 per µs over 5000 (0.5 % per µs), 1, 5 and 10 % are crossed at 2, 10 and 20
        // µs: from 10 µs the mean sweep jumps to the grid point above 1.5 x 20, then adds
        // points near 2 and 20 µs (the fitted 10 % lies a hair above 20, more than twice 10).
        // Over 5500 at 4 per µs of sd, the sd's are 13.75, 69 and 138 µs: the base (sd 10.6);
        // one point leaves the slope without an interval, so two members up (sd 74); then the
        // member above 1.5 x 138 (sd 229), and 69 has one near it.
        assert_eq!(
            names(&whole, "const-"),
            [
                "const-0.00ns",
                "const-10.0us",
                "const-50.0us",
                "const-2.00us",
                "const-20.0us"
            ]
        );
        assert_eq!(
            names(&whole, "20.0us-"),
            [
                "20.0us-uniform",
                "20.0us-lognormal",
                "20.0us-scale25",
                "20.0us-scale3.125"
            ]
        );
        // Every round of every step has the clean run and both references; no configuration
        // runs twice in a round.
        let mut by_round = std::collections::BTreeMap::<usize, Vec<&str>>::new();
        for r in rows.iter().filter(|r| !r.warmup) {
            by_round
                .entry(r.round.unwrap())
                .or_default()
                .push(&r.config);
        }
        for (round, configs) in &by_round {
            for want in ["clean", "const-0.00ns", "20.0us-uniform"] {
                assert!(configs.contains(&want), "round {round}: {configs:?}");
            }
            let mut sorted = configs.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), configs.len(), "round {round}: {configs:?}");
        }
        assert!(whole.warnings().is_empty(), "{:?}", whole.warnings());
        // Killed after any run: a fresh sweep replays the rows and goes on into the same runs.
        for cut in [0, 1, 5, 15, 16, 17, 30, rows.len() - 1, rows.len()] {
            let mut again = Sweep::new(&p, &dir).unwrap();
            again.replay(&rows[..cut]).unwrap();
            let mut resumed = rows[..cut].to_vec();
            STEADY.finish(&mut again, &mut resumed);
            // As written to study.csv (a Row's NaNs never compare equal).
            let csv = |rows: &[Row]| rows.iter().map(Row::to_csv).collect::<Vec<_>>();
            assert_eq!(csv(&resumed), csv(&rows), "resumed after {cut} rows");
            assert_eq!(again.plan(), whole.plan());
        }
        // Rows of another study are refused.
        let mut other = rows.clone();
        other[3].config = "const-5.00us".into();
        let err = Sweep::new(&p, &dir).unwrap().replay(&other).unwrap_err();
        assert!(err.contains("run 3 is \"const-5.00us\""), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_drifting_machine_is_not_read_as_latency() {
        // 5 % slower from the second step on (after a warm-up run and 3 rounds of 3), five
        // times the 1 % target. Each run is taken over its own round's zero delay: the line
        // holds the program's 0.5 % per µs and its crossings at 2, 10 and 20 µs.
        let dir = scratch("drift");
        let p = plan(Swept::Mean, Stopping::Reps(3));
        let drifting = Model {
            jump: (10, 1.05),
            ..STEADY
        };
        let mut sweep = Sweep::new(&p, &dir).unwrap();
        let mut rows = Vec::new();
        drifting.finish(&mut sweep, &mut rows);
        assert_eq!(sweep.steps(), 4);
        let t = crate::study::tolerance::summarize(sweep.plan(), &rows, true).unwrap();
        let m = t.mean.unwrap();
        assert!(m.slope_ci95[0] < 0.005 && 0.005 < m.slope_ci95[1], "{m:?}");
        for (c, want) in m.crossings.iter().zip([2.0, 10.0, 20.0]) {
            assert!(c.ci95[0] < want && want < c.ci95[1], "{c:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_point_whose_runs_fail_stops_its_sweep_and_says_so() {
        let dir = scratch("fails");
        let p = plan(Swept::Mean, Stopping::Reps(3));
        let failing = Model {
            fails_from: 40.0,
            ..STEADY
        };
        let mut sweep = Sweep::new(&p, &dir).unwrap();
        let mut rows = Vec::new();
        assert_eq!(failing.finish(&mut sweep, &mut rows), Ending::Complete);
        // 50 µs failed every run: nothing is chosen from it.
        assert_eq!(
            names(&sweep, "const-"),
            ["const-0.00ns", "const-10.0us", "const-50.0us"]
        );
        let w = sweep.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("the mean sweep stopped at const-50.0us: 0 of its runs counted"),
            "{w:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cap_names_only_what_it_left_wide() {
        let dir = scratch("cap");
        let p = plan(
            Swept::Mean,
            Stopping::UntilCi {
                fraction: 0.002,
                min: 2,
                max: 3,
            },
        );
        // One configuration far noisier than the 0.2 % asked.
        let noisy = Model {
            noise: |name| if name == "const-10.0us" { 400.0 } else { 5.0 },
            ..STEADY
        };
        let mut sweep = Sweep::new(&p, &dir).unwrap();
        let mut rows = Vec::new();
        assert_eq!(noisy.finish(&mut sweep, &mut rows), Ending::CapReached);
        assert_eq!(sweep.capped(), ["const-10.0us"]);
        let w = sweep.warnings();
        assert!(
            w[0].ends_with("the sweep went on from them: const-10.0us (step 1)"),
            "{w:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A line with three runs at each x, ±0.001 around `slope` × x.
    fn line(slope: f64, xs: &[f64]) -> LineFit {
        let points: Vec<crate::study::linefit::Point> = xs
            .iter()
            .map(|&x| crate::study::linefit::Point {
                x,
                values: [-0.001, 0.0, 0.001].iter().map(|e| slope * x + e).collect(),
            })
            .collect();
        LineFit::fit(&points).unwrap()
    }

    #[test]
    fn it_climbs_then_fills_in_near_each_crossing_then_stops() {
        let grid = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
        let targets = [0.01, 0.05, 0.10];
        let axis = |measured: &'static [usize], fit, beyond| Axis {
            grid: &grid,
            measured,
            fit,
            beyond_targets: beyond,
            targets: &targets,
        };
        // No resolved slope yet: two grid points up.
        let flat = line(0.0, &[10.0, 20.0]);
        assert_eq!(next_point(&axis(&[3], Some(&flat), false)), Some(5));
        assert_eq!(next_point(&axis(&[3], None, false)), Some(5));
        // At the top, not beyond the targets: done (not reached).
        assert_eq!(next_point(&axis(&[3, 9], Some(&flat), false)), None);
        assert_eq!(next_point(&axis(&[8], None, false)), Some(9));
        // A resolved slowdown of 0.2 % per µs: 10 % at 50 µs, so 1.5 x 50 = 75: 100 µs.
        let f = line(0.002, &[10.0, 20.0]);
        assert_eq!(next_point(&axis(&[3], Some(&f), false)), Some(6));
        // Beyond the targets at 100: 1 % at 5 µs has 10 within a factor of 2, 5 % at 25 µs
        // has none: its closest grid point, 20; then each crossing has one (10 % at 50: 100).
        assert_eq!(next_point(&axis(&[3, 6], Some(&f), true)), Some(4));
        assert_eq!(next_point(&axis(&[3, 4, 6], Some(&f), true)), None);
        // Had it jumped from 20 to 100: 1 % at 5 µs gets 5, then nothing is missing.
        assert_eq!(next_point(&axis(&[4, 6], Some(&f), true)), Some(2));
        assert_eq!(next_point(&axis(&[2, 4, 6], Some(&f), true)), None);
        // A crossing below the grid's first point, already measured: nothing more to add.
        let steep = line(0.1, &[1.0, 2.0]);
        assert_eq!(next_point(&axis(&[0], Some(&steep), true)), None);
    }
}

//! A tolerance study's adaptive sweep: which configurations it runs, chosen as it goes.
//!
//! The sweep is a series of steps. Each step is a small study of its own: the clean
//! configuration and the step's new points, run in rounds shuffled by (seed, round) as every
//! study's are, until `--reps` rounds or `--until-ci`'s intervals (or its cap). Then the next
//! step's points are decided from every row so far:
//! - the **mean** sweep adds, after a first step with the zero delay (the mean line's x = 0)
//!   and the start, constant delays from a 1-2-5 grid (1, 2, 5, 10, … µs, with the start
//!   and the top themselves): upwards until the largest point's slowdown is above the
//!   largest target beyond its interval (jumping to 1.5 × the fitted crossing once the
//!   fitted slope is resolved, else two grid points at a time), then near each target's
//!   fitted crossing where no point lies within a factor of 2 of it;
//! - the **sd** sweep, at one mean, adds members of the mean-preserving lognormal family
//!   (scale fractions 1, 1/2, … 1/1024 of the base: sd growing) in the same way, after a
//!   first step with the constant delay at that mean (the sd line's x = 0) and the base.
//!
//! Both sweeps advance together, one point each per step. Every decision is a function of
//! the plan and the rows before it alone (the rows' numbers read back from `study.csv` are
//! the very numbers measured), so a resumed sweep replays the decisions of the rows it finds
//! and goes on exactly where an uninterrupted one would.
use super::linefit::LineFit;
use super::plan::{round_order, Configuration, Plan, Slot, Tolerance};
use super::record::{counted_metrics, Row};
use super::stats::ratio_ci95;
use super::stopping::{rounds_enough, wide, Ending};
use super::tables::{as_named, constant_at, family_at_mean, family_tables, fmt_mean, write_config};
use super::tolerance::{mean_pairs, sd_pairs};
use crate::table::dist::LogNormal;
use crate::table::family::Family;
use crate::table::stats::Stats;
use std::path::{Path, PathBuf};

/// The sd sweep's scale fractions: 2^-k of the base scale for k = 0..SD_STEPS.
const SD_STEPS: usize = 11;
/// The smallest constant delay the mean sweep adds, ns (the injector's busy-wait is checked
/// down to 1 µs by `ibjitter doctor`).
const MEAN_FLOOR_NS: f64 = 1e3;

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
    /// Whether the largest measured point's slowdown interval lies above 1 + the largest
    /// target.
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
                let want = 1.5 * largest * f.intercept / f.slope;
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
        let x = p * f.intercept / f.slope;
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

/// One step: the clean configuration and the step's new points, in rounds.
#[derive(Debug, Clone)]
struct Step {
    first_run: usize,
    first_round: usize,
    /// Indices into the plan's configurations, the clean one first.
    configs: Vec<usize>,
}

/// A point of a sweep: the mean sweep's zero delay or a grid index of it, the sd sweep's
/// constant delay or a member of its family (index k: scale fraction 2^-k).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    MeanZero,
    Mean(usize),
    SdZero,
    Sd(usize),
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    Run(Slot),
    Done(Ending),
}

/// A tolerance sweep in progress.
pub struct Sweep {
    /// The plan with every configuration added so far (the stored plan has the clean one).
    plan: Plan,
    spec: Tolerance,
    tables: PathBuf,
    /// Candidate constant delays, µs.
    mean_grid: Vec<f64>,
    /// The family at the sd sweep's mean, and its members' sds in µs.
    family: Option<Family>,
    sd_grid: Vec<f64>,
    steps: Vec<Step>,
    /// (grid index, configuration index) of each point measured.
    mean_points: Vec<(usize, usize)>,
    sd_points: Vec<(usize, usize)>,
    mean_done: bool,
    sd_done: bool,
    /// The configurations that steps reaching `--until-ci`'s cap left wide.
    capped: Vec<String>,
    ended: Option<Ending>,
}

impl Sweep {
    /// The sweep of `plan` (a tolerance plan), its tables written to `tables`.
    pub fn new(plan: &Plan, tables: &Path) -> Result<Sweep, String> {
        let spec = plan
            .tolerance
            .clone()
            .ok_or("not a tolerance study: it has no sweep")?;
        let mean_grid = mean_grid(spec.mean_start_ns, spec.mean_max_ns)
            .iter()
            .map(|ns| ns / 1e3)
            .collect();
        let (family, sd_grid) = if spec.sweep.sd() {
            let fam = sd_family(&spec)?;
            let sds = fam
                .members
                .iter()
                .map(|m| Stats::of_i64(&m.table.entries).sd / 1e3)
                .collect();
            (Some(fam), sds)
        } else {
            (None, Vec::new())
        };
        Ok(Sweep {
            plan: plan.clone(),
            spec,
            tables: tables.to_path_buf(),
            mean_grid,
            family,
            sd_grid,
            steps: Vec::new(),
            mean_points: Vec::new(),
            sd_points: Vec::new(),
            mean_done: false,
            sd_done: false,
            capped: Vec::new(),
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

    /// What the sweep's own course warns about: steps that hit `--until-ci`'s cap.
    pub fn warnings(&self) -> Vec<String> {
        if self.capped.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "--until-ci: the interval of {} was not within the target at the cap; the sweep went on",
            self.capped.join(", ")
        )]
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
                                self.capped.extend(left.iter().map(|n| n.to_string()));
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
            let mut configs = vec![0];
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

    /// The next step's points (none: the sweep is done).
    fn decide(&mut self, rows: &[Row]) -> Vec<Point> {
        let targets = &self.spec.targets;
        let largest = targets.last().copied().unwrap_or(f64::NAN);
        let metrics_of =
            |config: usize| counted_metrics(rows, &self.plan.configurations[config].name);
        // Whether the last point's slowdown over `base` is beyond the largest target.
        let beyond = |points: &[(usize, usize)], base: &[f64]| {
            let last = points.iter().max_by_key(|p| p.0).map(|p| p.1);
            last.is_some_and(|c| ratio_ci95(&metrics_of(c), base).1 > 1.0 + largest)
        };
        let mut next = Vec::new();
        if self.spec.sweep.mean() && !self.mean_done {
            if self.mean_points.is_empty() {
                let start = as_named(self.spec.mean_start_ns) / 1e3;
                let k = self.mean_grid.iter().position(|&g| g == start).unwrap_or(0);
                next.extend([Point::MeanZero, Point::Mean(k)]);
            } else {
                let (xs, ys) = mean_pairs(rows);
                let zero: Vec<f64> = xs
                    .iter()
                    .zip(&ys)
                    .filter(|p| *p.0 == 0.0)
                    .map(|p| *p.1)
                    .collect();
                let fit = LineFit::ols(&xs, &ys);
                let measured: Vec<usize> = self.mean_points.iter().map(|p| p.0).collect();
                match next_point(&Axis {
                    grid: &self.mean_grid,
                    measured: &measured,
                    fit: fit.as_ref(),
                    beyond_targets: beyond(&self.mean_points, &zero),
                    targets,
                }) {
                    Some(k) => next.push(Point::Mean(k)),
                    None => self.mean_done = true,
                }
            }
        }
        if self.spec.sweep.sd() && !self.sd_done {
            if self.sd_points.is_empty() {
                next.extend([Point::SdZero, Point::Sd(0)]);
            } else {
                let (xs, ys) = sd_pairs(rows, self.spec.sd_mean_ns / 1e3);
                let zero: Vec<f64> = xs
                    .iter()
                    .zip(&ys)
                    .filter(|p| *p.0 == 0.0)
                    .map(|p| *p.1)
                    .collect();
                let fit = LineFit::ols(&xs, &ys);
                let measured: Vec<usize> = self.sd_points.iter().map(|p| p.0).collect();
                match next_point(&Axis {
                    grid: &self.sd_grid,
                    measured: &measured,
                    fit: fit.as_ref(),
                    beyond_targets: beyond(&self.sd_points, &zero),
                    targets,
                }) {
                    Some(k) => next.push(Point::Sd(k)),
                    None => self.sd_done = true,
                }
            }
        }
        next
    }

    /// Writes a point's table and adds it to the plan; returns its configuration index.
    fn add(&mut self, p: Point) -> Result<usize, String> {
        let config: Configuration = match p {
            Point::MeanZero => constant_at(0.0, &self.tables)?,
            Point::Mean(k) => constant_at(self.mean_grid[k] * 1e3, &self.tables)?,
            Point::SdZero | Point::Sd(_) => {
                let fam = self.family.as_ref().ok_or("the sd sweep has no family")?;
                let tables = family_tables(fam, self.spec.sd_mean_ns);
                let (name, table) = match p {
                    Point::Sd(k) => &tables[k],
                    _ => &tables[tables.len() - 1],
                };
                write_config(&self.tables, name, table)?
            }
        };
        self.plan.configurations.push(config);
        let c = self.plan.configurations.len() - 1;
        match p {
            Point::Mean(k) => self.mean_points.push((k, c)),
            Point::Sd(k) => self.sd_points.push((k, c)),
            Point::MeanZero | Point::SdZero => {}
        }
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

    fn plan(sweep: Swept) -> Plan {
        Plan {
            command: vec!["app".into()],
            configurations: vec![Configuration {
                name: "clean".into(),
                perturbation: Perturbation::Clean,
            }],
            seed: 4,
            warmup: 1,
            stopping: Stopping::Reps(3),
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

    /// The row a program of runtime 5000 + 25 × mean + 4 × sd µs (± a little noise from the
    /// run's seed) gives at `slot`.
    fn measured(plan: &Plan, slot: Slot) -> Row {
        let c = &plan.configurations[slot.config];
        let (m, sd) = c.perturbation.injected_us();
        let seed = plan.run_seed(slot.index);
        let noise = ((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 1000) as f64 / 1000.0;
        Row {
            round: slot.round,
            warmup: slot.round.is_none(),
            seed,
            table_mean_us: m,
            table_sd_us: sd,
            delayed: 1,
            ..Row::counted(
                slot.index,
                &c.name,
                c.perturbation.kind(),
                5000.0 + 25.0 * m + 4.0 * sd + 5.0 * (noise - 0.5),
            )
        }
    }

    /// Runs a sweep from `rows` to its end.
    fn finish(sweep: &mut Sweep, rows: &mut Vec<Row>) -> Ending {
        loop {
            match sweep.next(rows).unwrap() {
                Next::Done(e) => return e,
                Next::Run(slot) => rows.push(measured(sweep.plan(), slot)),
            }
        }
    }

    #[test]
    fn a_sweep_interleaves_clean_runs_and_resumes_from_any_row_into_the_same_runs() {
        let dir = std::env::temp_dir().join(format!("ibjitter-sweep-{}", std::process::id()));
        let p = plan(Swept::Both);
        let mut whole = Sweep::new(&p, &dir).unwrap();
        let mut rows = Vec::new();
        assert_eq!(finish(&mut whole, &mut rows), Ending::Complete);
        let names: Vec<&str> = whole
            .plan()
            .configurations
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        // Both sweeps started in one step: the zero delay and the constant 10 µs, the sd
        // sweep's constant delay at 20 µs and its base lognormal.
        assert_eq!(
            &names[..5],
            [
                "clean",
                "const-0.00ns",
                "const-10.0us",
                "20.0us-uniform",
                "20.0us-lognormal"
            ]
        );
        // At 25 per µs over 5000, 1, 5 and 10 % are crossed at 2, 10 and 20 µs: from 10 µs
        // the mean sweep jumps to the grid point above 1.5 x 20, then adds points near 2 and
        // 20 µs. Over 5500 at 4 per µs of sd, the sd's are 13.75, 69 and 138 µs: the base
        // (sd 10.6), the member above 1.5 x 138 (sd 229), then one near 69 (sd 74).
        let points = |prefix: &str| -> Vec<&str> {
            names
                .iter()
                .copied()
                .filter(|n| n.starts_with(prefix))
                .collect()
        };
        assert_eq!(
            points("const-"),
            [
                "const-0.00ns",
                "const-10.0us",
                "const-50.0us",
                "const-2.00us",
                "const-20.0us"
            ]
        );
        assert_eq!(
            points("20.0us-"),
            [
                "20.0us-uniform",
                "20.0us-lognormal",
                "20.0us-scale3.125",
                "20.0us-scale25"
            ]
        );
        // Every round of every step has a clean run; no configuration runs twice in a round.
        let mut by_round = std::collections::BTreeMap::<usize, Vec<&str>>::new();
        for r in rows.iter().filter(|r| !r.warmup) {
            by_round
                .entry(r.round.unwrap())
                .or_default()
                .push(&r.config);
        }
        for (round, configs) in &by_round {
            assert!(configs.contains(&"clean"), "round {round}: {configs:?}");
            let mut sorted = configs.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), configs.len(), "round {round}: {configs:?}");
        }
        // Killed after any run: a fresh sweep replays the rows and goes on into the same runs.
        for cut in [0, 1, 5, 13, 14, 30, rows.len() - 1, rows.len()] {
            let mut again = Sweep::new(&p, &dir).unwrap();
            again.replay(&rows[..cut]).unwrap();
            let mut resumed = rows[..cut].to_vec();
            finish(&mut again, &mut resumed);
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

    fn line(a: f64, b: f64, xs: &[f64]) -> LineFit {
        // Three runs at each x, ±0.1 % of a around the line: a resolved slope.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for &v in xs {
            for e in [-0.001, 0.0, 0.001] {
                x.push(v);
                y.push(a + b * v + e * a);
            }
        }
        LineFit::ols(&x, &y).unwrap()
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
        let flat = line(1000.0, 0.0, &[0.0, 10.0]);
        assert_eq!(next_point(&axis(&[3], Some(&flat), false)), Some(5));
        assert_eq!(next_point(&axis(&[3], None, false)), Some(5));
        // At the top, not beyond the targets: done (not reached).
        assert_eq!(next_point(&axis(&[3, 9], Some(&flat), false)), None);
        assert_eq!(next_point(&axis(&[8], None, false)), Some(9));
        // A resolved slope of 2 per µs over 1000: 10 % at 50 µs, so 1.5 x 50 = 75: 100 µs.
        let f = line(1000.0, 2.0, &[0.0, 10.0]);
        assert_eq!(next_point(&axis(&[3], Some(&f), false)), Some(6));
        // Beyond the targets at 100: 1 % at 5 µs has 10 within a factor of 2, 5 % at 25 µs
        // has none: its closest grid point, 20; then each crossing has one (10 % at 50: 100).
        assert_eq!(next_point(&axis(&[3, 6], Some(&f), true)), Some(4));
        assert_eq!(next_point(&axis(&[3, 4, 6], Some(&f), true)), None);
        // Had it jumped from 20 to 100: 1 % at 5 µs gets 5, then nothing is missing.
        assert_eq!(next_point(&axis(&[4, 6], Some(&f), true)), Some(2));
        assert_eq!(next_point(&axis(&[2, 4, 6], Some(&f), true)), None);
        // A crossing below the grid's first point, already measured: nothing more to add.
        let steep = line(1000.0, 100.0, &[0.0, 1.0]);
        assert_eq!(next_point(&axis(&[0], Some(&steep), true)), None);
    }
}

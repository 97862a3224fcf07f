//! What a study runs: its configurations (clean, one per delay table, congested) and the
//! order of its runs, or for a tolerance study the sweep it makes. The order is a pure
//! function of the seed and the run's index (a sweep's, of the rows before it too), so a
//! study resumed from its CSV continues exactly where an uninterrupted one would be.
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What perturbs the program in a configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Perturbation {
    /// The program alone: the baseline every slowdown is relative to.
    Clean,
    /// libibjitter.so with this table (its mean and sd, as injected, in ns).
    Table {
        path: PathBuf,
        mean_ns: f64,
        sd_ns: f64,
    },
    /// `ibjitter ARGS` traffic running alongside the program (GPCNeT's congestor).
    Congestor { args: String },
    /// libibjitter.so with `IBJITTER_EPISODES` (calm and congested tables, exponential dwells
    /// of these means, ns), every rank on the job's one wall-clock schedule (`shared`,
    /// `IBJITTER_EPISODES_SYNC=1`) or each on its own. `mean_ns` and `sd_ns` are the delay's
    /// over time: the two tables mixed in the shares of time each state lasts.
    Episodes {
        calm: PathBuf,
        congested: PathBuf,
        mean_calm_ns: f64,
        mean_congested_ns: f64,
        shared: bool,
        mean_ns: f64,
        sd_ns: f64,
    },
}

impl Perturbation {
    pub fn kind(&self) -> &'static str {
        match self {
            Perturbation::Clean => "clean",
            Perturbation::Table { .. } => "table",
            Perturbation::Congestor { .. } => "congestor",
            Perturbation::Episodes { .. } => "episodes",
        }
    }

    /// Whether its runs load the injector (and so must show it drew delays to count).
    pub fn injects(&self) -> bool {
        matches!(
            self,
            Perturbation::Table { .. } | Perturbation::Episodes { .. }
        )
    }

    /// The injected delay's mean and sd in µs (0 for the clean and congested runs: they
    /// inject nothing; the correlations use only clean and table runs).
    pub fn injected_us(&self) -> (f64, f64) {
        match self {
            Perturbation::Table { mean_ns, sd_ns, .. }
            | Perturbation::Episodes { mean_ns, sd_ns, .. } => (mean_ns / 1e3, sd_ns / 1e3),
            _ => (0.0, 0.0),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Configuration {
    pub name: String,
    #[serde(flatten)]
    pub perturbation: Perturbation,
}

/// When the study has measured enough.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopping {
    /// Exactly this many measured runs of every configuration.
    Reps(usize),
    /// Until every configuration's 95 % CI half-width is within `fraction` of its mean, after at
    /// least `min` rounds and at most `max`.
    UntilCi {
        fraction: f64,
        min: usize,
        max: usize,
    },
}

impl Stopping {
    /// The most rounds the study may take.
    pub fn max_rounds(self) -> usize {
        match self {
            Stopping::Reps(n) => n,
            Stopping::UntilCi { max, .. } => max,
        }
    }
}

/// What a tolerance sweep (`--tolerance`) sweeps: its configurations are not fixed in advance
/// but chosen as it goes (`study::sweep`) from this and the rows measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// The slowdowns whose crossing points are sought, as fractions (0.05: 5 %), ascending.
    pub targets: Vec<f64>,
    pub sweep: Swept,
    /// The mean sweep's first constant delay and the most it adds, ns.
    pub mean_start_ns: f64,
    pub mean_max_ns: f64,
    /// The sd sweep's mean, ns, and its base lognormal before scaling to that mean (stored,
    /// not its source, so a changed source file is noticed on resume).
    pub sd_mean_ns: f64,
    pub sd_base_shape: f64,
    pub sd_base_scale_ns: f64,
    pub sd_base_loc_ns: f64,
    /// µs per unit of the metric (1e6 for seconds) when known: the fitted slope is then also
    /// a count of latency-bound messages.
    pub metric_unit_us: Option<f64>,
}

/// Which of the two sweeps a tolerance study makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Swept {
    Mean,
    Sd,
    Both,
}

impl Swept {
    pub fn mean(self) -> bool {
        matches!(self, Swept::Mean | Swept::Both)
    }
    pub fn sd(self) -> bool {
        matches!(self, Swept::Sd | Swept::Both)
    }
}

/// Everything that decides which run comes when: stored as `DIR/plan.json`, so a resumed
/// study checks it runs the same experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub command: Vec<String>,
    pub configurations: Vec<Configuration>,
    pub seed: u64,
    /// Clean runs at the start, measured but discarded (caches, page cache, connection set-up).
    pub warmup: usize,
    pub stopping: Stopping,
    pub metric: Option<String>,
    pub tail_metric: Option<String>,
    pub higher_is_better: bool,
    /// A tolerance study's sweep (its `configurations` are then the clean one alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
}

/// Run `index` of the study: which configuration, in which round and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: usize,
    /// `None` for a warm-up run.
    pub round: Option<usize>,
    pub position: usize,
    pub config: usize,
}

impl Plan {
    pub fn rounds_fixed(&self) -> Option<usize> {
        match self.stopping {
            Stopping::Reps(n) => Some(n),
            Stopping::UntilCi { .. } => None,
        }
    }

    /// The most runs the study may take (warm-up included).
    pub fn max_runs(&self) -> usize {
        // Saturating: a plan.json read back may hold any numbers.
        self.stopping
            .max_rounds()
            .saturating_mul(self.configurations.len())
            .saturating_add(self.warmup)
    }

    /// What run `index` is. Warm-up runs are the clean configuration (index 0); then each round
    /// runs every configuration once, in an order shuffled by (seed, round), so clean runs are
    /// interleaved with the perturbed ones and no configuration always goes first.
    pub fn slot(&self, index: usize) -> Slot {
        if index < self.warmup {
            return Slot {
                index,
                round: None,
                position: index,
                config: 0,
            };
        }
        let n = self.configurations.len();
        let (round, position) = ((index - self.warmup) / n, (index - self.warmup) % n);
        Slot {
            index,
            round: Some(round),
            position,
            config: round_order(self.seed, round, n)[position],
        }
    }

    /// The injector's seed for run `index`: different for every run, repeatable.
    pub fn run_seed(&self, index: usize) -> u64 {
        self.seed.wrapping_mul(1_000_003).wrapping_add(index as u64)
    }

    /// What differs between this plan and the one a results directory holds, in words; empty
    /// when a study may continue there. The stopping rule may change (to extend a study).
    pub fn differences(&self, stored: &Plan) -> Vec<String> {
        let mut d = Vec::new();
        if self.command != stored.command {
            d.push(format!(
                "the command ({:?} there, {:?} now)",
                stored.command.join(" "),
                self.command.join(" ")
            ));
        }
        if self.configurations != stored.configurations {
            let names = |p: &Plan| {
                p.configurations
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            d.push(format!(
                "the configurations or their tables ({} there, {} now)",
                names(stored),
                names(self)
            ));
        }
        if self.seed != stored.seed {
            d.push(format!(
                "the seed ({} there, {} now)",
                stored.seed, self.seed
            ));
        }
        if self.warmup != stored.warmup {
            d.push(format!(
                "the warm-up runs ({} there, {} now)",
                stored.warmup, self.warmup
            ));
        }
        if (&self.metric, &self.tail_metric, self.higher_is_better)
            != (&stored.metric, &stored.tail_metric, stored.higher_is_better)
        {
            d.push("the metric".to_string());
        }
        if self.tolerance != stored.tolerance {
            d.push("the tolerance sweep (targets, kind, range, sd mean or family)".to_string());
        } else if self.tolerance.is_some() && self.stopping != stored.stopping {
            // A sweep's next point depends on when each point stopped.
            d.push("the stopping rule (--reps, --until-ci, --min-reps, --max-reps)".to_string());
        }
        d
    }
}

/// A permutation of 0..n from (seed, round): Fisher–Yates with a PCG stream of its own.
pub fn round_order(seed: u64, round: usize, n: usize) -> Vec<usize> {
    let mut rng = Pcg64::seed_from_u64(seed ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: usize, seed: u64) -> Plan {
        let mut configurations = vec![Configuration {
            name: "clean".into(),
            perturbation: Perturbation::Clean,
        }];
        for k in 1..n {
            configurations.push(Configuration {
                name: format!("t{k}"),
                perturbation: Perturbation::Table {
                    path: format!("t{k}.dist").into(),
                    mean_ns: 1e3,
                    sd_ns: k as f64,
                },
            });
        }
        Plan {
            command: vec!["true".into()],
            configurations,
            seed,
            warmup: 2,
            stopping: Stopping::Reps(20),
            metric: None,
            tail_metric: None,
            higher_is_better: false,
            tolerance: None,
        }
    }

    #[test]
    fn every_round_runs_every_configuration_once_in_a_seeded_order() {
        let p = plan(5, 7);
        assert_eq!(p.slot(0).round, None);
        assert_eq!(p.slot(1).config, 0);
        let mut firsts = std::collections::HashSet::new();
        for round in 0..20 {
            let mut seen: Vec<usize> = (0..5).map(|i| p.slot(2 + round * 5 + i).config).collect();
            firsts.insert(seen[0]);
            seen.sort();
            assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        }
        assert!(
            firsts.len() >= 3,
            "the first slot should rotate: {firsts:?}"
        );
        // Same seed, same order; another seed, another order.
        let q = plan(5, 7);
        let r = plan(5, 8);
        let order = |p: &Plan| {
            (0..p.max_runs())
                .map(|i| p.slot(i).config)
                .collect::<Vec<_>>()
        };
        assert_eq!(order(&p), order(&q));
        assert_ne!(order(&p), order(&r));
        assert_eq!(p.max_runs(), 2 + 100);
    }

    #[test]
    fn a_stored_plan_with_another_seed_or_table_is_not_continued() {
        let p = plan(3, 1);
        assert!(p.differences(&p.clone()).is_empty());
        let mut longer = p.clone();
        longer.stopping = Stopping::Reps(40);
        assert!(p.differences(&longer).is_empty());
        assert_eq!(p.differences(&plan(3, 2)).len(), 1);
        let mut other = p.clone();
        other.configurations[1].name = "x".into();
        assert!(p.differences(&other)[0].contains("configurations"));
    }

    #[test]
    fn a_plan_read_back_from_its_json_is_the_same_plan() {
        // --until-ci 0.17% is 0.17 / 100, a double whose shortest text has 17 digits: read
        // back to the last bit, or the resumed study is refused as another.
        let mut p = plan(3, 1);
        p.stopping = Stopping::UntilCi {
            fraction: 0.17 / 100.0,
            min: 3,
            max: 6,
        };
        let text = serde_json::to_string_pretty(&p).unwrap();
        let back: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p, "{text}");
    }
}

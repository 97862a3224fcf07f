//! What `ibjitter table fit`, `family`, `episodes` and `stats` report, as data;
//! `export::table` writes it as text (JSON is the data serialized).
use crate::table::dist::LogNormal;
use crate::table::episodes::EpisodeFit;
use crate::table::fit::{ks_distance, Fit};
use crate::table::stats::Stats;
use serde::Serialize;

/// A lognormal fitted to samples, beside the samples' own mean and sd.
#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub samples: usize,
    pub source: String,
    pub shape: f64,
    pub loc_ns: f64,
    pub scale_ns: f64,
    pub mean_ns: f64,
    pub sd_ns: f64,
    pub mode_ns: f64,
    pub sample_mean_ns: f64,
    pub sample_sd_ns: f64,
    /// Between the samples and the fitted distribution.
    pub ks_distance: f64,
    pub log_likelihood: f64,
    /// False when the likelihood has no interior maximum (the far end of the searched range).
    pub interior_maximum: bool,
}

impl FitReport {
    pub fn new(fit: &Fit, samples_ns: &[f64], source: &str) -> FitReport {
        let l = fit.lognormal;
        let sample = Stats::of_f64(samples_ns);
        FitReport {
            samples: fit.n,
            source: source.to_string(),
            shape: l.shape,
            loc_ns: l.loc_ns,
            scale_ns: l.scale_ns,
            mean_ns: l.mean(),
            sd_ns: l.sd(),
            mode_ns: l.mode(),
            sample_mean_ns: sample.mean,
            sample_sd_ns: sample.sd,
            ks_distance: ks_distance(samples_ns, &l),
            log_likelihood: fit.log_likelihood,
            interior_maximum: fit.interior,
        }
    }
}

/// One file of a mean-preserving family.
#[derive(Debug, Clone)]
pub struct FamilyRow {
    pub path: String,
    /// (fraction of the base's variation, the member's lognormal); None for the uniform table.
    pub member: Option<(f64, LogNormal)>,
    /// Of the table as written.
    pub mean: f64,
    pub sd: f64,
}

/// The tables `ibjitter table family` wrote.
#[derive(Debug, Clone)]
pub struct FamilyReport {
    /// The base distribution, described.
    pub base: String,
    pub target_mean_ns: f64,
    pub rows: Vec<FamilyRow>,
}

/// `ibjitter table episodes`: the fitted two-state model, the tables written, and the
/// injector's setting that replays them.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodesReport {
    pub source: String,
    #[serde(flatten)]
    pub fit: EpisodeFit,
    pub calm_table: String,
    pub congested_table: String,
    /// `IBJITTER_EPISODES=…`, the line to use.
    pub env: String,
}

/// `ibjitter table stats`: one table's statistics.
#[derive(Debug, Clone, Serialize)]
pub struct TableStatsReport {
    pub table: String,
    /// What the statistics count: "ns", or netem units.
    pub unit: &'static str,
    pub stats: Stats,
}

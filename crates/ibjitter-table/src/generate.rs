//! Making tables from distributions: absolute tables of stratified quantiles, and netem-format
//! tables (iproute2's constructions for netem's own distributions, normalization otherwise).
//! Every table records in its header how it was made.

use super::dist::Dist;
use super::duration::{format_ns, format_ns_rounded, format_short};
use super::format::{Kind, Table, ENTRIES};
use super::netem;
use super::stats::Stats;
use super::TableError;

/// The tool-version line in table headers. Deliberately the crate version only, not the git
/// commit, so shipped tables regenerate byte for byte at any commit.
pub const MADE_BY: &str = concat!("made by ibjitter ", env!("CARGO_PKG_VERSION"));

/// The stratum midpoint probabilities `(k + 0.5) / 4096`.
pub fn stratum_probability(k: usize) -> f64 {
    (k as f64 + 0.5) / ENTRIES as f64
}

/// The distribution's quantiles at the 4096 stratum midpoints, nanoseconds.
pub fn stratified_quantiles(dist: &Dist) -> Vec<f64> {
    (0..ENTRIES)
        .map(|k| dist.quantile(stratum_probability(k)))
        .collect()
}

/// First header line for each kind.
pub fn kind_line(kind: Kind) -> &'static str {
    match kind {
        Kind::Absolute => "ibjitter delay table, absolute: each entry is a delay in nanoseconds",
        Kind::Netem => {
            "ibjitter delay table, netem (tc) format: delay = mu + sigma * entry / 8192, mu and sigma given at use"
        }
    }
}

/// Summary line of an absolute table's entries.
pub fn summary_line(entries: &[i64]) -> String {
    let s = Stats::of_i64(entries);
    format!(
        "table: mean={} sd={} min={} max={}",
        format_ns_rounded(s.mean),
        format_ns_rounded(s.sd),
        format_ns(s.min),
        format_ns(s.max)
    )
}

/// An absolute table from quantiles in nanoseconds: rounded to the nearest ns, negative values
/// clamped to 0 (and counted in the header). `lines` describe the distribution.
pub fn absolute_from_quantiles(quantiles: &[f64], lines: &[String]) -> Result<Table, TableError> {
    if quantiles.len() != ENTRIES {
        return Err(TableError::new(format!(
            "expected {ENTRIES} quantiles, found {}",
            quantiles.len()
        )));
    }
    let mut negative = 0;
    let mut entries = Vec::with_capacity(ENTRIES);
    for (k, &q) in quantiles.iter().enumerate() {
        // i64::MAX as f64 rounds up to 2^63, which is out of range.
        if !q.is_finite() || q >= i64::MAX as f64 {
            return Err(TableError::new(format!(
                "entry {k}: quantile {q} ns does not fit a table entry"
            )));
        }
        let v = q.round();
        if v < 0.0 {
            negative += 1;
            entries.push(0);
        } else {
            entries.push(v as i64);
        }
    }
    let mut comments = vec![kind_line(Kind::Absolute).to_string()];
    comments.extend(lines.iter().cloned());
    if negative > 0 {
        comments.push(format!(
            "{negative} negative quantiles clamped to 0ns (a delay cannot be negative)"
        ));
    }
    comments.push(summary_line(&entries));
    comments.push(MADE_BY.to_string());
    Ok(Table {
        kind: Kind::Absolute,
        entries,
        comments,
    })
}

/// Makes a table of `dist` of the given kind.
///
/// Absolute: entry k is the quantile at `(k + 0.5) / 4096`. netem: `normal`, `pareto` and
/// `paretonormal` follow iproute2's constructions (their `mu`/`sigma` are not part of a netem
/// table); any other distribution is normalized by its table's own mean and sd, which the
/// header records as the `mu`/`sigma` that give it back.
pub fn make_table(dist: &Dist, kind: Kind) -> Result<Table, TableError> {
    dist.validate()?;
    match kind {
        Kind::Absolute => {
            let lines = vec![
                format!("distribution: {}", dist.describe()),
                "entries: quantiles at (k+0.5)/4096 for k = 0..4095, rounded to the nearest ns"
                    .to_string(),
            ];
            absolute_from_quantiles(&stratified_quantiles(dist), &lines)
        }
        Kind::Netem => {
            let (entries, lines) = match dist {
                Dist::Normal { .. } => (
                    netem::normal_entries(),
                    vec!["distribution: normal, built as iproute2's netem/normal.c builds it".to_string()],
                ),
                Dist::Pareto { .. } => (
                    netem::pareto_entries(),
                    vec!["distribution: pareto, built as iproute2's netem/pareto.c builds it".to_string()],
                ),
                Dist::ParetoNormal { .. } => (
                    netem::paretonormal_entries(),
                    vec![
                        "distribution: paretonormal, built as iproute2's netem/paretonormal.c builds it"
                            .to_string(),
                    ],
                ),
                _ => {
                    let n = netem::normalize(&stratified_quantiles(dist));
                    let mut lines = vec![
                        format!("distribution: {}", dist.describe()),
                        "entries: quantiles at (k+0.5)/4096, normalized to mean 0, sd 1 by the quantiles' own mean and sd, times 8192"
                            .to_string(),
                        format!(
                            "mu={} sigma={} give the distribution back",
                            format_ns_rounded(n.mean),
                            format_ns_rounded(n.sd)
                        ),
                    ];
                    if n.clamped > 0 {
                        lines.push(format!(
                            "{} entries beyond +-4 sd clamped to the i16 range",
                            n.clamped
                        ));
                    }
                    (n.entries, lines)
                }
            };
            let mut comments = vec![kind_line(Kind::Netem).to_string()];
            comments.extend(lines);
            comments.push(MADE_BY.to_string());
            Ok(Table {
                kind: Kind::Netem,
                entries,
                comments,
            })
        }
    }
}

/// How far an absolute table's mean may be from its distribution's mean, as a fraction of it.
pub const MEAN_TOLERANCE: f64 = 0.05;
/// How far an absolute table's sd may be from its distribution's sd, as a fraction of it.
/// Wider than the mean's: 4096 stratified quantiles leave out the far tail, so a table's sd is
/// always somewhat below a skewed distribution's.
pub const SD_TOLERANCE: f64 = 0.10;

/// An absolute table whose mean or sd is beyond [`MEAN_TOLERANCE`] / [`SD_TOLERANCE`] of what
/// its distribution asked: the far tail (a large shape or sd) does not fit in 4096 quantiles,
/// or rounding and clamping to whole non-negative nanoseconds moved it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shortfall {
    pub asked_mean_ns: f64,
    pub achieved_mean_ns: f64,
    /// `None` where the distribution has no closed-form sd (then only the mean is checked).
    pub asked_sd_ns: Option<f64>,
    pub achieved_sd_ns: f64,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let off = |achieved: f64, asked: f64| {
            if asked == 0.0 {
                String::new()
            } else {
                format!(", {:+.1} %", 100.0 * (achieved / asked - 1.0))
            }
        };
        write!(
            f,
            "the table's mean is {} (asked {}{})",
            format_short(self.achieved_mean_ns),
            format_short(self.asked_mean_ns),
            off(self.achieved_mean_ns, self.asked_mean_ns)
        )?;
        match self.asked_sd_ns {
            Some(sd) => write!(
                f,
                ", its sd {} (asked {}{})",
                format_short(self.achieved_sd_ns),
                format_short(sd),
                off(self.achieved_sd_ns, sd)
            )?,
            None => write!(f, ", its sd {}", format_short(self.achieved_sd_ns))?,
        }
        write!(
            f,
            "; a 4096-quantile table meets a mean within {:.0} % and an sd within {:.0} %",
            MEAN_TOLERANCE * 100.0,
            SD_TOLERANCE * 100.0
        )
    }
}

/// Whether an absolute table of `dist` carries the mean and sd the distribution has, within
/// the tolerances. Netem tables are normalized (their moments are given at use): not checked.
pub fn check_moments(dist: &Dist, table: &Table) -> Result<(), Shortfall> {
    if table.kind != Kind::Absolute {
        return Ok(());
    }
    let Some(asked_mean) = dist.mean() else {
        return Ok(());
    };
    let asked_sd = dist.sd();
    let st = Stats::of_i64(&table.entries);
    let within =
        |achieved: f64, asked: f64, tol: f64| (achieved - asked).abs() <= tol * asked.abs();
    let mean_ok = within(st.mean, asked_mean, MEAN_TOLERANCE);
    let sd_ok = asked_sd.is_none_or(|sd| within(st.sd, sd, SD_TOLERANCE));
    if mean_ok && sd_ok {
        return Ok(());
    }
    Err(Shortfall {
        asked_mean_ns: asked_mean,
        achieved_mean_ns: st.mean,
        asked_sd_ns: asked_sd,
        achieved_sd_ns: st.sd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::LogNormal;
    use crate::format::parse;
    use crate::stats::Stats;

    #[test]
    fn absolute_lognormal_round_trips_and_records_how() {
        let d = Dist::LogNormal(LogNormal::new(0.5, 1400.0, 5000.0).unwrap());
        let t = make_table(&d, Kind::Absolute).unwrap();
        let text = t.to_text().unwrap();
        assert_eq!(parse(&text, Kind::Absolute, "t").unwrap(), t);
        assert!(t.comments.iter().any(|c| c.contains("lognormal shape=0.5")));
        assert!(t.comments.iter().any(|c| c.contains(MADE_BY)));
        assert!(t.entries.windows(2).all(|w| w[0] <= w[1]));
        assert!(t.entries[0] > 5000);
    }

    #[test]
    fn negative_quantiles_are_clamped_and_counted() {
        let d = Dist::Normal {
            mu_ns: 100.0,
            sigma_ns: 100.0,
        };
        let t = make_table(&d, Kind::Absolute).unwrap();
        let zeros = t.entries.iter().filter(|&&e| e == 0).count();
        assert!(zeros > 0);
        assert!(t.comments.iter().any(|c| c.contains("clamped to 0ns")));
    }

    #[test]
    fn netem_normalized_from_any_distribution() {
        // Evenly spread values: within +-1.8 sd, so nothing is clamped.
        let d =
            Dist::empirical((0..4096).map(|i| 1000.0 + 3.0 * i as f64).collect(), "ramp").unwrap();
        let t = make_table(&d, Kind::Netem).unwrap();
        assert_eq!(t.kind, Kind::Netem);
        let s = Stats::of_i64(&t.entries);
        assert!(s.mean.abs() < 1.0, "{s:?}");
        assert!((s.sd - 8192.0).abs() < 1.0, "{s:?}");
        assert!(t
            .comments
            .iter()
            .any(|c| c.contains("give the distribution back")));
        // A skewed lognormal reaches beyond 4 sd: clamped entries are counted in the header.
        let d = Dist::LogNormal(LogNormal::new(0.3, 1000.0, 0.0).unwrap());
        let t = make_table(&d, Kind::Netem).unwrap();
        assert_eq!(*t.entries.last().unwrap(), 32767);
        assert!(t
            .comments
            .iter()
            .any(|c| c.contains("clamped to the i16 range")));
    }

    #[test]
    fn uniform_is_constant_at_the_mean() {
        let t = make_table(&Dist::Uniform { mean_ns: 6600.0 }, Kind::Absolute).unwrap();
        assert!(t.entries.iter().all(|&e| e == 6600));
        assert!(make_table(&Dist::Uniform { mean_ns: -1.0 }, Kind::Absolute).is_err());
    }

    #[test]
    fn moments_a_table_cannot_hold_are_reported() {
        // The cases: sd 1000 x the mean loses the tail; 1e30 s leaves only zeros.
        for (mean, sd) in [(10e3, 10e6), (10e3, 1e39)] {
            let d = Dist::LogNormal(LogNormal::from_mean_sd(mean, sd, 0.0).unwrap());
            let t = make_table(&d, Kind::Absolute).unwrap();
            let short = check_moments(&d, &t).unwrap_err();
            assert!((short.asked_mean_ns - mean).abs() < 1e-6 * mean);
            assert!(short.achieved_mean_ns < 0.95 * mean, "{short}");
            assert!(short.to_string().contains("(asked 10.0"), "{short}");
        }
        // An ordinary lognormal and the iproute2 shapes are met.
        let d = Dist::LogNormal(LogNormal::from_mean_sd(10e3, 5e3, 0.0).unwrap());
        assert_eq!(
            check_moments(&d, &make_table(&d, Kind::Absolute).unwrap()),
            Ok(())
        );
        for d in [
            Dist::Exponential {
                mean_ns: 10e3,
                loc_ns: 2e3,
            },
            Dist::Normal {
                mu_ns: 10e3,
                sigma_ns: 2e3,
            },
            Dist::Pareto {
                mu_ns: 10e3,
                sigma_ns: 2e3,
            },
            Dist::Uniform { mean_ns: 6600.0 },
        ] {
            let t = make_table(&d, Kind::Absolute).unwrap();
            assert_eq!(check_moments(&d, &t), Ok(()), "{}", d.describe());
        }
        // Clamping a normal's negative half moves its mean.
        let d = Dist::Normal {
            mu_ns: 0.0,
            sigma_ns: 1000.0,
        };
        assert!(check_moments(&d, &make_table(&d, Kind::Absolute).unwrap()).is_err());
    }
}

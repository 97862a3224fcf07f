//! The delay tables a study injects, as configurations: tables given by file, the
//! mean-preserving lognormal family (plus its uniform table) generated at one or more means
//! from a fit to measured latencies or a lognormal given by its parameters, the constant
//! delays a tolerance sweep adds, and congestion episodes (shared by the ranks or each
//! rank's own).
use super::plan::{Configuration, Perturbation};
use crate::table::dist::{Dist, LogNormal};
use crate::table::family::{family, percent, table_mean, Family};
use crate::table::fit::fit_lognormal;
use crate::table::generate::make_table;
use crate::table::samples::read_samples;
use crate::table::stats::Stats;
use crate::table::{read, Kind, Table};
use std::path::{Path, PathBuf};

/// Where a family's base lognormal comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum FamilyBase {
    /// Measured latencies (any layout `ibjitter table fit` reads): the fitted lognormal.
    Samples(PathBuf),
    /// A fit already made: `ibjitter table fit --json`'s output (`*.json`).
    Fit(PathBuf),
    /// `shape=S,scale=D[,loc=D]`.
    Given(LogNormal),
}

impl FamilyBase {
    /// `FILE` or `shape=S,scale=D[,loc=D]`.
    pub fn parse(spec: &str) -> Result<FamilyBase, String> {
        if !spec.contains('=') {
            if spec.ends_with(".json") {
                return Ok(FamilyBase::Fit(spec.into()));
            }
            return Ok(FamilyBase::Samples(spec.into()));
        }
        let (mut shape, mut scale, mut loc) = (None, None, 0.0);
        for part in spec.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("--family {spec:?}: expected FILE or shape=S,scale=D[,loc=D]")
            })?;
            match k.trim() {
                "shape" => {
                    shape = Some(
                        v.trim()
                            .parse::<f64>()
                            .map_err(|_| format!("--family: shape={v:?} is not a number"))?,
                    )
                }
                "scale" => scale = Some(crate::table::duration::parse_duration(v)?),
                "loc" => loc = crate::table::duration::parse_duration(v)?,
                other => {
                    return Err(format!(
                        "--family: unknown key {other:?} (expected shape, scale, loc)"
                    ))
                }
            }
        }
        match (shape, scale) {
            (Some(s), Some(d)) => LogNormal::new(s, d, loc)
                .map(FamilyBase::Given)
                .map_err(|e| format!("--family: {e}")),
            _ => Err(format!("--family {spec:?}: needs both shape= and scale=")),
        }
    }

    /// The base lognormal, and where it came from in words.
    pub fn lognormal(&self) -> Result<(LogNormal, String), String> {
        match self {
            FamilyBase::Given(l) => Ok((*l, format!("the lognormal {}", l.describe()))),
            FamilyBase::Fit(path) => {
                let text = crate::table::input::read_text(
                    path,
                    "a fit (`ibjitter table fit --json` output)",
                    crate::table::input::LIMITS,
                )
                .map_err(|e| e.to_string())?;
                let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                    format!(
                        "{}: not JSON (expected `ibjitter table fit --json` output): {e}",
                        path.display()
                    )
                })?;
                let get = |k: &str| {
                    doc[k].as_f64().ok_or_else(|| {
                        format!(
                            "{}: no number {k:?} (expected `ibjitter table fit --json` output)",
                            path.display()
                        )
                    })
                };
                let l = LogNormal::new(get("shape")?, get("scale_ns")?, get("loc_ns")?)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok((l, format!("the lognormal fit in {}", path.display())))
            }
            FamilyBase::Samples(path) => {
                let s = read_samples(path, None).map_err(|e| e.to_string())?;
                let f = fit_lognormal(&s.values_ns).map_err(|e| e.to_string())?;
                Ok((
                    f.lognormal,
                    format!(
                        "the lognormal fitted to {} samples of {}",
                        s.values_ns.len(),
                        path.display()
                    ),
                ))
            }
        }
    }
}

/// A name usable in file names and CSV cells: letters, digits, `-_.`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn table_config(name: String, path: &Path) -> Result<Configuration, String> {
    let t = read(path, Kind::Absolute).map_err(|e| e.to_string())?;
    let st = Stats::of_i64(&t.entries);
    let path = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Configuration {
        name,
        perturbation: Perturbation::Table {
            path,
            mean_ns: st.mean,
            sd_ns: st.sd,
        },
    })
}

/// One configuration per table file, named by its file stem (made unique).
pub fn from_files(
    paths: &[PathBuf],
    taken: &mut Vec<String>,
) -> Result<Vec<Configuration>, String> {
    let mut out = Vec::new();
    for p in paths {
        let stem = p
            .file_stem()
            .map(|s| sanitize(&s.to_string_lossy()))
            .unwrap_or_else(|| "table".into());
        let mut name = stem.clone();
        let mut k = 2;
        while taken.contains(&name) {
            name = format!("{stem}-{k}");
            k += 1;
        }
        taken.push(name.clone());
        out.push(table_config(name, p)?);
    }
    Ok(out)
}

/// `--episodes CALM.dist:CONGESTED.dist:MEAN_CALM:MEAN_CONGESTED` (means in ns already
/// parsed), as one configuration for each sharing asked: `episodes-shared` (every rank on
/// the job's one schedule) and `episodes-independent` (each rank its own). Their mean and sd
/// are the delay's over time: each table weighted by the share of time its state lasts.
pub fn episodes(
    calm: &Path,
    congested: &Path,
    dwell_ns: (f64, f64),
    sharing: &[bool],
) -> Result<Vec<Configuration>, String> {
    let load = |p: &Path, which: &str| -> Result<(PathBuf, Stats), String> {
        let t = read(p, Kind::Absolute).map_err(|e| format!("--episodes ({which} table): {e}"))?;
        let abs = std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok((abs, Stats::of_i64(&t.entries)))
    };
    let (calm, c) = load(calm, "calm")?;
    let (congested, g) = load(congested, "congested")?;
    let share = dwell_ns.1 / (dwell_ns.0 + dwell_ns.1);
    let mean = (1.0 - share) * c.mean + share * g.mean;
    let second =
        (1.0 - share) * (c.sd * c.sd + c.mean * c.mean) + share * (g.sd * g.sd + g.mean * g.mean);
    let sd = (second - mean * mean).max(0.0).sqrt();
    Ok(sharing
        .iter()
        .map(|&shared| Configuration {
            name: if shared {
                "episodes-shared"
            } else {
                "episodes-independent"
            }
            .into(),
            perturbation: Perturbation::Episodes {
                calm: calm.clone(),
                congested: congested.clone(),
                mean_calm_ns: dwell_ns.0,
                mean_congested_ns: dwell_ns.1,
                shared,
                mean_ns: mean,
                sd_ns: sd,
            },
        })
        .collect())
}

/// The family of `base` at each mean (`None`: the base's own), written to `dir` as
/// `<mean>-lognormal.dist`, `<mean>-scale75.dist`, …, `<mean>-uniform.dist`.
pub fn family_at_means(
    base: &FamilyBase,
    means_ns: &[f64],
    fractions: &[f64],
    dir: &Path,
) -> Result<Vec<Configuration>, String> {
    let (l, source) = base.lognormal()?;
    let means: Vec<f64> = if means_ns.is_empty() {
        vec![table_mean(&l)]
    } else {
        means_ns.to_vec()
    };
    let mut out = Vec::new();
    for &m in &means {
        let fam = family_at_mean(&l, &source, m, fractions)?;
        for (name, table) in family_tables(&fam, m) {
            out.push(write_config(dir, &name, table)?);
        }
    }
    Ok(out)
}

/// The mean-preserving family of `l` scaled to mean `mean_ns` (its shape kept, its scale and
/// location scaled), in memory.
pub fn family_at_mean(
    l: &LogNormal,
    source: &str,
    mean_ns: f64,
    fractions: &[f64],
) -> Result<Family, String> {
    if !(mean_ns.is_finite() && mean_ns > 0.0) {
        return Err(format!(
            "--family-means: expected means > 0, found {mean_ns} ns"
        ));
    }
    let f = mean_ns / table_mean(l);
    let scaled = LogNormal::new(l.shape, l.scale_ns * f, l.loc_ns * f)
        .map_err(|e| format!("--family at mean {}: {e}", fmt_mean(mean_ns)))?;
    family(&scaled, fractions, source)
        .map_err(|e| format!("--family at mean {}: {e}", fmt_mean(mean_ns)))
}

/// A family's tables with their configuration names: `<mean>-lognormal`, `<mean>-scale75`,
/// …, `<mean>-uniform`.
pub fn family_tables(fam: &Family, mean_ns: f64) -> Vec<(String, &Table)> {
    let label = fmt_mean(mean_ns);
    let mut files: Vec<(String, &Table)> = fam
        .members
        .iter()
        .map(|mem| (member_name(&label, mem.fraction), &mem.table))
        .collect();
    files.push((format!("{label}-uniform"), &fam.uniform));
    files
}

/// The name of a family member at `mean_ns`: `<mean>-lognormal` for the base, else
/// `<mean>-scale<percent>`.
pub fn member_name(label: &str, fraction: f64) -> String {
    if fraction == 1.0 {
        format!("{label}-lognormal")
    } else {
        format!("{label}-scale{}", percent(fraction))
    }
}

/// The constant delay `mean_ns` (every entry the same: the research's "uniform" table),
/// written to `dir` as `const-<mean>.dist`.
pub fn constant_at(mean_ns: f64, dir: &Path) -> Result<Configuration, String> {
    let mut table = make_table(&Dist::Uniform { mean_ns }, Kind::Absolute)
        .map_err(|e| format!("a constant delay of {}: {e}", fmt_mean(mean_ns)))?;
    table
        .comments
        .insert(2, "a constant delay of a tolerance sweep".to_string());
    write_config(dir, &format!("const-{}", fmt_mean(mean_ns)), &table)
}

/// Writes `table` to `dir/<name>.dist` and makes it a configuration of that name.
pub fn write_config(dir: &Path, name: &str, table: &Table) -> Result<Configuration, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.dist"));
    let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    table
        .write(file)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    table_config(name.to_string(), &path)
}

/// A mean for a name: `50.0us`, `1.50ms` (three significant digits, no spaces).
pub fn fmt_mean(ns: f64) -> String {
    sanitize(&crate::table::duration::format_short(ns))
}

/// The delay `ns` as its name writes it (three significant digits): two delays that would
/// share a name are then one delay, not two configurations with one name.
pub fn as_named(ns: f64) -> f64 {
    let text = crate::table::duration::format_short(ns);
    crate::table::duration::parse_duration(&text).unwrap_or(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_specs_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            FamilyBase::parse("lat.txt").unwrap(),
            FamilyBase::Samples("lat.txt".into())
        );
        match FamilyBase::parse("shape=0.8,scale=20us,loc=5us").unwrap() {
            FamilyBase::Given(l) => {
                assert_eq!(l.shape, 0.8);
                assert_eq!(l.scale_ns, 20e3);
                assert_eq!(l.loc_ns, 5e3);
            }
            other => panic!("{other:?}"),
        }
        assert!(FamilyBase::parse("shape=0.8")
            .unwrap_err()
            .contains("scale="));
        assert!(FamilyBase::parse("shape=x,scale=1us")
            .unwrap_err()
            .contains("not a number"));
        assert!(FamilyBase::parse("size=1,scale=1us")
            .unwrap_err()
            .contains("unknown key"));
    }

    /// Episodes' delay over time: calm 10 us three quarters of the time, congested 110 us
    /// one quarter: mean 35 us, sd sqrt(0.75 * 10^2 + 0.25 * 110^2 - 35^2) = 43.30 us.
    #[test]
    fn episodes_are_one_configuration_per_sharing_with_the_mixtures_mean_and_sd() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-ep-{}", std::process::id()));
        let calm = constant_at(10e3, &dir).unwrap();
        let cong = constant_at(110e3, &dir).unwrap();
        let path = |c: &Configuration| match &c.perturbation {
            Perturbation::Table { path, .. } => path.clone(),
            other => panic!("{other:?}"),
        };
        let got = episodes(&path(&calm), &path(&cong), (30e6, 10e6), &[true, false]).unwrap();
        let names: Vec<&str> = got.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["episodes-shared", "episodes-independent"]);
        for c in &got {
            let (m, sd) = c.perturbation.injected_us();
            assert!(
                (m - 35.0).abs() < 1e-9 && (sd - 43.30127).abs() < 1e-4,
                "{m} {sd}"
            );
            assert_eq!(c.perturbation.kind(), "episodes");
            assert!(c.perturbation.injects());
        }
        let missing = episodes(&dir.join("none.dist"), &path(&cong), (1.0, 1.0), &[true]);
        assert!(missing.unwrap_err().contains("calm table"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn constant_delays_are_tables_of_one_value_zero_included() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-const-{}", std::process::id()));
        for (ns, name) in [(0.0, "const-0.00ns"), (20e3, "const-20.0us")] {
            let c = constant_at(ns, &dir).unwrap();
            assert_eq!(c.name, name);
            match &c.perturbation {
                Perturbation::Table {
                    path,
                    mean_ns,
                    sd_ns,
                } => {
                    assert_eq!((*mean_ns, *sd_ns), (ns, 0.0));
                    assert!(path.ends_with(format!("{name}.dist")));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(constant_at(-1.0, &dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_family_at_two_means_keeps_each_mean_and_grows_the_sd() {
        let dir = std::env::temp_dir().join(format!("ibjitter-study-fam-{}", std::process::id()));
        let base = FamilyBase::parse("shape=0.5,scale=20us,loc=5us").unwrap();
        let cfgs = family_at_means(&base, &[30e3, 60e3], &[0.5, 0.25], &dir).unwrap();
        // Per mean: lognormal, scale50, scale25, uniform.
        assert_eq!(cfgs.len(), 8);
        assert_eq!(cfgs[0].name, "30.0us-lognormal");
        assert_eq!(cfgs[7].name, "60.0us-uniform");
        let stats: Vec<(f64, f64)> = cfgs
            .iter()
            .map(|c| match &c.perturbation {
                Perturbation::Table { mean_ns, sd_ns, .. } => (*mean_ns, *sd_ns),
                _ => unreachable!(),
            })
            .collect();
        for (k, &(m, _)) in stats.iter().enumerate() {
            let want = if k < 4 { 30e3 } else { 60e3 };
            assert!((m - want).abs() / want < 0.01, "{k}: mean {m}");
        }
        // Smaller scale at the same mean: larger sd.
        assert!(
            stats[0].1 < stats[1].1 && stats[1].1 < stats[2].1,
            "{stats:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

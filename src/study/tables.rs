//! The delay tables a study injects, as configurations: tables given by file, or the
//! mean-preserving lognormal family (plus its uniform table) generated at one or more means
//! from a fit to measured latencies or a lognormal given by its parameters.
use super::plan::{Configuration, Perturbation};
use crate::table::dist::LogNormal;
use crate::table::family::{family, percent, table_mean};
use crate::table::fit::fit_lognormal;
use crate::table::samples::read_samples;
use crate::table::stats::Stats;
use crate::table::{read, Kind};
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

    fn lognormal(&self) -> Result<(LogNormal, String), String> {
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

/// The family of `base` at each mean (`None`: the base's own), written to `dir` as
/// `<mean>-lognormal.dist`, `<mean>-scale75.dist`, …, `<mean>-uniform.dist`.
pub fn family_at_means(
    base: &FamilyBase,
    means_ns: &[f64],
    fractions: &[f64],
    dir: &Path,
) -> Result<Vec<Configuration>, String> {
    let (l, source) = base.lognormal()?;
    let own = table_mean(&l);
    let means: Vec<f64> = if means_ns.is_empty() {
        vec![own]
    } else {
        means_ns.to_vec()
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for &m in &means {
        if !(m.is_finite() && m > 0.0) {
            return Err(format!("--family-means: expected means > 0, found {m} ns"));
        }
        let f = m / own;
        let scaled = LogNormal::new(l.shape, l.scale_ns * f, l.loc_ns * f)
            .map_err(|e| format!("--family at mean {}: {e}", fmt_mean(m)))?;
        let fam = family(&scaled, fractions, &source)
            .map_err(|e| format!("--family at mean {}: {e}", fmt_mean(m)))?;
        let label = fmt_mean(m);
        let mut files: Vec<(String, &crate::table::Table)> = fam
            .members
            .iter()
            .map(|mem| {
                let n = if mem.fraction == 1.0 {
                    format!("{label}-lognormal")
                } else {
                    format!("{label}-scale{}", percent(mem.fraction))
                };
                (n, &mem.table)
            })
            .collect();
        files.push((format!("{label}-uniform"), &fam.uniform));
        for (name, table) in files {
            let path = dir.join(format!("{name}.dist"));
            let file =
                std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            table
                .write(file)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            out.push(table_config(name, &path)?);
        }
    }
    Ok(out)
}

/// A mean for a name: `50us`, `1.5ms` (three significant digits, no spaces).
fn fmt_mean(ns: f64) -> String {
    sanitize(&crate::table::duration::format_short(ns))
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

//! Message sizes drawn from a distribution (`run --size uniform:4K-64K`, `lognormal:…`, or a
//! CDF file in the format the congestion-control literature publishes), each flow with its
//! own seeded generator so a run repeats.
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use statrs::distribution::{ContinuousCDF, LogNormal};
use std::path::Path;

/// Quantile at which a lognormal's draws are clipped (it has no maximum; buffers need one).
const LOGNORMAL_CLIP: f64 = 0.9999;

#[derive(Debug, Clone, PartialEq)]
pub enum SizeDist {
    /// Every size in [min, max], equally likely.
    Uniform { min: u32, max: u32 },
    /// exp(N(ln median, sigma²)), clipped to its 99.99th percentile.
    Lognormal { median: u32, sigma: f64 },
    /// A piecewise-linear CDF: (size in bytes, cumulative probability) points, both
    /// non-decreasing, the last probability 1; sizes between points are interpolated.
    Cdf {
        points: Vec<(f64, f64)>,
        source: String,
    },
}

impl SizeDist {
    pub fn uniform(min: u32, max: u32) -> Result<SizeDist, String> {
        if min == 0 || min > max {
            return Err(format!(
                "uniform:MIN-MAX needs 1 <= MIN <= MAX, got {min}-{max}"
            ));
        }
        Ok(SizeDist::Uniform { min, max })
    }

    pub fn lognormal(median: u32, sigma: f64) -> Result<SizeDist, String> {
        if median == 0 || !(sigma > 0.0 && sigma <= 4.0) {
            return Err(format!(
                "lognormal:MEDIAN,SIGMA needs a median of at least 1 byte and 0 < SIGMA <= 4, got {median},{sigma}"
            ));
        }
        Ok(SizeDist::Lognormal { median, sigma })
    }

    /// Reads a CDF file: one `SIZE PROBABILITY` pair per line (spaces, tabs or a comma
    /// between), `#` comments and blank lines skipped; probabilities in 0..1, or in percent
    /// when the last one is 100.
    pub fn cdf_file(path: &Path) -> Result<SizeDist, String> {
        let text =
            crate::table::input::read_text(path, "the size CDF", crate::table::input::LIMITS)
                .map_err(|e| e.to_string())?;
        let at = |line: usize, what: String| format!("{}:{line}: {what}", path.display());
        let mut points = Vec::new();
        let mut last_line = 0;
        for (n, line) in text.lines().enumerate() {
            let line_no = n + 1;
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|f| !f.is_empty())
                .collect();
            let [size, prob] = fields[..] else {
                return Err(at(
                    line_no,
                    format!("expected SIZE PROBABILITY, found {line:?}"),
                ));
            };
            let size: f64 = size
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| at(line_no, format!("expected a size in bytes, found {size:?}")))?;
            if size > f64::from(u32::MAX) {
                return Err(at(
                    line_no,
                    format!(
                        "size {size} is larger than a message can be: at most {} bytes (4G - 1)",
                        u32::MAX
                    ),
                ));
            }
            let prob: f64 = prob
                .parse()
                .ok()
                .filter(|p: &f64| p.is_finite() && *p >= 0.0)
                .ok_or_else(|| at(line_no, format!("expected a probability, found {prob:?}")))?;
            if let Some(&(s0, p0)) = points.last() {
                if size < s0 || prob < p0 {
                    return Err(at(
                        line_no,
                        format!("sizes and probabilities must not decrease ({s0} {p0} before {size} {prob})"),
                    ));
                }
            }
            points.push((size, prob));
            last_line = line_no;
        }
        let Some(&(_, top)) = points.last() else {
            return Err(format!("{}: no SIZE PROBABILITY lines", path.display()));
        };
        let scale = if (top - 100.0).abs() < 1e-9 {
            100.0
        } else if (top - 1.0).abs() < 1e-9 {
            1.0
        } else {
            return Err(at(
                last_line,
                format!("the last probability must be 1 (or 100 in percent), found {top}"),
            ));
        };
        for p in &mut points {
            p.1 /= scale;
        }
        if points.iter().all(|p| p.0 < 1.0) {
            return Err(format!("{}: every size is below 1 byte", path.display()));
        }
        Ok(SizeDist::Cdf {
            points,
            source: path.display().to_string(),
        })
    }

    /// The size at cumulative probability `u` in [0, 1).
    fn quantile(&self, u: f64) -> f64 {
        match self {
            SizeDist::Uniform { min, max } => {
                let span = f64::from(max - min) + 1.0;
                (f64::from(*min) + (u * span).floor()).min(f64::from(*max))
            }
            SizeDist::Lognormal { median, sigma } => {
                let d = LogNormal::new(f64::from(*median).ln(), *sigma).expect("valid parameters");
                d.inverse_cdf(u.min(LOGNORMAL_CLIP))
            }
            SizeDist::Cdf { points, .. } => {
                let k = points
                    .partition_point(|&(_, p)| p < u)
                    .min(points.len() - 1);
                if k == 0 {
                    return points[0].0;
                }
                let ((s0, p0), (s1, p1)) = (points[k - 1], points[k]);
                if p1 <= p0 {
                    s1
                } else {
                    s0 + (s1 - s0) * (u - p0) / (p1 - p0)
                }
            }
        }
    }

    /// Mean size in bytes, before scaling (what `--load` turns into a message rate).
    pub fn mean(&self) -> f64 {
        match self {
            SizeDist::Uniform { min, max } => (f64::from(*min) + f64::from(*max)) / 2.0,
            // Of the clipped distribution, numerically: the clip moves it little.
            SizeDist::Lognormal { .. } => {
                let n = 100_000;
                (0..n)
                    .map(|k| self.quantile((k as f64 + 0.5) / n as f64))
                    .sum::<f64>()
                    / n as f64
            }
            SizeDist::Cdf { points, .. } => {
                let mut mean = points[0].0 * points[0].1;
                for w in points.windows(2) {
                    mean += (w[1].1 - w[0].1) * (w[0].0 + w[1].0) / 2.0;
                }
                mean
            }
        }
    }

    /// The largest size a draw can give, before scaling.
    pub fn max(&self) -> f64 {
        match self {
            SizeDist::Uniform { max, .. } => f64::from(*max),
            SizeDist::Lognormal { .. } => self.quantile(LOGNORMAL_CLIP),
            SizeDist::Cdf { points, .. } => points.last().expect("at least one point").0,
        }
    }

    /// How `--size` was given, for the report.
    pub fn describe(&self) -> String {
        match self {
            SizeDist::Uniform { min, max } => format!("uniform:{min}-{max}"),
            SizeDist::Lognormal { median, sigma } => format!("lognormal:{median},{sigma}"),
            SizeDist::Cdf { source, .. } => format!("cdf:{source}"),
        }
    }
}

/// A distribution with its scale (`--size-scale`): sizes in whole bytes, at least 1, at most
/// `max()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizes {
    pub dist: SizeDist,
    pub scale: f64,
}

impl Sizes {
    pub fn max(&self) -> u32 {
        (self.dist.max() * self.scale)
            .ceil()
            .clamp(1.0, f64::from(u32::MAX)) as u32
    }

    pub fn mean(&self) -> f64 {
        self.dist.mean() * self.scale
    }

    fn size_at(&self, u: f64) -> u32 {
        ((self.dist.quantile(u) * self.scale).round() as u32).clamp(1, self.max())
    }
}

/// One flow's draws.
pub struct SizeSampler {
    rng: Pcg64Mcg,
}

impl SizeSampler {
    /// Flow `flow`'s generator under the run's `seed`.
    pub fn new(seed: u64, flow: u32) -> SizeSampler {
        SizeSampler {
            rng: Pcg64Mcg::seed_from_u64(seed ^ 0x5153_495a_4553 ^ (u64::from(flow) << 32)),
        }
    }

    pub fn draw(&mut self, sizes: &Sizes) -> u32 {
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        sizes.size_at(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(sizes: &Sizes, n: usize) -> Vec<u32> {
        let mut s = SizeSampler::new(7, 3);
        let mut v: Vec<u32> = (0..n).map(|_| s.draw(sizes)).collect();
        v.sort_unstable();
        v
    }

    fn cdf(text: &str) -> Result<SizeDist, String> {
        // A directory per call (tests run in parallel), gone once the file is read.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ibjitter-sizes-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.cdf");
        std::fs::write(&path, text).unwrap();
        let d = SizeDist::cdf_file(&path);
        let _ = std::fs::remove_dir_all(&dir);
        d
    }

    #[test]
    fn draws_follow_a_cdf_file() {
        // The web-search shape in percent: every point's probability is met within 1 % by
        // 100,000 draws (a Kolmogorov-Smirnov distance), the mean within 2 %.
        let d = cdf("# size percent\n0 0\n10000 15\n20000 20\n30000 30\n50000 40\n80000 53\n200000 60\n1000000 70\n2000000 80\n5000000 90\n10000000 97\n30000000 100\n").unwrap();
        let sizes = Sizes {
            dist: d.clone(),
            scale: 1.0,
        };
        let v = draws(&sizes, 100_000);
        let SizeDist::Cdf { points, .. } = &d else {
            unreachable!()
        };
        for &(s, p) in points {
            let below = v.partition_point(|&x| f64::from(x) <= s) as f64 / v.len() as f64;
            assert!(
                (below - p).abs() < 0.01,
                "P(size <= {s}) = {below}, expected {p}"
            );
        }
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        assert!(
            (mean / d.mean() - 1.0).abs() < 0.02,
            "{mean} vs {}",
            d.mean()
        );
        assert_eq!(sizes.max(), 30_000_000);
        // Scaled: every size a tenth.
        let tenth = Sizes {
            dist: d,
            scale: 0.1,
        };
        assert_eq!(tenth.max(), 3_000_000);
        assert!((tenth.mean() - sizes.mean() / 10.0).abs() < 1e-6);
    }

    #[test]
    fn uniform_and_lognormal_keep_their_shape() {
        let u = Sizes {
            dist: SizeDist::uniform(100, 199).unwrap(),
            scale: 1.0,
        };
        let v = draws(&u, 100_000);
        assert_eq!((v[0], *v.last().unwrap()), (100, 199));
        let in_low_half = v.partition_point(|&x| x < 150) as f64 / v.len() as f64;
        assert!((in_low_half - 0.5).abs() < 0.01, "{in_low_half}");
        let l = Sizes {
            dist: SizeDist::lognormal(4096, 1.0).unwrap(),
            scale: 1.0,
        };
        let v = draws(&l, 100_000);
        let median = v[v.len() / 2];
        assert!(
            (f64::from(median) / 4096.0 - 1.0).abs() < 0.03,
            "median {median}"
        );
        // Clipped at the 99.99th percentile: e^(3.719) x 4096.
        let max = *v.last().unwrap();
        assert!(
            max <= l.max() && f64::from(l.max()) < 4096.0 * 41.5,
            "{max} {}",
            l.max()
        );
    }

    #[test]
    fn bad_cdf_files_say_where_and_what() {
        let e = cdf("0 0\n100 0.5\n50 0.7\n200 1\n").unwrap_err();
        assert!(
            e.contains(":3: sizes and probabilities must not decrease"),
            "{e}"
        );
        let e = cdf("0 0\n100 0.5\n").unwrap_err();
        assert!(e.contains(":2: the last probability must be 1"), "{e}");
        let e = cdf("0 0\n100 half\n").unwrap_err();
        assert!(e.contains(":2: expected a probability"), "{e}");
        let e = cdf("# only a comment\n").unwrap_err();
        assert!(e.contains("no SIZE PROBABILITY lines"), "{e}");
        let e = cdf("1 2 3\n").unwrap_err();
        assert!(e.contains(":1: expected SIZE PROBABILITY"), "{e}");
        assert!(SizeDist::uniform(10, 5).is_err());
        assert!(SizeDist::lognormal(4096, 0.0).is_err());
    }

    #[test]
    fn each_flow_draws_its_own_repeatable_sequence() {
        let u = Sizes {
            dist: SizeDist::uniform(1, 1_000_000).unwrap(),
            scale: 1.0,
        };
        let run = |flow| {
            let mut s = SizeSampler::new(1, flow);
            (0..8).map(|_| s.draw(&u)).collect::<Vec<_>>()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }
}

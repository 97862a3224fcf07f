//! `--size`: a constant (65536, 64K), or a distribution each message draws from:
//! `uniform:MIN-MAX`, `lognormal:MEDIAN,SIGMA`, or a CDF file (`cdf:FILE`, or a path).
use super::units;
use ibjitter::gen::sizes::SizeDist;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum SizeSpec {
    Fixed(u32),
    Drawn(SizeDist),
}

pub fn parse(text: &str) -> Result<SizeSpec, String> {
    let t = text.trim();
    if let Some(range) = t.strip_prefix("uniform:") {
        let (min, max) = range.split_once('-').ok_or_else(|| {
            format!("expected uniform:MIN-MAX (e.g. uniform:4K-64K), found {text:?}")
        })?;
        return SizeDist::uniform(units::size(min)?, units::size(max)?).map(SizeSpec::Drawn);
    }
    if let Some(params) = t.strip_prefix("lognormal:") {
        let (median, sigma) = params.split_once(',').ok_or_else(|| {
            format!("expected lognormal:MEDIAN,SIGMA (e.g. lognormal:16K,1.0), found {text:?}")
        })?;
        let sigma: f64 = sigma
            .trim()
            .parse()
            .map_err(|_| format!("lognormal: SIGMA must be a number, found {sigma:?}"))?;
        return SizeDist::lognormal(units::size(median)?, sigma).map(SizeSpec::Drawn);
    }
    if let Some(path) = t.strip_prefix("cdf:") {
        return SizeDist::cdf_file(Path::new(path)).map(SizeSpec::Drawn);
    }
    match units::size(t) {
        Ok(n) => Ok(SizeSpec::Fixed(n)),
        Err(_) if Path::new(t).is_file() => SizeDist::cdf_file(Path::new(t)).map(SizeSpec::Drawn),
        Err(e) => Err(format!(
            "{e}; or a distribution: uniform:MIN-MAX, lognormal:MEDIAN,SIGMA, cdf:FILE"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_and_distributions() {
        assert_eq!(parse("64K"), Ok(SizeSpec::Fixed(65536)));
        assert_eq!(
            parse("uniform:4K-64K"),
            Ok(SizeSpec::Drawn(SizeDist::Uniform {
                min: 4096,
                max: 65536
            }))
        );
        assert!(matches!(
            parse("lognormal:16K,1.5"),
            Ok(SizeSpec::Drawn(SizeDist::Lognormal { median: 16384, .. }))
        ));
        assert!(parse("uniform:64K")
            .unwrap_err()
            .contains("uniform:MIN-MAX"));
        assert!(parse("uniform:64K-4K")
            .unwrap_err()
            .contains("1 <= MIN <= MAX"));
        assert!(parse("lognormal:16K").unwrap_err().contains("MEDIAN,SIGMA"));
        assert!(parse("cdf:/nonexistent.cdf")
            .unwrap_err()
            .contains("cannot read"));
        assert!(parse("big").unwrap_err().contains("or a distribution"));
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/distributions/websearch.cdf");
        assert!(matches!(
            parse(shipped),
            Ok(SizeSpec::Drawn(SizeDist::Cdf { .. }))
        ));
    }
}

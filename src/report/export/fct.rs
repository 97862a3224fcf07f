//! `run --fct FILE`'s figures by size bucket: FILE-buckets.csv and FILE.svg (slowdown p50 and
//! p99 per bucket), beside the per-message CSV the run streamed to FILE.
use crate::report::fct::FctReport;
use crate::report::plot::{category_log_chart, Series};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// FILE's stem + `suffix` (`fct.csv` → `fct-buckets.csv`, `fct.svg`), in FILE's directory.
pub fn beside(file: &Path, suffix: &str) -> PathBuf {
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    file.with_file_name(format!("{stem}{suffix}"))
}

pub fn buckets_csv(r: &FctReport, path: &Path) -> Result<(), String> {
    let write = || -> std::io::Result<()> {
        let mut w = BufWriter::new(std::fs::File::create(path)?);
        writeln!(
            w,
            "bucket,min_bytes,max_bytes,messages,fct_p50_us,fct_p99_us,slowdown_mean,slowdown_p50,slowdown_p99"
        )?;
        for b in &r.buckets {
            writeln!(
                w,
                "{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3}",
                b.name,
                b.min_bytes,
                b.max_bytes.map_or(String::new(), |m| m.to_string()),
                b.messages,
                b.fct_p50_ns as f64 / 1e3,
                b.fct_p99_ns as f64 / 1e3,
                b.slowdown_mean,
                b.slowdown_p50,
                b.slowdown_p99
            )?;
        }
        w.flush()
    };
    write().map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Slowdown p50, mean and p99 by size bucket, on a log axis: small flows'
/// slowdowns run to thousands while large ones stay near 1.
pub fn slowdown_svg(r: &FctReport, path: &Path) -> Result<(), String> {
    let names: Vec<String> = r.buckets.iter().map(|b| b.name.clone()).collect();
    let line = |name: &str, f: &dyn Fn(&crate::report::fct::FctBucket) -> f64| Series {
        name: name.into(),
        points: (r.buckets.iter().enumerate())
            .filter(|(_, b)| b.messages > 0)
            .map(|(k, b)| (k as f64, f(b)))
            .collect(),
    };
    let title = format!(
        "FCT slowdown by flow size ({} flows; ideal: {} Gb/s line rate + {} us)",
        r.messages,
        r.line_gbps,
        r.base_latency_ns as f64 / 1e3
    );
    category_log_chart(
        path,
        &title,
        ("flow size", "slowdown (FCT / ideal FCT)"),
        &names,
        &[
            line("p99", &|b| b.slowdown_p99),
            line("mean", &|b| b.slowdown_mean),
            line("p50", &|b| b.slowdown_p50),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fct::FctBucket;

    #[test]
    fn bucket_files_beside_the_csv() {
        let dir = std::env::temp_dir().join(format!("ibjitter-fct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("fct.csv");
        assert_eq!(beside(&csv, "-buckets.csv"), dir.join("fct-buckets.csv"));
        let bucket = |name: &str, messages, p50, p99| FctBucket {
            name: name.into(),
            messages,
            slowdown_p50: p50,
            slowdown_p99: p99,
            slowdown_mean: (p50 + p99) / 2.0,
            ..Default::default()
        };
        let r = FctReport {
            line_gbps: 0.2,
            base_latency_ns: 0,
            messages: 834,
            buckets: vec![
                bucket("<10KB", 439, 20.2, 16031.7),
                bucket("10KB-100KB", 130, 0.79, 154.5),
                bucket("100KB-1MB", 243, 1.40, 14.9),
                bucket(">=1MB", 0, 0.0, 0.0),
            ],
        };
        buckets_csv(&r, &beside(&csv, "-buckets.csv")).unwrap();
        let text = std::fs::read_to_string(dir.join("fct-buckets.csv")).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(text.contains("\n<10KB,0,,439,"), "{text}");
        let svg = beside(&csv, ".svg");
        slowdown_svg(&r, &svg).unwrap();
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(
            svg.contains("100KB-1MB") && svg.contains("p99"),
            "labels and legend"
        );
        if let Ok(keep) = std::env::var("IBJITTER_KEEP_SVG") {
            std::fs::write(keep, svg).unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

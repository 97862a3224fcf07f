//! Per-flow throughput over time as CSV: one row per flow per interval,
//! `time_s,flow,bytes,gbps` — what the incast studies needed tcpdump and hand-written
//! filters for.
use std::io::{self, Write};

/// `series[f]` holds flow `ids[f]`'s bytes per interval; rows run to the longest series.
pub fn write<W: Write>(
    ids: &[u32],
    series: &[&[u64]],
    interval_s: f64,
    mut w: W,
) -> io::Result<()> {
    writeln!(w, "time_s,flow,bytes,gbps")?;
    let len = series.iter().map(|s| s.len()).max().unwrap_or(0);
    for k in 0..len {
        let t = k as f64 * interval_s;
        for (id, s) in ids.iter().zip(series) {
            let bytes = s.get(k).copied().unwrap_or(0);
            writeln!(
                w,
                "{t:.6},{id},{bytes},{:.6}",
                bytes as f64 * 8.0 / interval_s / 1e9
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_per_flow_per_interval() {
        let mut out = Vec::new();
        super::write(&[0, 7], &[&[125, 250], &[0]], 0.001, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows[0], "time_s,flow,bytes,gbps");
        assert_eq!(rows[1], "0.000000,0,125,0.001000");
        assert_eq!(rows[2], "0.000000,7,0,0.000000");
        assert_eq!(rows[3], "0.001000,0,250,0.002000");
        assert_eq!(rows.len(), 5);
    }
}

//! Per-flow throughput over time as CSV: one row per flow per interval, `time_s,flow,bytes,gbps`
//! — what the incast studies needed tcpdump and hand-written filters for. Written as the run
//! goes ([`write_header`], then [`write_interval`] per interval); a flow with no bytes in an
//! interval has no row there (its throughput was 0), which keeps a 10,000-flow file to what
//! moved.
use std::io::{self, Write};

pub fn write_header<W: Write>(w: &mut W) -> io::Result<()> {
    writeln!(w, "time_s,flow,bytes,gbps")
}

/// The rows of the interval starting at `t_s`: `rows` holds (flow, bytes).
pub fn write_interval<W: Write>(
    w: &mut W,
    t_s: f64,
    interval_s: f64,
    rows: &[(u32, u64)],
) -> io::Result<()> {
    for &(id, bytes) in rows {
        writeln!(
            w,
            "{t_s:.6},{id},{bytes},{:.6}",
            bytes as f64 * 8.0 / interval_s / 1e9
        )?;
    }
    Ok(())
}

/// A whole series at once: `series[f]` holds flow `ids[f]`'s bytes per interval.
pub fn write<W: Write>(
    ids: &[u32],
    series: &[&[u64]],
    interval_s: f64,
    mut w: W,
) -> io::Result<()> {
    write_header(&mut w)?;
    let len = series.iter().map(|s| s.len()).max().unwrap_or(0);
    for k in 0..len {
        let rows: Vec<(u32, u64)> = ids
            .iter()
            .zip(series)
            .filter_map(|(&id, s)| s.get(k).copied().filter(|&b| b > 0).map(|b| (id, b)))
            .collect();
        write_interval(&mut w, k as f64 * interval_s, interval_s, &rows)?;
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
        // Flow 7 moved nothing: no row.
        assert_eq!(rows[2], "0.001000,0,250,0.002000");
        assert_eq!(rows.len(), 3);
    }
}

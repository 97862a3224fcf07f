//! A pattern's per-pair figures (`incast --pattern`): pairs.csv, one row per (sender,
//! receiver) pair, and the throughput matrix as a text table.
use crate::report::pairs::PairMatrix;
use crate::report::us;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// pairs.csv: sender, receiver, steps, status, flows, ops, bytes, Gb/s, p50/p99/p99.9 in µs.
pub fn pairs_csv(m: &PairMatrix, path: &Path) -> Result<(), String> {
    let write = || -> io::Result<()> {
        let mut w = BufWriter::new(File::create(path)?);
        writeln!(
            w,
            "sender,receiver,steps,status,flows_requested,flows_started,ops,bytes,gbps,p50_us,p99_us,p999_us"
        )?;
        for c in &m.pairs {
            let l = &c.latency;
            writeln!(
                w,
                "{},{},{},\"{}\",{},{},{},{},{:.6},{:.3},{:.3},{:.3}",
                c.sender,
                c.receiver,
                c.steps,
                c.status.replace('"', "'"),
                c.flows_requested,
                c.flows_started,
                c.ops,
                c.bytes,
                c.gbps,
                us(l.p50_ns),
                us(l.p99_ns),
                us(l.p999_ns)
            )?;
        }
        w.flush()
    };
    write().map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The Gb/s matrix, senders down, receivers across; "-" where the pattern has no pair.
pub fn gbps_table<W: Write>(m: &PairMatrix, mut w: W) -> io::Result<()> {
    let width = m.hosts.iter().map(|h| h.len()).max().unwrap_or(1).max(8);
    write!(w, "  Gb/s {:>width$}", "to:")?;
    for h in &m.hosts {
        write!(w, " {h:>width$}")?;
    }
    writeln!(w)?;
    for (h, row) in m.hosts.iter().zip(&m.gbps) {
        write!(w, "  from {h:>width$}")?;
        for cell in row {
            match cell {
                Some(g) => write!(w, " {g:>width$.4}")?,
                None => write!(w, " {:>width$}", "-")?,
            }
        }
        writeln!(w)?;
    }
    let idle: Vec<String> = m
        .idle_or_failed()
        .map(|c| format!("{} -> {} ({})", c.sender, c.receiver, c.status))
        .collect();
    if !idle.is_empty() {
        writeln!(
            w,
            "  pairs that moved nothing or failed: {}",
            idle.join(", ")
        )?;
    }
    Ok(())
}

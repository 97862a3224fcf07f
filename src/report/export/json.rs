//! The whole report as JSON (per-flow and total ops, bytes, Gb/s, latency percentiles, fairness).
use crate::report::RunReport;
use std::io::{self, Write};

pub fn write<W: Write>(report: &RunReport, mut w: W) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut w, report).map_err(io::Error::other)?;
    writeln!(w)
}

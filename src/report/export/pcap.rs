//! `ibjitter pcap` output of a [`PcapReport`]: the capture summary, the per-flow table and
//! the IPD tables as text, the same as JSON, and SVG plots (IPD histogram, per-flow
//! throughput).
use crate::pcap::ipd::IpdRow;
use crate::pcap::Analysis;
use crate::report::pcap::{IpdReport, PcapReport};
use crate::report::plot::{self, Series};
use std::io::{self, Write};
use std::path::Path;

pub fn json<W: Write>(r: &PcapReport, mut w: W) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut w, r)?;
    writeln!(w)
}

/// The capture in a few lines, always printed.
pub fn summary<W: Write>(r: &PcapReport, mut w: W) -> io::Result<()> {
    writeln!(
        w,
        "{} ({}): {} frames, {} RoCE/IB transport packets, {} other, {} undecodable, {:.6} s",
        r.file, r.format, r.frames, r.roce_packets, r.other_frames, r.undecodable, r.duration_s
    )?;
    if let Some(why) = &r.first_undecodable {
        writeln!(w, "  first undecodable: {why}")?;
    }
    if let Some(t) = &r.truncated {
        writeln!(w, "  truncated: {t}")?;
    }
    if r.beyond_series > 0 {
        writeln!(
            w,
            "  time series: {} packets left out, past its {} intervals a flow or {} over all \
             flows (use a longer --interval)",
            r.beyond_series,
            crate::pcap::flows::MAX_SERIES_INTERVALS,
            crate::pcap::flows::SERIES_BUDGET
        )?;
    }
    if let Some(t) = &r.timestamps {
        writeln!(w, "  timestamps: {t}")?;
    }
    let t = &r.flow_totals;
    let aggregated = if r.aggregated_flows > 0 {
        format!(
            ", the last adding up {}{} flows beyond --max-flows {}",
            if r.aggregated_flows_exact {
                ""
            } else {
                "at least "
            },
            r.aggregated_flows,
            r.max_flows
        )
    } else {
        String::new()
    };
    writeln!(
        w,
        "  flows: {} ({} carrying data{aggregated}); payload {} bytes; retransmissions {}, out-of-order {}, NAKs {}, RNR NAKs {}",
        t.rows, t.data_rows, t.payload_bytes, t.retransmissions, t.out_of_order, t.naks, t.rnr_naks,
    )?;
    let c = &r.congestion;
    let pct = |n: u64| {
        if c.ip_packets > 0 {
            format!(" ({:.2} %)", 100.0 * n as f64 / c.ip_packets as f64)
        } else {
            String::new()
        }
    };
    write!(
        w,
        "  congestion: CE-marked {}{} of {} RoCEv2 packets (ECN-capable {}), CNPs {}, FECN {}, BECN {}; PAUSE {}, PFC {}",
        c.ce_marked,
        pct(c.ce_marked),
        c.ip_packets,
        c.ect,
        c.cnps,
        c.fecn,
        c.becn,
        c.pause_frames,
        c.pfc_frames
    )?;
    let paused: Vec<String> = (0..8)
        .filter(|&k| c.pfc_pauses[k] + c.pfc_resumes[k] > 0)
        .map(|k| {
            format!(
                "prio {k}: {} pause / {} resume",
                c.pfc_pauses[k], c.pfc_resumes[k]
            )
        })
        .collect();
    if !paused.is_empty() {
        write!(w, " ({})", paused.join(", "))?;
    }
    writeln!(w)
}

/// One row per flow.
pub fn flow_table<W: Write>(r: &PcapReport, mut w: W) -> io::Result<()> {
    writeln!(
        w,
        "{:>5} {:>15} {:>15} {:>8} {:>9} {:>13} {:>13} {:>10} {:>10} {:>7} {:>5} {:>5} {:>7} {:>5}  opcodes",
        "flow",
        "src",
        "dst",
        "dest_qp",
        "packets",
        "payload_B",
        "wire_B",
        "first_s",
        "last_s",
        "retrans",
        "ooo",
        "naks",
        "ce",
        "cnps"
    )?;
    for f in r.flows.iter() {
        let ops: Vec<String> = f.opcodes.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        writeln!(
            w,
            "{:>5} {:>15} {:>15} {:>#8x} {:>9} {:>13} {:>13} {:>10.6} {:>10.6} {:>7} {:>5} {:>5} {:>7} {:>5}  {}",
            f.flow,
            f.src,
            f.dst,
            f.dest_qp,
            f.packets,
            f.payload_bytes,
            f.wire_bytes,
            f.first_s,
            f.last_s,
            f.retransmissions,
            f.out_of_order,
            f.naks + f.rnr_naks,
            f.ce_marked,
            f.cnps,
            ops.join(", ")
        )?;
    }
    Ok(())
}

/// [`crate::report::us`] with at most 3 decimals, trailing zeros dropped.
fn us(ns: u64) -> String {
    let s = format!("{:.3}", crate::report::us(ns));
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn interval_label(row: &IpdRow) -> String {
    match row.to_ns {
        Some(to) => format!("{}-{}", us(row.from_ns), us(to)),
        None => format!(">={}", us(row.from_ns)),
    }
}

/// The talk's table form (interval, occurrences, percentage) and the percentiles.
fn ipd_table<W: Write>(title: &str, d: &IpdReport, w: &mut W) -> io::Result<()> {
    writeln!(w, "=== IPD {title}: {} gaps", d.gaps)?;
    if d.gaps == 0 {
        return Ok(());
    }
    writeln!(
        w,
        "{:>16} {:>12} {:>11}",
        "interval[us]", "occurrences", "percentage"
    )?;
    for row in &d.table {
        writeln!(
            w,
            "{:>16} {:>12} {:>10.2}%",
            interval_label(row),
            row.occurrences,
            row.percent
        )?;
    }
    let p = &d.percentiles;
    writeln!(
        w,
        "  [us] min {} p50 {} p90 {} p99 {} p99.9 {} max {} mean {:.3}{}",
        us(p.min_ns),
        us(p.p50_ns),
        us(p.p90_ns),
        us(p.p99_ns),
        us(p.p999_ns),
        us(p.max_ns),
        p.mean_ns / 1000.0,
        if d.backwards > 0 {
            format!(" ({} backwards timestamps counted as 0)", d.backwards)
        } else {
            String::new()
        }
    )
}

/// The overall IPD table, then each flow's: requests (the sender's pacing), and responses for
/// flows that carry only responses.
pub fn ipd_tables<W: Write>(r: &PcapReport, mut w: W) -> io::Result<()> {
    ipd_table(
        "overall (consecutive RoCE packets on the link)",
        &r.ipd,
        &mut w,
    )?;
    for f in r.flows.iter() {
        let (what, d) = if f.requests > 0 {
            ("requests", &f.ipd_requests)
        } else {
            ("responses", &f.ipd_responses)
        };
        let title = format!(
            "flow {} {} -> {} qp {:#x} ({what})",
            f.flow, f.src, f.dst, f.dest_qp
        );
        ipd_table(&title, d, &mut w)?;
    }
    Ok(())
}

/// `ipd.svg` (overall IPD table as bars) and, when the analysis kept a time series,
/// `throughput.svg` (per data flow, Gb/s per interval).
pub fn plots(dir: &Path, r: &PcapReport, a: &Analysis) -> Result<Vec<std::path::PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let bars: Vec<(String, f64)> = r
        .ipd
        .table
        .iter()
        .map(|row| (interval_label(row), row.occurrences as f64))
        .collect();
    let ipd = dir.join("ipd.svg");
    plot::bar_chart(
        &ipd,
        &format!("Inter-packet delay, all RoCE packets ({} gaps)", r.ipd.gaps),
        "interval [us]",
        "occurrences",
        &bars,
    )?;
    written.push(ipd);
    if let Some(interval) = a.options.interval_ns {
        let dt = interval as f64 / 1e9;
        let series: Vec<Series> = a
            .flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.is_data())
            .map(|(i, f)| Series {
                name: format!("flow {i} qp {:#x}", f.key.dest_qp),
                points: f
                    .series
                    .iter()
                    .enumerate()
                    .map(|(k, &b)| (k as f64 * dt, b as f64 * 8.0 / dt / 1e9))
                    .collect(),
            })
            .collect();
        let tp = dir.join("throughput.svg");
        plot::line_chart(
            &tp,
            "Per-flow payload throughput",
            "time [s]",
            "Gb/s",
            &series,
        )?;
        written.push(tp);
        let c = &r.congestion;
        let line = |name: &str, g: fn(&crate::report::pcap::SignalRow) -> u64| Series {
            name: name.to_string(),
            points: c.series.iter().map(|s| (s.t_s, g(s) as f64 / dt)).collect(),
        };
        let sig = dir.join("signals.svg");
        plot::line_chart(
            &sig,
            "Congestion signals on the link",
            "time [s]",
            "per second",
            &[
                line("CE-marked packets", |s| s.ce_marked),
                line("CNPs", |s| s.cnps),
                line("PAUSE/PFC frames", |s| s.flow_control),
            ],
        )?;
        written.push(sig);
    }
    Ok(written)
}

//! `ibjitter incast` output: a step's files (incast.json, timeseries.csv, latency.hlog, and
//! SVG plots), its one-paragraph summary, and a sweep's CSV and table.
use super::{hdrlog, timeseries};
use crate::report::incast::{
    percentile_points, throughput_plot, time_unit, IncastReport, Merged, RotationReport,
    StepStatus, SweepRow,
};
use crate::report::plot::{band_chart, line_chart, Series};
use crate::report::us;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::Duration;

/// A buffered file, or the error naming it.
fn create(path: &Path) -> Result<BufWriter<File>, String> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Turns an I/O error on `path` into the message.
fn failed(path: &Path) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("writing {}: {e}", path.display())
}

/// Writes a step's incast.json, timeseries.csv, latency.hlog (and with `plot`,
/// throughput.svg and latency.svg) into `dir`.
pub fn step_files(m: &Merged, dir: &Path, plot: bool) -> Result<(), String> {
    let path = dir.join("incast.json");
    let mut w = create(&path)?;
    serde_json::to_writer_pretty(&mut w, &m.report)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    writeln!(w).map_err(failed(&path))?;
    w.flush().map_err(failed(&path))?;
    let path = dir.join("timeseries.csv");
    let series: Vec<&[u64]> = m.series.iter().map(Vec::as_slice).collect();
    timeseries::write(&m.ids, &series, m.series_interval_s, create(&path)?)
        .map_err(failed(&path))?;
    // The senders' intervals (they send them with --json-series); else one interval, the
    // whole run.
    let path = dir.join("latency.hlog");
    let start = std::time::UNIX_EPOCH + Duration::from_nanos(m.start_unix_ns);
    let written = if m.latency_intervals.is_empty() {
        let whole = Duration::from_secs_f64(m.report.duration_s);
        hdrlog::write(
            std::slice::from_ref(&m.latency),
            whole,
            start,
            create(&path)?,
        )
    } else {
        let length = Duration::from_secs_f64(m.latency_interval_s);
        hdrlog::write(&m.latency_intervals, length, start, create(&path)?)
    };
    written.map_err(failed(&path))?;
    if plot {
        plots(m, dir)?;
    }
    Ok(())
}

/// Throughput over time (the total, a line per sender, the per-flow spread as bands) and the
/// latency percentile plot (in the unit that suits its largest value).
fn plots(m: &Merged, dir: &Path) -> Result<(), String> {
    let title = format!(
        "{} flows into {}: throughput",
        m.report.flows_requested, m.report.receiver
    );
    let t = throughput_plot(m);
    let mut lines = vec![t.total];
    lines.extend(t.senders);
    band_chart(
        &dir.join("throughput.svg"),
        &title,
        ("time [s]", "Mb/s"),
        &lines,
        &t.spread,
        "per flow",
    )?;
    let unit = time_unit(m.latency.max());
    let cdf = [Series {
        name: "all flows".into(),
        points: percentile_points(&m.latency, unit),
    }];
    line_chart(
        &dir.join("latency.svg"),
        "operation latency by percentile",
        "percentile [nines: 1=90%, 2=99%, 3=99.9%]",
        &format!("latency [{}]", unit.name),
        &cdf,
    )
}

/// The step's summary: totals, the senders that failed, flows with errors, where the report is.
pub fn step_summary<W: Write>(r: &IncastReport, report_path: &Path, mut w: W) -> io::Result<()> {
    let l = &r.total.latency;
    let (what, per) = match &r.pattern {
        Some(p) => (format!("{p} across {}", r.receiver), "pair"),
        None => (format!("incast into {}", r.receiver), "sender"),
    };
    writeln!(
        w,
        "{what}: {} flows ({} per {per} x {}), started {}, {:.3} Gb/s, fairness {:.4}, latency p50 {:.1} us p99 {:.1} us p99.9 {:.1} us; launch to first byte {}, start skew {:.1} ms",
        r.flows_requested,
        r.flows_per_sender,
        r.senders.len(),
        r.flows_started,
        r.total.gbps,
        r.fairness,
        us(l.p50_ns),
        us(l.p99_ns),
        us(l.p999_ns),
        r.launch_to_first_byte_s
            .map_or("unknown (clocks off)".into(), |s| format!("{s:.2} s")),
        r.start_skew_us / 1e3
    )?;
    if r.ops.len() > 1 {
        for (name, op) in &r.ops {
            writeln!(
                w,
                "  {name}: {} ops, {} bytes, latency p50 {:.1} us p99 {:.1} us",
                op.count,
                op.bytes,
                us(op.latency.p50_ns),
                us(op.latency.p99_ns)
            )?;
        }
    }
    for s in r.senders.iter().filter(|s| s.status != "ok") {
        writeln!(
            w,
            "  sender {} -> {}: {}{}",
            s.host,
            s.receiver,
            s.status,
            if s.stderr_tail.is_empty() {
                String::new()
            } else {
                format!(": {}", s.stderr_tail.replace('\n', " | "))
            }
        )?;
    }
    let failed = r.flows.iter().filter(|f| f.status != "ok").count();
    if failed > 0 {
        writeln!(w, "  {failed} flows ended with errors (see incast.json)")?;
    }
    writeln!(w, "  report: {}", report_path.display())
}

/// A rotating incast's pattern.json.
pub fn rotation_json(r: &RotationReport, path: &Path) -> Result<(), String> {
    let mut w = create(path)?;
    serde_json::to_writer_pretty(&mut w, r)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(w))
        .and_then(|()| w.flush())
        .map_err(failed(path))
}

/// A sweep as CSV, one row per step asked for: its status last ("done", "interrupted", "not
/// launched", "not run"), the figures empty where it did not run.
pub fn sweep_csv(rows: &[SweepRow], path: &Path) -> Result<(), String> {
    let mut w = create(path)?;
    let io = &failed(path);
    writeln!(
        w,
        "flows_per_sender,flows_requested,flows_started,total_gbps,fairness,p50_us,p99_us,p999_us,status"
    )
    .map_err(io)?;
    for r in rows {
        let [p50, p99, p999] = r.latency_us;
        let status = r.status.name();
        if r.status.ran() {
            writeln!(
                w,
                "{},{},{},{:.6},{:.6},{p50:.3},{p99:.3},{p999:.3},{status}",
                r.per_sender, r.requested, r.started, r.gbps, r.fairness
            )
        } else {
            writeln!(w, "{},,,,,,,,{status}", r.per_sender)
        }
        .map_err(io)?;
    }
    w.flush().map_err(io)
}

/// A sweep as a text table, its steps that did not run as such.
pub fn sweep_table<W: Write>(rows: &[SweepRow], mut w: W) -> io::Result<()> {
    writeln!(
        w,
        " {:>9} {:>9} {:>10} {:>9} {:>11} {:>11} {:>11}",
        "requested", "started", "Gb/s", "fairness", "p50[us]", "p99[us]", "p99.9[us]"
    )?;
    for r in rows {
        let [p50, p99, p999] = r.latency_us;
        match r.status {
            StepStatus::Done | StepStatus::Interrupted => writeln!(
                w,
                " {:>9} {:>9} {:>10.3} {:>9.4} {p50:>11.1} {p99:>11.1} {p999:>11.1}{}",
                r.requested,
                r.started,
                r.gbps,
                r.fairness,
                if r.status == StepStatus::Done {
                    ""
                } else {
                    "  (interrupted)"
                }
            )?,
            StepStatus::NotLaunched | StepStatus::NotRun => writeln!(
                w,
                " {:>9} {:>9}  ({} flows per sender: {})",
                "-",
                "-",
                r.per_sender,
                r.status.name()
            )?,
        }
    }
    Ok(())
}

//! `ibjitter pcap`: what RoCE / InfiniBand flows did on the wire, from a tcpdump or ibdump
//! capture.
use super::output_path::create;
use super::{exit, units};
use clap::Args;
use ibjitter::pcap::{analyze_file, ipd, Options};
use ibjitter::report::export::{pcap as export, timeseries};
use ibjitter::report::pcap::PcapReport;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "Reads pcap and pcapng: tcpdump on a RoCE interface (UDP 4791, IPv4 and \
IPv6; capture with -i <interface>, not -i any) or ibdump (InfiniBand, ERF records). A flow is \
(source, destination, destination QP). Bytes are BTH payload: what a WRITE or SEND moved, \
without headers, pad and ICRC; wire bytes are whole frames.\n\n\
Memory is bounded: at most about 2 KiB per flow (with the default IPD table), and flows beyond \
--max-flows are added up in one \"(other flows)\" row. Timestamps going backwards (merged or \
multi-queue captures) are counted and reported; times and gaps are then read on a monotonic \
view (see the report's \"timestamps\").\n\n\
Exit status: 0 analysed (a truncated last packet, flows added up beyond --max-flows and \
timestamps going backwards are reported on stderr and in the report, not fatal); 2 the file \
cannot be read or is not a supported capture."
)]
pub struct PcapArgs {
    /// The capture (pcap or pcapng)
    file: PathBuf,
    /// Print one row per flow: packets, bytes, first/last time, PSN checks, NAKs, opcodes
    #[arg(long)]
    flows: bool,
    /// Print inter-packet-delay tables (overall and per flow) with percentiles
    #[arg(long)]
    ipd: bool,
    /// Width of one IPD table interval
    #[arg(long, default_value = "1us", value_parser = units::duration)]
    ipd_bin: Duration,
    /// Number of IPD table intervals before the open-ended last one
    #[arg(long, default_value_t = ipd::DEFAULT_BINS as u32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    ipd_bins: u32,
    /// Write per-flow payload throughput per interval as CSV (time_s,flow,bytes,gbps; data flows)
    #[arg(long)]
    timeseries: Option<PathBuf>,
    /// Time-series interval (also used by --plot)
    #[arg(long, default_value = "10ms", value_parser = units::duration)]
    interval: Duration,
    /// Write everything (summary, flows, IPD tables and percentiles) as JSON
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write SVG plots into this directory: ipd.svg, throughput.svg
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Flows analysed one by one (in order of first appearance); later ones are added up in
    /// one "(other flows)" row [default: as many as ~1 GiB holds at their bound: 1 GiB / 2 KiB
    /// with the default IPD table, fewer with a longer one]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_flows: Option<u32>,
}

pub fn run(a: PcapArgs) -> i32 {
    match analyse(&a) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("ibjitter pcap: {e}");
            exit::PCAP_ERROR
        }
    }
}

fn analyse(a: &PcapArgs) -> Result<(), String> {
    let keep_series = a.timeseries.is_some() || a.plot.is_some();
    let options = Options {
        ipd_bin_ns: a.ipd_bin.as_nanos().max(1) as u64,
        ipd_bins: a.ipd_bins as usize,
        interval_ns: keep_series.then(|| a.interval.as_nanos().max(1) as u64),
        max_flows: a.max_flows.map(|n| n as usize),
        ..Options::default()
    };
    let (analysis, read) = analyze_file(&a.file, options)?;
    let report = PcapReport::new(&a.file, &analysis, &read);

    // The files first: a reader of stdout that stops early (`| head`) must not cost them.
    if let Some(path) = &a.json {
        let failed = |e: io::Error| format!("{}: {e}", path.display());
        let mut w = create(path)?;
        export::json(&report, &mut w).map_err(failed)?;
        w.flush().map_err(failed)?;
    }
    if let Some(path) = &a.timeseries {
        let failed = |e: io::Error| format!("{}: {e}", path.display());
        let data: Vec<(u32, &[u64])> = analysis
            .flows
            .iter()
            .chain(analysis.other.as_ref())
            .enumerate()
            .filter(|(_, f)| f.is_data())
            .map(|(i, f)| (i as u32, f.series.as_slice()))
            .collect();
        let ids: Vec<u32> = data.iter().map(|d| d.0).collect();
        let series: Vec<&[u64]> = data.iter().map(|d| d.1).collect();
        let mut w = create(path)?;
        timeseries::write(&ids, &series, a.interval.as_secs_f64(), &mut w).map_err(failed)?;
        w.flush().map_err(failed)?;
    }
    if let Some(dir) = &a.plot {
        for p in export::plots(dir, &report, &analysis)? {
            eprintln!("ibjitter pcap: wrote {}", p.display());
        }
    }
    let printed = (|| {
        let mut out = io::stdout().lock();
        export::summary(&report, &mut out)?;
        if a.flows {
            export::flow_table(&report, &mut out)?;
        }
        if a.ipd {
            export::ipd_tables(&report, &mut out)?;
        }
        out.flush()
    })();
    match printed {
        // Its reader stopped reading (`| head -1`): what it read is what it wanted.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(format!("stdout: {e}")),
        Ok(()) => {}
    }
    let name = a.file.display();
    if let Some(t) = &read.truncated {
        eprintln!("ibjitter pcap: {name}: {t}");
    }
    if report.beyond_series > 0 {
        // An interval left out reads as an idle one in the CSV: said here too.
        eprintln!(
            "ibjitter pcap: {name}: {} payload packets left out of the time series (past {} \
             intervals a flow, or {} over all flows): use a longer --interval",
            report.beyond_series,
            ibjitter::pcap::flows::MAX_SERIES_INTERVALS,
            ibjitter::pcap::flows::SERIES_BUDGET
        );
    }
    if report.aggregated_flows > 0 {
        eprintln!(
            "ibjitter pcap: {name}: more than {} flows: {}{} later flows added up in one \
             \"{}\" row (raise --max-flows to see them one by one; each takes up to {} bytes)",
            report.max_flows,
            if report.aggregated_flows_exact {
                ""
            } else {
                "at least "
            },
            report.aggregated_flows,
            ibjitter::report::pcap::OTHER_FLOWS,
            ibjitter::pcap::flows::flow_state_bound(&options),
        );
    }
    if report.backwards_timestamps > 0 {
        eprintln!(
            "ibjitter pcap: {name}: {} RoCE packets stamped before a packet read earlier \
             (merged or multi-queue capture): duration from the earliest stamp to the latest, \
             flows' times and gaps on a monotonic view (see \"timestamps\" in the report)",
            report.backwards_timestamps
        );
    }
    Ok(())
}

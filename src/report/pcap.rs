//! What `ibjitter pcap` reports: the capture's totals, each flow (counts, opcodes, gaps)
//! and the link's inter-packet delays. `export::pcap` writes it.
use crate::pcap::ipd::{Ipd, IpdRow};
use crate::pcap::reader::ReadSummary;
use crate::pcap::{decode, Analysis, Flow};
use crate::report::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Gaps of one packet stream: percentiles and the fixed-width table.
#[derive(Debug, Clone, Serialize)]
pub struct IpdReport {
    pub bin_ns: u64,
    pub gaps: u64,
    pub backwards: u64,
    pub percentiles: Latency,
    pub table: Vec<IpdRow>,
}

impl IpdReport {
    pub fn of(d: &Ipd) -> IpdReport {
        IpdReport {
            bin_ns: d.bin_ns(),
            gaps: d.count(),
            backwards: d.backwards,
            percentiles: Latency::of(d.histogram()),
            table: d.table(),
        }
    }
}

/// One flow of the capture (a second kind of flow beside the generator's [`super::FlowReport`]).
#[derive(Debug, Clone, Serialize)]
pub struct CapturedFlow {
    /// Index in order of first appearance (the time series' `flow` column).
    pub flow: u32,
    pub src: String,
    pub dst: String,
    pub dest_qp: u32,
    /// Carried application payload (not ACKs only).
    pub data: bool,
    pub packets: u64,
    pub wire_bytes: u64,
    pub payload_bytes: u64,
    pub retransmitted_bytes: u64,
    /// Seconds since the capture's first RoCE packet.
    pub first_s: f64,
    pub last_s: f64,
    pub opcodes: BTreeMap<String, u64>,
    pub requests: u64,
    pub responses: u64,
    pub ack_requests: u64,
    pub retransmissions: u64,
    pub out_of_order: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub undecoded_opcodes: u64,
    pub ipd_requests: IpdReport,
    pub ipd_responses: IpdReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct PcapReport {
    pub tool: String,
    pub file: String,
    pub format: String,
    pub frames: u64,
    pub roce_packets: u64,
    pub other_frames: u64,
    pub undecodable: u64,
    pub first_undecodable: Option<String>,
    /// Set when the file ends inside a record.
    pub truncated: Option<String>,
    /// Payload packets too late for the time series (a bogus timestamp, or a very long capture
    /// at a short interval).
    pub beyond_series: u64,
    /// Capture time of the first RoCE packet (s since the epoch).
    pub start_epoch_s: f64,
    pub duration_s: f64,
    pub flows: Vec<CapturedFlow>,
    /// Gaps between consecutive RoCE packets on the captured link, whatever their flow.
    pub ipd: IpdReport,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl PcapReport {
    pub fn new(file: &Path, a: &Analysis, read: &ReadSummary) -> PcapReport {
        let start = a.totals.first_ns.unwrap_or(0);
        let flows = a
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| captured_flow(i as u32, f, start))
            .collect();
        PcapReport {
            tool: format!("ibjitter {}", crate::VERSION),
            file: file.display().to_string(),
            format: read.format.to_string(),
            frames: a.totals.frames,
            roce_packets: a.totals.roce,
            other_frames: a.totals.other,
            undecodable: a.totals.undecodable,
            first_undecodable: a.totals.first_undecodable.clone(),
            truncated: read.truncated.clone(),
            beyond_series: a.totals.beyond_series,
            start_epoch_s: secs(start),
            duration_s: secs(a.totals.last_ns.saturating_sub(start)),
            flows,
            ipd: IpdReport::of(&a.overall),
        }
    }
}

fn captured_flow(i: u32, f: &Flow, start: u64) -> CapturedFlow {
    CapturedFlow {
        flow: i,
        src: f.key.src.to_string(),
        dst: f.key.dst.to_string(),
        dest_qp: f.key.dest_qp,
        data: f.is_data(),
        packets: f.packets,
        wire_bytes: f.wire_bytes,
        payload_bytes: f.payload_bytes,
        retransmitted_bytes: f.retransmitted_bytes,
        first_s: secs(f.first_ns.saturating_sub(start)),
        last_s: secs(f.last_ns.saturating_sub(start)),
        opcodes: f
            .opcodes
            .iter()
            .map(|(&op, &n)| (decode::opcode_name(op), n))
            .collect(),
        requests: f.requests,
        responses: f.responses,
        ack_requests: f.ack_requests,
        retransmissions: f.retransmissions,
        out_of_order: f.out_of_order,
        naks: f.naks,
        rnr_naks: f.rnr_naks,
        undecoded_opcodes: f.undecoded_opcodes,
        ipd_requests: IpdReport::of(&f.ipd_requests),
        ipd_responses: IpdReport::of(&f.ipd_responses),
    }
}

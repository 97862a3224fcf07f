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
    /// ECN-capable packets (ECT(0)/ECT(1)) and packets marked CE on the way.
    pub ect: u64,
    pub ce_marked: u64,
    /// BTH FECN / BECN bits set.
    pub fecn: u64,
    pub becn: u64,
    /// CNPs in this flow (it runs from the notification point to the sender it slows).
    pub cnps: u64,
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
    pub congestion: CongestionReport,
}

/// The capture's congestion signals: ECN marks and CNPs (DCQCN's), link-level flow control.
#[derive(Debug, Clone, Serialize)]
pub struct CongestionReport {
    /// RoCE packets with an IP header (RoCEv2): what ECN can be read from.
    pub ip_packets: u64,
    pub ect: u64,
    pub ce_marked: u64,
    pub fecn: u64,
    pub becn: u64,
    pub cnps: u64,
    pub pause_frames: u64,
    pub pfc_frames: u64,
    /// Per priority 0..7: PFC frames that paused it, and that resumed it.
    pub pfc_pauses: [u64; 8],
    pub pfc_resumes: [u64; 8],
    /// PAUSE + PFC frames per sending port.
    pub flow_control_by_port: BTreeMap<String, u64>,
    /// Per time-series interval (with --timeseries/--plot): start (s), CE marks, CNPs,
    /// PAUSE/PFC frames.
    pub series: Vec<SignalRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SignalRow {
    pub t_s: f64,
    pub ce_marked: u64,
    pub cnps: u64,
    pub flow_control: u64,
}

impl CongestionReport {
    fn of(a: &Analysis) -> CongestionReport {
        let t = &a.totals;
        let sum = |g: fn(&Flow) -> u64| a.flows.iter().map(g).sum::<u64>();
        let dt = a.options.interval_ns.unwrap_or(0) as f64 / 1e9;
        CongestionReport {
            ip_packets: t.roce_ip,
            ect: sum(|f| f.ect),
            ce_marked: sum(|f| f.ce_marked),
            fecn: sum(|f| f.fecn),
            becn: sum(|f| f.becn),
            cnps: sum(|f| f.cnps),
            pause_frames: t.pause_frames,
            pfc_frames: t.pfc_frames,
            pfc_pauses: t.pfc_pauses,
            pfc_resumes: t.pfc_resumes,
            flow_control_by_port: t
                .flow_control_by_port
                .iter()
                .map(|(m, n)| {
                    let mac: Vec<String> = m.iter().map(|b| format!("{b:02x}")).collect();
                    (mac.join(":"), *n)
                })
                .collect(),
            series: a
                .signals
                .iter()
                .enumerate()
                .map(|(k, s)| SignalRow {
                    t_s: k as f64 * dt,
                    ce_marked: s.ce_marked,
                    cnps: s.cnps,
                    flow_control: s.flow_control,
                })
                .collect(),
        }
    }
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
            congestion: CongestionReport::of(a),
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
        ect: f.ect,
        ce_marked: f.ce_marked,
        fecn: f.fecn,
        becn: f.becn,
        cnps: f.cnps,
        undecoded_opcodes: f.undecoded_opcodes,
        ipd_requests: IpdReport::of(&f.ipd_requests),
        ipd_responses: IpdReport::of(&f.ipd_responses),
    }
}

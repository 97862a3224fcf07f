//! Per-flow accounting of decoded packets. A flow is (source, destination, destination QP):
//! one direction of one connection. Each packet costs O(1) work and no allocation once its flow
//! exists, so memory grows with the number of flows (and time-series intervals), never with
//! the number of packets; and flows beyond [`Options::max_flows`] are added up in one "other
//! flows" aggregate, so it is bounded too (at most [`flow_state_bound`] bytes per flow).
//!
//! Timestamps are taken as they come, but a packet stamped before one read earlier (a merged
//! or multi-queue capture) is counted ([`Totals::backwards`], [`Flow::backwards`]): each
//! flow's first and last time are its earliest and latest stamps, the capture's duration runs
//! from the earliest to the latest, and gaps are taken on each stream's monotonic view (see
//! [`Ipd::packet`]).
use super::decode::{self, AckKind, Addr, LinkControl, LinkControlKind, Packet};
use super::ipd::Ipd;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;

/// PSNs are 24-bit and wrap.
const PSN_MOD: u32 = 1 << 24;
/// Time-series intervals kept per flow (8 MiB of counters): a bogus timestamp far in the future
/// must not allocate for every interval up to it.
pub const MAX_SERIES_INTERVALS: usize = 1 << 20;
/// Time-series intervals kept over all flows (256 MiB of counters): 500 flows of two packets
/// 10 s apart at a 10 us interval took 1 Mi intervals each (3.9 GB for a 98 KB capture).
/// Payload past it is left out of the series, counted and said (a longer `--interval` keeps it).
pub const SERIES_BUDGET: usize = 1 << 25;
/// Distinct opcodes counted per flow; packets of further ones count in
/// [`OpcodeCounts::other`] (a requester mixing every verb uses about 15).
pub const OPCODES_PER_FLOW: usize = 16;
/// The flow state [`default_max_flows`] aims at.
pub const FLOW_STATE_BUDGET: usize = 1 << 30;
/// Aggregated flows counted exactly up to this many (a set of 64-bit hashes, 72 MB at most);
/// beyond, the count is a lower bound and says so.
pub const AGGREGATED_EXACT_LIMIT: usize = 1 << 22;

/// Bytes one tracked flow holds at most with these options, everything counted: the flow,
/// its index entry (a hash table may be 7/16 full, a control byte per slot), its opcode list, and both gap streams'
/// table and sketch (and allocator headers). Not its time series (with `interval_ns`), which
/// grows with the capture's length.
pub fn flow_state_bound(o: &Options) -> usize {
    const MALLOC: usize = 16;
    let flow = std::mem::size_of::<Flow>() * 9 / 8; // the flows' Vec grows by 1/8
    let index = (std::mem::size_of::<(FlowKey, u32)>() + 1) * 16 / 7;
    let opcodes = OPCODES_PER_FLOW * std::mem::size_of::<(u8, u64)>() + MALLOC;
    let gaps = 2 * (Ipd::compact_bound(o.ipd_bins) + 2 * MALLOC);
    flow + index + opcodes + gaps
}

/// `--max-flows` by default: as many flows as [`FLOW_STATE_BUDGET`] holds at their bound.
pub fn default_max_flows(o: &Options) -> usize {
    (FLOW_STATE_BUDGET / flow_state_bound(o)).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: Addr,
    pub dst: Addr,
    pub dest_qp: u32,
}

/// What the analysis keeps besides counts.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// IPD table interval width and count (see [`Ipd::new`]).
    pub ipd_bin_ns: u64,
    pub ipd_bins: usize,
    /// Time-series interval for per-flow payload bytes; `None` keeps no series.
    pub interval_ns: Option<u64>,
    /// Flows tracked one by one, in order of first appearance; later ones are added up in
    /// one "other flows" aggregate. `None`: [`default_max_flows`].
    pub max_flows: Option<usize>,
    /// Time-series intervals kept over all flows ([`SERIES_BUDGET`]).
    pub series_budget: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ipd_bin_ns: 1000,
            ipd_bins: super::ipd::DEFAULT_BINS,
            interval_ns: None,
            max_flows: None,
            series_budget: SERIES_BUDGET,
        }
    }
}

impl Options {
    pub fn max_flows(&self) -> usize {
        // Flows are indexed by u32.
        self.max_flows
            .unwrap_or_else(|| default_max_flows(self))
            .min(u32::MAX as usize)
    }
}

/// Packets per BTH opcode, for the first [`OPCODES_PER_FLOW`] distinct opcodes of a flow.
#[derive(Debug, Clone, Default)]
pub struct OpcodeCounts {
    counts: Vec<(u8, u64)>,
    /// Packets of opcodes beyond the first [`OPCODES_PER_FLOW`] distinct ones.
    pub other: u64,
}

impl OpcodeCounts {
    fn add(&mut self, opcode: u8, n: u64) {
        if let Some(c) = self.counts.iter_mut().find(|c| c.0 == opcode) {
            c.1 += n;
        } else if self.counts.len() < OPCODES_PER_FLOW {
            if self.counts.len() == self.counts.capacity() {
                let want = (self.counts.len() * 2).clamp(2, OPCODES_PER_FLOW);
                self.counts.reserve_exact(want - self.counts.len());
            }
            self.counts.push((opcode, n));
        } else {
            self.other += n;
        }
    }

    pub fn get(&self, opcode: &u8) -> Option<&u64> {
        self.counts.iter().find(|c| c.0 == *opcode).map(|c| &c.1)
    }

    /// (opcode, packets), in order of first appearance.
    pub fn iter(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        self.counts.iter().copied()
    }
}

/// One flow's totals.
#[derive(Debug, Clone)]
pub struct Flow {
    pub key: FlowKey,
    pub packets: u64,
    /// Frame lengths on the wire (Ethernet or IB headers included).
    pub wire_bytes: u64,
    /// Application payload (WRITE / SEND / READ response data), retransmissions included.
    pub payload_bytes: u64,
    /// Payload carried by retransmitted packets (so `payload_bytes - retransmitted_bytes` is
    /// what the application moved).
    pub retransmitted_bytes: u64,
    /// The flow's earliest and latest timestamps.
    pub first_ns: u64,
    pub last_ns: u64,
    /// Packets stamped before an earlier packet of the flow.
    pub backwards: u64,
    /// Packets per BTH opcode.
    pub opcodes: OpcodeCounts,
    pub requests: u64,
    pub responses: u64,
    pub ack_requests: u64,
    /// Requests whose PSN was already seen on this flow.
    pub retransmissions: u64,
    /// Requests whose PSN skipped ahead of the next expected one (loss, reordering, or packets
    /// the capture dropped).
    pub out_of_order: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    /// Congestion signals: ECN-capable packets (ECT(0) or ECT(1)), packets a switch marked
    /// CE, BTH FECN / BECN bits, and CNPs (RoCEv2 congestion notification packets, BTH
    /// opcode 0x81: a flow of CNPs runs from the notification point back to the sender).
    pub ect: u64,
    pub ce_marked: u64,
    pub fecn: u64,
    pub becn: u64,
    pub cnps: u64,
    /// Packets with an opcode whose header layout is unknown here (payload not counted).
    pub undecoded_opcodes: u64,
    /// Gaps between the flow's requests: the sender's pacing.
    pub ipd_requests: Ipd,
    /// Gaps between the flow's responses (ACKs, READ responses).
    pub ipd_responses: Ipd,
    /// Payload bytes per time-series interval since the capture's first packet.
    pub series: Vec<u64>,
    next_psn: Option<u32>,
    /// After a READ request the requester's PSN jumps by the response length, unknown here.
    psn_jump_allowed: bool,
}

impl Flow {
    fn new(key: FlowKey, ts_ns: u64, o: &Options) -> Flow {
        Flow {
            key,
            packets: 0,
            wire_bytes: 0,
            payload_bytes: 0,
            retransmitted_bytes: 0,
            first_ns: ts_ns,
            last_ns: ts_ns,
            backwards: 0,
            opcodes: OpcodeCounts::default(),
            requests: 0,
            responses: 0,
            ack_requests: 0,
            retransmissions: 0,
            out_of_order: 0,
            naks: 0,
            rnr_naks: 0,
            ect: 0,
            ce_marked: 0,
            fecn: 0,
            becn: 0,
            cnps: 0,
            undecoded_opcodes: 0,
            ipd_requests: Ipd::compact(o.ipd_bin_ns, o.ipd_bins),
            ipd_responses: Ipd::compact(o.ipd_bin_ns, o.ipd_bins),
            series: Vec::new(),
            next_psn: None,
            psn_jump_allowed: false,
        }
    }

    /// A flow that carried application data (as opposed to ACKs only).
    pub fn is_data(&self) -> bool {
        self.payload_bytes > 0
    }

    /// Classifies a request PSN against the flow's expected next PSN.
    fn request_psn(&mut self, psn: u32, opcode: u8) -> Seq {
        let seq = match self.next_psn {
            None => Seq::InOrder,
            Some(next) => {
                let ahead = psn.wrapping_sub(next) % PSN_MOD;
                if ahead == 0 {
                    Seq::InOrder
                } else if ahead < PSN_MOD / 2 {
                    Seq::Ahead
                } else {
                    Seq::Repeat
                }
            }
        };
        if seq != Seq::Repeat {
            if seq == Seq::Ahead && !self.psn_jump_allowed {
                self.out_of_order += 1;
            }
            self.next_psn = Some((psn + 1) % PSN_MOD);
            self.psn_jump_allowed = decode::is_read_request(opcode);
        }
        seq
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seq {
    InOrder,
    Ahead,
    Repeat,
}

/// Whole-capture counts.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub frames: u64,
    /// Frames decoded to a RoCE / IBA transport packet.
    pub roce: u64,
    /// Of those, RoCEv2 packets (an IP header, so an ECN field).
    pub roce_ip: u64,
    /// Frames of other protocols (ARP, TCP, non-RoCE UDP, IB raw packets).
    pub other: u64,
    /// Frames that looked like RoCE but could not be decoded; the first reason is kept.
    pub undecodable: u64,
    pub first_undecodable: Option<String>,
    /// The first RoCE packet's timestamp (the time series' origin), the earliest and the
    /// latest.
    pub first_ns: Option<u64>,
    pub earliest_ns: u64,
    pub last_ns: u64,
    /// RoCE packets stamped before a packet read earlier (merged or multi-queue captures).
    pub backwards: u64,
    /// Payload packets left out of the series: later than [`MAX_SERIES_INTERVALS`] intervals,
    /// or past [`Options::series_budget`] over all flows.
    pub beyond_series: u64,
    /// Link-level flow control seen: 802.3x PAUSE frames, 802.1Qbb PFC frames, and per
    /// priority the PFC frames that paused it (quanta > 0) and that resumed it (quanta 0).
    pub pause_frames: u64,
    pub pfc_frames: u64,
    pub pfc_pauses: [u64; 8],
    pub pfc_resumes: [u64; 8],
    /// Flow-control frames per sending port (MAC address).
    pub flow_control_by_port: BTreeMap<[u8; 6], u64>,
}

/// Congestion signals in one time-series interval, whatever their flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    pub ce_marked: u64,
    pub cnps: u64,
    /// PAUSE and PFC frames.
    pub flow_control: u64,
}

/// Accumulates packets into flows.
pub struct Analyzer {
    options: Options,
    max_flows: usize,
    index: HashMap<FlowKey, u32>,
    flows: Vec<Flow>,
    /// Flows beyond `max_flows`, added up; and their keys' hashes, to count them.
    other: Option<Flow>,
    aggregated: HashSet<u64>,
    aggregated_flows: u64,
    aggregated_exact: bool,
    hasher: RandomState,
    /// Gaps between consecutive RoCE packets on the captured link, whatever their flow.
    overall: Ipd,
    totals: Totals,
    signals: Vec<Signals>,
    /// Time-series intervals the flows hold now, against [`Options::series_budget`].
    series_cells: usize,
}

/// The result of an analysis.
pub struct Analysis {
    /// In order of first appearance, at most `max_flows`.
    pub flows: Vec<Flow>,
    /// The flows beyond `max_flows`, added up (no PSN checks: their sequences differ).
    pub other: Option<Flow>,
    /// How many flows `other` adds up; a lower bound unless `aggregated_exact`.
    pub aggregated_flows: u64,
    pub aggregated_exact: bool,
    pub max_flows: usize,
    pub overall: Ipd,
    pub totals: Totals,
    /// Congestion signals per time-series interval (with `interval_ns` only).
    pub signals: Vec<Signals>,
    pub options: Options,
}

impl Analyzer {
    pub fn new(options: Options) -> Analyzer {
        Analyzer {
            options,
            max_flows: options.max_flows(),
            index: HashMap::new(),
            flows: Vec::new(),
            other: None,
            aggregated: HashSet::new(),
            aggregated_flows: 0,
            aggregated_exact: true,
            hasher: RandomState::new(),
            overall: Ipd::new(options.ipd_bin_ns, options.ipd_bins),
            totals: Totals::default(),
            signals: Vec::new(),
            series_cells: 0,
        }
    }

    /// The time-series interval of `ts_ns` (from the first RoCE packet, or this frame if none
    /// came yet), if a series is kept and it is within [`MAX_SERIES_INTERVALS`].
    fn interval(&self, ts_ns: u64) -> Option<usize> {
        let interval = self.options.interval_ns?;
        let start = self.totals.first_ns.unwrap_or(ts_ns);
        let k = ts_ns.saturating_sub(start) / interval;
        (k < MAX_SERIES_INTERVALS as u64).then_some(k as usize)
    }

    fn signals_at(&mut self, ts_ns: u64) -> Option<&mut Signals> {
        let k = self.interval(ts_ns)?;
        if k >= self.signals.len() {
            self.signals.resize(k + 1, Signals::default());
        }
        Some(&mut self.signals[k])
    }

    /// A PAUSE or PFC frame.
    fn link_control(&mut self, ts_ns: u64, c: LinkControl) {
        let t = &mut self.totals;
        match c.kind {
            LinkControlKind::Pause { .. } => t.pause_frames += 1,
            LinkControlKind::Pfc { enabled, quanta } => {
                t.pfc_frames += 1;
                for (k, q) in quanta.iter().enumerate() {
                    if enabled & (1 << k) != 0 {
                        if *q > 0 {
                            t.pfc_pauses[k] += 1;
                        } else {
                            t.pfc_resumes[k] += 1;
                        }
                    }
                }
            }
        }
        *t.flow_control_by_port.entry(c.src_mac).or_insert(0) += 1;
        if let Some(s) = self.signals_at(ts_ns) {
            s.flow_control += 1;
        }
    }

    /// One captured frame: decodes it and accounts for it.
    pub fn frame(&mut self, ts_ns: u64, link: decode::Link, data: &[u8], orig_len: u32) {
        self.totals.frames += 1;
        match decode::decode(link, data) {
            Ok(Some(p)) => self.packet(ts_ns, &p, orig_len),
            Ok(None) => {
                self.totals.other += 1;
                if let Some(c) = decode::link_control(link, data) {
                    self.link_control(ts_ns, c);
                }
            }
            Err(e) => {
                self.totals.undecodable += 1;
                if self.totals.first_undecodable.is_none() {
                    self.totals.first_undecodable =
                        Some(format!("frame {}: {e}", self.totals.frames));
                }
            }
        }
    }

    /// One decoded packet of `wire_len` bytes.
    pub fn packet(&mut self, ts_ns: u64, p: &Packet, wire_len: u32) {
        let t = &mut self.totals;
        t.roce += 1;
        t.roce_ip += p.ecn.is_some() as u64;
        let start = match t.first_ns {
            None => {
                t.first_ns = Some(ts_ns);
                t.earliest_ns = ts_ns;
                ts_ns
            }
            Some(start) => {
                t.backwards += (ts_ns < t.last_ns) as u64;
                t.earliest_ns = t.earliest_ns.min(ts_ns);
                start
            }
        };
        t.last_ns = t.last_ns.max(ts_ns);
        self.overall.packet(ts_ns);

        let key = FlowKey {
            src: p.src,
            dst: p.dst,
            dest_qp: p.bth.dest_qp,
        };
        let (f, tracked) = match self.index.get(&key) {
            Some(&i) => (&mut self.flows[i as usize], true),
            None if self.flows.len() < self.max_flows => {
                if self.flows.len() == self.flows.capacity() {
                    // By an eighth, not doubling: up to half the flows' memory was slack.
                    self.flows.reserve_exact((self.flows.len() / 8).max(64));
                }
                self.index.insert(key, self.flows.len() as u32);
                self.flows.push(Flow::new(key, ts_ns, &self.options));
                (self.flows.last_mut().expect("just pushed"), true)
            }
            None => {
                if self.aggregated_exact {
                    if self.aggregated.insert(self.hasher.hash_one(key)) {
                        self.aggregated_flows += 1;
                    }
                    if self.aggregated.len() >= AGGREGATED_EXACT_LIMIT {
                        // From here on, only a lower bound: the set is freed.
                        self.aggregated_exact = false;
                        self.aggregated = HashSet::new();
                    }
                }
                let options = &self.options;
                (
                    self.other
                        .get_or_insert_with(|| Flow::new(key, ts_ns, options)),
                    false,
                )
            }
        };
        f.packets += 1;
        f.wire_bytes += wire_len as u64;
        if ts_ns < f.last_ns {
            f.backwards += 1;
        }
        f.first_ns = f.first_ns.min(ts_ns);
        f.last_ns = f.last_ns.max(ts_ns);
        f.opcodes.add(p.bth.opcode, 1);
        f.ack_requests += p.bth.ack_req as u64;
        let payload = match p.payload {
            Some(n) => n as u64,
            None => {
                f.undecoded_opcodes += 1;
                0
            }
        };
        f.payload_bytes += payload;
        if let Some(a) = p.aeth {
            match a.kind() {
                AckKind::Nak(_) => f.naks += 1,
                AckKind::RnrNak => f.rnr_naks += 1,
                _ => {}
            }
        }
        f.fecn += p.bth.fecn as u64;
        f.becn += p.bth.becn as u64;
        let ce = p.ecn == Some(decode::ECN_CE);
        f.ce_marked += ce as u64;
        f.ect += matches!(p.ecn, Some(1 | 2)) as u64;
        let cnp = p.bth.opcode == decode::CNP;
        if cnp {
            // Congestion notifications are neither requests nor responses.
            f.cnps += 1;
        } else if decode::is_response(p.bth.opcode) {
            f.responses += 1;
            f.ipd_responses.packet(ts_ns);
        } else {
            f.requests += 1;
            f.ipd_requests.packet(ts_ns);
            if tracked && f.request_psn(p.bth.psn, p.bth.opcode) == Seq::Repeat {
                f.retransmissions += 1;
                f.retransmitted_bytes += payload;
            }
        }
        if let Some(interval) = self.options.interval_ns {
            if payload > 0 {
                let k = ts_ns.saturating_sub(start) / interval;
                // Counted as allocated: a Vec grown one interval at a time holds up to twice
                // its length (it doubles), and the budget is of memory.
                let (len, cap) = (f.series.len(), f.series.capacity());
                let fits = |k: u64| {
                    let need = k as usize + 1;
                    need <= len
                        || self.series_cells + need.max(cap * 2) - cap <= self.options.series_budget
                };
                if k < MAX_SERIES_INTERVALS as u64 && fits(k) {
                    let k = k as usize;
                    if k >= len {
                        f.series.resize(k + 1, 0);
                        self.series_cells += f.series.capacity() - cap;
                    }
                    f.series[k] += payload;
                } else {
                    self.totals.beyond_series += 1;
                }
            }
        }
        if ce || cnp {
            if let Some(s) = self.signals_at(ts_ns) {
                s.ce_marked += ce as u64;
                s.cnps += cnp as u64;
            }
        }
    }

    pub fn finish(self) -> Analysis {
        Analysis {
            flows: self.flows,
            other: self.other,
            aggregated_flows: self.aggregated_flows,
            aggregated_exact: self.aggregated_exact,
            max_flows: self.max_flows,
            overall: self.overall,
            totals: self.totals,
            signals: self.signals,
            options: self.options,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::decode::{Aeth, Bth};
    use std::net::Ipv4Addr;

    fn pkt(opcode: u8, qp: u32, psn: u32, payload: u32) -> Packet {
        Packet {
            src: Addr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            dst: Addr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            bth: Bth {
                opcode,
                solicited: false,
                pad: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: qp,
                ack_req: false,
                psn,
            },
            aeth: None,
            payload: Some(payload),
            ecn: Some(2),
        }
    }

    #[test]
    fn retransmissions_gaps_and_wraparound() {
        let mut a = Analyzer::new(Options {
            interval_ns: Some(1000),
            ..Options::default()
        });
        // PSNs 0xfffffe, 0xffffff, 0, then a go-back retransmission of 0xffffff and 0, then a gap.
        let psns = [0xff_fffe, 0xff_ffff, 0, 0xff_ffff, 0, 1, 5];
        for (k, psn) in psns.iter().enumerate() {
            a.packet(k as u64 * 400, &pkt(0x0a, 7, *psn, 100), 178);
        }
        let r = a.finish();
        let f = &r.flows[0];
        assert_eq!(
            (f.packets, f.requests, f.retransmissions, f.out_of_order),
            (7, 7, 2, 1)
        );
        assert_eq!(
            (f.payload_bytes, f.retransmitted_bytes, f.wire_bytes),
            (700, 200, 1246)
        );
        assert_eq!(f.series, vec![300, 200, 200]);
        assert_eq!(f.opcodes.get(&0x0a), Some(&7));
    }

    #[test]
    fn ce_marks_cnps_and_flow_control_are_counted_per_flow_and_over_time() {
        let mut a = Analyzer::new(Options {
            interval_ns: Some(1000),
            ..Options::default()
        });
        for k in 0..10u32 {
            let mut p = pkt(0x0a, 7, k, 100);
            if k % 3 == 0 {
                p.ecn = Some(decode::ECN_CE);
            }
            a.packet(u64::from(k) * 400, &p, 178);
        }
        let mut cnp = pkt(decode::CNP, 0x99, 0, 0);
        cnp.ecn = Some(0);
        a.packet(2500, &cnp, 62);
        // A PFC frame pausing priority 3 and resuming 5, then a PAUSE, from one port.
        let mut pfc = vec![
            0x01, 0x80, 0xc2, 0, 0, 0x01, 2, 0, 0, 0, 0, 9, 0x88, 0x08, 0x01, 0x01,
        ];
        pfc.extend_from_slice(&[0, 0b0010_1000]);
        for k in 0..8u16 {
            pfc.extend_from_slice(&(if k == 3 { 0xffffu16 } else { 0 }).to_be_bytes());
        }
        a.frame(3100, decode::Link::Ethernet, &pfc, pfc.len() as u32);
        let mut pause = pfc[..16].to_vec();
        pause[15] = 0x01;
        pause[14] = 0x00;
        pause.extend_from_slice(&[0xff, 0xff]);
        a.frame(3200, decode::Link::Ethernet, &pause, pause.len() as u32);
        let r = a.finish();
        let f = &r.flows[0];
        // PSNs 0, 3, 6, 9 marked; every other data packet ECN-capable.
        assert_eq!((f.ce_marked, f.ect, f.cnps), (4, 6, 0));
        assert_eq!(
            (r.flows[1].cnps, r.flows[1].ce_marked, r.flows[1].requests),
            (1, 0, 0)
        );
        let t = &r.totals;
        assert_eq!((t.pfc_frames, t.pause_frames, t.other), (1, 1, 2));
        assert_eq!(
            (t.pfc_pauses[3], t.pfc_resumes[5], t.pfc_pauses[5]),
            (1, 1, 0)
        );
        assert_eq!(t.flow_control_by_port.get(&[2, 0, 0, 0, 0, 9]), Some(&2));
        // CE-marked packets at 0, 1.2, 2.4 and 3.6 µs: one in each 1 µs interval.
        let ce: Vec<u64> = r.signals.iter().map(|s| s.ce_marked).collect();
        assert_eq!(ce, vec![1, 1, 1, 1]);
        assert_eq!(r.signals[2].cnps, 1);
        assert_eq!(r.signals[3].flow_control, 2);
    }

    #[test]
    fn a_timestamp_far_in_the_future_does_not_grow_the_series() {
        let mut a = Analyzer::new(Options {
            interval_ns: Some(1000),
            ..Options::default()
        });
        a.packet(0, &pkt(0x0a, 7, 0, 100), 178);
        a.packet(u64::MAX / 2, &pkt(0x0a, 7, 1, 100), 178);
        let r = a.finish();
        assert_eq!((r.flows[0].series.len(), r.totals.beyond_series), (1, 1));
    }

    /// Many flows of sparse packets grew one series each to the last packet's interval (500
    /// flows, two packets 10 s apart, 10 us: 3.9 GB): the intervals held over all flows stop at
    /// the budget, and what falls past it is counted.
    #[test]
    fn the_series_of_all_flows_stay_within_their_budget() {
        let mut a = Analyzer::new(Options {
            interval_ns: Some(1000),
            series_budget: 10_000,
            ..Options::default()
        });
        for qp in 0..50u32 {
            a.packet(0, &pkt(0x0a, qp, 0, 100), 178);
            a.packet(1_000_000, &pkt(0x0a, qp, 1, 100), 178);
        }
        let r = a.finish();
        let held: usize = r.flows.iter().map(|f| f.series.capacity()).sum();
        assert!(held <= 10_000, "{held}");
        // The first 9 flows reach their second packet (1001 intervals each); the others keep
        // their first and count their second as left out.
        assert_eq!(r.totals.beyond_series, 41);
    }

    #[test]
    fn read_requests_may_jump_and_naks_count() {
        let mut a = Analyzer::new(Options::default());
        a.packet(0, &pkt(0x0c, 3, 10, 0), 80);
        a.packet(1, &pkt(0x0c, 3, 14, 0), 80); // 4 response packets later: not out of order
        let mut nak = pkt(0x11, 9, 14, 0);
        nak.aeth = Some(Aeth {
            syndrome: 0x60,
            msn: 1,
        });
        a.packet(2, &nak, 62);
        let r = a.finish();
        assert_eq!(r.flows.len(), 2);
        assert_eq!(r.flows[0].out_of_order, 0);
        assert_eq!((r.flows[1].naks, r.flows[1].responses), (1, 1));
        assert!(!r.flows[1].is_data());
        assert_eq!(r.overall.count(), 2);
    }

    #[test]
    fn a_flow_holds_at_most_2_kib_and_the_default_budget_is_1_gib() {
        let o = Options::default();
        let bound = flow_state_bound(&o);
        eprintln!(
            "flow {} B inline, bound {bound} B",
            std::mem::size_of::<Flow>()
        );
        assert!(bound <= 2048, "{bound} bytes per flow");
        assert_eq!(o.max_flows(), FLOW_STATE_BUDGET / bound);
        // A flow at its worst: every opcode, both streams' gaps spread over every table
        // interval and far beyond (its sketch coarsens instead of growing).
        let mut a = Analyzer::new(o);
        let mut t = 0;
        for k in 0..20_000u64 {
            t += (k * 7919) % 100_000 + k % 3 * 1_000_000_000;
            let mut p = pkt(k as u8, 7, k as u32, 100);
            if k % 2 == 0 {
                p.bth.opcode = 0x11; // responses too
            }
            a.packet(t, &p, 178);
        }
        let r = a.finish();
        let f = &r.flows[0];
        let heap = f.ipd_requests.heap_bytes()
            + f.ipd_responses.heap_bytes()
            + f.opcodes.counts.capacity() * std::mem::size_of::<(u8, u64)>();
        assert!(
            std::mem::size_of::<Flow>() + heap <= bound,
            "{} + {heap} bytes",
            std::mem::size_of::<Flow>()
        );
        assert_eq!(f.opcodes.iter().count(), OPCODES_PER_FLOW);
        assert_eq!(
            f.opcodes.iter().map(|o| o.1).sum::<u64>() + f.opcodes.other,
            20_000
        );
    }

    #[test]
    fn flows_beyond_the_limit_are_added_up_and_counted() {
        let mut a = Analyzer::new(Options {
            max_flows: Some(3),
            ..Options::default()
        });
        for round in 0..2u32 {
            for qp in 0..10u32 {
                a.packet(u64::from(round * 10 + qp), &pkt(0x0a, qp, round, 100), 178);
            }
        }
        let r = a.finish();
        assert_eq!(r.flows.len(), 3);
        assert_eq!((r.aggregated_flows, r.aggregated_exact), (7, true));
        let other = r.other.as_ref().unwrap();
        assert_eq!((other.packets, other.payload_bytes), (14, 1400));
        // PSNs of different QPs are not one sequence: not checked.
        assert_eq!((other.out_of_order, other.retransmissions), (0, 0));
        assert_eq!(r.flows[2].packets, 2);
    }

    #[test]
    fn timestamps_going_backwards_are_counted_and_read_monotonically() {
        let mut a = Analyzer::new(Options::default());
        // A merged capture: a second interface's packets from 5 µs on, after the first's
        // up to 10 µs.
        for (t, qp) in [(1000, 1), (10_000, 1), (5000, 2), (6000, 2), (11_000, 1)] {
            a.packet(t, &pkt(0x0a, qp, t as u32, 100), 178);
        }
        let r = a.finish();
        assert_eq!(r.totals.backwards, 2);
        assert_eq!((r.totals.earliest_ns, r.totals.last_ns), (1000, 11_000));
        assert_eq!(r.flows[1].backwards, 0, "each flow in order on its own");
        assert_eq!((r.flows[1].first_ns, r.flows[1].last_ns), (5000, 6000));
        // The link-wide gaps: 9 µs, then two backwards (0), then 1 µs from the latest (10 µs).
        assert_eq!(r.overall.backwards, 2);
        assert_eq!(r.overall.count(), 4);
        let h = r.overall.histogram();
        assert!(h.equivalent(h.max(), 9000), "{}", h.max());
    }
}

//! What `ibjitter pcap` reports: the capture's totals, each flow (counts, opcodes, gaps)
//! and the link's inter-packet delays. `export::pcap` writes it. A flow's row is made when it
//! is written ([`FlowRows`]), from the analysis: a million flows are never held twice.
use crate::pcap::ipd::{Gaps, Ipd, IpdRow};
use crate::pcap::reader::ReadSummary;
use crate::pcap::sketch::{full_bucket, GapSketch};
use crate::pcap::{decode, Analysis, Flow};
use crate::report::Latency;
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::Path;

/// The `src` and `dst` of the row that adds up the flows beyond `--max-flows`.
pub const OTHER_FLOWS: &str = "(other flows)";

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
            percentiles: match d.gaps() {
                Gaps::Full(h) => Latency::of(h),
                Gaps::Sketch(s) => sketch_latency(s),
            },
            table: d.table(),
        }
    }
}

/// The figures [`Latency::of`] gives for a 3-digit HdrHistogram of the same gaps, computed
/// the same way (median-equivalent values for mean and deviation; a quantile is the highest
/// value of the bucket where its count is reached): equal to them while the sketch holds 3
/// digits, within its precision after. Min and max are exact to 3 digits either way.
pub fn sketch_latency(s: &GapSketch) -> Latency {
    if s.is_empty() {
        return Latency::default();
    }
    let n = s.len() as f64;
    let mean = s.buckets().fold(0.0, |t, (lo, hi, c)| {
        t + s.median(lo, hi) as f64 * c as f64 / n
    });
    let dev = s.buckets().fold(0.0, |t, (lo, hi, c)| {
        let d = s.median(lo, hi) as f64 - mean;
        t + d * d * c as f64
    });
    let quantile = |q: f64| {
        let target = ((q * n).ceil() as u64).max(1);
        let mut seen = 0;
        for (_, hi, c) in s.buckets() {
            seen += c;
            if seen >= target {
                return full_bucket(hi).1;
            }
        }
        full_bucket(s.max()).1
    };
    Latency {
        count: s.len(),
        min_ns: if s.min() == 0 {
            0
        } else {
            full_bucket(s.min()).0
        },
        mean_ns: mean,
        stdev_ns: (dev / n).sqrt(),
        p50_ns: quantile(0.5),
        p90_ns: quantile(0.9),
        p99_ns: quantile(0.99),
        p999_ns: quantile(0.999),
        p9999_ns: quantile(0.9999),
        max_ns: full_bucket(s.max()).1,
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
    /// Seconds since the capture's earliest RoCE packet: the flow's earliest and latest.
    pub first_s: f64,
    pub last_s: f64,
    /// Packets stamped before an earlier packet of the flow.
    pub backwards: u64,
    /// The "other flows" row only: how many flows it adds up (its PSN checks are not made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregated_flows: Option<u64>,
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

#[derive(Serialize)]
pub struct PcapReport<'a> {
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
    /// Capture time of the earliest RoCE packet (s since the epoch).
    pub start_epoch_s: f64,
    /// From the earliest RoCE packet to the latest, whatever their order in the file.
    pub duration_s: f64,
    /// RoCE packets stamped before a packet read earlier (a merged or multi-queue capture):
    /// flows' times and gaps are then taken on a monotonic view, see `timestamps`.
    pub backwards_timestamps: u64,
    /// How timestamps were read, when some went backwards.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamps: Option<String>,
    /// Flows tracked one by one (`--max-flows`); those beyond are added up in the last row,
    /// `(other flows)`.
    pub max_flows: usize,
    /// Flows added up in the `(other flows)` row (a lower bound if `aggregated_flows_exact`
    /// is false: past 4 M of them they are no longer told apart).
    pub aggregated_flows: u64,
    pub aggregated_flows_exact: bool,
    /// Over every flow (the aggregate's included).
    pub flow_totals: FlowTotals,
    pub flows: FlowRows<'a>,
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

/// Counts over every flow.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowTotals {
    /// Rows: tracked flows, and the aggregate if any.
    pub rows: usize,
    /// Flows (rows) that carried application payload.
    pub data_rows: usize,
    pub payload_bytes: u64,
    pub retransmissions: u64,
    pub out_of_order: u64,
    pub naks: u64,
    pub rnr_naks: u64,
}

/// Every flow of an analysis, then the aggregate: each row made as it is read.
pub struct FlowRows<'a> {
    flows: &'a [Flow],
    other: Option<(&'a Flow, u64)>,
    start: u64,
}

impl<'a> FlowRows<'a> {
    pub fn len(&self) -> usize {
        self.flows.len() + self.other.is_some() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = CapturedFlow> + 'a {
        let start = self.start;
        let n = self.flows.len();
        self.flows
            .iter()
            .enumerate()
            .map(move |(i, f)| captured_flow(i as u32, f, start, None))
            .chain(
                self.other
                    .map(move |(f, k)| captured_flow(n as u32, f, start, Some(k))),
            )
    }
}

impl Serialize for FlowRows<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Every flow of `a`, the aggregate included.
fn all_flows(a: &Analysis) -> impl Iterator<Item = &Flow> {
    a.flows.iter().chain(a.other.as_ref())
}

impl CongestionReport {
    fn of(a: &Analysis) -> CongestionReport {
        let t = &a.totals;
        let sum = |g: fn(&Flow) -> u64| all_flows(a).map(g).sum::<u64>();
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

impl<'a> PcapReport<'a> {
    pub fn new(file: &Path, a: &'a Analysis, read: &ReadSummary) -> PcapReport<'a> {
        let start = a.totals.first_ns.map_or(0, |_| a.totals.earliest_ns);
        let flows = FlowRows {
            flows: &a.flows,
            other: a.other.as_ref().map(|f| (f, a.aggregated_flows)),
            start,
        };
        let sum = |g: fn(&Flow) -> u64| all_flows(a).map(g).sum::<u64>();
        let flow_totals = FlowTotals {
            rows: flows.len(),
            data_rows: all_flows(a).filter(|f| f.is_data()).count(),
            payload_bytes: sum(|f| f.payload_bytes),
            retransmissions: sum(|f| f.retransmissions),
            out_of_order: sum(|f| f.out_of_order),
            naks: sum(|f| f.naks),
            rnr_naks: sum(|f| f.rnr_naks),
        };
        let backwards = a.totals.backwards;
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
            backwards_timestamps: backwards,
            timestamps: (backwards > 0).then(|| {
                format!(
                    "{backwards} RoCE packets were stamped before a packet read earlier (a merged or \
                     multi-queue capture): the duration runs from the earliest stamp to the \
                     latest; each flow's first/last are its earliest/latest stamps; gaps are taken \
                     on each stream's monotonic view (a packet stamped before the latest one of \
                     its stream is a gap of 0, the next gap runs from the latest); the time \
                     series counts packets stamped before the first packet in its first interval"
                )
            }),
            max_flows: a.max_flows,
            aggregated_flows: a.aggregated_flows,
            aggregated_flows_exact: a.aggregated_exact,
            flow_totals,
            flows,
            ipd: IpdReport::of(&a.overall),
            congestion: CongestionReport::of(a),
        }
    }
}

/// Row `i`: flow `f`, or with `aggregated` the flows beyond `--max-flows` added up.
fn captured_flow(i: u32, f: &Flow, start: u64, aggregated: Option<u64>) -> CapturedFlow {
    let mut opcodes: BTreeMap<String, u64> = f
        .opcodes
        .iter()
        .map(|(op, n)| (decode::opcode_name(op), n))
        .collect();
    if f.opcodes.other > 0 {
        opcodes.insert("other opcodes".into(), f.opcodes.other);
    }
    let name = |a: &decode::Addr| match aggregated {
        Some(_) => OTHER_FLOWS.to_string(),
        None => a.to_string(),
    };
    CapturedFlow {
        flow: i,
        src: name(&f.key.src),
        dst: name(&f.key.dst),
        dest_qp: if aggregated.is_some() {
            0
        } else {
            f.key.dest_qp
        },
        data: f.is_data(),
        packets: f.packets,
        wire_bytes: f.wire_bytes,
        payload_bytes: f.payload_bytes,
        retransmitted_bytes: f.retransmitted_bytes,
        first_s: secs(f.first_ns.saturating_sub(start)),
        last_s: secs(f.last_ns.saturating_sub(start)),
        backwards: f.backwards,
        aggregated_flows: aggregated,
        opcodes,
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

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    fn both(gaps: impl Iterator<Item = u64>) -> (GapSketch, Histogram<u64>) {
        let mut s = GapSketch::default();
        let mut h = crate::gen::histogram::new_histogram();
        for g in gaps {
            s.record(g);
            h.record(g).unwrap();
        }
        (s, h)
    }

    #[test]
    fn a_flow_with_few_distinct_gaps_reports_what_a_full_histogram_does() {
        let mut seed = 7;
        let (s, h) = both((0..10_000u64).map(|k| {
            // Pacing: a few gap values, 0 (same tick), and a rare long one.
            [0, 2000, 2016, 4000, 12_000][(lcg(&mut seed) % 5) as usize]
                + if k % 997 == 0 { 5_000_000 } else { 0 }
        }));
        let (a, b) = (sketch_latency(&s), Latency::of(&h));
        assert_eq!(
            (a.count, a.min_ns, a.p50_ns, a.p90_ns, a.p99_ns, a.p999_ns, a.p9999_ns, a.max_ns),
            (b.count, b.min_ns, b.p50_ns, b.p90_ns, b.p99_ns, b.p999_ns, b.p9999_ns, b.max_ns)
        );
        assert_eq!(s.relative_precision(), 1.0 / 1024.0);
        assert!(
            (a.mean_ns - b.mean_ns).abs() <= 1e-9 * b.mean_ns,
            "{a:?} {b:?}"
        );
        assert!(
            (a.stdev_ns - b.stdev_ns).abs() <= 1e-9 * b.stdev_ns,
            "{a:?} {b:?}"
        );
        assert_eq!(Latency::of(&s.histogram()).p99_ns, b.p99_ns);
    }

    #[test]
    fn a_flow_with_spread_gaps_reports_them_within_the_sketchs_precision() {
        let mut seed = 3;
        // Jitter: 10-40 µs (two powers of two), every 3-digit bucket a different one.
        let (s, h) = both((0..100_000).map(|_| 10_000 + lcg(&mut seed) % 30_000));
        let (a, b) = (sketch_latency(&s), Latency::of(&h));
        let precision = s.relative_precision();
        assert!(
            precision > 1.0 / 1024.0 && precision <= 1.0 / 16.0,
            "{precision}"
        );
        assert_eq!((a.count, a.min_ns, a.max_ns), (b.count, b.min_ns, b.max_ns));
        for (x, y) in [
            (a.p50_ns, b.p50_ns),
            (a.p90_ns, b.p90_ns),
            (a.p99_ns, b.p99_ns),
            (a.p999_ns, b.p999_ns),
        ] {
            assert!(
                (x as f64 / y as f64 - 1.0).abs() <= precision,
                "{x} vs {y} at {precision}"
            );
        }
        assert!((a.mean_ns / b.mean_ns - 1.0).abs() <= precision / 2.0);
    }
}

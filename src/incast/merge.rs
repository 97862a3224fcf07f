//! One report out of every sender's: flows numbered across senders, latency histograms added
//! exactly, time series aligned on the senders' common start (a sender whose clock is off
//! placed at the others', see [`super::clocks`]), fairness over all flows; the launch to the
//! first byte unless the senders' clocks are off alike.
use super::clocks::Clocks;
use crate::gen::intervals::{MIN_HDR_INTERVAL_NS, MIN_INTERVAL_NS};
use crate::gen::stats::new_histogram;
use crate::report::incast::{IncastFlow, IncastReport, Merged, SenderSummary};
use crate::report::ops::OpReport;
use crate::report::{hist, jain, spread_us, Latency, RunReport, Totals};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Merges the senders' reports (`None` where a sender produced none), their starts placed by
/// `clocks`. `launch_unix_ns` is when the first process was launched.
pub fn merge(
    receiver: &str,
    flows_per_sender: u32,
    reports: &[Option<RunReport>],
    mut senders: Vec<SenderSummary>,
    clocks: &Clocks,
    launch_unix_ns: u64,
) -> Merged {
    let mut latency = new_histogram();
    let mut flows = Vec::new();
    let mut ids = Vec::new();
    let mut series = Vec::new();
    // Intervals no `run` sends (0, NaN, below its floors) would make the shifts below
    // unbounded.
    let interval_s = reports
        .iter()
        .flatten()
        .map(|r| r.series_interval_s)
        .find(|&s| s >= MIN_INTERVAL_NS as f64 / 1e9 && s.is_finite())
        .unwrap_or(0.01);
    let t0 = reports
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some(clocks.start_of(k, r.as_ref()?.start_unix_ns)))
        .min()
        .unwrap_or(0);
    let mut firsts = Vec::new();
    let mut duration_s: f64 = 0.0;
    let latency_interval_s = reports
        .iter()
        .flatten()
        .map(|r| r.latency_interval_s)
        .find(|&s| s >= MIN_HDR_INTERVAL_NS as f64 / 1e9 && s.is_finite())
        .unwrap_or(0.0);
    let mut latency_intervals: Vec<hdrhistogram::Histogram<u64>> = Vec::new();
    let mut sender_latency = vec![None; senders.len()];
    let mut by_op: BTreeMap<String, (OpReport, Histogram<u64>)> = BTreeMap::new();
    for (k, (report, summary)) in reports.iter().zip(senders.iter_mut()).enumerate() {
        let Some(r) = report else { continue };
        summary.flows_requested = r.flows_requested;
        summary.flows_started = r.flows_started;
        summary.ops = r.total.ops;
        summary.bytes = r.total.bytes;
        summary.gbps = r.total.gbps;
        summary.port_counters = r.port_counters.clone();
        summary.outcome = Some(r.outcome);
        match hist::decode(&r.histogram) {
            Ok(h) => {
                latency.add(&h).expect("same histogram bounds");
                sender_latency[k] = Some(h);
            }
            Err(e) => {
                summary.status = format!("{} (latency histogram unreadable: {e})", summary.status)
            }
        }
        add_ops(&mut by_op, r, sender_latency[k].as_ref());
        // Within the step's bound of t0: the shifts below stay within the step's length.
        let start = clocks.start_of(k, r.start_unix_ns);
        if let Some(off) = clocks.off(k) {
            say(&mut summary.status, off);
        }
        let offset_ns = start - t0;
        // No sender ran longer than the step (a duration past it panicked the export).
        let ran_s = if (0.0..=clocks.bound_s()).contains(&r.duration_s) {
            r.duration_s
        } else {
            let counted = if r.duration_s > 0.0 {
                clocks.bound_s()
            } else {
                0.0
            };
            say(
                &mut summary.status,
                format!(
                    "reported it ran {:e} s, not within the {:.1} s this step allows: counted as \
                     {counted:.1} s",
                    r.duration_s,
                    clocks.bound_s()
                ),
            );
            counted
        };
        duration_s = duration_s.max(offset_ns as f64 / 1e9 + ran_s);
        // Latency intervals, shifted onto the common time axis like the series.
        if latency_interval_s > 0.0 {
            let shift = (offset_ns as f64 / 1e9 / latency_interval_s).round() as usize;
            for (k, text) in r.latency_intervals.iter().flatten().enumerate() {
                let Ok(h) = hist::decode(text) else { continue };
                if shift + k >= latency_intervals.len() {
                    latency_intervals.resize_with(shift + k + 1, new_histogram);
                }
                latency_intervals[shift + k]
                    .add(&h)
                    .expect("histograms grow to fit");
            }
        }
        // Series start at this sender's start: shift them onto the common time axis.
        let shift = (offset_ns as f64 / 1e9 / interval_s).round() as usize;
        let mut strays = (0, None);
        for f in &r.flows {
            // Sender k's flow i is k * flows_per_sender + i: a flow numbered past the request
            // would take another sender's id (or wrap), so it is left out and said.
            let Some(id) = flow_id(k, flows_per_sender, f.flow) else {
                strays = (strays.0 + 1, strays.1.or(Some(f.flow)));
                continue;
            };
            if let Some(first) = f.first_post_ns {
                firsts.push(start.saturating_add(first));
            }
            flows.push(IncastFlow {
                id,
                sender: summary.host.clone(),
                flow: f.flow,
                ops: f.ops,
                bytes: f.bytes,
                gbps: f.gbps,
                status: f.status.clone(),
                latency: f.latency.clone(),
            });
            let mut s = vec![0; shift];
            s.extend(f.series.as_deref().unwrap_or(&[]));
            ids.push(id);
            series.push(s);
        }
        if let (n, Some(first)) = strays {
            say(
                &mut summary.status,
                format!(
                    "reported {n} flows numbered past the {flows_per_sender} requested (flow \
                     {first}): left out of the per-flow figures"
                ),
            );
        }
    }
    let (ops, bytes) = flows
        .iter()
        .fold((0, 0), |(o, b), f| (o + f.ops, b + f.bytes));
    let duration_s = duration_s.max(f64::MIN_POSITIVE);
    let rates: Vec<f64> = flows.iter().map(|f| f.gbps).collect();
    let skew_us = spread_us(&firsts);
    // Measured from this machine's launch on the senders' clocks: unknown where they are off.
    let first_byte_s = clocks.common_skew.is_none().then(|| {
        firsts
            .iter()
            .min()
            .map_or(0.0, |&f| f.saturating_sub(launch_unix_ns) as f64 / 1e9)
    });
    let report = IncastReport {
        tool: format!("ibjitter {}", crate::VERSION),
        receiver: receiver.to_string(),
        flows_per_sender,
        // The CLI keeps it within 32 bits; saturated rather than wrapped if not.
        flows_requested: u32::try_from(u64::from(flows_per_sender) * senders.len() as u64)
            .unwrap_or(u32::MAX),
        flows_started: firsts.len() as u32,
        launch_to_first_byte_s: first_byte_s,
        clock_note: clocks.common_off(),
        stopped: None,
        start_skew_us: skew_us,
        duration_s,
        total: Totals::new(ops, bytes, duration_s, &latency),
        fairness: jain(&rates),
        senders,
        flows,
        pattern: None,
        pairs: None,
        ops: by_op
            .into_iter()
            .map(|(name, (op, h))| {
                let latency = Latency::of(&h);
                (name, OpReport { latency, ..op })
            })
            .collect(),
    };
    Merged {
        report,
        latency,
        sender_latency,
        latency_intervals,
        latency_interval_s,
        start_unix_ns: t0,
        series_interval_s: interval_s,
        ids,
        series,
    }
}

/// Says `what` in a sender's status: in place of "ok", else after what it already says.
fn say(status: &mut String, what: String) {
    *status = if status == "ok" {
        what
    } else {
        format!("{status} ({what})")
    };
}

/// The id of sender `k`'s flow `flow` across senders, `k * flows_per_sender + flow`; `None` for
/// a flow numbered past the request or an id past 32 bits.
fn flow_id(k: usize, flows_per_sender: u32, flow: u32) -> Option<u32> {
    if flow >= flows_per_sender {
        return None;
    }
    let id = (k as u64).checked_mul(u64::from(flows_per_sender))? + u64::from(flow);
    u32::try_from(id).ok()
}

/// Adds a sender's figures by op type: its op's own histogram with a mix, the run's (`all`)
/// when it ran one op.
fn add_ops(
    by_op: &mut BTreeMap<String, (OpReport, Histogram<u64>)>,
    r: &RunReport,
    all: Option<&Histogram<u64>>,
) {
    for (name, op) in &r.ops {
        let (sum, h) = by_op
            .entry(name.clone())
            .or_insert_with(|| (OpReport::default(), new_histogram()));
        sum.count += op.count;
        sum.bytes += op.bytes;
        if let Some(s) = op.swapped {
            *sum.swapped.get_or_insert(0) += s;
        }
        let own = (!op.histogram.is_empty())
            .then(|| hist::decode(&op.histogram).ok())
            .flatten();
        match (own, all) {
            (Some(own), _) => h.add(&own).expect("histograms grow to fit"),
            (None, Some(all)) if r.ops.len() == 1 => h.add(all).expect("histograms grow to fit"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_ids_are_unique_across_senders_or_none() {
        assert_eq!(flow_id(0, 2, 1), Some(1));
        assert_eq!(flow_id(1, 2, 0), Some(2));
        assert_eq!(flow_id(0, 2, 2), None);
        assert_eq!(flow_id(1, u32::MAX, 0), Some(u32::MAX));
        assert_eq!(flow_id(1, u32::MAX, 1), None);
        assert_eq!(flow_id(usize::MAX, u32::MAX, 0), None);
    }
}

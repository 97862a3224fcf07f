//! Per-pair figures of a pattern across hosts (`incast --pattern`): one cell per (sender,
//! receiver) pair that the pattern has, summed over the steps it appeared in, and the same
//! figures as sender × receiver matrices (null where the pattern has no such pair).
//!
//! The pair types are part of an incast's report, so they are defined in [`super::incast`]
//! (re-exported here); this module computes them from the merged steps.
use crate::gen::stats::new_histogram;
use crate::report::incast::Merged;
pub use crate::report::incast::{PairCell, PairMatrix};
use crate::report::{us, Latency};
use hdrhistogram::Histogram;

/// A pair's cell while its steps are added, with its latency histogram.
type Accumulating = (PairCell, Histogram<u64>);

impl PairMatrix {
    /// The pairs of every step in `steps`, over `hosts` (names as the senders' summaries
    /// give them).
    pub fn of(hosts: &[String], steps: &[&Merged]) -> PairMatrix {
        let n = hosts.len();
        let index = |name: &str| hosts.iter().position(|h| h == name);
        let mut cells: Vec<Vec<Option<Accumulating>>> = vec![vec![None; n]; n];
        for m in steps {
            for (k, s) in m.report.senders.iter().enumerate() {
                let (Some(i), Some(j)) = (index(&s.host), index(&s.receiver)) else {
                    continue;
                };
                let (cell, h) = cells[i][j].get_or_insert_with(|| {
                    let cell = PairCell {
                        sender: s.host.clone(),
                        receiver: s.receiver.clone(),
                        steps: 0,
                        status: "ok".into(),
                        flows_requested: 0,
                        flows_started: 0,
                        ops: 0,
                        bytes: 0,
                        gbps: 0.0,
                        latency: Latency::default(),
                    };
                    (cell, new_histogram())
                });
                cell.steps += 1;
                if cell.status == "ok" && s.status != "ok" {
                    cell.status = s.status.clone();
                }
                cell.flows_requested += s.flows_requested;
                cell.flows_started += s.flows_started;
                cell.ops += s.ops;
                cell.bytes += s.bytes;
                // A running mean over the steps.
                cell.gbps += (s.gbps - cell.gbps) / cell.steps as f64;
                if let Some(Some(l)) = m.sender_latency.get(k) {
                    h.add(l).expect("histograms grow to fit");
                }
            }
        }
        for row in &mut cells {
            for (cell, h) in row.iter_mut().flatten() {
                cell.latency = Latency::of(h);
            }
        }
        let grid = |f: &dyn Fn(&PairCell) -> f64| -> Vec<Vec<Option<f64>>> {
            cells
                .iter()
                .map(|row| row.iter().map(|c| c.as_ref().map(|(c, _)| f(c))).collect())
                .collect()
        };
        let mut pairs = Vec::new();
        let m = PairMatrix {
            hosts: hosts.to_vec(),
            gbps: grid(&|c| c.gbps),
            bytes: cells
                .iter()
                .map(|r| r.iter().map(|c| c.as_ref().map(|(c, _)| c.bytes)).collect())
                .collect(),
            flows_started: cells
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|c| c.as_ref().map(|(c, _)| c.flows_started))
                        .collect()
                })
                .collect(),
            p50_us: grid(&|c| us(c.latency.p50_ns)),
            p99_us: grid(&|c| us(c.latency.p99_ns)),
            pairs: Vec::new(),
        };
        for row in cells {
            pairs.extend(row.into_iter().flatten().map(|(c, _)| c));
        }
        PairMatrix { pairs, ..m }
    }

    /// Pairs that moved nothing or failed.
    pub fn idle_or_failed(&self) -> impl Iterator<Item = &PairCell> {
        self.pairs
            .iter()
            .filter(|c| c.bytes == 0 || c.status != "ok")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::incast::{IncastReport, SenderSummary};
    use crate::report::Totals;

    fn sender(host: &str, to: &str, status: &str, bytes: u64, gbps: f64) -> SenderSummary {
        SenderSummary {
            host: host.into(),
            receiver: to.into(),
            status: status.into(),
            exit_code: Some(0),
            outcome: None,
            flows_requested: 2,
            flows_started: 2,
            ops: bytes / 4096,
            bytes,
            gbps,
            port_counters: Default::default(),
            stderr_tail: String::new(),
        }
    }

    /// A step whose senders' latencies are all `latency_ns`.
    fn step(senders: Vec<SenderSummary>, latency_ns: u64) -> Merged {
        let h = |n: u64| {
            let mut h = new_histogram();
            h.record_n(latency_ns, n).unwrap();
            h
        };
        let sender_latency = senders.iter().map(|s| Some(h(s.ops))).collect();
        let latency = new_histogram();
        Merged {
            report: IncastReport {
                tool: String::new(),
                receiver: String::new(),
                stopped: None,
                flows_per_sender: 2,
                flows_requested: 0,
                flows_started: 0,
                launch_to_first_byte_s: Some(0.0),
                clock_note: None,
                start_skew_us: 0.0,
                duration_s: 1.0,
                total: Totals::new(0, 0, 1.0, &latency),
                fairness: 1.0,
                senders,
                flows: Vec::new(),
                pattern: None,
                pairs: None,
                ops: Default::default(),
            },
            latency,
            sender_latency,
            latency_intervals: Vec::new(),
            latency_interval_s: 0.0,
            start_unix_ns: 0,
            series_interval_s: 0.01,
            ids: Vec::new(),
            series: Vec::new(),
        }
    }

    #[test]
    fn pairs_add_up_over_steps_and_the_matrix_is_null_where_no_pair_is() {
        let hosts: Vec<String> = ["a", "b", "c"].map(String::from).into();
        // A rotating incast that comes round to sink a again.
        let one = step(
            vec![
                sender("b", "a", "ok", 4096 * 10, 1.0),
                sender("c", "a", "ok", 4096 * 20, 2.0),
            ],
            1_000,
        );
        let two = step(vec![sender("a", "b", "ok", 4096 * 5, 0.5)], 3_000);
        let three = step(
            vec![
                sender("b", "a", "exit status 1", 4096 * 30, 3.0),
                sender("c", "a", "ok", 0, 0.0),
            ],
            2_000,
        );
        let m = PairMatrix::of(&hosts, &[&one, &two, &three]);
        assert_eq!(m.pairs.len(), 3);
        let ba = m.pairs.iter().find(|c| c.sender == "b").unwrap();
        assert_eq!((ba.steps, ba.bytes, ba.ops), (2, 4096 * 40, 40));
        assert_eq!(ba.gbps, 2.0); // the mean of its steps' 1.0 and 3.0
        assert_eq!(ba.status, "exit status 1");
        assert_eq!(ba.latency.count, 40);
        assert_eq!(m.gbps[1][0], Some(2.0));
        assert_eq!(m.bytes[2][0], Some(4096 * 20));
        assert_eq!(m.flows_started[0][1], Some(2));
        // The histograms keep 3 significant digits.
        let p99 = m.p99_us[0][1].unwrap();
        assert!((p99 - 3.0).abs() <= 0.003, "{p99}");
        for (s, d) in [(0, 0), (1, 1), (2, 2), (0, 2), (1, 2), (2, 1)] {
            assert_eq!(m.gbps[s][d], None, "{s}->{d}");
        }
        // b->a failed once; c->a moved nothing in its second step but did in its first.
        let flagged: Vec<_> = m.idle_or_failed().map(|c| c.sender.as_str()).collect();
        assert_eq!(flagged, ["b"]);
    }
}

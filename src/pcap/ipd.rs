//! Inter-packet delay: the gap between consecutive packets of one stream, kept two ways — the
//! fixed-width table of the IB packet-capture talk (interval, occurrences, percentage), which
//! shows link pacing at a glance (2 µs per 2 KiB packet at 8 Gb/s, 4 µs when two senders
//! share it), and an HdrHistogram for percentiles of the long tail.
use hdrhistogram::Histogram;
use serde::Serialize;

/// Number of fixed-width intervals before the open-ended last one.
pub const DEFAULT_BINS: usize = 50;

/// The gaps of one packet stream.
#[derive(Debug, Clone)]
pub struct Ipd {
    last_ns: Option<u64>,
    bin_ns: u64,
    /// `bins[k]` counts gaps in [k·bin, (k+1)·bin); the last one every gap beyond.
    bins: Vec<u64>,
    hist: Histogram<u64>,
    /// Gaps where the timestamp went backwards (merged multi-interface captures); recorded as 0.
    pub backwards: u64,
}

/// One row of the table form.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IpdRow {
    pub from_ns: u64,
    /// `None` for the open-ended last interval.
    pub to_ns: Option<u64>,
    pub occurrences: u64,
    pub percent: f64,
}

impl Ipd {
    /// `bin_ns` wide intervals, `bins` of them before the open-ended one.
    pub fn new(bin_ns: u64, bins: usize) -> Ipd {
        // Gaps have no natural upper bound (idle minutes), so the histogram auto-resizes; it
        // records 0 for packets stamped in the same tick.
        let mut hist = Histogram::new(3).expect("3 significant digits is valid");
        hist.auto(true);
        Ipd {
            last_ns: None,
            bin_ns: bin_ns.max(1),
            bins: vec![0; bins + 1],
            hist,
            backwards: 0,
        }
    }

    /// A packet of the stream at `ts_ns`: records the gap from the previous one.
    pub fn packet(&mut self, ts_ns: u64) {
        if let Some(last) = self.last_ns.replace(ts_ns) {
            let gap = match ts_ns.checked_sub(last) {
                Some(g) => g,
                None => {
                    self.backwards += 1;
                    0
                }
            };
            self.record(gap);
        }
    }

    fn record(&mut self, gap_ns: u64) {
        let k = ((gap_ns / self.bin_ns) as usize).min(self.bins.len() - 1);
        self.bins[k] += 1;
        // `record` grows the auto-resizing histogram; saturating_record would clamp instead.
        if self.hist.record(gap_ns).is_err() {
            self.hist.saturating_record(gap_ns);
        }
    }

    /// Gaps recorded (one fewer than the packets seen).
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    pub fn bin_ns(&self) -> u64 {
        self.bin_ns
    }

    /// The non-empty intervals, in order, with their share of all gaps.
    pub fn table(&self) -> Vec<IpdRow> {
        let total = self.count().max(1) as f64;
        let last = self.bins.len() - 1;
        self.bins
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| IpdRow {
                from_ns: k as u64 * self.bin_ns,
                to_ns: (k < last).then(|| (k as u64 + 1) * self.bin_ns),
                occurrences: n,
                percent: n as f64 * 100.0 / total,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_senders_sharing_a_link_double_each_flows_gap() {
        // The talk's example: a 2 µs gap on the link, 4 µs within each of two flows.
        let (mut link, mut a, mut b) = (Ipd::new(1000, 10), Ipd::new(1000, 10), Ipd::new(1000, 10));
        for k in 0..100u64 {
            let t = k * 2000;
            link.packet(t);
            if k % 2 == 0 {
                a.packet(t)
            } else {
                b.packet(t)
            }
        }
        assert_eq!(
            link.table(),
            vec![IpdRow {
                from_ns: 2000,
                to_ns: Some(3000),
                occurrences: 99,
                percent: 100.0
            }]
        );
        assert_eq!(a.table()[0].from_ns, 4000);
        assert_eq!(a.count(), 49);
        let h = b.histogram();
        assert!(h.equivalent(h.value_at_quantile(0.5), 4000));
    }

    #[test]
    fn overflow_and_backwards_gaps() {
        let mut d = Ipd::new(1000, 3);
        for t in [0, 500, 10_000_000, 9_000_000] {
            d.packet(t);
        }
        let rows = d.table();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].from_ns, rows[0].occurrences), (0, 2)); // 500 ns and the backwards one
        assert_eq!(
            (rows[1].from_ns, rows[1].to_ns, rows[1].occurrences),
            (3000, None, 1)
        );
        assert_eq!(d.backwards, 1);
        assert!((rows.iter().map(|r| r.percent).sum::<f64>() - 100.0).abs() < 1e-9);
        assert!(d.histogram().max() >= 9_999_000);
    }
}

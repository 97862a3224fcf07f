//! Inter-packet delay: the gap between consecutive packets of one stream, kept two ways — the
//! fixed-width table of the IB packet-capture talk (interval, occurrences, percentage), which
//! shows link pacing at a glance (2 µs per 2 KiB packet at 8 Gb/s, 4 µs when two senders
//! share it), and for percentiles of the long tail an HdrHistogram (the link-wide stream) or,
//! per flow, a bounded [`GapSketch`] of the same buckets.
use super::sketch::GapSketch;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::borrow::Cow;

/// Number of fixed-width intervals before the open-ended last one.
pub const DEFAULT_BINS: usize = 50;

/// The gaps of one packet stream.
#[derive(Debug, Clone)]
pub struct Ipd {
    /// The latest timestamp so far: gaps are taken on this monotonic view, so a packet stamped
    /// before it (merged or multi-queue captures) is a gap of 0, and the next gap runs from the
    /// latest stamp, not from the stray one.
    last_ns: u64,
    /// No packet yet (`last_ns` unset).
    idle: bool,
    bin_count: u32,
    bin_ns: u64,
    /// `bins[k]` counts gaps in [k·bin, (k+1)·bin); the last one every gap beyond.
    bins: Bins,
    gaps: Gaps,
    /// Gaps where the timestamp went backwards (merged multi-interface captures); recorded as 0.
    pub backwards: u64,
}

/// The table's counters. A flow's are allocated at its first gap (most flows of a many-flow
/// capture have none) and are 32-bit until one would overflow (half the bytes per flow).
#[derive(Debug, Clone)]
enum Bins {
    None,
    Narrow(Box<[u32]>),
    Wide(Box<[u64]>),
}

impl Bins {
    fn add(&mut self, k: usize) {
        match self {
            Bins::Wide(b) => b[k] += 1,
            Bins::Narrow(b) => match b[k].checked_add(1) {
                Some(n) => b[k] = n,
                None => {
                    let mut wide: Box<[u64]> = b.iter().map(|&n| n as u64).collect();
                    wide[k] += 1;
                    *self = Bins::Wide(wide);
                }
            },
            Bins::None => unreachable!("allocated before the first gap is counted"),
        }
    }

    fn get(&self, k: usize) -> u64 {
        match self {
            Bins::Wide(b) => b[k],
            Bins::Narrow(b) => b[k] as u64,
            Bins::None => 0,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Bins::Wide(b) => b.len() * 8,
            Bins::Narrow(b) => b.len() * 4,
            Bins::None => 0,
        }
    }
}

/// Where the percentiles come from.
#[derive(Debug, Clone)]
pub enum Gaps {
    /// An auto-resizing 3-digit HdrHistogram (16-40 KiB): the link-wide stream.
    Full(Box<Histogram<u64>>),
    /// A flow's: the same buckets, at most a few hundred bytes.
    Sketch(GapSketch),
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
    /// `bin_ns` wide intervals, `bins` of them before the open-ended one; percentiles from a
    /// full HdrHistogram.
    pub fn new(bin_ns: u64, bins: usize) -> Ipd {
        // Gaps have no natural upper bound (idle minutes), so the histogram auto-resizes; it
        // records 0 for packets stamped in the same tick.
        let mut hist = Histogram::new(3).expect("3 significant digits is valid");
        hist.auto(true);
        let mut d = Ipd::compact(bin_ns, bins);
        d.bins = Bins::Wide(vec![0; bins + 1].into());
        d.gaps = Gaps::Full(Box::new(hist));
        d
    }

    /// The same for one flow of many: percentiles from a bounded sketch, nothing allocated
    /// before the first gap.
    pub fn compact(bin_ns: u64, bins: usize) -> Ipd {
        Ipd {
            last_ns: 0,
            idle: true,
            bin_count: u32::try_from(bins + 1).expect("fewer than 2^32 IPD bins"),
            bin_ns: bin_ns.max(1),
            bins: Bins::None,
            gaps: Gaps::Sketch(GapSketch::default()),
            backwards: 0,
        }
    }

    /// Heap bytes a compact one holds at most with `bins` table intervals (unless one of its
    /// intervals counts more than 2^32 gaps).
    pub fn compact_bound(bins: usize) -> usize {
        (bins + 1) * 4 + super::sketch::MAX_BUCKETS * 8
    }

    /// A packet of the stream at `ts_ns`: records the gap from the latest one before it.
    pub fn packet(&mut self, ts_ns: u64) {
        if self.idle {
            self.idle = false;
            self.last_ns = ts_ns;
        } else if ts_ns >= self.last_ns {
            let gap = ts_ns - self.last_ns;
            self.last_ns = ts_ns;
            self.record(gap);
        } else {
            self.backwards += 1;
            self.record(0);
        }
    }

    fn record(&mut self, gap_ns: u64) {
        if let Bins::None = self.bins {
            self.bins = Bins::Narrow(vec![0; self.bin_count as usize].into());
        }
        let k = ((gap_ns / self.bin_ns) as usize).min(self.bin_count as usize - 1);
        self.bins.add(k);
        match &mut self.gaps {
            Gaps::Full(hist) => {
                // `record` grows the auto-resizing histogram; saturating_record would clamp.
                if hist.record(gap_ns).is_err() {
                    hist.saturating_record(gap_ns);
                }
            }
            Gaps::Sketch(s) => s.record(gap_ns),
        }
    }

    /// Gaps recorded (one fewer than the packets seen).
    pub fn count(&self) -> u64 {
        match &self.gaps {
            Gaps::Full(hist) => hist.len(),
            Gaps::Sketch(s) => s.len(),
        }
    }

    pub fn gaps(&self) -> &Gaps {
        &self.gaps
    }

    /// The gaps as a 3-digit HdrHistogram (built from a flow's sketch: exact while it holds
    /// 3 digits).
    pub fn histogram(&self) -> Cow<'_, Histogram<u64>> {
        match &self.gaps {
            Gaps::Full(hist) => Cow::Borrowed(hist),
            Gaps::Sketch(s) => Cow::Owned(s.histogram()),
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.bins.heap_bytes()
            + match &self.gaps {
                Gaps::Full(hist) => hist.distinct_values() * 8,
                Gaps::Sketch(s) => s.heap_bytes(),
            }
    }

    pub fn bin_ns(&self) -> u64 {
        self.bin_ns
    }

    /// The non-empty intervals, in order, with their share of all gaps.
    pub fn table(&self) -> Vec<IpdRow> {
        let total = self.count().max(1) as f64;
        let last = self.bin_count as usize - 1;
        (0..self.bin_count as usize)
            .map(|k| (k, self.bins.get(k)))
            .filter(|&(_, n)| n > 0)
            .map(|(k, n)| IpdRow {
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

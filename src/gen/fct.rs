//! Flow completion times (`run --fct FILE`): each message is a flow, from when it was due (its
//! scheduled arrival in open loop, so waiting in our own sender counts, as in the
//! congestion-control simulators) to its completion. Its slowdown is FCT / ideal FCT, the
//! ideal being the message alone at line rate plus a base latency. Per size bucket, each
//! thread keeps an FCT and a slowdown histogram; every message's row streams to the CSV
//! through a bounded channel, so memory does not grow with the run.
use super::stats::{new_histogram, record};
use crossbeam::channel::Sender;
use hdrhistogram::Histogram;
use std::io::Write;

/// Size buckets (upper bounds, exclusive), the literature's: < 10 KB, < 100 KB, < 1 MB, rest.
pub const BUCKET_BOUNDS: [u64; 3] = [10_000, 100_000, 1_000_000];
pub const BUCKET_NAMES: [&str; 4] = ["<10KB", "10KB-100KB", "100KB-1MB", ">=1MB"];

/// Slowdowns are kept as thousandths in the histograms.
pub const SLOWDOWN_UNIT: f64 = 1000.0;

/// How the ideal FCT is reckoned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FctParams {
    /// Line rate, Gb/s (bits per ns).
    pub line_gbps: f64,
    /// Added to every ideal: the base (unloaded) latency.
    pub base_ns: u64,
}

impl FctParams {
    pub fn ideal_ns(&self, size: u32) -> f64 {
        self.base_ns as f64 + f64::from(size) * 8.0 / self.line_gbps
    }
}

pub fn bucket_of(size: u32) -> usize {
    BUCKET_BOUNDS.partition_point(|&b| u64::from(size) >= b)
}

/// One message: a row of the per-flow CSV.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FctRow {
    pub flow: u32,
    /// When it was due, ns since the start.
    pub start_ns: u64,
    pub size: u32,
    pub fct_ns: u64,
}

/// A bucket's histograms (FCT in ns, slowdown in thousandths).
pub struct Bucket {
    pub fct: Histogram<u64>,
    pub slowdown: Histogram<u64>,
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket {
            fct: new_histogram(),
            slowdown: new_histogram(),
        }
    }
}

/// What a thread measured, or all threads merged.
#[derive(Default)]
pub struct FctBuckets(pub [Bucket; 4]);

impl FctBuckets {
    pub fn add(&mut self, other: &FctBuckets) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            a.fct.add(&b.fct).expect("histograms grow to fit");
            a.slowdown.add(&b.slowdown).expect("histograms grow to fit");
        }
    }
}

/// Rows go out in batches of this many.
const BATCH: usize = 1024;

/// One thread's recorder.
pub struct FctLog {
    params: FctParams,
    buckets: FctBuckets,
    batch: Vec<FctRow>,
    rows: Option<Sender<Vec<FctRow>>>,
}

impl FctLog {
    pub fn new(params: FctParams, rows: Option<Sender<Vec<FctRow>>>) -> FctLog {
        FctLog {
            params,
            buckets: FctBuckets::default(),
            batch: Vec::with_capacity(if rows.is_some() { BATCH } else { 0 }),
            rows,
        }
    }

    pub fn record(&mut self, flow: u32, size: u32, start_ns: u64, end_ns: u64) {
        let fct_ns = end_ns.saturating_sub(start_ns).max(1);
        let slowdown = fct_ns as f64 / self.params.ideal_ns(size);
        let b = &mut self.buckets.0[bucket_of(size)];
        record(&mut b.fct, fct_ns);
        record(&mut b.slowdown, (slowdown * SLOWDOWN_UNIT).round() as u64);
        if let Some(tx) = &self.rows {
            self.batch.push(FctRow {
                flow,
                start_ns,
                size,
                fct_ns,
            });
            if self.batch.len() == BATCH {
                // A writer that is gone (its file failed) drops the rows; the report says so.
                let _ = tx.send(std::mem::replace(
                    &mut self.batch,
                    Vec::with_capacity(BATCH),
                ));
            }
        }
    }

    pub fn finish(mut self) -> FctBuckets {
        if let Some(tx) = self.rows.take() {
            if !self.batch.is_empty() {
                let _ = tx.send(std::mem::take(&mut self.batch));
            }
        }
        self.buckets
    }
}

/// The CSV's header.
pub const CSV_HEADER: &str = "flow,start_ns,size,fct_ns,ideal_ns,slowdown";

/// Writes the rows of every thread as they come, until every sender is gone.
pub fn write_rows(
    rx: crossbeam::channel::Receiver<Vec<FctRow>>,
    params: FctParams,
    mut w: Box<dyn Write + Send>,
) -> Result<u64, String> {
    let mut rows = 0;
    let mut write = || -> std::io::Result<()> {
        writeln!(w, "{CSV_HEADER}")?;
        for batch in rx.iter() {
            for r in batch {
                let ideal = params.ideal_ns(r.size);
                writeln!(
                    w,
                    "{},{},{},{},{:.0},{:.4}",
                    r.flow,
                    r.start_ns,
                    r.size,
                    r.fct_ns,
                    ideal,
                    r.fct_ns as f64 / ideal
                )?;
                rows += 1;
            }
        }
        w.flush()
    };
    write().map_err(|e| format!("writing the FCT rows: {e}"))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_ideal_and_slowdown() {
        assert_eq!(
            [
                1,
                9_999,
                10_000,
                99_999,
                100_000,
                999_999,
                1_000_000,
                u32::MAX
            ]
            .map(bucket_of),
            [0, 0, 1, 1, 2, 2, 3, 3]
        );
        let p = FctParams {
            line_gbps: 8.0,
            base_ns: 1000,
        };
        assert_eq!(p.ideal_ns(8000), 9000.0); // 1 us of base + 64,000 bits at 8 bits/ns
        let (tx, rx) = crossbeam::channel::bounded(4);
        let mut log = FctLog::new(p, Some(tx));
        log.record(3, 8000, 500, 500 + 18_000); // twice the ideal
        log.record(4, 200_000, 0, 1_000_000);
        let b = log.finish();
        assert_eq!(b.0[0].slowdown.max(), 2000);
        assert_eq!(b.0[0].fct.len(), 1);
        // The histograms grow to fit what they record, to 3 significant digits.
        assert!(b.0[0].fct.equivalent(b.0[0].fct.max(), 18_000));
        assert!(b.0[2]
            .fct
            .equivalent(b.0[2].fct.value_at_quantile(0.5), 1_000_000));
        assert_eq!(b.0[2].fct.len(), 1);
        let rows: Vec<FctRow> = rx.iter().flatten().collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].fct_ns, 18_000);
    }
}

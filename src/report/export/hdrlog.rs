//! The latency of every operation as an HdrHistogram interval log (V2, compressed), readable
//! by the standard HdrHistogram tools (HistogramLogProcessor and friends). Values are in ns.
use hdrhistogram::serialization::interval_log::{IntervalLogWriter, IntervalLogWriterBuilder};
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;
use std::io::{self, Write};
use std::time::{Duration, SystemTime};

/// A log being written, one interval at a time.
pub type Log<'a, 'b, W> = IntervalLogWriter<'a, 'b, W, V2DeflateSerializer>;

pub fn serializer() -> V2DeflateSerializer {
    V2DeflateSerializer::new()
}

/// Writes the log's header (start and base time: the run's common start).
pub fn begin<'a, 'b, W: Write>(
    w: &'a mut W,
    serializer: &'b mut V2DeflateSerializer,
    start: SystemTime,
) -> io::Result<Log<'a, 'b, W>> {
    let mut builder = IntervalLogWriterBuilder::new();
    builder
        .add_comment(&format!(
            "ibjitter {}: per-operation latency in ns",
            crate::VERSION
        ))
        .with_start_time(start)
        .with_base_time(start);
    builder.begin_log_with(w, serializer)
}

/// One interval's histogram, `offset` after the start.
pub fn interval<W: Write>(
    log: &mut Log<'_, '_, W>,
    h: &Histogram<u64>,
    offset: Duration,
    length: Duration,
) -> io::Result<()> {
    log.write_histogram(h, offset, length, None)
        .map_err(|e| io::Error::other(format!("{e:?}")))
}

/// A whole log at once: `intervals[k]` starts `k` intervals after `start`.
pub fn write<W: Write>(
    intervals: &[Histogram<u64>],
    length: Duration,
    start: SystemTime,
    mut w: W,
) -> io::Result<()> {
    let mut serializer = serializer();
    let mut log = begin(&mut w, &mut serializer, start)?;
    for (k, h) in intervals.iter().enumerate() {
        interval(&mut log, h, length * k as u32, length)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};

    #[test]
    fn log_reads_back_with_the_standard_parser() {
        let mut a = crate::gen::stats::new_histogram();
        let mut b = crate::gen::stats::new_histogram();
        a.record(1_000).unwrap();
        b.record(2_000).unwrap();
        b.record(3_000).unwrap();
        let mut out = Vec::new();
        write(
            &[a, b],
            Duration::from_secs(1),
            SystemTime::UNIX_EPOCH,
            &mut out,
        )
        .unwrap();
        let entries: Vec<_> = IntervalLogIterator::new(&out)
            .filter_map(|e| match e.unwrap() {
                LogEntry::Interval(h) => Some(h),
                _ => None,
            })
            .collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].start_timestamp(), Duration::from_secs(1));
    }
}

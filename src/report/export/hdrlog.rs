//! The latency of every operation as an HdrHistogram interval log (V2, compressed), readable
//! by the standard HdrHistogram tools (HistogramLogProcessor and friends). Values are in ns.
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::Histogram;
use std::io::{self, Write};
use std::time::{Duration, SystemTime};

pub fn write<W: Write>(
    intervals: &[Histogram<u64>],
    interval: Duration,
    start: SystemTime,
    mut w: W,
) -> io::Result<()> {
    let mut serializer = V2DeflateSerializer::new();
    let mut builder = IntervalLogWriterBuilder::new();
    builder
        .add_comment(&format!(
            "ibjitter {}: per-operation latency in ns",
            crate::VERSION
        ))
        .with_start_time(start)
        .with_base_time(start);
    let mut log = builder.begin_log_with(&mut w, &mut serializer)?;
    for (k, h) in intervals.iter().enumerate() {
        log.write_histogram(h, interval * k as u32, interval, None)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
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

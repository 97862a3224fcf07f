//! Reading measured latencies for `fit` and `empirical`.
//!
//! Two layouts are recognized:
//! - **plain**: numbers separated by any whitespace (one per line or several per line);
//!   lines starting with `#` are comments, and a comment `# unit: us` (or `units:`) names the
//!   unit. Otherwise the caller's unit (`--unit`) is required.
//! - **perftest**: the dump `ib_*_lat -H` (or `-U`) prints: a line `#, usec` (the unit)
//!   followed by lines `<index>, <value>`. Everything else in perftest's output (banner,
//!   summary) is skipped; only the first such block is read (with both `-U` and `-H` the
//!   second block repeats the same samples sorted).
//!
//! - **hdrlog**: an HdrHistogram interval log (V2, compressed), as `ibjitter run` writes its
//!   per-operation latencies: lines `[Tag=…,]start,interval,max,HIST…`. All intervals are
//!   merged and expanded into one sample per recorded operation, each at its bucket's median
//!   value (so values carry the histogram's precision). The unit is nanoseconds when a comment
//!   says `in ns` (ibjitter's do), else `--unit` is required.
//!
//! Values are returned in nanoseconds. Errors carry `file:line:col` and what was expected.

use super::duration::Unit;
use super::format::{ErrorKind, ParseError};
use std::path::Path;

/// Which layout a samples file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Plain,
    Perftest,
    HdrLog,
}

/// Latencies read from a file, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub values_ns: Vec<f64>,
    pub layout: Layout,
    /// The unit the file's numbers were in.
    pub unit: Unit,
}

pub(crate) fn perr(origin: &str, line: usize, col: usize, message: String) -> ParseError {
    ParseError {
        kind: ErrorKind::Syntax,
        origin: origin.to_string(),
        line,
        col,
        message,
    }
}

/// Column (1-based, in characters) of byte offset `at` in `line`.
pub(crate) fn col_of(line: &str, at: usize) -> usize {
    line[..at].chars().count() + 1
}

/// A `#, <unit>` perftest header, if this line is one.
pub(crate) fn perftest_header(line: &str) -> Option<&str> {
    let rest = line.trim().strip_prefix("#,")?;
    let unit = rest.trim();
    if !unit.is_empty() && unit.chars().all(|c| c.is_ascii_alphabetic()) {
        Some(unit)
    } else {
        None
    }
}

/// A `# unit: X` declaration in a plain file's comment.
pub(crate) fn unit_declaration(comment: &str) -> Option<&str> {
    let c = comment.trim();
    let rest = c
        .strip_prefix("unit:")
        .or_else(|| c.strip_prefix("units:"))?;
    Some(rest.trim())
}

pub(crate) fn number(token: &str) -> Option<f64> {
    // Rust's parser accepts "inf"/"nan"; latencies must be finite.
    token.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parses sample text. `unit` (from `--unit`) overrides the file's own.
pub fn parse_samples(text: &str, origin: &str, unit: Option<Unit>) -> Result<Samples, ParseError> {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    if let Some(h) = lines.iter().position(|l| perftest_header(l).is_some()) {
        return parse_perftest(&lines, h, origin, unit);
    }
    if lines.iter().any(|l| hdrlog_payload(l).is_some()) {
        return parse_hdrlog(&lines, origin, unit);
    }
    let mut declared: Option<Unit> = None;
    let mut raw = Vec::new();
    for (idx, line) in lines.iter().enumerate() {
        let line_no = idx + 1;
        let trimmed = line.trim_start();
        if let Some(comment) = trimmed.strip_prefix('#') {
            if let Some(u) = unit_declaration(comment) {
                let col = col_of(line, line.len() - trimmed.len());
                declared = Some(Unit::parse(u).ok_or_else(|| {
                    perr(
                        origin,
                        line_no,
                        col,
                        format!(
                            "expected a unit (ns, us, ms, s) in the unit declaration, found {u:?}"
                        ),
                    )
                })?);
            }
            continue;
        }
        let mut rest = *line;
        let mut offset = 0;
        while let Some(start) = rest.find(|c: char| !c.is_whitespace()) {
            let end = rest[start..]
                .find(char::is_whitespace)
                .map_or(rest.len(), |e| start + e);
            let token = &rest[start..end];
            let col = col_of(line, offset + start);
            let v = number(token).ok_or_else(|| {
                perr(
                    origin,
                    line_no,
                    col,
                    format!("expected a latency (a number), found {token:?}"),
                )
            })?;
            if v < 0.0 {
                return Err(perr(
                    origin,
                    line_no,
                    col,
                    format!("expected a non-negative latency, found {token}"),
                ));
            }
            raw.push(v);
            offset += end;
            rest = &rest[end..];
        }
    }
    let unit = unit.or(declared).ok_or_else(|| {
        perr(
            origin,
            1,
            1,
            "expected a unit for these samples: pass --unit ns|us|ms or start the file with '# unit: us'".to_string(),
        )
    })?;
    finish(raw, Layout::Plain, unit, origin)
}

fn parse_perftest(
    lines: &[&str],
    header: usize,
    origin: &str,
    unit: Option<Unit>,
) -> Result<Samples, ParseError> {
    let header_line = lines[header];
    let word = perftest_header(header_line).unwrap_or_default();
    let col = col_of(header_line, header_line.find(word).unwrap_or(0));
    let file_unit = match Unit::parse(word) {
        Some(u) => Some(u),
        None if word.eq_ignore_ascii_case("cycles") => None,
        None => {
            return Err(perr(
                origin,
                header + 1,
                col,
                format!("expected perftest's unit (usec) after '#,', found {word:?}"),
            ))
        }
    };
    let unit = match (unit, file_unit) {
        (Some(u), _) => u,
        (None, Some(u)) => u,
        (None, None) => {
            return Err(perr(
                origin,
                header + 1,
                col,
                "expected latencies in time units, found 'cycles' (re-run perftest without --report_cycles)"
                    .to_string(),
            ))
        }
    };
    let mut raw = Vec::new();
    for (idx, line) in lines.iter().enumerate().skip(header + 1) {
        let Some((index, value)) = line.split_once(',') else {
            break;
        };
        if index.trim().parse::<u64>().is_err() {
            break;
        }
        let token = value.trim();
        let col = col_of(
            line,
            index.len() + 1 + (value.len() - value.trim_start().len()),
        );
        let v = number(token).ok_or_else(|| {
            perr(
                origin,
                idx + 1,
                col,
                format!("expected a latency (a number) after the index, found {token:?}"),
            )
        })?;
        if v < 0.0 {
            return Err(perr(
                origin,
                idx + 1,
                col,
                format!("expected a non-negative latency, found {token}"),
            ));
        }
        raw.push(v);
    }
    if raw.is_empty() {
        return Err(perr(
            origin,
            header + 2,
            1,
            "expected '<index>, <latency>' lines after perftest's '#, usec' header, found none"
                .to_string(),
        ));
    }
    finish(raw, Layout::Perftest, unit, origin)
}

/// The base64 histogram of an interval-log line, and its byte offset in the line.
pub(crate) fn hdrlog_payload(line: &str) -> Option<(usize, &str)> {
    if line.starts_with('#') || line.starts_with('"') {
        return None;
    }
    let at = line.rfind(',')? + 1;
    let payload = line[at..].trim_end();
    payload.starts_with("HIST").then_some((at, payload))
}

/// The unit an interval log declares in its comments: `# unit: us`, or ibjitter's own
/// "… in ns".
pub(crate) fn hdrlog_unit(lines: &[&str]) -> Option<Unit> {
    lines.iter().find_map(|l| {
        let c = l.strip_prefix('#')?;
        if let Some(u) = unit_declaration(c) {
            return Unit::parse(u);
        }
        (c.contains(" in ns") || c.contains("(ns)")).then_some(Unit::Ns)
    })
}

/// Decodes an interval-log payload (base64 of a compressed V2 histogram); the error says what
/// was expected.
pub(crate) fn decode_histogram(payload: &str) -> Result<hdrhistogram::Histogram<u64>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload)
        .map_err(|e| format!("expected a base64 HdrHistogram, found invalid base64 ({e})"))?;
    decode_histogram_bytes(&bytes)
}

/// Decodes a serialized V2 histogram (plain or compressed) whose stated lengths were checked
/// first: hdrhistogram sizes its buffer by the counts' length the bytes state, before it
/// reads them (a crafted 0xffffffff: 4 GiB allocated, or an abort, for a 91-byte line).
pub fn decode_histogram_bytes(bytes: &[u8]) -> Result<hdrhistogram::Histogram<u64>, String> {
    check_histogram_lengths(bytes)?;
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut &bytes[..])
        .map_err(|e| format!("expected an HdrHistogram (V2), could not decode it ({e:?})"))
}

/// Whether the counts' length a V2 histogram states fits in what it holds: after its 40-byte
/// header (plain), or in its zlib stream (compressed; inflated to count, never kept).
fn check_histogram_lengths(bytes: &[u8]) -> Result<(), String> {
    use std::io::Read;
    const V2: u32 = 0x1c84_9313;
    const V2_COMPRESSED: u32 = 0x1c84_9314;
    const HEADER: u64 = 40;
    // The most bytes of counts decoded: hdrhistogram allocates what a histogram states before
    // it reads it, and a zlib stream can inflate to that much from a thousandth of it. Every
    // counts array hdrhistogram can make (5 significant digits over the whole u64 range:
    // 6.3 M counts) fits in far less as zig-zag varints of what is recorded.
    const MOST_COUNTS_BYTES: u64 = 16 << 20;
    let be32 = |b: &[u8]| {
        b.get(..4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    };
    let short = || "expected an HdrHistogram (V2), found too few bytes".to_string();
    let stated_past = |stated: u64, held: u64| {
        format!(
            "expected an HdrHistogram (V2) holding the {stated} bytes of counts it states, \
             found {held}"
        )
    };
    let too_many = |stated: u64| {
        (stated > MOST_COUNTS_BYTES).then(|| {
            format!(
                "expected an HdrHistogram (V2) of at most {MOST_COUNTS_BYTES} bytes of counts, \
                 found one stating {stated}"
            )
        })
    };
    match be32(bytes).ok_or_else(short)? {
        V2 => {
            let stated = u64::from(be32(&bytes[4..]).ok_or_else(short)?);
            if let Some(e) = too_many(stated) {
                return Err(e);
            }
            let held = (bytes.len() as u64).saturating_sub(HEADER);
            if stated > held {
                return Err(stated_past(stated, held));
            }
        }
        V2_COMPRESSED => {
            let compressed = u64::from(be32(&bytes[4..]).ok_or_else(short)?);
            let mut inflated =
                flate2::read::ZlibDecoder::new(bytes[8..].take(compressed)).take(u64::MAX);
            let mut header = [0u8; HEADER as usize];
            inflated.read_exact(&mut header).map_err(|_| short())?;
            let stated = u64::from(be32(&header[4..]).ok_or_else(short)?);
            if let Some(e) = too_many(stated) {
                return Err(e);
            }
            // Counted up to one byte past what it states, as it inflates.
            inflated.set_limit(stated + 1);
            let held = std::io::copy(&mut inflated, &mut std::io::sink()).map_err(|e| {
                format!("expected an HdrHistogram (V2), its compressed bytes do not inflate ({e})")
            })?;
            if stated > held {
                return Err(stated_past(stated, held));
            }
        }
        // Left to the decoder's own error (an unknown cookie).
        _ => {}
    }
    Ok(())
}

fn parse_hdrlog(lines: &[&str], origin: &str, unit: Option<Unit>) -> Result<Samples, ParseError> {
    let unit = unit.or_else(|| hdrlog_unit(lines)).ok_or_else(|| {
        perr(
            origin,
            1,
            1,
            "expected the unit of this HdrHistogram log: pass --unit ns|us|ms".to_string(),
        )
    })?;
    let mut merged: Option<hdrhistogram::Histogram<u64>> = None;
    for (idx, line) in lines.iter().enumerate() {
        let Some((at, payload)) = hdrlog_payload(line) else {
            continue;
        };
        let bad = |what: String| perr(origin, idx + 1, col_of(line, at), what);
        let h = decode_histogram(payload).map_err(bad)?;
        match merged.as_mut() {
            None => {
                let mut h = h;
                // Deserialized histograms have a fixed range; let the sum grow.
                h.auto(true);
                merged = Some(h);
            }
            Some(m) => m
                .add(&h)
                .map_err(|e| bad(format!("expected histograms that can be merged ({e:?})")))?,
        }
    }
    let h = merged.expect("at least one payload line");
    // Each recorded value, as often as recorded, up to MAX_EXPANDED samples in all; beyond,
    // each its share of them by cumulative count. The total is summed here: hdrhistogram's
    // own saturates at u64::MAX, which buckets of 2^63 each pass (shares past the cap).
    let total: u128 = h
        .iter_recorded()
        .map(|v| u128::from(v.count_at_value()))
        .sum();
    let made_in_all = total.min(u128::from(MAX_EXPANDED));
    let mut raw = Vec::with_capacity(made_in_all as usize);
    let (mut cum, mut made) = (0u128, 0u128);
    for v in h.iter_recorded() {
        let value = h.median_equivalent(v.value_iterated_to()) as f64;
        cum += u128::from(v.count_at_value());
        let upto = (cum * made_in_all / total.max(1)).min(made_in_all);
        raw.extend(std::iter::repeat_n(value, (upto - made) as usize));
        made = upto;
    }
    finish(raw, Layout::HdrLog, unit, origin)
}

/// The most samples made from an HdrHistogram log: its counts are expanded into samples, and a
/// count of 10^9 (a crafted 91-byte line, or a day-long log at 10^4 ops/s) made as many (7.8
/// GB; 2^63 panicked). Beyond, each value gets its share of these by cumulative count: the
/// distribution to one part in 8 Mi, far finer than a table's 4096 entries.
const MAX_EXPANDED: u64 = 1 << 23;

fn finish(raw: Vec<f64>, layout: Layout, unit: Unit, origin: &str) -> Result<Samples, ParseError> {
    if raw.is_empty() {
        return Err(perr(
            origin,
            1,
            1,
            "expected latency samples, found none".to_string(),
        ));
    }
    let k = unit.ns();
    Ok(Samples {
        values_ns: raw.into_iter().map(|v| v * k).collect(),
        layout,
        unit,
    })
}

/// Reads a samples file (see the module docs for layouts).
pub fn read_samples(path: &Path, unit: Option<Unit>) -> Result<Samples, ParseError> {
    let (origin, text) = read_text(path, "samples")?;
    parse_samples(&text, &origin, unit)
}

/// A text file read within [`crate::input::LIMITS`], and its name for messages; `what` names
/// the contents in errors. An invalid UTF-8 byte is reported at its line and column.
pub(crate) fn read_text(path: &Path, what: &str) -> Result<(String, String), ParseError> {
    let origin = path.display().to_string();
    let text =
        crate::input::read_text(path, what, crate::input::LIMITS).map_err(|e| ParseError {
            kind: if e.io {
                ErrorKind::Io
            } else {
                ErrorKind::Syntax
            },
            origin: origin.clone(),
            line: e.line,
            col: e.col,
            message: e.message,
        })?;
    Ok((origin, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdrlog(values: &[&[u64]], comment: &str) -> String {
        use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
        use hdrhistogram::serialization::V2DeflateSerializer;
        let mut out = Vec::new();
        let mut ser = V2DeflateSerializer::new();
        let mut b = IntervalLogWriterBuilder::new();
        b.add_comment(comment);
        let mut log = b.begin_log_with(&mut out, &mut ser).unwrap();
        for (k, vs) in values.iter().enumerate() {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            for &v in *vs {
                h.record(v).unwrap();
            }
            let t = std::time::Duration::from_secs(k as u64);
            log.write_histogram(&h, t, std::time::Duration::from_secs(1), None)
                .unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn hdrhistogram_interval_log() {
        let text = hdrlog(
            &[&[1000, 2000], &[3000, 3000, 3000]],
            "ibjitter 0.1.0: per-operation latency in ns",
        );
        let s = parse_samples(&text, "lat.hlog", None).unwrap();
        assert_eq!(s.layout, Layout::HdrLog);
        assert_eq!(s.unit, Unit::Ns);
        assert_eq!(s.values_ns.len(), 5);
        let mean = s.values_ns.iter().sum::<f64>() / 5.0;
        assert!((mean - 2400.0).abs() < 2400.0 * 1e-3, "{mean}");
        // Another tool's log without a unit needs --unit.
        let text = hdrlog(&[&[5]], "some other tool");
        assert!(parse_samples(&text, "f", None).is_err());
        let s = parse_samples(&text, "f", Some(Unit::Us)).unwrap();
        assert_eq!(s.values_ns, vec![5000.0]);
        // A corrupted payload is reported at its line and column.
        let bad = hdrlog(&[&[5]], "latency in ns").replace("HISTF", "HISTF!!");
        let e = parse_samples(&bad, "f", None).unwrap_err();
        assert!(e.message.contains("base64"), "{e}");
        assert!(e.line > 1 && e.col > 1, "{e}");
    }

    /// One interval-log line whose histogram is `bytes` (serialized, base64'd), in ns.
    fn log_of(bytes: &[u8]) -> String {
        use base64::Engine;
        format!(
            "# unit: ns\n0.000,1.000,1000.000,HIST{}\n",
            &base64::engine::general_purpose::STANDARD.encode(bytes)[4..]
        )
    }

    /// A count of 10^9 in one bucket (a few bytes of log) made 10^9 samples (7.8 GB; 2^63
    /// panicked "capacity overflow"): now at most MAX_EXPANDED, each value its share.
    #[test]
    fn a_huge_count_is_expanded_into_a_bounded_share() {
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        for huge in [1_000_000_000u64, 1 << 62] {
            let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            h.record_n(1000, huge).unwrap();
            h.record_n(5000, huge).unwrap();
            let mut bytes = Vec::new();
            V2DeflateSerializer::new()
                .serialize(&h, &mut bytes)
                .unwrap();
            let s = parse_samples(&log_of(&bytes), "huge.hlog", None).unwrap();
            assert_eq!(s.values_ns.len() as u64, MAX_EXPANDED, "{huge}");
            let small = s.values_ns.iter().filter(|&&v| v < 2000.0).count() as u64;
            assert_eq!(small, MAX_EXPANDED / 2, "{huge}: each value its share");
        }
    }

    /// A histogram that states 0xffffffff bytes of counts made hdrhistogram allocate 4 GiB
    /// before reading them (and abort under `ulimit -v`, or the merge of an incast's reports):
    /// refused first, saying what it states and holds, plain or compressed.
    #[test]
    fn a_histogram_stating_more_counts_than_it_holds_is_refused_before_any_allocation() {
        use hdrhistogram::serialization::{Serializer, V2Serializer};
        use std::io::Write;
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        h.record(1000).unwrap();
        let mut plain = Vec::new();
        V2Serializer::new().serialize(&h, &mut plain).unwrap();
        plain[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&plain).unwrap();
        let z = z.finish().unwrap();
        let mut compressed = 0x1c84_9314u32.to_be_bytes().to_vec();
        compressed.extend_from_slice(&(z.len() as u32).to_be_bytes());
        compressed.extend_from_slice(&z);
        for bytes in [&plain, &compressed] {
            let e = decode_histogram_bytes(bytes).unwrap_err();
            assert!(e.contains("found one stating 4294967295"), "{e}");
            let e = parse_samples(&log_of(bytes), "crafted.hlog", None).unwrap_err();
            assert!(e.line == 2 && e.message.contains("4294967295"), "{e}");
        }
        // One within the limit but past its bytes: refused too.
        let mut short = plain.clone();
        short[4..8].copy_from_slice(&1000u32.to_be_bytes());
        let e = decode_histogram_bytes(&short).unwrap_err();
        assert!(
            e.contains("holding the 1000 bytes of counts it states"),
            "{e}"
        );
        // A zlib bomb whose inflated length matches what it states (zeros: 64 MiB from 64
        // KiB): refused by the limit before it is inflated or allocated.
        let mut bomb = plain[..40].to_vec();
        bomb[4..8].copy_from_slice(&(64u32 << 20).to_be_bytes());
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&bomb).unwrap();
        for _ in 0..64 {
            z.write_all(&[0u8; 1 << 20]).unwrap();
        }
        let z = z.finish().unwrap();
        let mut compressed = 0x1c84_9314u32.to_be_bytes().to_vec();
        compressed.extend_from_slice(&(z.len() as u32).to_be_bytes());
        compressed.extend_from_slice(&z);
        let e = decode_histogram_bytes(&compressed).unwrap_err();
        assert!(e.contains("at most 16777216 bytes of counts"), "{e}");
    }

    /// Buckets of 2^62 each saturate hdrhistogram's own total (u64::MAX), past which the
    /// shares grew beyond the cap (33 GB from a thousand such buckets): the total is summed.
    #[test]
    fn counts_past_u64_in_all_still_make_at_most_the_cap() {
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for v in 1..=8u64 {
            h.record_n(v * 1000, 1 << 62).unwrap();
        }
        assert_eq!(h.len(), u64::MAX, "saturated");
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(&h, &mut bytes)
            .unwrap();
        let s = parse_samples(&log_of(&bytes), "sat.hlog", None).unwrap();
        assert_eq!(s.values_ns.len() as u64, MAX_EXPANDED);
        let last = s.values_ns.iter().filter(|&&v| v > 7500.0).count() as u64;
        assert_eq!(last, MAX_EXPANDED / 8, "each of the 8 values its eighth");
    }

    #[test]
    fn plain_with_unit_argument_or_declaration() {
        let s = parse_samples("1.5\n2 3\n\n# note\n4\n", "f", Some(Unit::Us)).unwrap();
        assert_eq!(s.values_ns, vec![1500.0, 2000.0, 3000.0, 4000.0]);
        assert_eq!(s.layout, Layout::Plain);
        let s = parse_samples("# unit: ms\n1 2\n", "f", None).unwrap();
        assert_eq!(s.values_ns, vec![1e6, 2e6]);
        let s = parse_samples("# unit: ms\n1 2\n", "f", Some(Unit::Ns)).unwrap();
        assert_eq!(s.values_ns, vec![1.0, 2.0], "--unit overrides");
        let e = parse_samples("1 2\n", "f", None).unwrap_err();
        assert!(e.message.contains("--unit"), "{e}");
    }

    #[test]
    fn plain_errors_have_positions() {
        let e = parse_samples("1\n 2  x3\n", "s.txt", Some(Unit::Ns)).unwrap_err();
        assert_eq!((e.line, e.col), (2, 5), "{e}");
        assert!(e.to_string().starts_with("s.txt:2:5: expected a latency"));
        let e = parse_samples("1 -2", "f", Some(Unit::Ns)).unwrap_err();
        assert_eq!((e.line, e.col), (1, 3));
        assert!(e.message.contains("non-negative"));
        let e = parse_samples("1 nan", "f", Some(Unit::Ns)).unwrap_err();
        assert_eq!(e.col, 3);
        let e = parse_samples("# only\n", "f", Some(Unit::Ns)).unwrap_err();
        assert!(e.message.contains("found none"));
        let e = parse_samples("# unit: parsecs\n1", "f", None).unwrap_err();
        assert_eq!(e.line, 1);
    }

    #[test]
    fn perftest_dump() {
        let text = "\
************************************
* Waiting for client to connect... *
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]
#, usec
1, 1.12
2, 1.25
3, 2.5e+01
 2       1000          1.12           25.0         1.25
#, usec
1, 1.12
";
        let s = parse_samples(text, "lat.txt", None).unwrap();
        assert_eq!(s.layout, Layout::Perftest);
        assert_eq!(s.unit, Unit::Us);
        assert_eq!(s.values_ns.len(), 3);
        assert!((s.values_ns[2] - 25_000.0).abs() < 1e-9);
        let e = parse_samples("#, cycles\n1, 100\n", "f", None).unwrap_err();
        assert!(e.message.contains("cycles"));
        let e = parse_samples("#, usec\n1, abc\n", "f", None).unwrap_err();
        assert_eq!((e.line, e.col), (2, 4), "{e}");
        let e = parse_samples("#, usec\nsummary\n", "f", None).unwrap_err();
        assert!(e.message.contains("found none"));
    }
}

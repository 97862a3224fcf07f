//! Per-interval data, streamed as the run goes: bytes per flow per time-series interval and a
//! latency histogram per HdrHistogram-log interval. Each thread keeps only its current
//! interval and hands every closed one to one writer thread, which merges the threads' parts
//! and writes an interval as soon as every thread has moved past it. So a 24-hour run holds
//! what a 10-second run holds: a few intervals in flight, never the whole run.
use super::histogram::{new_histogram, record};
use crossbeam::channel::{Receiver, Sender};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// The shortest `--interval`: each closed interval is a message from every thread.
pub const MIN_INTERVAL_NS: u64 = 1_000_000;
/// The shortest `--hdr-interval`: each interval is a histogram (tens of KiB with latencies
/// of milliseconds) that the writer compresses; at 1 ms the bench's writer fell behind and
/// the histograms waiting for it took 100 MB.
pub const MIN_HDR_INTERVAL_NS: u64 = 10_000_000;

/// Messages in flight between the threads and the writer (at most a few MB of histograms): a
/// full channel makes a thread wait (bounded memory) rather than buffer without limit.
const CHANNEL_CAPACITY: usize = 256;

/// One thread's closed interval `k`; the thread has nothing more for any interval before `next`.
pub enum Message {
    Series {
        thread: usize,
        k: u64,
        next: u64,
        /// (flow, bytes completed in the interval), flows with bytes only.
        rows: Vec<(u32, u64)>,
    },
    Latency {
        thread: usize,
        k: u64,
        next: u64,
        hist: Histogram<u64>,
    },
    /// The thread ended: everything it measured was sent.
    Done { thread: usize },
}

pub fn channel() -> (Sender<Message>, Receiver<Message>) {
    crossbeam::channel::bounded(CHANNEL_CAPACITY)
}

/// One thread's side: its current interval of each stream that was asked for.
pub struct Sink {
    tx: Sender<Message>,
    thread: usize,
    series: Option<SeriesBucket>,
    latency: Option<LatencyBucket>,
}

struct SeriesBucket {
    interval_ns: u64,
    k: u64,
    /// Bytes per flow of the thread (by index), and the indices with bytes, in first-touch order.
    bytes: Vec<u64>,
    touched: Vec<u32>,
    ids: Vec<u32>,
}

struct LatencyBucket {
    interval_ns: u64,
    k: u64,
    hist: Histogram<u64>,
}

impl Sink {
    /// `flow_ids`: the thread's flows, by index. None for a stream nobody asked for.
    pub fn new(
        tx: Sender<Message>,
        thread: usize,
        flow_ids: &[u32],
        series_interval_ns: Option<u64>,
        latency_interval_ns: Option<u64>,
    ) -> Sink {
        Sink {
            tx,
            thread,
            series: series_interval_ns.map(|interval_ns| SeriesBucket {
                interval_ns,
                k: 0,
                bytes: vec![0; flow_ids.len()],
                touched: Vec::new(),
                ids: flow_ids.to_vec(),
            }),
            latency: latency_interval_ns.map(|interval_ns| LatencyBucket {
                interval_ns,
                k: 0,
                hist: new_histogram(),
            }),
        }
    }

    /// Closes the current intervals if `now_ns` is past them (called on every loop of the
    /// thread, so an idle thread does not hold the writer back).
    pub fn tick(&mut self, now_ns: u64) {
        if let Some(k) = self.series.as_ref().map(|s| now_ns / s.interval_ns) {
            self.close_series(k);
        }
        if let Some(k) = self.latency.as_ref().map(|l| now_ns / l.interval_ns) {
            self.close_latency(k);
        }
    }

    /// One operation of flow `index` completed at `now_ns`: its `bytes`, and its latency if
    /// it was measured (not in the warm-up).
    pub fn complete(&mut self, index: usize, bytes: u64, latency_ns: Option<u64>, now_ns: u64) {
        self.tick(now_ns);
        if let Some(s) = &mut self.series {
            if s.bytes[index] == 0 {
                s.touched.push(index as u32);
            }
            s.bytes[index] += bytes;
        }
        if let (Some(l), Some(latency)) = (&mut self.latency, latency_ns) {
            record(&mut l.hist, latency);
        }
    }

    /// Sends the last intervals and says the thread is done.
    pub fn finish(mut self) {
        if let Some(k) = self.series.as_ref().map(|s| s.k + 1) {
            self.close_series(k);
        }
        if let Some(k) = self.latency.as_ref().map(|l| l.k + 1) {
            self.close_latency(k);
        }
        let _ = self.tx.send(Message::Done {
            thread: self.thread,
        });
    }

    /// Sends the current series interval if `next` is another one, and moves on to `next`.
    fn close_series(&mut self, next: u64) {
        let Some(s) = self.series.as_mut().filter(|s| s.k != next) else {
            return;
        };
        let rows = s.take_rows();
        let _ = self.tx.send(Message::Series {
            thread: self.thread,
            k: s.k,
            next,
            rows,
        });
        s.k = next;
    }

    /// The same for the latency interval.
    fn close_latency(&mut self, next: u64) {
        let Some(l) = self.latency.as_mut().filter(|l| l.k != next) else {
            return;
        };
        let hist = std::mem::replace(&mut l.hist, new_histogram());
        let _ = self.tx.send(Message::Latency {
            thread: self.thread,
            k: l.k,
            next,
            hist,
        });
        l.k = next;
    }
}

impl SeriesBucket {
    fn take_rows(&mut self) -> Vec<(u32, u64)> {
        let rows = self
            .touched
            .iter()
            .map(|&i| {
                (
                    self.ids[i as usize],
                    std::mem::take(&mut self.bytes[i as usize]),
                )
            })
            .collect();
        self.touched.clear();
        rows
    }
}

/// Merges one stream's parts from `threads` threads and hands each interval, in order, to
/// `emit` once no thread can add to it any more. Intervals no thread had data for are emitted
/// empty (the log's time axis has no holes).
pub struct Merger<P> {
    /// Per thread: it has nothing more before this interval (u64::MAX once done).
    watermarks: Vec<u64>,
    pending: BTreeMap<u64, P>,
    next: u64,
    /// The highest interval any thread reached (the end of the stream once all are done).
    end: u64,
}

impl<P: Default> Merger<P> {
    pub fn new(threads: usize) -> Merger<P> {
        Merger {
            watermarks: vec![0; threads],
            pending: BTreeMap::new(),
            next: 0,
            end: 0,
        }
    }

    /// Thread `thread`'s part of interval `k` (merged with `merge`); it has nothing before `next`.
    pub fn part(&mut self, thread: usize, k: u64, next: u64, merge: impl FnOnce(&mut P)) {
        merge(self.pending.entry(k).or_default());
        self.end = self.end.max(k + 1);
        self.watermarks[thread] = self.watermarks[thread].max(next);
    }

    pub fn done(&mut self, thread: usize) {
        self.watermarks[thread] = u64::MAX;
    }

    /// Emits every interval that is complete, in order.
    pub fn emit_ready<E>(
        &mut self,
        mut emit: impl FnMut(u64, P) -> Result<(), E>,
    ) -> Result<(), E> {
        let ready = self
            .watermarks
            .iter()
            .copied()
            .min()
            .unwrap_or(u64::MAX)
            .min(self.end);
        while self.next < ready {
            let part = self.pending.remove(&self.next).unwrap_or_default();
            emit(self.next, part)?;
            self.next += 1;
        }
        Ok(())
    }

    /// Intervals held, waiting for a slower thread.
    pub fn held(&self) -> usize {
        self.pending.len()
    }
}

/// Where the streams go: the time-series CSV and the HdrHistogram log, each if asked for.
pub struct Outputs {
    pub series: Option<Box<dyn std::io::Write + Send>>,
    pub series_interval_s: f64,
    pub latency: Option<Box<dyn std::io::Write + Send>>,
    pub latency_interval: std::time::Duration,
    /// Also keep every latency interval's histogram in memory, for the JSON report
    /// (`--json-series`: an incast merges its senders' intervals). It grows with the run.
    pub keep_latency: bool,
    /// The port counters' CSV (`--counters`), sampled by a thread of its own (see
    /// [`super::port_counters`]), not by the interval writer.
    pub counters: Option<Box<dyn std::io::Write + Send>>,
    /// `--fct`: one row per message (see [`super::fct`]), written by a thread of its own.
    pub fct: Option<Box<dyn std::io::Write + Send>>,
}

impl Outputs {
    pub fn none() -> Outputs {
        Outputs {
            series: None,
            series_interval_s: 0.0,
            latency: None,
            latency_interval: std::time::Duration::ZERO,
            keep_latency: false,
            counters: None,
            fct: None,
        }
    }

    /// Whether any stream is asked for (else no writer thread runs).
    pub fn any(&self) -> bool {
        self.series.is_some() || self.latency.is_some() || self.keep_latency
    }
}

/// What the writer brings back: the first write error, and the kept latency intervals.
#[derive(Default)]
pub struct Written {
    pub error: Option<String>,
    pub latency_intervals: Vec<Histogram<u64>>,
}

/// The writer thread: receives the `threads` threads' parts until all are done and writes
/// each interval when it is complete. `start` is the common start (the log's base time). On a
/// write error it keeps draining the channel (the threads must never block on it) and
/// returns the first error.
pub fn write(
    rx: Receiver<Message>,
    threads: usize,
    outputs: Outputs,
    start: std::time::SystemTime,
) -> Written {
    use crate::report::export::{hdrlog, timeseries};
    use std::io::Write;
    use std::time::Duration;
    let Outputs {
        series,
        series_interval_s,
        latency,
        latency_interval,
        keep_latency,
        counters: _,
        fct: _,
    } = outputs;
    let mut kept: Vec<Histogram<u64>> = Vec::new();
    let mut series_out = series.map(std::io::BufWriter::new);
    let mut latency_out = latency.map(std::io::BufWriter::new);
    let mut series_merge: Merger<Vec<(u32, u64)>> = Merger::new(threads);
    let mut latency_merge: Merger<Option<Histogram<u64>>> = Merger::new(threads);
    let mut error: Option<String> = None;
    let mut note = |e: std::io::Error, what: &str| {
        error.get_or_insert_with(|| format!("writing the {what}: {e}"));
    };
    if let Some(w) = &mut series_out {
        if let Err(e) = timeseries::write_header(w) {
            note(e, "time series");
            series_out = None;
        }
    }
    let mut serializer = hdrlog::serializer();
    let mut log = match &mut latency_out {
        Some(w) => match hdrlog::begin(w, &mut serializer, start) {
            Ok(log) => Some(log),
            Err(e) => {
                note(e, "HdrHistogram log");
                None
            }
        },
        None => None,
    };
    let mut done = 0;
    while done < threads {
        let Ok(m) = rx.recv() else { break };
        match m {
            Message::Series {
                thread,
                k,
                next,
                rows,
            } => series_merge.part(thread, k, next, |p| p.extend(rows)),
            Message::Latency {
                thread,
                k,
                next,
                hist,
            } => latency_merge.part(thread, k, next, |p| match p {
                Some(h) => {
                    let _ = h.add(&hist);
                }
                None => *p = Some(hist),
            }),
            Message::Done { thread } => {
                series_merge.done(thread);
                latency_merge.done(thread);
                done += 1;
            }
        }
        if let Some(w) = &mut series_out {
            let r = series_merge.emit_ready(|k, mut rows| {
                rows.sort_unstable();
                timeseries::write_interval(
                    w,
                    k as f64 * series_interval_s,
                    series_interval_s,
                    &rows,
                )
            });
            if let Err(e) = r {
                note(e, "time series");
                series_out = None;
            }
        } else {
            series_merge.emit_ready(|_, _| Ok::<(), ()>(())).ok();
        }
        let offset = |k: u64| Duration::from_nanos(latency_interval.as_nanos() as u64 * k);
        let r = latency_merge.emit_ready(|k, h| {
            let h = h.unwrap_or_else(new_histogram);
            let written = match &mut log {
                Some(l) => hdrlog::interval(l, &h, offset(k), latency_interval),
                None => Ok(()),
            };
            if keep_latency {
                kept.push(h);
            }
            written
        });
        if let Err(e) = r {
            note(e, "HdrHistogram log");
            log = None;
        }
    }
    drop(log);
    for (w, what) in [
        (
            series_out.as_mut().map(|w| w as &mut dyn Write),
            "time series",
        ),
        (
            latency_out.as_mut().map(|w| w as &mut dyn Write),
            "HdrHistogram log",
        ),
    ] {
        if let Some(Err(e)) = w.map(|w| w.flush()) {
            note(e, what);
        }
    }
    Written {
        error,
        latency_intervals: kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_close_intervals_as_time_passes_and_the_merger_orders_them() {
        let (tx, rx) = channel();
        let mut a = Sink::new(tx.clone(), 0, &[10, 11], Some(100), Some(1000));
        let mut b = Sink::new(tx, 1, &[20], Some(100), Some(1000));
        a.complete(0, 8, Some(7), 50);
        a.complete(1, 8, None, 60);
        a.complete(0, 8, None, 250); // closes a's interval 0, jumps to 2
        b.complete(0, 4, None, 120); // b's interval 1
        b.tick(1_500); // b closes 1 (series) and 0 (latency)
        a.finish();
        b.finish();
        let mut series: Merger<Vec<(u32, u64)>> = Merger::new(2);
        let mut latency: Merger<Option<Histogram<u64>>> = Merger::new(2);
        let (mut rows, mut hists) = (Vec::new(), Vec::new());
        for m in rx.try_iter() {
            match m {
                Message::Series {
                    thread,
                    k,
                    next,
                    rows,
                } => series.part(thread, k, next, |p| p.extend(rows)),
                Message::Latency {
                    thread,
                    k,
                    next,
                    hist,
                } => latency.part(thread, k, next, |p| match p {
                    Some(h) => h.add(&hist).unwrap(),
                    None => *p = Some(hist),
                }),
                Message::Done { thread } => {
                    series.done(thread);
                    latency.done(thread);
                }
            }
            series
                .emit_ready(|k, mut p| {
                    p.sort();
                    rows.push((k, p));
                    Ok::<(), ()>(())
                })
                .unwrap();
            latency
                .emit_ready(|k, p| {
                    hists.push((k, p.map_or(0, |h| h.len())));
                    Ok::<(), ()>(())
                })
                .unwrap();
        }
        // b's last interval (15: it ended at 1,500 ns) is the end of the stream; the intervals
        // between are empty, written all the same.
        let mut expected = vec![
            (0, vec![(10, 8), (11, 8)]),
            (1, vec![(20, 4)]),
            (2, vec![(10, 8)]),
        ];
        expected.extend((3..=15).map(|k| (k, vec![])));
        assert_eq!(rows, expected);
        assert_eq!(hists, vec![(0, 1), (1, 0)]);
        assert_eq!((series.held(), latency.held()), (0, 0));
    }

    #[test]
    fn a_slow_thread_holds_intervals_back_until_it_moves_on() {
        let mut m: Merger<u64> = Merger::new(2);
        let mut out = Vec::new();
        let mut emit = |k, p| {
            out.push((k, p));
            Ok::<(), ()>(())
        };
        m.part(0, 0, 5, |p| *p += 1);
        m.part(0, 5, 6, |p| *p += 1);
        m.emit_ready(&mut emit).unwrap();
        assert_eq!(m.held(), 2, "thread 1 has said nothing yet");
        m.part(1, 0, 3, |p| *p += 10);
        m.emit_ready(&mut emit).unwrap();
        m.done(1);
        m.emit_ready(&mut emit).unwrap();
        assert_eq!(out, vec![(0, 11), (1, 0), (2, 0), (3, 0), (4, 0), (5, 1)]);
    }
}

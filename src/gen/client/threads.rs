//! The measured phase: one thread per shard waits at a barrier, the server's Go releases them
//! all at once, and this thread watches the control connection (and draws progress) until
//! every worker has returned.
use super::super::cpus;
use super::super::fct;
use super::super::intervals::{self, Outputs, Sink};
use super::super::pingpong;
use super::super::port_counters::{self, PortCounters};
use super::super::progress::{self, Counters};
use super::super::run_config::{RunConfig, StopAt};
use super::super::shard::Shard;
use super::super::stats::new_histogram;
use super::super::stop::Reason;
use super::super::wire::Control;
use super::super::worker::{self, WorkerOutput, WorkerParams};
use crate::report::gbps;
use hdrhistogram::Histogram;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// What the threads brought back, and when they started.
pub struct Finished {
    pub outputs: Vec<WorkerOutput>,
    /// The CPU each thread was pinned to (`--pin`), in thread order.
    pub pinned: Vec<Option<usize>>,
    pub start: Instant,
    pub start_time: SystemTime,
    /// Writing the streamed time series or latency log failed.
    pub stream_error: Option<String>,
    /// With `Outputs::keep_latency`: every latency interval's histogram.
    pub latency_intervals: Vec<Histogram<u64>>,
}

/// Starts a worker per shard on the server's Go and waits for them all, while one more
/// thread writes the streamed intervals (`outputs`). An error means nothing was measured
/// (no Go came).
pub fn start_and_watch(
    cfg: &RunConfig,
    shards: &[Shard],
    params: &WorkerParams,
    control: &mut Control,
    mut outputs: Outputs,
    port: &PortCounters,
) -> Result<Finished, String> {
    let counters_out = outputs.counters.take();
    let counters_done = AtomicBool::new(false);
    let mut counters_error = None;
    let counters: Vec<Counters> = shards.iter().map(|_| Counters::default()).collect();
    let release = Barrier::new(shards.len() + 1);
    let t0: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let streaming = outputs.any();
    let (tx, rx) = intervals::channel();
    let sink = |thread: usize, shard: &Shard| {
        streaming.then(|| {
            let ids: Vec<u32> = shard.flows.iter().map(|f| f.id).collect();
            let ns = |d: Duration| d.as_nanos() as u64;
            Sink::new(
                tx.clone(),
                thread,
                &ids,
                outputs.series.is_some().then(|| ns(cfg.interval)),
                (outputs.latency.is_some() || outputs.keep_latency).then(|| ns(cfg.hdr_interval)),
            )
        })
    };
    let sinks: Vec<Option<Sink>> = shards.iter().enumerate().map(|(t, s)| sink(t, s)).collect();
    drop(tx);
    let mut go_error = None;
    let mut written = intervals::Written::default();
    let cpus = cpus::allowed();
    // --fct: every message's row, from the workers to a writer thread (bounded).
    let fct_stream = outputs
        .fct
        .take()
        .zip(params.fct)
        .map(|(w, p)| (crossbeam::channel::bounded(16), w, p));
    let fct_tx = fct_stream.as_ref().map(|((tx, _), _, _)| tx.clone());
    let mut fct_written = None;
    let outputs_of_threads: Vec<(WorkerOutput, Option<usize>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = shards
            .iter()
            .zip(&counters)
            .zip(sinks)
            .enumerate()
            .map(|(t, ((shard, c), sink))| {
                let (release, t0, cpus) = (&release, &t0, &cpus);
                let rows = fct_tx.clone();
                scope.spawn(move || {
                    // Pinned before the start: a syscall once, never on the post path.
                    let pinned = cfg.pin.then(|| cpus::for_thread(cpus, t)).filter(|&cpu| {
                        cpus::pin_current_thread(cpu)
                            .map_err(|e| eprintln!("ibjitter run: thread {t}: {e}; left unpinned"))
                            .is_ok()
                    });
                    release.wait();
                    let Some(&(start, _)) = t0.get() else {
                        let nothing = WorkerOutput {
                            flows: Vec::new(),
                            latency: new_histogram(),
                            by_op: Default::default(),
                            steady: Default::default(),
                            fct: None,
                        };
                        return (nothing, pinned);
                    };
                    let out = if cfg.pingpong {
                        pingpong::run(shard, params, start, c, sink)
                    } else {
                        let streams = worker::Streams {
                            sink,
                            fct_rows: rows,
                        };
                        worker::run(shard, params, start, c, streams)
                    };
                    (out, pinned)
                })
            })
            .collect();
        // The writer ends when the last worker drops its sender.
        drop(fct_tx);
        let fct_writer = fct_stream.map(|((tx, rx), w, p)| {
            drop(tx);
            scope.spawn(move || fct::write_rows(rx, p, w))
        });
        match control.await_go(cfg.start_timeout) {
            Ok(()) => {
                let _ = t0.set((Instant::now(), SystemTime::now()));
                let start_time = t0.get().expect("just set").1;
                let writer = streaming.then(|| {
                    scope.spawn(move || intervals::write(rx, shards.len(), outputs, start_time))
                });
                // --counters: the port's counters every interval (at least 10 ms: each
                // sample reads a few dozen sysfs files).
                let start = t0.get().expect("just set").0;
                let done = &counters_done;
                let sampler = counters_out.map(|mut w| {
                    let every = cfg.interval.max(Duration::from_millis(10));
                    scope.spawn(move || port_counters::stream(port, every, start, done, &mut *w))
                });
                release.wait();
                watch(control, &handles, &counters, cfg, params);
                counters_done.store(true, Ordering::Relaxed);
                if let Some(w) = writer {
                    written = w.join().expect("interval writer panicked");
                }
                if let Some(s) = sampler {
                    counters_error = s.join().expect("counter sampler panicked").err();
                }
            }
            Err(e) => {
                go_error = Some(e);
                release.wait(); // t0 unset: the threads return at once
            }
        }
        let outputs = handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect();
        fct_written = fct_writer.map(|w| w.join().expect("FCT writer panicked"));
        outputs
    });
    if let Some(e) = go_error {
        return Err(e);
    }
    let &(start, start_time) = t0.get().expect("started");
    let (outputs, pinned) = outputs_of_threads.into_iter().unzip();
    Ok(Finished {
        outputs,
        pinned,
        start,
        start_time,
        stream_error: written
            .error
            .or(counters_error)
            .or(fct_written.and_then(Result::err)),
        latency_intervals: written.latency_intervals,
    })
}

/// While the threads work: watch the server's connection (it only closes if the server dies)
/// and draw the progress line on a terminal.
fn watch<T>(
    control: &Control,
    handles: &[std::thread::ScopedJoinHandle<'_, T>],
    counters: &[Counters],
    cfg: &RunConfig,
    params: &WorkerParams,
) {
    let started = Instant::now();
    let show = cfg.progress && std::io::stderr().is_terminal() && expected_long(cfg);
    let mut last = (0u64, Instant::now());
    let mut shown = false;
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if control.peer_gone() {
            params.stop_token.request(Reason::PeerLost);
        }
        if show && last.1.elapsed() >= Duration::from_millis(500) {
            let (ops, bytes) = progress::totals(counters);
            let rate = gbps(bytes - last.0, last.1.elapsed().as_secs_f64());
            eprint!(
                "{}",
                progress::line(started.elapsed().as_secs_f64(), ops, rate, cfg.flows)
            );
            let _ = std::io::stderr().flush();
            last = (bytes, Instant::now());
            shown = true;
        }
    }
    if shown {
        eprintln!();
    }
}

fn expected_long(cfg: &RunConfig) -> bool {
    match cfg.stop {
        StopAt::Duration(d) => d > Duration::from_secs(2),
        StopAt::Iters(_) => true,
    }
}

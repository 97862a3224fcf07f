//! One thread driving its shard's flows for throughput: closed loop (keep `depth` outstanding
//! per flow) or open loop (post on a schedule, latency from the intended send time).
//! Every operation is signaled and timed from post to completion.
use super::pacing::{Arrival, Pacer};
use super::progress::Counters;
use super::shard::Shard;
use super::stats::{FlowStats, Recorder};
use super::stop;
use super::{Op, StopAt};
use crate::verbs::{wc_status_str, WorkCompletion};
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// How long outstanding operations may take to complete once posting stops.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy)]
pub struct WorkerParams {
    pub op: Op,
    pub size: u32,
    pub depth: u32,
    pub stop: StopAt,
    /// Open loop: operations per second per flow; None: closed loop.
    pub rate: Option<(f64, Arrival)>,
    pub interval_ns: u64,
    pub hdr_interval_ns: u64,
    /// Operations posted before this (ns since the start) are not in the latency histograms.
    pub warmup_ns: u64,
    pub seed: u64,
}

pub struct WorkerOutput {
    pub flows: Vec<FlowStats>,
    /// Latency of every operation of this thread, one histogram per HdrHistogram-log interval.
    pub intervals: Vec<Histogram<u64>>,
}

struct FlowState {
    posted: u64,
    outstanding: u32,
    /// When each slot's operation was posted (or was due, open loop), ns since start.
    slot_ns: Vec<u64>,
    free: Vec<u16>,
    pacer: Option<Pacer>,
}

fn wr_id(flow: usize, slot: u16) -> u64 {
    ((flow as u64) << 16) | u64::from(slot)
}

fn decode(wr_id: u64) -> (usize, u16) {
    ((wr_id >> 16) as usize, (wr_id & 0xffff) as u16)
}

/// Runs until the stop condition, Ctrl-C or a lost peer, then drains. `t0` is the common start.
pub fn run(shard: &Shard, p: &WorkerParams, t0: Instant, counters: &Counters) -> WorkerOutput {
    let n = shard.flows.len();
    let mut stats: Vec<FlowStats> = shard.flows.iter().map(|f| FlowStats::new(f.id)).collect();
    let mut state: Vec<FlowState> = shard
        .flows
        .iter()
        .map(|f| FlowState {
            posted: 0,
            outstanding: 0,
            slot_ns: vec![0; p.depth as usize],
            free: (0..p.depth as u16).rev().collect(),
            pacer: p
                .rate
                .map(|(rate, arrival)| Pacer::new(rate, arrival, p.seed ^ u64::from(f.id))),
        })
        .collect();
    let mut recorder = Recorder::new(p.interval_ns, p.hdr_interval_ns, p.warmup_ns);
    let deadline_ns = match p.stop {
        StopAt::Duration(d) => Some(d.as_nanos() as u64),
        StopAt::Iters(_) => None,
    };
    let max_posts = match p.stop {
        StopAt::Iters(n) => n,
        StopAt::Duration(_) => u64::MAX,
    };
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut stopping = false;
    let mut drain_until = 0u64;
    let now_ns = || t0.elapsed().as_nanos() as u64;

    // Post one operation of flow i if it may; returns false when the flow is finished posting.
    let post = |i: usize, st: &mut FlowState, fs: &mut FlowStats, when_ns: u64| -> bool {
        let Some(slot) = st.free.pop() else {
            return true;
        };
        let f = &shard.flows[i];
        let remote = f.remote.expect("flow connected before the start");
        let local = shard.mr.sge(f.send_off, p.size);
        let posted_ns = now_ns();
        let result = match p.op {
            Op::Write => f.qp.post_write(
                wr_id(i, slot),
                local,
                remote.buf.addr,
                remote.buf.rkey,
                true,
            ),
            Op::Send => f.qp.post_send(wr_id(i, slot), local, true),
        };
        match result {
            Ok(()) => {
                st.slot_ns[slot as usize] = when_ns.min(posted_ns);
                st.posted += 1;
                st.outstanding += 1;
                fs.posted(posted_ns);
                true
            }
            Err(e) => {
                st.free.push(slot);
                fs.error.get_or_insert_with(|| format!("post failed: {e}"));
                false
            }
        }
    };

    // Closed loop starts with `depth` posts per flow, round by round: every flow's first
    // operation goes out before any flow's second, so flows start as close together as posting
    // allows (each post is a system call on some providers). Open loop follows its schedule.
    if p.rate.is_none() {
        for _ in 0..p.depth {
            for i in 0..n {
                if stats[i].error.is_none() && state[i].posted < max_posts {
                    post(i, &mut state[i], &mut stats[i], 0);
                }
            }
        }
    }

    loop {
        let got = match shard.cq.poll(&mut wcs) {
            Ok(k) => k,
            Err(e) => {
                for fs in &mut stats {
                    fs.error
                        .get_or_insert_with(|| format!("polling the CQ failed: {e}"));
                }
                break;
            }
        };
        let now = now_ns();
        let (mut done_ops, mut done_bytes) = (0, 0);
        for wc in &wcs[..got] {
            let (i, slot) = decode(wc.wr_id);
            let (st, fs) = (&mut state[i], &mut stats[i]);
            st.outstanding -= 1;
            st.free.push(slot);
            if !wc.ok() {
                // The first error is the real one; the rest are flushes.
                fs.error.get_or_insert_with(|| wc_status_str(wc.status));
                continue;
            }
            recorder.complete(fs, u64::from(p.size), st.slot_ns[slot as usize], now);
            done_ops += 1;
            done_bytes += u64::from(p.size);
            if p.rate.is_none() && !stopping && fs.error.is_none() && st.posted < max_posts {
                post(i, st, fs, now);
            }
        }
        if done_ops > 0 {
            counters.add(done_ops, done_bytes);
        }

        if !stopping && (stop::requested().is_some() || deadline_ns.is_some_and(|d| now >= d)) {
            stopping = true;
            drain_until = now + DRAIN_TIMEOUT.as_nanos() as u64;
        }
        if !stopping {
            if p.rate.is_some() {
                for i in 0..n {
                    let (st, fs) = (&mut state[i], &mut stats[i]);
                    while fs.error.is_none() && st.posted < max_posts && !st.free.is_empty() {
                        let due = st.pacer.as_ref().map_or(0, Pacer::due_ns);
                        if now < due || !post(i, st, fs, due) {
                            break;
                        }
                        if let Some(pacer) = st.pacer.as_mut() {
                            pacer.advance();
                        }
                    }
                }
            }
        } else if now >= drain_until {
            for (st, fs) in state.iter().zip(&mut stats) {
                if st.outstanding > 0 && fs.error.is_none() {
                    fs.error = Some(format!(
                        "{} operations still outstanding when the run stopped",
                        st.outstanding
                    ));
                }
            }
            break;
        }
        let finished = state.iter().zip(&stats).all(|(st, fs)| {
            st.outstanding == 0 && (stopping || fs.error.is_some() || st.posted >= max_posts)
        });
        if finished {
            break;
        }
    }
    WorkerOutput {
        flows: stats,
        intervals: recorder.intervals,
    }
}

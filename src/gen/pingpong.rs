//! Round trips, like perftest's `ib_write_lat` / `ib_send_lat`: each flow sends one message,
//! the server echoes it, and the time from post to the echo's arrival is one round trip.
//!
//! WRITE: we write `size` bytes whose last byte is a sequence number into the server's buffer;
//! the server watches that byte and writes back; we watch our own buffer's last byte.
//! SEND: we keep a receive posted; the server answers each SEND with a SEND.
use super::progress::Counters;
use super::shard::Shard;
use super::stats::{FlowStats, Recorder};
use super::stop;
use super::worker::{WorkerOutput, WorkerParams, DRAIN_TIMEOUT};
use super::{Op, StopAt};
use crate::verbs::{wc_status_str, WorkCompletion};
use std::time::Instant;

const KIND_SEND: u64 = 0;
const KIND_RECV: u64 = 1;
/// Signaled sends not yet reaped, per flow, before we wait for their completions.
pub const MAX_UNREAPED_SENDS: u32 = 8;

struct Flow {
    seq: u8,
    waiting: bool,
    posted_ns: u64,
    unreaped: u32,
    round_trips: u64,
}

/// Next sequence number: 1..=255, never 0 (the buffer's initial value).
fn next_seq(seq: u8) -> u8 {
    seq % 255 + 1
}

pub fn run(shard: &Shard, p: &WorkerParams, t0: Instant, counters: &Counters) -> WorkerOutput {
    let now_ns = || t0.elapsed().as_nanos() as u64;
    let size = p.size as usize;
    let mut stats: Vec<FlowStats> = shard.flows.iter().map(|f| FlowStats::new(f.id)).collect();
    let mut flows: Vec<Flow> = shard
        .flows
        .iter()
        .map(|_| Flow {
            seq: 0,
            waiting: false,
            posted_ns: 0,
            unreaped: 0,
            round_trips: 0,
        })
        .collect();
    let mut recorder = Recorder::new(p.interval_ns, p.hdr_interval_ns, p.warmup_ns);
    let (deadline_ns, max_trips) = match p.stop {
        StopAt::Duration(d) => (Some(d.as_nanos() as u64), u64::MAX),
        StopAt::Iters(n) => (None, n),
    };
    let post_recv = |i: usize| {
        let f = &shard.flows[i];
        f.qp.post_recv(
            (i as u64) << 16 | KIND_RECV,
            shard.mr.sge(f.recv_off, shard.slot as u32),
        )
    };
    // Sends the next message of flow i.
    let send = |i: usize, fl: &mut Flow, fs: &mut FlowStats| {
        let f = &shard.flows[i];
        let remote = f.remote.expect("flow connected before the start");
        fl.seq = next_seq(fl.seq);
        shard.mr.write_byte(f.send_off + size - 1, fl.seq);
        let now = now_ns();
        let id = (i as u64) << 16 | KIND_SEND;
        let local = shard.mr.sge(f.send_off, p.size);
        let r = match p.op {
            Op::Write => {
                f.qp.post_write(id, local, remote.buf.addr, remote.buf.rkey, true)
            }
            Op::Send => f.qp.post_send(id, local, true),
        };
        match r {
            Ok(()) => {
                fl.posted_ns = now;
                fl.waiting = true;
                fl.unreaped += 1;
                fs.posted(now);
            }
            Err(e) => {
                fs.error.get_or_insert_with(|| format!("post failed: {e}"));
            }
        }
    };

    if p.op == Op::Send {
        for (i, fs) in stats.iter_mut().enumerate() {
            if let Err(e) = post_recv(i) {
                fs.error = Some(format!("posting a receive failed: {e}"));
            }
        }
    }
    for i in 0..flows.len() {
        if stats[i].error.is_none() && max_trips > 0 {
            send(i, &mut flows[i], &mut stats[i]);
        }
    }

    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut stopping = false;
    let mut drain_until = 0;
    let mut echoes = Vec::with_capacity(flows.len());
    loop {
        let got = shard.cq.poll(&mut wcs).unwrap_or_else(|e| {
            for fs in stats.iter_mut() {
                fs.error
                    .get_or_insert_with(|| format!("polling the CQ failed: {e}"));
            }
            0
        });
        let mut now = now_ns();
        echoes.clear();
        for wc in &wcs[..got] {
            let i = (wc.wr_id >> 16) as usize;
            if !wc.ok() {
                stats[i]
                    .error
                    .get_or_insert_with(|| wc_status_str(wc.status));
                flows[i].waiting = false;
                continue;
            }
            if wc.wr_id & 0xffff == KIND_SEND {
                flows[i].unreaped -= 1;
            } else if wc.is_recv() {
                echoes.push(i);
            }
        }
        if p.op == Op::Write {
            for (i, f) in shard.flows.iter().enumerate() {
                if flows[i].waiting && shard.mr.read_byte(f.recv_off + size - 1) == flows[i].seq {
                    echoes.push(i);
                }
            }
        }
        if !echoes.is_empty() {
            now = now_ns();
        }
        for &i in &echoes {
            let (fl, fs) = (&mut flows[i], &mut stats[i]);
            if !fl.waiting {
                continue;
            }
            fl.waiting = false;
            fl.round_trips += 1;
            recorder.complete(fs, u64::from(p.size), fl.posted_ns, now);
            counters.add(1, u64::from(p.size));
            if p.op == Op::Send {
                if let Err(e) = post_recv(i) {
                    fs.error
                        .get_or_insert_with(|| format!("posting a receive failed: {e}"));
                }
            }
        }
        if !stopping && (stop::requested().is_some() || deadline_ns.is_some_and(|d| now >= d)) {
            stopping = true;
            drain_until = now + DRAIN_TIMEOUT.as_nanos() as u64;
        }
        // Next round trip for every flow that is idle, if it may go on.
        if !stopping {
            for i in 0..flows.len() {
                let (fl, fs) = (&mut flows[i], &mut stats[i]);
                if !fl.waiting
                    && fs.error.is_none()
                    && fl.round_trips < max_trips
                    && fl.unreaped < MAX_UNREAPED_SENDS
                {
                    send(i, fl, fs);
                }
            }
        }
        let finished = flows.iter().zip(&stats).all(|(fl, fs)| {
            !fl.waiting && (fs.error.is_some() || stopping || fl.round_trips >= max_trips)
        });
        if finished || (stopping && now >= drain_until) {
            break;
        }
    }
    WorkerOutput {
        flows: stats,
        intervals: recorder.intervals,
    }
}

#[cfg(test)]
mod tests {
    use super::next_seq;

    #[test]
    fn sequence_never_returns_to_zero() {
        let mut s = 0u8;
        for _ in 0..1000 {
            let n = next_seq(s);
            assert!(n != 0 && n != s);
            s = n;
        }
    }
}

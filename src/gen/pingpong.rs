//! Round trips, like perftest's `ib_write_lat` / `ib_send_lat`: each flow sends one message,
//! the server echoes it, and the time from post to the echo's arrival is one round trip.
//! A [`Pattern`] of the thread loop ([`drive`]).
//!
//! WRITE: we write `size` bytes whose last byte is a sequence number into the server's buffer;
//! the server watches that byte and writes back; we watch our own buffer's last byte.
//! SEND: we keep a receive posted; the server answers each SEND with a SEND.
use super::drive::{drive, Limits, Pattern, Post, Transport};
use super::intervals::Sink;
use super::ops::Op;
use super::progress::Counters;
use super::shard::Shard;
use super::stats::{FlowStats, Recorder};
use super::worker::{WorkerOutput, WorkerParams};
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

struct PingPong<'a, C: Fn() -> u64> {
    p: &'a WorkerParams,
    now_ns: C,
    flows: Vec<Flow>,
    stats: Vec<FlowStats>,
    recorder: Recorder,
    counters: &'a Counters,
    max_trips: u64,
    /// Flows whose echo arrived this round (reused: no allocation per round).
    echoes: Vec<usize>,
    /// WRITE or SEND (the run's only op: checked when the run was made).
    op: Op,
}

impl<C: Fn() -> u64> PingPong<'_, C> {
    /// Sends flow i's next message.
    fn send<T: Transport>(&mut self, io: &T, i: usize) {
        let (fl, fs) = (&mut self.flows[i], &mut self.stats[i]);
        fl.seq = next_seq(fl.seq);
        io.stamp(i, self.p.size, fl.seq);
        let now = (self.now_ns)();
        let req = Post::message(self.op, self.p.size, (i as u64) << 16 | KIND_SEND);
        match io.post(i, &req) {
            Ok(()) => {
                fl.posted_ns = now;
                fl.waiting = true;
                fl.unreaped += 1;
                fs.posted(now);
            }
            Err(e) => {
                fs.error.get_or_insert(e);
            }
        }
    }

    fn post_recv<T: Transport>(&mut self, io: &T, i: usize) {
        if let Err(e) = io.post_recv(i, (i as u64) << 16 | KIND_RECV) {
            self.stats[i].error.get_or_insert(e);
        }
    }
}

impl<T: Transport, C: Fn() -> u64> Pattern<T> for PingPong<'_, C> {
    fn start(&mut self, io: &T) {
        if self.op == Op::Send {
            for i in 0..self.flows.len() {
                self.post_recv(io, i);
            }
        }
        for i in 0..self.flows.len() {
            if self.stats[i].error.is_none() && self.max_trips > 0 {
                self.send(io, i);
            }
        }
    }

    fn completed(&mut self, io: &T, wcs: &[WorkCompletion], now: u64, _stopping: bool) {
        self.recorder.tick(now);
        self.echoes.clear();
        for wc in wcs {
            let i = (wc.wr_id >> 16) as usize;
            if !wc.ok() {
                self.stats[i]
                    .error
                    .get_or_insert_with(|| wc_status_str(wc.status));
                self.flows[i].waiting = false;
                continue;
            }
            if wc.wr_id & 0xffff == KIND_SEND {
                self.flows[i].unreaped -= 1;
            } else if wc.is_recv() {
                self.echoes.push(i);
            }
        }
        if self.op == Op::Write {
            for (i, fl) in self.flows.iter().enumerate() {
                if fl.waiting && io.echoed(i, self.p.size) == fl.seq {
                    self.echoes.push(i);
                }
            }
        }
        // An echo found in memory arrived after the poll: time it now.
        let now = if self.echoes.is_empty() {
            now
        } else {
            (self.now_ns)()
        };
        for k in 0..self.echoes.len() {
            let i = self.echoes[k];
            let (fl, fs) = (&mut self.flows[i], &mut self.stats[i]);
            if !fl.waiting {
                continue;
            }
            fl.waiting = false;
            fl.round_trips += 1;
            self.recorder
                .complete(i, fs, self.op, u64::from(self.p.size), fl.posted_ns, now);
            self.counters.add(1, u64::from(self.p.size));
            if self.op == Op::Send {
                self.post_recv(io, i);
            }
        }
    }

    /// The next round trip of every idle flow that may go on.
    fn post_more(&mut self, io: &T, _now: u64) {
        for i in 0..self.flows.len() {
            let fl = &self.flows[i];
            if !fl.waiting
                && self.stats[i].error.is_none()
                && fl.round_trips < self.max_trips
                && fl.unreaped < MAX_UNREAPED_SENDS
            {
                self.send(io, i);
            }
        }
    }

    fn finished(&self, stopping: bool) -> bool {
        self.flows.iter().zip(&self.stats).all(|(fl, fs)| {
            !fl.waiting && (fs.error.is_some() || stopping || fl.round_trips >= self.max_trips)
        })
    }

    /// A round trip still waiting when the drain limit passed is in flight, not counted.
    fn abandon(&mut self) {
        for (fl, fs) in self.flows.iter().zip(&mut self.stats) {
            fs.in_flight = u32::from(fl.waiting);
        }
    }

    fn stats_mut(&mut self) -> &mut [FlowStats] {
        &mut self.stats
    }
}

fn pingpong<T: Transport>(
    io: &T,
    flow_ids: &[u32],
    p: &WorkerParams,
    limits: Limits,
    now_ns: impl Fn() -> u64,
    counters: &Counters,
    sink: Option<Sink>,
) -> WorkerOutput {
    let mut pattern = PingPong {
        p,
        flows: flow_ids
            .iter()
            .map(|_| Flow {
                seq: 0,
                waiting: false,
                posted_ns: 0,
                unreaped: 0,
                round_trips: 0,
            })
            .collect(),
        stats: flow_ids.iter().map(|&id| FlowStats::new(id)).collect(),
        recorder: Recorder::new(sink, p.kept_series_ns, p.warmup_ns, p.steady_ns),
        counters,
        max_trips: p.max_ops(),
        echoes: Vec::with_capacity(flow_ids.len()),
        op: p.mix.only().unwrap_or(Op::Write),
        now_ns: &now_ns,
    };
    drive(io, &mut pattern, limits, &now_ns);
    let (latency, by_op, steady) = pattern.recorder.finish();
    WorkerOutput {
        flows: pattern.stats,
        latency,
        by_op,
        steady,
        fct: None,
    }
}

/// Runs the shard's flows' round trips until the stop condition, Ctrl-C or a lost peer.
/// `t0` is the common start.
pub fn run(
    shard: &Shard,
    p: &WorkerParams,
    t0: Instant,
    counters: &Counters,
    sink: Option<Sink>,
) -> WorkerOutput {
    let ids: Vec<u32> = shard.flows.iter().map(|f| f.id).collect();
    let now_ns = || t0.elapsed().as_nanos() as u64;
    pingpong(shard, &ids, p, p.limits(), now_ns, counters, sink)
}

#[cfg(test)]
mod tests {
    use super::super::drive::fake::{self, ticking, Fake};
    use super::super::stop::StopToken;
    use super::*;

    #[test]
    fn sequence_never_returns_to_zero() {
        let mut s = 0u8;
        for _ in 0..1000 {
            let n = next_seq(s);
            assert!(n != 0 && n != s);
            s = n;
        }
    }

    fn params(op: Op, trips: u64) -> WorkerParams {
        fake::params(op, 8, 1, trips)
    }

    #[test]
    fn every_flow_completes_its_round_trips_over_write_and_send() {
        for op in [Op::Write, Op::Send] {
            let mut fake = Fake::new(3);
            fake.echo = true;
            let p = params(op, 300);
            let out = pingpong(
                &fake,
                &[0, 1, 2],
                &p,
                p.limits(),
                ticking(),
                &Counters::default(),
                None,
            );
            for f in &out.flows {
                assert!(f.error.is_none(), "{op:?}: {:?}", f.error);
                assert_eq!(f.ops, 300, "{op:?}");
                assert!(
                    f.latency.min() >= 1_000,
                    "{op:?}: a round trip spans clock readings"
                );
            }
            // One message in flight per flow, and sends reaped within the limit.
            assert_eq!(fake.posts.get(), 900, "{op:?}");
            assert!(
                fake.max_outstanding
                    .borrow()
                    .iter()
                    .all(|&m| m <= MAX_UNREAPED_SENDS),
                "{op:?}: {:?}",
                fake.max_outstanding.borrow()
            );
        }
    }

    #[test]
    fn a_failed_send_ends_its_flow_and_a_missing_echo_ends_at_the_deadline() {
        let mut fake = Fake::new(2);
        fake.echo = true;
        fake.fail = Some((0, 3));
        let p = params(Op::Write, 10);
        let out = pingpong(
            &fake,
            &[0, 1],
            &p,
            p.limits(),
            ticking(),
            &Counters::default(),
            None,
        );
        assert_eq!(out.flows[0].ops, 2);
        assert!(out.flows[0].error.is_some());
        assert_eq!(out.flows[1].ops, 10);

        // No echo ever: the deadline stops the wait, nothing is counted.
        let fake = Fake::new(1);
        let limits = Limits {
            deadline_ns: Some(10_000),
            drain_ns: 10_000,
            stop: StopToken::new(),
        };
        let out = pingpong(
            &fake,
            &[0],
            &params(Op::Write, 10),
            limits,
            ticking(),
            &Counters::default(),
            None,
        );
        assert_eq!((out.flows[0].ops, out.flows[0].in_flight), (0, 1));
        assert!(out.flows[0].error.is_none());
    }
}

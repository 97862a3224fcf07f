//! Throughput traffic, closed loop (keep `depth` outstanding per flow) or open loop (post on a
//! schedule, latency from the intended send time), as a [`Pattern`] of the thread loop
//! ([`drive`]). Every operation is timed from post to completion. With a mix, each post draws
//! its op from the flow's [`Picker`]; a cmp_swap compares with the value its flow's previous
//! swap put in (so each swaps, unless something else changed the word: it is counted).
use super::drive::{drive, Limits, Pattern, Post, Transport};
use super::fct::{FctBuckets, FctLog, FctParams, FctRow};
use super::intervals::Sink;
use super::ops::Picker;
use super::ops::{Op, OpMix};
use super::pacing::{Arrival, Pacer};
use super::progress::Counters;
use super::run_config::StopAt;
use super::shard::Shard;
use super::sizes::{SizeSampler, Sizes};
use super::stats::{ByOp, FlowStats, Recorder, SteadySpan};
use super::stop::StopToken;
use crate::verbs::{wc_status_str, WorkCompletion, POST_LIST_MAX};
use crossbeam::channel::Sender;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long outstanding operations may take to complete once posting stops.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct WorkerParams {
    pub mix: OpMix,
    pub size: u32,
    pub depth: u32,
    pub stop: StopAt,
    /// Open loop: operations per second per flow; None: closed loop.
    pub rate: Option<(f64, Arrival)>,
    /// Closed loop: one operation in this many asks for a completion (and every one that
    /// fills the flow's depth); the others are known complete when a later one completes
    /// (perftest's `--cq-mod`). 1: every operation is signaled and timed exactly.
    pub signal_every: u32,
    /// `--json-series`: each flow keeps its bytes per interval of this length.
    pub kept_series_ns: Option<u64>,
    /// Operations posted before this (ns since the start) are not in the latency histograms.
    pub warmup_ns: u64,
    /// Completions inside this window (ns since the start) are the steady-state throughput.
    pub steady_ns: (u64, u64),
    pub seed: u64,
    /// Ctrl-C or a lost peer: stop posting, drain.
    pub stop_token: StopToken,
    /// Sizes drawn per message (`--size uniform:…`, a CDF); None: every message is `size`.
    pub sizes: Option<Sizes>,
    /// `--fct`: each message's completion time and slowdown, reckoned so.
    pub fct: Option<FctParams>,
}

impl WorkerParams {
    /// The thread loop's limits: the duration (if any) and [`DRAIN_TIMEOUT`].
    pub fn limits(&self) -> Limits {
        Limits {
            deadline_ns: match self.stop {
                StopAt::Duration(d) => Some(d.as_nanos() as u64),
                StopAt::Iters(_) => None,
            },
            drain_ns: DRAIN_TIMEOUT.as_nanos() as u64,
            stop: self.stop_token,
        }
    }

    /// Operations (round trips) per flow, or unlimited.
    pub fn max_ops(&self) -> u64 {
        match self.stop {
            StopAt::Iters(n) => n,
            StopAt::Duration(_) => u64::MAX,
        }
    }
}

pub struct WorkerOutput {
    pub flows: Vec<FlowStats>,
    /// Every measured latency of the thread, at full precision.
    pub latency: Histogram<u64>,
    /// The thread's completions by op type.
    pub by_op: ByOp,
    /// Its completions in the steady-state window, between completion events.
    pub steady: SteadySpan,
    /// With `--fct`: the thread's FCT and slowdown histograms by size bucket.
    pub fct: Option<FctBuckets>,
}

/// Where a thread sends what it measures as the run goes.
#[derive(Default)]
pub struct Streams {
    /// The time series and latency intervals.
    pub sink: Option<Sink>,
    /// `--fct`: every message's row.
    pub fct_rows: Option<Sender<Vec<FctRow>>>,
}

struct FlowState {
    posted: u64,
    outstanding: u32,
    /// When each slot's operation was posted (or was due, open loop), ns since start.
    slot_ns: Vec<u64>,
    /// Each slot's op, and a cmp_swap's expected value.
    slot_op: Vec<Op>,
    /// Each slot's message size (drawn, with a size distribution).
    slot_size: Vec<u32>,
    slot_cmp: Vec<u64>,
    /// cmp_swaps posted: the next one expects the word to hold this (each adds 1).
    swaps: u64,
    /// With a mix: the flow's draw of its next op.
    picker: Option<Picker>,
    free: Vec<u16>,
    /// The busy slots in posting order: a completion covers its slot and every one before it.
    order: VecDeque<u16>,
    pacer: Option<Pacer>,
    /// With a size distribution: the flow's draws.
    sampler: Option<SizeSampler>,
}

impl FlowState {
    /// Undoes [`Throughput::take_slot`] for the latest request taken, which did not go in.
    fn give_back(&mut self, req: &Post) {
        debug_assert_eq!(self.order.back(), Some(&req.slot));
        self.order.pop_back();
        self.free.push(req.slot);
        self.swaps -= u64::from(req.op == Op::CmpSwap);
        self.posted -= 1;
        self.outstanding -= 1;
    }
}

/// The most payload one posted list carries (READ: asks for). On rxe a longer list of large
/// messages goes out as one burst that its queues drop (a list of four 64 KiB READs: 400 retries
/// in 5 s and 0.4x the throughput; 64 KiB WRITEs: 3x the retries); within this, lists of
/// small messages keep their gain (4,000 flows of 4 KiB: 1.06-1.18x).
const LIST_BYTES_MAX: u64 = 64 << 10;

fn wr_id(flow: usize, slot: u16) -> u64 {
    ((flow as u64) << 16) | u64::from(slot)
}

fn decode(wr_id: u64) -> (usize, u16) {
    ((wr_id >> 16) as usize, (wr_id & 0xffff) as u16)
}

/// The throughput pattern's state: per flow, its free slots and when each busy one was posted.
struct Throughput<'a, C: Fn() -> u64> {
    p: &'a WorkerParams,
    now_ns: C,
    state: Vec<FlowState>,
    stats: Vec<FlowStats>,
    recorder: Recorder,
    counters: &'a Counters,
    max_posts: u64,
    /// The op of a run of one op (no draw).
    only: Op,
    fct: Option<FctLog>,
}

impl<C: Fn() -> u64> Throughput<'_, C> {
    /// Posts one operation of flow i if it has a free slot; false when the flow failed.
    /// `when_ns`: when it was due (open loop), or 0 (closed loop: the latency starts now).
    fn post<T: Transport>(&mut self, io: &T, i: usize, when_ns: u64) -> bool {
        self.post_some(io, i, 1, when_ns)
    }

    /// Posts up to `n` operations of flow i, as many as it has free slots and may still post,
    /// in lists of up to [`POST_LIST_MAX`] requests and [`LIST_BYTES_MAX`] bytes (one doorbell
    /// each: on rxe a system call per list instead of per operation); false when the flow
    /// failed.
    fn post_some<T: Transport>(&mut self, io: &T, i: usize, mut n: usize, when_ns: u64) -> bool {
        let mut reqs = [Post::message(Op::Write, 0, 0); POST_LIST_MAX];
        while n > 0 && self.may_post(i) {
            let room = self.max_posts - self.state[i].posted;
            let most = n
                .min(POST_LIST_MAX)
                .min(self.state[i].free.len())
                .min(usize::try_from(room).unwrap_or(usize::MAX));
            if most == 0 {
                break;
            }
            let (mut k, mut bytes) = (0, 0);
            while k < most && bytes < LIST_BYTES_MAX {
                reqs[k] = self.take_slot(i);
                bytes += u64::from(reqs[k].size);
                k += 1;
            }
            let posted_ns = (self.now_ns)();
            let went_in = match io.post_list(i, &reqs[..k]) {
                Ok(()) => k,
                Err((went_in, e)) => {
                    self.stats[i].error.get_or_insert(e);
                    went_in
                }
            };
            let (st, fs) = (&mut self.state[i], &mut self.stats[i]);
            for req in reqs[..k].iter().rev().take(k - went_in) {
                st.give_back(req);
            }
            for req in &reqs[..went_in] {
                st.slot_ns[req.slot as usize] = when_ns.min(posted_ns);
            }
            if went_in > 0 {
                fs.posted(posted_ns);
            }
            if went_in < k {
                return false;
            }
            n -= k;
        }
        true
    }

    /// Takes a free slot of flow i for its next operation (draws its op and size, counts it
    /// posted); the flow has a free slot.
    fn take_slot(&mut self, i: usize) -> Post {
        let st = &mut self.state[i];
        let slot = st.free.pop().expect("a free slot");
        let every = u64::from(self.p.signal_every.max(1));
        // Signaled: every Nth, the one that fills the depth (else nothing would ever complete
        // visibly), and the flow's last.
        let signaled = every == 1
            || (st.posted + 1) % every == 0
            || st.free.is_empty()
            || st.posted + 1 == self.max_posts;
        let op = match &mut st.picker {
            Some(picker) => picker.draw(),
            None => self.only,
        };
        let size = match (&mut st.sampler, &self.p.sizes) {
            (Some(sampler), Some(sizes)) => sampler.draw(sizes),
            _ => self.p.size,
        };
        let req = Post {
            op,
            size,
            wr_id: wr_id(i, slot),
            slot,
            signaled,
            compare: st.swaps,
        };
        st.slot_op[slot as usize] = op;
        st.slot_size[slot as usize] = size;
        st.slot_cmp[slot as usize] = st.swaps;
        st.swaps += u64::from(op == Op::CmpSwap);
        st.order.push_back(slot);
        st.posted += 1;
        st.outstanding += 1;
        req
    }

    fn may_post(&self, i: usize) -> bool {
        self.stats[i].error.is_none() && self.state[i].posted < self.max_posts
    }
}

impl<T: Transport, C: Fn() -> u64> Pattern<T> for Throughput<'_, C> {
    /// Closed loop starts with `depth` posts per flow, round by round: every flow's first
    /// operation goes out before any flow's second, so flows start as close together as
    /// posting allows (each post is a system call on some providers). Open loop follows its
    /// schedule from the first `post_more`.
    fn start(&mut self, io: &T) {
        if self.p.rate.is_none() {
            for _ in 0..self.p.depth {
                for i in 0..self.state.len() {
                    // Thousands of first posts take a while (a system call each on rxe):
                    // Ctrl-C stops them too.
                    if i % 64 == 0 && self.p.stop_token.is_set() {
                        return;
                    }
                    if self.may_post(i) {
                        self.post(io, i, 0);
                    }
                }
            }
        }
    }

    fn completed(&mut self, io: &T, wcs: &[WorkCompletion], now: u64, stopping: bool) {
        self.recorder.tick(now);
        let (mut done_ops, mut done_bytes) = (0, 0);
        for wc in wcs {
            let (i, slot) = decode(wc.wr_id);
            // This completion covers its own operation and, unsignaled, every one posted
            // before it on the flow (an RC send queue completes in order).
            let mut freed = 0;
            loop {
                let (st, fs) = (&mut self.state[i], &mut self.stats[i]);
                let Some(q) = st.order.pop_front() else { break };
                st.outstanding -= 1;
                st.free.push(q);
                freed += 1;
                if q == slot && !wc.ok() {
                    // The first error is the real one; the rest are flushes.
                    fs.error.get_or_insert_with(|| wc_status_str(wc.status));
                    break;
                }
                let op = st.slot_op[q as usize];
                let (size, started) = (st.slot_size[q as usize], st.slot_ns[q as usize]);
                if let Some(fct) = &mut self.fct {
                    if started >= self.p.warmup_ns {
                        fct.record(fs.flow, size, started, now);
                    }
                }
                let size = u64::from(size);
                if op == Op::CmpSwap && io.atomic_result(i, q) == st.slot_cmp[q as usize] {
                    self.recorder.swapped();
                }
                self.recorder
                    .complete(i, fs, op, size, st.slot_ns[q as usize], now);
                done_ops += 1;
                done_bytes += size;
                if q == slot {
                    break;
                }
            }
            if self.p.rate.is_none() && !stopping {
                self.post_some(io, i, freed, now);
            }
        }
        if done_ops > 0 {
            self.counters.add(done_ops, done_bytes);
        }
    }

    fn post_more(&mut self, io: &T, now: u64) {
        if self.p.rate.is_none() {
            return;
        }
        for i in 0..self.state.len() {
            while self.may_post(i) && !self.state[i].free.is_empty() {
                let due = self.state[i].pacer.as_ref().map_or(0, Pacer::due_ns);
                if now < due || !self.post(io, i, due) {
                    break;
                }
                if let Some(pacer) = self.state[i].pacer.as_mut() {
                    pacer.advance();
                }
            }
        }
    }

    fn finished(&self, stopping: bool) -> bool {
        self.state.iter().zip(&self.stats).all(|(st, fs)| {
            st.outstanding == 0 && (stopping || fs.error.is_some() || st.posted >= self.max_posts)
        })
    }

    fn abandon(&mut self) {
        for (st, fs) in self.state.iter().zip(&mut self.stats) {
            fs.in_flight = st.outstanding;
        }
    }

    fn stats_mut(&mut self) -> &mut [FlowStats] {
        &mut self.stats
    }
}

/// Drives `flow_ids` (the flows of `io`, in order) until the stop condition, Ctrl-C or a lost
/// peer, then drains. `now_ns`: ns since the common start.
fn throughput<T: Transport>(
    io: &T,
    flow_ids: &[u32],
    p: &WorkerParams,
    limits: Limits,
    now_ns: impl Fn() -> u64,
    counters: &Counters,
    streams: Streams,
) -> WorkerOutput {
    let Streams { sink, fct_rows } = streams;
    let mut pattern = Throughput {
        p,
        state: flow_ids
            .iter()
            .map(|&id| FlowState {
                posted: 0,
                outstanding: 0,
                slot_ns: vec![0; p.depth as usize],
                slot_op: vec![Op::Write; p.depth as usize],
                slot_size: vec![p.size; p.depth as usize],
                sampler: p.sizes.as_ref().map(|_| SizeSampler::new(p.seed, id)),
                slot_cmp: vec![0; p.depth as usize],
                swaps: 0,
                picker: p
                    .mix
                    .only()
                    .is_none()
                    .then(|| Picker::new(&p.mix, p.seed, id)),
                free: (0..p.depth as u16).rev().collect(),
                order: VecDeque::with_capacity(p.depth as usize),
                pacer: p
                    .rate
                    .map(|(rate, arrival)| Pacer::new(rate, arrival, p.seed ^ u64::from(id))),
            })
            .collect(),
        stats: flow_ids.iter().map(|&id| FlowStats::new(id)).collect(),
        recorder: Recorder::new(sink, p.kept_series_ns, p.warmup_ns, p.steady_ns),
        counters,
        max_posts: p.max_ops(),
        only: p.mix.ops().next().expect("a mix has an op"),
        now_ns: &now_ns,
        fct: p.fct.map(|params| FctLog::new(params, fct_rows)),
    };
    drive(io, &mut pattern, limits, &now_ns);
    // Open loop: what the schedule asked for until posting stopped (the deadline, or now if
    // stopped early) and was never posted.
    let end_ns = limits.deadline_ns.map_or_else(&now_ns, |d| d.min(now_ns()));
    for (st, fs) in pattern.state.iter().zip(&mut pattern.stats) {
        if let Some(pacer) = &st.pacer {
            let allowed = pattern.max_posts.saturating_sub(st.posted);
            fs.missed = pacer.due_until(end_ns).min(allowed);
        }
    }
    let (latency, by_op, steady) = pattern.recorder.finish();
    WorkerOutput {
        flows: pattern.stats,
        latency,
        by_op,
        steady,
        fct: pattern.fct.map(FctLog::finish),
    }
}

/// Runs the shard's flows until the stop condition, Ctrl-C or a lost peer, then drains.
/// `t0` is the common start.
pub fn run(
    shard: &Shard,
    p: &WorkerParams,
    t0: Instant,
    counters: &Counters,
    streams: Streams,
) -> WorkerOutput {
    let ids: Vec<u32> = shard.flows.iter().map(|f| f.id).collect();
    let now_ns = || t0.elapsed().as_nanos() as u64;
    throughput(shard, &ids, p, p.limits(), now_ns, counters, streams)
}

#[cfg(test)]
mod tests {
    use super::super::drive::fake::{self, ticking, Fake};
    use super::*;

    fn params(depth: u32, ops: u64) -> WorkerParams {
        fake::params(Op::Write, 64, depth, ops)
    }

    /// The throughput pattern over `fake` on its ticking clock, without counters or streams.
    fn run(fake: &Fake, flow_ids: &[u32], p: &WorkerParams, limits: Limits) -> WorkerOutput {
        throughput(
            fake,
            flow_ids,
            p,
            limits,
            ticking(),
            &Counters::default(),
            Streams::default(),
        )
    }

    #[test]
    fn closed_loop_keeps_depth_outstanding_and_completes_every_operation() {
        let fake = Fake::new(3);
        let p = params(4, 50);
        let out = run(&fake, &[7, 8, 9], &p, p.limits());
        for (f, id) in out.flows.iter().zip([7, 8, 9]) {
            assert_eq!((f.flow, f.ops, f.bytes), (id, 50, 50 * 64));
            assert!(f.error.is_none(), "{:?}", f.error);
            assert_eq!(f.latency.len(), 50);
        }
        assert_eq!(fake.posts.get(), 150);
        assert_eq!(*fake.max_outstanding.borrow(), [4, 4, 4]);
        assert_eq!(*fake.outstanding.borrow(), [0, 0, 0]);
    }

    #[test]
    fn drawn_sizes_are_counted_as_drawn_and_every_message_gets_its_fct() {
        use crate::gen::sizes::{SizeDist, SizeSampler, Sizes};
        let fake = Fake::new(2);
        let mut p = params(4, 200);
        let sizes = Sizes {
            dist: SizeDist::uniform(1, 50_000).unwrap(),
            scale: 1.0,
        };
        p.size = sizes.max();
        p.sizes = Some(sizes.clone());
        p.fct = Some(FctParams {
            line_gbps: 8.0,
            base_ns: 0,
        });
        let (tx, rx) = crossbeam::channel::unbounded();
        let out = throughput(
            &fake,
            &[0, 1],
            &p,
            p.limits(),
            ticking(),
            &Counters::default(),
            Streams {
                sink: None,
                fct_rows: Some(tx),
            },
        );
        let rows: Vec<FctRow> = rx.iter().flatten().collect();
        assert_eq!(rows.len(), 400);
        for (f, id) in out.flows.iter().zip([0u32, 1]) {
            // The flow's bytes are its own seeded draws, in order.
            let mut draws = SizeSampler::new(p.seed, id);
            let expect: u64 = (0..200).map(|_| u64::from(draws.draw(&sizes))).sum();
            assert_eq!((f.ops, f.bytes), (200, expect));
            let rowed: u64 = (rows.iter().filter(|r| r.flow == id))
                .map(|r| u64::from(r.size))
                .sum();
            assert_eq!(rowed, expect);
        }
        let buckets = out.fct.expect("fct histograms");
        let timed: u64 = buckets.0.iter().map(|b| b.fct.len()).sum();
        assert_eq!(timed, 400);
        assert!(!buckets.0[0].fct.is_empty() && !buckets.0[1].fct.is_empty());
    }

    #[test]
    fn with_selective_signaling_one_completion_covers_the_operations_before_it() {
        let fake = Fake::new(2);
        // 101 operations: the last one is not a 4th, nor does it fill the depth.
        let mut p = params(8, 101);
        p.signal_every = 4;
        // A deadline far beyond the run (fake time): an operation never covered would show
        // as in flight instead of hanging the test.
        let limits = Limits {
            deadline_ns: Some(1_000_000_000),
            ..p.limits()
        };
        let out = run(&fake, &[0, 1], &p, limits);
        for f in &out.flows {
            assert_eq!((f.ops, f.bytes, f.latency.len()), (101, 101 * 64, 101));
            assert!(f.error.is_none(), "{:?}", f.error);
            assert_eq!(f.in_flight, 0);
        }
        assert_eq!(fake.posts.get(), 202);
        assert_eq!(*fake.max_outstanding.borrow(), [8, 8]);
        assert_eq!(*fake.outstanding.borrow(), [0, 0]);
        // Every silent completion was covered by a later signaled one.
        assert!(fake.unreported.borrow().iter().all(|&u| u == 0));
    }

    #[test]
    fn the_slots_a_completion_frees_go_out_as_one_list() {
        let fake = Fake::new(1);
        let mut p = params(8, 40);
        p.signal_every = 8;
        let out = run(&fake, &[0], &p, p.limits());
        assert_eq!(out.flows[0].ops, 40);
        // The start posts one at a time (every flow's first before any flow's second); each
        // completion then covers 8 and frees 8 slots: one list of 8.
        assert_eq!(*fake.lists.borrow(), [1, 1, 1, 1, 1, 1, 1, 1, 8, 8, 8, 8]);
    }

    #[test]
    fn a_list_stops_at_its_byte_budget() {
        // 24 KiB messages: a list ends with the one that reaches 64 KiB (3 of them).
        let fake = Fake::new(1);
        let mut p = fake::params(Op::Read, 24 << 10, 8, 24);
        p.signal_every = 8;
        let out = run(&fake, &[0], &p, p.limits());
        assert_eq!(out.flows[0].ops, 24);
        assert_eq!(
            *fake.lists.borrow(),
            [1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 3, 3, 2]
        );
    }

    #[test]
    fn a_post_refused_within_a_list_fails_its_flow_and_keeps_what_went_in() {
        let mut fake = Fake::new(2);
        // Flow 1's 12th post: the 4th of the list of 8 that follows its first completion.
        fake.refuse = Some((1, 12));
        let mut p = params(8, 40);
        p.signal_every = 8;
        // The 3 that went in are unsignaled and nothing later covers them: they stay in
        // flight until the drain limit (a device flushes them with an error completion when
        // its QP fails; the fake does not).
        let limits = Limits {
            deadline_ns: Some(1_000_000_000),
            ..p.limits()
        };
        let out = run(&fake, &[0, 1], &p, limits);
        assert_eq!(out.flows[0].ops, 40);
        assert!(out.flows[0].error.is_none());
        // The first 8 completed; the 3 of the list that went in are accounted in flight, the
        // 5 refused nowhere.
        assert_eq!((out.flows[1].ops, out.flows[1].in_flight), (8, 3));
        assert_eq!(fake.posts.get(), 40 + 11);
        let err = out.flows[1].error.as_deref().unwrap_or("");
        assert!(err.contains("Cannot allocate memory"), "{err}");
    }

    #[test]
    fn an_error_completion_ends_its_flow_only() {
        let mut fake = Fake::new(2);
        fake.fail = Some((1, 5));
        let p = params(2, 40);
        let out = run(&fake, &[0, 1], &p, p.limits());
        assert_eq!(out.flows[0].ops, 40);
        assert!(out.flows[0].error.is_none());
        // Four completed before the failed fifth; the one posted beside it drained.
        assert!(
            out.flows[1].ops >= 4 && out.flows[1].ops < 40,
            "{}",
            out.flows[1].ops
        );
        let err = out.flows[1].error.as_deref().unwrap_or("");
        assert!(err.contains("retry"), "{err}");
    }

    #[test]
    fn what_never_completes_is_reported_in_flight_after_the_drain_limit() {
        let mut fake = Fake::new(2);
        fake.silent = true;
        let p = params(3, 10);
        let limits = Limits {
            deadline_ns: Some(0),
            drain_ns: 50_000,
            stop: StopToken::new(),
        };
        let out = run(&fake, &[0, 1], &p, limits);
        for f in &out.flows {
            assert_eq!((f.ops, f.in_flight), (0, 3));
            assert!(f.error.is_none(), "{:?}", f.error);
        }
    }

    #[test]
    fn open_loop_beyond_capacity_counts_the_sends_it_never_posted() {
        let fake = Fake::new(2);
        let mut p = params(1, u64::MAX);
        // One send due per µs per flow, on a clock that ticks 1 µs per reading: a flow posts
        // at most one per loop, which reads the clock several times.
        p.rate = Some((1e6, Arrival::Fixed));
        let limits = Limits {
            deadline_ns: Some(2_000_000),
            drain_ns: 50_000,
            stop: StopToken::new(),
        };
        let out = run(&fake, &[0, 1], &p, limits);
        for f in &out.flows {
            let posted = f.ops + u64::from(f.in_flight);
            // About 2,000 sends were due per flow by the deadline.
            let due = posted + f.missed;
            assert!(
                (1_990..=2_001).contains(&due),
                "due {due}: {posted} posted, {} missed",
                f.missed
            );
            assert!(f.missed > due / 2, "{} of {due} missed", f.missed);
        }
    }

    #[test]
    fn open_loop_within_capacity_misses_nothing() {
        let fake = Fake::new(1);
        let mut p = params(4, u64::MAX);
        p.rate = Some((1e4, Arrival::Fixed)); // one per 100 µs
        let limits = Limits {
            deadline_ns: Some(5_000_000),
            drain_ns: 50_000,
            stop: StopToken::new(),
        };
        let out = run(&fake, &[0], &p, limits);
        assert!(out.flows[0].ops >= 49, "{}", out.flows[0].ops);
        assert!(out.flows[0].missed <= 1, "{}", out.flows[0].missed);
    }

    #[test]
    fn open_loop_posts_on_schedule_within_the_depth() {
        let fake = Fake::new(1);
        let mut p = params(2, 20);
        // 1e5 ops/s = one every 10 µs of a clock that ticks 1 µs per reading.
        p.rate = Some((1e5, Arrival::Fixed));
        let out = run(&fake, &[0], &p, p.limits());
        assert_eq!(out.flows[0].ops, 20);
        assert!(fake.max_outstanding.borrow()[0] <= 2);
    }

    #[test]
    fn a_mix_draws_every_op_and_tallies_each_apart() {
        let fake = Fake::new(4);
        let mut p = fake::params(Op::Write, 8, 4, 2_000);
        p.mix = OpMix::parse("write:50,read:20,send:10,fetch_add:10,cmp_swap:10").unwrap();
        let out = run(&fake, &[0, 1, 2, 3], &p, p.limits());
        let posted = *fake.by_op.borrow();
        let mut total = 0;
        for (op, share) in [
            (Op::Write, 0.5),
            (Op::Read, 0.2),
            (Op::Send, 0.1),
            (Op::FetchAdd, 0.1),
            (Op::CmpSwap, 0.1),
        ] {
            let t = &out.by_op[op.index()];
            // Every post of the op completed and was tallied under it, with its latency.
            assert_eq!(t.ops, posted[op.index()], "{op:?}");
            assert_eq!((t.bytes, t.latency.len()), (8 * t.ops, t.ops), "{op:?}");
            let got = t.ops as f64 / 8_000.0;
            assert!((got - share).abs() < 0.03, "{op:?}: {got}");
            total += t.ops;
        }
        assert_eq!(total, 8_000);
        assert_eq!(out.by_op[Op::WriteImm.index()].ops, 0);
        // Each flow's words: fetch_adds x addend, and its count of cmp_swaps (each swapped).
        let words = fake.words.borrow();
        let adds: u64 = words.iter().map(|w| w[0]).sum();
        let swapped: u64 = words.iter().map(|w| w[1]).sum();
        let fa = out.by_op[Op::FetchAdd.index()].ops;
        assert_eq!(adds, fa * crate::gen::ops::FETCH_ADD_ADDEND);
        let cs = &out.by_op[Op::CmpSwap.index()];
        assert_eq!((cs.swapped, swapped), (cs.ops, cs.ops));
    }

    #[test]
    fn cmp_swaps_covered_by_a_later_completion_are_still_checked() {
        let fake = Fake::new(2);
        let mut p = fake::params(Op::CmpSwap, 8, 8, 301);
        p.signal_every = 4;
        let out = run(&fake, &[0, 1], &p, p.limits());
        let cs = &out.by_op[Op::CmpSwap.index()];
        assert_eq!((cs.ops, cs.swapped), (602, 602));
        assert_eq!(*fake.words.borrow(), [[0, 301], [0, 301]]);
    }

    #[test]
    fn a_cmp_swap_that_finds_another_value_is_counted_unswapped() {
        let fake = Fake::new(1);
        // Something else moved the word: the flow's swaps expect 0..9 and find 1000.
        fake.words.borrow_mut()[0][1] = 1_000;
        let p = fake::params(Op::CmpSwap, 8, 1, 10);
        let out = run(&fake, &[0], &p, p.limits());
        let cs = &out.by_op[Op::CmpSwap.index()];
        assert_eq!((cs.ops, cs.swapped), (10, 0));
        assert_eq!(fake.words.borrow()[0][1], 1_000, "nothing swapped in");
    }
}

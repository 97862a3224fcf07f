//! One thread's loop over its flows, shared by the throughput worker ([`super::worker`]) and
//! ping-pong ([`super::pingpong`]): poll the CQ → hand the completions to the pattern → stop
//! when asked or due → let the pattern post more → drain what is outstanding, up to a limit.
//!
//! The loop talks to its flows through [`Transport`] (a [`Shard`] on the device, a fake in
//! the tests below) and leaves what to post to a [`Pattern`].
use super::ops::{self, Op};
use super::shard::Shard;
use super::stats::FlowStats;
use super::stop::{Reason, StopToken};
use crate::verbs::{AtomicOp, AtomicTarget, SendKind, SendWr, WorkCompletion};

/// One work request of a flow, as a pattern asks for it.
#[derive(Debug, Clone, Copy)]
pub struct Post {
    pub op: Op,
    /// Bytes moved (8 for an atomic).
    pub size: u32,
    pub wr_id: u64,
    /// The flow's slot it occupies (an atomic's result lands in the slot's word).
    pub slot: u16,
    /// Unless set, it completes without a completion of its own (a later signaled one of the
    /// same flow says it is done: a send queue completes in order), except on an error.
    pub signaled: bool,
    /// cmp_swap: the value the flow's word should hold; it swaps in `compare + 1`.
    pub compare: u64,
}

impl Post {
    /// A WRITE or SEND (ping-pong's), signaled, in slot 0.
    pub fn message(op: Op, size: u32, wr_id: u64) -> Post {
        Post {
            op,
            size,
            wr_id,
            slot: 0,
            signaled: true,
            compare: 0,
        }
    }
}

/// One thread's flows, as the loop uses them.
pub trait Transport {
    /// Posts flow `i`'s work request.
    fn post(&self, i: usize, req: &Post) -> Result<(), String>;
    /// Posts flow `i`'s work requests in order, 1 to [`crate::verbs::POST_LIST_MAX`] of them, as
    /// one list (one doorbell). On failure: how many went in first.
    fn post_list(&self, i: usize, reqs: &[Post]) -> Result<(), (usize, String)>;
    /// The 8-byte word an atomic of flow `i` in `slot` brought back (the target's value
    /// before it), once its completion (or a later one covering it) was seen.
    fn atomic_result(&self, i: usize, slot: u16) -> u64;
    /// Posts a receive for flow `i`'s incoming message, as `wr_id`.
    fn post_recv(&self, i: usize, wr_id: u64) -> Result<(), String>;
    /// Takes completions, at most `out.len()`.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, String>;
    /// Sets the last byte of flow `i`'s outgoing message (a ping-pong's sequence number).
    fn stamp(&self, i: usize, size: u32, tag: u8);
    /// The last byte where flow `i`'s peer writes back (the echoed sequence number).
    fn echoed(&self, i: usize, size: u32) -> u8;
}

impl Shard {
    /// Flow `i`'s request as the verbs layer takes it.
    #[inline]
    fn send_wr(&self, i: usize, req: &Post) -> SendWr<'_> {
        let f = &self.flows[i];
        let remote = f.remote.expect("flow connected before the start");
        let (remote_addr, rkey) = (remote.buf.addr, remote.buf.rkey);
        let out = self.mr.sge(f.send_off, req.size);
        let atomic = |offset: u64, op| {
            let target = AtomicTarget {
                addr: remote.atomic_addr + offset,
                rkey,
                op,
            };
            let result = self.mr.sge(f.atomic_off + 8 * req.slot as usize, 8);
            (result, SendKind::Atomic(target))
        };
        let (local, kind) = match req.op {
            Op::Write => (out, SendKind::Write { remote_addr, rkey }),
            // The immediate says which flow wrote (the server counts by completion, not by it).
            Op::WriteImm => {
                let kind = SendKind::WriteImm {
                    remote_addr,
                    rkey,
                    imm: f.id,
                };
                (out, kind)
            }
            Op::Read => {
                let into = self.mr.sge(f.recv_off, req.size);
                (into, SendKind::Read { remote_addr, rkey })
            }
            Op::Send => match &f.ah {
                Some(ah) => {
                    let remote_qpn = remote.qp.qpn;
                    (out, SendKind::SendUd { ah, remote_qpn })
                }
                None => (out, SendKind::Send),
            },
            Op::FetchAdd => atomic(0, AtomicOp::FetchAdd(ops::FETCH_ADD_ADDEND)),
            Op::CmpSwap => atomic(
                8,
                AtomicOp::CmpSwap {
                    compare: req.compare,
                    swap: req.compare + 1,
                },
            ),
        };
        SendWr::new(req.wr_id, local, req.signaled, kind)
    }
}

impl Transport for Shard {
    #[inline]
    fn post(&self, i: usize, req: &Post) -> Result<(), String> {
        self.post_list(i, std::slice::from_ref(req))
            .map_err(|(_, e)| e)
    }

    #[inline]
    fn post_list(&self, i: usize, reqs: &[Post]) -> Result<(), (usize, String)> {
        let wrs = reqs.iter().map(|req| self.send_wr(i, req));
        self.flows[i]
            .qp
            .post_list(wrs)
            .map_err(|(k, e)| (k, format!("post failed: {e}")))
    }

    #[inline]
    fn atomic_result(&self, i: usize, slot: u16) -> u64 {
        self.mr
            .read_u64(self.flows[i].atomic_off + 8 * slot as usize)
    }

    fn post_recv(&self, i: usize, wr_id: u64) -> Result<(), String> {
        let f = &self.flows[i];
        f.qp.post_recv(wr_id, self.mr.sge(f.recv_off, self.slot as u32))
            .map_err(|e| format!("posting a receive failed: {e}"))
    }

    #[inline]
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, String> {
        self.cq
            .poll(out)
            .map_err(|e| format!("polling the CQ failed: {e}"))
    }

    #[inline]
    fn stamp(&self, i: usize, size: u32, tag: u8) {
        self.mr
            .write_byte(self.flows[i].send_off + size as usize - 1, tag);
    }

    #[inline]
    fn echoed(&self, i: usize, size: u32) -> u8 {
        self.mr
            .read_byte(self.flows[i].recv_off + size as usize - 1)
    }
}

/// What one kind of traffic does at each step of the loop.
pub trait Pattern<T: Transport> {
    /// Before the loop: the first posts.
    fn start(&mut self, io: &T);
    /// This round's completions, polled at `now_ns`; `stopping`: post nothing new.
    fn completed(&mut self, io: &T, wcs: &[WorkCompletion], now_ns: u64, stopping: bool);
    /// After the completions, unless stopping: posts due now.
    fn post_more(&mut self, io: &T, now_ns: u64);
    /// Nothing is outstanding, and (`stopping`, or every flow done or failed) nothing more
    /// will be posted.
    fn finished(&self, stopping: bool) -> bool;
    /// The drain limit passed: note what is still in flight in the flows' stats (not an
    /// error: a timed run always ends with some operations in flight).
    fn abandon(&mut self);
    /// Every flow's stats.
    fn stats_mut(&mut self) -> &mut [FlowStats];
}

/// When the loop stops posting, and how long it then waits for what is outstanding.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Stop posting at this time (ns since the start); None: when the pattern is done.
    pub deadline_ns: Option<u64>,
    pub drain_ns: u64,
    /// Ctrl-C or a lost peer.
    pub stop: StopToken,
}

/// After Ctrl-C the drain is this short: the run must end within a second of it.
pub const INTERRUPTED_DRAIN_NS: u64 = 300_000_000;

/// Runs `pattern` over `io` until it is finished, Ctrl-C or a lost peer (`limits.stop`), or the
/// deadline; then drains for at most `drain_ns` ([`INTERRUPTED_DRAIN_NS`] after Ctrl-C).
/// `now_ns` is the common clock.
pub fn drive<T: Transport, P: Pattern<T>>(
    io: &T,
    pattern: &mut P,
    limits: Limits,
    now_ns: impl Fn() -> u64,
) {
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let (mut stopping, mut drain_until) = (false, 0);
    pattern.start(io);
    loop {
        let got = match io.poll(&mut wcs) {
            Ok(k) => k,
            Err(e) => {
                for fs in pattern.stats_mut() {
                    fs.error.get_or_insert_with(|| e.clone());
                }
                break;
            }
        };
        let now = now_ns();
        pattern.completed(io, &wcs[..got], now, stopping);
        if !stopping && (limits.stop.is_set() || limits.deadline_ns.is_some_and(|d| now >= d)) {
            stopping = true;
            let drain = if limits.stop.requested() == Some(Reason::Interrupted) {
                limits.drain_ns.min(INTERRUPTED_DRAIN_NS)
            } else {
                limits.drain_ns
            };
            drain_until = now + drain;
        }
        if !stopping {
            pattern.post_more(io, now);
        } else if now >= drain_until {
            pattern.abandon();
            break;
        }
        if pattern.finished(stopping) {
            break;
        }
    }
}

/// A fake [`Transport`] for the patterns' host tests: every post completes at the next
/// poll (or with the error status `fail` says), WRITE echoes land at once.
#[cfg(test)]
pub mod fake {
    use super::super::worker::WorkerParams;
    use super::super::StopAt;
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    /// A clock that advances 1 µs per reading.
    pub fn ticking() -> impl Fn() -> u64 {
        let t = Cell::new(0u64);
        move || {
            t.set(t.get() + 1_000);
            t.get()
        }
    }

    /// Thread-loop parameters for the tests: `ops` operations (round trips) per flow, no
    /// series kept, no warm-up, the whole run steady, a token of their own.
    pub fn params(op: Op, size: u32, depth: u32, ops: u64) -> WorkerParams {
        WorkerParams {
            mix: crate::gen::OpMix::single(op),
            size,
            depth,
            stop: StopAt::Iters(ops),
            rate: None,
            kept_series_ns: None,
            signal_every: 1,
            warmup_ns: 0,
            steady_ns: (0, u64::MAX),
            seed: 1,
            stop_token: StopToken::new(),
            sizes: None,
            fct: None,
        }
    }

    pub struct Fake {
        pub pending: RefCell<VecDeque<WorkCompletion>>,
        /// Outstanding posts per flow now, and the most seen.
        pub outstanding: RefCell<Vec<u32>>,
        pub max_outstanding: RefCell<Vec<u32>>,
        /// Per flow: unsignaled posts since its last signaled one.
        pub unreported: RefCell<Vec<u32>>,
        /// Per signaled wr_id: the unsignaled posts before it that its completion covers.
        pub covers: RefCell<std::collections::HashMap<u64, u32>>,
        pub posts: Cell<u64>,
        /// (flow, nth post of that flow counting from 1) that completes with an error.
        pub fail: Option<(usize, u64)>,
        /// (flow, nth post of that flow counting from 1) that the device refuses at the post.
        pub refuse: Option<(usize, u64)>,
        /// The length of each list of posts handed over in one call.
        pub lists: RefCell<Vec<usize>>,
        /// Posts never complete (to test the drain limit).
        pub silent: bool,
        /// Ping-pong: the peer echoes (WRITE: the stamped byte; SEND: a receive completes).
        pub echo: bool,
        per_flow_posts: RefCell<Vec<u64>>,
        stamped: RefCell<Vec<u8>>,
        landed: RefCell<Vec<u8>>,
        recvs: RefCell<Vec<VecDeque<u64>>>,
        /// The server's atomic words per flow (fetch_add's, cmp_swap's), executed in posting
        /// order, and what each (flow, slot) brought back.
        pub words: RefCell<Vec<[u64; 2]>>,
        results: RefCell<std::collections::HashMap<(usize, u16), u64>>,
        /// Posts per op type.
        pub by_op: RefCell<[u64; 6]>,
    }

    impl Fake {
        pub fn new(flows: usize) -> Fake {
            Fake {
                pending: RefCell::new(VecDeque::new()),
                outstanding: RefCell::new(vec![0; flows]),
                max_outstanding: RefCell::new(vec![0; flows]),
                posts: Cell::new(0),
                fail: None,
                refuse: None,
                lists: RefCell::new(Vec::new()),
                silent: false,
                echo: false,
                per_flow_posts: RefCell::new(vec![0; flows]),
                stamped: RefCell::new(vec![0; flows]),
                landed: RefCell::new(vec![0; flows]),
                recvs: RefCell::new(vec![VecDeque::new(); flows]),
                unreported: RefCell::new(vec![0; flows]),
                covers: RefCell::new(std::collections::HashMap::new()),
                words: RefCell::new(vec![[0; 2]; flows]),
                results: RefCell::new(std::collections::HashMap::new()),
                by_op: RefCell::new([0; 6]),
            }
        }
    }

    fn wc(wr_id: u64, status: u32, opcode: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            ..WorkCompletion::EMPTY
        }
    }

    impl Transport for Fake {
        fn post_list(&self, i: usize, reqs: &[Post]) -> Result<(), (usize, String)> {
            assert!((1..=crate::verbs::POST_LIST_MAX).contains(&reqs.len()));
            self.lists.borrow_mut().push(reqs.len());
            for (k, req) in reqs.iter().enumerate() {
                self.post(i, req).map_err(|e| (k, e))?;
            }
            Ok(())
        }

        fn post(&self, i: usize, req: &Post) -> Result<(), String> {
            let (op, wr_id, signaled) = (req.op, req.wr_id, req.signaled);
            let nth = self.per_flow_posts.borrow()[i] + 1;
            if self.refuse == Some((i, nth)) {
                return Err("post failed: Cannot allocate memory".into());
            }
            self.posts.set(self.posts.get() + 1);
            self.by_op.borrow_mut()[op.index()] += 1;
            let n = {
                let mut p = self.per_flow_posts.borrow_mut();
                p[i] += 1;
                p[i]
            };
            let out = {
                let mut o = self.outstanding.borrow_mut();
                o[i] += 1;
                o[i]
            };
            let m = &mut self.max_outstanding.borrow_mut()[i];
            *m = (*m).max(out);
            if self.silent {
                return Ok(());
            }
            let failed = self.fail == Some((i, n));
            let status = if failed { 12 } else { 0 }; // IBV_WC_RETRY_EXC_ERR
            if !failed && op.is_atomic() {
                let mut words = self.words.borrow_mut();
                let w = &mut words[i][usize::from(op == Op::CmpSwap)];
                self.results.borrow_mut().insert((i, req.slot), *w);
                match op {
                    Op::FetchAdd => *w += ops::FETCH_ADD_ADDEND,
                    _ if *w == req.compare => *w = req.compare + 1,
                    _ => {}
                }
            }
            if !signaled && !failed {
                // Completes silently: the flow's next signaled post covers it.
                self.unreported.borrow_mut()[i] += 1;
                return Ok(());
            }
            let covers = std::mem::take(&mut self.unreported.borrow_mut()[i]);
            self.covers.borrow_mut().insert(wr_id, covers);
            self.pending.borrow_mut().push_back(wc(wr_id, status, 0));
            if self.echo && !failed {
                match op {
                    Op::Write => self.landed.borrow_mut()[i] = self.stamped.borrow()[i],
                    Op::Send => {
                        if let Some(r) = self.recvs.borrow_mut()[i].pop_front() {
                            // IBV_WC_RECV = 128
                            self.pending.borrow_mut().push_back(wc(r, 0, 128));
                        }
                    }
                    _ => panic!("ping-pong never echoes {op:?}"),
                }
            }
            Ok(())
        }

        fn post_recv(&self, i: usize, wr_id: u64) -> Result<(), String> {
            self.recvs.borrow_mut()[i].push_back(wr_id);
            Ok(())
        }

        fn atomic_result(&self, i: usize, slot: u16) -> u64 {
            self.results.borrow()[&(i, slot)]
        }

        fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, String> {
            let mut p = self.pending.borrow_mut();
            let n = p.len().min(out.len());
            for slot in out.iter_mut().take(n) {
                let w = p.pop_front().expect("counted");
                if w.opcode != 128 {
                    let i = (w.wr_id >> 16) as usize;
                    let covered = self.covers.borrow_mut().remove(&w.wr_id).unwrap_or(0);
                    self.outstanding.borrow_mut()[i] -= 1 + covered;
                }
                *slot = w;
            }
            Ok(n)
        }

        fn stamp(&self, i: usize, _size: u32, tag: u8) {
            self.stamped.borrow_mut()[i] = tag;
        }

        fn echoed(&self, i: usize, _size: u32) -> u8 {
            self.landed.borrow()[i]
        }
    }
}

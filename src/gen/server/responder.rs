//! The server's data path for one session: absorb SENDs and WRITE_IMMs (replenishing the
//! shared receive queue, counting each kind), or echo ping-pongs back. RDMA WRITE, READ and
//! atomics need nothing from the server's CPU.
use crate::verbs::{
    wc_status_str, CompletionQueue, MemoryRegion, QueuePair, SharedReceiveQueue, WorkCompletion,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Echo writes/sends not yet reaped per flow before we wait for their completions.
const MAX_UNREAPED: u32 = 8;

/// Messages and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub messages: u64,
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.messages += 1;
        self.bytes += bytes;
    }
}

/// What the server saw in one session.
#[derive(Debug, Default, Clone, Copy)]
pub struct Received {
    /// SENDs received (UD: their payload only, the GRH left out).
    pub sends: Tally,
    /// RDMA WRITEs with immediate that landed (each took one receive).
    pub write_imms: Tally,
    /// Ping-pong: echoes sent back.
    pub echoes: Tally,
    pub errors: u64,
}

/// How long a receive sink goes on, once the client is done, with nothing arriving: a UD
/// datagram the client saw leave may still be on its way; one that was lost never comes.
const QUIET: Duration = Duration::from_millis(300);

/// When a session's data path ends: as soon as the client is done, except that a receive sink
/// first counts what the client says completed (`expect`), or gives up after [`QUIET`].
#[derive(Default)]
pub struct Finish {
    done: AtomicBool,
    expect: AtomicU64,
    /// Wakes [`Finish::wait`]: a session serving WRITEs, READs or atomics has nothing to poll.
    woken: (Mutex<()>, Condvar),
}

impl Finish {
    /// The client is done; `expect` receives should have arrived.
    pub fn finish(&self, expect: u64) {
        self.expect.store(expect, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
        let _g = self.woken.0.lock().unwrap_or_else(|e| e.into_inner());
        self.woken.1.notify_all();
    }

    pub fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Sleeps until [`Finish::finish`]. Not a timed poll: a server waking 200 times a second
    /// took CPU from the kernel's RDMA processing on a small (2-vCPU) host, where a
    /// single-flow run is CPU-bound.
    pub fn wait(&self) {
        let mut g = self.woken.0.lock().unwrap_or_else(|e| e.into_inner());
        while !self.done() {
            g = match self.woken.1.wait_timeout(g, Duration::from_secs(1)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// A sink that has counted `counted`, heard nothing for `idle`, may end.
    fn sink_may_end(&self, counted: u64, idle: Duration) -> bool {
        self.done() && (counted >= self.expect.load(Ordering::Relaxed) || idle >= QUIET)
    }
}

/// The receive pool: `count` buffers of `slot` bytes starting at `offset` in `mr`.
pub struct RecvPool<'a> {
    pub srq: &'a SharedReceiveQueue,
    pub mr: &'a MemoryRegion,
    pub offset: usize,
    pub slot: usize,
    pub count: usize,
}

impl RecvPool<'_> {
    pub fn post(&self, k: usize) -> crate::verbs::Result<()> {
        let local = self.mr.sge(self.offset + k * self.slot, self.slot as u32);
        self.srq.post_recv(k as u64, local)
    }
    pub fn post_all(&self) -> crate::verbs::Result<()> {
        (0..self.count).try_for_each(|k| self.post(k))
    }
}

fn poll(cq: &CompletionQueue, wcs: &mut [WorkCompletion], errors: &mut u64) -> usize {
    match cq.poll(wcs) {
        Ok(n) => n,
        Err(e) => {
            *errors += 1;
            eprintln!("ibjitter serve: polling failed: {e}");
            0
        }
    }
}

fn note_error(wc: &WorkCompletion, received: &mut Received) {
    if received.errors == 0 {
        eprintln!(
            "ibjitter serve: completion error on QP {}: {}",
            wc.qp_num,
            wc_status_str(wc.status)
        );
    }
    received.errors += 1;
}

/// Counts incoming SENDs and WRITE_IMMs and gives each receive buffer straight back to the
/// SRQ, until the client is done and what it completed has arrived (`finish`). A UD receive
/// starts with the datagram's `grh` bytes: not counted as payload.
///
/// When nothing is left to reap it sleeps until the next completion (or 50 ms, to see the
/// end) instead of spinning: the sink measures nothing, and on a shared host a spinning sink
/// takes CPU from the senders and from software RDMA's own packet processing. Under load
/// completions keep coming and it never sleeps. A CQ made without events spins.
pub fn sink_receives(cq: &CompletionQueue, pool: &RecvPool, finish: &Finish, grh: u32) -> Received {
    let mut r = Received::default();
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let mut armed = false;
    let mut last = Instant::now();
    let mut done_at = None;
    loop {
        if finish.done() {
            let since = *done_at.get_or_insert_with(Instant::now);
            let idle = last.max(since).elapsed();
            if finish.sink_may_end(r.sends.messages + r.write_imms.messages, idle) {
                break;
            }
        }
        let n = poll(cq, &mut wcs, &mut r.errors);
        for wc in &wcs[..n] {
            if !wc.ok() {
                note_error(wc, &mut r);
                continue;
            }
            if wc.is_recv_imm() {
                r.write_imms.add(u64::from(wc.byte_len));
            } else {
                r.sends.add(u64::from(wc.byte_len.saturating_sub(grh)));
            }
            if let Err(e) = pool.post(wc.wr_id as usize) {
                eprintln!("ibjitter serve: re-posting a receive failed: {e}");
                r.errors += 1;
            }
        }
        if n > 0 {
            last = Instant::now();
            continue;
        }
        if armed {
            let _ = cq.wait(Duration::from_millis(50));
            armed = false;
        } else if cq.arm().is_ok() {
            // A completion that slipped in before the arm raised no event: poll once more.
            armed = true;
        } else {
            std::hint::spin_loop();
        }
    }
    r
}

/// One ping-pong flow on the server: its QP, where the client's messages land (and our echo
/// comes from), and the client's buffer to write back to.
pub struct EchoFlow<'a> {
    pub qp: &'a QueuePair,
    pub offset: usize,
    pub remote_addr: u64,
    pub remote_rkey: u32,
}

/// Echoes every ping-pong message back, until the client is done. WRITE: watch each flow's last byte;
/// SEND: answer each receive (the pool's buffers are re-posted at once).
pub fn echo(
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    flows: &[EchoFlow],
    size: u32,
    pool: Option<&RecvPool>,
    finish: &Finish,
) -> Received {
    let mut r = Received::default();
    let mut wcs = [WorkCompletion::EMPTY; 64];
    let last = size as usize - 1;
    let mut seen = vec![0u8; flows.len()];
    let mut unreaped = vec![0u32; flows.len()];
    let mut pending = vec![false; flows.len()];
    let by_qpn: HashMap<u32, usize> = flows
        .iter()
        .enumerate()
        .map(|(i, f)| (f.qp.qpn(), i))
        .collect();
    while !finish.done() {
        let n = poll(cq, &mut wcs, &mut r.errors);
        for wc in &wcs[..n] {
            if !wc.ok() {
                note_error(wc, &mut r);
                continue;
            }
            if wc.is_recv() {
                if let Some(pool) = pool {
                    let _ = pool.post(wc.wr_id as usize);
                }
                if let Some(&i) = by_qpn.get(&wc.qp_num) {
                    pending[i] = true;
                }
            } else {
                let i = wc.wr_id as usize;
                unreaped[i] = unreaped[i].saturating_sub(1);
            }
        }
        for (i, f) in flows.iter().enumerate() {
            if pool.is_none() {
                let b = mr.read_byte(f.offset + last);
                if b != seen[i] {
                    seen[i] = b;
                    pending[i] = true;
                }
            }
            if !pending[i] || unreaped[i] >= MAX_UNREAPED {
                continue;
            }
            let local = mr.sge(f.offset, size);
            let result = if pool.is_some() {
                f.qp.post_send(i as u64, local, true)
            } else {
                f.qp.post_write(i as u64, local, f.remote_addr, f.remote_rkey, true)
            };
            match result {
                Ok(()) => {
                    pending[i] = false;
                    unreaped[i] += 1;
                    r.echoes.add(u64::from(size));
                }
                Err(_) => r.errors += 1,
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_ends_once_it_has_what_the_client_completed_or_hears_nothing() {
        let f = Finish::default();
        assert!(!f.sink_may_end(10, QUIET), "not before the client is done");
        f.finish(10);
        assert!(!f.sink_may_end(9, Duration::ZERO), "one still on its way");
        assert!(f.sink_may_end(10, Duration::ZERO));
        assert!(f.sink_may_end(9, QUIET), "lost: it never comes");
    }
}

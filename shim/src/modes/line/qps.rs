//! Each QP's place in the delay line: its generation (a destroyed QP's requests still in the
//! line are dropped), the latest due time given to one of its requests, and the latest due
//! time handed over. Due times are unique per QP and handed over in order, so "the QP has
//! requests in the line" is `last_due > handed_due`: no per-request count to keep.
use crate::sys::addr_table::{self, REMOVED};
use crate::sys::spin_lock::SpinLock;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

use crate::abi::verbs::ibv_qp;

pub struct QpLine {
    key: AtomicUsize,
    /// The QP's context, as it was when the entry was made: a device closed with QPs still
    /// alive drops their requests ([`context_closed`]) without reading a QP that may be gone.
    ctx: AtomicUsize,
    /// 0 while the entry is being set up; then unique over the process (a new QP at a
    /// destroyed one's address never takes over that QP's requests).
    gen: AtomicU32,
    /// Its PD is a thread domain's ([`super::thread_domains`]): its posts never enter the line.
    in_thread_domain: AtomicBool,
    last_due: AtomicU64,
    handed_due: AtomicU64,
}

const QP_SLOTS: usize = 8192;
const MAX_PROBES: usize = 256;
#[allow(clippy::declare_interior_mutable_const)]
const QP_EMPTY: QpLine = QpLine {
    key: AtomicUsize::new(0),
    ctx: AtomicUsize::new(0),
    gen: AtomicU32::new(0),
    in_thread_domain: AtomicBool::new(false),
    last_due: AtomicU64::new(0),
    handed_due: AtomicU64::new(0),
};
static QPS: [QpLine; QP_SLOTS] = [QP_EMPTY; QP_SLOTS];
static GEN: AtomicU32 = AtomicU32::new(1);
/// The QP whose requests are being handed over now (a destroy waits for it to finish).
static POSTING: AtomicPtr<ibv_qp> = AtomicPtr::new(null_mut());

fn key_of(e: &QpLine) -> &AtomicUsize {
    &e.key
}

/// The QP's entry, if it has one.
pub fn entry(qp: *mut ibv_qp) -> Option<&'static QpLine> {
    settled(addr_table::find(&QPS, qp as usize, MAX_PROBES, key_of)?, qp)
}

/// The QP's entry, made if it has none (at its creation in line mode, else at its first
/// post). None when the table has no room within its probe limit (or, rarely, an insertion
/// could not be had: see [`insert`]).
///
/// # Safety
/// `qp` is a live QP (its context and PD are read when the entry is made).
pub unsafe fn entry_made(qp: *mut ibv_qp) -> Option<&'static QpLine> {
    let e = match addr_table::find(&QPS, qp as usize, MAX_PROBES, key_of) {
        Some(e) => e,
        None => insert(
            qp as usize,
            (*qp).context as usize,
            super::thread_domains::holds((*qp).pd),
        )?,
    };
    settled(e, qp)
}

/// `e`, once a destroy of a QP that was at this address has finished resetting it.
fn settled(e: &'static QpLine, qp: *mut ibv_qp) -> Option<&'static QpLine> {
    while e.gen.load(Acquire) == 0 && e.key.load(Acquire) == qp as usize {
        std::hint::spin_loop();
    }
    Some(e)
}

/// Held while a QP's entry is made.
static INSERTING: SpinLock = SpinLock::new();
/// How long a new QP's first post waits for another thread's insertion before it gives up:
/// long enough for a holder preempted on a busy node to run again.
const INSERT_WAIT_NS: u64 = 200_000_000;

/// Makes `key`'s entry, one insertion at a time: threads posting a new QP's first requests at
/// once (a QP they share) would otherwise each claim a slot for it, and the requests entered
/// through the one lookups do not find were dropped at their hand-over. Once per QP, at its
/// creation in line mode (`qp_created`), else at its first post; the holder makes no call.
/// A post that waited [`INSERT_WAIT_NS`] for the lock (a signal handler posting on the
/// thread that holds it) gets no entry: its requests are posted directly, in place.
#[cold]
#[inline(never)]
fn insert(key: usize, ctx: usize, in_thread_domain: bool) -> Option<&'static QpLine> {
    let _held = INSERTING.lock_within(std::time::Duration::from_nanos(INSERT_WAIT_NS))?;
    // Another thread may have made it while this one waited.
    addr_table::find(&QPS, key, MAX_PROBES, key_of).or_else(|| {
        let e = addr_table::claim(&QPS, key, MAX_PROBES, key_of)?;
        // Set up, then publish the generation (lookups wait for it).
        e.last_due.store(0, Relaxed);
        e.handed_due.store(0, Relaxed);
        e.ctx.store(ctx, Relaxed);
        e.in_thread_domain.store(in_thread_domain, Relaxed);
        e.gen.store(GEN.fetch_add(1, Relaxed).max(1), Release);
        Some(e)
    })
}

/// A fork child: a thread of the parent's that was making an entry is not in the child.
pub fn forget_after_fork() {
    INSERTING.release_in_child();
    // Nor one that was handing requests over (a destroy in the child would wait for it).
    POSTING.store(null_mut(), SeqCst);
}

impl QpLine {
    /// The QP's generation now.
    #[inline]
    pub fn gen(&self) -> u32 {
        self.gen.load(Acquire)
    }

    /// Its PD is a thread domain's: only the program's own threads may post on it.
    #[inline]
    pub fn in_thread_domain(&self) -> bool {
        self.in_thread_domain.load(Relaxed)
    }

    /// The due time of a request that would be due at `want`: `want`, or just after the
    /// QP's latest one if that is later (an RC QP never reorders). Returns it and the
    /// latest due time before it.
    #[inline]
    pub fn next_due(&self, want: u64) -> (u64, u64) {
        let mut last = self.last_due.load(Relaxed);
        loop {
            let due = want.max(last + 1);
            match self
                .last_due
                .compare_exchange_weak(last, due, AcqRel, Relaxed)
            {
                Ok(_) => return (due, last),
                Err(now) => last = now,
            }
        }
    }

    /// Nothing of this QP is in the line (every due time given was handed over).
    #[inline]
    pub fn idle(&self) -> bool {
        self.last_due.load(Acquire) <= self.handed_due.load(Acquire)
    }

    /// Whether the requests due up to `due` were handed over.
    #[inline]
    pub fn handed_through(&self, due: u64) -> bool {
        self.handed_due.load(Acquire) >= due
    }

    /// Whether a request whose predecessor on this QP is due at `before` may be handed
    /// over: that one was. Also when `before` is beyond the QP's latest due time (a reset
    /// since restarted its due times: the predecessor was dropped).
    #[inline]
    pub fn may_follow(&self, before: u64) -> bool {
        self.handed_through(before) || before > self.last_due.load(Acquire)
    }

    /// Requests of this QP due up to `due` were handed over (or posted directly).
    pub fn handed(&self, due: u64) {
        self.handed_due.fetch_max(due, AcqRel);
    }
}

/// Announces that `qp`'s requests are being handed over and returns its entry and
/// generation: a destroy either sees the announcement and waits, or changed the generation
/// first and the requests are dropped. [`done_posting`] ends it.
pub fn posting(qp: *mut ibv_qp) -> (Option<&'static QpLine>, Option<u32>) {
    POSTING.store(qp, SeqCst);
    let q = entry(qp);
    (q, q.map(|q| q.gen.load(SeqCst)))
}

/// The QP whose requests are being handed over now (null: none).
pub fn posting_now() -> *mut ibv_qp {
    POSTING.load(SeqCst)
}

pub fn done_posting() {
    POSTING.store(null_mut(), SeqCst);
}

/// Before `ibv_destroy_qp`: the QP's requests still in the line will be dropped, and a
/// hand-over to it in progress finishes first.
pub fn destroyed(qp: *mut ibv_qp) {
    let Some(q) = entry(qp) else { return };
    retire(q, qp);
    // Free for another QP; this one's requests still in the line find no entry (or a new
    // QP's, at this address, with another generation) and are dropped.
    q.gen.store(0, Release);
    q.key.store(REMOVED, Release);
}

/// Before `ibv_modify_qp` to RESET: the QP's requests still in the line will be dropped, as
/// a reset discards what a send queue holds (handed over later, they would leave on the
/// connection the QP is given next); its entry stays, for what it is posted once connected
/// again. A hand-over to it in progress finishes first.
pub fn reset(qp: *mut ibv_qp) {
    if let Some(q) = entry(qp) {
        retire(q, qp);
    }
}

/// Before `ibv_close_device` of `ctx`: the requests still in the line of its QPs (a program
/// that closes its device without destroying them, as sloppy exits do) will be dropped:
/// handed over later, they would reach a provider whose device is gone (a doorbell page
/// unmapped, a command descriptor the program may have reopened as its own file).
/// `skip`: a QP not to wait for (the calling thread's own hand-over to it, interrupted).
pub fn context_closed(ctx: *mut crate::abi::verbs::ibv_context, skip: *mut ibv_qp) {
    for q in QPS.iter() {
        let key = q.key.load(Acquire);
        if key > REMOVED && q.ctx.load(Relaxed) == ctx as usize && key != skip as usize {
            retire(q, key as *mut ibv_qp);
        }
    }
}

/// Gives the QP's entry a new generation (its requests in the line are dropped at their hand-
/// over) and a fresh due order, once a hand-over to it in progress is done.
fn retire(q: &QpLine, qp: *mut ibv_qp) {
    q.gen.store(GEN.fetch_add(1, SeqCst).max(1), SeqCst);
    while POSTING.load(SeqCst) == qp {
        std::hint::spin_loop();
    }
    q.last_due.store(0, Release);
    q.handed_due.store(0, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Barrier, Mutex};

    /// The tests share the table and its insertion flag: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// `n` QPs (zeroed, never freed): an entry reads its QP's context when it is made.
    fn qps(n: usize) -> &'static mut [ibv_qp] {
        // SAFETY: bindgen's ibv_qp is valid all-zero.
        let v: Vec<ibv_qp> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        v.leak()
    }

    /// Threads that post a QP's first requests at once (a QP shared by many threads) must all
    /// get its one entry: a second entry for the same QP gives its requests a generation the
    /// hand-over does not find (dropped) and a due order of their own.
    #[test]
    fn threads_posting_a_new_qp_at_once_share_one_entry() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        const THREADS: usize = 8;
        const QPS: usize = 3000;
        let start = Barrier::new(THREADS);
        let all = qps(QPS).as_mut_ptr() as usize;
        let qp = |k: usize| (all as *mut ibv_qp).wrapping_add(k);
        let got: Vec<Vec<usize>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        (0..QPS)
                            .map(|k| {
                                start.wait();
                                let e = unsafe { entry_made(qp(k)) }.expect("room in the table");
                                e as *const QpLine as usize
                            })
                            .collect()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let split = (0..QPS)
            .filter(|&k| got.iter().any(|g| g[k] != got[0][k]))
            .count();
        for k in 0..QPS {
            destroyed(qp(k));
        }
        assert_eq!(split, 0, "QPs given two entries by threads posting at once");
    }

    /// An insertion that never ends holds a new QP's first post up for [`INSERT_WAIT_NS`]
    /// when another thread makes it (a thread stopped there), and not at all when it is this
    /// thread's own (a signal handler posting on the thread that was making an entry), never
    /// for ever: it gets no entry (its requests are posted in place), and a QP with an entry
    /// is found as before.
    #[test]
    fn a_new_qp_waits_for_a_stuck_insertion_for_a_bounded_time() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let three = qps(3);
        let known: *mut ibv_qp = &mut three[0];
        let e = unsafe { entry_made(known) }.expect("room in the table") as *const QpLine;
        // This thread's own insertion, interrupted.
        let held = INSERTING.lock();
        let t = std::time::Instant::now();
        let fresh = unsafe { entry_made(&mut three[1]) };
        let at_once = t.elapsed();
        let again = unsafe { entry_made(known) }.map(|e| e as *const QpLine);
        drop(held);
        assert!(fresh.is_none());
        assert!(
            at_once < std::time::Duration::from_millis(50),
            "{at_once:?}"
        );
        assert_eq!(again, Some(e));
        // Another thread's, which never ends.
        std::thread::scope(|s| {
            s.spawn(|| std::mem::forget(INSERTING.lock()));
        });
        let t = std::time::Instant::now();
        let fresh = unsafe { entry_made(&mut three[2]) };
        let waited = t.elapsed();
        // (Freed as a fork child frees what a thread of its parent held.)
        INSERTING.release_in_child();
        destroyed(known);
        assert!(fresh.is_none());
        assert!(
            waited >= std::time::Duration::from_nanos(INSERT_WAIT_NS)
                && waited < std::time::Duration::from_secs(2),
            "{waited:?}"
        );
    }
}

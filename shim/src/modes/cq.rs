//! Completion-side delay (`IBJITTER_CQ_TABLE`, `IBJITTER_CQ_DELAY`): completions that
//! `ibv_poll_cq` would hand the program are held until their own drawn delay has passed
//! since the shim first saw them. Receive-side latency, which no post-side delay models:
//! the receiver of a SEND sees it late.
//!
//! - `ibv_poll_cq` is a static inline through `ctx->ops.poll_cq`, patched with the context
//!   ([`crate::wrappers::patch`]). CQs made by the exported `ibv_create_cq` get a holding ring
//!   ([`crate::modes::hold::CAP`] completions, allocated there, freed by `ibv_destroy_cq`); CQs made by
//!   `ibv_create_cq_ex` get theirs in [`crate::modes::cq_ex`], which holds the extended poll API's
//!   completions. A CQ without a ring (the table of CQs full) passes through, its
//!   completions counted apart (`cq.unheld`).
//! - A CQ keeps its order: a completion is due at its own delay or its predecessor's due
//!   time, whichever is later (completions of one QP are ordered, as on the wire).
//! - Several threads may poll one CQ: the ring is taken with a try-lock; a thread that finds
//!   it taken sees no completion this time (a poll may always return 0), never waits.
//! - A CQ with a completion channel (event-driven programs arm it, sleep, then poll until a
//!   poll returns short) would sleep on held completions: there a poll waits for each held
//!   completion in turn, taking more from the provider as it goes, and returns fewer than
//!   asked only with none held and the provider's CQ empty (the extended API's
//!   `ibv_next_poll` answers ENOENT only then too).
use crate::abi::verbs::*;
use crate::modes::hold::{HoldRing, PollFlag};
use crate::state;
use crate::sys::clock::{self, WaitKind};
use crate::sys::{addr_table, rng};
use ibjitter_table::ENTRIES;
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// Completions taken from the provider per poll.
const BATCH: usize = 32;

/// The table in wait units, and in ns (for exact sums in the stats).
static WAITS: [AtomicU64; ENTRIES] = [const { AtomicU64::new(0) }; ENTRIES];
static NS: [AtomicU64; ENTRIES] = [const { AtomicU64::new(0) }; ENTRIES];
/// What a draw keeps of its random index ([`rng::index_mask`]).
static INDEX_MASK: AtomicUsize = AtomicUsize::new(ENTRIES - 1);
/// Completions handed over, how many of them were held, their delays' sum (ns), and the
/// completions of CQs without a ring.
static PASSED: AtomicU64 = AtomicU64::new(0);
static HELD: AtomicU64 = AtomicU64::new(0);
static SUM_NS: AtomicU64 = AtomicU64::new(0);
static UNHELD: AtomicU64 = AtomicU64::new(0);

type Ring = HoldRing<ibv_wc>;

struct CqEntry {
    key: AtomicUsize,
    polling: PollFlag,
    ring: AtomicPtr<Ring>,
}

const CQ_SLOTS: usize = 4096;
#[allow(clippy::declare_interior_mutable_const)]
const CQ_EMPTY: CqEntry = CqEntry {
    key: AtomicUsize::new(0),
    polling: PollFlag::new(),
    ring: AtomicPtr::new(null_mut()),
};
static CQS: [CqEntry; CQ_SLOTS] = [CQ_EMPTY; CQ_SLOTS];
/// Probes of the CQ table before a CQ is taken as absent (or the table as full).
const PROBES: usize = 256;

fn find(cq: *mut ibv_cq) -> Option<&'static CqEntry> {
    addr_table::find(&CQS, cq as usize, PROBES, |e| &e.key)
}

/// Activates the completion table (ns values, converted with the wait clock in use).
pub fn activate(values: &[u64], kind: WaitKind) {
    for ((w, n), &v) in WAITS.iter().zip(&NS).zip(values) {
        w.store(clock::ns_to_units(v, kind), Relaxed);
        n.store(v, Relaxed);
    }
    INDEX_MASK.store(rng::index_mask(values), Relaxed);
    state::set_cq_delay();
}

/// After the exported `ibv_create_cq`: a ring for the new CQ (off any data path).
///
/// # Safety
/// `cq` null or a CQ just created.
pub unsafe fn cq_created(cq: *mut ibv_cq) {
    if cq.is_null() || !state::cq_delay() {
        return;
    }
    let key = cq as usize;
    // Under an address-space limit (`ulimit -v`) with no room for it: one warning, and this
    // CQ's completions pass undelayed (counted as unheld), never an abort.
    // SAFETY: all-zero is a valid ibv_wc (integers only).
    let Some(ring) = Ring::try_new(std::mem::zeroed()) else {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Relaxed) {
            crate::sys::say::warn(&format!(
                "IBJITTER_CQ_TABLE: cannot allocate a CQ's holding ring ({} KiB; address space \
                 limit?): completions of such CQs pass undelayed",
                Ring::bytes() >> 10
            ));
        }
        return;
    };
    let ring = Box::new(ring);
    if let Some(e) = addr_table::claim(&CQS, key, PROBES, |e| &e.key) {
        e.ring.store(Box::into_raw(ring), Release);
        return;
    }
    crate::sys::say::warn_once!("IBJITTER_CQ_TABLE: too many CQs; later ones are not delayed");
}

/// A CQ's ring set aside while the provider destroys the CQ ([`park_for_destroy`]).
pub struct Parked {
    entry: &'static CqEntry,
    ring: *mut Ring,
}

/// Before `ibv_destroy_cq`: its ring is set aside (a poll meanwhile passes through; a CQ
/// created at its address once the provider freed it finds no ring of the old one's).
///
/// # Safety
/// `cq` null or a CQ about to be destroyed, polled by no thread.
pub unsafe fn park_for_destroy(cq: *mut ibv_cq) -> Option<Parked> {
    let entry = find(cq)?;
    Some(Parked {
        entry,
        ring: entry.ring.swap(null_mut(), AcqRel),
    })
}

/// After the provider's `destroy_cq`: destroyed, the ring goes (completions still held are
/// the program's loss, as the provider's own would be) and the entry is free; refused (a QP
/// still uses the CQ: EBUSY), the CQ keeps its ring and what it holds.
///
/// # Safety
/// `p` from [`park_for_destroy`] of the CQ the provider was asked to destroy.
pub unsafe fn after_destroy(p: Option<Parked>, destroyed: bool) {
    let Some(p) = p else { return };
    if destroyed {
        p.entry.key.store(addr_table::REMOVED, Release);
        if !p.ring.is_null() {
            drop(Box::from_raw(p.ring));
        }
    } else {
        p.entry.ring.store(p.ring, Release);
    }
}

pub(crate) use clock::now_units;

/// One draw from the completion table: (wait units, ns).
pub(crate) fn draw() -> (u64, u64) {
    let pick = |r: &mut rand_pcg::Pcg32, _: &mut u32, _: u32| {
        let i = rng::next_index(r) & INDEX_MASK.load(Relaxed);
        (WAITS[i].load(Relaxed), NS[i].load(Relaxed))
    };
    match rng::with_thread(pick) {
        Some(d) => d,
        None => {
            rng::init_current_thread();
            rng::with_thread(pick).unwrap_or((0, 0))
        }
    }
}

/// Our `ctx->ops.poll_cq` while completions are delayed: `orig` is the provider's.
///
/// # Safety
/// The arguments of `ibv_poll_cq`.
pub unsafe fn poll(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc, orig: PollCqFn) -> c_int {
    let Some(e) = find(cq) else {
        let got = orig(cq, n, wc);
        if got > 0 {
            UNHELD.fetch_add(got as u64, Relaxed);
        }
        return got;
    };
    let Some(_polling) = e.polling.try_take() else {
        return 0;
    };
    let r = e.ring.load(Acquire);
    if r.is_null() {
        return orig(cq, n, wc);
    }
    let ring = &mut *r;
    // Take what the provider has, as far as the ring has room.
    let got = take(ring, cq, orig, BATCH);
    if got < 0 {
        return got;
    }
    let n = n.max(0) as usize;
    let mut k = 0usize;
    if !(*cq).channel.is_null() {
        // An event-driven program would sleep on what is held: its next event comes only
        // for completions the provider's CQ gets after the program arms it, not for these.
        // It polls until a poll returns fewer than it asked for (a budgeted loop) or none,
        // then arms and sleeps: so a poll here returns short only with nothing held and the
        // provider's CQ empty, each completion waited for in turn (those of one poll reach
        // the program together, when the last of them is due).
        while k < n {
            if ring.is_empty() && (k == 0 || take(ring, cq, orig, n - k) <= 0) {
                break;
            }
            ring.wait_for_head();
            let (w, ns) = ring.pop().expect("a head");
            *wc.add(k) = w;
            handed_over(ns);
            k += 1;
        }
        return k as c_int;
    }
    let now = now_units();
    while k < n && ring.due_head(now).is_some() {
        let (w, ns) = ring.pop().expect("a due head");
        *wc.add(k) = w;
        handed_over(ns);
        k += 1;
    }
    k as c_int
}

/// Takes up to `most` completions (at most [`BATCH`], as far as the ring has room) from the
/// provider's CQ into `ring`, each due after its own draw; returns how many, or the
/// provider's error.
///
/// # Safety
/// `cq` is the ring's CQ, polled by this thread alone (its poll flag held).
unsafe fn take(ring: &mut Ring, cq: *mut ibv_cq, orig: PollCqFn, most: usize) -> c_int {
    let room = ring.room().min(BATCH).min(most);
    if room == 0 {
        return 0;
    }
    let mut fresh: [std::mem::MaybeUninit<ibv_wc>; BATCH] =
        [const { std::mem::MaybeUninit::uninit() }; BATCH];
    let got = orig(cq, room as c_int, fresh.as_mut_ptr().cast());
    let now = now_units();
    for f in fresh.iter().take(got.max(0) as usize) {
        let (units, ns) = draw();
        ring.push(f.assume_init_read(), now, units, ns);
    }
    got
}

/// Counts a completion handed to the program after `ns` held.
pub(crate) fn handed_over(ns: u64) {
    PASSED.fetch_add(1, Relaxed);
    if ns > 0 {
        HELD.fetch_add(1, Relaxed);
        // Saturating: the exit line must never claim a sum that wrapped.
        let _ = SUM_NS.fetch_update(Relaxed, Relaxed, |s| Some(s.saturating_add(ns)));
    }
}

/// The stats' `cq` object.
pub fn stats_json() -> serde_json::Value {
    serde_json::json!({
        "completions": PASSED.load(Relaxed),
        "held": HELD.load(Relaxed),
        "sum_ns": SUM_NS.load(Relaxed),
        "unheld": UNHELD.load(Relaxed),
    })
}

/// (completions handed over, held ones, their sum in ns) for the exit line.
pub fn counts() -> (u64, u64, u64) {
    (
        PASSED.load(Relaxed),
        HELD.load(Relaxed),
        SUM_NS.load(Relaxed),
    )
}

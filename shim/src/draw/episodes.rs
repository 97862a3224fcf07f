//! `IBJITTER_EPISODES`: two states, calm and congested, with exponential dwell times; the
//! draw adds [`offset`] to its index (the congested table is the second half of the table).
//! A thread of the shim switches the state ([`start`]).
use crate::sys::rng;
use ibjitter_table::ENTRIES;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// 0 while calm, ENTRIES while congested (added to the index drawn); how many times the
/// state changed; the mean dwells (ns), 0 without episodes.
static OFFSET: AtomicUsize = AtomicUsize::new(0);
static CHANGES: AtomicU64 = AtomicU64::new(0);
static DWELL_CALM: AtomicU64 = AtomicU64::new(0);
static DWELL_CONGESTED: AtomicU64 = AtomicU64::new(0);

/// The salt of the episodes' dwell-time stream ("epis").
const EPISODES_SALT: u64 = 0x6570_6973;

/// The mean dwells (ns), at load.
pub fn configure(calm: f64, congested: f64) {
    DWELL_CALM.store(calm.round().max(1.0) as u64, Release);
    DWELL_CONGESTED.store(congested.round().max(1.0) as u64, Release);
    OFFSET.store(0, Release);
}

/// What the draw adds to its index now.
#[inline(always)]
pub fn offset() -> usize {
    OFFSET.load(Relaxed)
}

/// The state changes so far, and the mean dwells asked (ns): None without episodes.
pub fn summary() -> Option<(u64, u64, u64)> {
    let calm = DWELL_CALM.load(Acquire);
    (calm > 0).then(|| (CHANGES.load(Relaxed), calm, DWELL_CONGESTED.load(Acquire)))
}

/// Starts, once, the thread that switches between the calm and the congested table after
/// exponential dwell times (means as asked, drawn from a stream of the seed: the state
/// sequence repeats with it; which posts fall in which episode depends on their timing).
/// Starts calm. A fork child keeps the state it was forked in.
pub fn start() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    let (calm, congested) = (DWELL_CALM.load(Acquire), DWELL_CONGESTED.load(Acquire));
    if calm == 0 || STARTED.swap(true, AcqRel) {
        return;
    }
    let mut rng = rng::stream(rng::seed(), EPISODES_SALT, 0);
    let _ = std::thread::Builder::new()
        .name("ibjitter-episodes".into())
        .spawn(move || loop {
            let congested_now = OFFSET.load(Relaxed) != 0;
            let mean = if congested_now { congested } else { calm };
            // Exponential: -mean ln(1 - u), u uniform in [0, 1).
            let u = (rand_core::Rng::next_u64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
            let dwell = -(mean as f64) * (1.0 - u).ln();
            std::thread::sleep(std::time::Duration::from_nanos(dwell as u64));
            OFFSET.store(if congested_now { 0 } else { ENTRIES }, Relaxed);
            CHANGES.fetch_add(1, Relaxed);
        });
}

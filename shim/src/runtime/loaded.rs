//! The settings in force (read at load, changed by live `set`s) with the clock chosen for
//! them, and what the draws of earlier tables added up to. Not used on the post path. Both
//! sit behind fork-safe spin locks, taken in that order (the settings, then the epochs),
//! held across a fork by the forking thread ([`lock_for_fork`]) and released on both sides.
use crate::config::{self, Settings};
use crate::draw::counts;
use crate::report::stats::{self, Drawn};
use crate::sys::spin_lock::{SpinGuard, SpinMutex};
use std::time::Duration;

/// The settings in force and the clock's description.
pub struct Loaded {
    pub settings: Settings,
    pub clock: String,
}

static LOADED: SpinMutex<Option<Loaded>> = SpinMutex::new(None);

/// Live `set`s: what earlier tables' draws added up to, and the hits at the last set (the
/// table in force counts the draws since).
struct Epochs {
    carried: Drawn,
    base_hits: Vec<u64>,
}

static EPOCHS: SpinMutex<Epochs> = SpinMutex::new(Epochs {
    carried: Drawn {
        draws: 0,
        injected: 0,
        sum: 0,
    },
    base_hits: Vec::new(),
});

/// `m` locked, waiting at most half a second: the exit paths go without rather than wait
/// on a thread that holds it for long.
fn locked<T>(m: &'static SpinMutex<T>) -> Option<SpinGuard<'static, T>> {
    m.lock_within(Duration::from_millis(500))
}

/// The settings in force (None before load, or when the lock cannot be had in time).
pub fn get() -> Option<SpinGuard<'static, Option<Loaded>>> {
    locked(&LOADED)
}

/// Sets the settings in force (at load).
pub fn set(l: Loaded) {
    *LOADED.lock() = Some(l);
}

/// fork() prepare: both locks held by the forking thread across the fork (in order).
pub fn lock_for_fork() {
    LOADED.hold_for_fork();
    EPOCHS.hold_for_fork();
}

/// fork() parent: both released.
pub fn release_in_parent() {
    EPOCHS.release_in_parent();
    LOADED.release_in_parent();
}

/// fork() child: both released (see [`crate::sys::spin_lock`]).
pub fn release_in_child() {
    EPOCHS.release_in_child();
    LOADED.release_in_child();
}

/// The hits since the last live set (all of them without one).
pub fn hits_since_set(hits: &[u64]) -> Vec<u64> {
    let Some(e) = locked(&EPOCHS) else {
        return hits.to_vec();
    };
    hits.iter()
        .enumerate()
        .map(|(i, &h)| h - e.base_hits.get(i).copied().unwrap_or(0).min(h))
        .collect()
}

/// Draws, delays and their sum over every table the process used.
pub fn drawn_in_all(table: Option<&[u64]>, hits: &[u64]) -> Drawn {
    let now = stats::drawn(table, &hits_since_set(hits));
    let c = locked(&EPOCHS).map(|e| e.carried).unwrap_or_default();
    Drawn {
        draws: c.draws + now.draws,
        injected: c.injected + now.injected,
        sum: c.sum + now.sum,
    }
}

/// A live `set` replaces `old`: what its draws added up to stays counted.
pub fn carry(old: Option<&config::Delays>) {
    let snap = counts::snapshot();
    let old = old.map(|d| d.values.as_slice());
    let since = hits_since_set(&snap.hits);
    let mut e = EPOCHS.lock();
    let was = stats::drawn(old, &since);
    e.carried.draws += was.draws;
    e.carried.injected += was.injected;
    e.carried.sum += was.sum;
    e.base_hits = snap.hits;
}

/// What earlier tables' draws added up to and the hits at the last live set, for the
/// signal-time writer (which takes no lock: it gets a copy at each set).
pub fn carried() -> (Drawn, Vec<u64>) {
    let e = EPOCHS.lock();
    (e.carried, e.base_hits.clone())
}

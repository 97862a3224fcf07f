//! The settings in force (read at load, changed by live `set`s) with the clock chosen for
//! them, and what the draws of earlier tables added up to. Not used on the post path.
use crate::config::{self, Settings};
use crate::draw::counts;
use crate::report::stats::{self, Drawn};
use std::sync::{Mutex, MutexGuard};

/// The settings in force and the clock's description.
pub struct Loaded {
    pub settings: Settings,
    pub clock: String,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

/// Live `set`s: what earlier tables' draws added up to, and the hits at the last set (the
/// table in force counts the draws since).
struct Epochs {
    carried: Drawn,
    base_hits: Vec<u64>,
}

static EPOCHS: Mutex<Epochs> = Mutex::new(Epochs {
    carried: Drawn {
        draws: 0,
        injected: 0,
        sum: 0,
    },
    base_hits: Vec::new(),
});

/// `m` locked, waiting at most half a second: a fork child whose parent forked while the
/// control thread held the lock inherits it held forever; its exit paths then go without.
fn locked<T>(m: &'static Mutex<T>) -> Option<MutexGuard<'static, T>> {
    for _ in 0..500 {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
        }
    }
    None
}

/// The settings in force (None before load, or when the lock cannot be had in time).
pub fn get() -> Option<MutexGuard<'static, Option<Loaded>>> {
    locked(&LOADED)
}

/// Sets the settings in force (at load).
pub fn set(l: Loaded) {
    *LOADED.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
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
    let mut e = EPOCHS.lock().unwrap_or_else(|e| e.into_inner());
    let was = stats::drawn(old, &since);
    e.carried.draws += was.draws;
    e.carried.injected += was.injected;
    e.carried.sum += was.sum;
    e.base_hits = snap.hits;
}

/// What earlier tables' draws added up to and the hits at the last live set, for the
/// signal-time writer (which takes no lock: it gets a copy at each set).
pub fn carried() -> (Drawn, Vec<u64>) {
    let e = EPOCHS.lock().unwrap_or_else(|e| e.into_inner());
    (e.carried, e.base_hits.clone())
}

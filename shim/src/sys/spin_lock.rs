//! A spin lock that a fork child can release: glibc runs the shim's fork handlers in the
//! forking thread, so the parent's prepare handler takes the lock ([`SpinLock::hold_for_fork`])
//! and both sides release it after the fork ([`SpinLock::force_unlock`]). A mutex held by
//! another thread at the fork would stay held forever in the child. Never taken on a post
//! path: only around registrations, mode changes and the settings in force, which are short.
//! [`SpinMutex`] is the same lock around the data it guards.
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

pub struct SpinLock(AtomicBool);

/// Held until dropped.
pub struct Guard<'a>(&'a SpinLock);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    pub fn lock(&self) -> Guard<'_> {
        let mut spins = 0u32;
        while !self.try_take() {
            spins = spins.saturating_add(1);
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                // Held for long (a clock calibration, a table read): leave the core to it.
                std::thread::yield_now();
            }
        }
        Guard(self)
    }

    /// The lock, or None if it stays taken for `limit` (a path that must end, e.g. at exit,
    /// or a holder that may never return: a signal handler on the holding thread). Spins a
    /// little first, as [`SpinLock::lock`], then yields its core between tries.
    pub fn lock_within(&self, limit: Duration) -> Option<Guard<'_>> {
        for _ in 0..1000 {
            if self.try_take() {
                return Some(Guard(self));
            }
            std::hint::spin_loop();
        }
        // The shim's clock, not std's `Instant`, which panics (here: in a hook, an abort)
        // when the clock cannot be read; once it cannot, this one runs fast and ends.
        let (t0, limit) = (super::clock::monotonic_ns(), limit.as_nanos());
        loop {
            if self.try_take() {
                return Some(Guard(self));
            }
            if u128::from(super::clock::monotonic_ns().wrapping_sub(t0)) >= limit {
                return None;
            }
            std::thread::yield_now();
        }
    }

    fn try_take(&self) -> bool {
        self.0
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_ok()
    }

    /// fork() prepare: takes the lock and keeps it across the fork.
    pub fn hold_for_fork(&self) {
        std::mem::forget(self.lock());
    }

    /// fork() parent and child: releases what [`SpinLock::hold_for_fork`] took, or what
    /// another thread of the parent held at the fork (in the child it is gone).
    pub fn force_unlock(&self) {
        self.0.store(false, Release);
    }
}

impl Default for SpinLock {
    fn default() -> SpinLock {
        SpinLock::new()
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        (self.0).0.store(false, Release);
    }
}

/// `T` guarded by a [`SpinLock`] (fork-safe as it is).
pub struct SpinMutex<T> {
    lock: SpinLock,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, which holds the lock.
unsafe impl<T: Send> Sync for SpinMutex<T> {}

/// The value, while the lock is held.
pub struct SpinGuard<'a, T> {
    _held: Guard<'a>,
    value: &'a mut T,
}

impl<T> SpinMutex<T> {
    pub const fn new(value: T) -> SpinMutex<T> {
        SpinMutex {
            lock: SpinLock::new(),
            value: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let held = self.lock.lock();
        // SAFETY: the lock is ours until the guard drops.
        SpinGuard {
            _held: held,
            value: unsafe { &mut *self.value.get() },
        }
    }

    /// See [`SpinLock::lock_within`].
    pub fn lock_within(&self, limit: Duration) -> Option<SpinGuard<'_, T>> {
        let held = self.lock.lock_within(limit)?;
        // SAFETY: as in `lock`.
        Some(SpinGuard {
            _held: held,
            value: unsafe { &mut *self.value.get() },
        })
    }

    /// See [`SpinLock::hold_for_fork`].
    pub fn hold_for_fork(&self) {
        self.lock.hold_for_fork();
    }

    /// See [`SpinLock::force_unlock`].
    pub fn force_unlock(&self) {
        self.lock.force_unlock();
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A lock whose holder never returns (a signal handler on the holding thread) is waited
    /// for its limit, then given up; once forced open (a fork child) it is free again.
    #[test]
    fn a_held_lock_is_given_up_after_the_limit_and_free_once_forced_open() {
        let lock = SpinLock::new();
        std::mem::forget(lock.lock());
        let t = Instant::now();
        assert!(lock.lock_within(Duration::from_millis(20)).is_none());
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(20) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        lock.force_unlock();
        assert!(lock.lock_within(Duration::ZERO).is_some());
    }
}

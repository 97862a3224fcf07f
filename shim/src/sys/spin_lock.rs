//! A spin lock that a fork child can release: glibc runs the shim's fork handlers in the
//! forking thread, so the parent's prepare handler takes the lock ([`SpinLock::hold_for_fork`])
//! and both sides release it after the fork ([`SpinLock::release_in_parent`],
//! [`SpinLock::release_in_child`]). A mutex held by another thread at the fork would stay
//! held forever in the child. Never taken on a post path: only around registrations, mode
//! changes and the settings in force, which are short.
//!
//! A program whose signal handler forks (a crash handler that runs a debugger) may interrupt
//! the shim while this very thread holds the lock: the prepare handler does not wait for it
//! (it would wait for ever), and only that thread's interrupted code releases it, in the
//! parent and in the child alike, once the handler returns. The lock's one word is its
//! holder's thread token ([`rng::this_thread`]: no system call), so a signal can never see it
//! taken without its holder. A lock another thread holds longer than [`FORK_WAIT`] at a fork
//! is forked without: released in the child (that thread is not there), left to its holder in
//! the parent. Each lock remembers which thread's prepare handler took it, so two threads
//! forking at once each release only their own. (A fork inside the prepare handler itself, a
//! SIGCHLD handler's, releases the outer fork's locks early: the outer child then frees what
//! another thread may have taken meanwhile, as above.)
//! [`SpinMutex`] is the same lock around the data it guards.
use crate::sys::rng;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::time::Duration;

/// How long a fork waits for a lock another thread holds.
pub const FORK_WAIT: Duration = Duration::from_secs(1);

pub struct SpinLock {
    /// The holder's thread token ([`rng::this_thread`]); 0: free.
    holder: AtomicUsize,
    /// The thread whose prepare handler took it and keeps it across its fork (0: none).
    fork_holder: AtomicUsize,
}

/// Held until dropped.
pub struct Guard<'a>(&'a SpinLock);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock {
            holder: AtomicUsize::new(0),
            fork_holder: AtomicUsize::new(0),
        }
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
        if self.held_here() {
            // This thread's interrupted code holds it: it cannot come free while we wait.
            return None;
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
        self.holder
            .compare_exchange_weak(0, rng::this_thread(), Acquire, Relaxed)
            .is_ok()
    }

    /// Whether this thread holds it (code a signal handler interrupted, if the caller is
    /// not that code).
    fn held_here(&self) -> bool {
        self.holder.load(Relaxed) == rng::this_thread()
    }

    fn release(&self) {
        self.holder.store(0, Release);
    }

    /// fork() prepare: takes the lock and keeps it across the fork, unless this thread holds
    /// it already (a handler that forks, see the module) or another thread keeps it past
    /// [`FORK_WAIT`].
    pub fn hold_for_fork(&self) {
        if let Some(held) = self.lock_within(FORK_WAIT) {
            std::mem::forget(held);
            self.fork_holder.store(rng::this_thread(), Relaxed);
        }
    }

    /// fork() parent: releases what this thread's [`SpinLock::hold_for_fork`] took.
    pub fn release_in_parent(&self) {
        let me = rng::this_thread();
        if self
            .fork_holder
            .compare_exchange(me, 0, Relaxed, Relaxed)
            .is_ok()
        {
            self.release();
        }
    }

    /// fork() child: releases what [`SpinLock::hold_for_fork`] took and what another thread
    /// of the parent held at the fork (gone here); what this thread's interrupted code holds
    /// stays its own to release.
    pub fn release_in_child(&self) {
        let me = rng::this_thread();
        let took = self.fork_holder.swap(0, Relaxed) == me;
        if took || !self.held_here() {
            self.release();
        }
    }

    /// fork() child, for a lock whose data are atomics only: released whoever holds it (this
    /// thread's interrupted code included: the child has no other thread, and that code's
    /// own release later is harmless).
    pub fn force_release_in_child(&self) {
        self.fork_holder.store(0, Relaxed);
        self.release();
    }
}

impl Default for SpinLock {
    fn default() -> SpinLock {
        SpinLock::new()
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.release();
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

    /// See [`SpinLock::release_in_parent`].
    pub fn release_in_parent(&self) {
        self.lock.release_in_parent();
    }

    /// See [`SpinLock::release_in_child`].
    pub fn release_in_child(&self) {
        self.lock.release_in_child();
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

    /// A lock another thread holds is waited for its limit, then given up; one this thread
    /// holds (code a signal handler interrupted) at once; released, it is free again.
    #[test]
    fn a_held_lock_is_given_up_after_the_limit_or_at_once_if_this_thread_holds_it() {
        let lock = SpinLock::new();
        std::mem::forget(lock.lock());
        let t = Instant::now();
        assert!(lock.lock_within(Duration::from_secs(5)).is_none());
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        lock.release_in_child();
        // Still this thread's: a child's handler leaves it to the interrupted code.
        assert!(lock.lock_within(Duration::ZERO).is_none());
        lock.release();

        std::thread::scope(|s| {
            s.spawn(|| std::mem::forget(lock.lock()));
        });
        let t = Instant::now();
        assert!(lock.lock_within(Duration::from_millis(20)).is_none());
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(20) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        // A fork forks without it; the parent leaves it to its holder, the child frees it.
        let t = Instant::now();
        lock.hold_for_fork();
        assert!(t.elapsed() >= FORK_WAIT, "{:?}", t.elapsed());
        lock.release_in_parent();
        assert!(lock.lock_within(Duration::ZERO).is_none());
        lock.release_in_child();
        assert!(lock.lock_within(Duration::ZERO).is_some());
    }

    /// Two threads fork at once: the second's prepare handler gives up on the lock the
    /// first's holds (after [`FORK_WAIT`]); each parent then releases only its own, so the
    /// lock is free after both (a flag shared by the two left it held for good).
    #[test]
    fn two_threads_forking_at_once_each_release_only_their_own() {
        let lock = SpinLock::new();
        let first_took = std::sync::Barrier::new(2);
        let second_gave_up = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                lock.hold_for_fork();
                first_took.wait();
                second_gave_up.wait();
                lock.release_in_parent();
            });
            s.spawn(|| {
                first_took.wait();
                lock.hold_for_fork();
                lock.release_in_parent();
                assert!(
                    lock.lock_within(Duration::ZERO).is_none(),
                    "released another's"
                );
                second_gave_up.wait();
            });
        });
        assert!(lock.lock_within(Duration::ZERO).is_some());
        // A child of the second: what the first held is freed there, whatever it recorded.
        lock.release();
        std::thread::scope(|s| {
            s.spawn(|| lock.hold_for_fork());
        });
        lock.release_in_child();
        assert!(lock.lock_within(Duration::ZERO).is_some());
    }

    /// A lock whose data are atomics is freed in a child even from this thread's own
    /// interrupted code (the child's handlers take it next: mode changes).
    #[test]
    fn a_lock_of_atomics_is_freed_in_the_child_whoever_holds_it() {
        let lock = SpinLock::new();
        std::mem::forget(lock.lock());
        lock.force_release_in_child();
        assert!(lock.lock_within(Duration::ZERO).is_some());
    }

    /// Taken by the prepare handler, it is free on both sides after the fork.
    #[test]
    fn a_lock_held_for_a_fork_is_free_again_on_both_sides() {
        let lock = SpinLock::new();
        lock.hold_for_fork();
        assert!(lock.lock_within(Duration::ZERO).is_none());
        lock.release_in_parent();
        assert!(lock.lock_within(Duration::ZERO).is_some());
        lock.hold_for_fork();
        lock.release_in_child();
        assert!(lock.lock_within(Duration::ZERO).is_some());
    }
}

//! A spin lock that a fork child can release: glibc runs the shim's fork handlers in the
//! forking thread, so the parent's prepare handler takes the lock ([`SpinLock::hold_for_fork`])
//! and both sides release it after the fork ([`SpinLock::force_unlock`]). A mutex held by
//! another thread at the fork would stay held forever in the child. Never taken on a post
//! path: only around registrations and mode changes, which are short.
use std::sync::atomic::{AtomicBool, Ordering::*};

pub struct SpinLock(AtomicBool);

/// Held until dropped.
pub struct Guard<'a>(&'a SpinLock);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    pub fn lock(&self) -> Guard<'_> {
        while self
            .0
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        Guard(self)
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

//! A CQ's holding ring (`IBJITTER_CQ_TABLE`): completions taken from the provider, each
//! with the time it is due to be handed to the program and its own drawn delay, in order.
//! A completion is due at its own delay or at its predecessor's due time, whichever is
//! later: a CQ keeps its order, as completions of one QP are ordered on the wire. Used by
//! `ibv_poll_cq` ([`crate::modes::cq`]) and the extended poll API ([`crate::modes::cq_ex`]).
use crate::sys::clock::now_units;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// One poll of a CQ at a time (its ring has one reader): a try-flag. A thread that finds it
/// taken sees an empty CQ, as when another thread's poll took the completions.
pub struct PollFlag(AtomicBool);

/// The flag, taken until dropped (or [`Taken::keep`]).
pub struct Taken<'a>(&'a PollFlag);

impl PollFlag {
    pub const fn new() -> PollFlag {
        PollFlag(AtomicBool::new(false))
    }

    /// Takes the flag; None if another thread polls the CQ now.
    #[inline]
    pub fn try_take(&self) -> Option<Taken<'_>> {
        (!self.0.swap(true, Acquire)).then_some(Taken(self))
    }

    /// Releases a flag kept across calls ([`Taken::keep`]).
    #[inline]
    pub fn release(&self) {
        self.0.store(false, Release);
    }
}

impl Default for PollFlag {
    fn default() -> PollFlag {
        PollFlag::new()
    }
}

impl Taken<'_> {
    /// Keeps the flag taken past this call: a poll that goes on in later calls
    /// (`ibv_start_poll` to `ibv_end_poll`), which releases it.
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Completions a ring holds (completions beyond wait in the provider's CQ).
pub const CAP: usize = 1024;

pub struct HoldRing<T: Copy> {
    head: usize,
    len: usize,
    last_due: u64,
    /// (completion, due time in clock units, its own delay in ns).
    entries: Box<[(T, u64, u64)]>,
}

impl<T: Copy> HoldRing<T> {
    /// An empty ring of [`CAP`] entries, allocated fallibly (None under an address-space
    /// limit: the caller then lets that CQ pass undelayed).
    pub fn try_new(blank: T) -> Option<HoldRing<T>> {
        let mut entries = Vec::new();
        entries.try_reserve_exact(CAP).ok()?;
        entries.resize(CAP, (blank, 0, 0));
        Some(HoldRing {
            head: 0,
            len: 0,
            last_due: 0,
            entries: entries.into_boxed_slice(),
        })
    }

    /// The bytes one ring takes (for a warning).
    pub fn bytes() -> usize {
        CAP * std::mem::size_of::<(T, u64, u64)>()
    }

    /// Completions it can still take.
    pub fn room(&self) -> usize {
        CAP - self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes `item`, seen `now`, to be held `units` (clock units; `ns` for the counts).
    pub fn push(&mut self, item: T, now: u64, units: u64, ns: u64) {
        debug_assert!(self.len < CAP);
        let due = now.saturating_add(units).max(self.last_due);
        self.last_due = due;
        self.entries[(self.head + self.len) % CAP] = (item, due, ns);
        self.len += 1;
    }

    /// The first completion, if it is due `now`.
    pub fn due_head(&self, now: u64) -> Option<&T> {
        (self.len > 0 && self.entries[self.head].1 <= now).then(|| &self.entries[self.head].0)
    }

    /// Removes the first completion; returns it and its delay (ns).
    pub fn pop(&mut self) -> Option<(T, u64)> {
        if self.len == 0 {
            return None;
        }
        let (item, _, ns) = self.entries[self.head];
        self.head = (self.head + 1) % CAP;
        self.len -= 1;
        Some((item, ns))
    }

    /// Busy-waits until the first completion is due: a program that sleeps on a completion
    /// channel would otherwise sleep on what the ring holds.
    pub fn wait_for_head(&self) {
        if self.len > 0 {
            while now_units() < self.entries[self.head].1 {
                std::hint::spin_loop();
            }
        }
    }
}

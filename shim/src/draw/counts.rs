//! Counters of posts per hook and table-index hits, in cache-line-sized per-thread slots (no
//! contention, no atomic read-modify-write for the first [`EXCLUSIVE_SLOTS`] threads). Hits ×
//! entries give the injected-delay distribution exactly; the stats document
//! ([`crate::report::stats`]) reads them at exit.
use ibjitter_table::ENTRIES;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Table indices counted: two tables' worth (`IBJITTER_EPISODES`: calm, then congested).
pub const INDICES: usize = 2 * ENTRIES;

/// Threads 0..EXCLUSIVE_SLOTS own a slot; later threads share the last one (atomic adds).
pub const EXCLUSIVE_SLOTS: usize = 64;

/// Which interposed pointer a post came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Hook {
    PostSend = 0,
    /// `ibv_wr_start`: a batch of `ibv_wr_*` work requests (its key in the stats file stays
    /// `wr_complete`, where the batch used to be counted).
    WrBatch = 1,
    /// A UCP send call (`IBJITTER_LAYER=ucp|auto`): one message.
    Ucp = 2,
}

/// How many hooks count posts.
pub const HOOKS: usize = 3;

#[repr(C, align(64))]
pub struct Slot {
    posts: [AtomicU64; HOOKS],
    hits: [AtomicU64; INDICES],
}

/// EXCLUSIVE_SLOTS + 1 slots, mapped once at load when counting is on (null otherwise).
static SLOTS: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());

/// Allocates the slots (once; later calls zero them). Under an address-space limit
/// (`ulimit -v`) with no room for them: one warning, and nothing is counted (the counts'
/// readers see no slots), never an abort.
pub fn enable() {
    if SLOTS.load(Acquire).is_null() {
        // Anonymous pages straight from the kernel, zero until touched: a thread's slot costs
        // resident memory only once it counts, and a process that never posts (a shell, a
        // launcher: the shim enters every process of a job) pays nothing for them. The
        // allocator's zeroed allocation of this 64-byte-aligned array wrote all of it: ~1,000
        // page faults and ~6 ms at every process's start.
        let bytes = std::mem::size_of::<Slot>() * (EXCLUSIVE_SLOTS + 1);
        // SAFETY: a new private anonymous mapping; all-zero is a valid Slot (atomics only),
        // and pages are aligned beyond a Slot's 64 bytes. Never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                crate::sys::say::warn(&format!(
                    "cannot allocate the send counters ({} KiB; address space limit?): sends are \
                     not counted, and the stats and exit line say none",
                    bytes >> 10
                ));
            }
            return;
        }
        SLOTS.store(p.cast(), Release);
    } else {
        reset();
    }
}

/// The slots threads may have counted into: one per thread that posted since load (or the
/// fork), the last one shared. Readers look at those only: the rest are pages nobody touched,
/// and reading them would map them (~1,000 page faults at each exit and fork of every
/// process the shim enters, a shell's included).
fn slots() -> Option<&'static [Slot]> {
    let p = SLOTS.load(Acquire);
    let used = (crate::sys::rng::threads_posted() as usize).min(EXCLUSIVE_SLOTS + 1);
    // SAFETY: a mapping of EXCLUSIVE_SLOTS + 1 slots, never unmapped; used <= that.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, used) })
}

/// Zeroes all counters (a forked child starts from zero): before the child numbers its
/// threads anew, so that the parent's are the ones zeroed.
pub fn reset() {
    for s in slots().unwrap_or(&[]) {
        s.posts
            .iter()
            .chain(s.hits.iter())
            // Only what was counted: untouched pages stay untouched.
            .filter(|c| c.load(Relaxed) != 0)
            .for_each(|c| c.store(0, Relaxed));
    }
}

#[inline(always)]
fn bump(c: &AtomicU64, exclusive: bool) {
    if exclusive {
        // Only this thread writes the counter: a plain load/store, no locked instruction.
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
    } else {
        c.fetch_add(1, Relaxed);
    }
}

/// Counts one post by thread `thread` through `hook`, and its table index if one was drawn.
#[inline(always)]
pub fn count(thread: u32, hook: Hook, index: Option<usize>) {
    count_in(thread, Some(hook), index)
}

/// Counts a table index drawn for a post counted before (see `inject::count_only`).
pub fn count_hit(thread: u32, index: usize) {
    count_in(thread, None, Some(index))
}

#[inline(always)]
fn count_in(thread: u32, hook: Option<Hook>, index: Option<usize>) {
    let p = SLOTS.load(Acquire);
    if p.is_null() {
        return;
    }
    let exclusive = (thread as usize) < EXCLUSIVE_SLOTS;
    let i = if exclusive {
        thread as usize
    } else {
        EXCLUSIVE_SLOTS
    };
    // SAFETY: i <= EXCLUSIVE_SLOTS, within the leaked array.
    let slot = unsafe { &*p.add(i) };
    if let Some(hook) = hook {
        bump(&slot.posts[hook as usize], exclusive);
    }
    if let Some(ix) = index {
        bump(&slot.hits[ix & (INDICES - 1)], exclusive);
    }
}

/// Posts per hook over all threads, read without allocating (for the signal handler).
pub struct Counts {
    pub posts: [u64; HOOKS],
}

pub fn signal_safe_counts() -> Counts {
    let mut c = Counts { posts: [0; HOOKS] };
    for slot in slots().unwrap_or(&[]) {
        for (t, p) in c.posts.iter_mut().zip(&slot.posts) {
            *t += p.load(Relaxed);
        }
    }
    c
}

/// Calls `f` with (post_send, wr_complete, ucp) of each slot up to the last one used,
/// without allocating (the signal handler's `threads`).
pub fn for_each_thread(mut f: impl FnMut([u64; HOOKS])) {
    let all = slots().unwrap_or(&[]);
    let used = all
        .iter()
        .rposition(|s| s.posts.iter().any(|p| p.load(Relaxed) != 0))
        .map_or(0, |i| i + 1);
    for s in &all[..used] {
        f(std::array::from_fn(|h| s.posts[h].load(Relaxed)));
    }
}

/// Hits of table index `i` over all threads, without allocating.
pub fn signal_safe_hits(i: usize) -> u64 {
    slots()
        .unwrap_or(&[])
        .iter()
        .map(|s| s.hits[i].load(Relaxed))
        .sum()
}

/// Totals at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// (post_send, wr_complete, ucp) per slot; the last slot is shared by threads ≥ 64.
    pub per_thread: Vec<[u64; HOOKS]>,
    pub post_send: u64,
    pub wr_complete: u64,
    pub ucp: u64,
    /// Hits per table index.
    pub hits: Vec<u64>,
}

pub fn snapshot() -> Snapshot {
    let mut s = Snapshot {
        hits: vec![0; INDICES],
        ..Default::default()
    };
    for slot in slots().unwrap_or(&[]) {
        let p: [u64; HOOKS] = std::array::from_fn(|h| slot.posts[h].load(Relaxed));
        s.post_send += p[0];
        s.wr_complete += p[1];
        s.ucp += p[2];
        s.per_thread.push(p);
        for (h, c) in s.hits.iter_mut().zip(slot.hits.iter()) {
            *h += c.load(Relaxed);
        }
    }
    while s.per_thread.last().is_some_and(|p| p == &[0; HOOKS]) {
        s.per_thread.pop();
    }
    s
}

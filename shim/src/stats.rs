//! Counters for `IBJITTER_STATS`: posts per hook and table-index hits, in cache-line-sized
//! per-thread slots (no contention, no atomic read-modify-write for the first
//! [`EXCLUSIVE_SLOTS`] threads). Hits × entries give the injected-delay distribution exactly;
//! it goes through an HdrHistogram at exit.
use crate::config::{Layer, Per, Unit};
use hdrhistogram::Histogram;
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

/// EXCLUSIVE_SLOTS + 1 slots, allocated once at load when stats are on (null otherwise).
static SLOTS: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());

/// Allocates the slots (once; later calls zero them).
pub fn enable() {
    if SLOTS.load(Acquire).is_null() {
        // Zeroed memory straight from the allocator (fresh pages for this size): a thread's
        // slot costs resident memory only once it counts.
        // Never freed. SAFETY: all-zero is a valid Slot (atomics only); a non-zero layout.
        let layout = std::alloc::Layout::array::<Slot>(EXCLUSIVE_SLOTS + 1).expect("layout");
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Slot;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        SLOTS.store(p, Release);
    } else {
        reset();
    }
}

fn slots() -> Option<&'static [Slot]> {
    let p = SLOTS.load(Acquire);
    // SAFETY: leaked allocation of EXCLUSIVE_SLOTS + 1 slots, never freed.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, EXCLUSIVE_SLOTS + 1) })
}

/// Zeroes all counters (a forked child starts from zero).
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

/// What the stats file says besides the counters.
pub struct Context<'a> {
    pub table: Option<&'a [u64]>,
    pub table_source: Option<&'a str>,
    pub unit: Unit,
    /// `IBJITTER_PER`: what one draw (and one count in `posts`) stands for.
    pub per: Per,
    /// `IBJITTER_LAYER` as asked.
    pub layer: Layer,
    pub seed: u64,
    pub seed_source: &'a str,
    pub clock: String,
    pub disabled_reason: Option<&'a str>,
}

/// What the draws of a table added up to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Drawn {
    pub draws: u64,
    /// Draws of a non-zero delay.
    pub injected: u64,
    /// Their sum, in the table's unit.
    pub sum: u128,
}

/// Totals of `hits` (per table index) over `table`.
pub fn drawn(table: Option<&[u64]>, hits: &[u64]) -> Drawn {
    let mut d = Drawn::default();
    for (&v, &n) in table.unwrap_or_default().iter().zip(hits) {
        d.draws += n;
        if v > 0 {
            d.injected += n;
        }
        d.sum += u128::from(v) * u128::from(n);
    }
    d
}

/// The stats document for `snap`.
pub fn to_json(snap: &Snapshot, ctx: &Context<'_>) -> serde_json::Value {
    use serde_json::json;
    let u = ctx.unit.name();
    let mut hist = Histogram::<u64>::new(3).expect("3 significant figures is valid");
    let Drawn {
        draws,
        injected,
        sum,
    } = drawn(ctx.table, &snap.hits);
    if let Some(table) = ctx.table {
        for (&v, &n) in table.iter().zip(&snap.hits) {
            if n > 0 {
                // Saturate rather than fail on absurd entries: the stats must not kill the host.
                let _ = hist.record_n(v, n);
            }
        }
    }
    let mut dist = serde_json::Map::new();
    dist.insert("count".into(), json!(hist.len()));
    if !hist.is_empty() {
        dist.insert("min".into(), json!(hist.min()));
        dist.insert("max".into(), json!(hist.max()));
        dist.insert("mean".into(), json!(sum as f64 / draws as f64));
        dist.insert("stdev".into(), json!(hist.stdev()));
        let mut pct = serde_json::Map::new();
        for q in [
            1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99,
        ] {
            pct.insert(format!("p{q}"), json!(hist.value_at_quantile(q / 100.0)));
        }
        dist.insert("percentiles".into(), pct.into());
        // (value, count) pairs at HdrHistogram's resolution (3 significant digits): enough
        // to rebuild the CDF and compare it with the table.
        let buckets: Vec<[u64; 2]> = hist
            .iter_recorded()
            .map(|v| {
                [
                    hist.highest_equivalent(v.value_iterated_to()),
                    v.count_at_value(),
                ]
            })
            .collect();
        dist.insert("histogram".into(), json!(buckets));
    }
    json!({
        "pid": std::process::id(),
        "ended_by": "exit",
        "comm": std::fs::read_to_string("/proc/self/comm").map(|s| s.trim().to_string()).unwrap_or_default(),
        "injecting": ctx.table.is_some(),
        "disabled_reason": ctx.disabled_reason,
        "table": ctx.table_source,
        "unit": u,
        "seed": ctx.seed,
        "seed_source": ctx.seed_source,
        // "post": `posts` counts ibv_post_send calls and ibv_wr_* batches; "wr": work requests.
        "per": ctx.per.name(),
        "clock": ctx.clock,
        // Real libibverbs symbols found only through dlopen("libibverbs.so.1", RTLD_NOLOAD).
        "symbols_via_noload_fallback": crate::real::NOLOAD_FALLBACKS.load(Relaxed),
        // Lookups through a library handle (dlsym/dlvsym, as NCCL does) answered with a hook.
        "hooks_via_dlsym": crate::dl::HANDED_OUT.load(Relaxed),
        // Asked for, and which layers delayed ("verbs", "ucp", "verbs+ucp" or "none").
        "layer": ctx.layer.name(),
        "layer_used": crate::inject::layer_used(snap.post_send + snap.wr_complete, snap.ucp),
        "posts": { "post_send": snap.post_send, "wr_complete": snap.wr_complete, "ucp": snap.ucp },
        "posts_total": snap.post_send + snap.wr_complete + snap.ucp,
        "threads": snap.per_thread.iter().map(|p| json!({"post_send": p[0], "wr_complete": p[1], "ucp": p[2]})).collect::<Vec<_>>(),
        "draws": draws,
        // Exact per-index counts ([index, hits], non-zero only): the injected distribution
        // without histogram rounding.
        "index_hits": snap.hits.iter().enumerate().filter(|(_, &n)| n > 0).map(|(i, &n)| [i as u64, n]).collect::<Vec<_>>(),
        "delays_injected": injected,
        format!("sum_{u}"): sum as u64,
        format!("delay_{u}"): dist,
    })
}

/// `%p` in the stats path → pid. Without `%p`, a process that does not own the path (a forked
/// child, an exec'd descendant of the owner) would overwrite the owner's file: it writes
/// `NAME.<pid>.EXT` (or `NAME.<pid>`) beside it instead.
pub fn expand_path(pattern: &str, not_owner: bool) -> String {
    let pid = std::process::id().to_string();
    if pattern.contains("%p") || !not_owner {
        return pattern.replace("%p", &pid);
    }
    let path = std::path::Path::new(pattern);
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => path
            .with_file_name(format!(
                "{}.{pid}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .display()
            .to_string(),
        _ => format!("{pattern}.{pid}"),
    }
}

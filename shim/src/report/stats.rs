//! The stats document (`IBJITTER_STATS`): what the counters ([`crate::draw::counts`]) and the
//! table say, with the context of the run, and where a process writes it.
use crate::config::{Layer, Per, Unit};
use crate::draw::counts::Snapshot;
use hdrhistogram::Histogram;
use std::sync::atomic::Ordering::Relaxed;

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
        "symbols_via_noload_fallback": crate::sys::symbols::NOLOAD_FALLBACKS.load(Relaxed),
        // Lookups through a library handle (dlsym/dlvsym, as NCCL does) answered with a hook.
        "hooks_via_dlsym": crate::sys::symbols::HANDED_OUT.load(Relaxed),
        // Asked for, and which layers delayed ("verbs", "ucp", "verbs+ucp" or "none").
        "layer": ctx.layer.name(),
        "layer_used": crate::state::layer_used(snap.post_send + snap.wr_complete, snap.ucp),
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

/// Where this process writes the stats (or trace) file named by `pattern`.
pub fn path_for(pattern: &str) -> String {
    expand_path(pattern, !crate::state::owns_stats_path())
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

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

/// `%p` in the stats path → pid, `%h` → the host's name. Without `%p`, a process that does
/// not own the path (a forked child, an exec'd descendant of the owner, a launcher's rank)
/// would overwrite the owner's file: it writes `NAME.<host>.<pid>.EXT` (or
/// `NAME.<host>.<pid>`) beside it instead. The host is in that name because ranks on
/// different nodes writing to a shared directory can have the same pid.
pub fn expand_path(pattern: &str, not_owner: bool) -> String {
    expand_path_for(pattern, not_owner, std::process::id(), &host_name())
}

fn expand_path_for(pattern: &str, not_owner: bool, pid: u32, host: &str) -> String {
    let pid = pid.to_string();
    let pattern = pattern.replace("%h", host);
    if pattern.contains("%p") || !not_owner {
        return pattern.replace("%p", &pid);
    }
    let path = std::path::Path::new(&pattern);
    match (path.file_stem(), path.extension()) {
        (Some(stem), Some(ext)) => path
            .with_file_name(format!(
                "{}.{host}.{pid}.{}",
                stem.to_string_lossy(),
                ext.to_string_lossy()
            ))
            .display()
            .to_string(),
        _ => format!("{pattern}.{host}.{pid}"),
    }
}

/// This host's name as a file name part (`gethostname`; a `/` or an empty name, which a
/// file name cannot carry, becomes `_` or `unknown-host`).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length; gethostname NUL-terminates within it (or truncates).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).replace('/', "_")
    } else {
        String::new()
    };
    if name.is_empty() || name == "." || name == ".." {
        "unknown-host".into()
    } else {
        name
    }
}

#[cfg(test)]
mod path_tests {
    use super::expand_path_for;

    #[test]
    fn ranks_and_children_name_their_files_by_host_and_pid() {
        let e = |p: &str, not_owner: bool| expand_path_for(p, not_owner, 42, "node7");
        assert_eq!(e("/d/s.json", false), "/d/s.json");
        assert_eq!(e("/d/s.json", true), "/d/s.node7.42.json");
        assert_eq!(e("/d/stats", true), "/d/stats.node7.42");
        assert_eq!(e("/d/s.%p.json", true), "/d/s.42.json");
        assert_eq!(e("/d/s.%h.%p.json", false), "/d/s.node7.42.json");
        // %h alone is not unique on a host: a process not owning the path adds both.
        assert_eq!(e("/d/%h.json", true), "/d/node7.node7.42.json");
    }
}

//! libibjitter.so — the LD_PRELOAD latency injector.
//!
//! `LD_PRELOAD=libibjitter.so APP` delays every send APP posts (each `ibv_post_send` call and
//! each batch of `ibv_wr_*` requests, at `ibv_wr_start`) by a busy-wait drawn from a 4096-entry table, without changing APP.
//!
//! Modules, each depending only on those listed after it:
//! - [`dl`]: interposed `dlsym`/`dlvsym`, so lookups through a libibverbs handle get the
//!   hooks; [`elf_lookup`]: libc's real ones, from its dynamic symbol table;
//! - [`hooks`]: the interposed exported symbols (open/import/close a device, create a QP);
//!   [`control`]: live control (`ibjitter inject`), served by a thread of the shim;
//! - [`patch`]: swapping provider pointers in contexts and QPs, the registries of originals,
//!   and the post wrappers; [`wr_ops`]: the `ibv_wr_*` work-request wrappers of
//!   `IBJITTER_PER=wr` and `IBJITTER_OPS`; [`select`]: which sends are delayed (opcode, QP,
//!   destination);
//! - [`ucp`]: the UCP layer, UCX's send calls (`IBJITTER_LAYER`);
//! - [`cq`]: completion-side delay (`IBJITTER_CQ_TABLE`), the rings `ibv_poll_cq` hands
//!   completions from; [`cq_ex`]: the same for the extended poll API (`ibv_start_poll`);
//! - [`inject`]: the active injection: table in wait units, clock kind, draw, wait;
//!   [`line`]: `IBJITTER_MODE=line`, the delay line and its timer thread;
//! - [`stats`]: counters and the stats document; [`config`]: the `IBJITTER_*` environment;
//!   [`rng`]: per-thread PCG streams; [`clock`]: TSC busy-wait;
//! - [`coverage`]: whether anything passed the hooks (said at exit); [`ports`]: what the
//!   device ports sent meanwhile;
//! - [`real`]: typed function pointers, the real libibverbs symbols; [`say`]: stderr;
//!   [`verbs_abi`]: struct layouts.
//!
//! This file wires load, fork and exit. The post path ([`patch::post_send_hook`]) takes no
//! lock, makes no syscall and never allocates.

pub mod clock;
pub mod config;
pub mod control;
pub mod coverage;
pub mod cq;
pub mod cq_ex;
pub mod dl;
pub mod elf_lookup;
pub mod hooks;
pub mod inject;
pub mod line;
pub mod patch;
pub mod ports;
pub mod real;
pub mod rng;
pub mod say;
pub mod select;
pub mod sigstats;
pub mod stats;
pub mod trace;
pub mod ucp;
pub mod verbs_abi;
pub mod wr_ops;

use config::Settings;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};
use std::sync::Mutex;

/// The active settings (not used on the post path).
static STATE: Mutex<Option<Loaded>> = Mutex::new(None);
/// This process must not write the stats path as given (no `%p` in it): it is a fork()
/// child of the one that loaded the shim, or an exec'd descendant of the process that
/// loaded it first ([`OWNER_VAR`]). It writes `NAME.<pid>.EXT` instead.
static NOT_OWNER: AtomicBool = AtomicBool::new(false);
/// The `IBJITTER_STATS` pattern, readable without a lock (a fork child needs it).
static PATTERN: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());
/// Set by the first process that loads the shim with a `%p`-less `IBJITTER_STATS`, inherited
/// by everything it execs: those write `NAME.<pid>.EXT`, never over the owner's file.
const OWNER_VAR: &str = "IBJITTER_STATS_OWNER";
struct Loaded {
    settings: Settings,
    clock: String,
}

/// Applies `settings`: activates the injection ([`inject::activate`]), prepares the startup
/// line and the stats. The load constructor calls it; tests and benches may too, while no
/// thread is posting.
pub fn install(settings: Settings) {
    let clock = inject::activate(
        settings.delays.as_ref(),
        settings.unit,
        settings.per,
        settings.layer,
        settings.spin,
        settings.seed,
        settings.stats.is_some(),
        settings.window,
        select::activate(&settings.select),
        &settings.shape,
        settings.control,
    );
    if settings.line && (settings.delays.is_some() || settings.control) {
        inject::enable_line();
    }
    let clock = match &settings.cq {
        Some(cq) => {
            // The completion table uses the send table's clock, or chooses it.
            let desc = if settings.delays.is_none() {
                inject::choose_clock(cq, settings.unit, settings.spin)
            } else {
                clock
            };
            cq::activate(&cq.values, clock::kind());
            desc
        }
        None => clock,
    };
    say::set_startup(startup_message(&settings, &clock));
    if settings.warning.is_some() {
        say::show_startup_now();
    }
    if let Some(pattern) = &settings.stats {
        PATTERN.store(Box::into_raw(Box::new(pattern.clone())), Release);
        sigstats::arm(
            &stats_path(pattern),
            settings.delays.as_ref().map(|d| d.values.as_slice()),
            settings.unit,
            settings.seed,
        );
    }
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(Loaded { settings, clock });
}

fn startup_message(s: &Settings, clock: &str) -> Option<String> {
    if let Some(w) = &s.warning {
        return Some(format!("ibjitter: warning: {w}"));
    }
    if s.quiet {
        return None;
    }
    if let Some(why) = &s.not_this_process {
        return Some(format!("ibjitter: {why}"));
    }
    let u = s.unit.name();
    let what = match &s.delays {
        Some(d) => format!(
            "table {} (mean {:.0} {u}, max {} {u}), seed {} ({}), clock {clock}{}",
            d.source,
            time_weighted_mean(d, &s.shape),
            d.max(),
            s.seed,
            s.seed_source,
            shape_words(&s.shape),
        ),
        None if s.cq.is_some() => format!("no send table, clock {clock}"),
        None if s.stats.is_some() => "no table: counting posts only".into(),
        None if s.control => {
            return Some(format!(
                "ibjitter: no table yet (IBJITTER_TABLE, _DIST or _DELAY): pass-through until \
                 `ibjitter inject set {}` gives one",
                std::process::id()
            ))
        }
        None => {
            return Some(
                "ibjitter: warning: no IBJITTER_TABLE, IBJITTER_DIST or IBJITTER_DELAY set; pass-through"
                    .into(),
            )
        }
    };
    let stats = s
        .stats
        .as_deref()
        .map(|p| format!(", stats {p}"))
        .unwrap_or_default();
    let per = match (s.per, s.line) {
        (config::Per::Post, false) => "",
        (config::Per::Wr, false) => ", one delay per work request",
        (config::Per::Post, true) => ", mode line (posts return at once; a shim thread posts when due)",
        (config::Per::Wr, true) => {
            ", one delay per work request, mode line (posts return at once; a shim thread posts when due)"
        }
    };
    let per = match s.window {
        Some(w) => format!(
            "{per}, from {:.3} s{} after load",
            w.start_ns as f64 / 1e9,
            w.stop_ns
                .map(|t| format!(" to {:.3} s", t as f64 / 1e9))
                .unwrap_or_default()
        ),
        None => per.to_string(),
    };
    let layer = match s.layer {
        config::Layer::Auto => ", layer auto (UCP for UCX, verbs for the rest)",
        config::Layer::Verbs => ", layer verbs",
        config::Layer::Ucp => ", layer ucp",
    };
    let cq =
        s.cq.as_ref()
            .map(|d| {
                format!(
                    ", completions held by table {} (mean {:.0} ns)",
                    d.source,
                    d.mean()
                )
            })
            .unwrap_or_default();
    Some(format!(
        "ibjitter: {what}{cq}{per}{}{layer}{stats}; hooks {}",
        s.select.describe(),
        hooks::HOOKED
    ))
}

/// Live `set`s ([`apply_live_set`]): what earlier tables' draws added up to, and the hits at
/// the last set (the table in `STATE` counts the draws since).
struct Epochs {
    sets: u64,
    carried: stats::Drawn,
    base_hits: Vec<u64>,
}

static EPOCHS: Mutex<Epochs> = Mutex::new(Epochs {
    sets: 0,
    carried: stats::Drawn {
        draws: 0,
        injected: 0,
        sum: 0,
    },
    base_hits: Vec::new(),
});

/// `m` locked, waiting at most half a second: a fork child whose parent forked while the
/// control thread held the lock inherits it held forever; its exit paths then go without.
fn locked<T>(m: &'static Mutex<T>) -> Option<std::sync::MutexGuard<'static, T>> {
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

/// The hits since the last live set (all of them without one).
fn hits_since_set(hits: &[u64]) -> Vec<u64> {
    let Some(e) = locked(&EPOCHS) else {
        return hits.to_vec();
    };
    hits.iter()
        .enumerate()
        .map(|(i, &h)| h - e.base_hits.get(i).copied().unwrap_or(0).min(h))
        .collect()
}

/// Draws, delays and their sum over every table the process used.
fn drawn_in_all(table: Option<&[u64]>, hits: &[u64]) -> stats::Drawn {
    let now = stats::drawn(table, &hits_since_set(hits));
    let c = locked(&EPOCHS).map(|e| e.carried).unwrap_or_default();
    stats::Drawn {
        draws: c.draws + now.draws,
        injected: c.injected + now.injected,
        sum: c.sum + now.sum,
    }
}

/// For live control's answers: sends that passed a hook, delayed ones, their sum in ns.
pub fn live_counts() -> (u64, u64, u64) {
    let snap = stats::snapshot();
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let table = guard
        .as_ref()
        .and_then(|l| l.settings.delays.as_ref())
        .map(|d| d.values.as_slice());
    let d = drawn_in_all(table, &snap.hits);
    (
        snap.post_send + snap.wr_complete + snap.ucp,
        d.injected,
        d.sum.min(u128::from(u64::MAX)) as u64,
    )
}

/// What is injected now, for live control's answers.
pub fn table_now() -> String {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref().and_then(|l| l.settings.delays.as_ref()) {
        Some(d) if inject::paused() => format!("paused (table {})", d.source),
        Some(d) => format!("table {}", d.source),
        None => "no table (pass-through)".into(),
    }
}

/// The variables `ibjitter inject set` may change.
const LIVE_VARS: [&str; 5] = [
    "IBJITTER_TABLE",
    "IBJITTER_DIST",
    "IBJITTER_DELAY",
    "IBJITTER_JITTER",
    "IBJITTER_PROB",
];

/// `ibjitter inject set`: `IBJITTER_*=value` lines, read with the grammar of the launch
/// environment (the unit and seed the process started with); on success the new table is
/// injected from now on. Returns what is injected now, or why nothing changed.
pub fn apply_live_set(text: &str) -> Result<String, String> {
    let mut vars = std::collections::HashMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("\"{line}\": expected IBJITTER_NAME=value"))?;
        if !LIVE_VARS.contains(&k) {
            return Err(format!(
                "{k} cannot change while the process runs (live: {})",
                LIVE_VARS.join(", ")
            ));
        }
        vars.insert(k.to_string(), v.to_string());
    }
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let l = guard.as_mut().ok_or("the shim has no configuration")?;
    let unit = l.settings.unit;
    vars.insert("IBJITTER_UNIT".into(), unit.name().into());
    vars.insert("IBJITTER_SEED".into(), l.settings.seed.to_string());
    let s = Settings::from_vars(|k| vars.get(k).cloned());
    if let Some(w) = s.warning {
        return Err(w
            .trim_end_matches("; injection disabled (pass-through)")
            .to_string());
    }
    let mut d = s
        .delays
        .ok_or("no table given (IBJITTER_TABLE, _DIST or _DELAY)")?;
    if inject::episodes().is_some() {
        // Both states' halves now hold the one table.
        d.values = d.values.repeat(2);
    }
    {
        // What the old table's draws added up to stays counted.
        let snap = stats::snapshot();
        let old = l.settings.delays.as_ref().map(|d| d.values.as_slice());
        let since = hits_since_set(&snap.hits);
        let mut e = EPOCHS.lock().unwrap_or_else(|e| e.into_inner());
        let was = stats::drawn(old, &since);
        e.carried.draws += was.draws;
        e.carried.injected += was.injected;
        e.carried.sum += was.sum;
        e.base_hits = snap.hits;
        e.sets += 1;
    }
    if let Some(clock) = inject::replace_table(&d, unit, l.settings.spin) {
        l.clock = clock;
    }
    if let Some(pattern) = &l.settings.stats {
        sigstats::arm(&stats_path(pattern), Some(&d.values), unit, l.settings.seed);
    }
    let now = format!("table {}", d.source);
    l.settings.delays = Some(d);
    Ok(now)
}

/// The mean delay: with episodes, each table's mean weighted by its state's mean dwell.
fn time_weighted_mean(d: &config::Delays, shape: &config::Shape) -> f64 {
    match shape.episodes {
        Some((calm, congested)) if d.values.len() == 2 * ibjitter_table::ENTRIES => {
            let (a, b) = d.values.split_at(ibjitter_table::ENTRIES);
            let mean = |t: &[u64]| t.iter().map(|&v| v as f64).sum::<f64>() / t.len() as f64;
            (calm * mean(a) + congested * mean(b)) / (calm + congested)
        }
        _ => d.mean(),
    }
}

/// ", correlation 0.8, trace FILE" for the startup line.
fn shape_words(shape: &config::Shape) -> String {
    let mut w = String::new();
    if let Some(rho) = shape.correlation {
        w += &format!(
            ", correlation {rho} (a draw repeats the thread's last with that probability)"
        );
    }
    if let Some((path, max)) = &shape.trace {
        w += &format!(", trace {path} (first {max} draws)");
    }
    w
}

/// Writes the `IBJITTER_TRACE` file, if asked for, of a process that drew.
fn write_trace() {
    let Some(guard) = locked(&STATE) else { return };
    let Some(l) = guard.as_ref() else { return };
    let (Some((pattern, _)), Some(d)) = (&l.settings.shape.trace, &l.settings.delays) else {
        return;
    };
    if rng::threads_posted() == 0 {
        return;
    }
    let path = stats_path(pattern);
    if let Err(e) = trace::write(&path, &d.values, l.settings.unit.name()) {
        say::warn_once(&format!("cannot write trace file {path}: {e}"));
    }
}

/// The stats document now (None when stats are off).
pub fn stats_json() -> Option<serde_json::Value> {
    let guard = locked(&STATE)?;
    let l = guard.as_ref()?;
    l.settings.stats.as_ref()?;
    let s = &l.settings;
    let ctx = stats::Context {
        table: s.delays.as_ref().map(|d| d.values.as_slice()),
        table_source: s.delays.as_ref().map(|d| d.source.as_str()),
        unit: s.unit,
        per: s.per,
        layer: s.layer,
        seed: s.seed,
        seed_source: &s.seed_source,
        clock: l.clock.clone(),
        disabled_reason: s.warning.as_deref().or(s.not_this_process.as_deref()),
    };
    let mut snap = stats::snapshot();
    let all = drawn_in_all(ctx.table, &snap.hits);
    // Index hits, the histogram and percentiles: the draws since the last live set (of the
    // table now in use); the totals: every table's.
    snap.hits = hits_since_set(&snap.hits);
    let mut doc = stats::to_json(&snap, &ctx);
    let sets = locked(&EPOCHS).map_or(0, |e| e.sets);
    if sets > 0 {
        doc["draws"] = all.draws.into();
        doc["delays_injected"] = all.injected.into();
        doc[format!("sum_{}", s.unit.name())] = (all.sum.min(u128::from(u64::MAX)) as u64).into();
        doc["live_sets"] = sets.into();
    }
    Some(doc)
}

/// Writes the stats file if `IBJITTER_STATS` asked for one and the process opened a device,
/// or loaded libibverbs and delayed nothing (shells and launchers under `LD_PRELOAD` leave no
/// empty files behind).
pub fn write_stats() {
    write_stats_noting(coverage::nothing_delayed());
}

/// [`write_stats`], with why nothing was delayed (if so) already known.
fn write_stats_noting(nothing_delayed: Option<String>) {
    if !say::opened() && nothing_delayed.is_none() {
        return;
    }
    let path = {
        let Some(guard) = locked(&STATE) else { return };
        match guard.as_ref().and_then(|l| l.settings.stats.clone()) {
            Some(p) => stats_path(&p),
            None => return,
        }
    };
    let Some(mut doc) = stats_json() else { return };
    doc["nothing_delayed"] = serde_json::json!(nothing_delayed);
    if inject::line_mode() {
        doc["line"] = line::stats_json();
    }
    if cq::on() {
        doc["cq"] = cq::stats_json();
    }
    if let Some((changes, calm, congested)) = inject::episodes() {
        doc["episodes"] = serde_json::json!({
            "mean_calm_ns": calm, "mean_congested_ns": congested, "state_changes": changes,
            // index_hits from 4096 on are the congested table's.
            "congested_indices_from": ibjitter_table::ENTRIES,
        });
    }
    // What the ports sent meanwhile (all processes' traffic on them), beside posts_total.
    doc["ports_sent"] = ports::sent_since_open();
    let text = format!("{doc:#}\n");
    if let Err(e) = std::fs::write(&path, text) {
        say::warn_once(&format!("cannot write stats file {path}: {e}"));
    }
}

// The shim's own load and exit hooks. `__register_atfork` with this object's handle is
// what glibc's pthread_atfork wrapper does (that symbol is not linkable directly).
extern "C" {
    fn __register_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
        dso_handle: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
    static __dso_handle: u8;
}

/// Where this process writes its stats.
fn stats_path(pattern: &str) -> String {
    stats::expand_path(pattern, NOT_OWNER.load(Relaxed))
}

/// Claims a `%p`-less stats path for this process, or notes that an ancestor did.
fn claim_stats_path() {
    match std::env::var("IBJITTER_STATS") {
        Ok(p) if !p.trim().is_empty() && !p.contains("%p") => {}
        _ => return,
    }
    // Ranks of a launcher are siblings: none inherits another's claim.
    if config::LAUNCHER_RANK_VARS
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        NOT_OWNER.store(true, Relaxed);
        return;
    }
    let me = std::process::id().to_string();
    match std::env::var(OWNER_VAR) {
        Ok(owner) if owner != me => NOT_OWNER.store(true, Relaxed),
        Ok(_) => {}
        // SAFETY (set_var): the load constructor runs before main, while no other thread
        // of the program reads the environment.
        Err(_) => std::env::set_var(OWNER_VAR, &me),
    }
}

extern "C" fn on_load() {
    // A panic must never cross into the host program: on any failure, pass through.
    let _ = std::panic::catch_unwind(|| {
        // Before anything else may look a symbol up through the shim's dlsym/dlvsym.
        dl::resolve();
        claim_stats_path();
        install(Settings::from_vars(|k| std::env::var(k).ok()));
        // SAFETY: handlers are plain functions of this object, unregistered by glibc if the
        // object is ever unloaded (dso handle).
        unsafe {
            __register_atfork(
                Some(on_fork_prepare),
                Some(patch::unlock_after_fork),
                Some(on_fork_child),
                std::ptr::addr_of!(__dso_handle) as *mut _,
            );
        }
    });
}

extern "C" fn on_fork_prepare() {
    rng::atfork_prepare();
    patch::lock_for_fork();
}

extern "C" fn on_fork_child() {
    patch::unlock_after_fork();
    NOT_OWNER.store(true, Relaxed);
    rng::atfork_child();
    coverage::reset_after_fork();
    ports::reset_after_fork();
    stats::reset();
    trace::reset();
    line::after_fork_child();
    inject::unlock_after_fork();
    inject::disable_line();
    // SAFETY: PATTERN is leaked, never freed. (glibc lets the forking thread allocate.)
    if let Some(p) = unsafe { PATTERN.load(Acquire).as_ref() } {
        sigstats::set_path(&stats_path(p));
    }
}

extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(|| {
        let nothing_delayed = coverage::nothing_delayed();
        if let Some(why) = &nothing_delayed {
            say::warn(why);
        } else if let Some(line) = exit_summary() {
            say::line(&line);
        }
        if let Some(line) = cq_summary() {
            say::line(&line);
        }
        // What is still in the delay line goes out before the process does (what a wire
        // would do), then the stats count it.
        line::drain(2_000_000_000);
        write_stats_noting(nothing_delayed);
        write_trace();
        control::remove_file();
    });
}

/// The completion side's line at exit: "ibjitter: held 300 of 600 completions, 300.000 ms in
/// all" (unless `IBJITTER_QUIET`).
fn cq_summary() -> Option<String> {
    if !cq::on() || locked(&STATE)?.as_ref()?.settings.quiet {
        return None;
    }
    let (passed, held, sum_ns) = cq::counts();
    let unheld_n = cq::stats_json()["unheld"].as_u64().unwrap_or(0);
    let unheld = if unheld_n > 0 {
        format!(
            "; {unheld_n} from CQs the shim had no ring for passed undelayed (more CQs than \
             its table holds)"
        )
    } else {
        String::new()
    };
    (passed + unheld_n > 0).then(|| {
        format!(
            "ibjitter: held {held} of {passed} completions, {:.3} ms in all{unheld}",
            sum_ns as f64 / 1e6
        )
    })
}

/// The coverage line said at exit ([`coverage::summary`]) by a process that injects and
/// whose sends passed a hook, unless `IBJITTER_QUIET` (a utility that only opens a device,
/// like ibv_devinfo, stays quiet).
fn exit_summary() -> Option<String> {
    let snap = stats::snapshot();
    if snap.post_send + snap.wr_complete + snap.ucp == 0 {
        return None;
    }
    let guard = locked(&STATE)?;
    let s = &guard.as_ref()?.settings;
    let table = s.delays.as_ref()?;
    if s.quiet {
        return None;
    }
    let d = drawn_in_all(Some(&table.values), &snap.hits);
    let sum = match s.unit {
        config::Unit::Ns => format!("{:.3} ms", d.sum as f64 / 1e6),
        config::Unit::Loops => format!("{} loops", d.sum),
    };
    Some(coverage::summary(
        [snap.post_send, snap.wr_complete, snap.ucp],
        d.injected,
        &sum,
        &ports::sent_since_open(),
    ))
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;

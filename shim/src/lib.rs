//! libibjitter.so — the LD_PRELOAD latency injector.
//!
//! `LD_PRELOAD=libibjitter.so APP` delays every send APP posts (each `ibv_post_send` call and
//! each `ibv_wr_complete`) by a busy-wait drawn from a 4096-entry table, without changing APP.
//!
//! - [`hooks`]: the interposed exported symbols and real-symbol resolution;
//! - [`patch`]: swapping provider pointers in contexts and QPs, registries for restore;
//! - [`config`]: the `IBJITTER_*` environment; [`clock`]: TSC busy-wait; [`rng`]: per-thread
//!   PCG streams; [`stats`]: counters and the stats file; [`verbs_abi`]: struct layouts.
//!
//! The post path ([`patch::post_send_hook`]) takes no lock, makes no syscall and never allocates.

pub mod clock;
pub mod config;
pub mod hooks;
pub mod patch;
pub mod rng;
pub mod stats;
pub mod verbs_abi;

use config::{Settings, Unit};
use stats::Hook;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::*};
use std::sync::Mutex;

const ENTRIES: usize = ibjitter_table::ENTRIES;
/// Mode bit: draw and wait.
const INJECT: u8 = 1;
/// Mode bit: count (IBJITTER_STATS).
const STATS: u8 = 2;

/// 0 until load finished (and whenever there is nothing to do): wrappers pass through.
static MODE: AtomicU8 = AtomicU8::new(0);
/// The table in wait units (TSC ticks, ns or loops), read by the post path.
static WAITS: [AtomicU64; ENTRIES] = [const { AtomicU64::new(0) }; ENTRIES];
/// The active settings and the startup message (not used on the post path).
static STATE: Mutex<Option<Loaded>> = Mutex::new(None);
static ANNOUNCED: AtomicBool = AtomicBool::new(false);
/// This process is a fork() child of the one that loaded the shim (its stats file must not
/// overwrite the parent's).
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);
/// Set once the configuration is installed.
static LOADED: AtomicBool = AtomicBool::new(false);

struct Loaded {
    settings: Settings,
    clock: String,
    message: Option<String>,
}

/// What the post wrappers must do: 0 = pass through (also before load finished).
#[inline(always)]
pub(crate) fn mode() -> u8 {
    MODE.load(Acquire)
}

/// Called before a post when [`mode`] is not 0: draw an index and count. Returns what to
/// busy-wait (0 for a zero entry: then the post goes on without reading any clock), or None
/// on the thread's first post (see [`rng::with_thread`]).
#[inline(always)]
pub(crate) fn draw(mode: u8, hook: Hook) -> Option<u64> {
    rng::with_thread(|rng, thread| {
        let (index, wait) = if mode & INJECT != 0 {
            let i = rng::next_index(rng);
            (Some(i), WAITS[i].load(Relaxed))
        } else {
            (None, 0)
        };
        if mode & STATS != 0 {
            stats::count(thread, hook, index);
        }
        wait
    })
}

/// Applies `settings`: converts the table to wait units (calibrating the TSC), seeds the
/// streams, prepares stats. The load constructor calls it; tests and benches may too, while
/// no thread is posting.
pub fn install(settings: Settings) {
    MODE.store(0, Release);
    let mut clock_desc = String::from("none");
    if let Some(d) = &settings.delays {
        let kind = match settings.unit {
            Unit::Loops => clock::WaitKind::Loops,
            Unit::Ns if clock::tsc_trusted() && clock::calibrate(2_000_000).is_some() => {
                clock::WaitKind::Tsc
            }
            Unit::Ns => clock::WaitKind::Monotonic,
        };
        clock::set_kind(kind);
        clock_desc = match kind {
            clock::WaitKind::Tsc => {
                format!("tsc {:.3} GHz", clock::tsc_per_ns().unwrap_or_default())
            }
            clock::WaitKind::Monotonic => "CLOCK_MONOTONIC".into(),
            clock::WaitKind::Loops => "spin loops".into(),
        };
        for (w, &v) in WAITS.iter().zip(&d.values) {
            w.store(clock::ns_to_units(v, kind), Relaxed);
        }
    }
    rng::set_seed(settings.seed);
    let mut mode = 0;
    if settings.delays.is_some() {
        mode |= INJECT;
    }
    if settings.stats.is_some() {
        stats::enable();
        mode |= STATS;
    }
    let message = startup_message(&settings, &clock_desc);
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(Loaded {
        settings,
        clock: clock_desc,
        message,
    });
    MODE.store(mode, Release);
    LOADED.store(true, Release);
}

/// Whether new contexts need patching: not when the configuration is loaded and asks for
/// nothing (no table, no stats): then posts go straight to the provider at no cost. Before
/// the configuration is loaded, patch (the wrappers pass through until it is).
pub(crate) fn wants_patching() -> bool {
    !LOADED.load(Acquire) || MODE.load(Acquire) != 0
}

fn startup_message(s: &Settings, clock: &str) -> Option<String> {
    if let Some(w) = &s.warning {
        return Some(format!("ibjitter: warning: {w}"));
    }
    if s.quiet {
        return None;
    }
    let u = s.unit.name();
    let what = match &s.delays {
        Some(d) => format!(
            "table {} (mean {:.0} {u}, max {} {u}), seed {} ({}), clock {clock}",
            d.source,
            d.mean(),
            d.max(),
            s.seed,
            s.seed_source
        ),
        None if s.stats.is_some() => "no table: counting posts only".into(),
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
    Some(format!("ibjitter: {what}{stats}; hooks {}", hooks::HOOKED))
}

/// Prints the startup line (or the warning) once per process, when it first opens a device:
/// processes that never use verbs (shells, launchers under LD_PRELOAD) stay silent.
pub(crate) fn announce_once() {
    if ANNOUNCED.swap(true, Relaxed) {
        return;
    }
    let msg = STATE
        .lock()
        .ok()
        .and_then(|s| s.as_ref().and_then(|l| l.message.clone()));
    if let Some(m) = msg {
        // One write: the line does not interleave with the application's output.
        let _ = std::io::stderr().write_all(format!("{m}\n").as_bytes());
    }
}

/// Prints a warning at most once per process.
pub(crate) fn warn_once(msg: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        let _ = std::io::stderr().write_all(format!("ibjitter: warning: {msg}\n").as_bytes());
    }
}

/// The stats document now (None when stats are off).
pub fn stats_json() -> Option<serde_json::Value> {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let l = guard.as_ref()?;
    l.settings.stats.as_ref()?;
    let s = &l.settings;
    let ctx = stats::Context {
        table: s.delays.as_ref().map(|d| d.values.as_slice()),
        table_source: s.delays.as_ref().map(|d| d.source.as_str()),
        unit: s.unit,
        seed: s.seed,
        seed_source: &s.seed_source,
        clock: l.clock.clone(),
        disabled_reason: s.warning.as_deref(),
    };
    Some(stats::to_json(&stats::snapshot(), &ctx))
}

/// Writes the stats file if `IBJITTER_STATS` asked for one and the process opened a device
/// (shells and launchers under `LD_PRELOAD` leave no empty files behind).
pub fn write_stats() {
    if !ANNOUNCED.load(Relaxed) {
        return;
    }
    let path = {
        let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref().and_then(|l| l.settings.stats.clone()) {
            Some(p) => stats::expand_path(&p, FORKED_CHILD.load(Relaxed)),
            None => return,
        }
    };
    let Some(doc) = stats_json() else { return };
    let text = format!("{doc:#}\n");
    if let Err(e) = std::fs::write(&path, text) {
        warn_once(&format!("cannot write stats file {path}: {e}"));
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

extern "C" fn on_load() {
    // A panic must never cross into the host program: on any failure, pass through.
    let _ = std::panic::catch_unwind(|| {
        install(Settings::from_vars(|k| std::env::var(k).ok()));
        // SAFETY: handlers are plain functions of this object, unregistered by glibc if the
        // object is ever unloaded (dso handle).
        unsafe {
            __register_atfork(
                Some(rng::atfork_prepare),
                None,
                Some(on_fork_child),
                std::ptr::addr_of!(__dso_handle) as *mut _,
            );
        }
    });
}

extern "C" fn on_fork_child() {
    FORKED_CHILD.store(true, Relaxed);
    rng::atfork_child();
    stats::reset();
}

extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(write_stats);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;

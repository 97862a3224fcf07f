//! The injector's life in a process, in order: load ([`at_load`]: settings applied, nothing
//! started), first use ([`first_use`]: the process opened a device or sent through UCP: the
//! start-up line, the shim's threads, live control), fork ([`before_fork`],
//! [`after_fork_child`]), exit ([`at_exit`]: the exit lines, the delay line drained, the
//! stats and trace files) and the ends that run no exit handler ([`before_exec`],
//! [`at_immediate_exit`]). Each step changes the state through [`crate::state`]'s writers.
use crate::abi::verbs::ibv_context;
use crate::config::{self, Settings};
use crate::draw::{self, counts, episodes, trace};
use crate::modes::{cq, line, select, window};
use crate::registry;
use crate::report::stats::{self, path_for};
use crate::report::{coverage, lines, ports, sigstats};
use crate::runtime::{control, loaded};
use crate::state;
use crate::sys::{clock, libc_dl, out_file, rng, say, symbols};
use crate::wrappers::patch;
use std::sync::atomic::{AtomicPtr, Ordering::*};

/// The `IBJITTER_STATS` pattern, readable without a lock (a fork child needs it).
static PATTERN: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());
/// Set by the first process that loads the shim with a `%p`-less `IBJITTER_STATS`, inherited
/// by everything it execs: those write `NAME.<host>.<pid>.EXT`, never over the owner's file.
const OWNER_VAR: &str = "IBJITTER_STATS_OWNER";

/// The load constructor's work: libc's `dlsym` first (before anything may look a symbol up
/// through the shim's exports), then the fork handlers and the settings. Once: a library
/// whose constructor opens a device runs before the shim's own when the loader initializes
/// it first (one preloaded after the shim, one the program links), and the first use does it
/// then. A panic in it is caught here (a poisoned `Once` would panic again at the first use,
/// in a hook, where nothing catches it): the shim then stands aside, all pass-through.
pub fn at_load() {
    static LOADED: std::sync::Once = std::sync::Once::new();
    LOADED.call_once(|| {
        if std::panic::catch_unwind(load).is_err() {
            state::stand_aside();
        }
    });
}

fn load() {
    say::note_stderr_at_load();
    libc_dl::resolve();
    if let Some(first) = another_copy_first() {
        state::stand_aside();
        say::warn(&format!(
            "{first} is loaded before this copy of libibjitter.so ({}): this one does \
             nothing (a second shim would write the same stats file at exit, with none of \
             the first's counts)",
            object_of(another_copy_first as *const u8)
        ));
        return;
    }
    register_fork_handlers();
    register_quick_exit_handler();
    claim_stats_path();
    install(Settings::from_vars(config::env_var));
}

extern "C" {
    /// What glibc's `pthread_atfork` wrapper calls with the caller's object (that symbol is
    /// not linkable directly).
    fn __register_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
        dso_handle: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
    static __dso_handle: u8;
    /// What glibc's `at_quick_exit` wrapper calls with the caller's object (idem).
    fn __cxa_at_quick_exit(
        f: extern "C" fn(),
        dso_handle: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
}

/// `quick_exit` runs only the handlers registered for it, then ends the process as `_exit`
/// does (glibc's internal call, which the shim's `_exit` does not see): said as `_exit` is.
fn register_quick_exit_handler() {
    extern "C" fn at_quick_exit() {
        at_immediate_exit("quick_exit");
    }
    // SAFETY: a plain function of this object, unregistered by glibc with the object.
    unsafe { __cxa_at_quick_exit(at_quick_exit, std::ptr::addr_of!(__dso_handle) as *mut _) };
}

/// Registers [`before_fork`], [`after_fork_parent`] and [`after_fork_child`] (before any
/// thread of the shim starts: the first use's, even from another library's constructor).
fn register_fork_handlers() {
    extern "C" fn prepare() {
        before_fork();
    }
    extern "C" fn parent() {
        after_fork_parent();
    }
    extern "C" fn child() {
        after_fork_child();
    }
    // SAFETY: handlers are plain functions of this object, unregistered by glibc if the
    // object is ever unloaded (its dso handle).
    unsafe {
        __register_atfork(
            Some(prepare),
            Some(parent),
            Some(child),
            std::ptr::addr_of!(__dso_handle) as *mut _,
        );
    }
}

/// Every copy of the shim defines it: the process's global scope says which copy is first.
#[no_mangle]
#[used]
static ibjitter_shim_instance: u8 = 0;

/// The file of another copy of the shim that the process's global scope finds first (an
/// installed one and a build tree's both preloaded, say), if any.
fn another_copy_first() -> Option<String> {
    // SAFETY: libc's dlsym with a NUL-terminated name.
    let found =
        unsafe { libc_dl::real_dlsym()(libc::RTLD_DEFAULT, c"ibjitter_shim_instance".as_ptr()) };
    // Not the marker's address: an exported symbol's references bind to the first copy's
    // in every copy. A function of this file that is not exported is this copy's own.
    let own = another_copy_first as *const u8;
    (!found.is_null() && object_base(found.cast()) != object_base(own))
        .then(|| object_of(found.cast()))
}

/// The load address of the object that holds `addr` (null if the loader does not say).
fn object_base(addr: *const u8) -> *mut libc::c_void {
    // SAFETY: dladdr only fills `info` for an address.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr.cast(), &mut info) == 0 {
            return std::ptr::null_mut();
        }
        info.dli_fbase
    }
}

/// The path of the object that holds `addr`, as the loader says.
fn object_of(addr: *const u8) -> String {
    // SAFETY: dladdr fills `info` for an address; its file name is a C string of the loader's.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr.cast(), &mut info) != 0 && !info.dli_fname.is_null() {
            return std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned();
        }
    }
    "another libibjitter.so".into()
}

/// Applies `settings`: the draw, the selection, the modes, then the state's mode; prepares
/// the start-up line and the signal-time stats.
pub fn install(settings: Settings) {
    let selective = select::activate(&settings.select);
    let mode = draw::prepare(&settings, selective);
    state::configure(
        mode,
        settings.layer,
        settings.window,
        settings.control,
        settings.per == config::Per::Wr,
    );
    if settings.line && (settings.delays.is_some() || settings.control) {
        state::set_line(true);
    }
    if settings.warning.is_some() {
        // A refused configuration is said at load, in every process, so that a mistyped
        // variable shows at once, even in a shell.
        say::set_startup(lines::startup(&settings, ""));
        say::show_startup_now();
    }
    if let Some(pattern) = &settings.stats {
        PATTERN.store(Box::into_raw(Box::new(pattern.clone())), Release);
        sigstats::prepare(
            &path_for(pattern),
            settings.delays.as_ref().map(|d| d.values.as_slice()),
            settings.unit,
            settings.seed,
        );
    }
    loaded::set(loaded::Loaded {
        settings,
        clock: CLOCK_NOT_CHOSEN.into(),
    });
}

/// The clock's description until the first use chooses it.
const CLOCK_NOT_CHOSEN: &str = "not chosen (no device opened, no UCP send)";

/// The wait clock for the settings' tables, chosen (the TSC calibrated against
/// CLOCK_MONOTONIC: 250 us of busy time), the tables converted to its units, and the
/// start-up line made with its description. At first use, not at load: shells and
/// launchers under `LD_PRELOAD` never pay for it. False if CLOCK_MONOTONIC cannot be read
/// (a seccomp filter refusing `clock_gettime` where the vDSO falls back to the system
/// call), then or by the end of the choice: then no delay can be timed, and the process
/// passes through, said once as its start-up line (the calibration spun on a failed read
/// for ever, at every device open).
fn choose_clock() -> bool {
    let Some(mut guard) = loaded::get() else {
        return true;
    };
    let Some(l) = guard.as_mut() else { return true };
    let s = &l.settings;
    let clock = match (&s.delays, &s.cq) {
        (Some(d), _) => draw::table::use_table(d, s.unit, s.spin),
        // The completion table uses the send table's clock, or chooses it.
        (None, Some(c)) => draw::table::choose_clock(c, s.unit, s.spin),
        (None, None) => "none".into(),
    };
    if s.warning.is_none() {
        if let Err(e) = clock::read_monotonic() {
            let why = format!(
                "CLOCK_MONOTONIC cannot be read (clock_gettime: {}): no delay can be timed; \
                 injection disabled (pass-through)",
                std::io::Error::from_raw_os_error(e)
            );
            state::no_clock();
            // Said here: the clock's later reads say nothing more.
            clock::unreadable_from_now();
            say::set_startup(Some(format!("ibjitter: warning: {why}")));
            // As a rank left out: a live `set` is refused, the status and the stats say why.
            l.settings.not_this_process = Some(why);
            // SAFETY: PATTERN is leaked, never freed.
            if let Some(p) = unsafe { PATTERN.load(Acquire).as_ref() } {
                // The signal-time stats: nothing injected either.
                sigstats::prepare(&path_for(p), None, l.settings.unit, l.settings.seed);
            }
            l.clock = "none (CLOCK_MONOTONIC cannot be read)".into();
            return false;
        }
    }
    if let Some(c) = &s.cq {
        cq::activate(&c.values, clock::kind());
    }
    if s.warning.is_none() {
        say::set_startup(lines::startup(s, &clock));
    }
    l.clock = clock;
    true
}

/// The process first opened a device or sent through UCP: choose the clock, say the start-up
/// line, start the threads the settings need (window, episodes, delay line), live control
/// and the signal-time stats' handlers. Once.
pub fn first_use() {
    // Other threads wait for the first use to end: it is not cancelled on the way (its
    // clock choice reads files, cancellation points).
    let _not_cancelled = crate::sys::threads::NoCancel::hold();
    // Before the shim's constructor (a device opened from another library's): without the
    // settings, the first use chose no clock and started nothing, and the posts counted as
    // delayed later were never waited for.
    at_load();
    if state::standing_aside() || !state::first_use() {
        return;
    }
    let timed = choose_clock();
    say::show_startup_now();
    // Nothing that times is started without a clock.
    if timed {
        window::start();
        episodes::start();
        if state::line_mode() && !line::start() {
            state::set_line(false);
        }
    }
    control::arm();
    // Not at load: the program has set its own handlers up by now (CPython's SIGINT).
    sigstats::install_handlers();
    state::first_use_done(true);
}

/// A context came back from the real open or import: the process's first use, then the
/// context patched, unless UCX opened it and its messages are delayed at UCP
/// (`IBJITTER_LAYER=auto|ucp`: the process's other contexts, NCCL's or the program's own,
/// keep the verbs delay).
///
/// # Safety
/// `ctx` null or a context just opened.
pub unsafe fn context_opened(ctx: *mut ibv_context) {
    first_use();
    if ctx.is_null() {
        return;
    }
    state::note_context_opened();
    let device = (*ctx).device;
    if !device.is_null() {
        let path = std::ffi::CStr::from_ptr((*device).ibdev_path.as_ptr());
        ports::device_opened(std::path::Path::new(&*path.to_string_lossy()));
    }
    if symbols::libucp_loaded() {
        state::note_ucx_seen();
        if state::ucx_contexts_at_ucp() && symbols::called_from(&[b"libuct", b"libucp"]) {
            // Left unpatched: its sends carry UCP messages, delayed at UCP.
            return;
        }
    }
    patch::patch_context(ctx);
}

/// The process's first UCP message (of this process: a fork child sees its own): UCX is in
/// use, and the first use is due.
#[cold]
#[inline(never)]
pub fn ucp_first_message() {
    state::note_ucx_seen();
    first_use();
}

/// Claims a `%p`-less stats path for this process, or notes that an ancestor did.
fn claim_stats_path() {
    match config::env_var("IBJITTER_STATS") {
        Some(p) if !p.trim().is_empty() && !p.contains("%p") => {}
        _ => return,
    }
    // Ranks of a launcher are siblings: none inherits another's claim.
    if config::launcher_rank(config::env_var).is_some() {
        state::stats_path_not_owned();
        return;
    }
    let me = std::process::id().to_string();
    match std::env::var(OWNER_VAR) {
        Ok(owner) if owner != me => state::stats_path_not_owned(),
        Ok(_) => {}
        // SAFETY (set_var): the load constructor runs before main, while no other thread
        // of the program reads the environment.
        Err(_) => std::env::set_var(OWNER_VAR, &me),
    }
}

/// fork() prepare handler (the forking thread, in the parent).
pub fn before_fork() {
    rng::atfork_prepare();
    loaded::lock_for_fork();
    registry::lock_for_fork();
}

/// fork() parent handler.
pub fn after_fork_parent() {
    registry::release_in_parent();
    loaded::release_in_parent();
}

/// fork() child handler: what the parent counted, opened and started is not the child's.
pub fn after_fork_child() {
    registry::release_in_child();
    loaded::release_in_child();
    state::forked_child();
    // The parent's threads' counters, while their number is still the parent's.
    counts::reset();
    rng::atfork_child();
    state::reset_seen_after_fork();
    ports::reset_after_fork();
    trace::reset();
    line::after_fork_child();
    select::after_fork_child();
    // SAFETY: PATTERN is leaked, never freed. (glibc lets the forking thread allocate.)
    if let Some(p) = unsafe { PATTERN.load(Acquire).as_ref() } {
        sigstats::after_fork_child(&path_for(p));
    }
}

/// The exit handler's work.
pub fn at_exit() {
    if state::standing_aside() {
        return;
    }
    state::exiting();
    // What is still in the delay line goes out before the process does (what a wire
    // would do), as far as its due times allow within 2 s; then the lines and the stats
    // count what was handed over.
    line::drain(2_000_000_000);
    if state::idle_fork_child() {
        // No diagnosis, no stats file of its own: it did nothing the shim saw.
        return;
    }
    let nothing_delayed = coverage::nothing_delayed();
    if let Some(why) = &nothing_delayed {
        say::warn(why);
    } else if let Some(line) = exit_sends() {
        say::line(&line);
    }
    let (quiet, lateness) = loaded::get()
        .and_then(|g| {
            g.as_ref()
                .map(|l| (l.settings.quiet, lines::line_lateness_warning(&l.settings)))
        })
        .unwrap_or((true, None));
    if let Some(w) = lateness {
        say::warn(&w);
    }
    if let Some(line) = lines::exit_completions(quiet) {
        say::line(&line);
    }
    write_stats(nothing_delayed);
    write_trace();
    control::remove_file();
}

fn exit_sends() -> Option<String> {
    let snap = counts::snapshot();
    let guard = loaded::get()?;
    let s = &guard.as_ref()?.settings;
    let drawn = loaded::drawn_in_all(s.delays.as_ref().map(|d| d.values.as_slice()), &snap.hits);
    lines::exit_sends(s, &snap, drawn)
}

/// Writes the `IBJITTER_TRACE` file, if asked for, of a process that drew.
fn write_trace() {
    let Some(guard) = loaded::get() else { return };
    let Some(l) = guard.as_ref() else { return };
    let (Some((pattern, _)), Some(d)) = (&l.settings.shape.trace, &l.settings.delays) else {
        return;
    };
    if rng::threads_posted() == 0 {
        return;
    }
    let path = path_for(pattern);
    // Past `ulimit -f` the write fails instead of SIGXFSZ killing the process at its exit.
    let written = crate::sys::quiet::without(libc::SIGXFSZ, |raised| {
        let r = trace::write(&path, &d.values, l.settings.unit.name());
        *raised = matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EFBIG));
        r
    });
    if let Err(e) = written {
        say::warn(&format!("cannot write trace file {path}: {e}"));
    }
}

/// The stats document now (None when stats are off).
pub fn stats_json() -> Option<serde_json::Value> {
    let guard = loaded::get()?;
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
    let mut snap = counts::snapshot();
    let all = loaded::drawn_in_all(ctx.table, &snap.hits);
    // Index hits, the histogram and percentiles: the draws since the last live set (of the
    // table now in use); the totals: every table's.
    snap.hits = loaded::hits_since_set(&snap.hits);
    let mut doc = stats::to_json(&snap, &ctx);
    if state::clock_unreadable() {
        doc["injecting"] = false.into();
    }
    let sets = state::epoch();
    if sets > 0 {
        doc["draws"] = all.draws.into();
        doc["delays_injected"] = all.injected.into();
        doc[format!("sum_{}", s.unit.name())] = (all.sum.min(u128::from(u64::MAX)) as u64).into();
        doc["live_sets"] = sets.into();
    }
    Some(doc)
}

/// Writes the stats file if `IBJITTER_STATS` asked for one and the process used verbs or
/// UCP, or loaded libibverbs and delayed nothing (shells and launchers under `LD_PRELOAD`
/// leave no empty files behind). `nothing_delayed`: why nothing was delayed, if so.
fn write_stats(nothing_delayed: Option<String>) {
    if !state::in_use() && nothing_delayed.is_none() {
        return;
    }
    let path = {
        let Some(guard) = loaded::get() else { return };
        match guard.as_ref().and_then(|l| l.settings.stats.clone()) {
            Some(p) => path_for(&p),
            None => return,
        }
    };
    let Some(mut doc) = stats_json() else { return };
    doc["nothing_delayed"] = serde_json::json!(nothing_delayed);
    if state::line_mode() {
        doc["line"] = line::stats_json();
        // Posts the line never handed over were not delayed.
        let (lost, lost_ns) = line::draws_never_given();
        if lost > 0 {
            let less = |v: &serde_json::Value, by: u64| v.as_u64().unwrap_or(0).saturating_sub(by);
            doc["delays_injected"] = less(&doc["delays_injected"], lost).into();
            doc["sum_ns"] = less(&doc["sum_ns"], lost_ns).into();
        }
    }
    if state::cq_delay() {
        doc["cq"] = cq::stats_json();
    }
    if let Some((changes, calm, congested)) = episodes::summary() {
        doc["episodes"] = serde_json::json!({
            "mean_calm_ns": calm, "mean_congested_ns": congested, "state_changes": changes,
            // index_hits from 4096 on are the congested table's.
            "congested_indices_from": ibjitter_table::ENTRIES,
        });
        // When this process set each state (CLOCK_REALTIME ns, congested): how ranks agree.
        let (log, set) = episodes::changes_at();
        doc["episodes"]["shared"] = episodes::shared().into();
        doc["episodes"]["states_set"] = set.into();
        doc["episodes"]["states_set_at"] = log
            .iter()
            .map(|&(t, c)| serde_json::json!([t, u8::from(c)]))
            .collect::<Vec<_>>()
            .into();
    }
    // What the ports sent meanwhile (all processes' traffic on them), beside posts_total.
    doc["ports_sent"] = ports::sent_since_open();
    let text = format!("{doc:#}\n");
    let written = out_file::write_whole(&path, text.as_bytes());
    // Said once per path: a signal handler that refused it has said why already.
    if let Err(e) = written {
        if !sigstats::refused() {
            say::warn(&format!("cannot write stats file {path}: {e}"));
        }
    }
}

/// `call` (an `exec` function) is about to replace this process's image: the end of the
/// process as far as the shim goes, but no exit handler runs. What is in the delay line goes
/// out as at exit (as it falls due, within 2 s); what is left then is said. Nothing in a
/// vfork child (the line is its parent's, which goes on). If the exec fails, the process and
/// its line go on.
pub fn before_exec(call: &str) {
    if line::own_requests() == 0 {
        return;
    }
    let left = line::drain(2_000_000_000);
    if left > 0 {
        say::warn(&format!(
            "{call}: {left} requests still in the delay line were not delivered (their due \
             times fell past the 2 s drain)"
        ));
    }
}

/// `call` (`_exit`, `_Exit`) ends the process now. It is async-signal-safe (signal handlers
/// and fork children call it), so no drain, no lock, no allocation: one `write` says how
/// many requests of this process's line are lost.
pub fn at_immediate_exit(call: &str) {
    line::say_lost_at_end(call);
}

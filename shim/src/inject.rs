//! The active injection: what the post wrappers do. The table in wait units with its clock
//! kind, the draw (per-thread stream → table index → wait, and the counting), and the wait.
//! Everything here that the post path reads is a plain atomic: no lock, no syscall, no
//! allocation.
use crate::clock::{self, WaitKind};
use crate::config::{Delays, Layer, Per, Shape, Spin, Unit, Window};
use crate::rng;
use crate::stats::{self, Hook, INDICES};
use crate::trace;
use ibjitter_table::ENTRIES;
use rand_pcg::Pcg32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};

/// Mode bit: draw and wait.
const INJECT: u8 = 1;
/// Mode bit: count (IBJITTER_STATS, or any table: the coverage line at exit).
const STATS: u8 = 2;
/// Mode bit: one draw per work request (`IBJITTER_PER=wr`), not per call or batch.
pub const PER_WR: u8 = 4;
/// Mode bit: only some sends are delayed ([`crate::select`]); the others are counted.
pub const SELECT: u8 = 8;
/// Mode bits that shape the index drawn (out of line): two-state episodes, correlation, trace.
const EPISODES: u8 = 16;
const CORRELATED: u8 = 32;
const TRACE: u8 = 64;
pub const SHAPED: u8 = EPISODES | CORRELATED | TRACE;
/// Mode bit: `IBJITTER_MODE=line` (the delay line takes `ibv_post_send` calls; kept outside
/// a window or a pause too, so that a direct post never overtakes the line).
pub const LINE: u8 = 128;
/// Modes the default post wrappers hand to an out-of-line path ([`delay`]), so that their
/// own path stays frameless.
pub const SLOW: u8 = SELECT | SHAPED | LINE;

/// The verbs wrappers' mode: 0 until load finished (and whenever there is nothing to do):
/// they pass through. Without INJECT when UCP is the only layer (they may still count).
static MODE: AtomicU8 = AtomicU8::new(0);
/// The UCP wrappers' mode ([`crate::ucp`]): 0 while verbs is the layer.
static UCP_MODE: AtomicU8 = AtomicU8::new(0);
/// The full mode (both layers' bits), and the layer asked for (a `Layer` as u8).
static FULL_MODE: AtomicU8 = AtomicU8::new(0);
static LAYER: AtomicU8 = AtomicU8::new(Layer::Auto as u8);
/// The table in wait units (TSC ticks, ns or loops), read by the post path; with
/// `IBJITTER_EPISODES` the calm table, then the congested one.
static WAITS: [AtomicU64; INDICES] = [const { AtomicU64::new(0) }; INDICES];
/// `IBJITTER_EPISODES`: 0 while calm, ENTRIES while congested (added to the index drawn);
/// how many times the state changed; the mean dwells (ns).
static EPISODE_OFFSET: AtomicUsize = AtomicUsize::new(0);
static EPISODE_CHANGES: AtomicU64 = AtomicU64::new(0);
static DWELL_CALM: AtomicU64 = AtomicU64::new(0);
static DWELL_CONGESTED: AtomicU64 = AtomicU64::new(0);
/// `IBJITTER_CORRELATION` as a threshold of a 32-bit draw.
static REPEAT: AtomicU32 = AtomicU32::new(0);
/// Set once a configuration is active.
static LOADED: AtomicBool = AtomicBool::new(false);
/// The verbs and UCP modes while injecting (MODE and UCP_MODE hold them, or the same without
/// INJECT outside an `IBJITTER_START`/`STOP` window).
static VERBS_ON: AtomicU8 = AtomicU8::new(0);
static UCP_ON: AtomicU8 = AtomicU8::new(0);
/// Inside the `IBJITTER_START`/`STOP` window (always, without one); paused by
/// `ibjitter inject pause`; live control is on (`IBJITTER_CONTROL`, default); one draw per
/// work request was asked for (kept for a live `set` in a process that had no table).
static IN_WINDOW: AtomicBool = AtomicBool::new(true);
static PAUSED: AtomicBool = AtomicBool::new(false);
static CONTROLLED: AtomicBool = AtomicBool::new(false);
static PER_WR_ASKED: AtomicBool = AtomicBool::new(false);
/// The window, in ns after [`activate`] (u64::MAX: none), and when that was.
static WINDOW_START: AtomicU64 = AtomicU64::new(u64::MAX);
static WINDOW_STOP: AtomicU64 = AtomicU64::new(u64::MAX);
static ACTIVATED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// What the post wrappers must do: 0 = pass through (also before load finished).
#[inline(always)]
pub fn mode() -> u8 {
    MODE.load(Acquire)
}

/// What the UCP wrappers must do: 0 = pass through.
#[inline(always)]
pub fn ucp_mode() -> u8 {
    UCP_MODE.load(Acquire)
}

/// Whether contexts that UCX opens stay unpatched (`IBJITTER_LAYER=auto|ucp`): their sends
/// carry UCP messages, delayed at UCP; other contexts of the process (NCCL's, the program's
/// own) keep the verbs delay in `auto`.
pub fn ucx_contexts_at_ucp() -> bool {
    LAYER.load(Acquire) != Layer::Verbs as u8
}

/// Whether the layer asked for is `verbs`.
pub fn layer_is_verbs() -> bool {
    LAYER.load(Acquire) == Layer::Verbs as u8
}

/// Which layers delayed, from the counts (posts through verbs wrappers, UCP messages):
/// "verbs", "ucp", "verbs+ucp" or "none". Allocation-free (the signal handler uses it).
pub fn layer_used(verbs_posts: u64, ucp_messages: u64) -> &'static str {
    let verbs = verbs_posts > 0 && MODE.load(Acquire) & INJECT != 0;
    let ucp = ucp_messages > 0 && UCP_MODE.load(Acquire) & INJECT != 0;
    match (verbs, ucp) {
        (true, true) => "verbs+ucp",
        (true, false) => "verbs",
        (false, true) => "ucp",
        (false, false) => "none",
    }
}

/// Called before a post when [`mode`] is not 0 and has no [`SHAPED`] bit (those go through
/// [`delay`]): draw an index and count. Returns what to
/// busy-wait (0 for a zero entry: then the post goes on without reading any clock), or None
/// on the thread's first post (see [`rng::with_thread`]; the caller then runs
/// [`first_post_of_thread`] and draws again).
#[inline(always)]
pub fn draw(mode: u8, hook: Hook) -> Option<u64> {
    rng::with_thread(|rng, _, thread| {
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

/// [`draw`], shaped or not.
fn draw_any(mode: u8, hook: Hook) -> Option<u64> {
    if mode & SHAPED == 0 || mode & INJECT == 0 {
        return draw(mode, hook);
    }
    rng::with_thread(|rng, last, thread| {
        let i = shaped_index(mode, rng, last, thread);
        if mode & STATS != 0 {
            stats::count(thread, hook, Some(i));
        }
        WAITS[i].load(Relaxed)
    })
}

/// The index of a shaped draw: the thread's last one again (correlation) or a new one, in
/// the table of the current state (episodes), recorded (trace).
#[inline(never)]
fn shaped_index(mode: u8, rng: &mut Pcg32, last: &mut u32, thread: u32) -> usize {
    let mut i = if mode & CORRELATED != 0 {
        rng::correlated_index(rng, last, REPEAT.load(Relaxed))
    } else {
        rng::next_index(rng)
    };
    if mode & EPISODES != 0 {
        i += EPISODE_OFFSET.load(Relaxed);
    }
    if mode & TRACE != 0 {
        trace::record(thread, i);
    }
    i
}

/// Gives the calling thread its stream (kept off the inlined post path).
#[cold]
pub fn first_post_of_thread() {
    rng::init_current_thread();
}

/// Draws and waits, giving the thread its stream first if needed: for the paths that are not
/// the default post path (whose wrappers split this up to stay frameless).
#[inline(never)]
pub fn delay(mode: u8, hook: Hook) {
    let units = match draw_any(mode, hook) {
        Some(u) => u,
        None => {
            first_post_of_thread();
            draw_any(mode, hook).unwrap_or(0)
        }
    };
    if units != 0 {
        wait(units);
    }
}

/// Whether a table is active (draws and waits; it may hold zeros), at either layer.
pub fn injecting() -> bool {
    FULL_MODE.load(Acquire) & INJECT != 0
}

/// Whether the verbs wrappers inject now (not when UCP took over).
pub fn injecting_at_verbs() -> bool {
    mode() & INJECT != 0
}

/// Whether each work request waits its own draw (`IBJITTER_PER=wr`).
pub fn per_wr() -> bool {
    mode() & PER_WR != 0
}

/// Whether `IBJITTER_PER=wr` was asked for (contexts get the per-request wrapper from the
/// start, so that a live `set` in a process without a table at load has it too).
pub fn per_wr_asked() -> bool {
    PER_WR_ASKED.load(Acquire)
}

/// Busy-waits `units` of the active clock kind (what [`draw`] returned).
#[inline(always)]
pub fn wait(units: u64) {
    clock::wait(units)
}

/// Activates `delays` (None: no injection) drawn once `per` post or work request at `layer`,
/// and counting, seeding the streams with `seed`: converts the table to wait units
/// (calibrating the TSC). Returns the clock's description. Called at load (and by tests)
/// while no thread is posting.
#[allow(clippy::too_many_arguments)]
pub fn activate(
    delays: Option<&Delays>,
    unit: Unit,
    per: Per,
    layer: Layer,
    spin: Spin,
    seed: u64,
    count: bool,
    window: Option<Window>,
    selective: bool,
    shape: &Shape,
    controlled: bool,
) -> String {
    MODE.store(0, Release);
    UCP_MODE.store(0, Release);
    let _ = ACTIVATED.set(std::time::Instant::now());
    let mut clock_desc = String::from("none");
    CONTROLLED.store(controlled, Release);
    PER_WR_ASKED.store(per == Per::Wr, Release);
    if let Some(d) = delays {
        clock_desc = use_table(d, unit, spin);
    }
    rng::set_seed(seed);
    let mut mode = 0;
    if delays.is_some() {
        mode |= INJECT;
    }
    // Counting comes with any table too (+0.8 ns a post on the hotpath bench): the coverage
    // line at exit says how many sends were delayed, stats file or not. Under live control
    // the counters exist from the start (a later `set` turns counting on).
    if count || delays.is_some() || controlled {
        stats::enable();
    }
    if count || delays.is_some() {
        mode |= STATS;
    }
    if per == Per::Wr && mode != 0 {
        mode |= PER_WR;
    }
    if selective && mode & INJECT != 0 {
        mode |= SELECT;
    }
    if mode & INJECT != 0 {
        if let Some((calm, congested)) = shape.episodes {
            DWELL_CALM.store(calm.round().max(1.0) as u64, Release);
            DWELL_CONGESTED.store(congested.round().max(1.0) as u64, Release);
            EPISODE_OFFSET.store(0, Release);
            mode |= EPISODES;
        }
        if let Some(rho) = shape.correlation {
            REPEAT.store((rho * 4_294_967_296.0).min(u32::MAX as f64) as u32, Release);
            mode |= CORRELATED;
        }
        if let Some((_, max)) = &shape.trace {
            trace::arm(*max);
            mode |= TRACE;
        }
    }
    LAYER.store(layer as u8, Release);
    let (start, stop) = match window {
        Some(w) => (w.start_ns, w.stop_ns.unwrap_or(u64::MAX)),
        None => (0, u64::MAX),
    };
    WINDOW_START.store(start, Release);
    WINDOW_STOP.store(stop, Release);
    // Before a window opens the wrappers only count (the timer thread turns injection on).
    IN_WINDOW.store(start == 0, Release);
    PAUSED.store(false, Release);
    set_full_mode(mode);
    LOADED.store(true, Release);
    clock_desc
}

/// Chooses the clock for `d` (when nothing was injected before: a live `set` keeps the one
/// chosen) and stores it in wait units. Returns the clock's description.
fn use_table(d: &Delays, unit: Unit, spin: Spin) -> String {
    let desc = choose_clock(d, unit, spin);
    store_waits(d, clock::kind());
    desc
}

/// Chooses the wait clock for a table (the send table's, or with only a completion table,
/// that one's). Returns its description.
pub fn choose_clock(d: &Delays, unit: Unit, spin: Spin) -> String {
    let kind = match unit {
        Unit::Loops => WaitKind::Loops,
        Unit::Ns if clock::tsc_trusted() && clock::calibrate(2_000_000).is_some() => WaitKind::Tsc,
        Unit::Ns => WaitKind::Monotonic,
    };
    clock::set_kind(kind);
    let mut clock_desc = match kind {
        WaitKind::Tsc => format!("tsc {:.3} GHz", clock::tsc_per_ns().unwrap_or_default()),
        WaitKind::Monotonic => "CLOCK_MONOTONIC".into(),
        WaitKind::Loops => "spin loops".into(),
    };
    let (pause, why) = match (kind, spin) {
        (WaitKind::Loops, _) => (false, String::new()),
        (_, Spin::Plain) => (false, "IBJITTER_SPIN".into()),
        (_, Spin::Pause) => (true, "IBJITTER_SPIN".into()),
        (_, Spin::Auto) => clock::choose_pause(d.values.iter().copied().filter(|&v| v > 0).min()),
    };
    clock::set_pause(pause);
    if kind != WaitKind::Loops {
        let how = if pause { "pause" } else { "plain" };
        clock_desc += &format!(", spin {how} ({why})");
    }
    clock_desc
}

/// The table in wait units; a single table fills both halves (the episodes' states).
fn store_waits(d: &Delays, kind: WaitKind) {
    if d.values.is_empty() {
        return;
    }
    for (i, w) in WAITS.iter().enumerate() {
        w.store(
            clock::ns_to_units(d.values[i % d.values.len()], kind),
            Relaxed,
        );
    }
}

/// Serializes mode changes (the window thread, the control thread, load): a spin lock, so
/// that a fork child can release it ([`unlock_after_fork`]). Never taken on a post path.
static MODE_LOCK: AtomicBool = AtomicBool::new(false);

struct ModeLock;

impl ModeLock {
    fn take() -> ModeLock {
        while MODE_LOCK
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        ModeLock
    }
}

impl Drop for ModeLock {
    fn drop(&mut self) {
        MODE_LOCK.store(false, Release);
    }
}

/// fork() child: a mode change in progress in another thread of the parent is not the
/// child's.
pub fn unlock_after_fork() {
    MODE_LOCK.store(false, Release);
}

/// Sets the full mode and each layer's, and publishes them (window, pause).
fn set_full_mode(mode: u8) {
    let _l = ModeLock::take();
    FULL_MODE.store(mode, Release);
    // `ucp`: verbs wrappers only count (they are patched only on contexts UCX did not open).
    let (verbs, ucp) = match LAYER.load(Acquire) {
        l if l == Layer::Verbs as u8 => (mode, 0),
        // The UCP layer waits in the calling thread (UCP calls are not work requests).
        l if l == Layer::Ucp as u8 => (outside(mode) & !LINE, mode & !LINE),
        _ => (mode, mode & !LINE),
    };
    VERBS_ON.store(verbs, Release);
    UCP_ON.store(ucp, Release);
    publish_locked();
}

/// [`publish_locked`] under the mode lock.
fn publish() {
    let _l = ModeLock::take();
    publish_locked();
}

/// What the wrappers do now: injecting inside the window unless paused, else counting only.
fn publish_locked() {
    let on = IN_WINDOW.load(Acquire) && !PAUSED.load(Acquire);
    let (verbs, ucp) = (VERBS_ON.load(Acquire), UCP_ON.load(Acquire));
    let (verbs, ucp) = if on {
        (verbs, ucp)
    } else {
        (outside(verbs), outside(ucp))
    };
    UCP_MODE.store(ucp, Release);
    MODE.store(verbs, Release);
}

/// `ibjitter inject pause|resume`: sends are counted, not delayed, while paused.
pub fn set_paused(paused: bool) {
    PAUSED.store(paused, Release);
    publish();
}

/// Whether live control is on (`IBJITTER_CONTROL`).
pub fn controlled() -> bool {
    CONTROLLED.load(Acquire)
}

pub fn paused() -> bool {
    PAUSED.load(Acquire)
}

/// `ibjitter inject set`: injects `d` from now on (the draws' entries switch one by one,
/// within microseconds; the clock is the one chosen at load, or chosen now if the process
/// injected nothing before). Returns the clock's description when it was chosen now. Called
/// by the control thread only.
pub fn replace_table(d: &Delays, unit: Unit, spin: Spin) -> Option<String> {
    let full = FULL_MODE.load(Acquire);
    let desc = if full & INJECT == 0 {
        Some(use_table(d, unit, spin))
    } else {
        store_waits(d, clock::kind());
        None
    };
    let mut mode = full | INJECT | STATS;
    if PER_WR_ASKED.load(Acquire) {
        mode |= PER_WR;
    }
    set_full_mode(mode);
    desc
}

/// A mode outside the window: counting only.
fn outside(mode: u8) -> u8 {
    mode & !INJECT & !PER_WR & !SELECT & !SHAPED
}

/// The mode for a send that the selection leaves out: counted, not delayed.
#[inline(always)]
pub fn unselected(mode: u8) -> u8 {
    mode & !INJECT
}

/// A batch of the `ibv_wr_*` API whose opcodes are not known yet (`IBJITTER_OPS`): counted
/// now; [`delay_drawn_only`] waits in its first selected work request.
pub fn count_only(mode: u8, hook: Hook) {
    delay(unselected(mode), hook)
}

/// Draws and waits without counting a post (it was counted by [`count_only`]).
#[inline(never)]
pub fn delay_drawn_only(mode: u8) {
    let draw_hit = |rng: &mut Pcg32, last: &mut u32, thread: u32| {
        let i = if mode & SHAPED == 0 {
            rng::next_index(rng)
        } else {
            shaped_index(mode, rng, last, thread)
        };
        if mode & STATS != 0 {
            stats::count_hit(thread, i);
        }
        WAITS[i].load(Relaxed)
    };
    let units = match rng::with_thread(draw_hit) {
        Some(u) => u,
        None => {
            first_post_of_thread();
            rng::with_thread(draw_hit).unwrap_or(0)
        }
    };
    if units != 0 {
        wait(units);
    }
}

/// Starts the shim's timer threads a configuration needs ([`arm_window`], [`arm_episodes`],
/// the delay line's): when the process first opens a device or sends through UCP.
pub fn arm_threads() {
    arm_window();
    arm_episodes();
    if line_mode() && !crate::line::start() {
        disable_line();
    }
}

/// `IBJITTER_MODE=line` (at load, after [`activate`]).
pub fn enable_line() {
    set_full_mode(FULL_MODE.load(Acquire) | LINE);
}

/// Back to waiting in the posting thread (a fork child, or a line that could not start).
pub fn disable_line() {
    set_full_mode(FULL_MODE.load(Acquire) & !LINE);
}

/// Whether the delay line is the mode.
pub fn line_mode() -> bool {
    FULL_MODE.load(Acquire) & LINE != 0
}

/// Draws (and counts) like [`delay`], without waiting: what the delay line defers by.
#[inline(never)]
pub fn draw_units(mode: u8, hook: Hook) -> u64 {
    match draw_any(mode, hook) {
        Some(u) => u,
        None => {
            first_post_of_thread();
            draw_any(mode, hook).unwrap_or(0)
        }
    }
}

/// The state changes of `IBJITTER_EPISODES` so far, and the mean dwells asked (ns): None
/// without episodes.
pub fn episodes() -> Option<(u64, u64, u64)> {
    let calm = DWELL_CALM.load(Acquire);
    (calm > 0).then(|| {
        (
            EPISODE_CHANGES.load(Relaxed),
            calm,
            DWELL_CONGESTED.load(Acquire),
        )
    })
}

/// With `IBJITTER_EPISODES`: starts, once, the thread that switches between the calm and
/// the congested table after exponential dwell times (means as asked, drawn from a stream
/// of the seed: the state sequence repeats with it; which posts fall in which episode
/// depends on their timing). Starts calm. A fork child keeps the state it was forked in.
fn arm_episodes() {
    static ARMED: AtomicBool = AtomicBool::new(false);
    let (calm, congested) = (DWELL_CALM.load(Acquire), DWELL_CONGESTED.load(Acquire));
    if calm == 0 || ARMED.swap(true, AcqRel) {
        return;
    }
    let mut rng = rng::stream(rng::seed(), EPISODES_SALT, 0);
    let _ = std::thread::Builder::new()
        .name("ibjitter-episodes".into())
        .spawn(move || loop {
            let congested_now = EPISODE_OFFSET.load(Relaxed) != 0;
            let mean = if congested_now { congested } else { calm };
            // Exponential: -mean ln(1 - u), u uniform in [0, 1).
            let u = (rand_core::Rng::next_u64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
            let dwell = -(mean as f64) * (1.0 - u).ln();
            std::thread::sleep(std::time::Duration::from_nanos(dwell as u64));
            EPISODE_OFFSET.store(if congested_now { 0 } else { ENTRIES }, Relaxed);
            EPISODE_CHANGES.fetch_add(1, Relaxed);
        });
}

/// The salt of the episodes' dwell-time stream ("epis").
const EPISODES_SALT: u64 = 0x6570_6973;

/// With an `IBJITTER_START`/`STOP` window: starts, once, the thread that switches injection
/// on at the start and off at the stop (the post path only reads the mode). Called when the
/// process first opens a device or sends through UCP: programs that never do get no thread.
/// A fork child keeps the mode it was forked with (it has no timer thread).
fn arm_window() {
    static ARMED: AtomicBool = AtomicBool::new(false);
    let (start, stop) = (WINDOW_START.load(Acquire), WINDOW_STOP.load(Acquire));
    if (start == 0 && stop == u64::MAX) || ARMED.swap(true, AcqRel) {
        return;
    }
    let Some(&t0) = ACTIVATED.get() else { return };
    let until = move |ns: u64| {
        let at = t0 + std::time::Duration::from_nanos(ns);
        let now = std::time::Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
    };
    let _ = std::thread::Builder::new()
        .name("ibjitter-window".into())
        .spawn(move || {
            if start > 0 {
                until(start);
                IN_WINDOW.store(true, Release);
                publish();
            }
            if stop != u64::MAX {
                until(stop);
                IN_WINDOW.store(false, Release);
                publish();
            }
        });
}

/// Whether new contexts need patching: not when the configuration is loaded and asks for
/// nothing (no table, no stats): then posts go straight to the provider at no cost. Before
/// the configuration is loaded, patch (the wrappers pass through until it is).
pub fn wants_patching() -> bool {
    !LOADED.load(Acquire)
        || VERBS_ON.load(Acquire) != 0
        || CONTROLLED.load(Acquire)
        || crate::cq::on()
}

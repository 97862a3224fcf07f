//! Layer 4: the one owner of the injector's lifecycle and mode. Every other module reads the
//! state through the functions here, and changes it only through the writers here
//! ([`configure`], [`set_paused`], [`set_in_window`], [`set_line`], [`set_cq_delay`],
//! [`table_replaced`], [`first_use`], [`first_use_done`], [`forked_child`], [`exiting`],
//! [`no_clock`]),
//! whichever thread they run in: the load constructor, the control thread, the window
//! thread, the first device open, a fork child, the exit handler.
//!
//! Whose the shim's threads are ([`owns_threads`]): the process that started them at its
//! first use. A fork child, a `vfork` child (which shares its parent's memory, this state
//! included) and a process that never used a device have none.
//!
//! The post path reads one byte ([`mode`] or [`ucp_mode`]): what the wrappers must do now,
//! published under a fork-safe spin lock from the parts below (the configured mode, the
//! layer, the window, pause, a clock that cannot be read). Reading it takes no lock.
use crate::config::{Layer, Window};
use crate::sys::clock;
use crate::sys::spin_lock::SpinLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};

/// Mode bit: draw and wait.
pub const INJECT: u8 = 1;
/// Mode bit: count (IBJITTER_STATS, or any table: the coverage line at exit).
pub const STATS: u8 = 2;
/// Mode bit: one draw per work request (`IBJITTER_PER=wr`), not per call or batch.
pub const PER_WR: u8 = 4;
/// Mode bit: only some sends are delayed ([`crate::modes::select`]); the others are counted.
pub const SELECT: u8 = 8;
/// Mode bits that shape the index drawn (out of line): two-state episodes, correlation, trace.
pub const EPISODES: u8 = 16;
pub const CORRELATED: u8 = 32;
pub const TRACE: u8 = 64;
pub const SHAPED: u8 = EPISODES | CORRELATED | TRACE;
/// Mode bit: `IBJITTER_MODE=line` (the delay line takes `ibv_post_send` calls; kept outside
/// a window or a pause too, so that a direct post never overtakes the line).
pub const LINE: u8 = 128;
/// Modes the default post wrappers hand to an out-of-line path, so that their own path stays
/// frameless.
pub const SLOW: u8 = SELECT | SHAPED | LINE;

/// Where the process is in its life with the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Loaded, settings not applied yet: the wrappers pass through.
    StartUp = 0,
    /// Settings applied (at load): nothing opened yet, no thread of the shim started.
    Configured = 1,
    /// The exit handler runs.
    Exiting = 2,
}

static PHASE: AtomicU8 = AtomicU8::new(Phase::StartUp as u8);
/// First use: not yet, under way (the first user is choosing the clock and starting the
/// threads: every other waits), done.
const UNUSED: u8 = 0;
const STARTING: u8 = 1;
const IN_USE: u8 = 2;
static USE: AtomicU8 = AtomicU8::new(UNUSED);
/// The pid of the process that started the shim's threads (0: none did).
static THREADS_OWNER: AtomicU32 = AtomicU32::new(0);
/// Completion-side delay (`IBJITTER_CQ_TABLE`/`CQ_DELAY`) is active.
static CQ_DELAY: AtomicBool = AtomicBool::new(false);
/// This process must not write the stats path as given (no `%p` in it): a fork child, or an
/// exec'd descendant of the process that claimed it.
static STATS_PATH_NOT_OWNED: AtomicBool = AtomicBool::new(false);

/// The verbs wrappers' mode: 0 until load finished (and whenever there is nothing to do):
/// they pass through. Without INJECT when UCP is the only layer (they may still count).
static MODE: AtomicU8 = AtomicU8::new(0);
/// The UCP wrappers' mode: 0 while verbs is the layer.
static UCP_MODE: AtomicU8 = AtomicU8::new(0);
/// The configured mode (both layers' bits), and the layer asked for (a `Layer` as u8).
static FULL_MODE: AtomicU8 = AtomicU8::new(0);
static LAYER: AtomicU8 = AtomicU8::new(Layer::Auto as u8);
/// The verbs and UCP modes while injecting (MODE and UCP_MODE hold them, or the same without
/// INJECT outside an `IBJITTER_START`/`STOP` window or while paused).
static VERBS_ON: AtomicU8 = AtomicU8::new(0);
static UCP_ON: AtomicU8 = AtomicU8::new(0);
/// Inside the `IBJITTER_START`/`STOP` window (always, without one); paused by
/// `ibjitter inject pause`; live control is on (`IBJITTER_CONTROL`, default); one draw per
/// work request was asked for (kept for a live `set` in a process that had no table).
static IN_WINDOW: AtomicBool = AtomicBool::new(true);
static PAUSED: AtomicBool = AtomicBool::new(false);
static CONTROLLED: AtomicBool = AtomicBool::new(false);
static PER_WR_ASKED: AtomicBool = AtomicBool::new(false);
/// The window, in ns after [`configure`] (u64::MAX: none), and when that was (CLOCK_MONOTONIC
/// ns; 0: the clock could not be read then).
static WINDOW_START: AtomicU64 = AtomicU64::new(u64::MAX);
static WINDOW_STOP: AtomicU64 = AtomicU64::new(u64::MAX);
static CONFIGURED_NS: AtomicU64 = AtomicU64::new(0);
/// The first use found CLOCK_MONOTONIC unreadable: nothing can be timed, nothing is
/// injected ([`no_clock`]).
static NO_CLOCK: AtomicBool = AtomicBool::new(false);
/// Live tables applied (`ibjitter inject set`): the table epoch.
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Serializes mode changes (the window thread, the control thread, load, fork child).
/// Never taken on a post path.
static MODE_LOCK: SpinLock = SpinLock::new();

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

pub fn phase() -> Phase {
    match PHASE.load(Acquire) {
        0 => Phase::StartUp,
        1 => Phase::Configured,
        _ => Phase::Exiting,
    }
}

/// Writer: the settings were applied. `mode` holds the bits the configuration asks for;
/// the window is in ns from now. Called at load (and by tests) while no thread is posting.
pub fn configure(mode: u8, layer: Layer, window: Option<Window>, controlled: bool, per_wr: bool) {
    MODE.store(0, Release);
    UCP_MODE.store(0, Release);
    // The shim's own checked read: std's `Instant::now` panics when the clock cannot be read
    // (a seccomp filter refusing clock_gettime), in every process the shim enters.
    let _ =
        CONFIGURED_NS.compare_exchange(0, clock::read_monotonic().unwrap_or(0), AcqRel, Acquire);
    CONTROLLED.store(controlled, Release);
    PER_WR_ASKED.store(per_wr, Release);
    LAYER.store(layer as u8, Release);
    let (start, stop) = match window {
        Some(w) => (w.start_ns, w.stop_ns.unwrap_or(u64::MAX)),
        None => (0, u64::MAX),
    };
    WINDOW_START.store(start, Release);
    WINDOW_STOP.store(stop, Release);
    // Before a window opens the wrappers only count (the window thread turns injection on).
    IN_WINDOW.store(start == 0, Release);
    PAUSED.store(false, Release);
    set_full_mode(mode);
    PHASE.store(Phase::Configured as u8, Release);
}

/// Writer: the process opened a device or sent through UCP. True for the first caller,
/// which then chooses the clock, says the start-up line, starts the shim's threads and
/// calls [`first_use_done`]; a caller meanwhile (another thread opening a device) waits for
/// that, so that no post of the process runs before its table is in clock units. A fork
/// child of a process in use is in use (its parent's threads are not restarted in it).
pub fn first_use() -> bool {
    match USE.compare_exchange(UNUSED, STARTING, AcqRel, Acquire) {
        Ok(_) => true,
        Err(_) => {
            while USE.load(Acquire) == STARTING {
                std::thread::yield_now();
            }
            false
        }
    }
}

/// Writer: the first use is done; `threads` if the shim's threads were started (this
/// process owns them).
pub fn first_use_done(threads: bool) {
    if threads {
        THREADS_OWNER.store(std::process::id(), Release);
    }
    USE.store(IN_USE, Release);
}

/// Whether the process has opened a device or sent through UCP (shells and launchers under
/// `LD_PRELOAD` never do: they stay silent and write no files).
pub fn in_use() -> bool {
    USE.load(Acquire) != UNUSED
}

/// Whether the calling process is the one that started the shim's threads (its delay line,
/// its live-control file): not a fork child, not a `vfork` child. Asks the kernel for the
/// pid (a `vfork` child shares the parent's memory but not its pid): off any post path.
pub fn owns_threads() -> bool {
    let owner = THREADS_OWNER.load(Acquire);
    // SAFETY: getpid has no preconditions; glibc asks the kernel (no cached pid).
    owner != 0 && owner == unsafe { libc::getpid() } as u32
}

/// Writer: the exit handler starts.
pub fn exiting() {
    PHASE.store(Phase::Exiting as u8, Release);
}

/// Writer (fork child handler): no mode change of another thread is in progress here, the
/// parent's threads are gone (so no delay line), the stats path is the parent's. A first use
/// under way in another thread of the parent ends here (that thread is gone; this child
/// has none of the shim's threads).
pub fn forked_child() {
    FORKED.store(true, Release);
    MODE_LOCK.force_release_in_child();
    THREADS_OWNER.store(0, Release);
    let _ = USE.compare_exchange(STARTING, IN_USE, AcqRel, Acquire);
    STATS_PATH_NOT_OWNED.store(true, Release);
    set_line(false);
}

/// Writer: the `%p`-less stats path belongs to another process (at load).
pub fn stats_path_not_owned() {
    STATS_PATH_NOT_OWNED.store(true, Release);
}

pub fn owns_stats_path() -> bool {
    !STATS_PATH_NOT_OWNED.load(Acquire)
}

/// What passed the hooks: contexts opened and QPs created (in this process: reset in a
/// fork child), and whether UCX's libucp was loaded when a device was opened (Open MPI
/// unloads it again at MPI_Finalize, before the exit check runs). Read by coverage.
static CONTEXTS_OPENED: AtomicU64 = AtomicU64::new(0);
static QPS_CREATED: AtomicU64 = AtomicU64::new(0);
static UCX_SEEN: AtomicBool = AtomicBool::new(false);

pub fn note_context_opened() {
    CONTEXTS_OPENED.fetch_add(1, Relaxed);
}

pub fn note_qp_created() {
    QPS_CREATED.fetch_add(1, Relaxed);
}

/// Whether UCX was seen (a UCP send, or a device UCX opened) in this process: one load (the
/// UCP wrappers' first-message check).
#[inline(always)]
pub fn ucx_seen() -> bool {
    UCX_SEEN.load(Relaxed)
}

pub fn note_ucx_seen() {
    UCX_SEEN.store(true, Relaxed);
}

/// (contexts opened, QPs created, UCX seen) through the hooks.
pub fn seen() -> (u64, u64, bool) {
    (
        CONTEXTS_OPENED.load(Relaxed),
        QPS_CREATED.load(Relaxed),
        UCX_SEEN.load(Relaxed),
    )
}

/// Another copy of the shim (another file: glibc loads one file once) came first in the
/// process's global scope: this one does nothing, at load, first use or exit.
static ASIDE: AtomicBool = AtomicBool::new(false);

/// Writer: another copy of the shim is the process's; this one stands aside.
pub fn stand_aside() {
    ASIDE.store(true, Release);
}

/// Whether this copy stands aside for another ([`stand_aside`]).
pub fn standing_aside() -> bool {
    ASIDE.load(Acquire)
}

/// This process is a fork child (of a process in use, since the shim was loaded).
static FORKED: AtomicBool = AtomicBool::new(false);

/// A fork child that has not used verbs or UCP itself: no device opened, no QP made, no
/// send (a helper forked to run a command, Python's `os.fork()`): at its `exit` it has
/// nothing of its own to say or count, and its parent's devices (open in it too) are no
/// evidence that its sends escaped the hooks.
pub fn idle_fork_child() -> bool {
    FORKED.load(Acquire) && seen() == (0, 0, false) && crate::sys::rng::threads_posted() == 0
}

/// Fork child: what the parent opened is not this process's.
pub fn reset_seen_after_fork() {
    CONTEXTS_OPENED.store(0, Relaxed);
    QPS_CREATED.store(0, Relaxed);
    UCX_SEEN.store(false, Relaxed);
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

/// Whether a table is active (draws and waits; it may hold zeros), at either layer: never
/// without a clock ([`no_clock`]).
pub fn injecting() -> bool {
    FULL_MODE.load(Acquire) & INJECT != 0 && !NO_CLOCK.load(Acquire)
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

/// Whether live control is on (`IBJITTER_CONTROL`).
pub fn controlled() -> bool {
    CONTROLLED.load(Acquire)
}

pub fn paused() -> bool {
    PAUSED.load(Acquire)
}

/// The configured mode bits (both layers).
pub fn full_mode() -> u8 {
    FULL_MODE.load(Acquire)
}

/// Whether the delay line is the mode.
pub fn line_mode() -> bool {
    FULL_MODE.load(Acquire) & LINE != 0
}

/// Writer (first use): completion-side delay is active (its table is in clock units).
pub fn set_cq_delay() {
    CQ_DELAY.store(true, Release);
}

/// Whether completions are delayed.
pub fn cq_delay() -> bool {
    CQ_DELAY.load(Acquire)
}

/// Whether new contexts need patching by what the send side asks for: not when the
/// configuration is loaded and asks for nothing (no table, no stats, no control): then posts
/// go straight to the provider at no cost. Before the configuration is loaded, patch (the
/// wrappers pass through until it is).
pub fn send_side_wants_patching() -> bool {
    phase() == Phase::StartUp || VERBS_ON.load(Acquire) != 0 || CONTROLLED.load(Acquire)
}

/// The `IBJITTER_START`/`STOP` window in ns after [`configure`] (None: no window, or the
/// clock cannot be read), and when [`configure`] ran (or, if the clock could not be read
/// then, now).
pub fn window() -> Option<(u64, u64, u64)> {
    let (start, stop) = (WINDOW_START.load(Acquire), WINDOW_STOP.load(Acquire));
    if start == 0 && stop == u64::MAX {
        return None;
    }
    // CLOCK_MONOTONIC, read checked (std's `Instant::now` panics on a clock that cannot be
    // read); from now if it could not be read at load.
    let configured = CONFIGURED_NS.load(Acquire);
    let t0 = if configured == 0 {
        clock::read_monotonic().ok()?
    } else {
        configured
    };
    Some((start, stop, t0))
}

/// Whether the first use found CLOCK_MONOTONIC unreadable ([`no_clock`]).
pub fn clock_unreadable() -> bool {
    NO_CLOCK.load(Acquire)
}

/// Writer (first use): CLOCK_MONOTONIC cannot be read, so no delay can be timed: nothing is
/// injected from now on (a live `set`, `resume` or the window cannot turn it on), and no
/// delay line.
pub fn no_clock() {
    let _l = MODE_LOCK.lock();
    NO_CLOCK.store(true, Release);
    set_full_mode_locked(FULL_MODE.load(Acquire) & !LINE);
}

/// Writer (window thread): the window opened or closed.
pub fn set_in_window(inside: bool) {
    IN_WINDOW.store(inside, Release);
    publish();
}

/// Writer (`ibjitter inject pause|resume`): sends are counted, not delayed, while paused.
pub fn set_paused(paused: bool) {
    PAUSED.store(paused, Release);
    publish();
}

/// Writer: `IBJITTER_MODE=line` on (at load), or off (a fork child, or a line that could
/// not start): back to waiting in the posting thread.
pub fn set_line(on: bool) {
    let _l = MODE_LOCK.lock();
    let full = FULL_MODE.load(Acquire);
    set_full_mode_locked(if on { full | LINE } else { full & !LINE });
}

/// Writer (`ibjitter inject set`): a new table is injected from now on: injection and
/// counting on (with the per-request draw if it was asked for at load). Returns the epoch.
pub fn table_replaced() -> u64 {
    let _l = MODE_LOCK.lock();
    let mut mode = FULL_MODE.load(Acquire) | INJECT | STATS;
    if PER_WR_ASKED.load(Acquire) {
        mode |= PER_WR;
    }
    set_full_mode_locked(mode);
    EPOCH.fetch_add(1, AcqRel) + 1
}

/// How many live tables were applied.
pub fn epoch() -> u64 {
    EPOCH.load(Acquire)
}

fn set_full_mode(mode: u8) {
    let _l = MODE_LOCK.lock();
    set_full_mode_locked(mode);
}

/// Sets the full mode and each layer's, and publishes them (window, pause).
fn set_full_mode_locked(mode: u8) {
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

fn publish() {
    let _l = MODE_LOCK.lock();
    publish_locked();
}

/// What the wrappers do now: injecting inside the window unless paused (or the clock cannot
/// be read), else counting only.
fn publish_locked() {
    let on = IN_WINDOW.load(Acquire) && !PAUSED.load(Acquire) && !NO_CLOCK.load(Acquire);
    let (verbs, ucp) = (VERBS_ON.load(Acquire), UCP_ON.load(Acquire));
    let (verbs, ucp) = if on {
        (verbs, ucp)
    } else {
        (outside(verbs), outside(ucp))
    };
    UCP_MODE.store(ucp, Release);
    MODE.store(verbs, Release);
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

//! Layer 6: the draw. Per-thread stream → table index (shaped by episodes, correlation,
//! trace) → wait units → busy-wait, and the counting. Everything here that the post path
//! reads is a plain atomic: no lock, no syscall, no allocation. What to do comes from the
//! mode byte the wrappers read from [`crate::state`].
pub mod counts;
pub mod episodes;
pub mod table;
pub mod trace;

use crate::config::{Per, Settings};
use crate::state::{self, CORRELATED, EPISODES, INJECT, PER_WR, SELECT, SHAPED, STATS, TRACE};
use crate::sys::{clock, rng};
use counts::Hook;
use rand_pcg::Pcg32;
use std::sync::atomic::{AtomicU32, Ordering::*};

/// `IBJITTER_CORRELATION` as a threshold of a 32-bit draw.
static REPEAT: AtomicU32 = AtomicU32::new(0);

/// Called before a post when the mode is not 0 and has no [`SHAPED`] bit (those go through
/// [`delay`]): draw an index and count. Returns what to busy-wait (0 for a zero entry: then
/// the post goes on without reading any clock), or None on the thread's first post (see
/// [`rng::with_thread`]; the caller then runs [`first_post_of_thread`] and draws again).
#[inline(always)]
pub fn draw(mode: u8, hook: Hook) -> Option<u64> {
    rng::with_thread(|rng, _, thread| {
        let (index, wait) = if mode & INJECT != 0 {
            let i = table::plain_index(rng::next_index(rng));
            (Some(i), table::wait_units(i))
        } else {
            (None, 0)
        };
        if mode & STATS != 0 {
            counts::count(thread, hook, index);
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
            counts::count(thread, hook, Some(i));
        }
        table::wait_units(i)
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
        i += episodes::offset();
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
    let units = draw_units(mode, hook);
    if units != 0 {
        wait(units);
    }
}

/// Busy-waits `units` of the active clock kind (what [`draw`] returned).
#[inline(always)]
pub fn wait(units: u64) {
    clock::wait(units)
}

/// A batch of the `ibv_wr_*` API whose opcodes are not known yet (`IBJITTER_OPS`): counted
/// now; [`delay_drawn_only`] waits in its first selected work request.
pub fn count_only(mode: u8, hook: Hook) {
    delay(state::unselected(mode), hook)
}

/// Draws and waits without counting a post (it was counted by [`count_only`]).
#[inline(never)]
pub fn delay_drawn_only(mode: u8) {
    let draw_hit = |rng: &mut Pcg32, last: &mut u32, thread: u32| {
        let i = if mode & SHAPED == 0 {
            table::plain_index(rng::next_index(rng))
        } else {
            shaped_index(mode, rng, last, thread)
        };
        if mode & STATS != 0 {
            counts::count_hit(thread, i);
        }
        table::wait_units(i)
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

/// What the settings `s` ask the draw for, applied (`selective`: a selection filters sends): the table in wait units (choosing and
/// calibrating the clock), the seed, the counters, the shapes; returns the mode bits and
/// the clock's description for [`state::configure`]. Called at load (and by tests) while no
/// thread is posting.
pub fn prepare(s: &Settings, selective: bool) -> u8 {
    let (delays, per, seed, shape, controlled) =
        (s.delays.as_ref(), s.per, s.seed, &s.shape, s.control);
    let count = s.stats.is_some();
    rng::set_seed(seed);
    let mut mode = 0;
    if delays.is_some() {
        mode |= INJECT;
    }
    // Counting comes with any table too (+0.8 ns a post on the hotpath bench): the coverage
    // line at exit says how many sends were delayed, stats file or not. Under live control
    // the counters exist from the start (a later `set` turns counting on).
    if count || delays.is_some() || controlled {
        counts::enable();
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
            // The shared schedule is the job's: every rank's, whatever IBJITTER_SEED_PER_RANK.
            episodes::configure(calm, congested, shape.episodes_sync.then_some(s.job_seed));
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
    mode
}

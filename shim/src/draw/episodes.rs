//! `IBJITTER_EPISODES`: two states, calm and congested, with exponential dwell times; the
//! draw adds [`offset`] to its index (the congested table is the second half of the table).
//! A thread of the shim switches the state ([`start`]): on a schedule of its own, drawn from
//! its start, or (`IBJITTER_EPISODES_SYNC=1`) on the one wall-clock schedule every process
//! with the same seed and means follows ([`shared_schedule`]). Each state it sets is logged
//! with the wall-clock time it was set ([`changes_at`]): the evidence that ranks agree.
mod shared_schedule;

use crate::sys::{rng, threads};
use ibjitter_table::ENTRIES;
use shared_schedule::Schedule;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// 0 while calm, ENTRIES while congested (added to the index drawn); how many times the
/// state changed; the mean dwells (ns), 0 without episodes.
static OFFSET: AtomicUsize = AtomicUsize::new(0);
static CHANGES: AtomicU64 = AtomicU64::new(0);
static DWELL_CALM: AtomicU64 = AtomicU64::new(0);
static DWELL_CONGESTED: AtomicU64 = AtomicU64::new(0);
/// `IBJITTER_EPISODES_SYNC`: follow the shared wall-clock schedule of the job's seed.
static SHARED: AtomicBool = AtomicBool::new(false);
static SHARED_SEED: AtomicU64 = AtomicU64::new(0);

/// The states set, in order: (CLOCK_REALTIME ns << 1) | congested, the start's first. The
/// first [`LOG_CAP`] are kept (8 KiB, static: nothing allocated), written by the episodes
/// thread alone (and the start, before it), read at exit.
const LOG_CAP: usize = 1024;
static LOG: [AtomicU64; LOG_CAP] = [const { AtomicU64::new(0) }; LOG_CAP];
static LOGGED: AtomicUsize = AtomicUsize::new(0);

/// The shared schedule's thread sleeps at most this long (ns): a wall clock stepped
/// meanwhile (either way) is noticed within it. Its sleeps are relative (CLOCK_MONOTONIC):
/// an absolute sleep on CLOCK_REALTIME would last as long again as a backward step.
const SHARED_MAX_SLEEP_NS: i128 = 50_000_000;
/// ... and at least this long: changes closer together than that (and the kernel's timer
/// slack, 50 us by default) are followed at its wake-ups, each setting the state then.
const SHARED_MIN_SLEEP_NS: i128 = 10_000;

/// The salt of the episodes' dwell-time stream ("epis").
const EPISODES_SALT: u64 = 0x6570_6973;

/// The mean dwells (ns), and the job's seed when following the shared schedule, at load.
pub fn configure(calm: f64, congested: f64, shared: Option<u64>) {
    DWELL_CALM.store(calm.round().max(1.0) as u64, Release);
    DWELL_CONGESTED.store(congested.round().max(1.0) as u64, Release);
    SHARED.store(shared.is_some(), Release);
    SHARED_SEED.store(shared.unwrap_or(0), Release);
    OFFSET.store(0, Release);
    LOGGED.store(0, Release);
}

/// Sets the state (and logs it with the wall-clock time, when it changed or is the first).
fn set_state(congested: bool, first: bool) {
    let offset = if congested { ENTRIES } else { 0 };
    if OFFSET.swap(offset, Relaxed) == offset && !first {
        return;
    }
    if !first {
        CHANGES.fetch_add(1, Relaxed);
    }
    let k = LOGGED.load(Relaxed);
    if k < LOG_CAP {
        let t = realtime_ns().clamp(0, i128::from(u64::MAX >> 1)) as u64;
        LOG[k].store(t << 1 | u64::from(congested), Relaxed);
        LOGGED.store(k + 1, Release);
    }
}

/// Whether the episodes follow the job's shared wall-clock schedule.
pub fn shared() -> bool {
    SHARED.load(Acquire)
}

/// The states set so far with the wall-clock time (ns since the epoch) each was set, the
/// first the state at start; and how many were set in all (the first [`LOG_CAP`] are kept).
pub fn changes_at() -> (Vec<(u64, bool)>, usize) {
    let n = LOGGED.load(Acquire);
    let kept = (0..n.min(LOG_CAP))
        .map(|k| {
            let v = LOG[k].load(Relaxed);
            (v >> 1, v & 1 == 1)
        })
        .collect();
    let set = if n > 0 {
        1 + CHANGES.load(Relaxed) as usize
    } else {
        0
    };
    (kept, set)
}

/// What the draw adds to its index now.
#[inline(always)]
pub fn offset() -> usize {
    OFFSET.load(Relaxed)
}

/// The state changes so far, and the mean dwells asked (ns): None without episodes.
pub fn summary() -> Option<(u64, u64, u64)> {
    let calm = DWELL_CALM.load(Acquire);
    (calm > 0).then(|| (CHANGES.load(Relaxed), calm, DWELL_CONGESTED.load(Acquire)))
}

/// Starts (at the process's first use, which runs once) the thread that switches between the calm and the congested table after
/// exponential dwell times (means as asked, drawn from a stream of the seed: the state
/// sequence repeats with it; which posts fall in which episode depends on their timing).
/// Starts calm. A fork child keeps the state it was forked in. With the shared schedule:
/// see [`start_shared`].
pub fn start() {
    let (calm, congested) = (DWELL_CALM.load(Acquire), DWELL_CONGESTED.load(Acquire));
    if calm == 0 {
        return;
    }
    if SHARED.load(Acquire) {
        let seed = SHARED_SEED.load(Acquire);
        return start_shared(Schedule::new(seed, calm, congested));
    }
    set_state(false, true);
    let mut rng = rng::stream(rng::seed(), EPISODES_SALT, 0);
    threads::spawn_or_say("ibjitter-episodes", LOST, move || loop {
        let congested_now = OFFSET.load(Relaxed) != 0;
        let mean = if congested_now { congested } else { calm };
        // Exponential: -mean ln(1 - u), u uniform in [0, 1).
        let u = (rand_core::Rng::next_u64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
        let dwell = -(mean as f64) * (1.0 - u).ln();
        if !threads::nap(dwell as u64) {
            return cannot_sleep();
        }
        set_state(!congested_now, false);
    });
}

/// What a process whose episodes thread cannot start goes without.
const LOST: &str = "IBJITTER_EPISODES: no congested episodes (calm throughout)";

/// The episodes thread cannot sleep (a seccomp filter): calm from now on, said (and recorded:
/// the ranks' record of states must say so).
fn cannot_sleep() {
    crate::sys::say::warn(&format!(
        "the shim's episodes thread cannot sleep (clock_nanosleep and poll fail: a seccomp \
         filter?): {LOST} from now on"
    ));
    set_state(false, false);
}

/// Sets the state of the shared schedule at once (the first posts already follow it), then
/// starts the thread that keeps it: at each wake-up it reads CLOCK_REALTIME, sets the
/// state the schedule has then and sleeps until its next change ([`shared_step`]). Each
/// wake-up derives the state afresh from the clock: a stepped clock is followed, never
/// replayed.
fn start_shared(schedule: Schedule) {
    set_state(schedule.at(realtime_ns()).congested, true);
    let kept = threads::spawn_or_say("ibjitter-episodes", LOST, move || loop {
        let (congested, sleep_ns) = shared_step(&schedule, realtime_ns());
        set_state(congested, false);
        if !threads::nap(sleep_ns) {
            return cannot_sleep();
        }
    });
    if !kept {
        // Recorded too: the ranks' record of states must say this one ran calm.
        set_state(false, false);
    }
}

/// At wall-clock time `t`: the shared schedule's state, and how long to sleep (ns) before
/// looking again: until its next change, within [`SHARED_MIN_SLEEP_NS`,
/// `SHARED_MAX_SLEEP_NS`].
fn shared_step(schedule: &Schedule, t: i128) -> (bool, u64) {
    let now = schedule.at(t);
    let sleep = (now.next - t).clamp(SHARED_MIN_SLEEP_NS, SHARED_MAX_SLEEP_NS);
    (now.congested, sleep as u64)
}

/// CLOCK_REALTIME in ns since the Unix epoch (negative before it).
fn realtime_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wall clock stepped backwards (an hour, a day, to before the epoch), forwards (to
    /// 2100, 2262) or standing still: each wake-up sets the schedule's state at the clock's
    /// time and sleeps a bounded, non-zero time, so the thread neither spins nor sleeps
    /// through the step.
    #[test]
    fn a_stepped_wall_clock_is_followed_with_bounded_sleeps() {
        const MS: i128 = 1_000_000;
        let s = Schedule::new(5, 20_000_000, 20_000_000);
        let t0: i128 = 1_767_225_600_000_000_000;
        let mut clock = vec![t0, t0 + 7 * MS, t0 + 7 * MS, t0 - 3_600_000 * MS];
        clock.extend([t0 - 86_400_000 * MS, -5_000 * MS, 4_102_444_800_000 * MS]);
        clock.extend([(1 << 63) - MS, 1 << 63, t0 + 40 * MS, t0 + 20 * MS]);
        for t in clock {
            let (congested, sleep) = shared_step(&s, t);
            assert_eq!(congested, s.at(t).congested, "{t}");
            assert!(
                (10_000..=50_000_000).contains(&sleep),
                "{t}: sleeps {sleep} ns"
            );
            let next = s.at(t).next;
            if next - t > SHARED_MIN_SLEEP_NS && next - t <= SHARED_MAX_SLEEP_NS {
                assert_eq!(i128::from(sleep), next - t, "{t}: wakes at the change");
            }
        }
        let tiny = Schedule::new(5, 1, 1);
        assert_eq!(shared_step(&tiny, t0).1, 10_000, "1 ns dwells: no spin");
        let huge = Schedule::new(5, 3_600_000_000_000_000, 3_600_000_000_000_000);
        assert_eq!(
            shared_step(&huge, t0).1,
            50_000_000,
            "1000 h dwells: still looks"
        );
    }

    /// Start-up cost of the shared schedule: one look-up (measured, printed).
    #[test]
    fn the_first_state_costs_microseconds() {
        let s = Schedule::new(rng::DEFAULT_SEED, 20_000_000, 20_000_000);
        let t0 = std::time::Instant::now();
        let n = 10_000;
        let mut congested = 0;
        for k in 0..n {
            congested += s.at(realtime_ns() + k * 1_000_003).congested as u32;
        }
        let each = t0.elapsed() / n as u32;
        eprintln!(
            "start-up look-up: {each:?} ({} levels); {congested} of {n} congested",
            s.depth()
        );
        assert!(each < std::time::Duration::from_micros(100), "{each:?}");
        assert!((3_000..7_000).contains(&congested), "{congested}");
    }
}

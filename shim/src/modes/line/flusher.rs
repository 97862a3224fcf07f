//! Handing the line's requests over: whoever flushes (the program's own calls, or the timer
//! thread) takes what entered, orders it by due time and hands what is due to the provider,
//! a QP's due requests as one list. One thread flushes at a time (a try-flag: a thread that
//! finds it taken goes on, never waits). Also the timer thread, and what the stats say of
//! the hand-over.
use super::lanes::{self, Line};
use super::qps;
use super::slots::{bytes_of, SLOTS};
use crate::abi::verbs::ibv_send_wr;
use crate::sys::clock::{self, now_units, units_to_ns};
use crate::sys::{rng, say, threads};
use std::cell::UnsafeCell;
use std::collections::BinaryHeap;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Longest sleep of the timer thread while the line holds requests (how late a new, earlier
/// request may be seen when the program makes no call), and its first while the line is
/// empty.
pub const IDLE_NS: u64 = 50_000;
/// Once the line has been empty for [`EMPTY_GRACE_NS`] the timer thread's sleep doubles at
/// each wake-up, from [`IDLE_NS`] to [`IDLE_MAX_NS`]: each wake-up costs the host ~7-15 us of
/// a core (on a full node, a rank's), ~15 % of a core at 50 us. A program that communicates
/// more often than the grace keeps the quick look; in a longer idle spell a request posted
/// into the empty line is seen within the sleep, or at once when the program goes to sleep
/// for a completion (its `ibv_req_notify_cq` or `ibv_get_cq_event`: [`program_may_sleep`]
/// rings the thread awake); a program that posts after an idle spell and then neither calls
/// nor sleeps on a completion finds that request late by up to [`IDLE_MAX_NS`] (said at exit
/// with the lateness). The ring's own wake-up is slow under the bench's emulated CPUs (~100-
/// 200 us): the grace keeps such programs' steady exchanges on the quick look. A program
/// whose own calls handed requests over within the grace (a busy-polling one, "calm") gets
/// no quick look: its calls hand over what it posts next, and the sleeps lengthen at once.
pub const EMPTY_GRACE_NS: u64 = 5_000_000;
pub const IDLE_MAX_NS: u64 = 1_000_000;
/// The timer thread wakes this long before a due time and spins the rest, while the program
/// makes no calls: a sleep's wake-up is late by up to about this much on the bench.
pub const EARLY_NS: u64 = 150_000;
/// The program counts as calling (polling, posting) if one of its calls saw requests in the
/// line this recently: its calls then hand requests over at their due time, and the timer
/// thread only sleeps, as a backstop.
pub const ACTIVE_NS: u64 = 100_000;
/// While the program is calling, how long after its due time a request waits for the
/// program's calls before the timer thread hands it over: from [`BACKSTOP_NS`], doubled at
/// each wake-up that found the program's calls handing requests over or calm (they handed
/// some over within [`EMPTY_GRACE_NS`]; on a full node each wake-up takes a core from a
/// rank), up to [`BACKSTOP_MAX_NS`]; back to the least at a wake-up that found neither, or
/// once the program is quiet, or as soon as the timer thread had to hand a request over.
/// While another thread holds the line (the program's call, inside the provider) the
/// thread sleeps the backstop too.
pub const BACKSTOP_NS: u64 = 50_000;
pub const BACKSTOP_MAX_NS: u64 = 1_000_000;
/// Where a quiet wake-up costs the host much (emulated CPUs: 40-85 us of CPU each under the
/// bench's qemu TCG, ~15 us on this project's KVM hosts, a few us on real cores), the
/// backstop's longest sleep grows beyond [`BACKSTOP_MAX_NS`] until one wake-up per longest
/// sleep costs at most 1/[`BACKSTOP_SHARE`] of a core (at the least a wake-up was measured to
/// cost), up to [`BACKSTOP_CEIL_NS`] (see [`BackstopCap`]). The thread's other wake-ups (its
/// hand-overs, the program's start and end with the line empty) come on top. On a full node
/// each wake-up takes a rank's core: on the bench, 1 ms backstops took 13-20 % of each rank's
/// vCPU and an MPI ping-pong's median sat 56-197 us above spin mode's; at 6-8 ms, 7-9 % and
/// within -23 to +41 us of it. The price: a program that stops calling without going to
/// sleep on a completion finds a request that was due meanwhile late by up to the longest
/// sleep.
pub const BACKSTOP_SHARE: u64 = 100;
pub const BACKSTOP_CEIL_NS: u64 = 8_000_000;

/// The earliest due time in the line (u64::MAX: the line is empty). Posters lower it
/// ([`announce`]), the flusher sets it from its heap.
static NEXT_DUE: AtomicU64 = AtomicU64::new(u64::MAX);
/// A clock reading (units) of a program call that found requests in the line, renewed at
/// most every [`ACTIVE_NS`] / 4 (a store each call would bounce its cache line between the
/// program's core and the timer thread's).
static PROGRAM_SEEN: AtomicU64 = AtomicU64::new(0);
static SEEN_STEP: AtomicU64 = AtomicU64::new(0);
/// The thread flushing the line now ([`rng::this_thread`]; 0: none); the [`Flusher`] is its.
/// Who, not only whether: a post its own signal handler makes while it flushes cannot wait
/// for the flush ([`flushing_here`]).
static FLUSHING: AtomicUsize = AtomicUsize::new(0);

/// Takes the line for flushing, unless a thread holds it.
#[inline]
fn take_line() -> bool {
    FLUSHING
        .compare_exchange(0, rng::this_thread(), Acquire, Relaxed)
        .is_ok()
}

#[inline]
fn release_line() {
    FLUSHING.store(0, Release);
}

/// Whether the calling thread is flushing the line: a post that finds it so was made inside
/// the flush (by a signal handler, or a provider's call back into verbs) and must not wait
/// for what only the flush it interrupted can give (a slot, a QP's earlier requests).
#[cold]
pub fn flushing_here() -> bool {
    FLUSHING.load(Relaxed) == rng::this_thread()
}

/// Requests taken out of the line (handed over or dropped), refused by the provider, dropped
/// (their QP was destroyed), and handed over by the program's calls and by the timer thread.
/// Only the thread flushing the line writes them (but POST_ERRORS, which says once).
static LEFT: AtomicU64 = AtomicU64::new(0);
static POST_ERRORS: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The draws the dropped requests carried, and their sum (ns, saturating): drawn, never
/// given.
static DROPPED_DRAWS: AtomicU64 = AtomicU64::new(0);
static DROPPED_NS: AtomicU64 = AtomicU64::new(0);
pub static BY_PROGRAM: AtomicU64 = AtomicU64::new(0);
pub static BY_TIMER: AtomicU64 = AtomicU64::new(0);

/// The provider's own time taking the line's requests (inside its `post_send`, summed), and
/// the span it falls in: from the first request handed over's entry (its due time less its
/// delay) to the end of the latest hand-over (all in clock units; 0: none yet). Their ratio
/// says whether the provider itself was the bottleneck: a software provider (rxe) does a
/// send's work in that call, tens of microseconds under the bench's emulated CPUs. Only the
/// thread flushing the line writes them.
static PROVIDER_UNITS: AtomicU64 = AtomicU64::new(0);
static FIRST_IN: AtomicU64 = AtomicU64::new(0);
static LAST_OUT: AtomicU64 = AtomicU64::new(0);

/// What the timer thread costs its host: its wake-ups, when it started (ns, monotonic) and
/// its CPU clock (`pthread_getcpuclockid`; -1 before it runs and in a fork child, which has
/// no timer thread). Only the timer thread writes them.
static TIMER_WAKEUPS: AtomicU64 = AtomicU64::new(0);
static TIMER_STARTED_NS: AtomicU64 = AtomicU64::new(0);
static TIMER_CPU_CLOCK: AtomicI32 = AtomicI32::new(-1);
/// The backstop's longest sleep now (ns; [`BackstopCap`]).
static BACKSTOP_LONGEST_NS: AtomicU64 = AtomicU64::new(BACKSTOP_MAX_NS);

/// The timer thread sleeps on this word (a futex) while the line is empty; ringing it
/// (a change, then a wake) ends the sleep. [`NAPPING`]: the thread sleeps on the empty line
/// now (up to [`IDLE_MAX_NS`]), so a request posted meanwhile would wait for the sleep's end.
static BELL: AtomicU32 = AtomicU32::new(0);
static NAPPING: AtomicBool = AtomicBool::new(false);
/// How often the program's sleep calls rang the timer thread awake.
static RUNG: AtomicU64 = AtomicU64::new(0);

/// The flusher's state: the requests taken from the line, by due time, and what the
/// hand-overs measured.
pub struct Flusher {
    heap: BinaryHeap<std::cmp::Reverse<(u64, u32)>>,
    times: Times,
}

/// How late requests were handed over (after their due time), and how long each call of
/// the provider's `post_send` took them: in clock units, converted to ns when read (a
/// conversion per request handed over cost a division, TSC ticks to ns).
struct Times {
    late: hdrhistogram::Histogram<u64>,
    provider_call: hdrhistogram::Histogram<u64>,
}

struct FlusherCell(UnsafeCell<Option<Flusher>>);
// SAFETY: only the holder of FLUSHING touches it.
unsafe impl Sync for FlusherCell {}
static FLUSHER: FlusherCell = FlusherCell(UnsafeCell::new(None));

/// Sets the flusher's state up (before the line takes its first request). False if its
/// memory cannot be had.
pub fn start() -> bool {
    // Up to an hour in TSC ticks of a 10 GHz clock.
    let hist = || hdrhistogram::Histogram::new_with_bounds(1, 36_000_000_000_000, 2).ok();
    let (Some(late), Some(provider_call)) = (hist(), hist()) else {
        return false;
    };
    let mut heap = BinaryHeap::new();
    if heap.try_reserve_exact(SLOTS).is_err() {
        return false;
    }
    SEEN_STEP.store(clock::ns_to_units(ACTIVE_NS / 4, clock::kind()), Relaxed);
    // SAFETY: nothing flushes before the line is on.
    unsafe {
        *FLUSHER.0.get() = Some(Flusher {
            heap,
            times: Times {
                late,
                provider_call,
            },
        })
    };
    true
}

/// A request entered the line due at `due` (the earliest of its post call's): lowers the
/// line's earliest due time if it is earlier. After the request entered: a flusher that set
/// the earliest due time before either took the request or sees this lower value.
#[inline]
pub fn announce(due: u64) {
    // Orders the way in's store before the load below (the flusher orders its store of
    // NEXT_DUE before its look at the ways in the same way).
    std::sync::atomic::fence(SeqCst);
    if due < NEXT_DUE.load(Relaxed) {
        NEXT_DUE.fetch_min(due, SeqCst);
    }
}

/// Hands over what is due, unless nothing is, or another thread is at it: what the
/// program's calls do first (`now`: their clock reading, if they have one). One atomic load
/// while the line is empty, then a clock read and a compare while nothing is due; no
/// syscall, no wait.
#[inline]
pub fn flush_if_due(now: Option<u64>) {
    let next = NEXT_DUE.load(Acquire);
    if next == u64::MAX {
        return;
    }
    let now = now.unwrap_or_else(now_units);
    if now.wrapping_sub(PROGRAM_SEEN.load(Relaxed)) > SEEN_STEP.load(Relaxed) {
        PROGRAM_SEEN.store(now, Relaxed);
    }
    if now >= next {
        flush(&BY_PROGRAM, Some(now));
    }
}

/// Takes what entered into the heap and hands the due requests over, counting them in `by`;
/// false if another thread holds the line. `now`: the caller's clock reading, if it has one
/// (each read costs 10-20 ns, a good part of a hand-over's own cost).
#[cold]
#[inline(never)]
pub fn flush(by: &AtomicU64, now: Option<u64>) -> bool {
    flush_before(by, now, u64::MAX)
}

/// A thread that had a lane exited: a flush (if the line is free) takes that lane's slots
/// back and frees it for the next thread, even with nothing in the line.
pub fn after_lane_owner_exits() {
    flush(&BY_PROGRAM, None);
}

/// Hands over what is due and due before `ceiling`, when the line is not empty and its
/// earliest request is due: a post waiting in place for its own due time hands over what
/// falls due meanwhile, but never a request due after its own (its QP's later ones, which
/// must leave after it).
#[inline]
pub fn flush_if_due_before(now: u64, ceiling: u64) {
    let next = NEXT_DUE.load(Acquire);
    if next != u64::MAX && now >= next && next < ceiling {
        flush_before(&BY_PROGRAM, Some(now), ceiling);
    }
}

/// [`flush`], handing over only requests due before `ceiling`.
#[cold]
#[inline(never)]
fn flush_before(by: &AtomicU64, now: Option<u64>, ceiling: u64) -> bool {
    let Some(line) = lanes::line() else {
        return false;
    };
    // Marked before the line is taken and released after it (its drop at the end): a
    // handler's post while this thread holds the line always finds itself nested.
    let _nested_posts = lanes::hold_while_flushing();
    if !take_line() {
        return false;
    }
    // Not cancelled while it holds the line (the provider's call may be a cancellation
    // point): allowed again at the end, once the line is released.
    let _not_cancelled = crate::sys::threads::NoCancel::hold();
    // SAFETY: FLUSHING is ours: so is the flusher's state.
    let Some(f) = (unsafe { &mut *FLUSHER.0.get() }) else {
        release_line();
        return false;
    };
    let mut given = now;
    loop {
        // SAFETY: FLUSHING is ours; each slot taken is the flusher's until given back.
        unsafe {
            line.take_entered(|i| f.heap.push(std::cmp::Reverse((line.pool.slot(i).due, i))))
        };
        let mut now = given.take().unwrap_or_else(now_units);
        let mut list = List::new();
        while let Some(&std::cmp::Reverse((due, i))) = f.heap.peek() {
            // `now` is the caller's reading or the latest provider call's return: a request
            // that fell due since leaves at the next call (no second clock read here).
            if due > now || due >= ceiling {
                break;
            }
            f.heap.pop();
            // SAFETY: the flusher owns slot i until post_list gives it back.
            unsafe { add_to_list(line, &mut list, i, &mut f.times, by, &mut now) };
        }
        if list.n > 0 {
            // SAFETY: as above.
            unsafe { post_list(line, &mut list, &mut f.times, by, &mut now) };
        }
        let next = f.heap.peek().map_or(u64::MAX, |r| r.0 .0);
        // The fence orders this store before the look at the ways below (as `announce`
        // orders a post's): a store that is itself a barrier is not needed.
        NEXT_DUE.store(next, Relaxed);
        std::sync::atomic::fence(SeqCst);
        // A request that entered meanwhile lowered NEXT_DUE after this store, or is seen here.
        if !line.entered_waiting() {
            break;
        }
    }
    release_line();
    true
}

/// Hands requests over for programs that sleep (completion channels, idle phases), and as a
/// backstop for those that call. While the program's calls are flushing the line (one saw
/// requests in it within [`ACTIVE_NS`]) it only sleeps, and leaves the core to the program:
/// until [`EARLY_NS`] before the earliest due time (the due time itself when the thread may
/// run on one CPU only), then to the backstop past it
/// ([`BACKSTOP_NS`] .. [`BACKSTOP_MAX_NS`]; both longest sleeps longer where its wake-ups
/// cost much: [`BACKSTOP_SHARE`]). Otherwise it sleeps until
/// [`EARLY_NS`] before the earliest due time (at most [`IDLE_NS`], so it sees new requests)
/// and spins the rest, unless a program call hands the request over first. On one CPU it
/// never spins and looks at most once per longest backstop ([`nap_on_one_cpu`]).
pub fn timer_thread() {
    let slack = lower_timer_slack();
    note_timer_start();
    // A thread allowed one CPU shares it with the program that made it (a rank pinned to its
    // core: `mpirun --bind-to core`, `srun --cpu-bind`, `taskset`): a spin there is the
    // program's time (a third of a rank's core, posting every 0.5 ms), so it only sleeps,
    // to each due time.
    // Unknown (the mask unreadable: a seccomp filter) counts as one: never spin on a core
    // that may be the rank's only one.
    let one_cpu = matches!(crate::sys::threads::allowed_cpus(), Some(1) | None);
    ONE_CPU.store(one_cpu, Relaxed);
    say_timer_slack(slack, one_cpu);
    // A slack it could not lower makes each sleep wake up to that much late: it wakes that
    // much earlier and spins the rest (unknown: as if none).
    let early_ns = match slack {
        _ if one_cpu => 0,
        Some(ns) if ns != SLACK_UNKNOWN => EARLY_NS.saturating_add(ns.min(SLACK_SPIN_MAX_NS)),
        _ => EARLY_NS,
    };
    let units = |ns| clock::ns_to_units(ns, clock::kind());
    let (early, active) = (units(early_ns), units(ACTIVE_NS));
    let (least, mut most) = (units(BACKSTOP_NS), units(BACKSTOP_MAX_NS));
    let mut backstop = least;
    let mut cap = BackstopCap::new();
    // The program's hand-overs when this thread last looked.
    let mut by_program = BY_PROGRAM.load(Relaxed);
    // The next sleep while the line stays empty, and since when it is (ns; 0: it is not).
    let (mut empty_nap, mut empty_since) = (IDLE_NS, 0);
    // When this thread last saw the program's calls' hand-overs grow (ns; 0: never, or this
    // thread handed requests over since), and the counts it saw then.
    let (mut program_handed_ns, mut handed_seen, mut timer_seen) = (0u64, 0u64, 0u64);
    loop {
        if let Some(ns) = cap.measured() {
            BACKSTOP_LONGEST_NS.store(ns, Relaxed);
            most = units(ns);
            backstop = backstop.min(most);
        }
        let next = NEXT_DUE.load(Acquire);
        // Calm: the program's calls handed requests over within the grace, and this thread
        // did not have to since. Its sleeps then lengthen whether the line is empty or not:
        // between the messages of a busy-polling program the line empties and fills every
        // exchange, and 50 us looks at each cost a full node's ranks a fifth to two fifths of
        // a vCPU on the bench (~200 us of CPU a wake-up there).
        let calm = {
            let (handed, by_timer) = (BY_PROGRAM.load(Relaxed), BY_TIMER.load(Relaxed));
            let now = clock::monotonic_ns();
            if handed != handed_seen {
                (handed_seen, program_handed_ns) = (handed, now);
            }
            if by_timer != timer_seen {
                (timer_seen, program_handed_ns) = (by_timer, 0);
            }
            program_handed_ns != 0 && now - program_handed_ns < EMPTY_GRACE_NS
        };
        if next == u64::MAX && calm {
            // What the program posts next its calls hand over too; one that goes to sleep on
            // a completion rings this thread awake.
            (empty_nap, empty_since) = (IDLE_NS, 0);
            if !sleep_while_empty(units_to_ns(backstop)) {
                return without_sleep();
            }
            backstop = (backstop * 2).min(most);
            TIMER_WAKEUPS.store(TIMER_WAKEUPS.load(Relaxed) + 1, Relaxed);
            continue;
        }
        if next == u64::MAX {
            backstop = least;
            let now = clock::monotonic_ns();
            if empty_since == 0 {
                empty_since = now;
            }
            if !sleep_while_empty(empty_nap) {
                return without_sleep();
            }
            if now - empty_since >= EMPTY_GRACE_NS {
                empty_nap = (empty_nap * 2).min(IDLE_MAX_NS);
            }
            TIMER_WAKEUPS.store(TIMER_WAKEUPS.load(Relaxed) + 1, Relaxed);
            continue;
        }
        (empty_nap, empty_since) = (IDLE_NS, 0);
        let nap = {
            let now = now_units();
            // Another thread holds the line: the program's calls are handing over (a call of
            // a software provider may take milliseconds on a full node, and none of the
            // program's calls renews PROGRAM_SEEN meanwhile): a backstop, not a spin.
            let line_taken = FLUSHING.load(Relaxed) != 0;
            if line_taken || now.saturating_sub(PROGRAM_SEEN.load(Relaxed)) < active {
                // The program's calls hand requests over: a backstop only.
                let wake = next.saturating_add(backstop);
                if now >= wake && !line_taken {
                    flush(&BY_TIMER, Some(now));
                    backstop = least;
                    continue;
                }
                let handed = BY_PROGRAM.load(Relaxed);
                let nap = if next > now.saturating_add(early) {
                    // Nothing due within EARLY_NS: no need to look before then (the
                    // program's calls hand over what they post meanwhile), and then the
                    // program may be quiet: it spins to the due time as for a sleeping one.
                    units_to_ns(next - now)
                        .saturating_sub(early_ns)
                        .min(units_to_ns(most))
                } else {
                    // Woken with nothing to hand over. Wake less often only if the
                    // program's calls did hand requests over since, or lately (calm): calls
                    // that merely saw requests in the line (none due yet) say nothing of who
                    // will hand them over once the program sleeps, and a long nap then made
                    // them late by up to the longest.
                    backstop = if handed != by_program || calm {
                        (backstop * 2).min(most)
                    } else {
                        least
                    };
                    let until = if wake > now { wake - now } else { backstop };
                    units_to_ns(until).min(units_to_ns(backstop).max(ACTIVE_NS))
                };
                by_program = handed;
                nap
            } else if next <= now.saturating_add(early) {
                // Due within EARLY_NS: spin to it, unless someone hands it over first.
                cap.spun();
                while now_units() < next && NEXT_DUE.load(Acquire) == next {
                    std::hint::spin_loop();
                }
                flush(&BY_TIMER, None);
                backstop = least;
                continue;
            } else {
                backstop = least;
                // Looks for new, earlier requests every IDLE_NS; on one CPU each look is
                // the program's time (5,000 looks a second took 16 % of it here): the
                // longest backstop's, where a look costs at most 1 % of a core.
                let look = if one_cpu { units_to_ns(most) } else { IDLE_NS };
                units_to_ns(next - now).saturating_sub(early_ns).min(look)
            }
        };
        let slept = if one_cpu {
            nap_on_one_cpu(nap.max(1), next)
        } else {
            threads::nap(nap.max(1))
        };
        if !slept {
            return without_sleep();
        }
        TIMER_WAKEUPS.store(TIMER_WAKEUPS.load(Relaxed) + 1, Relaxed);
    }
}

/// The timer thread ended: it could not sleep ([`without_sleep`]).
static TIMER_GONE: AtomicBool = AtomicBool::new(false);

/// The timer thread cannot sleep (a seccomp filter denies `clock_nanosleep`, `ppoll`, `poll`
/// and `futex`): it would spin a core for the process's life. It ends. The line goes on
/// (order, accounting and the exit drain as before): the program's own posts and polls hand
/// its requests over, and a program about to sleep on a completion first waits in place
/// until the line is empty ([`program_may_sleep`]), as a post waits in spin mode.
#[cold]
fn without_sleep() {
    say::warn(
        "IBJITTER_MODE=line: the delay line's timer thread cannot sleep (clock_nanosleep, \
         ppoll, poll and futex fail: a seccomp filter?) and ends: the program's own calls \
         hand its requests over, and before it sleeps on a completion it waits in place \
         until they have left",
    );
    TIMER_GONE.store(true, SeqCst);
}

/// The timer thread's timer slack when it could not lower it to 1 ns (ns; [`SLACK_UNKNOWN`]:
/// nor read it); 0 when it did (or there is no timer thread).
static TIMER_SLACK_NS: AtomicU64 = AtomicU64::new(0);
/// The timer slack could not be read.
pub const SLACK_UNKNOWN: u64 = u64::MAX;
/// The most a slack the timer thread could not lower widens its spin before each due time:
/// a slack of 100 ms (systemd's `TimerSlackNSec=`) would have it spin almost all the time, a
/// core taken from a full node's ranks; beyond this, the slack is lateness (said).
const SLACK_SPIN_MAX_NS: u64 = 2_000_000;
/// A timer slack the margins absorb (the kernel's default): above it, a slack the timer
/// thread could not lower is said.
pub const SLACK_SAID_NS: u64 = 50_000;

/// Sets the calling thread's timer slack to 1 ns (its sleeps then wake within a microsecond
/// of their time). None if it did; else the slack it keeps, inherited from the thread that
/// made it (systemd's `TimerSlackNSec=`, the program's own `prctl`), read back, or
/// [`SLACK_UNKNOWN`]: a seccomp filter may refuse `prctl` (both were ignored: the line was
/// late by the slack, 8.7 ms at the median for a 1 ms table under a 20 ms slack, and the
/// warning blamed busy cores).
fn lower_timer_slack() -> Option<u64> {
    // SAFETY: prctl on the calling thread.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) } == 0 {
        return None;
    }
    // The raw call: glibc's prctl returns an int, too small for a slack past 2.1 s.
    // SAFETY: as above; reads the calling thread's slack.
    let got = unsafe {
        libc::syscall(
            libc::SYS_prctl,
            libc::PR_GET_TIMERSLACK,
            0u64,
            0u64,
            0u64,
            0u64,
        )
    };
    let slack = u64::try_from(got).unwrap_or(SLACK_UNKNOWN);
    TIMER_SLACK_NS.store(slack, Relaxed);
    Some(slack)
}

/// Says once a timer slack the timer thread could not lower, if it is large.
fn say_timer_slack(slack: Option<u64>, one_cpu: bool) {
    let Some(ns) = slack.filter(|&ns| ns > SLACK_SAID_NS && ns != SLACK_UNKNOWN) else {
        return;
    };
    let then = if one_cpu {
        "on the one CPU it shares with the program it only sleeps, so a request it hands over \
         may leave that late"
            .to_string()
    } else {
        format!(
            "it wakes that much earlier, up to {:.3} ms, and spins to each due time instead \
             ({:.3} ms before it, the spin's CPU time; a slack beyond that is lateness)",
            SLACK_SPIN_MAX_NS as f64 / 1e6,
            EARLY_NS.saturating_add(ns.min(SLACK_SPIN_MAX_NS)) as f64 / 1e6
        )
    };
    say::warn(&format!(
        "IBJITTER_MODE=line: the delay line's timer thread cannot lower its timer slack \
         (prctl(PR_SET_TIMERSLACK) refused): its sleeps wake up to {:.3} ms late, the slack \
         it inherited (systemd's TimerSlackNSec=, or the program's own prctl); {then}",
        ns as f64 / 1e6
    ));
}

/// The timer thread's timer slack if it could not lower it (ns; [`SLACK_UNKNOWN`]: nor read
/// it); None when it did, or there is no timer thread.
pub fn timer_slack_kept() -> Option<u64> {
    Some(TIMER_SLACK_NS.load(Relaxed)).filter(|&ns| ns != 0)
}

/// The backstop's longest sleep as the timer thread's wake-ups cost ([`BACKSTOP_SHARE`]):
/// the thread's own CPU time over windows of [`BackstopCap::WINDOW`] wake-ups, counted only
/// in windows where it only slept and looked (no hand-over, no spin to a due time: their
/// CPU is not a wake-up's). The least window's cost stands for a wake-up (preemption and
/// page faults only add), over the last two epochs of [`BackstopCap::EPOCH`] windows, so a
/// node that gets busier (dearer wake-ups) is followed; an epoch without a clean window
/// (a timer handing requests over all along) keeps the estimate it had.
struct BackstopCap {
    /// CPU ns at the window's start (None: unreadable), wake-ups and the timer's hand-overs
    /// then, whether it spun since.
    cpu_ns: Option<u64>,
    wakeups: u64,
    by_timer: u64,
    spun: bool,
    /// Windows ended in this epoch; the least cost of a wake-up in this epoch and the one
    /// before (ns; u64::MAX: no clean window); the estimate in use (ns; u64::MAX: none yet).
    windows: u32,
    least_now: u64,
    least_before: u64,
    each_ns: u64,
}

impl BackstopCap {
    const WINDOW: u64 = 64;
    const EPOCH: u32 = 16;

    fn new() -> BackstopCap {
        BackstopCap {
            cpu_ns: thread_cpu_ns(),
            wakeups: TIMER_WAKEUPS.load(Relaxed),
            by_timer: BY_TIMER.load(Relaxed),
            spun: false,
            windows: 0,
            least_now: u64::MAX,
            least_before: u64::MAX,
            each_ns: u64::MAX,
        }
    }

    /// The thread spun to a due time: this window's CPU is not a wake-up's.
    fn spun(&mut self) {
        self.spun = true;
    }

    /// The backstop's longest sleep (ns) when a window just ended, else None.
    fn measured(&mut self) -> Option<u64> {
        let wakeups = TIMER_WAKEUPS.load(Relaxed);
        if wakeups.wrapping_sub(self.wakeups) < Self::WINDOW {
            return None;
        }
        Some(self.window_ended(thread_cpu_ns(), wakeups, BY_TIMER.load(Relaxed)))
    }

    /// A window ended with these readings: the backstop's longest sleep (ns).
    fn window_ended(&mut self, cpu_ns: Option<u64>, wakeups: u64, by_timer: u64) -> u64 {
        let n = wakeups.wrapping_sub(self.wakeups);
        if let (Some(then), Some(now)) = (self.cpu_ns, cpu_ns) {
            if !self.spun && by_timer == self.by_timer && now > then && n > 0 {
                self.least_now = self.least_now.min((now - then) / n);
            }
        }
        (self.cpu_ns, self.wakeups, self.by_timer, self.spun) = (cpu_ns, wakeups, by_timer, false);
        self.windows += 1;
        if self.windows == Self::EPOCH {
            (self.windows, self.least_before, self.least_now) = (0, self.least_now, u64::MAX);
        }
        let least = self.least_now.min(self.least_before);
        if least != u64::MAX {
            self.each_ns = least;
        }
        match self.each_ns {
            u64::MAX => BACKSTOP_MAX_NS,
            each => each
                .saturating_mul(BACKSTOP_SHARE)
                .clamp(BACKSTOP_MAX_NS, BACKSTOP_CEIL_NS),
        }
    }
}

/// The calling thread's CPU time (ns; None if it cannot be read). A system call: the timer
/// thread's, once a window, never the post path's.
fn thread_cpu_ns() -> Option<u64> {
    cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A CPU-time clock's reading in ns (None if it cannot be read).
fn cpu_clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The timer thread's sleep while the line is empty: `ns`, or until [`program_may_sleep`]
/// rings, or at once if a request entered since the thread looked.
fn sleep_while_empty(ns: u64) -> bool {
    let bell = BELL.load(SeqCst);
    NAPPING.store(true, SeqCst);
    // A poster lowered NEXT_DUE before its program's call looks at NAPPING: either that call
    // sees NAPPING and rings (the bell then differs from `bell`, and the wait returns), or
    // this load sees the request.
    let slept = NEXT_DUE.load(SeqCst) != u64::MAX || wait_for_the_bell(bell, ns);
    NAPPING.store(false, SeqCst);
    slept
}

/// When the timer thread's nap on one CPU ends (clock units; u64::MAX: not in one).
static NAP_UNTIL: AtomicU64 = AtomicU64::new(u64::MAX);

/// The timer thread's nap of `ns` on one CPU, planned for earliest due time `next`: its
/// looks for new requests are as far apart as the longest backstop there, so a program that
/// posts a request due sooner and then sleeps on a completion rings it awake
/// ([`program_may_sleep`]), as it does the sleep on an empty line.
fn nap_on_one_cpu(ns: u64, next: u64) -> bool {
    let bell = BELL.load(SeqCst);
    NAP_UNTIL.store(
        now_units().saturating_add(clock::ns_to_units(ns, clock::kind())),
        SeqCst,
    );
    // As in `sleep_while_empty`: either the program's call sees NAP_UNTIL and rings, or
    // this load sees its earlier request.
    let slept = NEXT_DUE.load(SeqCst) < next || wait_for_the_bell(bell, ns);
    NAP_UNTIL.store(u64::MAX, SeqCst);
    slept
}

/// Sleeps up to `ns` unless the bell rings (or rang since it read `bell`). A futex that
/// fails otherwise (a seccomp filter) returns at once: a plain sleep then ([`threads::nap`];
/// false if none can be had).
fn wait_for_the_bell(bell: u32, ns: u64) -> bool {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a futex wait on a live word with a valid relative timeout; it returns at the
    // timeout, on a wake, at once if the word is no longer `bell`, or on a signal.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            BELL.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            bell,
            &ts as *const libc::timespec,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error();
    rc == 0
        || matches!(errno, Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT))
        || threads::nap(ns)
}

/// The program is about to sleep for a completion (`ibv_req_notify_cq`, `ibv_get_cq_event`):
/// hands over what is due, counts the program as quiet (its calls will not hand the rest
/// over: the timer thread spins to their due times rather than leave them to a backstop),
/// and wakes the timer thread if requests wait in the line while it sleeps on an empty line
/// (otherwise they would wait for its end; within the 5 ms grace that sleep is 50 us, and
/// the ring only hastens it), or one is due before its nap on one CPU ends
/// ([`nap_on_one_cpu`]). A system call only then: not the post path, and a call that is
/// about to sleep anyway.
pub fn program_may_sleep() {
    if NEXT_DUE.load(Acquire) == u64::MAX {
        return;
    }
    if TIMER_GONE.load(SeqCst) {
        // Nobody else would hand the rest over while the program sleeps.
        while in_line() != 0 {
            flush(&BY_PROGRAM, None);
            std::hint::spin_loop();
        }
        return;
    }
    flush(&BY_PROGRAM, None);
    PROGRAM_SEEN.store(0, Relaxed);
    let next = NEXT_DUE.load(SeqCst);
    if next != u64::MAX && (NAPPING.load(SeqCst) || next < NAP_UNTIL.load(SeqCst)) {
        RUNG.fetch_add(1, Relaxed);
        BELL.fetch_add(1, SeqCst);
        // SAFETY: a futex wake on a live word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                BELL.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
    }
}

/// The timer thread's start and CPU clock, for [`timer_cost`].
fn note_timer_start() {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the calling thread's own id and a valid out-pointer.
    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
        TIMER_CPU_CLOCK.store(clock, Relaxed);
    }
    TIMER_STARTED_NS.store(clock::monotonic_ns(), Relaxed);
}

/// Whether the timer thread may run on one CPU only (shared with the program): it then
/// never spins to a due time.
static ONE_CPU: AtomicBool = AtomicBool::new(false);

/// Whether the timer thread may run on one CPU only ([`ONE_CPU`]).
pub fn timer_on_one_cpu() -> bool {
    ONE_CPU.load(Relaxed)
}

/// The timer thread's longest backstop sleep now (ns): [`BACKSTOP_MAX_NS`], or longer where
/// its wake-ups cost much ([`BACKSTOP_SHARE`]).
pub fn backstop_longest_ns() -> u64 {
    BACKSTOP_LONGEST_NS.load(Relaxed)
}

/// How often the program's calls before it sleeps (`ibv_req_notify_cq`, `ibv_get_cq_event`)
/// woke the timer thread from its sleep on an empty line.
pub fn timer_rung() -> u64 {
    RUNG.load(Relaxed)
}

/// What the timer thread has cost so far: (wake-ups, CPU ns, ns since it started); None if
/// this process has no timer thread. Off the post path: the stats and status answers.
pub fn timer_cost() -> Option<(u64, u64, u64)> {
    let clock = TIMER_CPU_CLOCK.load(Relaxed);
    if clock == -1 {
        return None;
    }
    // The thread lives as long as the process: its clock stays valid.
    let cpu = cpu_clock_ns(clock)?;
    let alive = clock::monotonic_ns().saturating_sub(TIMER_STARTED_NS.load(Relaxed));
    Some((TIMER_WAKEUPS.load(Relaxed), cpu, alive))
}

/// Most requests handed over as one list, and most bytes in it (large READs posted as one
/// list made rxe retry).
const LIST_MAX: usize = 64;
const LIST_BYTES: u64 = 64 * 1024;

/// Due requests of one QP, in order, handed over as one list: one call of the provider's
/// `post_send` (on rxe one system call) for all of them.
struct List {
    slots: [u32; LIST_MAX],
    n: usize,
    bytes: u64,
}

impl List {
    const fn new() -> List {
        List {
            slots: [0; LIST_MAX],
            n: 0,
            bytes: 0,
        }
    }
}

/// Adds slot `i` to `list`, handing the list over first if `i` is another QP's or the list
/// is full (`now`: as [`post_list`]'s).
unsafe fn add_to_list(
    line: &Line,
    list: &mut List,
    i: u32,
    times: &mut Times,
    by: &AtomicU64,
    now: &mut u64,
) {
    let s = line.pool.slot(i);
    let bytes = bytes_of(s);
    let qp = s.qp;
    if list.n > 0 {
        let first = line.pool.slot(list.slots[0]);
        if first.qp != qp || list.n == LIST_MAX || list.bytes + bytes > LIST_BYTES {
            post_list(line, list, times, by, now);
        }
    }
    list.slots[list.n] = i;
    list.n += 1;
    list.bytes += bytes;
}

/// Hands `list` over (the requests of a destroyed QP are dropped) and gives its slots back.
/// Its requests' lateness is taken from a clock reading of its own, just before the
/// provider's call (not from the reading that found them due: the flusher's own work since
/// is part of how late they reach the provider). `now`: set to the time the provider's call
/// returned, the flusher's latest reading.
unsafe fn post_list(
    line: &Line,
    list: &mut List,
    times: &mut Times,
    by: &AtomicU64,
    now: &mut u64,
) {
    let slots = &list.slots[..list.n];
    let qp = line.pool.slot(slots[0]).qp;
    let (q, gen) = qps::posting(qp);
    // Link the live requests into one list, in order.
    let mut live = 0usize;
    let mut last_due = 0;
    let mut first: *mut ibv_send_wr = null_mut();
    let mut prev: *mut ibv_send_wr = null_mut();
    let now_in = now_units();
    for &i in slots {
        let s = line.pool.slot(i);
        if Some(s.gen) != gen {
            if s.units > 0 {
                add(&DROPPED_DRAWS, 1);
                add(&DROPPED_NS, units_to_ns(s.units));
            }
            continue;
        }
        s.wr.next = null_mut();
        if prev.is_null() {
            first = &mut s.wr;
        } else {
            (*prev).next = &mut s.wr;
        }
        prev = &mut s.wr;
        live += 1;
        last_due = s.due;
        // Handed over now: how late, before the provider's own time to post.
        let _ = times.late.record(now_in.saturating_sub(s.due).max(1));
    }
    if live > 0 {
        if FIRST_IN.load(Relaxed) == 0 {
            let s = line.pool.slot(slots[0]);
            FIRST_IN.store(s.due.saturating_sub(s.units).max(1), Relaxed);
        }
        let mut bad = null_mut();
        let rc = crate::registry::post_send_orig(qp, first, &mut bad);
        let out = now_units();
        *now = out;
        let took = out.saturating_sub(now_in);
        add(&PROVIDER_UNITS, took);
        let _ = times.provider_call.record(took.max(1));
        LAST_OUT.store(out, Release);
        if rc != 0 {
            // Those before `bad` were posted (as a provider's own post_send leaves them).
            let mut refused = live as u64;
            let mut cur = first;
            while !cur.is_null() && cur != bad {
                refused -= 1;
                cur = (*cur).next;
            }
            if POST_ERRORS.fetch_add(refused, Relaxed) == 0 {
                say::warn(&format!(
                    "IBJITTER_MODE=line: the provider refused a deferred work request ({}); \
                     the program's post had returned 0 (counted in the stats' line.post_errors)",
                    std::io::Error::from_raw_os_error(rc)
                ));
            }
        }
        add(by, live as u64);
        // Before the destroy's wait ends: it then finds the QP's hand-over settled.
        if let Some(q) = q {
            q.handed(last_due);
        }
    }
    qps::done_posting();
    if live < list.n {
        add(&DROPPED, (list.n - live) as u64);
    }
    add(&LEFT, list.n as u64);
    for &i in slots {
        line.give_back(line.pool.slot(i).lane, i);
    }
    list.n = 0;
    list.bytes = 0;
}

/// Adds `n` to a count only the thread flushing the line writes (flushers take turns
/// under FLUSHING): no read-modify-write needed.
fn add(count: &AtomicU64, n: u64) {
    // Saturating: a sum of delays (clock units) never wraps to a small one.
    count.store(count.load(Relaxed).saturating_add(n), Release);
}

/// Requests in the line now (entered, not yet handed over or dropped): atomic loads only, for
/// callers that may not allocate or lock (`_exit`, a signal handler).
pub fn in_line() -> u64 {
    let left = LEFT.load(Acquire);
    lanes::entered().saturating_sub(left)
}

/// A fork child: the parent's requests in the line are not the child's (it has no timer
/// thread, and its posts wait in place), nor are its counts and times (the child's exit
/// line and stats said the parent's lateness).
pub fn forget_after_fork() {
    TIMER_CPU_CLOCK.store(-1, Relaxed);
    BACKSTOP_LONGEST_NS.store(BACKSTOP_MAX_NS, Relaxed);
    for parents in [
        &PROVIDER_UNITS,
        &FIRST_IN,
        &LAST_OUT,
        &POST_ERRORS,
        &DROPPED,
        &DROPPED_DRAWS,
        &DROPPED_NS,
        &BY_PROGRAM,
        &BY_TIMER,
        &TIMER_WAKEUPS,
        &RUNG,
    ] {
        parents.store(0, Relaxed);
    }
    // SAFETY: the child has one thread, this one: whoever held the flusher's state in the
    // parent is not here (FLUSHING is released below). Clearing allocates nothing.
    if let Some(f) = unsafe { (*FLUSHER.0.get()).as_mut() } {
        f.heap.clear();
        f.times.late.reset();
        f.times.provider_call.reset();
    }
    NAPPING.store(false, Relaxed);
    LEFT.store(lanes::entered(), Release);
    NEXT_DUE.store(u64::MAX, Release);
    release_line();
}

/// Runs `f` on the flusher's state, holding the line as a flusher does; waits at most 10 ms
/// for a thread flushing now (off the post path: exit, stats, control answers). None when
/// the line has no state or stayed busy.
fn with_flusher<R>(f: impl FnOnce(&mut Flusher) -> R) -> Option<R> {
    for _ in 0..1000 {
        let _nested_posts = lanes::hold_while_flushing();
        if take_line() {
            // SAFETY: FLUSHING is ours: so is the flusher's state.
            let r = unsafe { (*FLUSHER.0.get()).as_mut() }.map(f);
            release_line();
            return r;
        }
        if !threads::nap(10_000) {
            std::hint::spin_loop();
        }
    }
    None
}

/// The draws the requests still in the line carry, and their sum (ns).
pub fn undelivered_draws() -> (u64, u64) {
    let Some(line) = lanes::line() else {
        return (0, 0);
    };
    with_flusher(|f| {
        let (mut draws, mut sum) = (0u64, 0u64);
        // SAFETY: the flusher's state is ours, and so are the slots it and the ways hold.
        unsafe {
            line.take_entered(|i| f.heap.push(std::cmp::Reverse((line.pool.slot(i).due, i))));
            for r in f.heap.iter() {
                let units = line.pool.slot(r.0 .1).units;
                if units > 0 {
                    draws += 1;
                    sum = sum.saturating_add(units_to_ns(units));
                }
            }
        }
        (draws, sum)
    })
    .unwrap_or((0, 0))
}

/// How late requests were handed over (ns after their due time): (count, p50, p99, max).
/// None when nothing was handed over, or the line is busy (a thread flushing for over 10 ms).
pub fn lateness() -> Option<(u64, u64, u64, u64)> {
    with_flusher(|f| summary(&f.times.late)).flatten()
}

/// (count, p50, p99, max) of `h` (clock units) in ns; None if empty.
fn summary(h: &hdrhistogram::Histogram<u64>) -> Option<(u64, u64, u64, u64)> {
    (!h.is_empty()).then(|| {
        (
            h.len(),
            units_to_ns(h.value_at_quantile(0.5)),
            units_to_ns(h.value_at_quantile(0.99)),
            units_to_ns(h.max()),
        )
    })
}

/// How busy the line's hand-overs kept the provider: its time inside `post_send` for them
/// (ns), that time's share of the span from the first request's entry to the latest
/// hand-over (0..=1), and its time per request handed over (ns). None before a hand-over.
pub fn provider_busy() -> Option<(u64, f64, u64)> {
    let (first, last) = (FIRST_IN.load(Relaxed), LAST_OUT.load(Acquire));
    let handed = BY_PROGRAM.load(Relaxed) + BY_TIMER.load(Relaxed);
    if first == 0 || last <= first || handed == 0 {
        return None;
    }
    let ns = units_to_ns(PROVIDER_UNITS.load(Relaxed));
    let share = (ns as f64 / units_to_ns(last - first).max(1) as f64).min(1.0);
    Some((ns, share, ns / handed))
}

/// How long the provider's `post_send` took the hand-overs, per call (ns): (calls, p50, p99,
/// max). None as for [`lateness`].
pub fn provider_call_times() -> Option<(u64, u64, u64, u64)> {
    with_flusher(|f| summary(&f.times.provider_call)).flatten()
}

/// Provider refusals and dropped requests, for the stats.
pub fn errors() -> (u64, u64) {
    (POST_ERRORS.load(Relaxed), DROPPED.load(Relaxed))
}

/// Requests dropped (their QP was destroyed while they were in the line).
pub fn dropped() -> u64 {
    DROPPED.load(Acquire)
}

/// The draws the dropped requests carried, and their sum (ns).
pub fn dropped_draws() -> (u64, u64) {
    (DROPPED_DRAWS.load(Acquire), DROPPED_NS.load(Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> BackstopCap {
        BackstopCap {
            cpu_ns: Some(0),
            wakeups: 0,
            by_timer: 0,
            spun: false,
            windows: 0,
            least_now: u64::MAX,
            least_before: u64::MAX,
            each_ns: u64::MAX,
        }
    }

    /// Ends `k` windows of 64 wake-ups at `each` ns of CPU a wake-up; the last cap.
    fn windows(c: &mut BackstopCap, k: u32, each: u64) -> u64 {
        let mut last = 0;
        for _ in 0..k {
            let cpu = c.cpu_ns.unwrap_or(0) + 64 * each;
            last = c.window_ended(Some(cpu), c.wakeups + 64, c.by_timer);
        }
        last
    }

    /// The backstop looks less often only where the thread's quiet wake-ups cost much: 1 ms
    /// up to 10 us of CPU a wake-up (real cores), 6 ms at 60 us (the bench's qemu TCG), never
    /// past 8 ms. Windows in which it handed requests over or spun to a due time say nothing
    /// of a wake-up's cost, nor does one after an unreadable CPU clock.
    #[test]
    fn the_backstops_longest_sleep_follows_the_cost_of_a_quiet_wake_up() {
        assert_eq!(windows(&mut cap(), 1, 8_000), BACKSTOP_MAX_NS);
        assert_eq!(windows(&mut cap(), 1, 60_000), 6_000_000);
        assert_eq!(windows(&mut cap(), 1, 500_000), BACKSTOP_CEIL_NS);
        // A window with a hand-over by the timer, or a spin, is not a wake-up's cost.
        let mut c = cap();
        assert_eq!(c.window_ended(Some(64 * 60_000), 64, 3), BACKSTOP_MAX_NS);
        c.spun();
        assert_eq!(
            c.window_ended(Some(2 * 64 * 60_000), 128, 3),
            BACKSTOP_MAX_NS
        );
        assert_eq!(c.window_ended(Some(3 * 64 * 60_000), 192, 3), 6_000_000);
        // An unreadable clock voids the window it ends and the one it starts.
        let mut c = cap();
        assert_eq!(c.window_ended(None, 64, 0), BACKSTOP_MAX_NS);
        assert_eq!(c.window_ended(Some(64 * 900_000), 128, 0), BACKSTOP_MAX_NS);
        assert_eq!(windows(&mut c, 1, 20_000), 2_000_000);
    }

    /// The least cost of a wake-up holds for two epochs of windows, then a dearer one (a node
    /// grown busier) takes over; an epoch with no clean window keeps the estimate.
    #[test]
    fn the_backstops_estimate_follows_a_node_that_gets_busier() {
        let mut c = cap();
        assert_eq!(windows(&mut c, 1, 20_000), 2_000_000);
        // Dearer windows: the cheap one stands until two epochs have passed.
        assert_eq!(windows(&mut c, BackstopCap::EPOCH, 60_000), 2_000_000);
        assert_eq!(windows(&mut c, BackstopCap::EPOCH, 60_000), 6_000_000);
        // An epoch and more in which the timer hands requests over in every window.
        for _ in 0..3 * BackstopCap::EPOCH {
            let cpu = c.cpu_ns.unwrap() + 64 * 1_000;
            let by_timer = c.by_timer + 1;
            assert_eq!(
                c.window_ended(Some(cpu), c.wakeups + 64, by_timer),
                6_000_000
            );
        }
    }
}

//! The delay line's timer thread: it hands requests over for programs that sleep
//! (completion channels, idle phases), and as a backstop for those whose own calls hand
//! them over ([`super::flusher`]), sleeping as long as it can: its sleep policy, its
//! wake-ups' cost and the backstop that follows it, its timer slack, and the bell a program
//! about to sleep on a completion rings.
use super::flusher::{self, ACTIVE_NS};
use crate::sys::clock::{self, now_units, units_to_ns};
use crate::sys::{say, threads};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::*};

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
    let mut by_program = flusher::BY_PROGRAM.load(Relaxed);
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
        let next = flusher::next_due();
        // Calm: the program's calls handed requests over within the grace, and this thread
        // did not have to since. Its sleeps then lengthen whether the line is empty or not:
        // between the messages of a busy-polling program the line empties and fills every
        // exchange, and 50 us looks at each cost a full node's ranks a fifth to two fifths of
        // a vCPU on the bench (~200 us of CPU a wake-up there).
        let calm = {
            let (handed, by_timer) = (
                flusher::BY_PROGRAM.load(Relaxed),
                flusher::BY_TIMER.load(Relaxed),
            );
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
            let line_taken = flusher::line_taken();
            if line_taken || now.saturating_sub(flusher::program_seen()) < active {
                // The program's calls hand requests over: a backstop only.
                let wake = next.saturating_add(backstop);
                if now >= wake && !line_taken {
                    flusher::flush(&flusher::BY_TIMER, Some(now));
                    backstop = least;
                    continue;
                }
                let handed = flusher::BY_PROGRAM.load(Relaxed);
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
                while now_units() < next && flusher::next_due() == next {
                    std::hint::spin_loop();
                }
                flusher::flush(&flusher::BY_TIMER, None);
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
            by_timer: flusher::BY_TIMER.load(Relaxed),
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
        Some(self.window_ended(thread_cpu_ns(), wakeups, flusher::BY_TIMER.load(Relaxed)))
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
    let slept = flusher::next_due() != u64::MAX || wait_for_the_bell(bell, ns);
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
    let slept = flusher::next_due() < next || wait_for_the_bell(bell, ns);
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
    if flusher::next_due() == u64::MAX {
        return;
    }
    if TIMER_GONE.load(SeqCst) {
        // Nobody else would hand the rest over while the program sleeps.
        while flusher::in_line() != 0 {
            flusher::flush(&flusher::BY_PROGRAM, None);
            std::hint::spin_loop();
        }
        return;
    }
    flusher::flush(&flusher::BY_PROGRAM, None);
    flusher::program_quiet();
    let next = flusher::next_due();
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

/// A fork child has no timer thread: its cost, bell and backstop are not the parent's.
pub fn forget_after_fork() {
    TIMER_CPU_CLOCK.store(-1, Relaxed);
    BACKSTOP_LONGEST_NS.store(BACKSTOP_MAX_NS, Relaxed);
    TIMER_WAKEUPS.store(0, Relaxed);
    RUNG.store(0, Relaxed);
    NAPPING.store(false, Relaxed);
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

//! Busy-waiting: on a calibrated TSC when the kernel or the CPU says it is constant, else on
//! the vDSO's CLOCK_MONOTONIC, or (`IBJITTER_UNIT=loops`) as raw loop iterations.
//! Never sleeps: a kernel trap makes microsecond sleeps unpredictable.
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

/// How [`wait`] interprets its argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WaitKind {
    /// TSC ticks.
    Tsc = 0,
    /// Nanoseconds of CLOCK_MONOTONIC.
    Monotonic = 1,
    /// Iterations of an uncalibrated spin loop (the research's unit).
    Loops = 2,
}

static KIND: AtomicU8 = AtomicU8::new(WaitKind::Monotonic as u8);
/// Whether the clock spins pause between reads (see [`choose_pause`]).
static PAUSE: AtomicBool = AtomicBool::new(false);
/// TSC ticks per ns, as f64 bits (0 when not calibrated).
static TSC_PER_NS: AtomicU64 = AtomicU64::new(0);

/// Selects how [`wait`] waits.
pub fn set_kind(kind: WaitKind) {
    KIND.store(kind as u8, Relaxed);
}

/// The current wait kind.
pub fn kind() -> WaitKind {
    match KIND.load(Relaxed) {
        0 => WaitKind::Tsc,
        1 => WaitKind::Monotonic,
        _ => WaitKind::Loops,
    }
}

/// TSC frequency in ticks per ns found by [`calibrate`], if any.
pub fn tsc_per_ns() -> Option<f64> {
    let v = f64::from_bits(TSC_PER_NS.load(Relaxed));
    (v > 0.0).then_some(v)
}

/// Waits `q` units of the current kind (ticks, ns or loops).
#[inline(always)]
pub fn wait(q: u64) {
    match (KIND.load(Relaxed), PAUSE.load(Relaxed)) {
        (0, false) => spin_tsc(q),
        (0, true) => spin_tsc_pausing(q),
        (1, false) => spin_monotonic(q),
        (1, true) => spin_monotonic_pausing(q),
        _ => spin_loops(q),
    }
}

/// Makes the clock spins pause between reads (or not). Loop-count waits never pause: a
/// pause would change what one loop is.
pub fn set_pause(on: bool) {
    PAUSE.store(on, Relaxed);
}

/// Whether the clock spins pause.
pub fn pausing() -> bool {
    PAUSE.load(Relaxed)
}

/// Whether the CPU says it runs under a hypervisor (CPUID.1:ECX bit 31): qemu TCG, KVM,
/// Xen, Hyper-V, cloud instances.
pub fn under_hypervisor() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 1 exists on every x86_64 CPU.
        let r = core::arch::x86_64::__cpuid(1);
        r.ecx & (1 << 31) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What one `pause` costs here, in ns: the least of a few timed batches (needs the TSC
/// calibrated; None otherwise).
pub fn pause_cost_ns() -> Option<f64> {
    let per_ns = tsc_per_ns()?;
    const BATCH: u64 = 200;
    let best = (0..5)
        .map(|_| {
            let t0 = rdtsc();
            for _ in 0..BATCH {
                core::hint::spin_loop();
            }
            rdtsc().wrapping_sub(t0)
        })
        .min()?;
    Some(best as f64 / per_ns / BATCH as f64)
}

/// `IBJITTER_SPIN=auto`: whether the clock spins should pause. A `pause` between clock reads
/// spares a hyperthread sibling and power, but where it traps it distorts: under qemu TCG
/// each one takes qemu's global lock (round trips grew by milliseconds), and a KVM guest's
/// pause loop may exit to the host (pause-loop exiting) and lose its CPU. So: never under a
/// hypervisor; on bare metal only if one pause costs at most 1/50 of the shortest non-zero
/// delay (the most a wait can overshoot by one pause). Returns the choice and why.
pub fn choose_pause(shortest_ns: Option<u64>) -> (bool, String) {
    if under_hypervisor() {
        return (false, "hypervisor".into());
    }
    match (pause_cost_ns(), shortest_ns) {
        (Some(cost), Some(d)) if cost * 50.0 <= d as f64 => (true, format!("{cost:.0} ns")),
        (Some(cost), _) => (false, format!("pause {cost:.0} ns")),
        (None, _) => (false, "no calibrated TSC".into()),
    }
}

/// Reads the TSC (0 on other architectures, where the TSC is never selected).
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// CLOCK_MONOTONIC in ns (through the vDSO: no syscall on the usual clocksources, `tsc` and
/// `kvm-clock`; a system call on those the vDSO cannot read, e.g. `hpet`, `acpi_pm`), or the
/// errno of a read that failed: a seccomp filter refusing `clock_gettime` where the vDSO falls
/// back to the system call, or an interposer's.
#[inline(always)]
pub fn read_monotonic() -> Result<u64, c_int> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        // SAFETY: errno is thread-local and always readable.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// A read of CLOCK_MONOTONIC failed: from then on every read is [`unreadable`]'s. And
/// whether that was said.
static UNREADABLE: AtomicBool = AtomicBool::new(false);
static UNREADABLE_SAID: AtomicBool = AtomicBool::new(false);
/// What the clock reads as once a read failed: past any reading of the real clock (2^62 ns,
/// 146 years of uptime), and 1 ms later at each read.
static UNREADABLE_NS: AtomicU64 = AtomicU64::new(1 << 62);

/// CLOCK_MONOTONIC in ns ([`read_monotonic`]). Once a read has failed (the first use then
/// found the clock readable: a process that could not read it passes through), every read
/// is [`unreadable`]'s: time jumps past every due time and then runs 1 ms a read, so each
/// wait timed on the clock ends within a few reads and nothing that compares readings waits
/// for ever (a read of 0, as before, left waits started after the failure spinning for good,
/// and the delay line's due times never came). Said once.
#[inline(always)]
pub fn monotonic_ns() -> u64 {
    match read_monotonic() {
        Ok(ns) if !UNREADABLE.load(Relaxed) => ns,
        r => unreadable(r.err()),
    }
}

/// A read of CLOCK_MONOTONIC after one failed (`errno`: this one's, if it failed).
#[cold]
#[inline(never)]
fn unreadable(errno: Option<c_int>) -> u64 {
    UNREADABLE.store(true, Relaxed);
    if !UNREADABLE_SAID.swap(true, Relaxed) {
        // Formatted on the stack: a post of a signal handler may read the clock, and must
        // not allocate.
        use std::io::Write;
        let mut buf = [0u8; 320];
        let mut out = &mut buf[..];
        let then = match kind() {
            WaitKind::Tsc => "the delays go on, timed on the TSC",
            WaitKind::Loops => "the delays go on, counted in loops",
            WaitKind::Monotonic => {
                "no further delay is waited; a delay line hands its requests over at once"
            }
        };
        let _ = write!(
            out,
            "CLOCK_MONOTONIC can no longer be read (clock_gettime failed, errno {}): what the \
             shim timed on it ends at once from now on ({then})",
            errno.unwrap_or(0)
        );
        let left = out.len();
        let len = buf.len() - left;
        super::say::warn(
            std::str::from_utf8(&buf[..len]).unwrap_or("CLOCK_MONOTONIC can no longer be read"),
        );
    }
    UNREADABLE_NS.fetch_add(1_000_000, Relaxed) + 1_000_000
}

// Two forms of each clock spin: without `pause` (under qemu TCG every `pause` leaves the
// translated code and takes qemu's global lock, which stalled the other vCPU and the virtual
// NIC: round trips grew by milliseconds instead of the injected delay) and with it, where
// [`choose_pause`] finds it harmless.

#[inline(always)]
fn spin_tsc(ticks: u64) {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < ticks {}
}

#[inline(always)]
fn spin_tsc_pausing(ticks: u64) {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < ticks {
        core::hint::spin_loop();
    }
}

#[inline(always)]
fn spin_monotonic_pausing(ns: u64) {
    let start = monotonic_ns();
    while monotonic_ns().wrapping_sub(start) < ns {
        core::hint::spin_loop();
    }
}

#[inline(always)]
fn spin_monotonic(ns: u64) {
    let start = monotonic_ns();
    while monotonic_ns().wrapping_sub(start) < ns {}
}

#[inline(never)]
fn spin_loops(n: u64) {
    let mut i = 0u64;
    while i < n {
        // black_box keeps the compiler from folding the loop away; no pause, as in a plain
        // C `for` loop.
        i = std::hint::black_box(i) + 1;
    }
}

/// Whether the TSC can stand in for CLOCK_MONOTONIC: the kernel uses it as its clocksource,
/// or the CPU declares it constant and non-stop and the kernel has not rejected it.
pub fn tsc_trusted() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let dir = "/sys/devices/system/clocksource/clocksource0";
    let current = std::fs::read_to_string(format!("{dir}/current_clocksource")).unwrap_or_default();
    let available = std::fs::read_to_string(format!("{dir}/available_clocksource")).ok();
    tsc_trusted_by(&current, available.as_deref(), cpu_flags().as_deref())
}

/// The `flags` line of /proc/cpuinfo.
fn cpu_flags() -> Option<String> {
    use std::io::BufRead;
    let f = std::fs::File::open("/proc/cpuinfo").ok()?;
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("flags"))
}

/// [`tsc_trusted`] from what the kernel and the CPU say. A TSC the kernel marked unstable
/// (its clocksource watchdog saw it drift, or `tsc=unstable`: CPUs whose TSCs are not in
/// step, on large multi-socket machines) leaves `available_clocksource`, while the CPU's
/// flags stay: waits timed on it would end early on a thread that migrates to a CPU whose
/// TSC is behind, and the line's due times would be compared across CPUs out of step.
fn tsc_trusted_by(current: &str, available: Option<&str>, flags: Option<&str>) -> bool {
    if current.trim() == "tsc" {
        return true;
    }
    if available.is_some_and(|a| !a.split_whitespace().any(|c| c == "tsc")) {
        return false;
    }
    flags.is_some_and(|line| {
        let has = |flag: &str| line.split_whitespace().any(|w| w == flag);
        has("constant_tsc") && has("nonstop_tsc")
    })
}

/// The caller found CLOCK_MONOTONIC unreadable and said so (the first use, which then
/// passes through): every later read is [`unreadable`]'s, unsaid.
pub fn unreadable_from_now() {
    UNREADABLE_SAID.store(true, Relaxed);
    UNREADABLE.store(true, Relaxed);
}

/// One (tsc, ns) pair, bracketed by two TSC reads; the tightest of a few tries. None if a
/// read of the clock failed.
fn pair() -> Option<(f64, u64)> {
    let mut best = (u64::MAX, 0.0, 0);
    for _ in 0..7 {
        let a = rdtsc();
        let ns = read_monotonic().ok()?;
        let b = rdtsc();
        let width = b.wrapping_sub(a);
        if width < best.0 {
            best = (width, a as f64 + width as f64 / 2.0, ns);
        }
    }
    Some((best.1, best.2))
}

/// The most TSC ticks per ns [`calibrate`] believes.
const TSC_PER_NS_MAX: f64 = 20.0;
/// The most clock reads [`calibrate`] spins for (250 us is ~12,000 reads of the vDSO's
/// clock here, a few hundred under an emulated CPU).
const CALIBRATION_READS: u32 = 1 << 20;

/// Measures TSC ticks per ns against CLOCK_MONOTONIC over `span_ns` of busy time, stores
/// and returns it; None if the result is implausible, a read of the clock failed, or the
/// clock did not advance by `span_ns` within [`CALIBRATION_READS`] reads and the TSC ticks
/// of `span_ns` at [`TSC_PER_NS_MAX`] (a clock that stands still: it spun for ever at
/// every device open); the caller then keeps Monotonic.
pub fn calibrate(span_ns: u64) -> Option<f64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let (t0, n0) = pair()?;
    let ticks_max = span_ns as f64 * TSC_PER_NS_MAX;
    // No pause in this spin either (see the spins above): it runs in every process at load.
    let mut reads = 0u32;
    while read_monotonic().ok()?.wrapping_sub(n0) < span_ns {
        reads += 1;
        if reads >= CALIBRATION_READS || rdtsc() as f64 - t0 > ticks_max {
            // The ticks' bound may trip because this thread was preempted between a read of
            // the clock and the TSC's (milliseconds on a busy node): a clock that advanced
            // meanwhile is not one that stands still.
            if read_monotonic().ok()?.wrapping_sub(n0) >= span_ns {
                break;
            }
            return None;
        }
    }
    let (t1, n1) = pair()?;
    let f = (t1 - t0) / n1.checked_sub(n0).filter(|&d| d > 0)? as f64;
    if !(0.05..=TSC_PER_NS_MAX).contains(&f) {
        return None;
    }
    TSC_PER_NS.store(f.to_bits(), Relaxed);
    Some(f)
}

/// Now in wait units of the current kind (TSC ticks, else ns): the clock the delay line and
/// the completion rings keep due times in.
#[inline]
pub fn now_units() -> u64 {
    if kind() == WaitKind::Tsc {
        rdtsc()
    } else {
        monotonic_ns()
    }
}

/// Wait units of the current kind back to ns.
pub fn units_to_ns(u: u64) -> u64 {
    match (kind(), tsc_per_ns()) {
        (WaitKind::Tsc, Some(f)) => (u as f64 / f) as u64,
        _ => u,
    }
}

/// Converts ns to wait units of `kind` (ns → TSC ticks, rounded; otherwise unchanged).
pub fn ns_to_units(ns: u64, kind: WaitKind) -> u64 {
    match (kind, tsc_per_ns()) {
        (WaitKind::Tsc, Some(f)) => (ns as f64 * f).round() as u64,
        _ => ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tsc_the_kernel_rejected_is_not_trusted() {
        let flags = Some("flags\t\t: fpu tsc constant_tsc nonstop_tsc rdtscp");
        assert!(tsc_trusted_by("tsc\n", Some("tsc hpet\n"), None));
        // A guest on kvm-clock with a stable TSC (the bench's).
        assert!(tsc_trusted_by(
            "kvm-clock\n",
            Some("kvm-clock tsc acpi_pm\n"),
            flags
        ));
        // Marked unstable: gone from the available clocksources, the flags unchanged.
        assert!(!tsc_trusted_by("hpet\n", Some("hpet acpi_pm\n"), flags));
        // No sysfs (a container without it): the flags decide.
        assert!(tsc_trusted_by("", None, flags));
        assert!(!tsc_trusted_by("", None, Some("flags : fpu tsc")));
    }
}

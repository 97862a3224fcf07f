//! The clock the injector waits on: an invariant TSC, its calibration against
//! CLOCK_MONOTONIC, and how far a busy-wait of 1, 10 and 100 µs overshoots on this CPU,
//! measured with the injector's own method (spin on rdtsc until the calibrated tick count).
use super::verdict::{Check, Verdict};
use serde_json::json;

const GROUP: &str = "clock";
/// The waits measured, ns, and how many of each.
const WAITS: [(u64, usize); 3] = [(1_000, 2000), (10_000, 1000), (100_000, 200)];

pub fn check() -> Vec<Check> {
    let flags = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| cpu_flags(&t))
        .unwrap_or_default();
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
    let available = std::fs::read_to_string(
        "/sys/devices/system/clocksource/clocksource0/available_clocksource",
    )
    .ok();
    let mut out = vec![tsc_check(
        cfg!(target_arch = "x86_64"),
        &flags,
        &source,
        available.as_deref(),
    )];
    match calibrate() {
        Some(rates) => {
            out.push(calibration_check(&rates));
            let per_ns = rates.iter().sum::<f64>() / rates.len() as f64;
            for (target, n) in WAITS {
                let mut errors = measure_waits(per_ns, target, n);
                out.push(busy_wait_check(target, &mut errors));
            }
        }
        None => out.push(
            Check::new(GROUP, "calibration", Verdict::Warn)
                .detail("no TSC on this architecture: the injector waits on CLOCK_MONOTONIC"),
        ),
    }
    out
}

/// The `flags` line of /proc/cpuinfo (its first CPU's).
pub fn cpu_flags(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.trim().to_string())
}

/// An invariant TSC is what lets the injector spin on rdtsc: `constant_tsc` (fixed rate) and
/// `nonstop_tsc` (runs in deep C-states). Without it the injector waits on CLOCK_MONOTONIC
/// (vDSO), which is slower to read but still correct. A TSC the kernel marked unstable has
/// left its available clocksources (`available`, when sysfs says): the injector does not use
/// it either.
pub fn tsc_check(x86: bool, flags: &str, clocksource: &str, available: Option<&str>) -> Check {
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    let data = json!({
        "constant_tsc": has("constant_tsc"), "nonstop_tsc": has("nonstop_tsc"),
        "hypervisor": has("hypervisor"), "clocksource": clocksource,
    });
    let c = Check::new(GROUP, "TSC", Verdict::Ok).data(data);
    let src = if clocksource.is_empty() {
        String::from("clocksource unknown")
    } else {
        format!("clocksource {clocksource}")
    };
    let vm = if has("hypervisor") {
        ", under a hypervisor"
    } else {
        ""
    };
    if !x86 {
        return c.verdict(Verdict::Warn).detail(format!(
            "not x86_64: the injector waits on CLOCK_MONOTONIC ({src})"
        ));
    }
    if !(has("constant_tsc") && has("nonstop_tsc")) {
        return c
            .verdict(Verdict::Warn)
            .detail(format!(
                "no invariant TSC (constant_tsc and nonstop_tsc not both set){vm}; {src}: \
                 the injector waits on CLOCK_MONOTONIC"
            ))
            .advice("delays stay correct but each clock read costs more; prefer bare-metal nodes");
    }
    if clocksource != "tsc" && available.is_some_and(|a| !a.split_whitespace().any(|c| c == "tsc"))
    {
        return c
            .verdict(Verdict::Warn)
            .detail(format!(
                "invariant TSC{vm}, but the kernel rejected it ({src}; tsc is not among its \
                 available clocksources: marked unstable): the injector waits on \
                 CLOCK_MONOTONIC"
            ))
            .advice(
                "check `dmesg | grep -i tsc`: CPUs whose TSCs are out of step make waits \
                 timed on the TSC wrong on a thread that migrates",
            );
    }
    if clocksource != "tsc" {
        return c
            .verdict(Verdict::Warn)
            .detail(format!(
                "invariant TSC{vm}, but the kernel's {src} (it distrusts the TSC or \
                 prefers the hypervisor's clock)"
            ))
            .advice("check `dmesg | grep -i tsc`; the injector calibrates the TSC itself");
    }
    c.detail(format!(
        "invariant TSC (constant_tsc, nonstop_tsc){vm}, {src}"
    ))
}

/// TSC ticks per ns over three 20 ms windows of CLOCK_MONOTONIC (None without a TSC).
fn calibrate() -> Option<Vec<f64>> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let rates = (0..3)
        .map(|_| {
            let (t0, m0) = (rdtsc(), monotonic_ns());
            while monotonic_ns() - m0 < 20_000_000 {}
            let (t1, m1) = (rdtsc(), monotonic_ns());
            t1.wrapping_sub(t0) as f64 / (m1 - m0) as f64
        })
        .collect();
    Some(rates)
}

/// The TSC's rate must agree with CLOCK_MONOTONIC from window to window: a spread above
/// 0.1 % would make a 1 ms delay drift by more than 1 µs.
pub fn calibration_check(rates: &[f64]) -> Check {
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let (lo, hi) = rates
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), r| (l.min(*r), h.max(*r)));
    let spread = if mean > 0.0 { (hi - lo) / mean } else { 1.0 };
    let c = Check::new(GROUP, "calibration", Verdict::Ok)
        .detail(format!(
            "TSC {:.3} GHz against CLOCK_MONOTONIC, windows agree within {:.4} %",
            mean,
            spread * 100.0
        ))
        .data(json!({ "ghz": mean, "windows_ghz": rates, "spread": spread }));
    if spread > 0.001 || mean <= 0.0 {
        c.verdict(Verdict::Warn)
            .advice("the TSC rate wandered between windows (frequency scaling without an invariant TSC, or a busy host): delays will drift")
    } else {
        c
    }
}

/// How much each of `n` busy-waits of `target_ns` overshot, ns (spin on rdtsc for the
/// calibrated tick count, timed by CLOCK_MONOTONIC around it).
fn measure_waits(ticks_per_ns: f64, target_ns: u64, n: usize) -> Vec<f64> {
    let ticks = (target_ns as f64 * ticks_per_ns) as u64;
    (0..n)
        .map(|_| {
            let m0 = monotonic_ns();
            let t0 = rdtsc();
            while rdtsc().wrapping_sub(t0) < ticks {}
            let m1 = monotonic_ns();
            (m1 - m0) as f64 - target_ns as f64
        })
        .collect()
}

/// The `q` quantile of sorted values (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// A busy-wait's overshoot: the typical wait (p50) should be within 0.3 µs + 5 % of the
/// target, and the 99th percentile within 5 µs + 50 % (beyond: preemption, SMT siblings or a
/// hypervisor stealing the CPU; delays then come out longer than drawn, now and then).
pub fn busy_wait_check(target_ns: u64, errors: &mut [f64]) -> Check {
    errors.sort_by(f64::total_cmp);
    let (p50, p99) = (quantile(errors, 0.5), quantile(errors, 0.99));
    let t = target_ns as f64;
    let name = format!("busy-wait {} us", target_ns / 1000);
    let detail = format!(
        "overshoot p50 {:.3} us, p99 {:.3} us over {} waits",
        p50 / 1e3,
        p99 / 1e3,
        errors.len()
    );
    let c = Check::new(GROUP, name, Verdict::Ok)
        .detail(detail)
        .data(json!({ "target_ns": target_ns, "p50_error_ns": p50, "p99_error_ns": p99, "waits": errors.len() }));
    if p50 > 300.0 + 0.05 * t {
        c.verdict(Verdict::Warn).advice(
            "the typical wait overshoots: reading the clock is slow here (a VM?); \
             delays this short come out longer than asked",
        )
    } else if p99 > 5_000.0 + 0.5 * t {
        c.verdict(Verdict::Warn).advice(
            "rare long overshoots: the CPU was taken away (pin the job's ranks, keep \
             SMT siblings and other jobs off their cores)",
        )
    } else {
        c
    }
}

fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invariant_tsc_needs_both_flags_and_the_kernel_on_it() {
        let both = "fpu tsc constant_tsc nonstop_tsc rdtscp";
        assert_eq!(tsc_check(true, both, "tsc", None).verdict, Verdict::Ok);
        let one = tsc_check(true, "fpu tsc constant_tsc", "tsc", None);
        assert_eq!(one.verdict, Verdict::Warn);
        assert!(one.detail.contains("CLOCK_MONOTONIC"), "{}", one.detail);
        let vm = tsc_check(
            true,
            &format!("{both} hypervisor"),
            "kvm-clock",
            Some("kvm-clock tsc"),
        );
        assert_eq!(vm.verdict, Verdict::Warn);
        assert!(vm.detail.contains("kvm-clock"), "{}", vm.detail);
        assert!(!vm.detail.contains("rejected"), "{}", vm.detail);
        // Marked unstable: out of the available clocksources, the flags unchanged.
        let unstable = tsc_check(true, both, "hpet", Some("hpet acpi_pm\n"));
        assert_eq!(unstable.verdict, Verdict::Warn);
        assert!(
            unstable.detail.contains("rejected") && unstable.detail.contains("CLOCK_MONOTONIC"),
            "{}",
            unstable.detail
        );
        // "constant_tsc" must be a whole word, not a part of another flag.
        assert_eq!(
            tsc_check(true, "xconstant_tsc nonstop_tsc", "tsc", None).verdict,
            Verdict::Warn
        );
        assert_eq!(
            tsc_check(false, both, "arch_sys_counter", None).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn the_flags_line_of_cpuinfo_is_found() {
        let t = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu tsc constant_tsc\nbugs\t: x\n";
        assert_eq!(cpu_flags(t).as_deref(), Some("fpu tsc constant_tsc"));
        assert_eq!(cpu_flags("processor: 0\n"), None);
    }

    #[test]
    fn calibration_windows_must_agree_within_a_thousandth() {
        assert_eq!(
            calibration_check(&[2.0, 2.0005, 2.001]).verdict,
            Verdict::Ok
        );
        assert_eq!(calibration_check(&[2.0, 2.01, 2.0]).verdict, Verdict::Warn);
    }

    #[test]
    fn busy_wait_verdicts_follow_p50_and_p99() {
        let mut good: Vec<f64> = (0..100).map(|i| 50.0 + i as f64).collect();
        assert_eq!(busy_wait_check(10_000, &mut good).verdict, Verdict::Ok);
        // Typical overshoot 1 µs on a 10 µs wait: over 0.3 + 0.5 µs.
        let mut slow = vec![1_000.0; 100];
        assert_eq!(busy_wait_check(10_000, &mut slow).verdict, Verdict::Warn);
        // Typical fine, 2 % of the waits 20 µs late: the p99 says so.
        let mut tail: Vec<f64> = (0..100)
            .map(|i| if i < 98 { 50.0 } else { 20_000.0 })
            .collect();
        let c = busy_wait_check(10_000, &mut tail);
        assert_eq!(c.verdict, Verdict::Warn);
        assert!(c.advice.contains("pin"), "{}", c.advice);
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v[..1], 0.99), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}

//! The senders' wall clocks against each other. Every sender of a step starts at one barrier
//! and ends within the step, so their reported starts lie within the step's length of each
//! other (as timed here, plus [`SLACK`] for clocks that agree only as well as NTP keeps them),
//! and none ran longer than that. A start further from the others' is its host's clock being
//! off, not when it ran: the merge places such a sender at the others' start instead of padding
//! every series by the skew, and says so.
use std::time::Duration;

/// How far the hosts' clocks may disagree on top of the step's own length.
pub const SLACK: Duration = Duration::from_secs(1);

pub struct Clocks {
    /// The senders' median start (of the middle two, the one nearer this machine's clock at
    /// launch): where the others' clocks agree.
    pub reference_unix_ns: u64,
    /// The step's length as timed here, plus [`SLACK`]: no honest start is further from the
    /// reference, and no sender ran longer.
    pub bound_ns: u64,
    /// Per sender: how far its start is from the reference (ns; negative: behind) where that
    /// is more than `bound_ns`; `None` where it is not, or the sender sent no report.
    pub skews: Vec<Option<i128>>,
}

impl Clocks {
    /// The clocks of senders that started at `starts` (their reports' `start_unix_ns`; `None`
    /// where a sender sent no report), in a step launched at `launch_unix_ns` (this machine's
    /// clock) that lasted `step`.
    pub fn of(starts: &[Option<u64>], launch_unix_ns: u64, step: Duration) -> Clocks {
        let bound_ns = u64::try_from(step.saturating_add(SLACK).as_nanos()).unwrap_or(u64::MAX);
        let mut sorted: Vec<u64> = starts.iter().flatten().copied().collect();
        sorted.sort_unstable();
        let n = sorted.len();
        let reference_unix_ns = match n {
            0 => launch_unix_ns,
            _ if n % 2 == 1 => sorted[n / 2],
            // Of the middle two (two senders a day apart), the one agreeing with this machine.
            _ => {
                let (a, b) = (sorted[n / 2 - 1], sorted[n / 2]);
                if a.abs_diff(launch_unix_ns) <= b.abs_diff(launch_unix_ns) {
                    a
                } else {
                    b
                }
            }
        };
        let skews = starts
            .iter()
            .map(|s| {
                let skew = i128::from((*s)?) - i128::from(reference_unix_ns);
                (skew.unsigned_abs() > u128::from(bound_ns)).then_some(skew)
            })
            .collect();
        Clocks {
            reference_unix_ns,
            bound_ns,
            skews,
        }
    }

    /// Where sender `k`, which says it started at `start_unix_ns`, started on the common time
    /// axis: there, or at the reference where its clock is off.
    pub fn start_of(&self, k: usize, start_unix_ns: u64) -> u64 {
        match self.skews.get(k) {
            Some(Some(_)) => self.reference_unix_ns,
            _ => start_unix_ns,
        }
    }

    /// The longest a sender can have run, in seconds.
    pub fn bound_s(&self) -> f64 {
        self.bound_ns as f64 / 1e9
    }

    /// What is said of sender `k`'s clock, if it is off.
    pub fn off(&self, k: usize) -> Option<String> {
        let skew = self.skews.get(k).copied().flatten()?;
        Some(format!(
            "its clock is {:.3} s {} the other senders' (beyond the {:.1} s this step allows): \
             its figures are placed at their start",
            skew.unsigned_abs() as f64 / 1e9,
            if skew < 0 { "behind" } else { "ahead of" },
            self.bound_s()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(starts: &[u64], launch: u64, step_s: u64) -> Clocks {
        let starts: Vec<Option<u64>> = starts.iter().copied().map(Some).collect();
        Clocks::of(&starts, launch, Duration::from_secs(step_s))
    }

    const DAY: u64 = 86_400_000_000_000;
    const T: u64 = 1_700_000_000_000_000_000;

    #[test]
    fn a_start_beyond_the_step_is_a_clock_off_by_that_much() {
        let c = starts(&[T, T + 2_000_000, T - DAY], T - 5, 10);
        assert_eq!(c.reference_unix_ns, T);
        assert_eq!(c.skews, [None, None, Some(-i128::from(DAY))]);
        assert!(c
            .off(2)
            .unwrap()
            .starts_with("its clock is 86400.000 s behind"));
        assert_eq!(c.off(0), None);
        // Within the step and its slack: not said.
        let c = starts(&[T, T + 10_900_000_000], T, 10);
        assert_eq!(c.skews, [None, None]);
    }

    #[test]
    fn of_two_senders_the_one_agreeing_with_this_machine_is_right() {
        let c = starts(&[T - DAY, T], T - 1_000, 10);
        assert_eq!(c.reference_unix_ns, T);
        assert_eq!(c.skews, [Some(-i128::from(DAY)), None]);
        let c = starts(&[T, T + DAY], T - 1_000, 10);
        assert_eq!(c.skews, [None, Some(i128::from(DAY))]);
        // No report: nothing said; clocks at their extremes.
        let c = Clocks::of(&[None, Some(T)], T, Duration::ZERO);
        assert_eq!(c.skews, [None, None]);
        let c = starts(&[0, u64::MAX], T, 10);
        assert_eq!(c.skews, [None, Some(i128::from(u64::MAX))]);
    }
}

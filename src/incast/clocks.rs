//! The senders' wall clocks against each other. Every sender of a step starts at one barrier
//! and ends within the step, so their reported starts lie within the step's length of each
//! other (as timed here, plus [`SLACK`] for clocks that agree only as well as NTP keeps them),
//! and none ran longer than that. A start further from the others' is its host's clock being
//! off, not when it ran: the merge places such a sender at the others' start instead of padding
//! every series by the skew, and says so. Where they agree, they must also agree with this
//! machine: they started after the step was launched here and before it ended. Clocks off alike
//! (a lone sender's, or every one's) agree with each other but not with that; only the launch to
//! the first byte depends on this machine's clock, and it is then unknown.
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
    /// How far the reference is outside the step as timed here (ns; negative: before its
    /// launch, positive: past its end) where it is more than [`SLACK`] outside: the senders'
    /// clocks are off alike by at least that much. `None` where it is within.
    pub common_skew: Option<i128>,
}

impl Clocks {
    /// The clocks of senders that started at `starts` (their reports' `start_unix_ns`; `None`
    /// where a sender sent no report), in a step launched at `launch_unix_ns` (this machine's
    /// clock) that lasted `step`.
    pub fn of(starts: &[Option<u64>], launch_unix_ns: u64, step: Duration) -> Clocks {
        let step_ns = i128::try_from(step.as_nanos()).unwrap_or(i128::MAX);
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
        // No honest start is before the launch or past the step's end, as timed here.
        let (reference, launch) = (i128::from(reference_unix_ns), i128::from(launch_unix_ns));
        let slack = SLACK.as_nanos() as i128;
        let common_skew = if reference < launch - slack {
            Some(reference - launch)
        } else if reference > launch.saturating_add(step_ns).saturating_add(slack) {
            Some(reference - launch - step_ns)
        } else {
            None
        };
        Clocks {
            reference_unix_ns,
            bound_ns,
            skews,
            common_skew,
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

    /// What is said of the senders' clocks against this machine's, if they are off alike.
    pub fn common_off(&self) -> Option<String> {
        let skew = self.common_skew?;
        Some(format!(
            "the senders' clocks are at least {:.3} s {} this machine's (they say they started \
             {}, beyond the {:.1} s clocks may disagree): the launch to the first byte is \
             unknown",
            skew.unsigned_abs() as f64 / 1e9,
            if skew < 0 { "behind" } else { "ahead of" },
            if skew < 0 {
                "before the step was launched here"
            } else {
                "after the step ended here"
            },
            SLACK.as_secs_f64()
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

    #[test]
    fn clocks_off_alike_are_off_against_this_machines_launch() {
        // A lone sender a day behind, and three that agree a day ahead of the step's end.
        let c = starts(&[T - DAY], T, 10);
        assert_eq!(
            (c.skews.as_slice(), c.common_skew),
            (&[None][..], Some(-i128::from(DAY)))
        );
        assert!(c
            .common_off()
            .unwrap()
            .starts_with("the senders' clocks are at least 86400.000 s behind"));
        let c = starts(&[T + DAY - 5, T + DAY, T + DAY + 9], T - 10_000_000_000, 10);
        assert_eq!(c.common_skew, Some(i128::from(DAY)));
        assert!(c.common_off().unwrap().contains("86400.000 s ahead of"));
        // Within the step and its slack either side: not said; nor without a report.
        for start in [T - 900_000_000, T + 10_900_000_000] {
            assert_eq!(starts(&[start], T, 10).common_skew, None);
        }
        assert_eq!(Clocks::of(&[None], T, Duration::ZERO).common_off(), None);
        assert_eq!(
            starts(&[u64::MAX], 0, 0).common_skew,
            Some(i128::from(u64::MAX))
        );
    }
}

//! `IBJITTER_EPISODES_SYNC=1`: one schedule of calm and congested states on the wall clock,
//! the same in every process with the same seed and means, whenever it started.
//!
//! The schedule is the two-state Markov process of today's episodes (exponential dwells of
//! the asked means) as a pure function of (seed, means, wall-clock time), so that no process
//! has to walk it from a common start. Time is ns since the Unix epoch modulo 2^63 (the root
//! interval, 1970 to 2262; times outside it wrap). The state at the root's two ends is drawn
//! (the first from the stationary law, the second given the first); then the interval holding
//! `t` is halved level by level, each midpoint's state drawn given its two ends (the Markov
//! bridge), down to a leaf a few mean dwells long; inside the leaf the path is drawn forward
//! from its start and kept only if it ends in the leaf's end state (rejection: about 2 tries).
//! Each node draws from its own PCG stream of the seed (keyed by the node's number), so every
//! process that asks about the same moment draws the same numbers. Cost of one look-up: at
//! most 63 bridge draws and a leaf of a few dwells, a few microseconds, whatever the date.
use crate::sys::rng;
use rand_core::Rng;
use rand_pcg::Pcg32;

/// The salt of the shared schedule's streams ("epsy"): node k draws from stream
/// (seed, SALT ^ k); node 0 draws the root's two end states, node 1 is the root, node k's
/// halves are 2k and 2k + 1.
const SHARED_SALT: u64 = 0x6570_7379 << 32;

/// The root interval's length: the schedule repeats after 2^63 ns (292 years).
const ROOT_BITS: u32 = 63;

/// Forward paths tried in a leaf before keeping one that ends in the wrong state (an
/// extra change at the leaf's end). About 2 are needed on average (see [`Schedule::new`]).
const MAX_TRIES: u32 = 1000;

/// The shared schedule for one seed and pair of mean dwells.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    seed: u64,
    /// The mean dwells (ns), calm then congested.
    mean: [f64; 2],
    /// The rate of leaving either state, summed (per ns).
    total: f64,
    /// The stationary probability of being congested.
    congested_share: f64,
    /// Leaves are 2^leaf_bits ns long.
    leaf_bits: u32,
}

/// A state and when it may change next: what [`Schedule::at`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub congested: bool,
    /// The next time (ns since the epoch) the state may change: a change, the end of the
    /// leaf or the end of the root interval (then the state may stay as it is).
    pub next: i128,
}

impl Schedule {
    /// The schedule of mean dwells `calm` and `congested` (ns, at least 1) for `seed`.
    ///
    /// A leaf holds at least K = 2 + ln(1 / smaller stationary share) mean times of the
    /// total rate: then a leaf's end state, drawn given a later state, is close enough to its
    /// law given the leaf's start alone that the forward draw matches it in ~2 tries.
    pub fn new(seed: u64, calm: u64, congested: u64) -> Schedule {
        let mean = [calm.max(1) as f64, congested.max(1) as f64];
        let leave = [1.0 / mean[0], 1.0 / mean[1]];
        let total = leave[0] + leave[1];
        let congested_share = leave[0] / total;
        let smaller = congested_share
            .min(1.0 - congested_share)
            .max(f64::MIN_POSITIVE);
        let k = 2.0 - smaller.ln();
        let leaf_bits = (k / total).log2().ceil().clamp(0.0, ROOT_BITS as f64) as u32;
        Schedule {
            seed,
            mean,
            total,
            congested_share,
            leaf_bits,
        }
    }

    /// How many bridge levels a look-up descends (at most 63).
    pub fn depth(&self) -> u32 {
        ROOT_BITS - self.leaf_bits
    }

    /// The state at wall-clock time `t` (ns since the Unix epoch, before it too) and when
    /// it may change next (always after `t`).
    pub fn at(&self, t: i128) -> Now {
        let root = 1i128 << ROOT_BITS;
        let tau = t.rem_euclid(root) as u64;
        let base = t - tau as i128;
        let mut r = self.node(0);
        let mut start_state = uniform(&mut r) < self.congested_share;
        let mut end_state = uniform(&mut r) < self.p_congested_after(start_state, root as f64);
        let (mut start, mut id) = (0u64, 1u64);
        for level in 0..self.depth() {
            let half = 1u64 << (ROOT_BITS - 1 - level);
            let mid_state = self.bridge(&mut self.node(id), start_state, end_state, half as f64);
            if tau < start + half {
                end_state = mid_state;
                id *= 2;
            } else {
                start += half;
                start_state = mid_state;
                id = 2 * id + 1;
            }
        }
        let leaf_len = 1u64 << self.leaf_bits;
        let (congested, next) = self.leaf(id, start_state, end_state, leaf_len, tau - start);
        Now {
            congested,
            next: base + (start as i128) + next.map_or(leaf_len as i128, |n| n as i128),
        }
    }

    /// The stream of node `id`.
    fn node(&self, id: u64) -> Pcg32 {
        rng::stream(self.seed, SHARED_SALT ^ id, 0)
    }

    /// P(congested at +len | `from` now).
    fn p_congested_after(&self, from: bool, len: f64) -> f64 {
        let mixed = -(-self.total * len).exp_m1();
        if from {
            1.0 - (1.0 - self.congested_share) * mixed
        } else {
            self.congested_share * mixed
        }
    }

    /// P(state `to` at +len | `from` now).
    fn p(&self, from: bool, to: bool, len: f64) -> f64 {
        let c = self.p_congested_after(from, len);
        if to {
            c
        } else {
            1.0 - c
        }
    }

    /// The state half-way (`half` ns) between `from` and `to` (2 `half` apart).
    fn bridge(&self, r: &mut Pcg32, from: bool, to: bool, half: f64) -> bool {
        let calm = self.p(from, false, half) * self.p(false, to, half);
        let congested = self.p(from, true, half) * self.p(true, to, half);
        let sum = calm + congested;
        let p = if sum > 0.0 { congested / sum } else { 0.5 };
        uniform(r) < p
    }

    /// Leaf `id`, `len` ns from state `from` to state `to`: the state at `offset` in it and
    /// the offset of the first change after it (None: none in this leaf).
    fn leaf(&self, id: u64, from: bool, to: bool, len: u64, offset: u64) -> (bool, Option<u64>) {
        let mut r = self.node(id);
        let mut last = (from, None);
        for _ in 0..MAX_TRIES {
            let (mut state, mut at) = (from, 0f64);
            let (mut state_at_offset, mut next) = (from, None);
            loop {
                // Exponential: -mean ln(1 - u), u uniform in [0, 1) (as per-process episodes).
                at += -self.mean[state as usize] * (1.0 - uniform(&mut r)).ln();
                if at >= len as f64 {
                    break;
                }
                state = !state;
                let change = at as u64;
                if change <= offset {
                    state_at_offset = state;
                } else if next.is_none() {
                    next = Some(change);
                }
            }
            last = (state_at_offset, next);
            if state == to {
                break;
            }
        }
        last
    }
}

/// Uniform in [0, 1), 53 bits.
fn uniform(r: &mut Pcg32) -> f64 {
    (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const HOUR: u64 = 3_600_000_000_000;
    /// 2026-01-01T00:00:00Z in ns.
    const Y2026: i128 = 1_767_225_600_000_000_000;

    /// The (state, length) of the whole dwells from `t0` for `span` ns (the first one
    /// began before `t0`: left out).
    fn dwells(s: &Schedule, t0: i128, span: i128) -> Vec<(bool, i128)> {
        let (mut t, mut out) = (t0, Vec::new());
        let (mut state, mut since) = (s.at(t0).congested, None);
        while t < t0 + span {
            let now = s.at(t);
            if now.congested != state {
                if let Some(since) = since {
                    out.push((state, t - since));
                }
                (state, since) = (now.congested, Some(t));
            }
            assert!(now.next > t, "{t}: next {}", now.next);
            t = now.next;
        }
        out
    }

    #[test]
    fn dwells_have_the_asked_exponential_means() {
        for (calm, congested) in [(20 * MS, 20 * MS), (50 * MS, 10 * MS), (1_000, 300_000)] {
            let s = Schedule::new(7, calm, congested);
            let span = 25_000 * (calm + congested) as i128;
            let d = dwells(&s, Y2026, span);
            for (state, mean) in [(false, calm), (true, congested)] {
                let v: Vec<f64> = d
                    .iter()
                    .filter(|x| x.0 == state)
                    .map(|x| x.1 as f64)
                    .collect();
                let n = v.len() as f64;
                let m = v.iter().sum::<f64>() / n;
                // About 25,000 dwells: the mean's sd is 0.6 % of it; the share longer than
                // the mean is e^-1 = 0.368 for an exponential (sd 0.003).
                let longer = v.iter().filter(|&&x| x > mean as f64).count() as f64 / n;
                eprintln!(
                    "means {calm}/{congested} ns, state {state}: {n} dwells, mean {m:.0} ns, \
                     {longer:.3} longer than asked"
                );
                assert!(n > 20_000.0, "{n}");
                assert!((m / mean as f64 - 1.0).abs() < 0.03, "{m} vs {mean}");
                assert!((longer - (-1f64).exp()).abs() < 0.015, "{longer}");
            }
        }
    }

    /// The law of the states at random moments, and of pairs of states Δ apart, is the
    /// Markov process's: congested 1/6 of the time for 50 ms / 10 ms means, the same state
    /// after Δ with probability Σ π_i (π_i + (1 - π_i) e^(-λΔ)), wherever leaves and bridge
    /// levels fall.
    #[test]
    fn states_at_random_moments_follow_the_markov_law() {
        let s = Schedule::new(11, 50 * MS, 10 * MS);
        let (congested_share, rate) = (
            1.0 / 6.0,
            1.0 / (50.0 * MS as f64) + 1.0 / (10.0 * MS as f64),
        );
        let mut r = rng::stream(99, 1, 0);
        let n = 20_000;
        for lag in [MS / 10, 5 * MS, 20 * MS, 100 * MS] {
            let (mut congested, mut same) = (0, 0);
            for _ in 0..n {
                let t = Y2026 + (r.next_u64() >> 8) as i128;
                let a = s.at(t).congested;
                congested += a as u32;
                same += (a == s.at(t + lag as i128).congested) as u32;
            }
            let e = (-rate * lag as f64).exp();
            let expected = [congested_share, 1.0 - congested_share]
                .iter()
                .map(|p| p * (p + (1.0 - p) * e))
                .sum::<f64>();
            let (got_share, got_same) = (congested as f64 / n as f64, same as f64 / n as f64);
            eprintln!("lag {lag} ns: congested {got_share:.3}, same after it {got_same:.3} (law {expected:.3})");
            // sd of either share of 20,000: at most 0.0036.
            assert!((got_share - congested_share).abs() < 0.02, "{got_share}");
            assert!(
                (got_same - expected).abs() < 0.02,
                "lag {lag}: {got_same} vs {expected}"
            );
        }
    }

    #[test]
    fn a_look_up_is_the_same_whenever_it_is_made_and_within_a_dwell() {
        let s = Schedule::new(42, 20 * MS, 20 * MS);
        // Two processes, 3 s apart and across an hour boundary: the changes of the overlap.
        let changes = |from: i128| -> Vec<i128> {
            let (mut t, mut out, mut state) = (from, Vec::new(), s.at(from).congested);
            while t < Y2026 + 10_000 * MS as i128 {
                let now = s.at(t);
                if now.congested != state {
                    out.push(t);
                    state = now.congested;
                }
                t = now.next;
            }
            out.retain(|&c| c > Y2026 - 3_500 * MS as i128);
            out
        };
        let early = changes(Y2026 - 5_000 * MS as i128);
        let late = changes(Y2026 - 2_000 * MS as i128 + 123_457);
        let overlap: Vec<i128> = early
            .iter()
            .copied()
            .filter(|&c| c > Y2026 - 1_900 * MS as i128)
            .collect();
        assert!(overlap.len() > 400, "{}", overlap.len());
        assert!(
            late.ends_with(&overlap),
            "the later process sees the same changes"
        );
        // Anywhere inside a dwell the answer is the same state and the same next change.
        let mut t = Y2026;
        for _ in 0..2000 {
            let a = s.at(t);
            let inside = t + (a.next - t) / 2;
            assert_eq!(s.at(inside), a, "{t} and {inside}");
            t = a.next;
        }
    }

    #[test]
    fn the_seed_chooses_the_schedule() {
        let states = |seed| {
            let s = Schedule::new(seed, 20 * MS, 20 * MS);
            (0..200)
                .map(|i| s.at(Y2026 + i * 7 * MS as i128).congested)
                .collect::<Vec<_>>()
        };
        assert_eq!(states(1), states(1));
        assert_ne!(states(1), states(2));
    }

    #[test]
    fn any_date_and_extreme_means_cost_microseconds() {
        let dates = [
            i128::from(i64::MIN) * 1_000_000_000, // the earliest timespec
            -1_000_000_000,                       // 1969: before the anchor
            0,
            Y2026,
            4_102_444_800_000_000_000, // 2100
            (1i128 << 63) - 1,         // the root's last ns (2262)
            1i128 << 63,
            i128::from(i64::MAX) * 1_000_000_000, // the latest timespec
        ];
        let means = [
            (1, 1),
            (1, 1000 * HOUR),
            (1000 * HOUR, 1),
            (1000 * HOUR, 1000 * HOUR),
            (u64::MAX, u64::MAX),
            (20 * MS, 20 * MS),
        ];
        let t0 = std::time::Instant::now();
        let mut n = 0;
        for (calm, congested) in means {
            let s = Schedule::new(3, calm, congested);
            for d in dates {
                for k in 0..100 {
                    let t = d.saturating_add(k * 977);
                    let now = s.at(t);
                    assert!(now.next > t, "{calm}/{congested} at {t}: {now:?}");
                    n += 1;
                }
            }
        }
        let each = t0.elapsed() / n;
        eprintln!("{n} look-ups, {each:?} each");
        assert!(each < std::time::Duration::from_micros(200), "{each:?}");
    }

    #[test]
    fn extreme_means_keep_their_stationary_shares() {
        // 1 ns against 1000 h: (almost) always in the long state.
        for (calm, congested, share) in [
            (1, 1000 * HOUR, 1.0),
            (1000 * HOUR, 1, 0.0),
            (1000 * HOUR, 1000 * HOUR, 0.5),
            (MS, 3 * MS, 0.75),
        ] {
            let s = Schedule::new(9, calm, congested);
            // Samples ~a year apart (2^55 ns) are independent for these means.
            let v: Vec<bool> = (1..=250i128)
                .map(|k| s.at(k * (1 << 55) + k * 12_345).congested)
                .collect();
            let got = v.iter().filter(|&&c| c).count() as f64 / v.len() as f64;
            // sd of a share of 250: at most 0.032.
            assert!(
                (got - share).abs() < 0.15,
                "{calm}/{congested}: {got} congested"
            );
        }
    }
}

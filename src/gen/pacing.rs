//! Open-loop pacing: the gaps between one flow's sends, fixed or exponential (a Poisson
//! process), as in the research's leaky-bucket background-load generator.
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Fixed,
    Poisson,
}

/// Produces send times for one flow, in ns since the start.
pub struct Pacer {
    mean_gap_ns: f64,
    arrival: Arrival,
    rng: Pcg64Mcg,
    next_ns: f64,
}

impl Pacer {
    /// `ops_per_s` per flow; `seed` makes the gaps repeatable. The first send is at a random
    /// phase within one gap, so many flows do not fire in lockstep.
    pub fn new(ops_per_s: f64, arrival: Arrival, seed: u64) -> Pacer {
        let mean_gap_ns = 1e9 / ops_per_s;
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let phase = unit(&mut rng) * mean_gap_ns;
        Pacer {
            mean_gap_ns,
            arrival,
            rng,
            next_ns: phase,
        }
    }

    /// When the next send is due.
    pub fn due_ns(&self) -> u64 {
        self.next_ns as u64
    }

    /// How many sends are due from the next one up to `end_ns` (inclusive): exact for fixed
    /// gaps, the expected count for Poisson arrivals (their mean gap). The sends a flow that
    /// falls behind its schedule never posted.
    pub fn due_until(&self, end_ns: u64) -> u64 {
        let end = end_ns as f64;
        if self.next_ns > end {
            0
        } else {
            ((end - self.next_ns) / self.mean_gap_ns).floor() as u64 + 1
        }
    }

    /// Moves on to the following send.
    pub fn advance(&mut self) {
        let gap = match self.arrival {
            Arrival::Fixed => self.mean_gap_ns,
            // Inverse transform: -ln(U) is exponential with mean 1; U in (0, 1].
            Arrival::Poisson => -(1.0 - unit(&mut self.rng)).ln() * self.mean_gap_ns,
        };
        self.next_ns += gap;
    }
}

/// A uniform number in [0, 1) from the top 53 bits.
fn unit(rng: &mut Pcg64Mcg) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(arrival: Arrival, n: usize) -> Vec<f64> {
        let mut p = Pacer::new(100_000.0, arrival, 7);
        let mut prev = p.next_ns;
        (0..n)
            .map(|_| {
                p.advance();
                let now = p.next_ns;
                let g = now - prev;
                prev = now;
                g
            })
            .collect()
    }

    #[test]
    fn due_until_counts_the_schedule_left_behind() {
        let mut p = Pacer::new(100_000.0, Arrival::Fixed, 7);
        p.next_ns = 1_000.0;
        assert_eq!(p.due_until(999), 0);
        assert_eq!(p.due_until(1_000), 1);
        assert_eq!(p.due_until(10_999), 1);
        assert_eq!(p.due_until(11_000), 2);
        assert_eq!(p.due_until(1_001_000), 101);
    }

    #[test]
    fn fixed_gaps_are_the_period() {
        assert!(gaps(Arrival::Fixed, 100)
            .iter()
            .all(|g| (g - 10_000.0).abs() < 1e-6));
    }

    #[test]
    fn poisson_gaps_are_exponential() {
        let g = gaps(Arrival::Poisson, 200_000);
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let var = g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / g.len() as f64;
        // Exponential: mean = sd = 10 µs.
        assert!((mean - 10_000.0).abs() / 10_000.0 < 0.01, "mean {mean}");
        assert!(
            (var.sqrt() - 10_000.0).abs() / 10_000.0 < 0.02,
            "sd {}",
            var.sqrt()
        );
        assert!(g.iter().all(|&x| x >= 0.0));
    }

    #[test]
    fn same_seed_same_schedule() {
        assert_eq!(gaps(Arrival::Poisson, 50), gaps(Arrival::Poisson, 50));
    }
}

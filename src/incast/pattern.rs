//! Traffic patterns across hosts: who sends to whom. A pattern becomes one or more [`Layout`]s
//! (a step each: every receiver's `serve` and every pair's `run`, started by one barrier);
//! rotating-incast is a sequence of incasts whose sink moves on each step.
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    /// Many senders, one receiver (--receiver, --senders)
    Incast,
    /// Every host sends to every other host
    Alltoall,
    /// Every host sends to one other host and receives from one (a random derangement)
    Permutation,
    /// An incast per step, the sink moving to the next host each step
    RotatingIncast,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Incast => "incast",
            Pattern::Alltoall => "alltoall",
            Pattern::Permutation => "permutation",
            Pattern::RotatingIncast => "rotating-incast",
        }
    }
}

/// A host: the launcher's name for it and its address on the RDMA network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub addr: String,
}

impl Host {
    /// `HOST[:ADDR]` (the address is the name when not given).
    pub fn parse(spec: &str) -> Result<Host, String> {
        let (name, addr) = spec.split_once(':').unwrap_or((spec, spec));
        if name.is_empty() || addr.is_empty() {
            return Err(format!("{spec:?}: expected HOST or HOST:ADDR"));
        }
        Ok(Host {
            name: name.into(),
            addr: addr.into(),
        })
    }
}

/// A host's name as it appears in file names under --out (`step-K-HOST/`, `serve-HOST.log`,
/// `sender-K-HOST.err`): '/', '%' and control characters percent-encoded. Each such name has a
/// prefix, so `..` is never a whole component: `../../x` stays one file inside --out. The
/// encoding is one to one: two hosts never share a file.
pub fn file_name(host: &str) -> String {
    let mut out = String::with_capacity(host.len());
    for c in host.chars() {
        if c == '/' || c == '%' || c.is_ascii_control() {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// One step: the pairs that send, as indices into the pattern's host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// (sender, receiver) host indices.
    pub pairs: Vec<(usize, usize)>,
}

impl Layout {
    /// The hosts that receive, each once, in host order.
    pub fn receivers(&self) -> Vec<usize> {
        let mut r: Vec<usize> = self.pairs.iter().map(|&(_, d)| d).collect();
        r.sort_unstable();
        r.dedup();
        r
    }

    /// How many senders each receiver's start barrier waits for.
    pub fn senders_of(&self, receiver: usize) -> u32 {
        self.pairs.iter().filter(|&&(_, d)| d == receiver).count() as u32
    }
}

/// Most steps of a rotating incast: each is a whole incast (its processes, a directory of its
/// own), and pattern.json keeps each one's summary.
pub const MAX_STEPS: usize = 10_000;

/// Most (sender, receiver) pairs in one step: each is a process launched from this machine,
/// with a thread reading its report.
pub const MAX_PAIRS: u64 = 65_536;

/// How many (sender, receiver) pairs a step of `pattern` over `n` hosts has, counted without
/// making them (checked against [`MAX_PAIRS`] before any is).
pub fn pairs_per_step(pattern: Pattern, n: usize) -> u64 {
    let n = n as u64;
    match pattern {
        Pattern::Incast | Pattern::RotatingIncast => n.saturating_sub(1),
        Pattern::Alltoall => n.saturating_mul(n.saturating_sub(1)),
        Pattern::Permutation => n,
    }
}

/// Step `k` of `pattern` over `n` hosts, made when it runs (a rotating incast's steps are many,
/// and each is the same whatever came before). For `Incast`, host 0 is the receiver and the
/// others send. `seed` draws the permutation; a rotating incast's sink in step k is host k mod n.
pub fn layout(pattern: Pattern, n: usize, seed: u64, k: usize) -> Layout {
    let incast_to = |sink: usize| Layout {
        pairs: (0..n).filter(|&s| s != sink).map(|s| (s, sink)).collect(),
    };
    match pattern {
        Pattern::Incast => incast_to(0),
        Pattern::Alltoall => Layout {
            pairs: (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
                .collect(),
        },
        Pattern::Permutation => Layout {
            pairs: derangement(n, seed).into_iter().enumerate().collect(),
        },
        Pattern::RotatingIncast => incast_to(k % n),
    }
}

/// A uniformly random permutation of 0..n with no fixed point (n ≥ 2): shuffles until none is
/// left in place (about e ≈ 2.7 shuffles on average).
fn derangement(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut p: Vec<usize> = (0..n).collect();
    loop {
        for i in (1..n).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            p.swap(i, j);
        }
        if p.iter().enumerate().all(|(i, &d)| i != d) {
            return p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alltoall_has_every_ordered_pair_once() {
        let l = &layout(Pattern::Alltoall, 4, 1, 0);
        assert_eq!(l.pairs.len(), 12);
        let mut seen = std::collections::BTreeSet::new();
        for &(s, d) in &l.pairs {
            assert_ne!(s, d);
            assert!(seen.insert((s, d)));
        }
        assert_eq!(l.receivers(), vec![0, 1, 2, 3]);
        assert!((0..4).all(|r| l.senders_of(r) == 3));
    }

    #[test]
    fn permutations_send_and_receive_once_per_host_and_follow_the_seed() {
        for seed in 0..200 {
            let l = &layout(Pattern::Permutation, 5, seed, 0);
            let mut to: Vec<usize> = l.pairs.iter().map(|&(_, d)| d).collect();
            assert!(l.pairs.iter().all(|&(s, d)| s != d), "{l:?}");
            to.sort_unstable();
            assert_eq!(to, vec![0, 1, 2, 3, 4], "{l:?}");
            assert_eq!(l, &layout(Pattern::Permutation, 5, seed, 0));
        }
        // Not always the same one.
        let distinct: std::collections::BTreeSet<_> = (0..50)
            .map(|s| layout(Pattern::Permutation, 5, s, 0).pairs)
            .collect();
        assert!(distinct.len() > 10, "{}", distinct.len());
    }

    #[test]
    fn rotating_incast_moves_its_sink_each_step() {
        let steps: Vec<Layout> = (0..4)
            .map(|k| layout(Pattern::RotatingIncast, 3, 0, k))
            .collect();
        let sinks: Vec<Vec<usize>> = steps.iter().map(|l| l.receivers()).collect();
        assert_eq!(sinks, vec![vec![0], vec![1], vec![2], vec![0]]);
        assert_eq!(steps[1].pairs, vec![(0, 1), (2, 1)]);
    }

    #[test]
    fn pairs_are_counted_as_the_layouts_make_them() {
        for pattern in [
            Pattern::Incast,
            Pattern::Alltoall,
            Pattern::Permutation,
            Pattern::RotatingIncast,
        ] {
            for n in 2..7 {
                let made = layout(pattern, n, 1, 1).pairs.len() as u64;
                assert_eq!(pairs_per_step(pattern, n), made, "{pattern:?} {n}");
            }
        }
        assert_eq!(pairs_per_step(Pattern::Alltoall, 8200), 67_231_800);
    }

    #[test]
    fn host_names_become_one_file_name_each() {
        assert_eq!(file_name("node7.cluster"), "node7.cluster");
        assert_eq!(file_name("../../x1"), "..%2F..%2Fx1");
        assert_eq!(file_name("a%2Fb"), "a%252Fb");
        assert_eq!(file_name("a\0b\n"), "a%00b%0A");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    }

    #[test]
    fn hosts_parse_with_and_without_an_address() {
        assert_eq!(
            Host::parse("h1:10.0.0.2").unwrap(),
            Host {
                name: "h1".into(),
                addr: "10.0.0.2".into()
            }
        );
        assert_eq!(Host::parse("node7").unwrap().addr, "node7");
        assert!(Host::parse(":1.2.3.4").is_err());
        assert!(Host::parse("h1:").is_err());
    }
}

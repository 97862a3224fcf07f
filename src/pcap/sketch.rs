//! A per-flow gap sketch in a few hundred bytes: HdrHistogram's 3-significant-digit buckets
//! (1 ns resolution, the link-wide histogram's), but only the non-empty ones are stored, at
//! most [`MAX_BUCKETS`]. A flow whose gaps need more buckets than that halves the sketch's
//! precision (two neighbouring buckets become one) until they fit, so memory is bounded
//! whatever the gaps, and a flow with a few distinct gaps (steady pacing) keeps 3 digits: its
//! percentiles are those of a full 3-digit histogram (each flow's kept 16-40 KiB of counters
//! before, most of the state of a 200,000-flow capture).
use hdrhistogram::Histogram;

/// Buckets a sketch holds (8 bytes each). At one bucket per power of two (the coarsest
/// precision) the gaps up to [`MAX_GAP_NS`] need 38: every gap always fits. Gaps spread over
/// two powers of two keep 16 buckets per power of two (6 %, the generator's per-flow 1 digit).
pub const MAX_BUCKETS: usize = 40;
/// Gaps longer than this (about 69 s) count at this value in the percentiles; min and max
/// are kept exactly.
pub const MAX_GAP_NS: u64 = 1 << 36;
/// Mantissa bits of HdrHistogram's 3-digit buckets: 2048 exact values, then 1024 buckets per
/// power of two.
const FULL_BITS: u32 = 10;
/// A bucket's key in the top 16 bits of an entry, its count in the rest: 2^48 gaps in one
/// bucket of one flow would take three weeks of minimum-size packets at 100 Gb/s, all captured.
const COUNT_BITS: u32 = 48;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The bucket of `v` at `bits` mantissa bits: values below 2^(bits+1) exactly, then 2^bits
/// buckets per power of two. Monotone in `v`, and below 2^16 for any `v` at 10 bits or fewer.
fn key(v: u64, bits: u32) -> u64 {
    if v < 1 << (bits + 1) {
        return v;
    }
    let e = 63 - v.leading_zeros();
    let shift = e - bits;
    ((shift as u64) << bits) + (v >> shift)
}

/// The lowest value of bucket `k` at `bits`, and the bucket's width.
fn bucket(k: u64, bits: u32) -> (u64, u64) {
    if k < 1 << (bits + 1) {
        return (k, 1);
    }
    let shift = (k >> bits) - 1;
    let mantissa = k - (shift << bits);
    (mantissa << shift, 1 << shift)
}

/// The 3-digit bucket of `v` (HdrHistogram's at 3 significant digits, 1 ns resolution, as the
/// link-wide gaps keep): its lowest and highest value.
pub fn full_bucket(v: u64) -> (u64, u64) {
    let (lo, w) = bucket(key(v, FULL_BITS), FULL_BITS);
    (lo, lo + (w - 1))
}

/// Gaps of one packet stream, bounded.
#[derive(Debug, Clone, Default)]
pub struct GapSketch {
    /// Sorted by key (the top 16 bits), each `key << 48 | count`.
    entries: Vec<u64>,
    min: u64,
    max: u64,
    /// How many times the precision was halved (0: 3 digits).
    coarsened: u8,
}

impl GapSketch {
    fn bits(&self) -> u32 {
        FULL_BITS - self.coarsened as u32
    }

    pub fn record(&mut self, gap_ns: u64) {
        if self.entries.is_empty() {
            self.min = gap_ns;
            self.max = gap_ns;
        } else {
            self.min = self.min.min(gap_ns);
            self.max = self.max.max(gap_ns);
        }
        let v = gap_ns.min(MAX_GAP_NS);
        let mut k = key(v, self.bits());
        let mut at = self.entries.binary_search_by_key(&k, |e| e >> COUNT_BITS);
        if at.is_err() && self.entries.len() == MAX_BUCKETS {
            while self.entries.len() == MAX_BUCKETS {
                self.coarsen();
            }
            k = key(v, self.bits());
            at = self.entries.binary_search_by_key(&k, |e| e >> COUNT_BITS);
        }
        match at {
            Ok(i) => self.entries[i] += 1,
            Err(i) => {
                if self.entries.len() == self.entries.capacity() {
                    // Doubling, but never past the bound (a Vec would round 40 up to 64).
                    let want = (self.entries.len() * 2).clamp(4, MAX_BUCKETS);
                    self.entries.reserve_exact(want - self.entries.len());
                }
                self.entries.insert(i, k << COUNT_BITS | 1);
            }
        }
    }

    /// One bit less precision: neighbouring buckets merge (keys stay sorted: the mapping is
    /// monotone, and each old bucket lies within one new bucket).
    fn coarsen(&mut self) {
        let (old, new) = (self.bits(), self.bits() - 1);
        self.coarsened += 1;
        let mut out = 0;
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            let k = key(bucket(e >> COUNT_BITS, old).0, new);
            if out > 0 && self.entries[out - 1] >> COUNT_BITS == k {
                self.entries[out - 1] += e & COUNT_MASK;
            } else {
                self.entries[out] = k << COUNT_BITS | (e & COUNT_MASK);
                out += 1;
            }
        }
        self.entries.truncate(out);
    }

    /// Gaps recorded (summed over the buckets: read once per report, not per packet).
    pub fn len(&self) -> u64 {
        self.entries.iter().map(|e| e & COUNT_MASK).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The relative width of its buckets: 1/1024 (3 digits) until it had to coarsen, twice
    /// that for each halving.
    pub fn relative_precision(&self) -> f64 {
        1.0 / (1u64 << self.bits()) as f64
    }

    /// Bytes of heap it holds.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * 8
    }

    /// Each stored bucket: (lowest value, highest value, count), ascending; the highest
    /// clamped to the largest gap seen (so the top percentiles never exceed the max).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let bits = self.bits();
        self.entries.iter().map(move |e| {
            let (lo, w) = bucket(e >> COUNT_BITS, bits);
            let hi = (lo + (w - 1)).min(self.max.max(lo));
            (lo, hi, e & COUNT_MASK)
        })
    }

    pub fn min(&self) -> u64 {
        self.min
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value that stands for bucket (lo, hi) in means: HdrHistogram's median-equivalent
    /// (lowest + half its width) of the 3-digit bucket while the sketch holds 3 digits, of the
    /// coarser bucket after.
    pub fn median(&self, lo: u64, hi: u64) -> u64 {
        if self.coarsened == 0 {
            let (l, h) = full_bucket(lo);
            l + ((h - l + 1) >> 1)
        } else {
            lo + ((hi - lo + 1) >> 1)
        }
    }

    /// A 3-digit HdrHistogram holding each bucket's count at its lowest value (exact while the
    /// sketch holds 3 digits).
    pub fn histogram(&self) -> Histogram<u64> {
        let mut h = Histogram::<u64>::new(3).expect("3 significant digits is valid");
        h.auto(true);
        for (lo, _, c) in self.buckets() {
            if h.record_n(lo, c).is_err() {
                h.saturating_record_n(lo, c);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn keys_are_hdrhistograms_three_digit_buckets() {
        let h: Histogram<u64> = Histogram::new(3).unwrap();
        for v in [
            0u64,
            1,
            2047,
            2048,
            2049,
            4095,
            4096,
            12_000,
            999_999,
            1 << 39,
        ] {
            let (lo, hi) = full_bucket(v);
            assert_eq!(
                (lo, hi),
                (h.lowest_equivalent(v), h.highest_equivalent(v)),
                "{v}"
            );
        }
        for bits in 0..=FULL_BITS {
            let mut last = 0;
            for v in (0..5000u64).chain([MAX_GAP_NS - 1, MAX_GAP_NS]) {
                let k = key(v, bits);
                assert!(k >= last && k < 1 << 16, "monotone, 16 bits");
                let (lo, w) = bucket(k, bits);
                assert!(lo <= v && v < lo + w, "{v} in its bucket at {bits} bits");
                last = k;
            }
        }
    }

    #[test]
    fn any_gaps_stay_within_the_bound() {
        let mut s = GapSketch::default();
        let mut seed = 1;
        for _ in 0..100_000 {
            // Log-uniform from 1 ns to ~1 s: every 3-digit bucket differs.
            let gap = 1u64 << (lcg(&mut seed) % 30);
            s.record(gap + lcg(&mut seed) % gap);
        }
        s.record(3_600_000_000_000);
        assert!(s.entries.len() <= MAX_BUCKETS && s.heap_bytes() <= MAX_BUCKETS * 8);
        assert_eq!((s.len(), s.max()), (100_001, 3_600_000_000_000));
        let counted: u64 = s.buckets().map(|b| b.2).sum();
        assert_eq!(counted, 100_001);
        // The hour counts at the bound; the buckets stay ascending.
        let top = s.buckets().last().unwrap();
        assert!(top.0 <= MAX_GAP_NS && MAX_GAP_NS <= top.1, "{top:?}");
        assert!(s.buckets().zip(s.buckets().skip(1)).all(|(a, b)| a.1 < b.0));
    }
}

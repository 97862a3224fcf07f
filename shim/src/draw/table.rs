//! The table the post path draws from, in wait units (TSC ticks, ns or loops), and the wait
//! clock chosen for it. With `IBJITTER_EPISODES` it holds the calm table, then the
//! congested one.
use crate::config::{Delays, Spin, Unit};
use crate::draw::counts::INDICES;
use crate::sys::clock::{self, WaitKind};
use crate::sys::rng;
use ibjitter_table::ENTRIES;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// How long the TSC is timed against CLOCK_MONOTONIC at first use: the two ends are each
/// read between two TSC reads (the tightest of seven), so the ratio's error is the ends'
/// width over the span: within 24 ppm at 250 us on the bench host, 50 runs against a 50 ms
/// reference (2 us per table entry of 100 ms). Every process that opens a device pays it once.
const CALIBRATION_NS: u64 = 250_000;

static WAITS: [AtomicU64; INDICES] = [const { AtomicU64::new(0) }; INDICES];

/// What an unshaped draw keeps of its random index: all of it, or nothing when every entry
/// is the same (`IBJITTER_DELAY=100us`, the commonest table). A random index costs a post
/// two cold cache lines, its entry (32 KiB of them) and its hit counter; index 0 stays in
/// cache (hotpath bench, bursts after a 6 ms pause: spin at 1 ns ~79 ns a post over the
/// direct call with a random index, ~30 with index 0; the delay line's entry ~132, ~84).
/// The thread's stream advances the same either way.
static INDEX_MASK: AtomicUsize = AtomicUsize::new(ENTRIES - 1);

/// Entry `i` in wait units (`i` < [`INDICES`]).
#[inline(always)]
pub fn wait_units(i: usize) -> u64 {
    WAITS[i].load(Relaxed)
}

/// An unshaped draw's index `i` (< [`ENTRIES`]) as the table's entries need it: `i`, or 0
/// when they are all the same.
#[inline(always)]
pub fn plain_index(i: usize) -> usize {
    i & INDEX_MASK.load(Relaxed)
}

/// Chooses the clock for `d` and stores it in wait units. Returns the clock's description.
pub fn use_table(d: &Delays, unit: Unit, spin: Spin) -> String {
    let desc = choose_clock(d, unit, spin);
    store_waits(d, clock::kind());
    desc
}

/// `ibjitter inject set`: the draws' entries switch one by one, within microseconds, in the
/// clock chosen at load, or chosen now if the process injected nothing before (`injecting`
/// false). Returns the clock's description when it was chosen now.
pub fn replace(d: &Delays, unit: Unit, spin: Spin, injecting: bool) -> Option<String> {
    if injecting {
        store_waits(d, clock::kind());
        None
    } else {
        Some(use_table(d, unit, spin))
    }
}

/// Chooses the wait clock for a table (the send table's, or with only a completion table,
/// that one's). Returns its description.
pub fn choose_clock(d: &Delays, unit: Unit, spin: Spin) -> String {
    let kind = match unit {
        Unit::Loops => WaitKind::Loops,
        Unit::Ns if clock::tsc_trusted() && clock::calibrate(CALIBRATION_NS).is_some() => {
            WaitKind::Tsc
        }
        Unit::Ns => WaitKind::Monotonic,
    };
    clock::set_kind(kind);
    let mut clock_desc = match kind {
        WaitKind::Tsc => format!("tsc {:.3} GHz", clock::tsc_per_ns().unwrap_or_default()),
        WaitKind::Monotonic => "CLOCK_MONOTONIC".into(),
        WaitKind::Loops => "spin loops".into(),
    };
    let (pause, why) = match (kind, spin) {
        (WaitKind::Loops, _) => (false, String::new()),
        (_, Spin::Plain) => (false, "IBJITTER_SPIN".into()),
        (_, Spin::Pause) => (true, "IBJITTER_SPIN".into()),
        (_, Spin::Auto) => clock::choose_pause(d.values.iter().copied().filter(|&v| v > 0).min()),
    };
    clock::set_pause(pause);
    if kind != WaitKind::Loops {
        let how = if pause { "pause" } else { "plain" };
        clock_desc += &format!(", spin {how} ({why})");
    }
    clock_desc
}

/// The table in wait units; a single table fills both halves (the episodes' states).
fn store_waits(d: &Delays, kind: WaitKind) {
    if d.values.is_empty() {
        return;
    }
    for (i, w) in WAITS.iter().enumerate() {
        w.store(
            clock::ns_to_units(d.values[i % d.values.len()], kind),
            Relaxed,
        );
    }
    // With `ibjitter inject set` the entries switch one by one within microseconds, and
    // the mask with them: a draw in between may take a new table's entry or an old one's.
    INDEX_MASK.store(rng::index_mask(&d.values), Relaxed);
}

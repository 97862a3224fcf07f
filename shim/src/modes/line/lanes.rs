//! The ways into the delay line and back. A thread that posts into the line gets a lane of
//! its own (the first [`LANES`] threads to do so): a ring its requests go in by, read by
//! whichever thread flushes the line, and a ring the flusher gives its free slots back by.
//! Both rings have one writer and one reader (flushers take turns), so the entry takes no
//! lock and no read-modify-write: a slot comes off the thread's way back, and goes in with
//! one release store. Slots freed while few are free, and the slots of threads beyond the
//! first [`LANES`], go through two shared lock-free stacks linked through the slots'
//! indices (no memory but the line's own), where any thread finds them. A thread holds its
//! lane while it enters ([`hold_my_lane`]): a signal handler posting on a thread it
//! interrupted there takes the stacks too. A thread that exits gives its lane up (a
//! thread-specific key's destructor): a flush then (or the next, if another thread holds the
//! line) moves the free slots left on its way back to the shared stack, and a thread that
//! comes later takes the lane over. Kept for
//! the life of the process, a lane left by a thread that posted a burst held up to 3,072
//! of the 4,096 slots where nobody took them again: threads coming and going (a pool's
//! workers) found the line full and waited.
use super::slots::{Pool, SLOTS};
use crate::sys::rng;
use std::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;

/// Threads with a lane of their own.
pub const LANES: usize = 16;
/// A lane's way back takes every slot its thread freed while the shared queue holds at
/// least [`SHARED_RESERVE`] free slots, and at least [`LANE_MIN`] whatever it holds: so a
/// thread that posts keeps its own slots, and slots idle in the lanes of threads that
/// stopped posting never starve the others (the shared queue fills again from every slot
/// freed while it is low).
pub const SHARED_RESERVE: usize = SLOTS / 4;
pub const LANE_MIN: u32 = 64;
/// The way of threads without a lane.
pub const SHARED: u32 = u32::MAX;
/// How many slots ahead on its way back a lane's entry prefetches (see `take_slot`).
const PREFETCH_AHEAD: u32 = 4;
/// A ring holds every slot at most once: it never fills.
const RING: usize = SLOTS;

/// The lane's owner writes this side.
#[repr(align(128))]
#[derive(Default)]
struct OwnerSide {
    /// Next position of the way in.
    tail: AtomicU32,
    /// Next position of the way back.
    back_head: AtomicU32,
    /// Requests this lane put into the line.
    entered: AtomicU64,
}

/// The flusher writes this side.
#[repr(align(128))]
#[derive(Default)]
struct FlusherSide {
    head: AtomicU32,
    back_tail: AtomicU32,
    /// Who has the lane: [`UNTAKEN`], [`OWNED`], [`GONE`], [`FREE`].
    state: AtomicU32,
}

/// A lane no thread has had yet (handed out by the count of lanes taken, never taken over).
const UNTAKEN: u32 = 0;
/// A live thread's.
const OWNED: u32 = 1;
/// Its thread exited: a flush takes its slots back, then frees it.
const GONE: u32 = 2;
/// Free for a thread that comes later to take over.
const FREE: u32 = 3;

struct Lane {
    owner: OwnerSide,
    flusher: FlusherSide,
    way_in: Box<[AtomicU32]>,
    way_back: Box<[AtomicU32]>,
}

/// The line's slots and their ways.
pub struct Line {
    pub pool: Pool,
    lanes: Box<[Lane]>,
    /// The shared stacks' links: slot i's successor, plus one (0: none).
    links: Box<[AtomicU32]>,
    /// Requests of threads without a lane (a stack: the flusher takes it whole).
    shared_in: AtomicU32,
    /// Free slots no lane keeps: a stack whose head carries a tag (upper half) bumped by
    /// every change, so that a pop racing others never takes a stale successor.
    free: AtomicU64,
    free_n: AtomicU32,
}

static LINE: OnceLock<Line> = OnceLock::new();
/// The thread-specific key whose destructor gives an exiting thread's lane up.
static EXIT_KEY: OnceLock<libc::pthread_key_t> = OnceLock::new();
/// glibc keeps the values of the first 32 keys in the thread itself and allocates a block
/// for the others at a thread's first `pthread_setspecific`: a thread's first post (perhaps
/// a signal handler's) must not allocate, so a later key is not used.
const KEYS_WITHOUT_ALLOCATION: usize = 32;
/// Lanes handed out (may count a little past [`LANES`]: threads that asked at once).
static LANES_TAKEN: AtomicU32 = AtomicU32::new(0);
static SHARED_ENTERED: AtomicU64 = AtomicU64::new(0);
/// Lanes given up by threads that exited (their slots taken back).
static LANES_GIVEN_UP: AtomicU64 = AtomicU64::new(0);
/// Lanes given up and not yet taken over: a thread without a lane looks for one while any is
/// (one load a post, for such threads only).
static FREE_LANES: AtomicU32 = AtomicU32::new(0);

/// Lanes given up by threads that exited, their free slots taken back.
pub fn lanes_given_up() -> u64 {
    LANES_GIVEN_UP.load(Relaxed)
}

/// Requests entered by threads without a lane (beyond [`LANES`] at once, or a signal
/// handler's inside its thread's entry).
pub fn entered_without_a_lane() -> u64 {
    SHARED_ENTERED.load(Acquire)
}

/// A ring of [`RING`] positions, or None if its memory cannot be had.
fn ring() -> Option<Box<[AtomicU32]>> {
    let mut v: Vec<AtomicU32> = Vec::new();
    v.try_reserve_exact(RING).ok()?;
    v.extend((0..RING).map(|_| AtomicU32::new(0)));
    Some(v.into_boxed_slice())
}

/// Allocates the pool and the ways (fallibly: under an address-space limit the line does not
/// start). Once; false if it cannot.
pub fn start(after_owner_exits: fn()) -> bool {
    let _ = AFTER_OWNER_EXITS.set(after_owner_exits);
    let Some(pool) = Pool::new() else {
        return false;
    };
    let mut lanes = Vec::new();
    if lanes.try_reserve_exact(LANES).is_err() {
        return false;
    }
    for _ in 0..LANES {
        let (Some(way_in), Some(way_back)) = (ring(), ring()) else {
            return false;
        };
        lanes.push(Lane {
            owner: OwnerSide::default(),
            flusher: FlusherSide::default(),
            way_in,
            way_back,
        });
    }
    let mut links = Vec::new();
    if links.try_reserve_exact(SLOTS).is_err() {
        return false;
    }
    links.extend((0..SLOTS).map(|_| AtomicU32::new(0)));
    let line = Line {
        pool,
        lanes: lanes.into_boxed_slice(),
        links: links.into_boxed_slice(),
        shared_in: AtomicU32::new(0),
        free: AtomicU64::new(0),
        free_n: AtomicU32::new(0),
    };
    for i in (0..SLOTS as u32).rev() {
        line.push_free(i);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: a new key with a destructor that only stores to atomics, deleted again if its
    // value would cost an allocation. Without one, lanes are kept for the threads' lives.
    unsafe {
        if libc::pthread_key_create(&mut key, Some(lane_owner_exits)) == 0 {
            if (key as usize) < KEYS_WITHOUT_ALLOCATION {
                let _ = EXIT_KEY.set(key);
            } else {
                libc::pthread_key_delete(key);
            }
        }
    }
    LINE.set(line).is_ok()
}

/// What the line does once a lane's thread is gone (a flush, whose look at the lanes takes
/// that lane's slots back at once, if no other thread holds the line).
static AFTER_OWNER_EXITS: OnceLock<fn()> = OnceLock::new();

/// The destructor of [`EXIT_KEY`], at the exit of a thread that had lane `value - 1`.
unsafe extern "C" fn lane_owner_exits(value: *mut libc::c_void) {
    // A post from a later destructor of this thread takes the shared way (and never a lane
    // given up since: it would be set up for this thread's exit again, and kept if that
    // comes after the last round of destructors).
    rng::set_line_lane(EXITED);
    let lane = (value as usize).wrapping_sub(1);
    if let Some(l) = line().and_then(|line| line.lanes.get(lane)) {
        // Its writes to the lane before this store are the flusher's to read after it.
        l.flusher.state.store(GONE, Release);
        // Now, not at the next flush: with the line empty a thread coming next (a pool's
        // next worker) would find no lane to take over, and post without one for its life.
        if let Some(after) = AFTER_OWNER_EXITS.get() {
            after();
        }
    }
}

/// Bytes the line takes when it starts.
pub const BYTES: usize = Pool::BYTES + LANES * (2 * RING * 4 + 256) + SLOTS * 4;

/// The line, once started.
#[inline(always)]
pub fn line() -> Option<&'static Line> {
    LINE.get()
}

/// The lane word (`rng::line_lane`) of a thread that has no lane of its own (it came after
/// the first [`LANES`]). 0 means "none asked for yet", `l + 1` lane `l`.
pub const NO_LANE: u32 = 0x7fff_ffff;
/// The lane word of a thread that gave its lane up as it exits: the shared way from then on.
const EXITED: u32 = NO_LANE - 1;
/// Set in the lane word while the thread is inside an entry ([`hold_my_lane`]).
const HELD: u32 = 1 << 31;

/// The calling thread's lane, held for one post's entries until the hold drops: a lane's
/// rings have one writer, so a signal handler that posts on a thread interrupted inside an
/// entry must not write them too. It finds the lane held and takes the shared way, whose
/// stacks any thread may push to at any moment.
pub struct LaneHold {
    /// The lane to use ([`SHARED`]: none of its own, or held by the code this handler
    /// interrupted).
    pub lane: u32,
    /// The word to restore, or None if this hold did not take it.
    restore: Option<u32>,
}

impl LaneHold {
    /// The thread was already inside an entry or a flush of the line: this post is its
    /// signal handler's.
    #[inline]
    pub fn nested(&self) -> bool {
        self.restore.is_none()
    }
}

impl Drop for LaneHold {
    #[inline]
    fn drop(&mut self) {
        if let Some(word) = self.restore {
            // The lane's writes stay before the release, as the thread's own handler sees them.
            compiler_fence(SeqCst);
            rng::set_line_lane(word);
        }
    }
}

/// The calling thread's lane for the entries of one post: taken at its first post into the
/// line and kept for its life ([`SHARED`] if it has none, or while the thread is already
/// inside an entry). See [`LaneHold`].
#[inline]
pub fn hold_my_lane() -> LaneHold {
    let mut word = rng::line_lane();
    if word & HELD != 0 {
        return LaneHold {
            lane: SHARED,
            restore: None,
        };
    }
    if word == 0 {
        // Held before the lane is asked for: a handler's post meanwhile must not take a
        // lane of its own that this thread would then overwrite (and leave unused).
        rng::set_line_lane(HELD);
        compiler_fence(SeqCst);
        word = take_lane();
    } else if word == NO_LANE && FREE_LANES.load(Relaxed) != 0 {
        // A lane was given up since this thread found none (a thread that came while the
        // one before it was still giving its lane up): taken over now, not never.
        rng::set_line_lane(HELD);
        compiler_fence(SeqCst);
        word = line()
            .and_then(Line::take_over_free_lane)
            .map_or(NO_LANE, |k| k + 1);
    }
    rng::set_line_lane(word | HELD);
    compiler_fence(SeqCst);
    LaneHold {
        lane: if word == NO_LANE || word == EXITED {
            SHARED
        } else {
            word - 1
        },
        restore: Some(word),
    }
}

/// Marks the calling thread as inside a flush of the line until the hold drops (its lane
/// word held, no lane taken): a post its signal handler makes meanwhile finds itself
/// [`LaneHold::nested`].
#[inline]
pub fn hold_while_flushing() -> LaneHold {
    // One read-modify-write (the flush path is cold): a handler taking the thread's first
    // lane between a load and a store would lose it to this hold's restore.
    let word = rng::mark_line_lane(HELD);
    if word & HELD != 0 {
        return LaneHold {
            lane: SHARED,
            restore: None,
        };
    }
    compiler_fence(SeqCst);
    LaneHold {
        lane: SHARED,
        restore: Some(word),
    }
}

/// A lane for a thread that has none yet: the next never taken, or one a thread that exited
/// gave up, or none ([`NO_LANE`]). The count stops near [`LANES`]: threads beyond ask once
/// each and never move it on (a count moved by every post of theirs would wrap after 2^32
/// posts and hand out lanes in use).
#[cold]
fn take_lane() -> u32 {
    if (LANES_TAKEN.load(Relaxed) as usize) < LANES {
        let k = LANES_TAKEN.fetch_add(1, Relaxed);
        if (k as usize) < LANES {
            claim(k, UNTAKEN);
            return k + 1;
        }
    }
    line()
        .and_then(Line::take_over_free_lane)
        .map_or(NO_LANE, |k| k + 1)
}

/// Makes lane `k` (in state `was`) the calling thread's, and arranges for it to be given up
/// when the thread exits. Once per thread (one `pthread_setspecific` of a key that needs no
/// allocation: [`KEYS_WITHOUT_ALLOCATION`]).
fn claim(k: u32, was: u32) {
    let Some(line) = line() else { return };
    if was == UNTAKEN {
        line.lanes[k as usize].flusher.state.store(OWNED, Release);
    }
    if let Some(key) = EXIT_KEY.get() {
        // SAFETY: our key; the value is the lane plus one (never null).
        unsafe { libc::pthread_setspecific(*key, (k as usize + 1) as *const libc::c_void) };
    }
}

impl Line {
    fn lanes_in_use(&self) -> &[Lane] {
        let n = (LANES_TAKEN.load(Acquire) as usize).min(LANES);
        &self.lanes[..n]
    }

    /// Takes over a lane an exited thread gave up (its slots already taken back), if any.
    fn take_over_free_lane(&self) -> Option<u32> {
        let k = self.lanes_in_use().iter().position(|l| {
            l.flusher
                .state
                .compare_exchange(FREE, OWNED, Acquire, Relaxed)
                .is_ok()
        })? as u32;
        FREE_LANES.fetch_sub(1, Relaxed);
        claim(k, FREE);
        Some(k)
    }

    /// A free slot for the thread of `lane`: the next on its way back (one of the few it
    /// used last), else one of the shared queue's. None when there is none now.
    #[inline]
    pub fn take_slot(&self, lane: u32) -> Option<u32> {
        if let Some(l) = self.lanes.get(lane as usize) {
            let h = l.owner.back_head.load(Relaxed);
            let t = l.flusher.back_tail.load(Acquire);
            if h != t {
                let i = l.way_back[h as usize % RING].load(Relaxed);
                l.owner.back_head.store(h.wrapping_add(1), Release);
                // The slot a few posts from now: its lines come over meanwhile.
                if t.wrapping_sub(h) > PREFETCH_AHEAD {
                    let later =
                        l.way_back[h.wrapping_add(PREFETCH_AHEAD) as usize % RING].load(Relaxed);
                    self.pool.prefetch_for_entry(later);
                }
                return Some(i);
            }
        }
        self.pop_free()
    }

    /// Puts slot `i` (filled) into the line by `lane`. The caller then announces its due
    /// time (`flusher::announce`).
    #[inline]
    pub fn enter(&self, lane: u32, i: u32) {
        match self.lanes.get(lane as usize) {
            Some(l) => {
                // Counted first: the count never trails what a flusher took.
                let o = &l.owner;
                o.entered.store(o.entered.load(Relaxed) + 1, Relaxed);
                let t = o.tail.load(Relaxed);
                l.way_in[t as usize % RING].store(i, Relaxed);
                o.tail.store(t.wrapping_add(1), Release);
            }
            None => {
                SHARED_ENTERED.fetch_add(1, Relaxed);
                // Push-only beside the flusher's take-all: no tag needed.
                let mut h = self.shared_in.load(Relaxed);
                loop {
                    self.links[i as usize].store(h, Relaxed);
                    match self
                        .shared_in
                        .compare_exchange_weak(h, i + 1, Release, Relaxed)
                    {
                        Ok(_) => break,
                        Err(now) => h = now,
                    }
                }
            }
        }
    }

    /// The flusher's side: every request entered since, in no particular order.
    ///
    /// # Safety
    /// Only the thread flushing the line (one at a time) takes.
    pub unsafe fn take_entered(&self, mut f: impl FnMut(u32)) {
        for l in self.lanes_in_use() {
            // Before its way in is read: a thread gone by now entered nothing after.
            let gone = l.flusher.state.load(Acquire) == GONE;
            let mut h = l.flusher.head.load(Relaxed);
            let t = l.owner.tail.load(Acquire);
            while h != t {
                f(l.way_in[h as usize % RING].load(Relaxed));
                h = h.wrapping_add(1);
            }
            l.flusher.head.store(h, Release);
            if gone {
                self.take_back(l);
            }
        }
        let mut next = self.shared_in.swap(0, Acquire);
        while next != 0 {
            let i = next - 1;
            next = self.links[i as usize].load(Relaxed);
            f(i);
        }
    }

    /// Whether a request entered that no flusher took yet.
    pub fn entered_waiting(&self) -> bool {
        self.lanes_in_use()
            .iter()
            .any(|l| l.flusher.head.load(Acquire) != l.owner.tail.load(Acquire))
            || self.shared_in.load(Acquire) != 0
    }

    /// The flusher gives slot `i`, taken by `lane`, back.
    ///
    /// # Safety
    /// Only the thread flushing the line gives back, and only slots it took.
    pub unsafe fn give_back(&self, lane: u32, i: u32) {
        // A lane whose thread is gone (or not yet taken over) keeps nothing.
        let owned = |l: &&Lane| l.flusher.state.load(Relaxed) == OWNED;
        if let Some(l) = self.lanes.get(lane as usize).filter(owned) {
            let t = l.flusher.back_tail.load(Relaxed);
            let held = t.wrapping_sub(l.owner.back_head.load(Acquire));
            if held < LANE_MIN || self.free_n.load(Relaxed) as usize >= SHARED_RESERVE {
                l.way_back[t as usize % RING].store(i, Relaxed);
                l.flusher.back_tail.store(t.wrapping_add(1), Release);
                return;
            }
        }
        self.push_free(i);
    }

    /// The flusher's side, for a lane whose thread is gone (its way in just emptied): the
    /// free slots on its way back go to the shared stack, and the lane is free for another
    /// thread to take over.
    fn take_back(&self, l: &Lane) {
        // The owner is gone: its side is the flusher's until the lane is freed.
        let t = l.flusher.back_tail.load(Relaxed);
        let mut h = l.owner.back_head.load(Relaxed);
        while h != t {
            self.push_free(l.way_back[h as usize % RING].load(Relaxed));
            h = h.wrapping_add(1);
        }
        l.owner.back_head.store(h, Relaxed);
        LANES_GIVEN_UP.fetch_add(1, Relaxed);
        // Counted first: a thread taking the lane over at once never takes the count below 0.
        FREE_LANES.fetch_add(1, Relaxed);
        l.flusher.state.store(FREE, Release);
    }

    /// Pushes slot `i` on the shared free stack.
    fn push_free(&self, i: u32) {
        // Counted first: a pop racing this push never takes the count below zero.
        self.free_n.fetch_add(1, Relaxed);
        let mut h = self.free.load(Relaxed);
        loop {
            self.links[i as usize].store(h as u32, Relaxed);
            let new = (h >> 32).wrapping_add(1) << 32 | u64::from(i + 1);
            match self.free.compare_exchange_weak(h, new, Release, Relaxed) {
                Ok(_) => break,
                Err(now) => h = now,
            }
        }
    }

    /// Pops a slot off the shared free stack. A successor read from a slot another thread
    /// took meanwhile is stale, but then the head's tag changed and the swap fails.
    fn pop_free(&self) -> Option<u32> {
        let mut h = self.free.load(Acquire);
        loop {
            let top = h as u32;
            if top == 0 {
                return None;
            }
            let next = self.links[(top - 1) as usize].load(Relaxed);
            let new = (h >> 32).wrapping_add(1) << 32 | u64::from(next);
            match self.free.compare_exchange_weak(h, new, Acquire, Acquire) {
                Ok(_) => {
                    self.free_n.fetch_sub(1, Relaxed);
                    return Some(top - 1);
                }
                Err(now) => h = now,
            }
        }
    }
}

/// Requests put into the line since it started.
pub fn entered() -> u64 {
    let lanes = line().map_or(0, |l| {
        l.lanes_in_use()
            .iter()
            .map(|l| l.owner.entered.load(Acquire))
            .sum()
    });
    lanes + SHARED_ENTERED.load(Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests share the count of lanes handed out: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// A thread that came after the lanes were all taken asks once: its posts do not move the
    /// count on (moved by each post, it wrapped after 2^32 of them and handed that thread a
    /// lane another thread writes).
    #[test]
    fn threads_beyond_the_lanes_ask_for_one_once() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        std::thread::spawn(|| {
            LANES_TAKEN.store(LANES as u32, Relaxed);
            for _ in 0..1000 {
                assert_eq!(hold_my_lane().lane, SHARED);
            }
            assert_eq!(LANES_TAKEN.load(Relaxed), LANES as u32);
        })
        .join()
        .unwrap();
    }

    /// A post inside another's entry on the same thread (a signal handler's) takes the shared
    /// way; the thread keeps its lane once the entry ends.
    #[test]
    fn an_entry_inside_an_entry_takes_the_shared_way() {
        let _one = ONE_AT_A_TIME.lock().unwrap();
        std::thread::spawn(|| {
            LANES_TAKEN.store(0, Relaxed);
            let outer = hold_my_lane();
            let lane = outer.lane;
            assert!((lane as usize) < LANES);
            assert_eq!(hold_my_lane().lane, SHARED);
            assert_eq!(hold_my_lane().lane, SHARED);
            drop(outer);
            assert_eq!(hold_my_lane().lane, lane);
            assert_eq!(LANES_TAKEN.load(Relaxed), 1);
        })
        .join()
        .unwrap();
    }
}

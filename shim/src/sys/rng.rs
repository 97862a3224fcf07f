//! Per-thread PCG32 streams: thread k of the process (numbered in order of its first post)
//! draws from a stream derived from the seed and k, so a seed reproduces each thread's delay
//! sequence run after run. One const-initialized TLS slot, no destructor, no allocation.
use ibjitter_table::ENTRIES;
use rand_core::Rng;
use rand_pcg::Pcg32;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Seed used when `IBJITTER_SEED` is unset ("ibjitter" in ASCII).
pub const DEFAULT_SEED: u64 = 0x6962_6a69_7474_6572;

static SEED: AtomicU64 = AtomicU64::new(DEFAULT_SEED);
/// Mixed into stream derivation in forked children, so a child does not replay its parent.
static SALT: AtomicU64 = AtomicU64::new(0);
static NEXT_THREAD: AtomicU32 = AtomicU32::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);

/// The calling thread's generator, once it has one.
#[repr(C)]
struct ThreadState {
    rng: MaybeUninit<Pcg32>,
    /// Thread index k.
    index: u32,
    /// Zero (the TLS initial image) until `rng` is set.
    ready: u32,
    /// `IBJITTER_PER=wr`: 1 when this thread's `ibv_wr_start` already waited for the first
    /// work request of its batch (see `wr_ops`). Kept in this block: the one TLS slot.
    batch_paid: u32,
    /// How deep this thread is in UCP send calls (libucp's own `_nb`/`_nbi` forms call its
    /// `_nbx` ones through the PLT, i.e. through the shim's hooks again): only the outermost
    /// call delays. Kept in this block: the one TLS slot.
    ucp_depth: u32,
    /// `IBJITTER_OPS` on the `ibv_wr_*` API: 1 from `ibv_wr_start` until the batch's first
    /// selected work request waited (see `wr_ops`).
    batch_open: u32,
    /// The last table index drawn (`IBJITTER_CORRELATION` repeats it). Kept in this block:
    /// the one TLS slot.
    last_index: u32,
    /// `IBJITTER_MODE=line`: this thread's lane into the delay line, plus one (0: none yet;
    /// `lanes::NO_LANE`: none of its own), and bit 31 while it is inside an entry. Kept in
    /// this block: the one TLS slot.
    line_lane: u32,
    /// Where the thread's latest UCP send call returns to: its call site, stored by the
    /// export's entry (`exports::ucp`, in assembly) for the wrapper, which resolves the real
    /// function as that caller would (`by_caller`). Kept in this block: the one TLS slot.
    ucp_caller: usize,
}

/// The offset of [`ThreadState`]'s `ucp_caller` in the TLS block (the exports' assembly).
pub(crate) const UCP_CALLER_OFFSET: usize = std::mem::offset_of!(ThreadState, ucp_caller);

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tls {
    //! The per-thread state in a `.tbss` block reached with the initial-exec model (one load
    //! from the GOT plus %fs): `thread_local!` in a cdylib costs an indirect call and a
    //! `__tls_get_addr` call per access, more than the whole zero-delay budget. Initial-exec
    //! is what LD_PRELOADed objects get anyway (static TLS); a later dlopen still works,
    //! glibc serves small blocks from its static TLS surplus and initializes them in every
    //! running thread.
    use super::ThreadState;

    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 6",
        // Global for the other codegen units, hidden so it is never exported.
        ".globl ibjitter_thread_state",
        ".hidden ibjitter_thread_state",
        ".type ibjitter_thread_state,@object",
        ".size ibjitter_thread_state,64",
        "ibjitter_thread_state:",
        ".zero 64",
        ".popsection",
    );
    const _: () = assert!(size_of::<ThreadState>() <= 64);

    #[inline(always)]
    pub(super) fn state() -> *mut ThreadState {
        let offset: usize;
        let tp: usize;
        // SAFETY: reads the GOT slot the linker fills with the block's offset from the thread
        // pointer, and the thread pointer itself (%fs:0 holds its own address on x86_64).
        unsafe {
            core::arch::asm!(
                "mov {off}, qword ptr [rip + ibjitter_thread_state@GOTTPOFF]",
                "mov {tp}, qword ptr fs:[0]",
                off = out(reg) offset,
                tp = out(reg) tp,
                options(pure, readonly, nostack, preserves_flags)
            );
        }
        tp.wrapping_add(offset) as *mut ThreadState
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tls {
    use super::ThreadState;
    use std::cell::UnsafeCell;
    use std::mem::MaybeUninit;

    thread_local! {
        static STATE: UnsafeCell<ThreadState> = const {
            UnsafeCell::new(ThreadState { rng: MaybeUninit::uninit(), index: 0, ready: 0, batch_paid: 0, ucp_depth: 0, batch_open: 0, last_index: 0, line_lane: 0, ucp_caller: 0 })
        };
    }

    #[inline(always)]
    pub(super) fn state() -> *mut ThreadState {
        STATE.with(|s| s.get())
    }
}

/// SplitMix64's finalizer: spreads seed, salt and thread index over all bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The generator of thread `k` for `seed` (and fork salt `salt`, 0 in the first process).
pub fn stream(seed: u64, salt: u64, k: u32) -> Pcg32 {
    let state = mix(seed ^ mix(salt ^ mix(u64::from(k))));
    Pcg32::new(state, mix(state ^ 0x6a09_e667_f3bc_c909))
}

/// The seed set at load.
pub fn seed() -> u64 {
    SEED.load(Relaxed)
}

/// Sets the seed and restarts thread numbering (at load).
pub fn set_seed(seed: u64) {
    SEED.store(seed, Relaxed);
    NEXT_THREAD.store(0, Relaxed);
    SALT.store(0, Relaxed);
    reset_current_thread();
}

/// The calling thread's delay-line lane word (`modes::line::lanes`): 0 until it sets one.
/// Read and written as an atomic: the thread's own signal handlers read it too (see
/// `lanes::hold_my_lane`); relaxed, a plain `mov`.
#[inline(always)]
pub fn line_lane() -> u32 {
    // SAFETY: the block is this thread's; the field is a u32, aligned.
    unsafe { AtomicU32::from_ptr(&raw mut (*tls::state()).line_lane).load(Relaxed) }
}

/// Sets the calling thread's delay-line lane word.
#[inline]
pub fn set_line_lane(v: u32) {
    // SAFETY: as `line_lane`.
    unsafe { AtomicU32::from_ptr(&raw mut (*tls::state()).line_lane).store(v, Relaxed) }
}

/// A word no other live thread shares (its per-thread block's address; never 0): which
/// thread holds a lock it may re-enter from a signal handler (`modes::line::flusher`, the
/// spin locks).
#[inline]
pub fn this_thread() -> usize {
    tls::state() as usize
}

/// Sets `bits` in the calling thread's lane word at once (a handler cannot come between its
/// read and its write); returns the word before.
#[inline]
pub fn mark_line_lane(bits: u32) -> u32 {
    // SAFETY: as `line_lane`.
    unsafe { AtomicU32::from_ptr(&raw mut (*tls::state()).line_lane).fetch_or(bits, Relaxed) }
}

/// Forgets the calling thread's stream; its next post takes a new thread index.
pub fn reset_current_thread() {
    // SAFETY: the block is this thread's; nothing else holds a reference into it now.
    unsafe {
        (*tls::state()).ready = 0;
        // A fork child starts outside any UCP call (the forking thread may have been inside).
        (*tls::state()).ucp_depth = 0;
    }
}

/// How many threads have posted (through a wrapper that draws or counts) since load, or
/// since the fork that made this process.
pub fn threads_posted() -> u32 {
    NEXT_THREAD.load(Relaxed)
}

/// Gives the calling thread its stream: the next thread index k, and the stream of k.
#[cold]
#[inline(never)]
pub(crate) fn init_current_thread() {
    // SAFETY: the block is this thread's; nothing else holds a reference into it now.
    let s = unsafe { &mut *tls::state() };
    let k = NEXT_THREAD.fetch_add(1, Relaxed);
    s.index = k;
    s.rng = MaybeUninit::new(stream(SEED.load(Relaxed), SALT.load(Relaxed), k));
    s.ready = 1;
}

/// Runs `f` with the calling thread's generator and thread index; None (without calling
/// `f`) if the thread has no stream yet: the caller runs [`init_current_thread`] out of line
/// and retries, which keeps the usual path free of calls and stack frames.
#[inline(always)]
pub(crate) fn with_thread<R>(f: impl FnOnce(&mut Pcg32, &mut u32, u32) -> R) -> Option<R> {
    // SAFETY: the block is this thread's; `f` (the post path) never re-enters here.
    let s = unsafe { &mut *tls::state() };
    if s.ready == 0 {
        return None;
    }
    // SAFETY: `ready` says `rng` was written.
    let rng = unsafe { s.rng.assume_init_mut() };
    Some(f(rng, &mut s.last_index, s.index))
}

/// Notes that this thread's `ibv_wr_start` waited for the first work request of its batch.
#[inline(always)]
pub(crate) fn set_batch_paid() {
    // SAFETY: the block is this thread's; no reference into it is alive.
    unsafe { (*tls::state()).batch_paid = 1 };
}

/// Whether the batch's first work request was already waited for (and forgets it).
#[inline(always)]
pub(crate) fn take_batch_paid() -> bool {
    // SAFETY: the block is this thread's; no reference into it is alive.
    let s = unsafe { &mut *tls::state() };
    std::mem::replace(&mut s.batch_paid, 0) != 0
}

/// Notes that this thread's `ibv_wr_start` opened a batch whose delay waits for its first
/// selected work request.
#[inline(always)]
pub(crate) fn set_batch_open() {
    // SAFETY: the block is this thread's; no reference into it is alive.
    unsafe { (*tls::state()).batch_open = 1 };
}

/// Whether the batch still waits for its first selected work request (and forgets it).
#[inline(always)]
pub(crate) fn take_batch_open() -> bool {
    // SAFETY: the block is this thread's; no reference into it is alive.
    let s = unsafe { &mut *tls::state() };
    std::mem::replace(&mut s.batch_open, 0) != 0
}

/// Enters a UCP send call; true if it is this thread's outermost one.
#[inline(always)]
pub(crate) fn enter_ucp() -> bool {
    // SAFETY: the block is this thread's; no reference into it is alive.
    let s = unsafe { &mut *tls::state() };
    s.ucp_depth += 1;
    s.ucp_depth == 1
}

/// Where this thread's latest UCP send call returns to (0 where no entry stores it).
#[inline(always)]
pub(crate) fn ucp_caller() -> usize {
    // SAFETY: the block is this thread's; the export's entry wrote the word just before.
    unsafe { std::ptr::addr_of!((*tls::state()).ucp_caller).read_volatile() }
}

/// Leaves a UCP send call entered with [`enter_ucp`].
#[inline(always)]
pub(crate) fn leave_ucp() {
    // SAFETY: the block is this thread's; no reference into it is alive.
    let s = unsafe { &mut *tls::state() };
    s.ucp_depth = s.ucp_depth.saturating_sub(1);
}

/// A table index: the low bits of the next draw (ENTRIES is a power of two).
#[inline(always)]
pub(crate) fn next_index(rng: &mut Pcg32) -> usize {
    const { assert!(ENTRIES.is_power_of_two()) };
    rng.next_u32() as usize & (ENTRIES - 1)
}

/// What an index into a table of `values` needs of [`next_index`]: all of it, or nothing
/// when every entry is the same (index 0 then stays in cache: a random one costs a cold
/// line in bursts, and gives the same value).
pub(crate) fn index_mask(values: &[u64]) -> usize {
    if values.iter().all(|&v| Some(&v) == values.first()) {
        0
    } else {
        ENTRIES - 1
    }
}

/// `IBJITTER_CORRELATION`: the thread's last index again with probability `repeat` (in
/// 2^-32 steps), else a new one; the table's distribution is kept and the lag-k
/// autocorrelation of the indices drawn is repeat^k.
#[inline(always)]
pub(crate) fn correlated_index(rng: &mut Pcg32, last: &mut u32, repeat: u32) -> usize {
    if rng.next_u32() >= repeat {
        *last = next_index(rng) as u32;
    }
    *last as usize
}

/// fork() prepare handler (parent): number the fork, so each child gets its own salt.
pub(crate) extern "C" fn atfork_prepare() {
    FORKS.fetch_add(1, Relaxed);
}

/// fork() child handler: the child's only thread starts a fresh stream family, derived
/// deterministically from the parent's salt and fork number.
pub(crate) extern "C" fn atfork_child() {
    let salt = mix(SALT.load(Relaxed) ^ mix(FORKS.load(Relaxed)));
    SALT.store(salt, Relaxed);
    FORKS.store(0, Relaxed);
    NEXT_THREAD.store(0, Relaxed);
    reset_current_thread();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_by_thread_and_repeat_by_seed() {
        let draw = |seed, k| {
            let mut r = stream(seed, 0, k);
            (0..8).map(|_| next_index(&mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 0), draw(7, 0));
        assert_ne!(draw(7, 0), draw(7, 1));
        assert_ne!(draw(7, 0), draw(8, 0));
        assert_ne!(stream(7, 0, 0), stream(7, 1, 0));
    }

    #[test]
    fn only_a_table_of_one_value_draws_one_index() {
        assert_eq!(index_mask(&[5; ENTRIES]), 0);
        assert_eq!(index_mask(&[]), 0);
        let mut last_differs = [5; ENTRIES];
        last_differs[ENTRIES - 1] = 6;
        assert_eq!(index_mask(&last_differs), ENTRIES - 1);
    }
}

//! The delay line's slots: each holds one deferred work request's copy (the request, its
//! scatter list and its inline payload, which the caller may reuse as soon as its post
//! returns), in one pool allocated when the line starts.
use crate::abi::verbs::*;
use std::cell::UnsafeCell;
use std::ptr::null_mut;

/// Work requests the line holds at once.
pub const SLOTS: usize = 4096;
/// Scatter entries a slot holds.
pub const MAX_SGE: usize = 16;
/// Inline payload bytes a slot holds.
pub const INLINE_BYTES: usize = 512;

/// One deferred work request. What the entry and the hand-over touch comes first (the
/// request and its first scatter entries fill the first four cache lines).
#[repr(C, align(64))]
pub struct Slot {
    pub qp: *mut ibv_qp,
    /// The QP's generation when the request entered (a destroyed QP's requests are dropped).
    pub gen: u32,
    /// The way the slot goes back when it is free (`lanes`).
    pub lane: u32,
    /// Due time in clock units (unique per QP: requests of a QP leave in its order).
    pub due: u64,
    /// The due time of the QP's request before this one (0: none since the QP was made or
    /// reset): this one leaves only after that one (it may enter the line later, from a
    /// thread or a signal handler interrupted between taking its due time and entering).
    pub before: u64,
    /// The draw this request carries (clock units): its post's on the chain's first
    /// request, 0 on the others (under `IBJITTER_PER=post` a chain shares one draw, which
    /// the stats count once). What was not given if it is never handed over.
    pub units: u64,
    pub wr: ibv_send_wr,
    pub sge: [ibv_sge; MAX_SGE],
    pub inline: [u8; INLINE_BYTES],
}

/// Cache lines an entry of a one-entry request writes: the header, the request and its
/// first scatter entry.
pub const ENTRY_LINES: usize =
    (std::mem::offset_of!(Slot, sge) + std::mem::size_of::<ibv_sge>()).div_ceil(64);

/// The slots, indexed by `u32`.
pub struct Pool {
    slots: Box<[UnsafeCell<Slot>]>,
    /// Whether the CPU has PREFETCHW (see [`Pool::prefetch_for_entry`]).
    prefetch_w: bool,
}
// SAFETY: a slot is used by one thread at a time: the poster between taking its index and
// entering it, then the flusher until it gives the index back (`lanes`). The raw pointers in
// it (the QP, the copies' own lists) are only dereferenced by that thread.
unsafe impl Sync for Pool {}
unsafe impl Send for Pool {}

impl Pool {
    /// The pool, or None if its memory cannot be had (an address-space limit: the caller
    /// does not start the line).
    pub fn new() -> Option<Pool> {
        let mut slots: Vec<UnsafeCell<Slot>> = Vec::new();
        slots.try_reserve_exact(SLOTS).ok()?;
        slots.extend((0..SLOTS).map(|_| {
            UnsafeCell::new(Slot {
                qp: null_mut(),
                gen: 0,
                lane: 0,
                due: 0,
                before: 0,
                units: 0,
                // SAFETY: all-zero is a valid ibv_send_wr and ibv_sge (integers, pointers).
                wr: unsafe { std::mem::zeroed() },
                sge: unsafe { std::mem::zeroed() },
                inline: [0; INLINE_BYTES],
            })
        }));
        Some(Pool {
            slots: slots.into_boxed_slice(),
            prefetch_w: has_prefetchw(),
        })
    }

    /// Asks for the lines of slot `i` an entry writes (header, request, first scatter
    /// entry), for writing: a slot whose lines the flusher's core wrote last then comes
    /// over while the caller copies into the slots before it, not at its own copy. A hint
    /// only; nothing on a CPU without PREFETCHW (a read prefetch did not help: the line must
    /// be had for writing).
    #[inline(always)]
    pub fn prefetch_for_entry(&self, i: u32) {
        if !self.prefetch_w {
            return;
        }
        if let Some(s) = self.slots.get(i as usize) {
            let p = s.get() as *const u8;
            for line in 0..ENTRY_LINES {
                // SAFETY: a hint within the slot: it neither reads nor writes memory, and
                // the CPU has it (checked above).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    std::arch::asm!("prefetchw [{}]", in(reg) p.add(line * 64),
                                    options(nostack, readonly, preserves_flags));
                }
            }
        }
    }

    /// Bytes the pool takes.
    pub const BYTES: usize = SLOTS * std::mem::size_of::<Slot>();

    /// Slot `i`.
    ///
    /// # Safety
    /// The caller owns slot `i` now (see the `Sync` impl).
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub unsafe fn slot(&self, i: u32) -> &mut Slot {
        &mut *self.slots[i as usize].get()
    }
}

/// Whether the CPU has PREFETCHW (CPUID 0x80000001:ECX bit 8, "3DNowPrefetch"/PRFCHW):
/// AMD since the K6, Intel since Broadwell.
fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        // Leaf 0x80000000 exists on every x86_64 CPU and says the highest extended leaf.
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether a slot can hold `wr`: SEND, WRITE, READ and the atomics (their immediate and
/// invalidate forms too), at most [`MAX_SGE`] entries, at most [`INLINE_BYTES`] inline.
///
/// # Safety
/// `wr` is a valid work request.
#[inline]
pub unsafe fn fits(wr: *const ibv_send_wr) -> bool {
    let w = &*wr;
    const DEFERRABLE: u32 = crate::config::select::opcodes(
        crate::config::select::SEND
            | crate::config::select::WRITE
            | crate::config::select::READ
            | crate::config::select::ATOMIC,
    ) & !(1 << ibv_wr_opcode_IBV_WR_TSO
        | 1 << ibv_wr_opcode_IBV_WR_ATOMIC_WRITE);
    let deferrable = w.opcode < 32 && DEFERRABLE & (1 << w.opcode) != 0;
    let n = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
    if !deferrable || n > MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return false;
    }
    if w.send_flags & ibv_send_flags_IBV_SEND_INLINE != 0 {
        let bytes: u64 = (0..n).map(|i| u64::from((*w.sg_list.add(i)).length)).sum();
        return bytes <= INLINE_BYTES as u64;
    }
    true
}

/// Copies `wr` (alone: `next` cleared) into `s`, its scatter list and inline payload too.
///
/// # Safety
/// `wr` is a valid work request that [`fits`].
#[inline]
pub unsafe fn copy_into(s: &mut Slot, wr: *const ibv_send_wr) {
    s.wr = *wr;
    s.wr.next = null_mut();
    let n = s.wr.num_sge.max(0) as usize;
    let src = (*wr).sg_list;
    if s.wr.send_flags & ibv_send_flags_IBV_SEND_INLINE != 0 {
        // The payload itself: the caller may overwrite its buffer once the post returns.
        let mut len = 0usize;
        for i in 0..n {
            let e = &*src.add(i);
            let l = e.length as usize;
            std::ptr::copy_nonoverlapping(e.addr as *const u8, s.inline.as_mut_ptr().add(len), l);
            len += l;
        }
        s.sge[0] = ibv_sge {
            addr: s.inline.as_ptr() as u64,
            length: len as u32,
            lkey: 0,
        };
        s.wr.num_sge = i32::from(n > 0);
    } else {
        std::ptr::copy_nonoverlapping(src, s.sge.as_mut_ptr(), n);
    }
    s.wr.sg_list = if n > 0 {
        s.sge.as_mut_ptr()
    } else {
        null_mut()
    };
}

/// The bytes slot `s`'s request carries.
pub fn bytes_of(s: &Slot) -> u64 {
    (0..s.wr.num_sge.clamp(0, MAX_SGE as i32) as usize)
        .map(|k| u64::from(s.sge[k].length))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_entry_request_takes_the_slots_first_three_lines() {
        // What the entry prefetches, from the slot's start: slots start on a line.
        assert_eq!(ENTRY_LINES, 3);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
    }
}

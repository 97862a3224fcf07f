//! `IBJITTER_TRACE=FILE`: the draws in the order they were made, for checking what a shaped
//! source (`IBJITTER_EPISODES`, `IBJITTER_CORRELATION`) produced, e.g. its autocorrelation.
//! A buffer of `IBJITTER_TRACE_MAX` 4-byte records (thread index and table index) is
//! allocated at the first draw, once, fallibly (a process that never draws, like every shell a
//! launcher starts, reserves nothing; under `ulimit -v` a refused allocation is one warning and
//! no trace, never an abort); each later draw takes the next record with one atomic add (no
//! lock, no syscall); the file is written at exit: `thread index delay` per line, and a first line
//! saying how many draws were made and kept. A forked child starts an empty trace.
use std::io::Write;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

static BUF: AtomicPtr<u32> = AtomicPtr::new(std::ptr::null_mut());
static CAP: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Draws made while another thread allocated the buffer (not waited for: see [`allocate`]).
static MISSED: AtomicUsize = AtomicUsize::new(0);
/// The buffer: not wanted, wanted (armed), being allocated, ready, or refused.
static BUF_STATE: AtomicU8 = AtomicU8::new(NONE);
const NONE: u8 = 0;
const ARMED: u8 = 1;
const ALLOCATING: u8 = 2;
const READY: u8 = 3;
const REFUSED: u8 = 4;

/// Table indices take 13 bits (two tables of 4096); the thread index the rest.
const INDEX_BITS: u32 = 13;

/// Asks for room for `cap` draws (at configuration; allocated at the first draw).
pub fn arm(cap: usize) {
    if cap > 0
        && BUF_STATE
            .compare_exchange(NONE, ARMED, AcqRel, Acquire)
            .is_ok()
    {
        CAP.store(cap, Release);
    }
}

/// The first draw's one allocation: zeroed pages from the allocator (touched only as records
/// are written), or None, said once, when the address space has no room for them.
#[cold]
fn allocate() -> bool {
    match BUF_STATE.compare_exchange(ARMED, ALLOCATING, AcqRel, Acquire) {
        Ok(_) => {}
        Err(READY) => return true,
        Err(ALLOCATING) => {
            // Another thread's first draw is allocating. Not waited for: that thread may be
            // this one, interrupted by a signal handler that posts, or gone from a fork child
            // (`reset`); this draw goes untraced, counted.
            MISSED.fetch_add(1, Relaxed);
            return false;
        }
        Err(_) => return false,
    }
    let cap = CAP.load(Acquire);
    let p = std::alloc::Layout::array::<u32>(cap)
        .ok()
        .filter(|l| l.size() > 0)
        // SAFETY: a non-zero layout; the memory is leaked on purpose (read at exit).
        .map_or(std::ptr::null_mut(), |l| unsafe {
            std::alloc::alloc_zeroed(l) as *mut u32
        });
    if p.is_null() {
        crate::sys::say::warn(&format!(
            "IBJITTER_TRACE: cannot allocate {} MiB for {cap} draws (address space limit?): no \
             trace is kept",
            (cap * 4) >> 20
        ));
        BUF_STATE.store(REFUSED, Release);
        return false;
    }
    BUF.store(p, Release);
    BUF_STATE.store(READY, Release);
    true
}

/// Records one draw (the post path, when tracing).
#[inline]
pub fn record(thread: u32, index: usize) {
    if BUF_STATE.load(Acquire) != READY && !allocate() {
        return;
    }
    let k = NEXT.fetch_add(1, Relaxed);
    let buf = BUF.load(Relaxed);
    if k < CAP.load(Relaxed) && !buf.is_null() {
        // SAFETY: k < CAP, the leaked buffer's length; each k is written once.
        unsafe { *buf.add(k) = (thread << INDEX_BITS) | index as u32 };
    }
}

/// fork() child: its own trace.
pub fn reset() {
    NEXT.store(0, Relaxed);
    MISSED.store(0, Relaxed);
    // A parent thread was allocating the buffer: it is not in the child, which allocates anew.
    let _ = BUF_STATE.compare_exchange(ALLOCATING, ARMED, AcqRel, Acquire);
}

/// Writes the trace to `path`: the delays are `table[index]`, in `unit`.
pub fn write(path: &str, table: &[u64], unit: &str) -> std::io::Result<()> {
    let buf = BUF.load(Acquire);
    if buf.is_null() {
        return Ok(());
    }
    let recorded = NEXT.load(Acquire);
    let kept = recorded.min(CAP.load(Acquire));
    let missed = MISSED.load(Acquire);
    let made = recorded + missed;
    // SAFETY: the leaked buffer holds CAP >= kept records.
    let records = unsafe { std::slice::from_raw_parts(buf, kept) };
    // Never through a link, never blocking, only the process's own regular file.
    let mut out = std::io::BufWriter::new(crate::sys::out_file::create(path)?);
    let first = if missed == 0 {
        format!("the first {kept} kept")
    } else {
        format!("{kept} kept ({missed} made while the trace's buffer was being allocated are not)")
    };
    writeln!(
        out,
        "# ibjitter trace: {made} draws, {first}; columns: thread index delay_{unit}"
    )?;
    for &r in records {
        let index = (r & ((1 << INDEX_BITS) - 1)) as usize;
        let delay = table.get(index).copied().unwrap_or(0);
        writeln!(out, "{} {index} {delay}", r >> INDEX_BITS)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A draw that finds the buffer being allocated (by another thread, by the code its
    /// signal handler interrupted, or by a parent thread a fork child does not have) returns
    /// at once, counted; a fork child allocates anew. It waited for the allocation before:
    /// for ever in the last two cases.
    #[test]
    fn a_draw_during_the_buffers_allocation_does_not_wait_for_it() {
        BUF_STATE.store(ALLOCATING, Release);
        CAP.store(16, Release);
        // On a thread of its own: a wait would hang it, not the test.
        let (done, returned) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            record(1, 7);
            let _ = done.send(());
        });
        returned
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the draw waited for the allocation");
        assert_eq!(MISSED.load(Relaxed), 1);
        assert_eq!(NEXT.load(Relaxed), 0);
        reset();
        assert_eq!(BUF_STATE.load(Acquire), ARMED);
        record(1, 7);
        assert_eq!(BUF_STATE.load(Acquire), READY);
        assert_eq!(NEXT.load(Relaxed), 1);
        // SAFETY: the buffer holds CAP records; the first was written.
        assert_eq!(unsafe { *BUF.load(Acquire) }, (1 << INDEX_BITS) | 7);
    }
}

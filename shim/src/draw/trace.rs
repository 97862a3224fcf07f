//! `IBJITTER_TRACE=FILE`: the draws in the order they were made, for checking what a shaped
//! source (`IBJITTER_EPISODES`, `IBJITTER_CORRELATION`) produced, e.g. its autocorrelation.
//! A buffer of `IBJITTER_TRACE_MAX` 4-byte records (thread index and table index) is
//! allocated at load; each draw takes the next record with one atomic add (no lock, no
//! syscall); the file is written at exit: `thread index delay` per line, and a first line
//! saying how many draws were made and kept. A forked child starts an empty trace.
use std::io::Write;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

static BUF: AtomicPtr<u32> = AtomicPtr::new(std::ptr::null_mut());
static CAP: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Table indices take 13 bits (two tables of 4096); the thread index the rest.
const INDEX_BITS: u32 = 13;

/// Allocates room for `cap` draws (at load).
pub fn arm(cap: usize) {
    if BUF.load(Acquire).is_null() && cap > 0 {
        let b: Box<[u32]> = vec![0; cap].into_boxed_slice();
        CAP.store(cap, Release);
        BUF.store(Box::leak(b).as_mut_ptr(), Release);
    }
}

/// Records one draw (the post path, when tracing).
#[inline]
pub fn record(thread: u32, index: usize) {
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
}

/// Writes the trace to `path`: the delays are `table[index]`, in `unit`.
pub fn write(path: &str, table: &[u64], unit: &str) -> std::io::Result<()> {
    let buf = BUF.load(Acquire);
    if buf.is_null() {
        return Ok(());
    }
    let made = NEXT.load(Acquire);
    let kept = made.min(CAP.load(Acquire));
    // SAFETY: the leaked buffer holds CAP >= kept records.
    let records = unsafe { std::slice::from_raw_parts(buf, kept) };
    // Never through a link, never blocking, only the process's own regular file.
    let mut out = std::io::BufWriter::new(crate::sys::out_file::create(path)?);
    writeln!(
        out,
        "# ibjitter trace: {made} draws, the first {kept} kept; columns: thread index delay_{unit}"
    )?;
    for &r in records {
        let index = (r & ((1 << INDEX_BITS) - 1)) as usize;
        let delay = table.get(index).copied().unwrap_or(0);
        writeln!(out, "{} {index} {delay}", r >> INDEX_BITS)?;
    }
    out.flush()
}

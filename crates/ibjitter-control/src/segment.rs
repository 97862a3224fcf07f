//! The segment's layout: the fields both sides read and write at fixed offsets, the
//! commands, the texts' limits, and the whole-file read and field writes.
use std::fs::File;
use std::os::unix::fs::FileExt;

/// "IBJCTL" and the layout's version: 02 read and wrote the file with pread/pwrite and added
/// the creator's pid namespace and the heartbeat; 03 sleeps until woken through its FIFO
/// (an 02 client, which never wakes it, would take its heartbeat for stopped).
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBJCTL03");
/// The first bytes of every layout's magic: a file that starts so but differs in the version
/// was made by another ibjitter version.
pub(crate) const MAGIC_FAMILY: &[u8; 6] = b"IBJCTL";
/// How often the process looks for a request when it has no wake FIFO.
pub const POLL_MS: u64 = 10;
/// The longest the process's control thread sleeps unwoken (its heartbeat's longest gap).
pub const IDLE_WAKE_MS: u64 = 1000;
/// A client waiting for an answer or a heartbeat wakes the thread again this often.
pub(crate) const WAKE_AGAIN_MS: u64 = 20;
/// A heartbeat that has not moved for this many polls: nobody serves the segment.
pub const SILENT_POLLS: u64 = 10;
/// Bytes of text each way (the settings of a `set`, the answer's message, the table's name),
/// its NUL terminator included.
pub const TEXT: usize = 1024;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Command {
    Status = 1,
    /// New settings: `IBJITTER_*=value` lines in [`Segment::text`].
    Set = 2,
    Pause = 3,
    Resume = 4,
}

impl Command {
    pub fn from_u32(v: u32) -> Option<Command> {
        [
            Command::Status,
            Command::Set,
            Command::Pause,
            Command::Resume,
        ]
        .into_iter()
        .find(|c| *c as u32 == v)
    }
}

/// [`Segment::state`] bits.
pub const STATE_INJECTING: u32 = 1;
pub const STATE_PAUSED: u32 = 2;

/// The file's layout (`repr(C)`, integers and bytes only, no padding; both sides are built
/// from this crate and the file never leaves the host).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Segment {
    pub magic: u64,
    pub pid: u64,
    /// The process's start time (`/proc/PID/stat` field 22): a reused pid does not match.
    pub start_time: u64,
    /// The inode of the creator's `/proc/self/ns/pid` (0: unknown): its pid and start time
    /// mean something only in that pid namespace.
    pub pid_ns: u64,
    /// CLOCK_MONOTONIC ns of the control thread's last poll.
    pub heartbeat_ns: u64,
    /// The last request's number (the client bumps it), and the last one applied.
    pub request: u64,
    pub done: u64,
    pub command: u32,
    /// 0: applied; 1: refused (the reason in `answer`).
    pub result: u32,
    /// [`STATE_INJECTING`], [`STATE_PAUSED`].
    pub state: u32,
    pub _pad: u32,
    /// Counts at the answer: sends that passed a hook, delayed ones, their delays' sum (ns).
    pub posts: u64,
    pub delayed: u64,
    pub sum_ns: u64,
    /// When the request was applied (CLOCK_MONOTONIC ns, for the switch latency).
    pub applied_ns: u64,
    /// The request's text (settings), the answer's text (an error, or the table now in use),
    /// each NUL-terminated.
    pub text: [u8; TEXT],
    pub answer: [u8; TEXT],
}

/// Size of the file.
pub const SIZE: usize = std::mem::size_of::<Segment>();
// Every byte is a field's: the byte views below never expose padding.
const _: () = assert!(SIZE == 11 * 8 + 4 * 4 + 2 * TEXT);

impl Segment {
    pub(crate) fn zeroed() -> Segment {
        Segment::from_bytes(&[0; SIZE])
    }

    pub(crate) fn from_bytes(b: &[u8; SIZE]) -> Segment {
        // SAFETY: SIZE bytes; every bit pattern is a valid Segment (integers and bytes).
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: a Segment is SIZE initialized bytes (no padding, asserted above).
        unsafe { std::slice::from_raw_parts((self as *const Segment).cast(), SIZE) }
    }

    /// Writes `s` into `buf`, NUL-terminated, truncated to `TEXT - 1` bytes; says whether it
    /// fitted whole.
    pub fn put(buf: &mut [u8; TEXT], s: &str) -> bool {
        let b = s.as_bytes();
        let n = b.len().min(TEXT - 1);
        buf[..n].copy_from_slice(&b[..n]);
        buf[n..].fill(0);
        n == b.len()
    }

    /// The NUL-terminated text in `buf`; `None` when it has no terminator.
    pub fn get(buf: &[u8; TEXT]) -> Option<String> {
        let n = buf.iter().position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

/// Why `text` cannot be a request's text: longer than a segment holds, or with a NUL in it.
pub fn check_text(text: &str) -> Result<(), String> {
    if text.len() > TEXT - 1 {
        return Err(format!(
            "the request is {} bytes; a control request holds at most {} bytes",
            text.len(),
            TEXT - 1
        ));
    }
    if text.contains('\0') {
        return Err("the request contains a NUL byte".into());
    }
    Ok(())
}

/// Reads the whole segment; `None` when the file is shorter (truncated under us).
pub(crate) fn read(file: &File) -> std::io::Result<Option<Segment>> {
    let mut b = [0u8; SIZE];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) => Ok(Some(Segment::from_bytes(&b))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes bytes `range` of `seg` at their offsets.
pub(crate) fn write(
    file: &File,
    seg: &Segment,
    range: std::ops::Range<usize>,
) -> std::io::Result<()> {
    file.write_all_at(&seg.as_bytes()[range.clone()], range.start as u64)
}

/// The field `$f`'s byte range in the file.
macro_rules! field {
    ($f:ident) => {{
        let start = std::mem::offset_of!($crate::segment::Segment, $f);
        let s = $crate::segment::Segment::zeroed();
        start..start + std::mem::size_of_val(&s.$f)
    }};
}

pub(crate) fn magic_name(m: u64) -> String {
    String::from_utf8_lossy(&m.to_le_bytes()).into_owned()
}

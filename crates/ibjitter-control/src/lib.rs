//! The live-control segment: one small file per injected process,
//! `/dev/shm/ibjitter.<uid>/<pid>.<pidns>` ([`path`]), served by `libibjitter.so`
//! ([`Server`]) and sent requests by `ibjitter inject` ([`send`]).
//!
//! Neither side maps the file: both read and write it with `pread`/`pwrite` at the fixed
//! offsets of [`Segment`]. A mapping of a file that someone truncates faults (SIGBUS) on the
//! next touch, and the shim lives in other people's processes: a short read is "no request",
//! never a crash. Requests from concurrent `ibjitter inject` runs are serialized by an `flock`
//! on the file, taken without blocking and retried within the request's timeout.
//!
//! A request: the client writes its fields ([`Segment::command`], the settings text), then
//! bumps [`Segment::request`] and wakes the process's control thread through its FIFO
//! (`<pid>.<pidns>.wake`, [`wake`]); the thread (never on a post path) stamps
//! [`Segment::heartbeat_ns`] at each wake-up, applies the request, writes its answer (result,
//! counts, the state) and then sets [`Segment::done`] to the request's number. Unwoken, the
//! thread sleeps [`IDLE_WAKE_MS`] ms between looks: on a node whose cores are all busy, a
//! thread that woke every 10 ms took 0.7 % of a core (58-75 µs of CPU a wake-up under KVM).
//! Without its FIFO it looks every [`POLL_MS`] ms.
use std::fs::{File, OpenOptions};
use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// "IBJCTL" and the layout's version: 02 read and wrote the file with pread/pwrite and added
/// the creator's pid namespace and the heartbeat; 03 sleeps until woken through its FIFO
/// (an 02 client, which never wakes it, would take its heartbeat for stopped).
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBJCTL03");
/// The first bytes of every layout's magic: a file that starts so but differs in the version
/// was made by another ibjitter version.
const MAGIC_FAMILY: &[u8; 6] = b"IBJCTL";
/// How often the process looks for a request when it has no wake FIFO.
pub const POLL_MS: u64 = 10;
/// The longest the process's control thread sleeps unwoken (its heartbeat's longest gap).
pub const IDLE_WAKE_MS: u64 = 1000;
/// A client waiting for an answer or a heartbeat wakes the thread again this often.
const WAKE_AGAIN_MS: u64 = 20;
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
    fn zeroed() -> Segment {
        Segment::from_bytes(&[0; SIZE])
    }

    fn from_bytes(b: &[u8; SIZE]) -> Segment {
        // SAFETY: SIZE bytes; every bit pattern is a valid Segment (integers and bytes).
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) }
    }

    fn as_bytes(&self) -> &[u8] {
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

fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The directory of this user's segments.
pub fn dir() -> PathBuf {
    // This crate's unit tests make segments for pids that run nothing: in the real directory,
    // any injected process's start (its sweep of files of processes gone) could take them
    // mid-test.
    let name = if cfg!(test) {
        "ibjitter-unit-tests"
    } else {
        "ibjitter"
    };
    PathBuf::from(format!("/dev/shm/{name}.{}", uid()))
}

/// The segment file of `pid` in this pid namespace: `<pid>.<namespace>`, the namespace being
/// the inode of `/proc/self/ns/pid` (0 when `/proc` does not say). Containers that share
/// `/dev/shm` but not a pid namespace (Docker's `--ipc=host`, a rank per container: small
/// pids, pid 1 in each) name their files apart: with the pid alone, the second one's file
/// replaced the first's, whose exit then removed it.
pub fn path(pid: u32) -> PathBuf {
    dir().join(format!("{pid}.{}", pid_ns().unwrap_or(0)))
}

/// The FIFO that wakes the control thread of `pid`.
pub fn wake_path(pid: u32) -> PathBuf {
    wake_path_of(&path(pid))
}

/// The FIFO beside segment file `p`.
fn wake_path_of(p: &Path) -> PathBuf {
    let mut w = p.as_os_str().to_owned();
    w.push(".wake");
    PathBuf::from(w)
}

/// Removes the segment of `pid` and its wake FIFO.
pub fn remove(pid: u32) {
    remove_path(&path(pid));
}

/// Removes segment file `p` and its wake FIFO.
pub fn remove_path(p: &Path) {
    let _ = std::fs::remove_file(p);
    let _ = std::fs::remove_file(wake_path_of(p));
}

/// Wakes the control thread of `pid` (one byte into its FIFO, never blocking): false when
/// nobody reads the FIFO (no such process, one that exec'd, an older shim without one) or it
/// is not a FIFO of this user's. A full FIFO is a wake-up already pending.
pub fn wake(pid: u32) -> bool {
    wake_at(&wake_path(pid))
}

fn wake_at(fifo: &Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let Ok(mut f) = OpenOptions::new()
        .write(true)
        // Never a link; no reader is ENXIO, not a wait.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(fifo)
    else {
        return false;
    };
    match f.metadata() {
        Ok(m) if m.file_type().is_fifo() && m.uid() == uid() => {}
        _ => return false,
    }
    match f.write_all(&[1]) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot), if readable.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_start_time(pid).ok()
}

fn proc_start_time(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let bad = || std::io::Error::other(format!("/proc/{pid}/stat: no start time"));
    let rest = &stat[stat.rfind(')').ok_or_else(bad)? + 1..];
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), if `/proc` says.
pub fn pid_ns() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Checks that `d` is a directory (not a link) of this user, private to it.
pub fn check_dir(d: &Path) -> Result<(), OpenError> {
    let meta = match std::fs::symlink_metadata(d) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) => return Err(OpenError::Io(e)),
    };
    let uid = uid();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(OpenError::Unsafe(format!(
            "{} is not a private directory of uid {uid} (a {}, owner uid {}, mode {:o}; \
             expected a directory of uid {uid}, mode 700)",
            d.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "file"
    } else {
        "special file"
    }
}

/// Reads the whole segment; `None` when the file is shorter (truncated under us).
fn read(file: &File) -> std::io::Result<Option<Segment>> {
    let mut b = [0u8; SIZE];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) => Ok(Some(Segment::from_bytes(&b))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes bytes `range` of `seg` at their offsets.
fn write(file: &File, seg: &Segment, range: std::ops::Range<usize>) -> std::io::Result<()> {
    file.write_all_at(&seg.as_bytes()[range.clone()], range.start as u64)
}

/// The field `$f`'s byte range in the file.
macro_rules! field {
    ($f:ident) => {{
        let start = offset_of!(Segment, $f);
        let s = Segment::zeroed();
        start..start + std::mem::size_of_val(&s.$f)
    }};
}

/// The process's side: the segment it made, served by its control thread.
pub struct Server {
    file: Held,
    pid: u64,
    /// Its wake FIFO, open for reading (and writing: never at end of file); why not when it
    /// could not be made (the thread then looks every [`POLL_MS`] ms).
    wake: Result<Held, String>,
}

/// The lowest number the server's descriptors take: above those a program's own opens take
/// first, so that a program that closed every descriptor it did not know (`closefrom`, a
/// daemon's close-all loop) does not get their numbers back at its next opens.
const FD_FLOOR: libc::c_int = 100;

/// A descriptor the server opened, and the file it names (device, inode). The program the
/// server lives in may close that number or put a file of its own under it (`dup2`, a
/// shell's `exec 4<file`): the server then must not read, write or close it
/// ([`Held::ours`]); dropped, it is closed only while it is still the server's.
struct Held {
    file: std::mem::ManuallyDrop<File>,
    id: (u64, u64),
}

impl Held {
    fn new(f: File) -> std::io::Result<Held> {
        use std::os::fd::FromRawFd;
        // SAFETY: fcntl on our own descriptor; on success the new one is ours alone.
        let high = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, FD_FLOOR) };
        // Below a small `ulimit -n` it stays where it is.
        let f = if high >= 0 {
            // SAFETY: `high` is a descriptor just made for us; `f` is closed by its drop.
            unsafe { File::from_raw_fd(high) }
        } else {
            f
        };
        let m = f.metadata()?;
        Ok(Held {
            id: (m.dev(), m.ino()),
            file: std::mem::ManuallyDrop::new(f),
        })
    }

    /// Whether its number still names the file opened (one `fstat`).
    fn ours(&self) -> bool {
        // SAFETY: fstat into a zeroed stat; a closed number is an error, not a fault.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let stated = unsafe { libc::fstat(self.file.as_raw_fd(), &mut st) } == 0;
        stated && (st.st_dev, st.st_ino) == self.id
    }

    fn fd(&self) -> libc::c_int {
        self.file.as_raw_fd()
    }
}

impl std::ops::Deref for Held {
    type Target = File;
    fn deref(&self) -> &File {
        &self.file
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.ours() {
            // SAFETY: dropped once, here; the number is still the file we opened.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.file) };
        }
    }
}

/// A request read from the segment.
#[derive(Debug)]
pub struct Request {
    /// Its number ([`Server::answer`] marks it done).
    pub number: u64,
    /// `Err(raw value)` for a command this version does not know.
    pub command: Result<Command, u32>,
    /// The settings; `None` when the text has no terminator (not a whole request).
    pub text: Option<String>,
}

/// What the process answers.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub ok: bool,
    pub text: String,
    pub state: u32,
    pub posts: u64,
    pub delayed: u64,
    pub sum_ns: u64,
    pub applied_ns: u64,
}

/// Creates (or replaces) this process's segment, marked with its pid, start time and pid
/// namespace. The directory must be this user's own and private (not a symlink); the file is
/// made under a temporary name without following links, its space reserved for real (a full
/// `/dev/shm` is an error here, not a fault later), and renamed into place once complete, so
/// a reader never sees a half-made segment and nobody else's file is ever written.
pub fn create(pid: u32) -> std::io::Result<(Server, PathBuf)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let d = dir();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&d)?;
    check_dir(&d).map_err(|e| std::io::Error::other(e.describe(pid)))?;
    let p = path(pid);
    let mut tmp = p.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let made = fill(&file, pid).and_then(|()| Held::new(file));
    let file = match made {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    // The FIFO first: a client that finds the segment finds the FIFO it wakes.
    let wake_path = wake_path_of(&p);
    let wake = make_wake_fifo(&wake_path);
    if let Err(e) = std::fs::rename(&tmp, &p) {
        // Neither is anyone's: nothing removes a `.new`, and the FIFO would stay beside no
        // segment (a sandbox refusing rename left both in /dev/shm for good).
        drop(wake);
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(&wake_path);
        return Err(e);
    }
    Ok((
        Server {
            file,
            pid: u64::from(pid),
            wake,
        },
        p,
    ))
}

/// Makes wake FIFO `w` (replacing an old one) and opens it without blocking; why not if it
/// cannot be made or is not then a FIFO of this user's.
fn make_wake_fifo(w: &Path) -> Result<Held, String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let why = |e: std::io::Error| format!("{}: {e}", w.display());
    let _ = std::fs::remove_file(w);
    let c = std::ffi::CString::new(w.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(why(std::io::Error::last_os_error()));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(w)
        .map_err(why)?;
    let m = f.metadata().map_err(why)?;
    if m.file_type().is_fifo() && m.uid() == uid() {
        Held::new(f).map_err(why)
    } else {
        Err(format!("{}: not a FIFO of uid {}", w.display(), uid()))
    }
}

/// Reserves the file's blocks and writes its first contents.
fn fill(file: &File, pid: u32) -> std::io::Result<()> {
    // SAFETY: fallocate on our own descriptor.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SIZE as libc::off_t) };
    if r != 0 {
        let e = std::io::Error::from_raw_os_error(r);
        return Err(std::io::Error::new(
            e.kind(),
            format!("reserving {SIZE} bytes: {e}"),
        ));
    }
    let mut s = Segment::zeroed();
    s.magic = MAGIC;
    s.pid = u64::from(pid);
    s.start_time = start_time(pid).unwrap_or(0);
    s.pid_ns = pid_ns().unwrap_or(0);
    s.heartbeat_ns = monotonic_ns();
    write(file, &s, 0..SIZE)
}

impl Server {
    /// Why the server has no wake FIFO (it then looks every [`POLL_MS`] ms), if it has none.
    pub fn no_wake(&self) -> Option<&str> {
        self.wake.as_ref().err().map(String::as_str)
    }

    /// Sleeps until a client wakes this thread or [`IDLE_WAKE_MS`] pass ([`POLL_MS`] without
    /// a FIFO); the wake-ups pending are taken. Returns at once when the FIFO's number is no
    /// longer the FIFO ([`Server::lost`] then says so): nothing is read from it.
    /// `Ok(Some(why))`: the FIFO could not be polled (a sandbox's `RLIMIT_NOFILE` of 0 makes
    /// `poll` fail with EINVAL, a seccomp filter with EPERM), and this thread slept
    /// [`POLL_MS`] instead. `Err`: it cannot sleep at all ([`nap`]): it must stop, not spin.
    pub fn wait(&self) -> Result<Option<String>, String> {
        let cannot_sleep = || {
            "this thread cannot sleep (clock_nanosleep and poll fail: a seccomp filter?)"
                .to_string()
        };
        let Ok(f) = &self.wake else {
            return if nap(POLL_MS * 1_000_000) {
                Ok(None)
            } else {
                Err(cannot_sleep())
            };
        };
        let mut p = libc::pollfd {
            fd: f.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, IDLE_WAKE_MS as libc::c_int) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(None);
            }
            // Returned at once: without a sleep of another kind this thread would spin.
            return if nap(POLL_MS * 1_000_000) {
                Ok(Some(format!(
                    "its wake FIFO cannot be polled ({e}): it looks every {POLL_MS} ms"
                )))
            } else {
                Err(cannot_sleep())
            };
        }
        let ready = rc > 0;
        // A closed number answers POLLNVAL at once; a file the program put under it may read
        // as ready: checked just before the read, which would take the program's data.
        if ready && p.revents & libc::POLLIN != 0 && f.ours() {
            let mut b = [0u8; 64];
            // SAFETY: reads into our buffer from our non-blocking descriptor, until empty.
            while unsafe { libc::read(f.fd(), b.as_mut_ptr().cast(), b.len()) } > 0 {}
        }
        Ok(None)
    }

    /// Which of the server's descriptors the program closed or put another file under, if
    /// any: the server must stop (and drop, which leaves that number alone).
    pub fn lost(&self) -> Option<String> {
        if !self.file.ours() {
            return Some(format!("descriptor {} (its control file)", self.file.fd()));
        }
        match &self.wake {
            Ok(w) if !w.ours() => Some(format!("descriptor {} (its wake FIFO)", w.fd())),
            _ => None,
        }
    }

    /// One poll: stamps the heartbeat and returns the pending request, if any. An error when
    /// the file is no longer the segment this process made (truncated or overwritten): nothing
    /// is written to it then.
    pub fn poll(&self) -> Result<Option<Request>, String> {
        self.still_ours()?;
        let s = match read(&self.file) {
            Ok(Some(s)) => s,
            Ok(None) => return Err("the control file was truncated".into()),
            Err(e) => return Err(format!("the control file cannot be read: {e}")),
        };
        if s.magic != MAGIC || s.pid != self.pid {
            return Err("the control file was overwritten".into());
        }
        let mut beat = s;
        beat.heartbeat_ns = monotonic_ns();
        self.still_ours()?;
        write(&self.file, &beat, field!(heartbeat_ns))
            .map_err(|e| format!("the control file cannot be written: {e}"))?;
        if s.request == s.done {
            return Ok(None);
        }
        Ok(Some(Request {
            number: s.request,
            command: Command::from_u32(s.command).ok_or(s.command),
            text: Segment::get(&s.text),
        }))
    }

    /// Writes the answer to `req`, then marks it done.
    pub fn answer(&self, req: &Request, reply: &Reply) -> std::io::Result<()> {
        let mut s = Segment::zeroed();
        s.result = u32::from(!reply.ok);
        s.state = reply.state;
        s.posts = reply.posts;
        s.delayed = reply.delayed;
        s.sum_ns = reply.sum_ns;
        s.applied_ns = reply.applied_ns;
        if !Segment::put(&mut s.answer, &reply.text) {
            // Said, not silently cut: the last bytes mark it.
            s.answer[TEXT - 4..TEXT - 1].copy_from_slice(b"...");
        }
        // Each write right after a look at the descriptor: applying the request (a new
        // table) took a while, in which the program may have put a file of its own under it.
        let ours = || self.still_ours().map_err(std::io::Error::other);
        ours()?;
        write(&self.file, &s, field!(result).start..field!(text).start)?;
        ours()?;
        write(&self.file, &s, field!(answer))?;
        s.done = req.number;
        ours()?;
        write(&self.file, &s, field!(done))
    }

    /// Err (what [`Server::lost`] says) when the segment's number is no longer its file.
    fn still_ours(&self) -> Result<(), String> {
        match self.file.ours() {
            true => Ok(()),
            false => Err(format!(
                "descriptor {} is no longer the control file",
                self.file.fd()
            )),
        }
    }
}

/// Why a segment cannot be used.
#[derive(Debug)]
pub enum OpenError {
    /// No such file: the process is not injected, or has not opened a device yet.
    Missing,
    /// The process that made it is gone (or the pid was reused), as this pid namespace
    /// proves: the file is stale.
    Stale,
    /// Not a segment (wrong size or another pid in it): left alone.
    Foreign,
    /// A segment of another layout: another ibjitter version made it (its magic).
    OtherVersion(String),
    /// Not this user's own private directory or file (the reason): never used.
    Unsafe(String),
    /// Made in another pid namespace, or where `/proc` was unreadable (here or there): whether
    /// its process lives cannot be told from here, so it is neither used nor removed.
    Unreachable,
    /// Its process lives but no control thread answers (it exec'd a program without the shim,
    /// or is stopped): the heartbeat has not moved for [`SILENT_POLLS`] polls.
    NotServing,
    Io(std::io::Error),
}

impl OpenError {
    /// The error in words, for the segment of `pid`.
    pub fn describe(&self, pid: u32) -> String {
        self.describe_file(&find(pid), pid)
    }

    /// The error in words, for segment file `p` of `pid`.
    pub fn describe_file(&self, p: &Path, pid: u32) -> String {
        let p = p.display();
        match self {
            OpenError::Missing => format!(
                "no control segment {p}: is {pid} running under libibjitter.so (with \
                 IBJITTER_CONTROL unset or 1), and has it opened an RDMA device yet?"
            ),
            OpenError::Stale => format!("process {pid} is gone (its control file is stale)"),
            OpenError::Foreign => format!("{p} is not a control segment"),
            OpenError::OtherVersion(m) => format!(
                "{p} was made by another ibjitter version (layout {m}; this one reads {}): \
                 use the ibjitter of the libibjitter.so the process runs",
                magic_name(MAGIC)
            ),
            OpenError::Unsafe(why) => {
                format!("{why}: refused (another user could answer for process {pid})")
            }
            OpenError::Unreachable => format!(
                "{p} was made in another pid namespace (a container sharing /dev/shm?) or \
                 without a readable /proc: not reachable from this pid namespace; left alone"
            ),
            OpenError::NotServing => format!(
                "process {pid} has a control file but is not serving it (exec'd without the \
                 shim, or stopped): no heartbeat for at least {} ms",
                SILENT_POLLS * POLL_MS
            ),
            OpenError::Io(e) => format!("{p}: {e}"),
        }
    }
}

fn magic_name(m: u64) -> String {
    String::from_utf8_lossy(&m.to_le_bytes()).into_owned()
}

/// The client's side: an open segment of a live process that serves it.
pub struct Client {
    pub pid: u32,
    file: File,
    /// The file opened (its wake FIFO is beside it).
    path: PathBuf,
}

/// Opens the segment of `pid` for requests; checks it is this user's own, of this layout,
/// made by that very process (in this pid namespace) and served.
pub fn open(pid: u32) -> Result<Client, OpenError> {
    check_dir(&dir())?;
    open_path(&find(pid), pid)
}

/// The file of `pid` that [`open`] reads: this namespace's; else one of a shim from before
/// namespaced names (`<pid>`, the same layout 03) or of another namespace (unreachable from
/// here, and said so); this namespace's name when there is none.
fn find(pid: u32) -> PathBuf {
    let p = path(pid);
    if std::fs::symlink_metadata(&p).is_ok() {
        return p;
    }
    // By pid, then namespace: a legacy name first.
    listed()
        .into_iter()
        .find(|f| f.pid == pid)
        .map_or(p, |f| f.path)
}

/// [`open`] of the file at `p` (its directory already checked).
pub fn open_path(p: &Path, pid: u32) -> Result<Client, OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        // Never a link; a FIFO put there must not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(OpenError::Unsafe(format!(
                "{} is a symbolic link",
                p.display()
            )))
        }
        Err(e) => return Err(OpenError::Io(e)),
    };
    let meta = file.metadata().map_err(OpenError::Io)?;
    let uid = uid();
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(OpenError::Unsafe(format!(
            "{} is not a private file of uid {uid} (a {}, owner uid {}, mode {:o}; expected \
             a file of uid {uid}, mode 600)",
            p.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut m = [0u8; 8];
    if file.read_exact_at(&mut m, 0).is_err() {
        return Err(OpenError::Foreign);
    }
    if m != MAGIC.to_le_bytes() {
        return Err(if m.starts_with(MAGIC_FAMILY) {
            OpenError::OtherVersion(magic_name(u64::from_le_bytes(m)))
        } else {
            OpenError::Foreign
        });
    }
    let s = match read(&file).map_err(OpenError::Io)? {
        Some(s) if meta.len() == SIZE as u64 && s.pid == u64::from(pid) => s,
        _ => return Err(OpenError::Foreign),
    };
    match maker_gone(&s, pid) {
        Some(false) => {}
        Some(true) => return Err(OpenError::Stale),
        None => return Err(OpenError::Unreachable),
    }
    let c = Client {
        pid,
        file,
        path: p.to_path_buf(),
    };
    if !c.serving(s.heartbeat_ns) {
        return Err(OpenError::NotServing);
    }
    Ok(c)
}

impl Client {
    /// Whether a control thread serves the segment: its heartbeat is recent, or (clocks of
    /// another time namespace, a slow poll) moves within [`SILENT_POLLS`] polls.
    fn serving(&self, beat: u64) -> bool {
        let silent = Duration::from_millis(SILENT_POLLS * POLL_MS);
        if beat != 0 && monotonic_ns().saturating_sub(beat) <= silent.as_nanos() as u64 {
            return true;
        }
        // An idle thread sleeps up to IDLE_WAKE_MS: woken, it stamps at once (woken again
        // every WAKE_AGAIN_MS: a wake-up is never lost, but costs nothing to repeat).
        let t0 = Instant::now();
        let mut woken = None::<Instant>;
        while t0.elapsed() < silent {
            if woken.is_none_or(|w| w.elapsed() >= Duration::from_millis(WAKE_AGAIN_MS)) {
                self.wake();
                woken = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
            match read(&self.file) {
                Ok(Some(s)) if s.heartbeat_ns != beat => return true,
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        false
    }

    /// Wakes the process's control thread through the FIFO beside the file opened.
    fn wake(&self) -> bool {
        wake_at(&wake_path_of(&self.path))
    }

    /// Takes the file's lock without blocking, retrying until `deadline`.
    fn lock(&self, deadline: Instant) -> Result<(), String> {
        loop {
            // SAFETY: flock on our open descriptor; released when the file closes.
            if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(format!("flock {}: {e}", self.path.display()));
            }
            if Instant::now() >= deadline {
                let holder = self
                    .lock_holder()
                    .map_or_else(|| "another process".into(), |h| format!("process {h}"));
                return Err(format!(
                    "the control file of process {} stayed locked by {holder} until the \
                     timeout (another `ibjitter inject` still waiting, or someone holding \
                     its lock); nothing sent",
                    self.pid
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The pid holding an flock on the file, from `/proc/locks` (if it says).
    fn lock_holder(&self) -> Option<u32> {
        let ino = self.file.metadata().ok()?.ino();
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        locks.lines().find_map(|l| {
            // "1: FLOCK  ADVISORY  WRITE 4242 00:1a:12345 0 EOF"
            let f: Vec<&str> = l.split_whitespace().collect();
            let dev_ino = f.get(5)?;
            (f.get(1) == Some(&"FLOCK") && dev_ino.rsplit(':').next()?.parse() == Ok(ino))
                .then(|| f.get(4)?.parse().ok())?
        })
    }
}

/// A segment file in [`dir`] (live or stale).
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub pid: u32,
    /// The pid namespace its name says; None for a file of a shim from before namespaced
    /// names (`<pid>`).
    pub ns: Option<u64>,
    pub path: PathBuf,
}

/// What a file of [`dir`] is, by its name.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// `<pid>.<ns>`, or `<pid>` (before namespaced names).
    Segment,
    /// `<pid>.<ns>.new`: a segment being made (left by a process that died meanwhile).
    Making,
    /// `<pid>.<ns>.wake`: a segment's wake FIFO.
    Wake,
}

/// The segment files in [`dir`], of every pid namespace, by pid.
pub fn listed() -> Vec<Listed> {
    let mut v: Vec<Listed> = entries()
        .into_iter()
        .filter(|(kind, _)| *kind == Kind::Segment)
        .map(|(_, l)| l)
        .collect();
    v.sort_unstable_by_key(|l| (l.pid, l.ns));
    v
}

/// The files of [`dir`] this crate names, of every kind.
fn entries() -> Vec<(Kind, Listed)> {
    let d = dir();
    std::fs::read_dir(&d)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name();
                    let (kind, pid, ns) = parse_name(name.to_str()?)?;
                    let path = d.join(name);
                    Some((kind, Listed { pid, ns, path }))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `<pid>.<namespace>` (a legacy `<pid>`), and its `.new` and `.wake` files; None for
/// anything else (a legacy `<pid>.wake`: whose namespace it is, its name does not say).
fn parse_name(name: &str) -> Option<(Kind, u32, Option<u64>)> {
    let mut parts = name.split('.');
    let pid = parts.next()?.parse().ok()?;
    let Some(ns) = parts.next() else {
        return Some((Kind::Segment, pid, None));
    };
    let ns = Some(ns.parse().ok()?);
    let kind = match parts.next() {
        None => Kind::Segment,
        Some("new") => Kind::Making,
        Some("wake") => Kind::Wake,
        Some(_) => return None,
    };
    parts.next().is_none().then_some((kind, pid, ns))
}

/// Removes the files of this user's processes that are gone, as this pid namespace proves
/// (at most `limit`, so the cost stays bounded); returns how many. A process that ended by a
/// signal's default action, SIGKILL or `_exit` (a job cancelled, a time limit) never removes
/// its own: without this, such files gathered on a node for ever. Files another pid
/// namespace's name are left at once; one `kill(pid, 0)` tells a live process of this
/// namespace from the rest; a file is removed only when its segment says it was made in this
/// namespace by a process that is not there any more, and only that very file (a process that
/// took the pid meanwhile may have put its own in its place). The directory is not checked
/// here: [`create`] just did.
pub fn remove_stale(limit: usize) -> usize {
    let here = pid_ns().unwrap_or(0);
    let (mut removed, mut opened) = (0, 0);
    for (kind, f) in entries() {
        // Bounded work too: files it cannot remove are opened again at each start.
        if removed >= limit || opened >= limit.saturating_mul(4) {
            break;
        }
        let swept = match kind {
            Kind::Segment => sweep(&f, here),
            Kind::Making | Kind::Wake => sweep_leftover(kind, &f, here),
        };
        match swept {
            Swept::Left => {}
            Swept::Opened => opened += 1,
            Swept::Removed => (opened, removed) = (opened + 1, removed + 1),
        }
    }
    removed
}

/// What the sweep did with one file.
#[derive(Debug, PartialEq)]
enum Swept {
    /// Another namespace's, or its pid is a live process: not even opened.
    Left,
    /// Opened and kept (not a segment whose maker is gone).
    Opened,
    Removed,
}

/// Whether `f` is named in namespace `here` (or by an earlier shim) for a pid that no
/// process of `here` has.
fn gone_here(f: &Listed, here: u64) -> bool {
    if f.ns.is_some_and(|ns| ns != here) {
        return false;
    }
    let Ok(p) = libc::pid_t::try_from(f.pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    p > 0
        && unsafe { libc::kill(p, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Sweeps segment file `f` from pid namespace `here`.
fn sweep(f: &Listed, here: u64) -> Swept {
    if !gone_here(f, here) {
        return Swept::Left;
    }
    let Some(stale) = stale_file(&f.path, f.pid) else {
        return Swept::Opened;
    };
    let same = std::fs::symlink_metadata(&f.path).is_ok_and(|m| m.ino() == stale.ino());
    if same && std::fs::remove_file(&f.path).is_ok() {
        // Its FIFO was made before it: a FIFO changed after it is a new process's, which
        // took the pid and makes its segment now.
        let fifo = wake_path_of(&f.path);
        let changed = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
        let theirs = std::fs::symlink_metadata(&fifo).is_ok_and(|m| changed(&m) > changed(&stale));
        if !theirs {
            let _ = std::fs::remove_file(fifo);
        }
        return Swept::Removed;
    }
    Swept::Opened
}

/// Removes segment file `f` (listed by [`listed`]) if its process is gone, as this pid
/// namespace proves, and it is still the file found stale; whether it did.
pub fn remove_if_stale(f: &Listed) -> bool {
    sweep(f, pid_ns().unwrap_or(0)) == Swept::Removed
}

/// Sweeps a segment's half-made file or wake FIFO `f` (named in a namespace) from `here`:
/// removed when its process is gone here, a FIFO only once its segment is gone too (the
/// segment's sweep takes both). A process that died between making and renaming its
/// segment, or a FIFO whose segment a user removed, left them for ever.
fn sweep_leftover(kind: Kind, f: &Listed, here: u64) -> Swept {
    if f.ns.is_none() || !gone_here(f, here) {
        return Swept::Left;
    }
    if kind == Kind::Wake {
        let segment = f.path.with_extension("");
        if std::fs::symlink_metadata(segment).is_ok() {
            return Swept::Opened;
        }
    }
    match std::fs::remove_file(&f.path) {
        Ok(()) => Swept::Removed,
        Err(_) => Swept::Opened,
    }
}

/// The metadata of file `p` when it is a segment of `pid` (this layout or 02, which keeps its
/// maker's pid, start time and namespace where 03 has them) made in this pid namespace by a
/// process that is gone.
fn stale_file(p: &Path, pid: u32) -> Option<std::fs::Metadata> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != uid() {
        return None;
    }
    let s = read(&f).ok()??;
    let layout = s.magic == MAGIC || s.magic == u64::from_le_bytes(*b"IBJCTL02");
    (layout && s.pid == u64::from(pid) && maker_gone(&s, pid) == Some(true)).then_some(meta)
}

/// Whether the process that made segment `s` (of `pid`) is gone, as this pid namespace proves
/// (its pid is no process, or one started at another time); None when this namespace cannot
/// tell (the segment was made in another, or `/proc` does not say).
fn maker_gone(s: &Segment, pid: u32) -> Option<bool> {
    if s.pid_ns == 0 || pid_ns() != Some(s.pid_ns) {
        return None;
    }
    match proc_start_time(pid) {
        Ok(t) => Some(t != s.start_time),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(true),
        Err(_) => None,
    }
}

/// What one process answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub pid: u32,
    /// The request was applied (else `text` says why not).
    pub ok: bool,
    /// What is injected now, or why the request was refused.
    pub text: String,
    /// [`STATE_INJECTING`], [`STATE_PAUSED`].
    pub state: u32,
    /// Sends that passed a hook, how many were delayed, the delays' sum (ns), at the answer.
    pub posts: u64,
    pub delayed: u64,
    pub sum_ns: u64,
    /// From the request to the moment the process applied it.
    pub applied_after: Duration,
}

/// Sends `command` (with `settings`, `IBJITTER_*=value` lines, for [`Command::Set`]) to
/// `pid` and waits up to `timeout` (the lock's wait included) for its answer.
pub fn send(
    pid: u32,
    command: Command,
    settings: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    let deadline = Instant::now() + timeout;
    check_text(settings)?;
    let c = open(pid).map_err(|e| e.describe(pid))?;
    let io = |e: std::io::Error| format!("{}: {e}", c.path.display());
    // One request at a time per process: concurrent `ibjitter inject` runs take turns.
    c.lock(deadline)?;
    let mut s = Segment::zeroed();
    s.command = command as u32;
    Segment::put(&mut s.text, settings);
    write(&c.file, &s, field!(command)).map_err(io)?;
    write(&c.file, &s, field!(text)).map_err(io)?;
    let now = read(&c.file).map_err(io)?.ok_or_else(|| {
        OpenError::Foreign.describe_file(&c.path, pid) + " (truncated while in use)"
    })?;
    let t0 = monotonic_ns();
    s.request = now.request.wrapping_add(1);
    let request = s.request;
    write(&c.file, &s, field!(request)).map_err(io)?;
    c.wake();
    let mut woken = Instant::now();
    // The heartbeat must keep moving while we wait: a process that stops serving is said at
    // once, not after the whole timeout.
    let (mut beat, mut beat_seen) = (now.heartbeat_ns, Instant::now());
    let silent = Duration::from_millis(2 * SILENT_POLLS * POLL_MS);
    loop {
        let s = read(&c.file).map_err(io)?.ok_or_else(|| {
            OpenError::Foreign.describe_file(&c.path, pid) + " (truncated while in use)"
        })?;
        if s.done == request {
            return Ok(Answer {
                pid,
                ok: s.result == 0,
                text: Segment::get(&s.answer).unwrap_or_default(),
                state: s.state,
                posts: s.posts,
                delayed: s.delayed,
                sum_ns: s.sum_ns,
                applied_after: Duration::from_nanos(s.applied_ns.saturating_sub(t0)),
            });
        }
        if woken.elapsed() >= Duration::from_millis(WAKE_AGAIN_MS) {
            c.wake();
            woken = Instant::now();
        }
        if s.heartbeat_ns != beat {
            (beat, beat_seen) = (s.heartbeat_ns, Instant::now());
        } else if beat_seen.elapsed() > silent {
            return Err(OpenError::NotServing.describe_file(&c.path, pid));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "process {pid} did not answer within {} ms (is its control thread stopped?)",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sleeps `ns` (CLOCK_MONOTONIC), resuming after a signal; false, at once, when no sleep can
/// be had. The injector's threads sleep through this, never `std::thread::sleep`, which
/// panics on any error but EINTR: under a seccomp filter that denies `clock_nanosleep`, their
/// sleeps fall back to `ppoll`, then `poll` (whole milliseconds), with no descriptors, then
/// a timed futex wait, and where all fail their caller must stop rather than spin a core.
pub fn nap(ns: u64) -> bool {
    let mut ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        let mut rest = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid timespecs; clock_nanosleep returns its error rather than set errno.
        match unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, &mut rest) } {
            0 => return true,
            libc::EINTR => ts = rest,
            _ => break,
        }
    }
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: no descriptors, a valid timeout, no signal mask change.
        if unsafe { libc::ppoll(std::ptr::null_mut(), 0, &ts, std::ptr::null()) } >= 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    let ms = ns.div_ceil(1_000_000).min(i32::MAX as u64) as libc::c_int;
    loop {
        // SAFETY: no descriptors: a plain timed sleep.
        if unsafe { libc::poll(std::ptr::null_mut(), 0, ms) } >= 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    // Last, a futex wait that nobody wakes: every threaded program needs futex, so a sandbox
    // that refuses all the rest still allows it.
    let word = std::sync::atomic::AtomicU32::new(0);
    // SAFETY: a private futex wait on a live word of ours, with a valid relative timeout.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &ts as *const libc::timespec,
        )
    };
    rc == 0
        || matches!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ETIMEDOUT | libc::EINTR)
        )
}

/// CLOCK_MONOTONIC, the clock of `applied_ns` and the heartbeat.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests;

//! The process's side ([`Server`]): the segment it makes at its first device open, its wake
//! FIFO, and its control thread's look for a request and answer, on descriptors the program
//! may close or reuse under it.
use crate::clock::{monotonic_ns, nap};
use crate::files::{check_dir, dir, path, pid_ns, start_time, uid, wake_path_of};
use crate::segment::*;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
pub(crate) struct Held {
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
pub(crate) fn make_wake_fifo(w: &Path) -> Result<Held, String> {
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

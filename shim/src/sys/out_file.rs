//! Opening the shim's output files (the stats file at exit and at a signal, the trace) so that
//! a careless or hostile path cannot hurt the host: never through a symbolic link (paths like
//! `/tmp/ibjitter.%p.json` are predictable, another user could plant one), never blocking (a
//! FIFO or a device would hang the exit, or the signal handler), and only a regular file of the
//! process's own effective user. What is already there is looked at before it is opened (a
//! FIFO with a reader, a device: opening them has effects of its own), and again once open
//! (what the path names may change in between). Async-signal-safe: fstatat, open, fstat,
//! ftruncate, close only, no allocation; the signal-time writer uses [`open_raw`].
use std::ffi::{c_char, c_int, CString};
use std::fmt;
use std::os::fd::FromRawFd;

/// Why an output file was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The path is a symbolic link.
    Link,
    /// A FIFO, socket, device or directory: not a regular file.
    NotRegular,
    /// A regular file another user owns (e.g. planted in a sticky `/tmp`).
    OtherOwner,
    /// open(2) failed otherwise, with this errno.
    Open(c_int),
    /// ftruncate(2) failed, with this errno.
    Truncate(c_int),
    /// A write failed, with this errno (a full disk, a quota, `ulimit -f`): the file is left
    /// empty rather than cut short.
    Write(c_int),
}

impl Refused {
    /// What happened, without the errno's text (async-signal-safe: a static string).
    pub fn why(self) -> &'static str {
        match self {
            Refused::Link => "it is a symbolic link (output files are not written through links)",
            Refused::NotRegular => {
                "it is not a regular file (a FIFO, socket, device or directory: never written, \
                 it could block)"
            }
            Refused::OtherOwner => {
                "it is a file another user owns (only the process's own files are overwritten)"
            }
            Refused::Open(_) => "cannot open it",
            Refused::Truncate(_) => "cannot truncate it",
            Refused::Write(_) => {
                "cannot write it whole (a full disk, a quota, the file-size limit?): it is left \
                 empty"
            }
        }
    }

    /// The errno behind [`Refused::Open`] and [`Refused::Truncate`] (0 otherwise).
    pub fn errno(self) -> c_int {
        match self {
            Refused::Open(e) | Refused::Truncate(e) | Refused::Write(e) => e,
            _ => 0,
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.why())?;
        match self.errno() {
            0 => Ok(()),
            e => write!(f, ": {}", std::io::Error::from_raw_os_error(e)),
        }
    }
}

impl From<Refused> for std::io::Error {
    fn from(r: Refused) -> Self {
        std::io::Error::other(r.to_string())
    }
}

fn errno() -> c_int {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

/// Opens `path` for writing as described above, empty, and returns its descriptor (the
/// caller closes it). Async-signal-safe.
///
/// # Safety
/// `path` is a NUL-terminated string.
pub unsafe fn open_raw(path: *const c_char) -> Result<c_int, Refused> {
    let mut st: libc::stat = std::mem::zeroed();
    if libc::fstatat(libc::AT_FDCWD, path, &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 {
        refuse_unfit(&st)?;
    }
    let flags =
        libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let fd = libc::open(path, flags, 0o666 as libc::c_uint);
    if fd < 0 {
        return Err(match errno() {
            // O_NOFOLLOW: the last component is a link.
            libc::ELOOP => Refused::Link,
            // O_NONBLOCK on a FIFO with no reader (or a device with nothing behind it).
            libc::ENXIO | libc::EISDIR => Refused::NotRegular,
            e => Refused::Open(e),
        });
    }
    let checked = if libc::fstat(fd, &mut st) != 0 {
        Err(Refused::Open(errno()))
    } else if let Err(r) = refuse_unfit(&st) {
        Err(r)
    } else if libc::ftruncate(fd, 0) != 0 {
        Err(Refused::Truncate(errno()))
    } else {
        Ok(fd)
    };
    if checked.is_err() {
        libc::close(fd);
    }
    checked
}

/// Why `st` (of the path, not followed, or of the open file) is no file to write, if so.
fn refuse_unfit(st: &libc::stat) -> Result<(), Refused> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => Err(Refused::Link),
        libc::S_IFREG if st.st_uid != unsafe { libc::geteuid() } => Err(Refused::OtherOwner),
        libc::S_IFREG => Ok(()),
        _ => Err(Refused::NotRegular),
    }
}

/// Writes `text` whole to `path` ([`create`]), with SIGXFSZ held off ([`quiet::without`]):
/// past `ulimit -f` the write fails rather than killing the process. A write that fails
/// leaves the file empty, never a document cut short that a reader would take for whole.
pub fn write_whole(path: &str, text: &[u8]) -> Result<(), Refused> {
    use std::io::Write;
    let mut f = create(path)?;
    super::quiet::without(libc::SIGXFSZ, |raised| match f.write_all(text) {
        Ok(()) => Ok(()),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            *raised = errno == libc::EFBIG;
            let _ = f.set_len(0);
            Err(Refused::Write(errno))
        }
    })
}

/// [`open_raw`] for the writers that run outside a signal handler.
pub fn create(path: &str) -> Result<std::fs::File, Refused> {
    let c = CString::new(path).map_err(|_| Refused::Open(libc::EINVAL))?;
    // SAFETY: a NUL-terminated string; the descriptor returned is ours to own.
    unsafe { open_raw(c.as_ptr()).map(|fd| std::fs::File::from_raw_fd(fd)) }
}

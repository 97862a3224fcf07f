//! Bounded reading of the text files a user names (samples, series, size CDFs, plans, fits):
//! at most [`Limits::max_bytes`] in all and [`Limits::max_line`] per line, so a device, an
//! endless FIFO or a file of one huge line ends in an error naming the file, the line and the
//! limit instead of growing until the OOM killer.
//!
//! Std only (with libc for `O_NONBLOCK`), so every crate of the workspace can share it.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;

/// How much of a user's file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The whole file, in bytes.
    pub max_bytes: u64,
    /// One line, in bytes, without its newline.
    pub max_line: usize,
}

/// The limits of every reader of user files: 64 MiB is millions of samples or CDF points
/// (more than any of them needs in memory), and a line of 1 MiB is no line of numbers.
pub const LIMITS: Limits = Limits {
    max_bytes: 64 << 20,
    max_line: 1 << 20,
};

/// Why a file was not read: where (`line` 0 when no line is concerned) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub path: String,
    pub line: usize,
    pub col: usize,
    /// The file could not be opened or read (as opposed to being too large or not text).
    pub io: bool,
    pub message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.col) {
            (0, _) => write!(f, "{}: {}", self.path, self.message),
            (l, 0) => write!(f, "{}:{l}: {}", self.path, self.message),
            (l, c) => write!(f, "{}:{l}:{c}: {}", self.path, self.message),
        }
    }
}

impl std::error::Error for InputError {}

/// A byte count as a person reads it: `64 MiB`, `1 MiB`, `300 bytes`.
pub fn bytes_text(n: u64) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// Reads a text file of at most `limits`. `what` names the contents in messages ("the size
/// CDF"). Regular files and FIFOs/pipes (`<(command)`) are read; directories, devices
/// (`/dev/zero` never ends) and sockets are refused. A FIFO is opened without waiting for a
/// writer: with none it reads as empty; with one that never stops, it ends at the limit.
pub fn read_text(path: &Path, what: &str, limits: Limits) -> Result<String, InputError> {
    let bytes = read_bytes(path, what, limits)?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let good = std::str::from_utf8(&bytes[..e.utf8_error().valid_up_to()]).unwrap_or_default();
        InputError {
            path: path.display().to_string(),
            line: good.matches('\n').count() + 1,
            col: good.rsplit('\n').next().unwrap_or("").chars().count() + 1,
            io: false,
            message: format!("expected {what} as text (UTF-8), found an invalid byte"),
        }
    })
}

/// [`read_text`], or `None` when there is no file at `path` (a file a program writes
/// itself and reads back when it resumes, say).
pub fn read_text_if_present(
    path: &Path,
    what: &str,
    limits: Limits,
) -> Result<Option<String>, InputError> {
    if let Err(e) = std::fs::symlink_metadata(path) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Ok(None);
        }
    }
    read_text(path, what, limits).map(Some)
}

/// [`read_text`] without the UTF-8 check.
pub fn read_bytes(path: &Path, what: &str, limits: Limits) -> Result<Vec<u8>, InputError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let origin = path.display().to_string();
    let err = |line: usize, io: bool, message: String| InputError {
        path: origin.clone(),
        line,
        col: 0,
        io,
        message,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| err(0, true, format!("cannot read {what}: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| err(0, true, format!("cannot read {what}: {e}")))?;
    let t = meta.file_type();
    let refuse = |found: &str| {
        err(
            0,
            true,
            format!("cannot read {what}: expected a file, found {found}"),
        )
    };
    if t.is_dir() {
        return Err(refuse("a directory"));
    } else if t.is_char_device() || t.is_block_device() {
        return Err(refuse("a device"));
    } else if t.is_socket() {
        return Err(refuse("a socket"));
    } else if t.is_fifo() {
        // Opened without waiting for a writer; reads must now wait for one's data.
        clear_nonblock(&file).map_err(|e| err(0, true, format!("cannot read {what}: {e}")))?;
    } else if !t.is_file() {
        return Err(refuse("something else"));
    }
    // About the whole file, not a line of it.
    let too_large = || {
        err(
            0,
            false,
            format!(
                "larger than the limit of {} for {what}",
                bytes_text(limits.max_bytes)
            ),
        )
    };
    if t.is_file() && meta.len() > limits.max_bytes {
        return Err(too_large());
    }
    let mut out = Vec::with_capacity(if t.is_file() { meta.len() as usize } else { 0 });
    let mut buf = vec![0u8; 64 << 10];
    let (mut line, mut line_len) = (1usize, 0usize);
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(line, true, format!("cannot read {what}: {e}"))),
        };
        if (out.len() + n) as u64 > limits.max_bytes {
            return Err(too_large());
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                line += 1;
                line_len = 0;
            } else {
                line_len += 1;
                if line_len > limits.max_line {
                    // At the first byte beyond the limit.
                    return Err(InputError {
                        col: limits.max_line + 1,
                        ..err(
                            line,
                            false,
                            format!(
                                "a line longer than the limit of {} for {what}",
                                bytes_text(limits.max_line as u64)
                            ),
                        )
                    });
                }
            }
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Makes `file` (opened with `O_NONBLOCK`, so that a FIFO nobody writes or reads did not
/// make the open wait) block again for its reads and writes.
pub fn clear_nonblock(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A path in a directory of the test's own, removed with it when the test ends.
    struct Temp(std::path::PathBuf);

    impl std::ops::Deref for Temp {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for Temp {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn temp(name: &str) -> Temp {
        let dir =
            std::env::temp_dir().join(format!("ibjitter-input-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Temp(dir.join(name))
    }

    const SMALL: Limits = Limits {
        max_bytes: 100,
        max_line: 10,
    };

    #[test]
    fn reads_a_file_within_the_limits() {
        let p = temp("ok");
        std::fs::write(&p, "1 2\n3 4\n").unwrap();
        assert_eq!(read_text(&p, "numbers", SMALL).unwrap(), "1 2\n3 4\n");
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_naming_it_and_the_limit() {
        let p = temp("big");
        std::fs::write(&p, "1\n".repeat(51)).unwrap();
        let e = read_text(&p, "numbers", SMALL).unwrap_err();
        assert!(!e.io);
        let text = e.to_string();
        assert!(text.starts_with(&p.display().to_string()), "{text}");
        assert!(text.contains("limit of 100 bytes"), "{text}");
    }

    #[test]
    fn a_long_line_is_refused_at_its_line() {
        let p = temp("long");
        std::fs::write(&p, format!("1\n2\n{}\n", "9".repeat(11))).unwrap();
        let e = read_text(&p, "numbers", SMALL).unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e
            .to_string()
            .contains(":3:11: a line longer than the limit of 10 bytes"));
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read_text(Path::new("/dev/zero"), "numbers", LIMITS).unwrap_err();
        assert!(e.to_string().contains("found a device"), "{e}");
        let e = read_text(&std::env::temp_dir(), "numbers", LIMITS).unwrap_err();
        assert!(e.to_string().contains("found a directory"), "{e}");
    }

    #[test]
    fn invalid_utf8_is_reported_at_its_line_and_column() {
        let p = temp("utf8");
        std::fs::write(&p, b"12\n3\xff\n").unwrap();
        let e = read_text(&p, "numbers", SMALL).unwrap_err();
        assert_eq!((e.line, e.col), (2, 2));
    }

    #[test]
    fn an_endless_fifo_ends_at_the_limit_and_one_without_writer_reads_empty() {
        let p = temp("fifo");
        let _ = std::fs::remove_file(&p);
        let c = std::ffi::CString::new(p.display().to_string()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(read_text(&p, "numbers", SMALL).unwrap(), "");
        // A writer that never stops: held open read-write (so opening does not wait for a
        // reader), non-blocking so that it can be told to stop.
        use std::os::unix::fs::OpenOptionsExt;
        let mut w = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let writer = std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match w.write(b"1\n") {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(1))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let e = read_text(&p, "numbers", SMALL).unwrap_err();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(e.to_string().contains("limit of 100 bytes"), "{e}");
        writer.join().unwrap();
    }
}

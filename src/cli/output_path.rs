//! Output paths for the subcommands that write files: whether one can be written, checked
//! before any work (so that a bad path is a bad argument, not a lost run), and opening it.

/// A buffered output file, or the error naming it.
pub(super) fn create(path: &std::path::Path) -> Result<std::io::BufWriter<std::fs::File>, String> {
    open_without_waiting(path, true)
        .map(std::io::BufWriter::new)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Writes `path` whole through `write`, never leaving it cut short: a regular file (or a new
/// one) is written beside it under a new name and renamed over it once complete, so a full
/// disk or a quota leaves the file that was there as it was (a table truncated to its first
/// 4 KiB was what a full disk left); the new file gets the old one's mode (and owner, where
/// allowed). Anything else is written directly, as before: a symbolic link (through it:
/// `/dev/stdout` is one, to what the shell redirected), a FIFO with a reader, a device; so is
/// a file whose directory takes no new file (or whose name leaves no room for the temporary's).
/// The error names the file.
pub(super) fn replace_whole<W>(path: &std::path::Path, write: W) -> Result<(), String>
where
    W: FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
{
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    // Written in place, as File::create would.
    let direct = |write: W| -> Result<(), String> {
        let mut w = create(path)?;
        write(&mut w).and_then(|()| w.flush()).map_err(failed)
    };
    let old = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Some(m),
        Ok(_) => return direct(write),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(failed(e)),
    };
    // As File::create would: a file we may not write is refused, not replaced.
    if old.is_some() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(failed)?;
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| std::ffi::OsString::from("output"), |n| n.to_os_string());
    let stem = format!(
        ".{}.ibjitter-new-{}",
        name.to_string_lossy(),
        std::process::id()
    );
    let made = ibjitter::temp_files::new_file_with_mode(dir, &stem, "tmp", 0o666);
    let Ok((file, tmp)) = made else {
        return direct(write);
    };
    if let Some(m) = &old {
        // The old file's mode exactly (not less the umask), and its owner where allowed.
        let _ = file.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777));
        let _ = std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()));
    }
    let mut w = std::io::BufWriter::new(file);
    let written = write(&mut w)
        .and_then(|()| w.flush())
        .and_then(|()| w.get_ref().sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("{} (what was there is left as it was)", failed(e)));
    }
    Ok(())
}

/// Opens `path` for writing (created and emptied with `create`) without waiting for a FIFO's
/// reader: a FIFO nobody reads is an error ("no reader"), not an open that waits before any
/// work, or for ever. The descriptor then blocks again, for the writes. A FIFO with a
/// reader (`-o >(gzip > f)`) works as before. A name of one of this process's descriptors
/// (`/dev/stdout`) is that descriptor ([`our_descriptor`]).
fn open_without_waiting(path: &std::path::Path, create: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(fd) = names_our_descriptor(path) {
        return our_descriptor(fd);
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(create)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => {
                std::io::Error::other("it is a FIFO nobody reads (writing would wait for a reader)")
            }
            _ => e,
        })?;
    // The writes block again.
    ibjitter::table::input::clear_nonblock(&f)?;
    Ok(f)
}

/// The descriptor `path` names, if it names one of this process's own by its name:
/// `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`.
fn names_our_descriptor(path: &std::path::Path) -> Option<i32> {
    let p = path.to_str()?;
    match p {
        "/dev/stdout" => Some(1),
        "/dev/stderr" => Some(2),
        _ => p
            .strip_prefix("/dev/fd/")
            .or_else(|| p.strip_prefix("/proc/self/fd/"))
            .and_then(|n| n.parse().ok())
            .filter(|&n: &i32| n >= 0),
    }
}

/// Our descriptor `fd`, duplicated: written where the shell pointed it, as it opened it.
/// Opening its name again would open the file anew: emptied (O_TRUNC), and without the
/// shell's O_APPEND or offset, so `-o /dev/stdout >> log` emptied the log, and a summary on
/// stdout and the output overwrote each other.
fn our_descriptor(fd: i32) -> std::io::Result<std::fs::File> {
    use std::os::fd::BorrowedFd;
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (above) and stays so while it is duplicated: this process does
    // not close its own descriptors meanwhile.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    // What this process wrote there through its own stdout goes first.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    Ok(std::fs::File::from(owned))
}

/// Whether `path` can be written, without changing anything: an existing file must open for
/// writing (not truncated), a new one needs an existing directory we may write to. For
/// outputs written at the end, checked before any work so that a bad path is a bad argument.
pub(super) fn check_writable(path: &std::path::Path) -> Result<(), String> {
    let refuse = |why: String| Err(format!("cannot write {}: {why}", path.display()));
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return refuse("it is a directory".into()),
        Ok(_) => {
            return open_without_waiting(path, false)
                .map(drop)
                .or_else(|e| refuse(e.to_string()))
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return refuse(e.to_string()),
        Err(_) => {}
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    check_dir_writable(parent).or_else(refuse)
}

/// Whether `dir` can be created (if missing) and written into, without creating it: its
/// nearest existing ancestor must be a directory we may write to.
pub(super) fn check_dir_creatable(dir: &std::path::Path) -> Result<(), String> {
    let mut at = dir;
    loop {
        match std::fs::symlink_metadata(at) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot write into {}: {e}", dir.display())),
        }
        at = match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
    }
    check_dir_writable(at).map_err(|e| format!("cannot write into {}: {e}", dir.display()))
}

/// Whether files can be created in `dir` (which must exist): access(2) with W_OK and X_OK,
/// which also says no for a read-only file system.
fn check_dir_writable(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a NUL byte in the path", dir.display()))?;
    // SAFETY: a valid NUL-terminated path; access(2) only reads it.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(format!(
            "{}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

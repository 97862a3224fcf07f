//! Files and directories the tools make in a directory others share (`/tmp`): never one that
//! is already there. A predictable name (`ibjitter-doctor.<pid>`) there is another user's to
//! plant first, as a directory of their own or a symbolic link to a file of the victim's, which
//! a root run then wrote through (`fs.protected_symlinks=0`). Made exclusively instead:
//! `mkdtemp` for a directory, `O_CREAT|O_EXCL|O_NOFOLLOW` for a file, 0700/0600.
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// A new private directory in the temporary directory, named `PREFIX.XXXXXX`.
pub fn private_dir(prefix: &str) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let template = std::env::temp_dir().join(format!("{prefix}.XXXXXX"));
    let mut bytes = std::ffi::CString::new(template.into_os_string().into_vec())
        .map_err(io::Error::other)?
        .into_bytes_with_nul();
    // SAFETY: a NUL-terminated template that mkdtemp rewrites in place.
    if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    bytes.pop();
    Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// A new file in `dir` named `STEM.N.EXT` for the first N (from 0) that nobody made yet;
/// never a link followed, never a file that was there. Private (0600).
pub fn new_file(dir: &Path, stem: &str, ext: &str) -> io::Result<(File, PathBuf)> {
    new_file_with_mode(dir, stem, ext, 0o600)
}

/// [`new_file`] with permissions `mode` (less the process's umask).
pub fn new_file_with_mode(
    dir: &Path,
    stem: &str,
    ext: &str,
    mode: u32,
) -> io::Result<(File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    for n in 0..1000 {
        let path = dir.join(format!("{stem}.{n}.{ext}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    Err(io::Error::other(format!(
        "{}: 1000 files named {stem}.N.{ext} there already",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name taken (here by a link, as another user would plant) is never opened: the next
    /// one is made, and the link's target is untouched.
    #[test]
    fn a_planted_name_is_passed_over_and_its_target_untouched() {
        let dir = private_dir("ibjitter-temp-files-test").unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(meta.is_dir());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("out.0.txt")).unwrap();
        let (_, made) = new_file(&dir, "out", "txt").unwrap();
        assert_eq!(made, dir.join("out.1.txt"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Where `IBJITTER_DIST=NAME` finds `NAME.dist`: relative to the loaded libibjitter.so, never
//! under the path the library was built in (another machine's, or another user's checkout).
//! In order: `IBJITTER_DISTRIBUTIONS` (a directory, if set); `../share/ibjitter/distributions/`
//! beside the library's directory (an installed layout: `PREFIX/lib/libibjitter.so`); the
//! checkout's `distributions/` only when the library sits in that checkout's `target/`
//! directory (a build run in place); then iproute2's directories.
use ibjitter_table::format::SYSTEM_DIST_DIRS;
use std::path::{Path, PathBuf};

/// How many directories up from the library a checkout's `target/` may be
/// (`target/release`, `target/debug/deps`, `target/<triple>/release/deps`).
const TARGET_DEPTH: usize = 4;

/// The file the shim was loaded from (its own code's address, looked up by the loader).
pub fn own_path() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = own_path as fn() -> Option<PathBuf> as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables; `info` is ours.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the loader's file name, a C string it owns for as long as the object is loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    // A relative name (a program run by a relative path) is taken from the current
    // directory, as the loader did.
    std::fs::canonicalize(path).ok()
}

/// The directories to look in, in order, for a library loaded from `own` (None: unknown)
/// with `IBJITTER_DISTRIBUTIONS=env_dir`.
pub fn dist_dirs(own: Option<&Path>, env_dir: Option<&str>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = env_dir.map(str::trim).filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
    }
    if let Some(lib_dir) = own.and_then(Path::parent) {
        if let Some(prefix) = lib_dir.parent() {
            dirs.push(prefix.join("share/ibjitter/distributions"));
        }
        if let Some(checkout) = checkout_of(lib_dir) {
            dirs.push(checkout.join("distributions"));
        }
    }
    dirs.extend(SYSTEM_DIST_DIRS.iter().map(PathBuf::from));
    dirs
}

/// The checkout whose `target/` holds `lib_dir`: an ancestor named `target` (a few levels
/// up) whose parent is a workspace with a `distributions/` directory.
fn checkout_of(lib_dir: &Path) -> Option<&Path> {
    lib_dir
        .ancestors()
        .take(TARGET_DEPTH)
        .find(|d| d.file_name().is_some_and(|n| n == "target"))
        .and_then(Path::parent)
        .filter(|c| c.join("Cargo.toml").is_file() && c.join("distributions").is_dir())
}

/// `NAME.dist` (a trailing `.dist` allowed) in the first of `dirs` that has it; else the
/// message says where it looked. Names with a path separator, a NUL or a leading dot are no
/// names.
pub fn find_named(name: &str, dirs: &[PathBuf]) -> Result<PathBuf, String> {
    let stem = name.strip_suffix(".dist").unwrap_or(name);
    if stem.is_empty() || stem.contains(['/', '\\', '\0']) || stem.starts_with('.') {
        return Err(format!("{stem:?} is not a table name"));
    }
    let file = format!("{stem}.dist");
    dirs.iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            format!(
                "no such named distribution (looked for {file} in {})",
                looked.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_found_beside_the_library_never_under_the_build_path() {
        let root = std::env::temp_dir().join(format!("ibjitter-dists-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // An installed layout: PREFIX/lib/libibjitter.so, PREFIX/share/ibjitter/distributions.
        let prefix = root.join("prefix");
        std::fs::create_dir_all(prefix.join("lib")).unwrap();
        std::fs::create_dir_all(prefix.join("share/ibjitter/distributions")).unwrap();
        std::fs::write(prefix.join("share/ibjitter/distributions/mine.dist"), "1\n").unwrap();
        let installed = prefix.join("lib/libibjitter.so");
        let dirs = dist_dirs(Some(&installed), None);
        assert_eq!(
            find_named("mine", &dirs),
            Ok(prefix.join("share/ibjitter/distributions/mine.dist"))
        );
        // A checkout built in place: its distributions/ when the library is in its target/.
        let ck = root.join("checkout");
        std::fs::create_dir_all(ck.join("target/release/deps")).unwrap();
        std::fs::create_dir_all(ck.join("distributions")).unwrap();
        std::fs::write(ck.join("Cargo.toml"), "[workspace]\n").unwrap();
        std::fs::write(ck.join("distributions/ours.dist"), "1\n").unwrap();
        for lib in ["target/release/libibjitter.so", "target/release/deps/x.so"] {
            let dirs = dist_dirs(Some(&ck.join(lib)), None);
            assert_eq!(
                find_named("ours.dist", &dirs),
                Ok(ck.join("distributions/ours.dist")),
                "{lib}"
            );
        }
        // The installed library never looks into a checkout, whatever path it was built in.
        let e = find_named("ours", &dist_dirs(Some(&installed), None)).unwrap_err();
        assert!(!e.contains(ck.to_str().unwrap()), "{e}");
        assert!(
            e.contains(
                prefix
                    .join("share/ibjitter/distributions")
                    .to_str()
                    .unwrap()
            ) && e.contains("/usr/lib/tc"),
            "says where it looked: {e}"
        );
        // IBJITTER_DISTRIBUTIONS first.
        let dirs = dist_dirs(
            Some(&installed),
            Some(ck.join("distributions").to_str().unwrap()),
        );
        assert_eq!(
            find_named("ours", &dirs),
            Ok(ck.join("distributions/ours.dist"))
        );
        for bad in ["../x", "", ".hidden", "a/b"] {
            assert!(find_named(bad, &dirs).is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

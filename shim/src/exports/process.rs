//! The ends of a process that run no exit handler: `execve`, `execv`, `execvp`, `execvpe`,
//! `fexecve` (the new image replaces this one: the delay line is handed over first, as at
//! exit, and what is left is said: [`lifecycle::before_exec`]) and `_exit`, `_Exit`
//! (async-signal-safe: they only say what the line still holds:
//! [`lifecycle::at_immediate_exit`]). Each then calls the next definition of its name (libc's,
//! or another interposer's), or the raw system call if there is none.
//!
//! Not reached: the variadic `execl`, `execle`, `execlp` (stable Rust cannot define a
//! C-variadic function, and glibc's build their argument vector and call its internal
//! `__execve`, which no interposer sees), `posix_spawn` and `system` (their child is a
//! `vfork`-like clone that execs through `__execve`; the line is the parent's and stays with
//! it), and a raw `syscall(SYS_execve)` or `SYS_exit_group`.
use crate::abi::elf;
use crate::runtime::lifecycle;
use crate::sys::fn_slot::{as_fn, FnSlot};
use crate::sys::libc_dl::real_dlsym;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::Ordering::{Acquire, Release};

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// The next definition of `name` after the shim, looked up once.
struct Next<F> {
    name: &'static CStr,
    slot: FnSlot<F>,
}

impl<F: Copy> Next<F> {
    const fn new(name: &'static CStr) -> Next<F> {
        Next {
            name,
            slot: FnSlot::empty(),
        }
    }

    /// `dlsym(RTLD_NEXT)` (libc's real one: the shim exports `dlsym`), else libc's own
    /// definition (the shim `dlopen`ed with `RTLD_LOCAL`, where `RTLD_NEXT` may find
    /// nothing); None if neither.
    fn get(&self) -> Option<F> {
        if let Some(f) = self.slot.get(Acquire) {
            return Some(f);
        }
        // SAFETY: a valid C string; RTLD_NEXT means "after the shim" from here.
        let mut p = unsafe { real_dlsym()(libc::RTLD_NEXT, self.name.as_ptr()) };
        if p.is_null() {
            let me = resolve_at_load as fn() as *const c_void;
            p = elf::find_function(self.name, &["libc.so"], me).unwrap_or(std::ptr::null_mut());
        }
        // SAFETY: the function of this name in libc (or an interposer of it) has type F.
        let f = unsafe { as_fn::<F>(p) };
        self.slot.set(f, Release);
        f
    }
}

static EXECVE: Next<ExecveFn> = Next::new(c"execve");
static EXECV: Next<ExecvFn> = Next::new(c"execv");
static EXECVP: Next<ExecvFn> = Next::new(c"execvp");
static EXECVPE: Next<ExecveFn> = Next::new(c"execvpe");
static FEXECVE: Next<FexecveFn> = Next::new(c"fexecve");
static EXIT: Next<ExitFn> = Next::new(c"_exit");
static EXIT_C99: Next<ExitFn> = Next::new(c"_Exit");

/// Looks all of them up (the load constructor calls it): `_exit` runs in signal handlers and
/// fork children, where the dynamic linker's lookup (locks) must not be the first.
pub fn resolve_at_load() {
    EXECVE.get();
    EXECV.get();
    EXECVP.get();
    EXECVPE.get();
    FEXECVE.get();
    EXIT.get();
    EXIT_C99.get();
}

extern "C" {
    static environ: *const *const c_char;
}

/// The exec is this process's end: hand the line over first (never across a panic).
fn before_exec(call: &str) {
    let _ = std::panic::catch_unwind(|| lifecycle::before_exec(call));
}

/// Interposed `execve`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec("execve");
    match EXECVE.get() {
        Some(f) => f(path, argv, envp),
        None => raw_execve(path, argv, envp),
    }
}

/// Interposed `execv`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec("execv");
    match EXECV.get() {
        Some(f) => f(path, argv),
        None => raw_execve(path, argv, environ),
    }
}

/// Interposed `execvp`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec("execvp");
    match EXECVP.get() {
        Some(f) => f(file, argv),
        None => raw_execvpe(file, argv, environ),
    }
}

/// Interposed `execvpe`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec("execvpe");
    match EXECVPE.get() {
        Some(f) => f(file, argv, envp),
        None => raw_execvpe(file, argv, envp),
    }
}

/// Interposed `fexecve`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec("fexecve");
    match FEXECVE.get() {
        Some(f) => f(fd, argv, envp),
        None => libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv,
            envp,
            libc::AT_EMPTY_PATH,
        ) as c_int,
    }
}

/// Interposed `_exit`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    lifecycle::at_immediate_exit("_exit");
    match EXIT.slot.get(Acquire) {
        Some(f) => f(status),
        None => raw_exit(status),
    }
}

/// Interposed `_Exit`.
///
/// # Safety
/// Same contract as libc's function of this name.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    lifecycle::at_immediate_exit("_Exit");
    match EXIT_C99.slot.get(Acquire) {
        Some(f) => f(status),
        None => raw_exit(status),
    }
}

/// The system call, when no `execve` could be found.
unsafe fn raw_execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    libc::syscall(libc::SYS_execve, path, argv, envp) as c_int
}

/// `execvpe` by hand, when no definition could be found: `file` as it is if it names a
/// directory, else each entry of `PATH` (default `/bin:/usr/bin`) in turn, on the stack
/// (a vfork child may call it). A script without `#!` is not retried with `/bin/sh`.
unsafe fn raw_execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let name = CStr::from_ptr(file).to_bytes();
    if name.is_empty() {
        *libc::__errno_location() = libc::ENOENT;
        return -1;
    }
    if name.contains(&b'/') {
        return raw_execve(file, argv, envp);
    }
    let path = libc::getenv(c"PATH".as_ptr());
    let path = if path.is_null() {
        b"/bin:/usr/bin".as_slice()
    } else {
        CStr::from_ptr(path).to_bytes()
    };
    let mut denied = false;
    let mut buf = [0u8; libc::PATH_MAX as usize];
    for dir in path.split(|&b| b == b':') {
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let len = dir.len() + 1 + name.len();
        if len >= buf.len() {
            continue;
        }
        buf[..dir.len()].copy_from_slice(dir);
        buf[dir.len()] = b'/';
        buf[dir.len() + 1..len].copy_from_slice(name);
        buf[len] = 0;
        raw_execve(buf.as_ptr().cast(), argv, envp);
        match *libc::__errno_location() {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ETIMEDOUT | libc::ENODEV => {}
            _ => return -1,
        }
    }
    *libc::__errno_location() = if denied { libc::EACCES } else { libc::ENOENT };
    -1
}

/// The system call, when no `_exit` could be found.
fn raw_exit(status: c_int) -> ! {
    loop {
        // SAFETY: exit_group ends every thread of the process; it does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

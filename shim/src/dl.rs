//! Programs that look verbs up themselves: NCCL `dlopen`s libibverbs and resolves each entry
//! point with `dlvsym(handle, name, "IBVERBS_1.1")`, a lookup that searches that library
//! only, never the preloaded shim. The shim therefore exports `dlsym` and `dlvsym` too: a
//! lookup through a handle that yields the very function a hook wraps (the address the shim's
//! own [`crate::real`] lookup found) returns the hook instead; everything else is the real
//! answer, untouched (another library's function of the same name, a compat version, a
//! `dlmopen` namespace's copy).
//!
//! `RTLD_NEXT` and `RTLD_DEFAULT` lookups depend on who calls (the next object *after the
//! caller*): the exports jump to libc's function instead of calling it, so it sees the
//! program's return address. That needs a naked function, written for x86_64; elsewhere the
//! shim exports neither name and dlopen-only programs are not reached (the coverage warning
//! says so).
//!
//! libc's own `dlsym`/`dlvsym` are found in its dynamic symbol table ([`elf_lookup`]), at load
//! or at the first lookup, whichever comes first.
use crate::elf_lookup;
use crate::hooks;
use crate::real::{address, as_fn, FnSlot};
use crate::say;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// libc's functions (read by the naked exports as plain words).
static REAL_DLSYM: FnSlot<DlsymFn> = FnSlot::empty();
static REAL_DLVSYM: FnSlot<DlvsymFn> = FnSlot::empty();

/// Finds libc's `dlsym` and `dlvsym` (the load constructor calls it; the exports call it if
/// a lookup comes first). Each found address is stored once; a race stores the same value.
pub fn resolve() {
    if REAL_DLSYM.raw(Acquire).is_null() {
        // SAFETY: libc's dlsym has this type; `unavailable_dlsym` stands in if none is found.
        let f = find(c"dlsym").and_then(|p| unsafe { as_fn::<DlsymFn>(p) });
        REAL_DLSYM.set(Some(f.unwrap_or(unavailable_dlsym)), Release);
    }
    if REAL_DLVSYM.raw(Acquire).is_null() {
        // SAFETY: libc's dlvsym has this type.
        let f = find(c"dlvsym").and_then(|p| unsafe { as_fn::<DlvsymFn>(p) });
        REAL_DLVSYM.set(Some(f.unwrap_or(unavailable_dlvsym)), Release);
    }
}

/// `name` in libc (glibc ≥ 2.34) or libdl (before it): never another interposer's or the
/// program's own. None (after one warning) if neither defines it.
fn find(name: &CStr) -> Option<*mut c_void> {
    let found = elf_lookup::find_function(name, &["libc.so", "libdl.so"], resolve as *const c_void);
    if found.is_none() {
        say::warn_once(&format!(
            "cannot find libc's {}: lookups through it return NULL",
            name.to_string_lossy()
        ));
    }
    found
}

unsafe extern "C" fn unavailable_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

unsafe extern "C" fn unavailable_dlvsym(
    _: *mut c_void,
    _: *const c_char,
    _: *const c_char,
) -> *mut c_void {
    std::ptr::null_mut()
}

/// libc's `dlsym`, for the shim's own lookups.
pub fn real_dlsym() -> DlsymFn {
    REAL_DLSYM.get(Acquire).unwrap_or_else(|| {
        resolve();
        REAL_DLSYM.get(Acquire).unwrap_or(unavailable_dlsym)
    })
}

/// libc's `dlvsym`, for the shim's own lookups (`RTLD_NEXT` then means "after the shim").
pub fn real_dlvsym() -> DlvsymFn {
    REAL_DLVSYM.get(Acquire).unwrap_or_else(|| {
        resolve();
        REAL_DLVSYM.get(Acquire).unwrap_or(unavailable_dlvsym)
    })
}

/// Lookups through a handle (the exports' path for anything but the pseudo-handles).
unsafe extern "C" fn dlsym_through_handle(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let found = real_dlsym()(handle, name);
    hooked(name, found)
}

unsafe extern "C" fn dlvsym_through_handle(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let found = real_dlvsym()(handle, name, version);
    hooked(name, found)
}

/// The hook for what a lookup found, if the shim wraps that very function; else `found`.
unsafe fn hooked(name: *const c_char, found: *mut c_void) -> *mut c_void {
    if found.is_null() || name.is_null() {
        return found;
    }
    // A panic must never cross into the host program.
    let hook = std::panic::catch_unwind(|| hooks::hook_for(CStr::from_ptr(name), found));
    // The program's lookup succeeded: a failure of the shim's own lookups inside hook_for
    // must not show in its next dlerror().
    libc::dlerror();
    hook.ok()
        .flatten()
        .inspect(|_| {
            HANDED_OUT.fetch_add(1, Relaxed);
        })
        .unwrap_or(found)
}

/// How many lookups through a handle were answered with a hook (in the stats).
pub static HANDED_OUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Called by the exports when libc's function is not known yet: resolves, returns it.
extern "C" fn resolved_dlsym() -> *mut c_void {
    address(real_dlsym())
}

extern "C" fn resolved_dlvsym() -> *mut c_void {
    address(real_dlvsym())
}

/// Defines an interposed lookup function: RTLD_NEXT (-1) and RTLD_DEFAULT (0) jump to libc's
/// (`$real`, resolved first by `$resolved` if a lookup comes before the load constructor),
/// keeping the caller's return address, since their answer depends on it; other handles jump
/// to `$through_handle`, so no frame of ours is left behind either way. At most three
/// argument registers are live (rdi, rsi, rdx); three pushes keep the stack 16-byte aligned
/// at the call.
macro_rules! interposed_lookup {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),+), $through_handle:path, $real:path, $resolved:path) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Same contract as libc's function of this name.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> *mut c_void {
            std::arch::naked_asm!(
                "cmp rdi, -1",
                "je 2f",
                "test rdi, rdi",
                "je 2f",
                "jmp {through_handle}",
                "2:",
                "mov rax, qword ptr [rip + {real}]",
                "test rax, rax",
                "jz 3f",
                "jmp rax",
                "3:",
                "push rdi",
                "push rsi",
                "push rdx",
                "call {resolved}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                through_handle = sym $through_handle,
                real = sym $real,
                resolved = sym $resolved,
            )
        }
    };
}

interposed_lookup!(
    /// Interposed `dlsym`.
    dlsym(handle: *mut c_void, name: *const c_char),
    dlsym_through_handle,
    REAL_DLSYM,
    resolved_dlsym
);

interposed_lookup!(
    /// Interposed `dlvsym`: as [`dlsym`], with the version in the third argument.
    dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char),
    dlvsym_through_handle,
    REAL_DLVSYM,
    resolved_dlvsym
);

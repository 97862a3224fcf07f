//! Programs that look verbs up themselves: NCCL `dlopen`s libibverbs and resolves each entry
//! point with `dlvsym(handle, name, "IBVERBS_1.1")`, a lookup that searches that library
//! only, never the preloaded shim. The shim therefore exports `dlsym` and `dlvsym` too: a
//! lookup through a handle that yields the very function a hook wraps (the address the shim's
//! own [`crate::sys::symbols`] lookup found) returns the hook instead; everything else is the real
//! answer, untouched (another library's function of the same name, a compat version, a
//! `dlmopen` namespace's copy).
//!
//! `RTLD_NEXT` and `RTLD_DEFAULT` lookups depend on who calls (the next object *after the
//! caller*): the exports jump to libc's function instead of calling it, so it sees the
//! program's return address. That needs a naked function, written for x86_64; elsewhere the
//! shim exports neither name and dlopen-only programs are not reached (the coverage warning
//! says so).
//!
//! libc's own `dlsym`/`dlvsym`: [`crate::sys::libc_dl`].
use crate::exports::verbs;
use crate::sys::libc_dl::{
    real_dlsym, real_dlvsym, resolved_dlsym, resolved_dlvsym, REAL_DLSYM, REAL_DLVSYM,
};
use crate::sys::symbols::HANDED_OUT;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering::Relaxed;

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
    let hook = std::panic::catch_unwind(|| verbs::hook_for(CStr::from_ptr(name), found));
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

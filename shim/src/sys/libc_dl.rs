//! libc's own `dlsym` and `dlvsym`, found in its dynamic symbol table ([`crate::abi::elf`]):
//! the shim exports functions of those names ([`crate::exports::dl`]), so asking the dynamic
//! linker for them would find the shim itself. Resolved at load, or at the first lookup,
//! whichever comes first.
use crate::abi::elf;
use crate::sys::fn_slot::{address, as_fn, FnSlot};
use crate::sys::say;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering::{Acquire, Release};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// libc's functions (read by the naked exports as plain words).
pub static REAL_DLSYM: FnSlot<DlsymFn> = FnSlot::empty();
pub static REAL_DLVSYM: FnSlot<DlvsymFn> = FnSlot::empty();

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
    let found = elf::find_function(name, &["libc.so", "libdl.so"], resolve as *const c_void);
    if found.is_none() {
        say::warn_once!(&format!(
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

/// Called by the exports when libc's function is not known yet: resolves, returns it.
pub extern "C" fn resolved_dlsym() -> *mut c_void {
    address(real_dlsym())
}

pub extern "C" fn resolved_dlvsym() -> *mut c_void {
    address(real_dlvsym())
}

//! UCP functions resolved as each caller's own lookup would resolve them ([`UcpReal`]).
//!
//! The shim's `ucp_*` exports come first in the global scope, so every caller of every copy of
//! libucp lands in them: a wheel's bundled `libucp-<hash>.so.0` beside the system's
//! `libucp.so.0` (RAPIDS next to mpi4py), each in a local scope. Forwarding everyone to the
//! one copy found first gives that copy the other's endpoints. So the real function is the one
//! found after the shim in the global scope, the same for every caller, when there is one
//! (one load a call, as before); otherwise the one in the caller's own scope (the object the
//! call returns to and its dependencies, the lookup `dlsym` makes through its handle), kept
//! per call site; and only if that finds none, a library of that name loaded elsewhere.
//!
//! The call site is the return address, which the export's entry stores in the thread's state
//! before it jumps to the wrapper (`exports::ucp`; x86_64 only, elsewhere it is 0 and every
//! caller gets the global or first-found copy, as before).
use crate::sys::fn_slot::as_fn;
use crate::sys::libc_dl;
use crate::sys::symbols::Real;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// Call sites a function remembers (beyond: resolved again at every call, never wrongly).
const SITES: usize = 32;

/// Not looked up yet; found in the global scope; not there: per caller.
const UNRESOLVED: u8 = 0;
const PER_CALLER: u8 = 2;

struct Site {
    /// The return address (0: free). Written once.
    ret: AtomicUsize,
    /// What that caller's lookup finds (null until resolved).
    found: AtomicPtr<c_void>,
}

/// An unversioned libucp function of type `F`, resolved per caller when it must be.
pub struct UcpReal<F> {
    real: Real<F>,
    /// Found after the shim in the global scope: every caller's.
    global: AtomicPtr<c_void>,
    state: AtomicU8,
    sites: [Site; SITES],
}

impl<F: Copy> UcpReal<F> {
    pub const fn new(name: &'static CStr) -> UcpReal<F> {
        UcpReal {
            real: Real::ucp(name),
            global: AtomicPtr::new(null_mut()),
            state: AtomicU8::new(UNRESOLVED),
            sites: [const {
                Site {
                    ret: AtomicUsize::new(0),
                    found: AtomicPtr::new(null_mut()),
                }
            }; SITES],
        }
    }

    /// The real function for a call that returns to `caller`; None, after one warning, if no
    /// lookup finds it. Loads only, once resolved: the global copy's address, else the call
    /// site's (Open MPI loads libucp with `RTLD_LOCAL`: every one of its sends comes here).
    #[inline(always)]
    pub fn get(&self, caller: usize) -> Option<F> {
        let p = self.global.load(Acquire);
        if p.is_null() {
            if caller == 0 {
                // No call site (not x86_64): the global or first-found copy, kept.
                return self.real.get();
            }
            if let Some(s) = self.known_site(caller) {
                let p = s.found.load(Acquire);
                if !p.is_null() {
                    // SAFETY: only addresses of this function (type F) are stored.
                    return unsafe { as_fn(p) };
                }
            }
            return self.resolve(caller);
        }
        // SAFETY: as above.
        unsafe { as_fn(p) }
    }

    /// A call site's first call (or any call, past [`SITES`] of them).
    #[cold]
    #[inline(never)]
    fn resolve(&self, caller: usize) -> Option<F> {
        if self.state.load(Acquire) == UNRESOLVED {
            let p = self.real.find_next();
            if !p.is_null() {
                self.global.store(p, Release);
                // SAFETY: as in `get`.
                return unsafe { as_fn(p) };
            }
            self.state.store(PER_CALLER, Release);
        }
        let mut p = in_callers_scope(self.real.name(), caller);
        if p.is_null() {
            p = self.real.find_elsewhere();
        }
        if p.is_null() {
            self.real.warn_missing();
            return None;
        }
        if let Some(s) = self.claim_site(caller) {
            s.found.store(p, Release);
        }
        // SAFETY: as in `get`.
        unsafe { as_fn(p) }
    }

    fn first_slot(caller: usize) -> usize {
        (caller.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % SITES
    }

    /// `caller`'s entry if it has one (loads only).
    #[inline(always)]
    fn known_site(&self, caller: usize) -> Option<&Site> {
        let start = Self::first_slot(caller);
        for k in 0..SITES {
            let s = &self.sites[(start + k) % SITES];
            match s.ret.load(Acquire) {
                r if r == caller => return Some(s),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    /// `caller`'s entry, claimed if new; None for an unknown caller (0) or a full table.
    fn claim_site(&self, caller: usize) -> Option<&Site> {
        if caller == 0 {
            return None;
        }
        let start = Self::first_slot(caller);
        for k in 0..SITES {
            let s = &self.sites[(start + k) % SITES];
            match s.ret.compare_exchange(0, caller, AcqRel, Acquire) {
                Ok(_) => return Some(s),
                Err(r) if r == caller => return Some(s),
                Err(_) => {}
            }
        }
        None
    }
}

/// `name` as the object containing `caller` finds it through its own dependencies (null if
/// it does not, or finds only the shim's own export). The handle stays open when it does: the
/// caller, and the copy it uses, then stay loaded while the address is kept.
fn in_callers_scope(name: &CStr, caller: usize) -> *mut c_void {
    if caller == 0 {
        return null_mut();
    }
    // SAFETY: dladdr only reads the loader's tables; `info` is ours. dlopen with RTLD_NOLOAD
    // loads nothing; the file name is the loader's own C string.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(caller as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return null_mut();
        }
        if info.dli_fbase == shim_base() {
            return null_mut();
        }
        let h = libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return null_mut();
        }
        let p = libc_dl::real_dlsym()(h, name.as_ptr());
        let mut found: libc::Dl_info = std::mem::zeroed();
        let ours =
            !p.is_null() && libc::dladdr(p, &mut found) != 0 && found.dli_fbase == shim_base();
        if p.is_null() || ours {
            libc::dlclose(h);
            // The program's next dlerror() must not see this lookup's failure.
            libc::dlerror();
            return null_mut();
        }
        p
    }
}

/// The shim's own load address (a lookup through the main program's handle searches the
/// global scope, where the shim's export comes first).
fn shim_base() -> *mut c_void {
    static BASE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let b = BASE.load(Relaxed);
    if !b.is_null() {
        return b;
    }
    // SAFETY: as above, for an address inside the shim.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(shim_base as *const c_void, &mut info) } == 0 {
        return null_mut();
    }
    BASE.store(info.dli_fbase, Relaxed);
    info.dli_fbase
}

//! UCP functions resolved as each caller's own lookup would resolve them ([`UcpReal`]).
//!
//! The shim's `ucp_*` exports come first in the global scope, so every caller of every copy of
//! libucp lands in them: a wheel's bundled `libucp-<hash>.so.0` beside the system's
//! `libucp.so.0` (RAPIDS next to mpi4py), each in a local scope. Forwarding everyone to the
//! one copy found first gives that copy the other's endpoints. So the real function is the one
//! found after the shim in the global scope, the same for every caller, when there is one
//! (one load a call, as before); otherwise the one in the caller's own scope (the object the
//! call returns to and its dependencies, the lookup `dlsym` makes through its handle), kept
//! per call site; and only if that finds none (a call in tail position returns where its
//! caller's caller does; a caller not linked with libucp), the library of that name loaded
//! elsewhere, as before, kept per call site too.
//!
//! The call site is the return address, which the export's entry stores in the thread's state
//! before it jumps to the wrapper (`exports::ucp`; x86_64 only, elsewhere it is 0 and every
//! caller gets the global or first-found copy, as before). A signal handler that sends between
//! that store and the wrapper's read makes the interrupted call resolve from the handler's
//! call site (UCP is not async-signal-safe: a program cannot count on such a send anyway).
//!
//! Once resolved, a call takes loads only: the lookups (`dladdr`, `dlopen` with
//! `RTLD_NOLOAD`, `dlsym`, which take the loader's lock) run at a call site's first call.
//! Past [`SITES`] call sites of one function, the others get the first-found copy (said once),
//! never a lookup per call. The shim keeps one reference (`dlopen`) to each calling object it
//! resolved through: it, and the copy it uses, stay loaded under the kept address. Whether
//! the global scope has the function is looked at once, at the first call.
use crate::sys::fn_slot::as_fn;
use crate::sys::libc_dl;
use crate::sys::symbols::Real;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// Call sites a function remembers (beyond: the first-found copy, said once).
const SITES: usize = 128;
/// Entries a call site's lookup looks at, from the one its address hashes to: a site that
/// finds neither itself nor a free one there is one too many.
const PROBES: usize = 16;
/// Calling objects the shim keeps a reference to (beyond: each lookup's reference is kept,
/// at most one per call site).
const PINNED: usize = 64;

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
    /// A call site found no entry (see [`PROBES`]).
    full: AtomicBool,
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
            full: AtomicBool::new(false),
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
            match self.known_site(caller) {
                Some(s) => {
                    let p = s.found.load(Acquire);
                    if !p.is_null() {
                        // SAFETY: only addresses of this function (type F) are stored.
                        return unsafe { as_fn(p) };
                    }
                }
                // One call site too many: the first-found copy, kept.
                None if self.full.load(Relaxed) => return self.real.get(),
                None => {}
            }
            return self.resolve(caller);
        }
        // SAFETY: as above.
        unsafe { as_fn(p) }
    }

    /// A call site's first call.
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
        let Some(site) = self.claim_site(caller) else {
            self.full.store(true, Relaxed);
            crate::sys::say::warn_once!(&format!(
                "{} is called from more places than the shim tells apart ({SITES}): the later \
                 ones reach the first libucp found (with two copies of UCX loaded, perhaps \
                 not their own)",
                self.real.name().to_string_lossy()
            ));
            return self.real.get();
        };
        let mut p = in_callers_scope(self.real.name(), caller);
        if p.is_null() {
            p = self.real.find();
        }
        if p.is_null() {
            self.real.warn_missing();
            return None;
        }
        site.found.store(p, Release);
        // SAFETY: as in `get`.
        unsafe { as_fn(p) }
    }

    fn first_slot(caller: usize) -> usize {
        (caller.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % SITES
    }

    /// `caller`'s entry if it has one (loads only; None for an unknown caller too).
    #[inline(always)]
    fn known_site(&self, caller: usize) -> Option<&Site> {
        if caller == 0 {
            return None;
        }
        let start = Self::first_slot(caller);
        for k in 0..PROBES {
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
        for k in 0..PROBES {
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
/// it does not, or finds only the shim's own export). The object stays referenced when it
/// does ([`pin`]).
fn in_callers_scope(name: &CStr, caller: usize) -> *mut c_void {
    if caller == 0 {
        return null_mut();
    }
    // SAFETY: dladdr only reads the loader's tables; `info` is ours. dlopen with RTLD_NOLOAD
    // loads nothing; the file name is the loader's own C string. A failure's message is taken
    // (dlerror) so the program's next dlerror() does not see it.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        // The byte before the return address is the call's own: a call that ends its object
        // returns just past it.
        let site = (caller - 1) as *const c_void;
        if libc::dladdr(site, &mut info) == 0 || info.dli_fname.is_null() {
            return null_mut();
        }
        if info.dli_fbase == shim_base() {
            return null_mut();
        }
        let h = libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            libc::dlerror();
            return null_mut();
        }
        let p = libc_dl::real_dlsym()(h, name.as_ptr());
        let mut found: libc::Dl_info = std::mem::zeroed();
        let ours =
            !p.is_null() && libc::dladdr(p, &mut found) != 0 && found.dli_fbase == shim_base();
        if p.is_null() || ours {
            libc::dlclose(h);
            libc::dlerror();
            return null_mut();
        }
        pin(info.dli_fbase as usize, h);
        p
    }
}

/// Keeps one reference to the object loaded at `base` (`h`, just taken): a second one is
/// given back.
///
/// # Safety
/// `h` is a handle `dlopen` just returned for that object.
unsafe fn pin(base: usize, h: *mut c_void) {
    static BASES: [AtomicUsize; PINNED] = [const { AtomicUsize::new(0) }; PINNED];
    for b in &BASES {
        match b.compare_exchange(0, base, AcqRel, Acquire) {
            Ok(_) => return,
            Err(had) if had == base => {
                libc::dlclose(h);
                return;
            }
            Err(_) => {}
        }
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

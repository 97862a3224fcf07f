//! The real libibverbs and libucp symbols ([`Real`]), found after the shim in the lookup
//! order, and counters of how they were found.
use crate::abi::verbs::*;
use crate::sys::fn_slot::as_fn;
pub use crate::sys::fn_slot::{address, FnSlot};
use crate::sys::{libc_dl, say};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

/// How many real symbols were found only through the `RTLD_NOLOAD` fallback (in the stats).
pub static NOLOAD_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// A real symbol of type `F` (libibverbs', or UCX's libucp), resolved on first use.
pub struct Real<F> {
    name: &'static CStr,
    /// libibverbs' symbols are versioned, libucp's are not.
    version: Option<&'static CStr>,
    /// The library's soname, for the RTLD_NOLOAD fallback.
    library: &'static CStr,
    slot: FnSlot<F>,
}

impl<F: Copy> Real<F> {
    const fn new(name: &'static CStr, version: &'static CStr) -> Real<F> {
        Real {
            name,
            version: Some(version),
            library: c"libibverbs.so.1",
            slot: FnSlot::empty(),
        }
    }

    /// An unversioned symbol of libucp (UCX's UCP API).
    pub const fn ucp(name: &'static CStr) -> Real<F> {
        Real {
            name,
            version: None,
            library: c"libucp.so.0",
            slot: FnSlot::empty(),
        }
    }

    /// The real symbol: `dlvsym(RTLD_NEXT)`, else libibverbs already loaded in some local
    /// scope (Open MPI loads UCX, and UCX libibverbs, with RTLD_LOCAL; NCCL dlopens it: there
    /// RTLD_NEXT finds nothing). None, after one warning, if neither works.
    pub fn get(&self) -> Option<F> {
        let p = self.find();
        if p.is_null() {
            self.warn_missing();
            return None;
        }
        // SAFETY: the symbol of this name and version has type F (the declarations below).
        unsafe { as_fn(p) }
    }

    /// Says once that the real symbol cannot be found (its calls fail).
    pub fn warn_missing(&self) {
        say::warn_once!(&format!(
            "cannot find the real {}{}{}; the call fails",
            self.name.to_string_lossy(),
            if self.version.is_some() { "@" } else { "" },
            self.version
                .map(|v| v.to_string_lossy())
                .unwrap_or_default()
        ));
    }

    pub fn name(&self) -> &'static CStr {
        self.name
    }

    /// The real symbol's address as [`Real::get`] finds it, null (silently) if not found.
    pub fn find(&self) -> *mut c_void {
        let p = self.slot.raw(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let mut p = self.find_next();
        if p.is_null() {
            p = self.find_elsewhere();
        }
        if !p.is_null() {
            self.slot.set_raw(p, Ordering::Release);
        }
        p
    }

    fn lookup(&self, h: *mut c_void) -> *mut c_void {
        // The real dlsym/dlvsym, not the shim's exports: RTLD_NEXT means "after the shim".
        // SAFETY: valid C strings; dlsym/dlvsym have no other preconditions.
        unsafe {
            match self.version {
                Some(v) => crate::sys::libc_dl::real_dlvsym()(h, self.name.as_ptr(), v.as_ptr()),
                None => crate::sys::libc_dl::real_dlsym()(h, self.name.as_ptr()),
            }
        }
    }

    /// The symbol after the shim in the global scope (null if none; not kept).
    pub fn find_next(&self) -> *mut c_void {
        self.lookup(libc::RTLD_NEXT)
    }

    /// The library loaded outside the global scope: by its soname (`RTLD_NOLOAD`), else under
    /// another file name (a wheel's bundled `libucp-<hash>.so`), found in the loaded objects'
    /// symbol tables. Null if neither; not kept.
    pub fn find_elsewhere(&self) -> *mut c_void {
        // SAFETY: a valid C string; NOLOAD loads nothing.
        let h = unsafe { libc::dlopen(self.library.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            let p = self.lookup(h);
            if !p.is_null() {
                // The reference NOLOAD took stays: the library cannot be unloaded (and
                // reloaded elsewhere) under the cached address.
                NOLOAD_FALLBACKS.fetch_add(1, Ordering::Relaxed);
                return p;
            }
            // SAFETY: the handle NOLOAD just gave.
            unsafe { libc::dlclose(h) };
        }
        let stem = self
            .library
            .to_str()
            .unwrap_or("")
            .split('.')
            .next()
            .unwrap_or("");
        if stem.is_empty() {
            return std::ptr::null_mut();
        }
        crate::abi::elf::find_function(self.name, &[stem], libc_dl::resolve as *const c_void)
            .unwrap_or(std::ptr::null_mut())
    }
}

/// Whether libibverbs is loaded in this process, in any scope.
pub fn libibverbs_loaded() -> bool {
    loaded(c"libibverbs.so.1")
}

/// Whether UCX's libucp is loaded in this process, in any scope.
pub fn libucp_loaded() -> bool {
    loaded(c"libucp.so.0")
}

fn loaded(soname: &CStr) -> bool {
    // SAFETY: a valid C string; RTLD_NOLOAD loads nothing, and the reference it took is
    // given back at once.
    unsafe {
        let h = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

pub type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub type ImportDeviceFn = unsafe extern "C" fn(c_int) -> *mut ibv_context;
pub type CloseDeviceFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
pub type CreateQpFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type QpToQpExFn = unsafe extern "C" fn(*mut ibv_qp) -> *mut ibv_qp_ex;
pub type DestroyQpFn = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
pub type DeallocPdFn = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
pub type ModifyQpFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
pub type CreateCqFn = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
pub type DestroyCqFn = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
pub type GetCqEventFn =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;

pub static OPEN_DEVICE: Real<OpenDeviceFn> = Real::new(c"ibv_open_device", c"IBVERBS_1.1");
pub static IMPORT_DEVICE: Real<ImportDeviceFn> = Real::new(c"ibv_import_device", c"IBVERBS_1.10");
pub static CLOSE_DEVICE: Real<CloseDeviceFn> = Real::new(c"ibv_close_device", c"IBVERBS_1.1");
pub static CREATE_QP: Real<CreateQpFn> = Real::new(c"ibv_create_qp", c"IBVERBS_1.1");
pub static QP_TO_QP_EX: Real<QpToQpExFn> = Real::new(c"ibv_qp_to_qp_ex", c"IBVERBS_1.6");
pub static DESTROY_QP: Real<DestroyQpFn> = Real::new(c"ibv_destroy_qp", c"IBVERBS_1.1");
pub static DEALLOC_PD: Real<DeallocPdFn> = Real::new(c"ibv_dealloc_pd", c"IBVERBS_1.1");
pub static MODIFY_QP: Real<ModifyQpFn> = Real::new(c"ibv_modify_qp", c"IBVERBS_1.1");
pub static CREATE_CQ: Real<CreateCqFn> = Real::new(c"ibv_create_cq", c"IBVERBS_1.1");
pub static DESTROY_CQ: Real<DestroyCqFn> = Real::new(c"ibv_destroy_cq", c"IBVERBS_1.1");
pub static GET_CQ_EVENT: Real<GetCqEventFn> = Real::new(c"ibv_get_cq_event", c"IBVERBS_1.1");

/// How many lookups through a library handle (`dlsym`/`dlvsym`, as NCCL does) were answered
/// with a hook ([`crate::exports::dl`]), for the stats.
pub static HANDED_OUT: AtomicU64 = AtomicU64::new(0);

/// Whether code of a library whose file name starts with one of `prefixes` (`libuct`,
/// `libucp`) is on the calling stack: a few frames of `backtrace`, each looked up with
/// `dladdr`. At open time only, never on a post path.
pub fn called_from(prefixes: &[&[u8]]) -> bool {
    let mut frames = [std::ptr::null_mut::<c_void>(); 16];
    // SAFETY: the buffer holds 16 entries; backtrace writes at most that many.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), frames.len() as c_int) };
    frames[..n.clamp(0, 16) as usize].iter().any(|&ip| {
        // SAFETY: dladdr only reads the loader's tables; `info` is ours.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if ip.is_null() || unsafe { libc::dladdr(ip, &mut info) } == 0 || info.dli_fname.is_null() {
            return false;
        }
        // SAFETY: dladdr's file name is a C string owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
        let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
        prefixes.iter().any(|p| base.starts_with(p))
    })
}

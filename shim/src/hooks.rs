//! The exported symbols that LD_PRELOAD interposes, and how the real ones are found.
//!
//! `ibv_post_send` is a static inline, so there is nothing to interpose for it: instead the
//! functions that hand out contexts are interposed, and the returned context is patched
//! (see [`crate::patch`]). These are the only symbols libibjitter.so exports.
use crate::verbs_abi::*;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

/// How many real symbols were found only through the `RTLD_NOLOAD` fallback (in the stats).
pub static NOLOAD_FALLBACKS: AtomicU64 = AtomicU64::new(0);

struct Real {
    name: &'static CStr,
    version: &'static CStr,
    ptr: AtomicPtr<c_void>,
}

impl Real {
    const fn new(name: &'static CStr, version: &'static CStr) -> Real {
        Real {
            name,
            version,
            ptr: AtomicPtr::new(null_mut()),
        }
    }

    /// The real symbol: `dlvsym(RTLD_NEXT)`, else libibverbs already loaded in some local
    /// scope (Open MPI loads UCX, and UCX libibverbs, with RTLD_LOCAL: there RTLD_NEXT finds
    /// nothing). Null if neither works.
    fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Acquire);
        if !p.is_null() {
            return p;
        }
        // SAFETY: valid C strings; dlvsym/dlopen have no other preconditions.
        let p = unsafe {
            let mut p = libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), self.version.as_ptr());
            if p.is_null() {
                let h = libc::dlopen(
                    c"libibverbs.so.1".as_ptr(),
                    libc::RTLD_LAZY | libc::RTLD_NOLOAD,
                );
                if !h.is_null() {
                    p = libc::dlvsym(h, self.name.as_ptr(), self.version.as_ptr());
                    if !p.is_null() {
                        NOLOAD_FALLBACKS.fetch_add(1, Relaxed);
                    }
                    // NOLOAD took a reference; the library stays loaded by its other users.
                    libc::dlclose(h);
                }
            }
            p
        };
        if p.is_null() {
            crate::warn_once(&format!(
                "cannot find the real {}@{}; the call fails with ENOSYS",
                self.name.to_string_lossy(),
                self.version.to_string_lossy()
            ));
        } else {
            self.ptr.store(p, Release);
        }
        p
    }
}

static OPEN_DEVICE: Real = Real::new(c"ibv_open_device", c"IBVERBS_1.1");
static IMPORT_DEVICE: Real = Real::new(c"ibv_import_device", c"IBVERBS_1.10");
static CLOSE_DEVICE: Real = Real::new(c"ibv_close_device", c"IBVERBS_1.1");
static CREATE_QP: Real = Real::new(c"ibv_create_qp", c"IBVERBS_1.1");
static QP_TO_QP_EX: Real = Real::new(c"ibv_qp_to_qp_ex", c"IBVERBS_1.6");

/// Names shown in the startup line.
pub const HOOKED: &str =
    "ibv_open_device ibv_import_device ibv_close_device ibv_create_qp -> ops.post_send, create_qp_ex -> wr_complete";

fn fail_enosys<T>() -> *mut T {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    null_mut()
}

/// Patches the `ibv_qp_ex` of `qp`, if it has one (created with send ops flags).
///
/// # Safety
/// `qp` must be null or a live QP.
pub(crate) unsafe fn patch_qp_ex_of(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    let f = QP_TO_QP_EX.get();
    if f.is_null() {
        return;
    }
    let to_qpx: unsafe extern "C" fn(*mut ibv_qp) -> *mut ibv_qp_ex = std::mem::transmute(f);
    crate::patch::patch_qp(to_qpx(qp));
}

/// Interposed `ibv_open_device@IBVERBS_1.1`.
///
/// # Safety
/// Same contract as libibverbs' `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let f = OPEN_DEVICE.get();
    if f.is_null() {
        return fail_enosys();
    }
    let real: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context = std::mem::transmute(f);
    let ctx = real(device);
    crate::announce_once();
    crate::patch::patch_context(ctx);
    ctx
}

/// Interposed `ibv_import_device@IBVERBS_1.10`.
///
/// # Safety
/// Same contract as libibverbs' `ibv_import_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let f = IMPORT_DEVICE.get();
    if f.is_null() {
        return fail_enosys();
    }
    let real: unsafe extern "C" fn(c_int) -> *mut ibv_context = std::mem::transmute(f);
    let ctx = real(cmd_fd);
    crate::announce_once();
    crate::patch::patch_context(ctx);
    ctx
}

/// Interposed `ibv_close_device@IBVERBS_1.1`: restore the provider's pointers first.
///
/// # Safety
/// Same contract as libibverbs' `ibv_close_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    let f = CLOSE_DEVICE.get();
    if f.is_null() {
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    }
    crate::patch::unpatch_context(ctx);
    let real: unsafe extern "C" fn(*mut ibv_context) -> c_int = std::mem::transmute(f);
    real(ctx)
}

/// Interposed `ibv_create_qp@IBVERBS_1.1`: a provider may give legacy QPs an `ibv_qp_ex`
/// too, reachable through `ibv_qp_to_qp_ex`; patch it where it exists.
///
/// # Safety
/// Same contract as libibverbs' `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let f = CREATE_QP.get();
    if f.is_null() {
        return fail_enosys();
    }
    let real: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp =
        std::mem::transmute(f);
    let qp = real(pd, attr);
    patch_qp_ex_of(qp);
    qp
}

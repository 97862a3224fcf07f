//! The exported symbols that LD_PRELOAD interposes (the real ones: [`crate::sys::symbols`]).
//!
//! `ibv_post_send` is a static inline, so there is nothing to interpose for it: instead the
//! functions that hand out contexts are interposed, and the returned context is patched
//! (see [`crate::wrappers::patch`]). With `dlsym`/`dlvsym` ([`crate::exports::dl`]), these are the only symbols
//! libibjitter.so exports; [`hook_for`] says which hook stands for which real function.
use crate::abi::verbs::*;
use crate::modes::{cq, cq_ex, line, select};
use crate::registry;
use crate::runtime::lifecycle;
use crate::state;
use crate::sys::symbols::{address, Real, CLOSE_DEVICE, CREATE_QP, DESTROY_QP};
use crate::sys::symbols::{CloseDeviceFn, CreateQpFn, DestroyQpFn, ImportDeviceFn, OpenDeviceFn};
use crate::sys::symbols::{CreateCqFn, DestroyCqFn, CREATE_CQ, DESTROY_CQ, IMPORT_DEVICE};
use crate::sys::symbols::{DeallocPdFn, DEALLOC_PD};
use crate::sys::symbols::{GetCqEventFn, ModifyQpFn, GET_CQ_EVENT, MODIFY_QP, OPEN_DEVICE};
use crate::wrappers::patch;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;

/// The hook that stands for `found`, the function a lookup of `name` through a handle
/// returned, if the shim wraps that very function (the address its own lookup of the real
/// symbol finds: not a compat version, another library's namesake or a `dlmopen` copy).
pub fn hook_for(name: &CStr, found: *mut c_void) -> Option<*mut c_void> {
    fn same<F: Copy>(real: &Real<F>, found: *mut c_void, hook: F) -> Option<*mut c_void> {
        (real.find() == found).then(|| address(hook))
    }
    match name.to_bytes() {
        b"ibv_open_device" => same(&OPEN_DEVICE, found, ibv_open_device as OpenDeviceFn),
        b"ibv_import_device" => same(&IMPORT_DEVICE, found, ibv_import_device as ImportDeviceFn),
        b"ibv_close_device" => same(&CLOSE_DEVICE, found, ibv_close_device as CloseDeviceFn),
        b"ibv_create_qp" => same(&CREATE_QP, found, ibv_create_qp as CreateQpFn),
        b"ibv_destroy_qp" => same(&DESTROY_QP, found, ibv_destroy_qp as DestroyQpFn),
        b"ibv_modify_qp" => same(&MODIFY_QP, found, ibv_modify_qp as ModifyQpFn),
        b"ibv_dealloc_pd" => same(&DEALLOC_PD, found, ibv_dealloc_pd as DeallocPdFn),
        b"ibv_create_cq" => same(&CREATE_CQ, found, ibv_create_cq as CreateCqFn),
        b"ibv_destroy_cq" => same(&DESTROY_CQ, found, ibv_destroy_cq as DestroyCqFn),
        b"ibv_get_cq_event" => same(&GET_CQ_EVENT, found, ibv_get_cq_event as GetCqEventFn),
        _ => None,
    }
}

fn fail_enosys<T>() -> *mut T {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    null_mut()
}

/// Interposed `ibv_open_device@IBVERBS_1.1`.
///
/// # Safety
/// Same contract as libibverbs' `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let Some(real) = OPEN_DEVICE.get() else {
        return fail_enosys();
    };
    let ctx = real(device);
    opened(ctx);
    ctx
}

/// A context came back from the real open or import.
unsafe fn opened(ctx: *mut ibv_context) {
    lifecycle::context_opened(ctx);
}

/// Interposed `ibv_import_device@IBVERBS_1.10`.
///
/// # Safety
/// Same contract as libibverbs' `ibv_import_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let Some(real) = IMPORT_DEVICE.get() else {
        return fail_enosys();
    };
    let ctx = real(cmd_fd);
    opened(ctx);
    ctx
}

/// Interposed `ibv_close_device@IBVERBS_1.1`: restore the provider's pointers first, and drop
/// what the delay line still holds for the context's QPs ([`line::context_closed`]).
///
/// # Safety
/// Same contract as libibverbs' `ibv_close_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    let Some(real) = CLOSE_DEVICE.get() else {
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    };
    line::context_closed(ctx);
    patch::unpatch_context(ctx);
    real(ctx)
}

/// Interposed `ibv_create_qp@IBVERBS_1.1`: the delay line learns of the QP. A legacy QP has
/// no `ibv_qp_ex` (no send ops flags can be asked for here), and `ibv_qp_to_qp_ex` is never
/// called on it: on providers whose QP is a plain `ibv_qp` it reads past the object.
///
/// # Safety
/// Same contract as libibverbs' `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let Some(real) = CREATE_QP.get() else {
        return fail_enosys();
    };
    let qp = real(pd, attr);
    if qp.is_null() {
        return qp;
    }
    state::note_qp_created();
    line::qp_created(qp);
    qp
}

/// Interposed `ibv_destroy_qp@IBVERBS_1.1`: the QP's registry entry is released first (its
/// address may come back for another QP). `EBUSY` inside the delay line's own hand-over to
/// it ([`line::may_destroy`]).
///
/// # Safety
/// Same contract as libibverbs' `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let Some(real) = DESTROY_QP.get() else {
        return libc::ENOSYS;
    };
    if !line::may_destroy(qp) {
        return libc::EBUSY;
    }
    registry::forget_qp(qp);
    select::qp_destroyed(qp);
    line::qp_destroyed(qp);
    real(qp)
}

/// Interposed `ibv_dealloc_pd@IBVERBS_1.1`: a parent domain with a thread domain is
/// forgotten ([`line::thread_domains`]), its address free for a plain PD.
///
/// # Safety
/// Same contract as libibverbs' `ibv_dealloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    let Some(real) = DEALLOC_PD.get() else {
        return libc::ENOSYS;
    };
    let rc = real(pd);
    if rc == 0 {
        line::thread_domains::freed(pd);
    }
    rc
}

/// Interposed `ibv_modify_qp@IBVERBS_1.1`: a QP being connected to a destination that
/// `IBJITTER_DEST` selects joins the selected QPs ([`select::qp_modified`]); one being reset
/// loses what the delay line holds for it ([`line::before_modify_qp`]).
///
/// # Safety
/// Same contract as libibverbs' `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    let Some(real) = MODIFY_QP.get() else {
        return libc::ENOSYS;
    };
    line::before_modify_qp(qp, attr, attr_mask);
    let rc = real(qp, attr, attr_mask);
    if rc == 0 {
        select::qp_modified(qp, attr, attr_mask);
    }
    rc
}

/// Interposed `ibv_create_cq@IBVERBS_1.1`: with a completion table, the new CQ gets its
/// holding ring ([`crate::modes::cq`]).
///
/// # Safety
/// Same contract as libibverbs' `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Some(real) = CREATE_CQ.get() else {
        return fail_enosys();
    };
    let cq = real(ctx, cqe, cq_context, channel, comp_vector);
    cq::cq_created(cq);
    cq
}

/// Interposed `ibv_destroy_cq@IBVERBS_1.1`: its ring is set aside first, and goes once the
/// provider destroyed the CQ (it stays if the provider refuses: a QP still uses the CQ).
///
/// # Safety
/// Same contract as libibverbs' `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let Some(real) = DESTROY_CQ.get() else {
        return libc::ENOSYS;
    };
    let parked = (cq::park_for_destroy(cq), cq_ex::park_for_destroy(cq));
    let rc = real(cq);
    cq::after_destroy(parked.0, rc == 0);
    cq_ex::after_destroy(parked.1, rc == 0);
    rc
}

/// Interposed `ibv_get_cq_event@IBVERBS_1.1`: the program blocks for a completion event next.
/// The delay line hands over what is due and wakes its timer thread for the requests still in
/// it ([`line::program_may_sleep`]), then the real one reads the channel.
///
/// # Safety
/// Same contract as libibverbs' `ibv_get_cq_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let Some(real) = GET_CQ_EVENT.get() else {
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    };
    line::program_may_sleep();
    real(channel, cq, cq_context)
}

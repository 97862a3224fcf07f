//! The UCP layer (`IBJITTER_LAYER=ucp|auto`): a delay per message at UCX's public send API,
//! whatever transport UCX picks underneath. On Mellanox hardware UCX's `rc_mlx5`, `dc_mlx5`
//! and `ud_mlx5` write work requests to the NIC themselves, past every verbs hook; Open MPI's
//! `pml_ucx`/`osc_ucx`, MPICH's ch4:ucx, OpenSHMEM and Intel MPI's `mlx` provider all send
//! through these calls. The preloaded shim is in the global scope, so its definitions come
//! first even for a libucp that Open MPI loads with `RTLD_LOCAL`.
//!
//! One message, one delay: libucp's `_nb`, `_nbi` and `_nbr` forms, and its old blocking
//! atomics, call its `_nbx` ones through the PLT, i.e. through these wrappers again; a
//! per-thread depth counter lets only the outermost call wait (so a send that a callback makes
//! while a blocking `ucp_put`/`ucp_get` progresses the worker is not delayed). The wait comes
//! before UCX sees the message, in the calling thread, as at verbs. The verbs contexts UCX
//! opens are left unpatched ([`crate::exports::verbs`]), so its messages never wait twice.
//!
//! Every wrapped function takes only integer and pointer arguments and returns an integer
//! (`ucs_status_t`) or a pointer (`ucs_status_ptr_t`): the wrappers pass each argument on as
//! a 64-bit word and the result back as one, which the x86_64 and AArch64 C calling
//! conventions make exact (up to 8 arguments: registers, then stack slots of 8 bytes).
use crate::draw;
use crate::draw::counts::Hook;
use crate::modes::select;
use crate::runtime::lifecycle;
use crate::state;
use crate::sys::rng;
use crate::sys::symbols::Real;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// `UCS_ERR_UNSUPPORTED`, returned (as a status or a status pointer) if the real function
/// cannot be found, which a program that calls it can hardly meet.
const UCS_ERR_UNSUPPORTED: i64 = -22;

/// Whether this process has sent a UCP message since load.
static SEEN: AtomicBool = AtomicBool::new(false);

/// The first UCP message: UCX is in use, and the startup line is due.
#[cold]
#[inline(never)]
fn first_message() {
    SEEN.store(true, Relaxed);
    state::note_ucx_seen();
    lifecycle::first_use();
}

/// Before the real call: the outermost call of a thread waits its draw (when `class` is
/// selected, see [`crate::modes::select`]).
#[inline(always)]
fn enter(mode: u8, class: u8) {
    if rng::enter_ucp() {
        if !SEEN.load(Relaxed) {
            first_message();
        }
        let mode = if mode & state::SELECT != 0 && !select::ucp_selected(class) {
            state::unselected(mode)
        } else {
            mode
        };
        draw::delay(mode, Hook::Ucp);
    }
}

/// Verbs contexts that UCX opened (left unpatched), by address; 0 = free. Lock-free, so a
/// fork never inherits it locked.
static UCX_CONTEXTS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

/// Whether the device being opened is opened by UCX (libuct's or libucp's code is on the
/// calling stack): a few frames of `backtrace`, each looked up with `dladdr`. At open time
/// only, never on a post path.
pub fn opened_by_ucx() -> bool {
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
        base.starts_with(b"libuct") || base.starts_with(b"libucp")
    })
}

/// Notes a context UCX opened (not patched: its sends are UCP messages).
pub fn add_ucx_context(ctx: *mut c_void) {
    let key = ctx as usize;
    for slot in &UCX_CONTEXTS {
        if slot.compare_exchange(0, key, Relaxed, Relaxed).is_ok() {
            return;
        }
    }
    // Full: the context stays unpatched anyway; only its QPs' ibv_qp_ex could be patched.
}

/// Forgets a context (closed: its address may come back for another).
pub fn forget_ucx_context(ctx: *mut c_void) {
    let key = ctx as usize;
    for slot in &UCX_CONTEXTS {
        let _ = slot.compare_exchange(key, 0, Relaxed, Relaxed);
    }
}

/// Whether UCX opened this context.
pub fn is_ucx_context(ctx: *mut c_void) -> bool {
    let key = ctx as usize;
    key != 0 && UCX_CONTEXTS.iter().any(|s| s.load(Relaxed) == key)
}

/// `u64` for each argument name (the wrappers' parameter types).
macro_rules! word {
    ($x:ident) => {
        u64
    };
}

/// Defines one exported wrapper per UCP send function.
macro_rules! ucp_sends {
    ($($name:ident($($arg:ident),+);)+) => {
        /// The UCP functions the shim wraps.
        pub const WRAPPED: &[&str] = &[$(stringify!($name)),+];
        $(
            /// Interposed UCP send function: one delay per message (see the module).
            ///
            /// # Safety
            /// Same contract as UCX's function of this name.
            #[no_mangle]
            // "C-unwind": a callback that ends its thread (pthread_exit, cancellation) from
            // inside the real call unwinds through here instead of aborting the process.
            pub unsafe extern "C-unwind" fn $name($($arg: u64),+) -> u64 {
                type F = unsafe extern "C-unwind" fn($(word!($arg)),+) -> u64;
                static REAL: Real<F> = Real::ucp(
                    match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("bad name"),
                    },
                );
                let Some(real) = REAL.get() else {
                    return UCS_ERR_UNSUPPORTED as u64;
                };
                let mode = state::ucp_mode();
                if mode == 0 {
                    return real($($arg),+);
                }
                const CLASS: u8 = crate::config::select::ucp_class(stringify!($name));
                enter(mode, CLASS);
                let result = real($($arg),+);
                rng::leave_ucp();
                result
            }
        )+
    };
}

// From UCX 1.13's ucp.h and ucp_compat.h (the argument names are theirs).
ucp_sends! {
    ucp_tag_send_nbx(ep, buffer, count, tag, param);
    ucp_tag_send_sync_nbx(ep, buffer, count, tag, param);
    ucp_tag_send_nb(ep, buffer, count, datatype, tag, cb);
    ucp_tag_send_nbr(ep, buffer, count, datatype, tag, req);
    ucp_tag_send_sync_nb(ep, buffer, count, datatype, tag, cb);
    ucp_am_send_nbx(ep, id, header, header_length, buffer, count, param);
    ucp_am_send_nb(ep, id, buffer, count, datatype, cb, flags);
    ucp_stream_send_nbx(ep, buffer, count, param);
    ucp_stream_send_nb(ep, buffer, count, datatype, cb, flags);
    ucp_put_nbx(ep, buffer, count, remote_addr, rkey, param);
    ucp_put_nbi(ep, buffer, length, remote_addr, rkey);
    ucp_put_nb(ep, buffer, length, remote_addr, rkey, cb);
    ucp_put(ep, buffer, length, remote_addr, rkey);
    ucp_get_nbx(ep, buffer, count, remote_addr, rkey, param);
    ucp_get_nbi(ep, buffer, length, remote_addr, rkey);
    ucp_get_nb(ep, buffer, length, remote_addr, rkey, cb);
    ucp_get(ep, buffer, length, remote_addr, rkey);
    ucp_atomic_op_nbx(ep, opcode, buffer, count, remote_addr, rkey, param);
    ucp_atomic_post(ep, opcode, value, op_size, remote_addr, rkey);
    ucp_atomic_fetch_nb(ep, opcode, value, result, op_size, remote_addr, rkey, cb);
    ucp_atomic_add32(ep, add, remote_addr, rkey);
    ucp_atomic_add64(ep, add, remote_addr, rkey);
    ucp_atomic_fadd32(ep, add, remote_addr, rkey, result);
    ucp_atomic_fadd64(ep, add, remote_addr, rkey, result);
    ucp_atomic_swap32(ep, swap, remote_addr, rkey, result);
    ucp_atomic_swap64(ep, swap, remote_addr, rkey, result);
    ucp_atomic_cswap32(ep, compare, swap, remote_addr, rkey, result);
    ucp_atomic_cswap64(ep, compare, swap, remote_addr, rkey, result);
}

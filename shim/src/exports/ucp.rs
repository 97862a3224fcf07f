//! The UCP layer's exports (`IBJITTER_LAYER=ucp|auto`): a delay per message at UCX's public
//! send API, whatever transport UCX picks underneath. On Mellanox hardware UCX's `rc_mlx5`,
//! `dc_mlx5` and `ud_mlx5` write work requests to the NIC themselves, past every verbs hook;
//! Open MPI's `pml_ucx`/`osc_ucx`, MPICH's ch4:ucx, OpenSHMEM and Intel MPI's `mlx` provider
//! all send through these calls. The preloaded shim is in the global scope, so its
//! definitions come first even for a libucp that Open MPI loads with `RTLD_LOCAL`. Each
//! wrapper only delegates: the first message to the lifecycle (the process's first use),
//! the wait to [`crate::wrappers::ucp`], the message to the real function. The verbs
//! contexts UCX opens are left unpatched ([`crate::exports::verbs`]), so its messages never
//! wait twice.
//!
//! Every wrapped function takes only integer and pointer arguments and returns an integer
//! (`ucs_status_t`) or a pointer (`ucs_status_ptr_t`): the wrappers pass each argument on as
//! a 64-bit word and the result back as one, which the x86_64 and AArch64 C calling
//! conventions make exact (up to 8 arguments: registers, then stack slots of 8 bytes).
use crate::runtime::lifecycle;
use crate::state;
use crate::sys::by_caller::UcpReal;
use crate::sys::rng;
use crate::wrappers::ucp;

/// `UCS_ERR_UNSUPPORTED`, returned (as a status or a status pointer) if the real function
/// cannot be found, which a program that calls it can hardly meet.
const UCS_ERR_UNSUPPORTED: i64 = -22;

/// `u64` for each argument name (the wrappers' parameter types).
macro_rules! word {
    ($x:ident) => {
        u64
    };
}

/// Defines one exported wrapper per UCP send function: the export is an entry that stores
/// its return address (the call site) in the thread's state and jumps to the wrapper, which
/// resolves the real function as that caller would ([`UcpReal`]): with two copies of libucp
/// in one process each keeps its own callers. The jump leaves no frame of the entry's: the
/// wrapper returns to the caller, and an unwind passes from the wrapper to it.
macro_rules! ucp_sends {
    ($($name:ident($($arg:ident),+);)+) => {
        /// The UCP functions the shim wraps.
        pub const WRAPPED: &[&str] = &[$(stringify!($name)),+];

        /// The wrappers, reached from their exports below.
        mod wrapper {
            use super::*;
            $(
                /// Interposed UCP send function: one delay per message (see the module).
                ///
                /// # Safety
                /// Same contract as UCX's function of this name.
                // "C-unwind": a callback that ends its thread (pthread_exit, cancellation)
                // from inside the real call unwinds through here instead of aborting.
                pub unsafe extern "C-unwind" fn $name($($arg: u64),+) -> u64 {
                    type F = unsafe extern "C-unwind" fn($(word!($arg)),+) -> u64;
                    static REAL: UcpReal<F> = UcpReal::new(
                        match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                            Ok(c) => c,
                            Err(_) => panic!("bad name"),
                        },
                    );
                    let Some(real) = REAL.get(rng::ucp_caller()) else {
                        return UCS_ERR_UNSUPPORTED as u64;
                    };
                    let mode = state::ucp_mode();
                    if mode == 0 {
                        return real($($arg),+);
                    }
                    if !state::ucx_seen() {
                        lifecycle::ucp_first_message();
                    }
                    const CLASS: u8 = crate::config::select::ucp_class(stringify!($name));
                    ucp::enter(mode, CLASS);
                    let result = real($($arg),+);
                    ucp::leave();
                    result
                }
            )+
        }

        $(
            /// Interposed UCP send function: stores where it returns to, then jumps to its
            /// wrapper (see the macro).
            ///
            /// # Safety
            /// Same contract as UCX's function of this name.
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C-unwind" fn $name($($arg: u64),+) -> u64 {
                // r10 and r11 carry no argument; the stack is as the caller left it (the
                // arguments beyond six are on it).
                std::arch::naked_asm!(
                    "mov r11, qword ptr [rip + ibjitter_thread_state@GOTTPOFF]",
                    "mov r10, qword ptr [rsp]",
                    "mov qword ptr fs:[r11 + {off}], r10",
                    "jmp {wrapper}",
                    off = const crate::sys::rng::UCP_CALLER_OFFSET,
                    wrapper = sym wrapper::$name,
                )
            }

            /// Interposed UCP send function (every caller gets the global or first-found
            /// copy: no entry stores the call site here).
            ///
            /// # Safety
            /// Same contract as UCX's function of this name.
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            #[no_mangle]
            pub unsafe extern "C-unwind" fn $name($($arg: u64),+) -> u64 {
                wrapper::$name($($arg),+)
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

//! The UCP layer's wait (`IBJITTER_LAYER=ucp|auto`): one delay per message, before UCX sees
//! it, in the calling thread, as at verbs. The exported UCP send functions
//! ([`crate::exports::ucp`]) call [`enter`] and [`leave`] around the real call.
//!
//! One message, one delay: libucp's `_nb`, `_nbi` and `_nbr` forms, and its old blocking
//! atomics, call its `_nbx` ones through the PLT, i.e. through the exported wrappers again;
//! a per-thread depth counter lets only the outermost call wait (so a send that a callback
//! makes while a blocking `ucp_put`/`ucp_get` progresses the worker is not delayed).
use crate::draw;
use crate::draw::counts::Hook;
use crate::modes::select;
use crate::state;
use crate::sys::rng;

/// Before the real call (`mode`: the UCP wrappers' mode, not 0): the outermost call of a
/// thread waits its draw (when `class` is selected, see [`crate::modes::select`]). False
/// for a call inside another (no wait); [`leave`] follows either way.
#[inline(always)]
pub fn enter(mode: u8, class: u8) -> bool {
    if !rng::enter_ucp() {
        return false;
    }
    let mode = if mode & state::SELECT != 0 && !select::ucp_selected(class) {
        state::unselected(mode)
    } else {
        mode
    };
    draw::delay(mode, Hook::Ucp);
    true
}

/// After the real call.
#[inline(always)]
pub fn leave() {
    rng::leave_ucp();
}

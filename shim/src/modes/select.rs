//! Selective injection: only some sends are delayed.
//!
//! - `IBJITTER_OPS=send,write,read,atomic`: by the work request's opcode class (a chain is
//!   selected when any of its requests is; UCP calls by what they do: tag/AM/stream sends are
//!   `send`, puts `write`, gets `read`, atomics `atomic`).
//! - `IBJITTER_QPN=LIST`: by the sending QP's own number (decimal or `0x` hex; on any device).
//! - `IBJITTER_DEST=LIST`: by where the QP is connected: `qpn:N` (the remote QP's number),
//!   an IPv4 or IPv6 address or a GID (RoCE's GID of that address), `lid:N`. Read from
//!   `ibv_modify_qp` as the QP is connected (RC, UC; rdma_cm calls it too): a matching QP
//!   joins a set the post path looks up (by the QP's address: QP numbers repeat across
//!   devices). UD QPs name their destination per work
//!   request (an address handle): they are never selected by destination.
//!
//! A send is delayed when it passes every filter given; the others are counted, not delayed.
//! QPN and destination filters apply to verbs sends only: UCP messages have no QP, and are
//! not delayed while one is given (the startup line says so).
//!
//! The post path reads atomics only: the opcode mask, and with a QP filter a probe of a
//! fixed open-addressing set of QP addresses (no lock, no allocation, no syscall).
use crate::abi::verbs::*;
use crate::config::select::{opcodes, Dest, Selection, ATOMIC, READ, SEND, WRITE};
use crate::sys::addr_table::{self, int_key, KeySet};
use crate::sys::spin_lock::SpinLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// Selected opcodes (bits of `ibv_wr_opcode`); all while no `IBJITTER_OPS`.
static OPCODES: AtomicU32 = AtomicU32::new(u32::MAX);
/// Selected UCP classes; all while no `IBJITTER_OPS`. No UCP message is selected while QPs
/// are filtered.
static UCP_CLASSES: AtomicU32 = AtomicU32::new(u32::MAX);
/// QPs are filtered: by the static list alone ([`QPNS`]), or by the set ([`SET`]) when a
/// destination filter fills it.
static BY_QP: AtomicBool = AtomicBool::new(false);
static BY_DEST: AtomicBool = AtomicBool::new(false);
/// `IBJITTER_QPN`: the QP numbers as a set sized at load (O(1) per post, however long
/// the list).
static QPNS: OnceLock<Box<[AtomicUsize]>> = OnceLock::new();
static DESTS: OnceLock<Vec<Dest>> = OnceLock::new();

/// The QPs connected to a selected destination, by address. A full set says so once.
const SET_SLOTS: usize = 1 << 14;
static SET: [AtomicUsize; SET_SLOTS] = [const { AtomicUsize::new(0) }; SET_SLOTS];
const SET_PROBES: usize = 64;

/// Serialises the set's changes: two `ibv_modify_qp` of one QP at once (rdma_cm's thread
/// and the program's, say) would otherwise each claim a slot for it, and its removal would
/// leave one behind (the QP, or a later one at its address, selected after it left).
static SET_CHANGING: SpinLock = SpinLock::new();
/// How long a change waits for another before it gives up (and says so).
const SET_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

fn dest_set() -> KeySet<'static> {
    KeySet::new(&SET, SET_PROBES)
}

/// Changes the set under [`SET_CHANGING`] (off the post path: at `ibv_modify_qp` and
/// `ibv_destroy_qp`); says once if it could not be had.
fn change_dest_set(f: impl FnOnce(KeySet<'static>)) {
    match SET_CHANGING.lock_within(SET_WAIT) {
        Some(_held) => f(dest_set()),
        None => crate::sys::say::warn_once!(
            "IBJITTER_DEST: a QP's selection could not be updated (another update held the \
             set for 200 ms); it may be delayed as before its ibv_modify_qp",
        ),
    }
}

/// Activates `sel` (at load, before any post). Returns whether anything is filtered.
pub fn activate(sel: &Selection) -> bool {
    let ops = sel.ops.unwrap_or(SEND | WRITE | READ | ATOMIC);
    OPCODES.store(
        if sel.ops.is_some() {
            opcodes(ops)
        } else {
            u32::MAX
        },
        Release,
    );
    UCP_CLASSES.store(if sel.by_qp() { 0 } else { u32::from(ops) }, Release);
    if let Some(q) = &sel.qpns {
        let slots = addr_table::slots_for(q.len());
        let set = KeySet::new(&slots, slots.len());
        for &n in q {
            set.insert(int_key(n));
        }
        let _ = QPNS.set(slots);
    }
    if let Some(d) = &sel.dests {
        let _ = DESTS.set(d.clone());
    }
    BY_DEST.store(sel.dests.is_some(), Release);
    BY_QP.store(sel.by_qp(), Release);
    sel.any()
}

fn in_static_list(qpn: u32) -> bool {
    QPNS.get()
        .is_none_or(|slots| KeySet::new(slots, slots.len()).contains(int_key(qpn)))
}

/// Whether a send on `qp` is selected (ops aside).
///
/// # Safety
/// `qp` a live QP.
#[inline]
pub unsafe fn qp_selected(qp: *const ibv_qp) -> bool {
    if !BY_QP.load(Relaxed) {
        return true;
    }
    if BY_DEST.load(Relaxed) {
        dest_set().contains(qp as usize)
    } else {
        in_static_list((*qp).qp_num)
    }
}

/// Whether an `ibv_post_send` call is selected: its QP, and any of its work requests'
/// opcodes.
///
/// # Safety
/// `qp` a live QP, `wr` null or the application's list (read only).
#[inline(never)]
pub unsafe fn post_selected(qp: *mut ibv_qp, wr: *const ibv_send_wr) -> bool {
    if !qp_selected(qp) {
        return false;
    }
    let ops = OPCODES.load(Relaxed);
    if ops == u32::MAX {
        return true;
    }
    let mut cur = wr;
    while !cur.is_null() {
        if opcode_selected_with(ops, (*cur).opcode) {
            return true;
        }
        cur = (*cur).next;
    }
    false
}

fn opcode_selected_with(ops: u32, opcode: ibv_wr_opcode) -> bool {
    opcode < 32 && ops & (1 << opcode) != 0
}

/// Whether a work request of `opcode` is selected by `IBJITTER_OPS`.
#[inline]
pub fn opcode_selected(opcode: ibv_wr_opcode) -> bool {
    opcode_selected_with(OPCODES.load(Relaxed), opcode)
}

/// Whether the opcode filter is on (the `ibv_wr_*` API then learns the opcode in the
/// work-request calls, see [`crate::wrappers::wr_ops`]).
pub fn by_opcode() -> bool {
    OPCODES.load(Relaxed) != u32::MAX
}

/// Whether a UCP call of `class` ([`SEND`], ...) is selected.
#[inline]
pub fn ucp_selected(class: u8) -> bool {
    UCP_CLASSES.load(Relaxed) & u32::from(class) != 0
}

/// After a successful `ibv_modify_qp`: a QP given its destination (`IBV_QP_DEST_QPN`,
/// `IBV_QP_AV`) joins or leaves the selected set.
///
/// # Safety
/// `qp` a live QP, `attr` the attributes just applied with `mask`.
pub unsafe fn qp_modified(qp: *mut ibv_qp, attr: *const ibv_qp_attr, mask: i32) {
    if !BY_DEST.load(Acquire) || qp.is_null() || attr.is_null() {
        return;
    }
    let mask = mask as u32;
    let (dest_qpn, av) = (
        mask & ibv_qp_attr_mask_IBV_QP_DEST_QPN != 0,
        mask & ibv_qp_attr_mask_IBV_QP_AV != 0,
    );
    if !dest_qpn && !av {
        return;
    }
    let a = &*attr;
    let hit = DESTS.get().is_some_and(|ds| {
        ds.iter().any(|d| match *d {
            Dest::Qpn(n) => dest_qpn && a.dest_qp_num == n,
            Dest::Gid(g) => av && a.ah_attr.is_global != 0 && a.ah_attr.grh.dgid.raw == g,
            Dest::Lid(l) => av && a.ah_attr.dlid == l,
        })
    });
    let selected = hit && in_static_list((*qp).qp_num);
    change_dest_set(|set| {
        if !selected {
            set.remove(qp as usize);
        } else if !set.insert(qp as usize) {
            crate::sys::say::warn_once!(
                "IBJITTER_DEST: too many selected QPs; later ones are not delayed",
            );
        }
    });
}

/// Before `ibv_destroy_qp`: its number may come back for another QP.
///
/// # Safety
/// `qp` null or a live QP.
pub unsafe fn qp_destroyed(qp: *mut ibv_qp) {
    if BY_DEST.load(Acquire) && !qp.is_null() {
        change_dest_set(|set| set.remove(qp as usize));
    }
}

/// fork() child: a thread of the parent's that was changing the set is not in the child.
pub fn after_fork_child() {
    SET_CHANGING.release_in_child();
}

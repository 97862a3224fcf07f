//! Completion-side delay for the extended poll API: CQs made by `ibv_create_cq_ex` (through
//! `verbs_context.create_cq_ex`, patched with the context) are polled with `ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll` and read with `ibv_wc_read_*`, all calls through the CQ's
//! own pointers. The shim swaps them for its own: `start_poll` takes what the provider has
//! (provider polls of one completion each: start, read, end), capturing every field the
//! provider can read into the CQ's ring with a due time; then it and `next_poll` present the ring's due head
//! (`status`, `wr_id` and the read calls answer from it), and `end_poll` releases the CQ.
//! Order, try-lock and completion-channel rules are [`crate::modes::cq`]'s.
//!
//! In line mode (`IBJITTER_MODE=line`) every `start_poll` first hands over what the delay
//! line has due, as `ibv_poll_cq` does: with completion-side delay off, only `start_poll` is
//! swapped, for one that flushes and calls the provider's.
use crate::abi::verbs::*;
use crate::modes::cq;
use crate::modes::hold::{HoldRing, PollFlag};
use crate::modes::line;
use crate::sys::addr_table;
use std::ffi::{c_int, c_uint};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// Completions taken from the provider per `start_poll`.
const BATCH: usize = 32;

type StartPollFn = unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int;
type EndPollFn = unsafe extern "C" fn(*mut ibv_cq_ex);
type ReadTmFn = unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info);

/// For each `ibv_wc_read_*` pointer of `ibv_cq_ex`: the captured field, the original, and
/// our reader.
macro_rules! reads {
    ($($f:ident: $t:ty),* $(,)?) => {
        /// One captured completion.
        #[derive(Clone, Copy)]
        struct Fields {
            status: ibv_wc_status,
            wr_id: u64,
            tm: ibv_wc_tm_info,
            $($f: $t,)*
        }

        /// The provider's pointers of one CQ.
        #[derive(Clone, Copy)]
        struct Originals {
            start_poll: Option<StartPollFn>,
            end_poll: Option<EndPollFn>,
            read_tm_info: Option<ReadTmFn>,
            $($f: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> $t>,)*
        }

        /// Reads the provider's current completion through its own calls.
        unsafe fn capture(cq: *mut ibv_cq_ex, o: &Originals) -> Fields {
            let mut tm = ibv_wc_tm_info { tag: 0, priv_: 0 };
            if let Some(g) = o.read_tm_info {
                g(cq, &mut tm);
            }
            Fields {
                status: (*cq).status,
                wr_id: (*cq).wr_id,
                tm,
                $($f: match o.$f { Some(g) => g(cq), None => Default::default() },)*
            }
        }

        /// Our readers: the presented completion's fields.
        mod readers {
            use super::*;
            $(
                pub unsafe extern "C" fn $f(cq: *mut ibv_cq_ex) -> $t {
                    current(cq).map_or(Default::default(), |c| c.$f)
                }
            )*
            pub unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, out: *mut ibv_wc_tm_info) {
                if let Some(c) = current(cq) {
                    *out = c.tm;
                }
            }
        }

        /// Records the CQ's pointers and points them at ours (those the provider has).
        unsafe fn swap_pointers(cq: *mut ibv_cq_ex) -> Originals {
            let o = Originals {
                start_poll: (*cq).start_poll,
                end_poll: (*cq).end_poll,
                read_tm_info: (*cq).read_tm_info,
                $($f: (*cq).$f,)*
            };
            (*cq).start_poll = Some(start_poll);
            (*cq).next_poll = Some(next_poll);
            (*cq).end_poll = Some(end_poll);
            if o.read_tm_info.is_some() {
                (*cq).read_tm_info = Some(readers::read_tm_info);
            }
            $(
                if o.$f.is_some() {
                    (*cq).$f = Some(readers::$f);
                }
            )*
            o
        }
    };
}

reads! {
    read_opcode: ibv_wc_opcode,
    read_vendor_err: u32,
    read_byte_len: u32,
    read_imm_data: __be32,
    read_qp_num: u32,
    read_src_qp: u32,
    read_wc_flags: c_uint,
    read_slid: u32,
    read_sl: u8,
    read_dlid_path_bits: u8,
    read_completion_ts: u64,
    read_cvlan: u16,
    read_flow_tag: u32,
    read_completion_wallclock_ns: u64,
}

/// One extended CQ: its provider's pointers and its ring.
struct ExCq {
    orig: Originals,
    /// A completion is presented (between a successful start/next poll and the next call).
    presented: bool,
    ring: HoldRing<Fields>,
}

struct Entry {
    key: AtomicUsize,
    polling: PollFlag,
    cq: AtomicPtr<ExCq>,
    /// Line mode without completion-side delay: the provider's `start_poll` (an address).
    flush_only: AtomicUsize,
}

const SLOTS: usize = 1024;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    key: AtomicUsize::new(0),
    polling: PollFlag::new(),
    cq: AtomicPtr::new(null_mut()),
    flush_only: AtomicUsize::new(0),
};
static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];

/// Probes of the table before a CQ is taken as absent (or the table as full).
const PROBES: usize = 256;

fn find(key: usize) -> Option<&'static Entry> {
    addr_table::find(&TABLE, key, PROBES, |e| &e.key)
}

/// The completion presented on `cq` now.
unsafe fn current(cq: *mut ibv_cq_ex) -> Option<Fields> {
    let e = find(cq as usize)?;
    let x = e.cq.load(Acquire).as_ref()?;
    if !x.presented {
        return None;
    }
    x.ring.due_head(u64::MAX).copied()
}

/// After the provider's `create_cq_ex`: ring and pointer swap (off any data path).
///
/// # Safety
/// `cq` null or a CQ just created, not yet polled.
pub unsafe fn created(cq: *mut ibv_cq_ex) {
    if cq.is_null() {
        return;
    }
    if !crate::state::cq_delay() {
        if crate::state::line_mode() {
            flush_before_start_poll(cq);
        }
        return;
    }
    let key = cq as usize;
    let Some(slot) = addr_table::claim(&TABLE, key, PROBES, |e| &e.key) else {
        crate::sys::say::warn_once!(
            "IBJITTER_CQ_TABLE: too many extended CQs; later ones are not delayed",
        );
        return;
    };
    // SAFETY: all-zero is a valid Fields (integers only).
    let Some(ring) = HoldRing::try_new(std::mem::zeroed()) else {
        // Under an address-space limit: this CQ passes undelayed (its pointers unswapped).
        slot.key.store(addr_table::REMOVED, Release);
        // Once (as for plain CQs): a program making CQs under the limit got a line each.
        crate::sys::say::warn_once!(
            "IBJITTER_CQ_TABLE: cannot allocate an extended CQ's holding ring (address space \
             limit?): completions of such CQs pass undelayed",
        );
        return;
    };
    let x = Box::new(ExCq {
        orig: swap_pointers(cq),
        presented: false,
        ring,
    });
    slot.cq.store(Box::into_raw(x), Release);
}

/// Line mode, completion-side delay off: `start_poll` flushes the line, then is the
/// provider's.
unsafe fn flush_before_start_poll(cq: *mut ibv_cq_ex) {
    let Some(orig) = (*cq).start_poll else { return };
    let Some(slot) = addr_table::claim(&TABLE, cq as usize, PROBES, |e| &e.key) else {
        crate::sys::say::warn_once!(
            "IBJITTER_MODE=line: too many extended CQs; ibv_start_poll on later ones does not \
             hand over the delay line (the timer thread does)",
        );
        return;
    };
    slot.flush_only.store(orig as usize, Release);
    (*cq).start_poll = Some(start_poll_flushing);
}

unsafe extern "C" fn start_poll_flushing(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    line::flush_if_due();
    match find(cq as usize).map(|e| e.flush_only.load(Acquire)) {
        // SAFETY: the address was the CQ's own start_poll, stored when it was swapped.
        Some(f) if f != 0 => std::mem::transmute::<usize, StartPollFn>(f)(cq, attr),
        _ => libc::ENOENT,
    }
}

/// An extended CQ's ring and line hook set aside while the provider destroys the CQ.
pub struct Parked {
    entry: &'static Entry,
    cq: *mut ExCq,
    flush_only: usize,
}

/// Before `ibv_destroy_cq`: the ring and the line hook are set aside (a CQ created at its
/// address once the provider freed it finds neither).
///
/// # Safety
/// `cq` null or a CQ about to be destroyed.
pub unsafe fn park_for_destroy(cq: *mut ibv_cq) -> Option<Parked> {
    let entry = find(cq as usize)?;
    Some(Parked {
        entry,
        cq: entry.cq.swap(null_mut(), AcqRel),
        flush_only: entry.flush_only.swap(0, AcqRel),
    })
}

/// After the provider's `destroy_cq`: destroyed, the ring goes and the entry is free;
/// refused (EBUSY), the CQ keeps them: its poll pointers still lead here, and without its
/// ring every `ibv_start_poll` would answer ENOENT for ever.
///
/// # Safety
/// `p` from [`park_for_destroy`] of the CQ the provider was asked to destroy.
pub unsafe fn after_destroy(p: Option<Parked>, destroyed: bool) {
    let Some(p) = p else { return };
    if destroyed {
        p.entry.key.store(addr_table::REMOVED, Release);
        if !p.cq.is_null() {
            drop(Box::from_raw(p.cq));
        }
    } else {
        p.entry.flush_only.store(p.flush_only, Release);
        p.entry.cq.store(p.cq, Release);
    }
}

/// Presents the ring's head if it is due (sets `status` and `wr_id` as a provider does).
unsafe fn present(cq: *mut ibv_cq_ex, x: &mut ExCq) -> c_int {
    if let Some(&f) = x.ring.due_head(cq::now_units()) {
        (*cq).status = f.status;
        (*cq).wr_id = f.wr_id;
        x.presented = true;
        0
    } else {
        x.presented = false;
        libc::ENOENT
    }
}

/// Consumes the presented completion (counted as handed over).
fn consume(x: &mut ExCq) {
    if x.presented {
        if let Some((_, ns)) = x.ring.pop() {
            cq::handed_over(ns);
        }
    }
    x.presented = false;
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    line::flush_if_due();
    let Some(e) = find(cq as usize) else {
        return libc::ENOENT;
    };
    let Some(polling) = e.polling.try_take() else {
        return libc::ENOENT;
    };
    let Some(x) = e.cq.load(Acquire).as_mut() else {
        return libc::ENOENT;
    };
    if let Err(rc) = take(cq, x, attr) {
        return rc;
    }
    // An event-driven program would sleep on what is held: wait for the head instead.
    if !(*cq).channel.is_null() {
        x.ring.wait_for_head();
    }
    let rc = present(cq, x);
    if rc == 0 {
        // The program's end_poll releases it (none follows a start_poll that found nothing).
        polling.keep();
    }
    rc
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    let Some(x) = find(cq as usize).and_then(|e| e.cq.load(Acquire).as_mut()) else {
        return libc::ENOENT;
    };
    consume(x);
    // As in start_poll: an event-driven program would sleep on what is held, and polls to
    // ENOENT before it arms and sleeps: ENOENT only with nothing held and the provider's CQ
    // empty (its next event comes only for completions after the arming).
    if !(*cq).channel.is_null() {
        if x.ring.is_empty() {
            // SAFETY: all-zero is a valid ibv_poll_cq_attr (comp_mask 0, as required).
            let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
            let _ = take(cq, x, &mut attr);
        }
        x.ring.wait_for_head();
    }
    present(cq, x)
}

/// Takes what the provider has into the ring, as far as it has room (at most [`BATCH`]):
/// one completion per provider poll (start, read, end). Not start/next.../end: rxe's
/// next_poll releases the CQ when it finds it empty and its end_poll then advances past the
/// producer, so a loop to ENOENT corrupts its queue; start+end with one completion is right
/// on every provider. Err: the provider's error, with nothing taken and the ring empty.
///
/// # Safety
/// `cq` is `x`'s CQ, polled by this thread alone (its poll flag held).
unsafe fn take(cq: *mut ibv_cq_ex, x: &mut ExCq, attr: *mut ibv_poll_cq_attr) -> Result<(), c_int> {
    let o = x.orig;
    let (Some(sp), Some(ep)) = (o.start_poll, o.end_poll) else {
        return Err(libc::ENOENT);
    };
    let now = cq::now_units();
    for _ in 0..BATCH {
        if x.ring.room() == 0 {
            break;
        }
        let rc = sp(cq, attr);
        if rc == libc::ENOENT {
            break;
        }
        if rc != 0 {
            if x.ring.is_empty() {
                return Err(rc);
            }
            break;
        }
        let (units, ns) = cq::draw();
        x.ring.push(capture(cq, &o), now, units, ns);
        ep(cq);
    }
    Ok(())
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    let Some(e) = find(cq as usize) else { return };
    if let Some(x) = e.cq.load(Acquire).as_mut() {
        consume(x);
    }
    e.polling.release();
}

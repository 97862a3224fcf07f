//! Live control (`ibjitter inject status|set|pause|resume`): this process's segment
//! ([`ibjitter_control`]), created when it first opens a device or sends through UCP, and the
//! thread that serves it: every few milliseconds it looks for a request and applies it (a new
//! table, pause, resume), then answers with the counts. The post path never sees any of it:
//! it reads the same mode and table atomics as always. `IBJITTER_CONTROL=0` turns it off.
//!
//! A forked child has no control thread (threads do not survive fork): it keeps the mode it
//! was forked with, and never removes its parent's file.
use crate::runtime::live;
use crate::state;
use crate::sys::{clock, say};
use ibjitter_control::{self as ctl, Command, Mapping, Segment};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::OnceLock;

static PATH: OnceLock<PathBuf> = OnceLock::new();
/// The process that created the file (a fork child must not remove it).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Creates the segment and starts its thread, once per process.
pub fn arm() {
    static ARMED: AtomicBool = AtomicBool::new(false);
    if !state::controlled() || ARMED.swap(true, AcqRel) {
        return;
    }
    let pid = std::process::id();
    match ctl::create(pid) {
        Ok((m, path)) => {
            OWNER.store(pid, Release);
            let _ = PATH.set(path);
            let _ = std::thread::Builder::new()
                .name("ibjitter-control".into())
                .spawn(move || serve(m));
        }
        Err(e) => say::warn_once(&format!(
            "live control unavailable ({}: {e}): `ibjitter inject` cannot reach this process",
            ctl::path(pid).display()
        )),
    }
}

fn serve(m: Mapping) {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(ctl::POLL_MS));
        let request = m.request.load(Acquire);
        if request != m.done.load(Acquire) {
            answer(&m);
            m.done.store(request, Release);
        }
    }
}

/// Applies the pending request and writes the answer.
fn answer(m: &Segment) {
    let result = match Command::from_u32(m.command.load(Acquire)) {
        Some(Command::Status) => Ok(live::table_now()),
        Some(Command::Pause) => {
            state::set_paused(true);
            Ok(live::table_now())
        }
        Some(Command::Resume) => {
            state::set_paused(false);
            Ok(live::table_now())
        }
        Some(Command::Set) => live::apply_live_set(&Segment::get(&m.text)),
        None => Err("unknown request (is ibjitter newer than this libibjitter.so?)".into()),
    };
    m.applied_ns.store(clock::monotonic_ns(), Relaxed);
    let (posts, delayed, sum_ns) = live::live_counts();
    m.posts.store(posts, Relaxed);
    m.delayed.store(delayed, Relaxed);
    m.sum_ns.store(sum_ns, Relaxed);
    let mut state = 0;
    if state::injecting() {
        state |= ctl::STATE_INJECTING;
    }
    if state::paused() {
        state |= ctl::STATE_PAUSED;
    }
    m.state.store(state, Relaxed);
    match result {
        Ok(text) => {
            Segment::put(&m.answer, &text);
            m.result.store(0, Release);
        }
        Err(e) => {
            Segment::put(&m.answer, &e);
            m.result.store(1, Release);
        }
    }
}

/// At exit: the file goes with the process that made it.
pub fn remove_file() {
    if OWNER.load(Acquire) == std::process::id() {
        if let Some(p) = PATH.get() {
            let _ = std::fs::remove_file(p);
        }
    }
}

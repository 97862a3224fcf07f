//! Live control (`ibjitter inject status|set|pause|resume`): this process's segment
//! ([`ibjitter_control`]), created when it first opens a device or sends through UCP, and the
//! thread that serves it: woken by `ibjitter inject` (or once a second) it stamps its
//! heartbeat, looks for a request and applies it (a new table, pause, resume), then answers
//! with the counts. A file that
//! cannot be made (a full `/dev/shm`) is one warning and no live control. The post path
//! never sees any of it: it reads the same mode and table atomics as always. `IBJITTER_CONTROL=0` turns it off.
//!
//! A forked child has no control thread (threads do not survive fork): it keeps the mode it
//! was forked with, and never removes its parent's file.
use crate::runtime::live;
use crate::state;
use crate::sys::{clock, say, threads};
use ibjitter_control::{self as ctl, Command, Reply, Request, Server};
use std::path::PathBuf;
use std::sync::OnceLock;

static PATH: OnceLock<PathBuf> = OnceLock::new();

/// Creates the segment and starts its thread (at the process's first use, which runs once).
pub fn arm() {
    if !state::controlled() {
        return;
    }
    let pid = std::process::id();
    // Reserving the segment's blocks past `ulimit -f` raises SIGXFSZ, whose default action
    // would end the program at its device open: held off, the creation fails instead.
    let made = create_without_sigxfsz(pid);
    match made {
        Ok((server, path)) => {
            if let Some(why) = server.no_wake() {
                // Live control works, but costs a busy node what the FIFO saves.
                say::warn(&format!(
                    "live control: no wake FIFO ({why}); its thread looks every {} ms instead \
                     of sleeping until asked",
                    ctl::POLL_MS
                ));
            }
            let lost = format!(
                "live control unavailable (`ibjitter inject` cannot reach this process; {} \
                 removed)",
                path.display()
            );
            let served = path.clone();
            if threads::spawn_or_say("ibjitter-control", &lost, move || serve(server, &served)) {
                let _ = PATH.set(path);
            } else {
                ctl::remove_path(&path);
            }
        }
        // arm() runs once: a plain warning.
        Err(e) => say::warn(&format!(
            "live control unavailable ({}: {e}): `ibjitter inject` cannot reach this process",
            ctl::path(pid).display()
        )),
    }
}

/// Files of processes gone (killed, cancelled, `_exit`ed) that one process start removes at
/// most: a bounded cost, and each start thins what is left.
const STALE_SWEPT: usize = 64;

fn create_without_sigxfsz(pid: u32) -> std::io::Result<(Server, PathBuf)> {
    crate::sys::quiet::without(libc::SIGXFSZ, |raised| {
        let r = ctl::create(pid);
        *raised = r.is_err();
        r
    })
}

fn serve(server: Server, path: &std::path::Path) {
    // On this thread, not the program's: its device open does not wait for it.
    ctl::remove_stale(STALE_SWEPT);
    // A same-user process may truncate or overwrite the file: the server reads and writes it
    // by offset (never through a mapping, which would fault), ignores it until it is whole
    // again, and says so once.
    let mut warned = false;
    let mut said_poll = false;
    loop {
        // Until `ibjitter inject` wakes it, or a second passes (its heartbeat).
        match server.wait() {
            Ok(None) => {}
            Ok(Some(why)) => {
                if !std::mem::replace(&mut said_poll, true) {
                    say::warn(&format!("live control: {why}"));
                }
            }
            Err(why) => {
                say::warn(&format!(
                    "live control stops: {why}; `ibjitter inject` cannot reach this process \
                     ({} removed)",
                    path.display()
                ));
                ctl::remove_path(path);
                return;
            }
        }
        if stops_as_lost(&server, path) {
            return;
        }
        match server.poll() {
            Ok(Some(req)) => {
                let reply = answer(&req);
                if let Err(e) = server.answer(&req, &reply) {
                    if stops_as_lost(&server, path) {
                        return;
                    }
                    warn_once(&mut warned, &format!("the answer cannot be written: {e}"));
                }
            }
            Ok(None) => {}
            Err(_) if stops_as_lost(&server, path) => return,
            Err(e) => warn_once(&mut warned, &e),
        }
    }
}

/// Whether the program closed or reused one of the server's descriptors: then said once,
/// the files removed, and the server is to stop (its numbers are the program's now, or
/// nothing: never used or closed again).
fn stops_as_lost(server: &Server, path: &std::path::Path) -> bool {
    let Some(taken) = server.lost() else {
        return false;
    };
    say::warn(&format!(
        "live control stops: the program closed or reused the shim's {taken}; `ibjitter \
         inject` cannot reach this process ({} removed)",
        path.display()
    ));
    ctl::remove_path(path);
    true
}

fn warn_once(warned: &mut bool, e: &str) {
    if !std::mem::replace(warned, true) {
        say::warn(&format!(
            "live control: {e} ({}); requests are ignored until it is whole again",
            PATH.get()
                .map_or_else(String::new, |p| p.display().to_string())
        ));
    }
}

/// Applies the request and says what to answer.
fn answer(req: &Request) -> Reply {
    let result = match (req.command, &req.text) {
        (Ok(Command::Status), _) => Ok(live::table_now()),
        (Ok(Command::Pause), _) => {
            state::set_paused(true);
            Ok(live::table_now())
        }
        (Ok(Command::Resume), _) => {
            state::set_paused(false);
            Ok(live::table_now())
        }
        (Ok(Command::Set), Some(text)) => live::apply_live_set(text),
        (Ok(Command::Set), None) => Err(format!(
            "the request's settings have no terminator (longer than {} bytes?): not applied",
            ctl::TEXT - 1
        )),
        (Err(_), _) => Err("unknown request (is ibjitter newer than this libibjitter.so?)".into()),
    };
    let applied_ns = clock::monotonic_ns();
    let (posts, delayed, sum_ns) = live::live_counts();
    let mut bits = 0;
    if state::injecting() {
        bits |= ctl::STATE_INJECTING;
    }
    if state::paused() {
        bits |= ctl::STATE_PAUSED;
    }
    let (ok, text) = match result {
        Ok(t) => (true, t),
        Err(e) => (false, e),
    };
    Reply {
        ok,
        text,
        state: bits,
        posts,
        delayed,
        sum_ns,
        applied_ns,
    }
}

/// At exit: the file and its wake FIFO go with the process that made them (not a fork or
/// `vfork` child).
pub fn remove_file() {
    if state::owns_threads() {
        if let Some(p) = PATH.get() {
            ctl::remove_path(p);
        }
    }
}

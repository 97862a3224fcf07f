//! The stats file when SIGINT, SIGTERM or SIGHUP ends the process, or may end it (Ctrl-C, `mpirun`
//! or Slurm stopping a job), where no destructor runs. [`prepare`] (at load, at each live `set`)
//! readies what the handler needs; [`install_handlers`] installs it when the process first uses
//! verbs or UCP, not at load: a program then sets its handlers up as without the shim (CPython
//! installs its SIGINT handler, `KeyboardInterrupt`, only over the default action), and a process
//! that never uses verbs (a shell, a launcher) never gets ours. The handler writes the file with
//! async-signal-safe calls only (open, fstat, ftruncate, write, close: no allocation, no lock),
//! into a regular file of the process's own user (never through a link, never blocking:
//! [`out_file`]), then does what the signal did before: the handler the program had at that first
//! use, or the default action (the process still dies of the signal, even in a sandbox it
//! entered since: [`end_by_default`]). Chained to the program's
//! handler, ours has that handler's flags and mask (SA_RESTART or not, SA_ONSTACK, SA_NODEFER,
//! SA_RESETHAND): the program's interrupted calls and nested signals behave as without the shim. A
//! signal the program ignores stays ignored, and a handler the program installs later replaces
//! ours, flags and all (its exit() then writes the full file).
//!
//! Only the default action surely ends the process: that signal's file is the last. Before
//! the program's own handler the file is written too (a handler that calls `_exit` leaves
//! it), but the process may go on: then what ends it later (its exit, another signal)
//! writes the file again, with the counts and tables of then.
//!
//! The document has the exit-time file's counters and exact percentiles (walking the table in
//! sorted order with its hit counts); only HdrHistogram's bucket list is left out.
use crate::config::Unit;
use crate::draw::counts::{self, Hook};
use crate::report::stats::Drawn;
use crate::sys::out_file;
use ibjitter_table::ENTRIES;
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};

const SIGNALS: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// The thread (id) whose handler sent each signal again for its default action
/// ([`end_by_default`]), 0 before.
static ENDING: [AtomicI32; 3] = [const { AtomicI32::new(0) }; 3];
/// The thread (id) whose handler took the first signal that ends the process, 0 before one:
/// a handler for an ending signal on another thread waits for that one to end the process
/// ([`wait_for_the_first_end`]).
static ENDER: AtomicI32 = AtomicI32::new(0);

/// What the handler reads, prepared at load and at live sets (the path again in a forked
/// child).
static PATH: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
/// How the handler prices the hits: the table in force and what earlier tables' draws added
/// up to. Two slots, filled in turn ([`publish`]): one is published for the handler, the
/// other is the next to fill; an Epoch a handler may read is never freed.
static EPOCH_SLOTS: [AtomicPtr<Epoch>; 2] = [
    AtomicPtr::new(std::ptr::null_mut()),
    AtomicPtr::new(std::ptr::null_mut()),
];
static PUBLISHED: AtomicPtr<Epoch> = AtomicPtr::new(std::ptr::null_mut());

struct Epoch {
    /// The table in its unit (ENTRIES values, or two tables' with episodes); empty when not
    /// injecting.
    table: Vec<u64>,
    /// Table indices sorted by value, for exact percentiles.
    order: Vec<u16>,
    /// The hits at the last live set (empty before one): the table in force prices those
    /// since; earlier draws are in `carried`.
    base_hits: Vec<u64>,
    carried: Drawn,
}

static SEED: AtomicU64 = AtomicU64::new(0);
static UNIT_LOOPS: AtomicBool = AtomicBool::new(false);
static ARMED: AtomicBool = AtomicBool::new(false);
/// Set by a signal whose default action ends the process: its file is the last one.
static FINAL: AtomicBool = AtomicBool::new(false);
/// The thread (id) whose handler writes the file now, 0 when none: one writer at a time (the
/// output buffer, the published Epoch), without a lock.
static WRITER: AtomicI32 = AtomicI32::new(0);
/// A signal found the path unfit to write (see [`out_file`]) and said so.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// The actions the signals had before ours.
struct Previous(UnsafeCell<[libc::sigaction; 3]>);
// SAFETY: written only in `install_handlers`, before the handlers that read it are installed.
unsafe impl Sync for Previous {}
// SAFETY: an all-zero sigaction is SIG_DFL with no flags.
static PREVIOUS: Previous = Previous(UnsafeCell::new(unsafe { std::mem::zeroed() }));
/// Our actions as installed (the handler puts one back: [`keep_ours`]); written like
/// PREVIOUS.
static OURS: Previous = Previous(UnsafeCell::new(unsafe { std::mem::zeroed() }));

/// Prepares the signal-time file at `path` (the handlers come at first use:
/// [`install_handlers`]). `table`: the delays in `unit`, if injecting.
pub fn prepare(path: &str, table: Option<&[u64]>, unit: Unit, seed: u64) {
    prepare_after_set(path, table, unit, seed, Drawn::default(), &[]);
}

/// [`prepare`] at a live set: `carried` is what the earlier tables' draws added up to,
/// `base_hits` the hits when the last of them was replaced (the runtime's own record).
pub fn prepare_after_set(
    path: &str,
    table: Option<&[u64]>,
    unit: Unit,
    seed: u64,
    carried: Drawn,
    base_hits: &[u64],
) {
    set_path(path);
    let table = table.filter(|t| t.len() == ENTRIES || t.len() == counts::INDICES);
    let table = table.unwrap_or(&[]);
    let mut order: Vec<u16> = (0..table.len() as u16).collect();
    order.sort_by_key(|&i| table[usize::from(i)]);
    publish(Epoch {
        table: table.to_vec(),
        order,
        base_hits: base_hits.to_vec(),
        carried,
    });
    SEED.store(seed, Relaxed);
    UNIT_LOOPS.store(unit == Unit::Loops, Relaxed);
}

/// Makes `e` what the handler reads. Callers are serialized (load, then live sets under the
/// settings' lock). The slot overwritten is never one a running handler reads: a handler
/// takes the published one after it sets `WRITER`, and holds `WRITER` while it reads, so the
/// unpublished slot is free if `WRITER` is clear (SeqCst orders the two). While a handler
/// writes (or if one was abandoned by a `longjmp` out of a program's handler that interrupted
/// it) the slot may be the one it took before the last publish: a new Epoch is made instead
/// and the old one leaked. Publishing never waits for a handler.
fn publish(e: Epoch) {
    if FINAL.load(SeqCst) {
        // The process is dying of a signal.
        return;
    }
    let published = PUBLISHED.load(SeqCst);
    let k = usize::from(EPOCH_SLOTS[0].load(Relaxed) == published);
    let slot = EPOCH_SLOTS[k].load(Relaxed);
    let p = if slot.is_null() || WRITER.load(SeqCst) != 0 {
        let p = Box::into_raw(Box::new(e));
        EPOCH_SLOTS[k].store(p, Relaxed);
        p
    } else {
        // SAFETY: a leaked Epoch, not published, and no handler reads it (see above).
        unsafe { *slot = e };
        slot
    };
    PUBLISHED.store(p, SeqCst);
}

/// Installs the handlers, if stats were asked for ([`prepare`]): once per process, at its
/// first use of verbs or UCP, over the handlers the program has then (never over a signal it
/// ignores).
pub fn install_handlers() {
    if PATH.load(Acquire).is_null() || ARMED.swap(true, AcqRel) {
        return;
    }
    // SAFETY: plain sigaction calls; PREVIOUS is filled before our handler can run.
    unsafe {
        let prev = &mut *PREVIOUS.0.get();
        for (k, &sig) in SIGNALS.iter().enumerate() {
            if libc::sigaction(sig, std::ptr::null(), &mut prev[k]) != 0
                || prev[k].sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut ours: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_signal;
            ours.sa_sigaction = handler as *const () as usize;
            if prev[k].sa_sigaction == libc::SIG_DFL {
                // Ours alone, then the process dies: on the alternate stack if the thread
                // has one (a small thread stack, a goroutine's), which it fits. SA_RESETHAND:
                // the kernel puts the default action back as it delivers the signal, so the
                // handler needs no system call of its own to die of it ([`end_by_default`]),
                // and none that a program that sandboxed itself since (seccomp) may refuse.
                ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
                libc::sigemptyset(&mut ours.sa_mask);
            } else {
                // The program's handler runs inside ours: with its own flags and mask, so
                // that its interrupted calls restart or fail with EINTR as without the shim
                // (CPython's Ctrl-C in a blocking read needs EINTR: no SA_RESTART), on the
                // stack it chose, with the signals it blocks blocked.
                let keep =
                    libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND;
                ours.sa_flags = libc::SA_SIGINFO | (prev[k].sa_flags & keep);
                ours.sa_mask = prev[k].sa_mask;
            }
            (*OURS.0.get())[k] = ours;
            libc::sigaction(sig, &ours, std::ptr::null_mut());
        }
    }
}

/// A fork child: its own file (`path`), and no write in progress or final (the parent's
/// thread that may have been writing at the fork does not exist here).
pub fn after_fork_child(path: &str) {
    WRITER.store(0, Release);
    ENDER.store(0, Release);
    FINAL.store(false, Release);
    set_path(path);
}

/// The file the handler writes (a forked child gets its own name: [`after_fork_child`]).
pub fn set_path(path: &str) {
    if let Ok(c) = CString::new(path) {
        // The old string is leaked: a handler may be reading it.
        PATH.store(c.into_raw(), Release);
    }
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: errno is thread-local; restored before returning to the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    let Some(k) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    // SAFETY: PREVIOUS was filled in `install_handlers`, before this handler was installed.
    let prev = unsafe { &(*PREVIOUS.0.get())[k] };
    if prev.sa_sigaction == libc::SIG_DFL && called_by_a_later_handler(sig) {
        // Ours stands for the default action, which is no function: without the shim the
        // program's handler would have had nothing to call, and would have gone on (a
        // graceful shutdown: signal-hook, tokio's ctrl_c). The stats as they are (its exit
        // writes them again), and the program's handler decides.
        if crate::state::in_use() {
            write_at_signal(sig, false);
        }
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    if prev.sa_sigaction == libc::SIG_DFL {
        // SAFETY: from our handler of SIGNALS[k], installed over the default action.
        unsafe { keep_ours(k) };
        // SAFETY: gettid has no preconditions (a system call: async-signal-safe).
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        match ENDER.compare_exchange(0, me, SeqCst, SeqCst) {
            // Not if this thread was writing the file when the signal came (a caught
            // signal's): the other ender waits for that write, which only this handler can
            // finish (it takes the write over below).
            Err(first) if first != me && WRITER.load(SeqCst) != me => wait_for_the_first_end(),
            _ => {}
        }
        if ENDING[k].swap(me, AcqRel) == me {
            // Here again on this thread after `end_by_default` sent the signal anew: a
            // handler the program installed since, which chains to ours, had it delivered
            // to itself, and the default action could not be put back (a sandbox refusing
            // `rt_sigaction`). Ended as by the signal, without a second stats file.
            // SAFETY: the raw exit_group: no exit handler runs, as at a signal.
            unsafe { libc::syscall(libc::SYS_exit_group, 128 + sig) };
        }
    }
    if crate::state::in_use() {
        // The three signals' default action ends the process; a program's handler may not.
        let ends = prev.sa_sigaction == libc::SIG_DFL;
        write_at_signal(sig, ends);
        if ends {
            // No drain at a signal: what the line still holds is lost, and said (as `_exit`).
            crate::modes::line::say_lost_at_end(signal_name(sig));
        }
    }
    // SAFETY: the calls are async-signal-safe; `prev` is a valid action.
    unsafe {
        match prev.sa_sigaction {
            libc::SIG_DFL => end_by_default(sig),
            libc::SIG_IGN => {}
            h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
                let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                    std::mem::transmute(h);
                f(sig, info, uctx);
            }
            h => {
                let f: extern "C" fn(c_int) = std::mem::transmute(h);
                f(sig);
            }
        }
        *libc::__errno_location() = errno;
    }
}

/// Whether a handler the program installed over ours called ours (as libraries that chain
/// handlers do: signal-hook calls the action it replaced if that is a function), rather than
/// the kernel delivering `sig` to ours: the action in place is neither ours nor the default
/// (SA_RESETHAND puts that back as the kernel delivers to ours). Unknown (false) when the
/// action cannot be read (a sandbox refusing `rt_sigaction`).
fn called_by_a_later_handler(sig: c_int) -> bool {
    let ours: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_signal;
    // SAFETY: reads the action into a zeroed struct (async-signal-safe).
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    let read = unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) } == 0;
    read && now.sa_sigaction != libc::SIG_DFL && now.sa_sigaction != ours as *const () as usize
}

/// Puts our handler of `SIGNALS[k]` back where the kernel reset it to the default action as
/// it delivered the signal (SA_RESETHAND): a second one (Ctrl-C reaching every rank, then the
/// launcher's SIGTERM; Slurm's and the launcher's SIGTERM) goes to another thread while this
/// handler writes the file, and its default action would kill the process mid-write. A
/// program's handler installed since stays. Failure is ignored (a sandbox refusing
/// `rt_sigaction`: the second signal then ends the process as without the shim).
///
/// # Safety
/// From our handler of `SIGNALS[k]`, installed over the default action.
unsafe fn keep_ours(k: usize) {
    let sig = SIGNALS[k];
    let mut now: libc::sigaction = std::mem::zeroed();
    if libc::sigaction(sig, std::ptr::null(), &mut now) == 0 && now.sa_sigaction == libc::SIG_DFL {
        libc::sigaction(sig, &(*OURS.0.get())[k], std::ptr::null_mut());
    }
}

/// In a handler for a signal that ends the process while another thread's handler ends it
/// already (writes the file, then dies of its signal): waits for that, so that this one
/// neither cuts the file short nor writes another as the process dies. Bounded (2 s): that
/// handler may have been abandoned by a `longjmp` out of a program's handler that
/// interrupted it; then this one goes on as the only one.
fn wait_for_the_first_end() {
    for _ in 0..2000 {
        // SAFETY: poll with no descriptors sleeps 1 ms (async-signal-safe); refused (a
        // sandbox), a spin of about as long.
        if unsafe { libc::poll(std::ptr::null_mut(), 0, 1) } < 0 {
            for _ in 0..200_000 {
                std::hint::spin_loop();
            }
        }
    }
}

/// Ends the process by `sig`'s default action, once this handler returns: `sig` is blocked
/// in this thread until then. SA_RESETHAND made its action the default again as the kernel
/// delivered it to our handler; but where the action in place cannot be read (a program
/// that denied itself `rt_sigaction` after its first device open, a seccomp sandbox), a
/// handler the program installed since, which chains to ours, may be the one delivered
/// ([`called_by_a_later_handler`] cannot tell), still in place: the default is put back here
/// too, its failure ignored (relying on `sigaction` alone had this handler re-raise into
/// itself for ever, rewriting the stats; [`ENDING`] ends that case). The signal is sent again to this
/// thread (`tgkill`), else to the process (`kill`; a thread that does not block it, or this
/// one once the handler returns, takes it); if the sandbox refuses both, the process ends
/// with the status a shell gives a death by that signal, 128 + `sig`, by the raw
/// `exit_group` (no exit handler runs, as at a signal). The process never goes on without
/// the signal's effect.
///
/// # Safety
/// From the handler of `sig` installed with SA_RESETHAND over the default action.
unsafe fn end_by_default(sig: c_int) {
    let mut default: libc::sigaction = std::mem::zeroed();
    default.sa_sigaction = libc::SIG_DFL;
    libc::sigaction(sig, &default, std::ptr::null_mut());
    if libc::raise(sig) == 0 || libc::kill(libc::getpid(), sig) == 0 {
        return;
    }
    libc::syscall(libc::SYS_exit_group, 128 + sig);
}

/// Writes the file for `sig`, the last one if `ends` (the default action follows: the
/// process dies at this handler's return). One writer at a time (`WRITER`); never waits where
/// that could deadlock.
fn write_at_signal(sig: c_int, ends: bool) {
    // SAFETY: gettid has no preconditions (a system call: async-signal-safe).
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut held = WRITER.compare_exchange(0, me, SeqCst, SeqCst);
    if ends {
        // Another thread writing (a signal to it at the same moment): its write ends within
        // milliseconds, and this one must be the last. Bounded: that thread may have been
        // abandoned mid-write by a longjmp out of its program's handler.
        let mut waited = 0;
        while matches!(held, Err(t) if t != me) && waited < 200 {
            // SAFETY: poll with no descriptors sleeps 1 ms (async-signal-safe).
            unsafe { libc::poll(std::ptr::null_mut(), 0, 1) };
            waited += 1;
            held = WRITER.compare_exchange(0, me, SeqCst, SeqCst);
        }
        // This thread's own write, interrupted by this signal (or abandoned by a longjmp):
        // it never goes on, as the process dies at this handler's return; this one replaces
        // it.
        if held == Err(me) {
            held = Ok(0);
        }
    }
    if held.is_err() {
        // A caught signal while another writes: that file is as recent.
        return;
    }
    // After an ending signal's file a caught one writes nothing: the process is dying. An
    // ending one writes: it is the latest, and what the process dies of.
    if ends || !FINAL.load(SeqCst) {
        if ends {
            FINAL.store(true, SeqCst);
        }
        // A fork child that did nothing the shim saw has no file of its own (as at exit).
        // Past `ulimit -f` the write fails (EFBIG) instead of SIGXFSZ killing the process.
        if !crate::state::idle_fork_child() {
            crate::sys::quiet::without(libc::SIGXFSZ, |raised| {
                *raised = write_document(sig) == libc::EFBIG;
            });
        }
    }
    WRITER.store(0, SeqCst);
}

/// The handler's output buffer: static, not on the stack, so the handler fits a small
/// alternate signal stack (`sigaltstack` of 2-4 KiB with `SA_ONSTACK`, whose kernel frame
/// takes most of it).
struct OutBuf(UnsafeCell<[u8; 4096]>);
// SAFETY: used only by the thread holding `WRITER` (see `write_at_signal`), by one `Out` at a
// time.
unsafe impl Sync for OutBuf {}
static OUT_BUF: OutBuf = OutBuf(UnsafeCell::new([0; 4096]));

/// A buffered writer to a file descriptor, with integer formatting, allocation-free.
struct Out {
    fd: c_int,
    buf: &'static mut [u8; 4096],
    len: usize,
    /// The errno of the first write that failed (0: none); nothing is written after it.
    failed: c_int,
}

impl Out {
    /// # Safety
    /// Only by the thread holding `WRITER`, and no other `Out` alive.
    unsafe fn new(fd: c_int) -> Out {
        Out {
            fd,
            buf: &mut *OUT_BUF.0.get(),
            len: 0,
            failed: 0,
        }
    }

    fn s(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }

    fn bytes(&mut self, text: &[u8]) {
        for &b in text {
            if self.len == self.buf.len() {
                self.flush();
            }
            self.buf[self.len] = b;
            self.len += 1;
        }
    }

    fn u(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        // SAFETY: ASCII digits.
        self.s(unsafe { std::str::from_utf8_unchecked(&digits[i..]) });
    }

    fn flush(&mut self) {
        if self.failed != 0 {
            self.len = 0;
            return;
        }
        let mut done = 0;
        while done < self.len {
            let n = if self.fd == libc::STDERR_FILENO {
                // Never SIGPIPE: the warning's stderr may be a pipe nobody reads.
                crate::sys::say::write_to_stderr(&[libc::iovec {
                    iov_base: self.buf[done..].as_mut_ptr().cast(),
                    iov_len: self.len - done,
                }])
            } else {
                // SAFETY: writes initialized bytes of our buffer.
                unsafe { libc::write(self.fd, self.buf[done..].as_ptr().cast(), self.len - done) }
            };
            if n <= 0 {
                if self.failed == 0 {
                    // SAFETY: errno is thread-local and always readable.
                    let e = unsafe { *libc::__errno_location() };
                    self.failed = if n == 0 || e == 0 { libc::EIO } else { e };
                }
                break;
            }
            done += n as usize;
        }
        self.len = 0;
    }
}

fn signal_name(sig: c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "SIGHUP",
    }
}

/// Writes the stats document; returns the errno of a write that failed (0: none).
fn write_document(sig: c_int) -> c_int {
    let path = PATH.load(Acquire);
    if path.is_null() {
        return 0;
    }
    // SAFETY: a NUL-terminated path that is never freed.
    let fd = match unsafe { out_file::open_raw(path) } {
        Ok(fd) => fd,
        Err(why) => {
            refuse(path, why);
            return 0;
        }
    };
    // SAFETY: this thread holds WRITER; no other Out.
    let mut o = unsafe { Out::new(fd) };
    let u = if UNIT_LOOPS.load(Relaxed) {
        "loops"
    } else {
        "ns"
    };
    let name = signal_name(sig);
    // SAFETY: a leaked Epoch that is not written while WRITER is held (`publish`), or null.
    let epoch = unsafe { PUBLISHED.load(SeqCst).as_ref() };
    let counts = counts::signal_safe_counts();
    o.s("{\n  \"pid\": ");
    // SAFETY: getpid is async-signal-safe.
    o.u(unsafe { libc::getpid() } as u64);
    o.s(",\n  \"ended_by\": \"");
    o.s(name);
    o.s("\",\n  \"injecting\": ");
    let injecting = epoch.is_some_and(|e| !e.table.is_empty());
    o.s(if injecting { "true" } else { "false" });
    o.s(",\n  \"unit\": \"");
    o.s(u);
    o.s("\",\n  \"seed\": ");
    o.u(SEED.load(Relaxed));
    o.s(",\n  \"per\": \"");
    o.s(if crate::state::per_wr() { "wr" } else { "post" });
    o.s("\"");
    o.s(",\n  \"layer_used\": \"");
    o.s(crate::state::layer_used(
        counts.posts[Hook::PostSend as usize] + counts.posts[Hook::WrBatch as usize],
        counts.posts[Hook::Ucp as usize],
    ));
    o.s("\"");
    o.s(",\n  \"posts\": { \"post_send\": ");
    o.u(counts.posts[Hook::PostSend as usize]);
    o.s(", \"wr_complete\": ");
    o.u(counts.posts[Hook::WrBatch as usize]);
    o.s(", \"ucp\": ");
    o.u(counts.posts[Hook::Ucp as usize]);
    o.s(" },\n  \"posts_total\": ");
    o.u(counts.posts.iter().sum());
    o.s(",\n  \"threads\": [");
    let mut first = true;
    counts::for_each_thread(|p| {
        o.s(if first { "" } else { ", " });
        first = false;
        o.s("{\"post_send\": ");
        o.u(p[0]);
        o.s(", \"wr_complete\": ");
        o.u(p[1]);
        o.s(", \"ucp\": ");
        o.u(p[2]);
        o.s("}");
    });
    o.s("]");
    if let Some(e) = epoch.filter(|_| injecting) {
        write_delays(&mut o, u, e);
    }
    if crate::state::line_mode() {
        // What the line held at the signal: handed over only if the process goes on (their
        // draws are in delays_injected: the line cannot be taken here to count them out).
        use crate::modes::line;
        o.s(",\n  \"line\": { \"in_line_at_signal\": ");
        o.u(line::own_requests());
        o.s(", \"dropped\": ");
        o.u(line::dropped());
        o.s(", \"refused\": ");
        o.u(line::refused());
        o.s(" }");
    }
    o.s("\n}\n");
    o.flush();
    let failed = o.failed;
    if failed != 0 {
        // Empty rather than cut short: a reader would take a prefix for a whole document.
        // SAFETY: our descriptor.
        unsafe { libc::ftruncate(fd, 0) };
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    if failed != 0 {
        refuse(path, out_file::Refused::Write(failed));
    }
    failed
}

/// Says on stderr why the file at `path` was not written (one write, async-signal-safe), once
/// per process: a caught signal, then the ending one, find the same path.
fn refuse(path: *const libc::c_char, why: out_file::Refused) {
    if REFUSED.swap(true, Relaxed) {
        return;
    }
    // SAFETY: this thread holds WRITER; no other Out.
    let mut o = unsafe { Out::new(libc::STDERR_FILENO) };
    o.s("ibjitter: warning: cannot write stats file ");
    // SAFETY: a NUL-terminated path that is never freed.
    o.bytes(unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes());
    o.s(" (at a signal): ");
    o.s(why.why());
    if why.errno() != 0 {
        o.s(", errno ");
        o.u(why.errno() as u64);
    }
    o.s("\n");
    o.flush();
}

/// Whether the signal-time writer refused its file (and said so: the exit-time writer, if
/// the process lives on, does not say it again).
pub fn refused() -> bool {
    REFUSED.load(Relaxed)
}

/// draws, delays_injected and sum over every table the process used; index_hits and exact
/// percentiles of the delays drawn from the table in force (as the exit-time file).
fn write_delays(o: &mut Out, u: &str, e: &Epoch) {
    // The hits of index `i` since the last live set.
    let hits = |i: usize| {
        let h = counts::signal_safe_hits(i);
        h - e.base_hits.get(i).copied().unwrap_or(0).min(h)
    };
    let (mut draws, mut injected, mut sum) = (0u64, 0u64, 0u128);
    for (i, &v) in e.table.iter().enumerate() {
        let n = hits(i);
        draws += n;
        injected += if v > 0 { n } else { 0 };
        sum += u128::from(v) * u128::from(n);
    }
    o.s(",\n  \"draws\": ");
    o.u(e.carried.draws + draws);
    o.s(",\n  \"delays_injected\": ");
    o.u(e.carried.injected + injected);
    o.s(",\n  \"sum_");
    o.s(u);
    o.s("\": ");
    o.u((e.carried.sum + sum).min(u128::from(u64::MAX)) as u64);
    let sets = crate::state::epoch();
    if sets > 0 {
        o.s(",\n  \"live_sets\": ");
        o.u(sets);
    }
    o.s(",\n  \"index_hits\": [");
    let mut first = true;
    for i in 0..e.table.len() {
        let n = hits(i);
        if n > 0 {
            o.s(if first { "[" } else { ", [" });
            first = false;
            o.u(i as u64);
            o.s(", ");
            o.u(n);
            o.s("]");
        }
    }
    o.s("]");
    if draws == 0 {
        return;
    }
    o.s(",\n  \"delay_");
    o.s(u);
    o.s("\": { \"count\": ");
    o.u(draws);
    o.s(", \"mean\": ");
    o.u((sum / u128::from(draws)) as u64);
    o.s(", \"percentiles\": {");
    // Walk the table in value order: the q-quantile is the first value whose cumulative
    // count reaches q × draws.
    const QS: [(&str, u64); 13] = [
        ("p0", 0),
        ("p1", 100),
        ("p5", 500),
        ("p10", 1000),
        ("p25", 2500),
        ("p50", 5000),
        ("p75", 7500),
        ("p90", 9000),
        ("p95", 9500),
        ("p99", 9900),
        ("p99.9", 9990),
        ("p99.99", 9999),
        ("p100", 10000),
    ];
    let (mut cum, mut next) = (0u128, 0);
    for &i in &e.order {
        let n = hits(usize::from(i));
        if n == 0 {
            continue;
        }
        cum += u128::from(n);
        // p0 is the smallest value drawn at all (a threshold of one draw).
        while next < QS.len()
            && cum * 10000 >= (u128::from(draws) * u128::from(QS[next].1)).max(10000)
        {
            o.s(if next == 0 { " \"" } else { ", \"" });
            o.s(QS[next].0);
            o.s("\": ");
            o.u(e.table[usize::from(i)]);
            next += 1;
        }
    }
    o.s(" } }");
}

//! The start barrier: the sessions of one group of clients start together. With `hold`, the
//! group is released by whoever launched the server (`incast`'s patterns with several
//! receivers release them all at once): the server says `ready` on stdout and waits for a line
//! on stdin.
use std::io::Write;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a held server prints when its group is ready (the launcher waits for it).
pub const READY_LINE: &str = "ibjitter serve: ready";

/// Releases a group of `size` sessions together.
pub(super) struct StartBarrier {
    size: u32,
    hold: bool,
    state: Mutex<(u64, u32)>, // (generation, waiting)
    cv: Condvar,
}

impl StartBarrier {
    pub(super) fn new(size: u32, hold: bool) -> StartBarrier {
        StartBarrier {
            size: size.max(1),
            hold,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    /// Waits until `size` sessions are ready, or `timeout`: then the sessions that are ready
    /// start without the missing ones (a sender that died must not hold up the others).
    pub(super) fn wait(&self, timeout: Duration) {
        let mut s = self.state.lock().unwrap();
        let generation = s.0;
        s.1 += 1;
        if s.1 == self.size {
            self.release(&mut s, generation, timeout);
            return;
        }
        let deadline = Instant::now() + timeout;
        while s.0 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!(
                    "ibjitter serve: start: only {} of {} clients ready after {timeout:?}; starting without the others",
                    s.1, self.size
                );
                self.release(&mut s, generation, timeout);
                return;
            }
            s = self.cv.wait_timeout(s, left).unwrap().0;
        }
    }

    /// Starts the group (after the launcher's word, with `hold`). The lock is held meanwhile:
    /// every other session of the group is waiting anyway.
    fn release(&self, s: &mut (u64, u32), generation: u64, timeout: Duration) {
        if self.hold {
            hold_until_released(s.1, timeout);
        }
        *s = (generation + 1, 0);
        self.cv.notify_all();
    }
}

/// Says `ready` on stdout and waits for a line on stdin, at most `timeout`; a launcher that
/// never answers (stdin closed, or not forwarded) gets a warning and the group starts.
fn hold_until_released(ready: u32, timeout: Duration) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{READY_LINE}: {ready} client(s) at the start barrier");
    let _ = out.flush();
    drop(out);
    match wait_for_line(timeout) {
        Ok(()) => {}
        Err(why) => {
            eprintln!("ibjitter serve: start: not released by the launcher ({why}); starting now")
        }
    }
}

/// Reads stdin until a newline, polling so that a stop (Ctrl-C) or `timeout` ends the wait.
fn wait_for_line(timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let stop = crate::gen::stop::StopToken::process();
    loop {
        if stop.is_set() {
            return Err("interrupted".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("nothing on stdin after {timeout:?}"));
        }
        let mut fd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(100) as i32;
        // SAFETY: poll(2) on one pollfd we own.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n <= 0 {
            continue;
        }
        let mut buf = [0u8; 64];
        // SAFETY: read(2) into a buffer we own, of its length.
        let got = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        match got {
            0 => return Err("stdin closed".into()),
            n if n < 0 => return Err(std::io::Error::last_os_error().to_string()),
            n if buf[..n as usize].contains(&b'\n') => return Ok(()),
            _ => {}
        }
    }
}

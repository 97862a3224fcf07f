//! The live-control segment: one small file per injected process,
//! `/dev/shm/ibjitter.<uid>/<pid>.<pidns>` ([`path`]), served by `libibjitter.so`
//! ([`Server`]) and sent requests by `ibjitter inject` ([`send`]).
//!
//! Neither side maps the file: both read and write it with `pread`/`pwrite` at the fixed
//! offsets of [`Segment`]. A mapping of a file that someone truncates faults (SIGBUS) on the
//! next touch, and the shim lives in other people's processes: a short read is "no request",
//! never a crash. Requests from concurrent `ibjitter inject` runs are serialized by an `flock`
//! on the file, taken without blocking and retried within the request's timeout.
//!
//! A request: the client writes its fields ([`Segment::command`], the settings text), then
//! bumps [`Segment::request`] and wakes the process's control thread through its FIFO
//! (`<pid>.<pidns>.wake`, [`wake`]); the thread (never on a post path) stamps
//! [`Segment::heartbeat_ns`] at each wake-up, applies the request, writes its answer (result,
//! counts, the state) and then sets [`Segment::done`] to the request's number. Unwoken, the
//! thread sleeps [`IDLE_WAKE_MS`] ms between looks: on a node whose cores are all busy, a
//! thread that woke every 10 ms took 0.7 % of a core (58-75 µs of CPU a wake-up under KVM).
//! Without its FIFO it looks every [`POLL_MS`] ms.
//!
//! Modules: `segment` (the layout), `files` (where segments live, who made them), `server`
//! (the process's side), `client` (`ibjitter inject`'s side), `sweep` (files of processes
//! gone), `clock` (the heartbeat's clock, a sleep that never panics).
#[macro_use]
mod segment;
mod client;
mod clock;
mod files;
mod server;
mod sweep;

pub use client::{open, open_path, send, Answer, Client, OpenError};
pub use clock::{monotonic_ns, nap};
pub use files::{check_dir, dir, path, pid_ns, remove, remove_path, start_time, wake, wake_path};
pub use segment::{
    check_text, Command, Segment, IDLE_WAKE_MS, MAGIC, POLL_MS, SILENT_POLLS, SIZE,
    STATE_INJECTING, STATE_PAUSED, TEXT,
};
pub use server::{create, Reply, Request, Server};
pub use sweep::{listed, remove_if_stale, remove_stale, Listed};

// What the unit tests reach beyond the public items.
#[cfg(test)]
use {
    segment::write,
    server::make_wake_fifo,
    sweep::{entries, parse_name, sweep, sweep_leftover, Kind, Swept},
};
#[cfg(test)]
mod tests;

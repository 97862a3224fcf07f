//! libibjitter.so — the LD_PRELOAD latency injector.
//!
//! `LD_PRELOAD=libibjitter.so APP` delays every send APP posts (each `ibv_post_send` call and
//! each batch of `ibv_wr_*` requests, at `ibv_wr_start`) by a busy-wait drawn from a
//! 4096-entry table, without changing APP.
//!
//! Layers, from the bottom up; no module imports from a layer listed after its own, and no
//! modules import each other, directly or around a circle (`tests/layering.rs` checks both):
//! - [`abi`]: libibverbs' struct layouts and function types, ELF dynamic tables;
//! - [`sys`]: stderr, clocks and busy-waits, per-thread state and PCG streams, address
//!   tables, a fork-safe spin lock and mutex, typed real symbols, libc's own `dlsym`;
//! - [`config`]: the `IBJITTER_*` settings and the selection, parsed;
//! - [`state`]: the one owner of the lifecycle and the mode the wrappers read (start-up,
//!   configured, first use under way or done, the owner of the shim's threads, window,
//!   paused, line, completion delay, live table epoch, forked child, exiting);
//! - [`registry`]: the patched contexts and QPs and their provider originals;
//! - [`draw`]: the table in wait units, the draw, episodes, the trace, the counters;
//! - [`modes`]: selection, the injection window, the delay line, completion-side delay;
//! - [`wrappers`]: the post wrappers and the pointer swaps that install them, the UCP
//!   layer's wait;
//! - [`report`]: the stats document, its signal-time writer, coverage, port counters, the
//!   start-up and exit lines;
//! - [`runtime`]: the settings in force, live `set`s, live control, the lifecycle steps
//!   (load, first use, a context opened, fork, exit);
//! - [`exports`]: the exported symbols (libibverbs', UCP's, `dlsym`, the ends of a process:
//!   `exec*`, `_exit`), which only delegate.
//!
//! This file holds the load (the one constructor) and exit hooks only. The post path
//! ([`wrappers::post::post_send_hook`]) takes no lock, makes no syscall and never allocates.

pub mod abi;
pub mod config;
pub mod draw;
pub mod exports;
pub mod modes;
pub mod registry;
pub mod report;
pub mod runtime;
pub mod state;
pub mod sys;
pub mod wrappers;

use runtime::lifecycle;

extern "C" fn on_load() {
    // A panic must never cross into the host program: on any failure, pass through.
    let _ = std::panic::catch_unwind(|| {
        lifecycle::at_load();
        // After libc's own dlsym is known (at_load's first step); a copy standing aside
        // resolves them too, as the first copy's exec hooks reach its exports by RTLD_NEXT.
        exports::process::resolve_at_load();
    });
}

extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(lifecycle::at_exit);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;

//! The traffic generator: many flows (QPs, RC or UD) from one process, started together,
//! every operation timed; which operations, [`ops`]. `serve` is the receiving side, `run` the sending side; they meet over
//! the out-of-band TCP exchange in [`wire`], and with `--cm` connect their QPs through
//! rdma_cm ([`cm`]).
//!
//! Pipeline of a run, as its [`run_config`] asks: [`client`] opens the device and builds one
//! [`shard`] per thread (its own CQ, buffers and flows), exchanges endpoints with [`server`],
//! waits for the common start, and lets each thread drive its flows (one loop, [`drive`],
//! with a pattern: [`worker`] for throughput, [`pingpong`] for round trips),
//! then gathers [`stats::FlowStats`] into a [`crate::report::RunReport`].
pub mod client;
pub mod cm;
pub mod cpus;
pub mod drive;
pub mod fct;
pub mod histogram;
pub mod intervals;
pub mod ops;
pub mod pacing;
pub mod pingpong;
pub mod port_counters;
pub mod progress;
pub mod run_config;
pub mod server;
pub mod shard;
pub mod sizes;
pub mod stats;
pub mod stop;
pub mod wire;
pub mod worker;

pub use client::RunError;
pub use ops::{Op, OpMix, QpType};
pub use run_config::{Load, RunConfig, StopAt};

//! ibjitter: study RDMA latency and latency variation.
//!
//! The library is the pipeline the CLI drives:
//! - [`table`]: delay tables (netem's 512×8 `.dist` shape) — format, generators, fitting, stats.
//! - [`verbs`]: safe wrappers over libibverbs, one module per verbs object.
//! - [`gen`]: the traffic generator (many RC flows from one process, every operation timed).
//! - [`incast`]: many senders to one receiver through the cluster's launcher, merged.
//! - [`report`]: what a run measured, and `report::export` for its output formats.
//! - [`pcap`]: wire-level analysis of RoCE / InfiniBand captures (`ibjitter pcap`).
//! - [`control`]: live control of processes under the injector (`ibjitter inject`).
//! - [`inject_env`]: the environment that runs a program under the injector (`ibjitter exec`).
//! - [`study`]: a program's sensitivity to latency variation and congestion (`ibjitter study`).
//!
//! The LD_PRELOAD injector lives in the `shim/` crate and depends on `ibjitter-table` alone.

pub mod control;
pub mod doctor;
pub mod gen;
pub mod incast;
pub mod inject_env;
pub mod pcap;
pub mod report;
pub mod study;
pub mod temp_files;
pub mod verbs;

/// Delay tables: the `ibjitter-table` crate (crates/ibjitter-table), which the shim uses alone.
pub use ibjitter_table as table;

/// Version string stamped into reports: crate version plus the git commit it was built from.
pub const VERSION: &str = env!("IBJITTER_VERSION");

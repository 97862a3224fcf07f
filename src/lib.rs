//! ibjitter: study RDMA latency and latency variation.
//!
//! The library is the pipeline the CLI drives:
//! - [`table`]: delay tables (netem's 512×8 `.dist` shape) — format, generators, fitting, stats.
//!
//! The LD_PRELOAD injector lives in the `shim/` crate and uses [`table`] to read its tables.

pub mod table;

/// Version string stamped into reports: crate version plus the git commit it was built from.
pub const VERSION: &str = env!("IBJITTER_VERSION");

//! Delay tables: 4096 integers in 512 lines of 8, the shape of tc netem's `.dist` files.
//!
//! - [`format`]: reading and writing tables (std only; the LD_PRELOAD shim uses just this).
//! - [`duration`]: durations with units (`6.1us`) to and from nanoseconds (std only).
//! - [`input`]: bounded reading of the text files a user names (std only).
//!
//! With the `generate` feature (default):
//! - [`dist`]: distributions and their quantile functions.
//! - [`netem`]: iproute2's constructions of netem's normal/pareto/paretonormal tables.
//! - [`generate`]: tables from distributions, with headers saying how they were made.
//! - [`stats`]: mean, sd and percentiles of a table.
//! - [`samples`]: reading measured latencies (plain numbers, perftest `-H` dumps).
//! - [`fit`]: maximum-likelihood lognormal with location (what `scipy.stats.lognorm.fit` does).
//! - [`family`]: the research's mean-preserving lognormal family.
//! - [`episodes`]: a two-state (calm/congested) episode model fitted to a latency time series:
//!   a table per state and exponential mean dwells.

#[cfg(feature = "generate")]
pub mod dist;
pub mod duration;
#[cfg(feature = "generate")]
pub mod episodes;
#[cfg(feature = "generate")]
pub mod family;
#[cfg(feature = "generate")]
pub mod fit;
pub mod format;
#[cfg(feature = "generate")]
pub mod generate;
pub mod input;
#[cfg(feature = "generate")]
pub mod netem;
#[cfg(feature = "generate")]
pub mod samples;
#[cfg(feature = "generate")]
pub mod stats;

pub use format::{
    parse, read, resolve_named_dist, ErrorKind, Kind, ParseError, Table, ENTRIES, NETEM_SCALE,
    PER_LINE,
};

use std::fmt;

/// An error from making or analysing tables: a one-line message saying what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError {
    pub kind: ErrorKind,
    pub message: String,
}

impl TableError {
    /// An [`ErrorKind::Invalid`] error.
    pub fn new(message: impl Into<String>) -> Self {
        TableError {
            kind: ErrorKind::Invalid,
            message: message.into(),
        }
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TableError {}

impl From<ParseError> for TableError {
    fn from(e: ParseError) -> Self {
        TableError {
            kind: e.kind,
            message: e.to_string(),
        }
    }
}

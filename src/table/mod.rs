//! Delay tables: 4096 integers in 512 lines of 8, the shape of tc netem's `.dist` files.
//!
//! - [`format`]: reading and writing tables (std only; the LD_PRELOAD shim uses just this).

pub mod format;

pub use format::{
    parse, read, resolve_named_dist, Kind, ParseError, Table, ENTRIES, NETEM_SCALE, PER_LINE,
};

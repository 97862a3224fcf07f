//! Layer 3: the `IBJITTER_*` settings, read once at load (and for a live `set`) into plain
//! values: [`values`] (the grammar of one value: durations, seeds, probabilities, ranks),
//! [`tables`] (loading and bounding the tables the settings name), [`dists`] (where named
//! tables are found, from the loaded library's own path), [`settings`] (the variables and what
//! they ask for), [`select`] (which sends are selected). Nothing here touches the process
//! beyond reading files and asking the loader where the library is.
pub mod dists;
pub mod select;
pub mod settings;
pub mod tables;
pub mod values;

pub use settings::*;
pub use tables::{with_probability, Delays};
pub use values::{parse_duration, Unit};

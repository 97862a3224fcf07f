//! Layer 3: the `IBJITTER_*` settings, read once at load (and for a live `set`) into plain
//! values: [`settings`] (the variables, their grammar, the tables they name), [`select`]
//! (which sends are selected). Nothing here touches the process beyond reading files.
pub mod select;
pub mod settings;

pub use settings::*;

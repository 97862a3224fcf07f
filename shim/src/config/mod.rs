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

/// The process's environment variable `k` as the settings read it. A value that is not
/// UTF-8 (a Latin-1 path, a stray byte) is read with each bad byte as U+FFFD, so the setting's
/// own check refuses it with its name and value in the warning: read as unset, it was
/// ignored without a word (or blamed on another cause).
pub fn env_var(k: &str) -> Option<String> {
    std::env::var_os(k).map(|v| {
        v.into_string()
            .unwrap_or_else(|v| v.to_string_lossy().into_owned())
    })
}

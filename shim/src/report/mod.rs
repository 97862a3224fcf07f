//! Layer 9: what the shim says about a run: the stats document ([`stats`]) and its
//! signal-time writer ([`sigstats`]), whether anything passed the hooks ([`coverage`]), what
//! the device ports sent ([`ports`]), and the start-up and exit lines ([`lines`]).
pub mod coverage;
pub mod lines;
pub mod ports;
pub mod sigstats;
pub mod stats;

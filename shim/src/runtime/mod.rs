//! Layer 10: the running injector: the settings in force ([`loaded`]), applying the settings at load and at first use, the
//! exit and fork sequences ([`lifecycle`]), live `set`s and their accounting ([`live`]),
//! and the live-control thread that serves `ibjitter inject` ([`control`]).
pub mod control;
pub mod lifecycle;
pub mod live;
pub mod loaded;

//! Layer 2: process-level tools with no knowledge of injection: stderr ([`say`]), clocks and
//! busy-waits ([`clock`]), the per-thread state and PCG streams ([`rng`]), the fixed
//! open-addressing tables keyed by address ([`addr_table`]), a fork-safe spin lock
//! ([`spin_lock`]), typed real symbols ([`symbols`]) and libc's own `dlsym` ([`libc_dl`]).
pub mod addr_table;
pub mod clock;
pub mod fn_slot;
pub mod libc_dl;
pub mod rng;
pub mod say;
pub mod spin_lock;
pub mod symbols;

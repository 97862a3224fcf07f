//! Layer 2: process-level tools with no knowledge of injection: stderr ([`say`]), clocks and
//! busy-waits ([`clock`]), the per-thread state and PCG streams ([`rng`]), the fixed
//! open-addressing tables keyed by address ([`addr_table`]), a fork-safe spin lock
//! ([`spin_lock`]), typed real symbols ([`symbols`]), UCP's resolved per caller
//! ([`by_caller`]), libc's own `dlsym` ([`libc_dl`]),
//! output files opened without following links or blocking ([`out_file`]), writes that raise
//! no signal ([`quiet`]) and the shim's own threads, deaf to the program's signals
//! ([`threads`]).
pub mod addr_table;
pub mod by_caller;
pub mod clock;
pub mod fn_slot;
pub mod libc_dl;
pub mod out_file;
pub mod quiet;
pub mod rng;
pub mod say;
pub mod spin_lock;
pub mod symbols;
pub mod threads;

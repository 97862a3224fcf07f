//! Every exit status of the CLI, decided here from what the library returned: the
//! subcommands report, this file maps.
use ibjitter::gen::server::ServeError;
use ibjitter::gen::RunError;
use ibjitter::report::Outcome;

/// Everything asked for was done.
pub const OK: i32 = 0;
/// It ran, but not all of it went well: flows ended with errors, a session or a sender
/// failed; for `table` and `pcap`, the input was refused (`table` has said 1 since its first
/// release, `pcap` 2: kept).
pub const PARTLY: i32 = 1;
/// Bad arguments, or set-up failed: nothing was measured.
pub const SETUP: i32 = 2;
/// The peer (the server) was lost mid-run; what was measured is written.
pub const PEER_LOST: i32 = 3;
/// Open loop: the rate asked for was not offered (more than 5 % of the sends due were never
/// posted); what was measured is written, with offered and achieved rates.
pub const OVERLOADED: i32 = 4;
/// Ctrl-C (SIGINT/SIGTERM); what was measured is written.
pub const INTERRUPTED: i32 = 130;

/// `run` measured something: how it ended.
pub fn outcome(o: Outcome) -> i32 {
    match o {
        Outcome::Completed => OK,
        Outcome::Overloaded => OVERLOADED,
        Outcome::FlowErrors => PARTLY,
        Outcome::PeerLost => PEER_LOST,
        Outcome::Interrupted => INTERRUPTED,
    }
}

/// `run` measured nothing.
pub fn run_error(e: &RunError) -> i32 {
    match e {
        RunError::Setup(_) => SETUP,
        RunError::Interrupted(_) => INTERRUPTED,
    }
}

pub fn serve_error(e: &ServeError) -> i32 {
    match e {
        ServeError::Sessions(_) => PARTLY,
        ServeError::Setup(_) => SETUP,
    }
}

/// `table` refused its input or could not write.
pub const TABLE_ERROR: i32 = PARTLY;
/// `pcap` could not read or decode its input, or could not write.
pub const PCAP_ERROR: i32 = SETUP;

/// What could not be written after a measurement: never below [`SETUP`].
pub fn with_write_failure(code: i32) -> i32 {
    code.max(SETUP)
}

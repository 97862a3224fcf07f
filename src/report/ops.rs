//! A run's figures by op type, and what the server said reached it: counts by op (its own
//! for the ops that raise completions there, the client's for the others), and the checks a
//! user can read off (fetch_add words sum to fetch_adds x addend, every cmp_swap swapped, UD
//! datagrams lost).
use super::latency::Latency;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One op type of a run, at the client.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpReport {
    /// Operations completed.
    pub count: u64,
    pub bytes: u64,
    pub latency: Latency,
    /// cmp_swap: how many found the value their flow's previous swap had put in (and so
    /// swapped); the others found something else there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swapped: Option<u64>,
    /// With a mix: this op's latencies as an HdrHistogram (`hist::encode`), so an incast
    /// merges its senders' per op exactly (a single op's is the run's `histogram`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub histogram: String,
}

/// One op type at the server.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerOpReport {
    pub ops: u64,
    pub bytes: u64,
    /// "server": its own receive completions (SEND, WRITE_IMM; ping-pong echoes); "client":
    /// what the client saw complete, told to the server (WRITE, READ and atomics raise
    /// nothing there).
    pub counted_at: String,
}

/// fetch_add: the sum of every flow's word, read by the server after the client was done,
/// against what the client's completed fetch_adds must have added.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FetchAddCheck {
    /// fetch_adds the client saw complete.
    pub ops: u64,
    /// What each added.
    pub addend: u64,
    /// ops x addend.
    pub expected_sum: u64,
    /// The server's words, summed.
    pub sum: u64,
    pub exact: bool,
}

/// cmp_swap: each swap compares its flow's word with the value the flow's previous swap put
/// in, and puts in one more; so every swap succeeds, and each flow's word ends at its count
/// of successful swaps.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CmpSwapCheck {
    /// cmp_swaps the client saw complete, and of those, the ones that swapped.
    pub ops: u64,
    pub swapped: u64,
    /// The server's words, summed.
    pub sum: u64,
    /// Every one swapped, and the words add up to them.
    pub exact: bool,
}

/// What the server reported at the end (the `Bye` message).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerReport {
    /// By op key ("send", "read", ...).
    pub ops: BTreeMap<String, ServerOpReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_add: Option<FetchAddCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmp_swap: Option<CmpSwapCheck>,
    /// UD: datagrams the client sent (completed) that the server never received; UD does not
    /// retransmit, and a datagram finding no receive posted is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams_lost: Option<u64>,
    /// Completions in error at the server.
    #[serde(default)]
    pub errors: u64,
}

impl FetchAddCheck {
    pub fn new(ops: u64, addend: u64, sum: u64) -> FetchAddCheck {
        let expected_sum = ops.wrapping_mul(addend);
        FetchAddCheck {
            ops,
            addend,
            expected_sum,
            sum,
            exact: sum == expected_sum,
        }
    }
}

impl CmpSwapCheck {
    pub fn new(ops: u64, swapped: u64, sum: u64) -> CmpSwapCheck {
        CmpSwapCheck {
            ops,
            swapped,
            sum,
            exact: swapped == ops && sum == swapped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_say_exact_only_when_everything_adds_up() {
        assert!(FetchAddCheck::new(1000, 0x101, 1000 * 0x101).exact);
        let off = FetchAddCheck::new(1000, 0x101, 999 * 0x101);
        assert!(!off.exact && off.expected_sum == 1000 * 0x101);
        assert!(CmpSwapCheck::new(50, 50, 50).exact);
        assert!(!CmpSwapCheck::new(50, 49, 49).exact, "one did not swap");
        assert!(!CmpSwapCheck::new(50, 50, 51).exact, "an extra swap landed");
    }
}

//! What reached the server in one session, by op type ([`ServerCounts`], sent back in Bye and
//! printed): its own count of what raises completions here (SEND, WRITE_IMM; a ping-pong's
//! echoes), the client's count of what does not (WRITE, READ, atomics: the operations whose
//! completion it saw reached this memory), and the sums of the flows' atomic words.
use super::responder::{Received, Tally};
use crate::gen::ops::{Op, FETCH_ADD_ADDEND};
use crate::gen::wire::{CountedAt, OpCount, QpType, RunRequest, ServerCounts};

/// The session's counts. `client`: what the client said it completed, by op;
/// `atomic_sum(op)`: the flows' words for fetch_add or cmp_swap, summed.
pub fn of_session(
    run: &RunRequest,
    received: &Received,
    client: &[OpCount],
    atomic_sum: impl Fn(Op) -> Option<u64>,
) -> ServerCounts {
    let here = |op, t: Tally| {
        let count = OpCount {
            op,
            ops: t.messages,
            bytes: t.bytes,
        };
        (count, CountedAt::Server)
    };
    let ops = if run.pingpong {
        let op = run.mix.only().unwrap_or(Op::Write);
        vec![here(op, received.echoes)]
    } else {
        run.mix
            .ops()
            .map(|op| match op {
                Op::Send => here(op, received.sends),
                Op::WriteImm => here(op, received.write_imms),
                _ => (told(client, op), CountedAt::Client),
            })
            .collect()
    };
    let sum = |op| run.mix.contains(op).then(|| atomic_sum(op)).flatten();
    ServerCounts {
        ops,
        fetch_add_sum: sum(Op::FetchAdd),
        cmp_swap_sum: sum(Op::CmpSwap),
        errors: received.errors,
    }
}

/// The client's count of `op` (0 if it told none).
fn told(client: &[OpCount], op: Op) -> OpCount {
    client
        .iter()
        .find(|c| c.op == op)
        .copied()
        .unwrap_or(OpCount {
            op,
            ops: 0,
            bytes: 0,
        })
}

/// Messages and bytes over every op type (Bye's totals).
pub fn totals(counts: &ServerCounts) -> (u64, u64) {
    counts
        .ops
        .iter()
        .fold((0, 0), |(m, b), (c, _)| (m + c.ops, b + c.bytes))
}

/// The session's line of the server's output, after what the run was. A single WRITE or
/// SEND (or a ping-pong) reads as it always has; otherwise each op type of the mix, whose
/// count it is, and the atomic checks.
pub fn summary(
    run: &RunRequest,
    counts: &ServerCounts,
    (client_ops, client_bytes): (u64, u64),
    client: &[OpCount],
) -> String {
    let errors = counts.errors;
    let (messages, bytes) = totals(counts);
    match run.mix.only() {
        Some(Op::Write) if !run.pingpong => {
            return format!(
                "the client wrote {client_ops} operations, {client_bytes} bytes into this \
                 server's memory (completed at the client: a WRITE raises no completion here), \
                 {errors} errors"
            )
        }
        Some(Op::Send) if run.qp_type == QpType::Rc => {
            return format!("received {messages} messages, {bytes} bytes, {errors} errors")
        }
        _ if run.pingpong => {
            return format!("received {messages} messages, {bytes} bytes, {errors} errors")
        }
        _ => {}
    }
    let mut parts: Vec<String> = counts
        .ops
        .iter()
        .map(|(c, at)| {
            let none = if c.ops == 0 { " (none)" } else { "" };
            match at {
                CountedAt::Server if run.qp_type == QpType::Ud => format!(
                    "send: received {} of the {} datagrams the client sent{none}, {} bytes \
                     (GRH excluded)",
                    c.ops,
                    told(client, c.op).ops,
                    c.bytes
                ),
                CountedAt::Server => {
                    format!(
                        "{}: received {}{none}, {} bytes",
                        c.op.key(),
                        c.ops,
                        c.bytes
                    )
                }
                CountedAt::Client => format!(
                    "{}: {} operations{none}, {} bytes (the client's count: no completion here)",
                    c.op.key(),
                    c.ops,
                    c.bytes
                ),
            }
        })
        .collect();
    if let Some(sum) = counts.fetch_add_sum {
        let n = told(client, Op::FetchAdd).ops;
        let expected = n.wrapping_mul(FETCH_ADD_ADDEND);
        parts.push(if sum == expected {
            format!("fetch_add words sum to {sum} = {n} x {FETCH_ADD_ADDEND}: exact")
        } else {
            format!(
                "fetch_add words sum to {sum}, but {n} fetch_adds x {FETCH_ADD_ADDEND} = \
                 {expected}: MISMATCH"
            )
        });
    }
    if let Some(sum) = counts.cmp_swap_sum {
        parts.push(format!(
            "cmp_swap words sum to {sum} (each flow's word counts the swaps that found it as \
             expected; the client saw {} complete)",
            told(client, Op::CmpSwap).ops
        ));
    }
    format!("{}; {errors} errors", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::wire::OpMix;

    fn run(mix: &str, qp_type: QpType) -> RunRequest {
        RunRequest {
            client: "c".into(),
            mix: OpMix::parse(mix).unwrap(),
            qp_type,
            size: 8,
            depth: 1,
            pingpong: false,
            cm: false,
            flows: Vec::new(),
        }
    }

    fn count(op: Op, ops: u64) -> OpCount {
        OpCount {
            op,
            ops,
            bytes: 8 * ops,
        }
    }

    #[test]
    fn receives_are_counted_here_and_the_rest_taken_from_the_client() {
        let r = run("write_imm:1,read:1,fetch_add:1,cmp_swap:1", QpType::Rc);
        let received = Received {
            write_imms: Tally {
                messages: 7,
                bytes: 56,
            },
            errors: 1,
            ..Received::default()
        };
        let client = [
            count(Op::WriteImm, 7),
            count(Op::Read, 5),
            count(Op::FetchAdd, 3),
            count(Op::CmpSwap, 2),
        ];
        let sums = |op| {
            Some(if op == Op::FetchAdd {
                3 * FETCH_ADD_ADDEND
            } else {
                2
            })
        };
        let c = of_session(&r, &received, &client, sums);
        assert_eq!(
            c.ops,
            vec![
                (count(Op::Read, 5), CountedAt::Client),
                (count(Op::WriteImm, 7), CountedAt::Server),
                (count(Op::FetchAdd, 3), CountedAt::Client),
                (count(Op::CmpSwap, 2), CountedAt::Client),
            ]
        );
        assert_eq!(
            (c.fetch_add_sum, c.cmp_swap_sum, c.errors),
            (Some(771), Some(2), 1)
        );
        assert_eq!(totals(&c), (17, 136));
        let line = summary(&r, &c, (17, 136), &client);
        assert!(
            line.contains("fetch_add words sum to 771 = 3 x 257: exact"),
            "{line}"
        );
        assert!(
            line.contains("read: 5 operations, 40 bytes (the client's count"),
            "{line}"
        );
        assert!(line.contains("write_imm: received 7, 56 bytes"), "{line}");
        // One fetch_add more than landed: said, not hidden.
        let more = [count(Op::FetchAdd, 4)];
        let line = summary(&r, &c, (0, 0), &more);
        assert!(line.contains("MISMATCH"), "{line}");
    }

    #[test]
    fn a_ud_line_names_datagrams_received_of_sent_and_a_lone_write_reads_as_before() {
        let r = run("send:1", QpType::Ud);
        let received = Received {
            sends: Tally {
                messages: 9,
                bytes: 72,
            },
            ..Received::default()
        };
        let client = [count(Op::Send, 10)];
        let c = of_session(&r, &received, &client, |_| None);
        let line = summary(&r, &c, (10, 80), &client);
        assert!(line.contains("received 9 of the 10 datagrams"), "{line}");
        let w = run("write:1", QpType::Rc);
        let c = of_session(&w, &Received::default(), &[count(Op::Write, 4)], |_| None);
        assert_eq!(c.fetch_add_sum, None);
        let line = summary(&w, &c, (4, 32), &[count(Op::Write, 4)]);
        assert!(
            line.starts_with("the client wrote 4 operations, 32 bytes"),
            "{line}"
        );
    }
}

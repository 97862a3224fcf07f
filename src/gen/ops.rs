//! The operations a flow can post ([`Op`]), the transport they travel on ([`QpType`]), and a
//! run's weighted choice among them ([`OpMix`], `--op` or `--mix`): parsing, the rules a run
//! must keep (checked by the client before anything is opened and again by the server), and
//! each flow's seeded draw of its next operation ([`Picker`]).
use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Send,
    Write,
    Read,
    WriteImm,
    FetchAdd,
    CmpSwap,
}

/// What each fetch_add adds to its flow's word at the server: the words' final sum is then
/// `fetch_adds x FETCH_ADD_ADDEND` exactly. Not 1: a byte-order or width mistake would still
/// sum to the count with 1; 0x0101 does not survive either.
pub const FETCH_ADD_ADDEND: u64 = 0x0101;

/// Bytes a UD datagram's receive buffer holds before its payload: the GRH (for RoCE v2, the
/// IP header in its last 20 bytes). Not payload: left out of the bytes counted.
pub const GRH_BYTES: u32 = 40;

/// The largest path MTU any device has (IBV_MTU_4096): no UD datagram is larger.
pub const MAX_MTU: u32 = 4096;

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Send,
        Op::Write,
        Op::Read,
        Op::WriteImm,
        Op::FetchAdd,
        Op::CmpSwap,
    ];

    /// Position in [`Op::ALL`] (per-op tables index by it).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The verbs name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "SEND",
            Op::Write => "RDMA_WRITE",
            Op::Read => "RDMA_READ",
            Op::WriteImm => "RDMA_WRITE_WITH_IMM",
            Op::FetchAdd => "ATOMIC_FETCH_ADD",
            Op::CmpSwap => "ATOMIC_CMP_SWAP",
        }
    }

    /// The name on the command line and in the JSON (`--op`, `--mix`, the `ops` map).
    pub fn key(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::WriteImm => "write_imm",
            Op::FetchAdd => "fetch_add",
            Op::CmpSwap => "cmp_swap",
        }
    }

    /// `key`, or its spelling with a dash (`write-imm`).
    pub fn parse(text: &str) -> Result<Op, String> {
        let want = text.trim().replace('-', "_");
        Op::ALL
            .into_iter()
            .find(|op| op.key() == want)
            .ok_or_else(|| {
                let keys: Vec<&str> = Op::ALL.iter().map(|op| op.key()).collect();
                format!("unknown op '{}' (ops: {})", text.trim(), keys.join(", "))
            })
    }

    /// An 8-byte atomic at the server's word for this flow.
    pub fn is_atomic(self) -> bool {
        matches!(self, Op::FetchAdd | Op::CmpSwap)
    }

    /// Raises a receive completion at the server (consumes one of its receives): the server
    /// counts these itself. The others land in, or are read from, its memory unseen: it
    /// reports the client's count of them.
    pub fn counted_at_server(self) -> bool {
        matches!(self, Op::Send | Op::WriteImm)
    }
}

/// The transport of a run's flows.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QpType {
    /// Reliable connected: every op, delivery acknowledged.
    #[default]
    Rc,
    /// Unreliable datagram: SEND only, one packet each (at most the path MTU), no
    /// acknowledgement: a completion means sent, not received.
    Ud,
}

impl QpType {
    pub fn key(self) -> &'static str {
        match self {
            QpType::Rc => "rc",
            QpType::Ud => "ud",
        }
    }
}

/// Which operations a run posts and how often: a weight per [`Op`] (`--mix write:70,read:30`;
/// `--op X` is X alone). Each flow draws its next operation with probability weight / total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "Vec<(Op, u32)>", try_from = "Vec<(Op, u32)>")]
pub struct OpMix {
    weights: [u32; 6],
}

impl OpMix {
    /// One operation, always.
    pub fn single(op: Op) -> OpMix {
        let mut weights = [0; 6];
        weights[op.index()] = 1;
        OpMix { weights }
    }

    /// `op:weight[,op:weight...]`, each op at most once, whole-number weights adding up to
    /// more than 0 (an op of weight 0 is allowed: it is never drawn).
    pub fn parse(text: &str) -> Result<OpMix, String> {
        if text.trim().is_empty() {
            return Err("an empty mix: give op:weight pairs, e.g. write:70,read:30".into());
        }
        let mut pairs = Vec::new();
        for part in text.split(',') {
            let Some((op, weight)) = part.split_once(':') else {
                return Err(format!(
                    "'{}' is not op:weight (e.g. write:70)",
                    part.trim()
                ));
            };
            let op = Op::parse(op)?;
            let weight: u32 = weight.trim().parse().map_err(|_| {
                format!(
                    "'{}': the weight of {} must be a whole number",
                    part.trim(),
                    op.key()
                )
            })?;
            pairs.push((op, weight));
        }
        OpMix::try_from(pairs)
    }

    /// The ops of weight above 0, in [`Op::ALL`] order, with their weights.
    pub fn entries(&self) -> impl Iterator<Item = (Op, u32)> + '_ {
        Op::ALL
            .into_iter()
            .map(|op| (op, self.weights[op.index()]))
            .filter(|&(_, w)| w > 0)
    }

    pub fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        self.entries().map(|(op, _)| op)
    }

    pub fn contains(&self, op: Op) -> bool {
        self.weights[op.index()] > 0
    }

    /// The op, when there is only one.
    pub fn only(&self) -> Option<Op> {
        let mut ops = self.ops();
        match (ops.next(), ops.next()) {
            (Some(op), None) => Some(op),
            _ => None,
        }
    }

    pub fn has_atomics(&self) -> bool {
        self.ops().any(Op::is_atomic)
    }

    /// Raises receive completions at the server (which must keep receives posted).
    pub fn needs_receives(&self) -> bool {
        self.ops().any(Op::counted_at_server)
    }

    fn total(&self) -> u64 {
        self.weights.iter().map(|&w| u64::from(w)).sum()
    }

    /// `write:70,read:30` (or just `write` for one op): what `parse` reads back.
    pub fn describe(&self) -> String {
        match self.only() {
            Some(op) => op.key().to_string(),
            None => self
                .entries()
                .map(|(op, w)| format!("{}:{w}", op.key()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The report's name for it: the verbs name of a single op, else `MIX(write:70,...)`.
    pub fn name(&self) -> String {
        match self.only() {
            Some(op) => op.name().to_string(),
            None => format!("MIX({})", self.describe()),
        }
    }

    /// The rules a run must keep with this mix; each error names the rule or limit.
    pub fn validate(&self, size: u32, qp_type: QpType, pingpong: bool) -> Result<(), String> {
        if let Some(atomic) = self.ops().find(|op| op.is_atomic()) {
            if size != 8 {
                return Err(format!(
                    "{} is an 8-byte atomic: --size must be 8 with it, got {size}",
                    atomic.key()
                ));
            }
        }
        if qp_type == QpType::Ud {
            if let Some(other) = self.ops().find(|&op| op != Op::Send) {
                return Err(format!(
                    "--qp-type ud carries SEND only (a datagram QP has no RDMA WRITE, READ or \
                     atomics): not {}",
                    other.key()
                ));
            }
            if size > MAX_MTU {
                return Err(format!(
                    "--qp-type ud: --size {size} exceeds the path MTU (at most {MAX_MTU} bytes \
                     on any device): a datagram is one packet"
                ));
            }
        }
        if pingpong {
            match self.only() {
                None => return Err("--pingpong times one op, not a --mix".into()),
                Some(Op::Write | Op::Send) => {}
                Some(op) => {
                    return Err(format!(
                        "--pingpong times WRITE or SEND round trips, not {}",
                        op.key()
                    ))
                }
            }
            if qp_type == QpType::Ud {
                return Err("--pingpong runs over RC (--qp-type rc)".into());
            }
        }
        Ok(())
    }
}

impl From<OpMix> for Vec<(Op, u32)> {
    fn from(mix: OpMix) -> Self {
        mix.entries().collect()
    }
}

impl TryFrom<Vec<(Op, u32)>> for OpMix {
    type Error = String;

    fn try_from(pairs: Vec<(Op, u32)>) -> Result<OpMix, String> {
        let mut weights = [0; 6];
        let mut seen = [false; 6];
        for (op, weight) in pairs {
            if std::mem::replace(&mut seen[op.index()], true) {
                return Err(format!("{} appears twice in the mix", op.key()));
            }
            weights[op.index()] = weight;
        }
        let mix = OpMix { weights };
        if mix.total() == 0 {
            return Err(
                "the mix's weights add up to 0: give at least one op a weight above 0".into(),
            );
        }
        Ok(mix)
    }
}

/// One flow's draw of its next operation: its own PRNG, seeded from the run's seed and the
/// flow's id, so a run repeats its sequence of ops exactly.
pub struct Picker {
    rng: Pcg64Mcg,
    /// Cumulative weights in [`Op::ALL`] order, and their total.
    bounds: [u64; 6],
    total: u64,
}

impl Picker {
    pub fn new(mix: &OpMix, seed: u64, flow: u32) -> Picker {
        let mut bounds = [0; 6];
        let mut sum = 0;
        for (b, &w) in bounds.iter_mut().zip(&mix.weights) {
            sum += u64::from(w);
            *b = sum;
        }
        Picker {
            rng: Pcg64Mcg::seed_from_u64(seed ^ 0x6d69_7800 ^ (u64::from(flow) << 24)),
            bounds,
            total: sum,
        }
    }

    /// The next op: each with probability weight / total (a 64-bit draw, so the modulo's
    /// bias is below 2^-32 for any total that fits the weights).
    pub fn draw(&mut self) -> Op {
        let r = self.rng.next_u64() % self.total;
        let k = self.bounds.iter().position(|&b| r < b).unwrap_or(5);
        Op::ALL[k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_its_place_and_its_name_back() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(Op::parse(op.key()), Ok(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(
                json,
                format!("\"{}\"", op.key()),
                "JSON and CLI spell it alike"
            );
        }
    }

    #[test]
    fn mixes_parse_and_describe_themselves() {
        let m = OpMix::parse("write:70, read:20 ,send:10").unwrap();
        assert_eq!(m.describe(), "send:10,write:70,read:20");
        assert_eq!(OpMix::parse(&m.describe()).unwrap(), m);
        assert_eq!(m.only(), None);
        assert_eq!(m.name(), "MIX(send:10,write:70,read:20)");
        assert!(!m.has_atomics() && m.needs_receives());
        let one = OpMix::parse("fetch-add:3").unwrap();
        assert_eq!(
            (one.only(), one.name()),
            (Some(Op::FetchAdd), "ATOMIC_FETCH_ADD".into())
        );
        // A zero weight is allowed beside others, and never drawn.
        let z = OpMix::parse("write:1,read:0").unwrap();
        assert_eq!(z.only(), Some(Op::Write));
        let back: OpMix = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn bad_mixes_say_what_is_wrong() {
        let err = |t: &str| OpMix::parse(t).unwrap_err();
        assert!(err("write:70,bogus:30").contains("unknown op 'bogus' (ops: send, write"));
        assert!(err("write:0,read:0").contains("add up to 0"));
        assert!(err("").contains("empty mix"));
        assert!(err("write").contains("'write' is not op:weight"));
        assert!(err("write:x").contains("weight of write must be a whole number"));
        assert!(err("write:-1").contains("whole number"));
        assert!(err("write:1,write:2").contains("write appears twice"));
        let bad: Result<OpMix, _> = serde_json::from_str("[]");
        assert!(bad.is_err(), "a server refuses an empty mix too");
    }

    #[test]
    fn the_rules_name_their_limit() {
        let v = |t: &str, size, qp, pp| OpMix::parse(t).unwrap().validate(size, qp, pp);
        assert!(v("fetch_add:1", 8, QpType::Rc, false).is_ok());
        let e = v("write:1,cmp_swap:1", 64, QpType::Rc, false).unwrap_err();
        assert!(
            e.contains("cmp_swap is an 8-byte atomic: --size must be 8"),
            "{e}"
        );
        let e = v("send:1,read:1", 64, QpType::Ud, false).unwrap_err();
        assert!(
            e.contains("carries SEND only") && e.contains("not read"),
            "{e}"
        );
        let e = v("send:1", 8192, QpType::Ud, false).unwrap_err();
        assert!(
            e.contains("exceeds the path MTU (at most 4096 bytes"),
            "{e}"
        );
        assert!(v("send:1", 4096, QpType::Ud, false).is_ok());
        assert!(v("write:1,send:1", 2, QpType::Rc, true)
            .unwrap_err()
            .contains("not a --mix"));
        assert!(v("read:1", 2, QpType::Rc, true)
            .unwrap_err()
            .contains("not read"));
        assert!(v("send:1", 2, QpType::Ud, true)
            .unwrap_err()
            .contains("over RC"));
        assert!(v("send:1", 2, QpType::Rc, true).is_ok());
    }

    #[test]
    fn each_flow_draws_its_own_repeatable_sequence_in_proportion() {
        let mix = OpMix::parse("write:70,read:20,send:10").unwrap();
        let draw = |flow| {
            let mut p = Picker::new(&mix, 7, flow);
            (0..100_000).map(|_| p.draw()).collect::<Vec<_>>()
        };
        let (a, a2, b) = (draw(0), draw(0), draw(1));
        assert_eq!(a, a2, "same seed and flow: same sequence");
        assert_ne!(a, b, "flows draw apart");
        let share = |op| a.iter().filter(|&&o| o == op).count() as f64 / a.len() as f64;
        for (op, want) in [(Op::Write, 0.7), (Op::Read, 0.2), (Op::Send, 0.1)] {
            assert!((share(op) - want).abs() < 0.01, "{op:?}: {}", share(op));
        }
        assert!(a.iter().all(|op| mix.contains(*op)));
    }
}

//! `IBJITTER_OPS`, `IBJITTER_QPN`, `IBJITTER_DEST`: which sends the user selected, parsed
//! and described; the opcode classes. What the post path does with them:
//! [`crate::modes::select`].
use crate::abi::verbs::*;
use crate::config::values::{quoted, shown};
use std::net::IpAddr;

/// Opcode classes, as bits of the names' mask.
pub const SEND: u8 = 1;
pub const WRITE: u8 = 2;
pub const READ: u8 = 4;
pub const ATOMIC: u8 = 8;
const CLASSES: [(&str, u8); 4] = [
    ("send", SEND),
    ("write", WRITE),
    ("read", READ),
    ("atomic", ATOMIC),
];

/// What the environment selected.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    /// Opcode classes (None: all).
    pub ops: Option<u8>,
    /// Local QP numbers (None: all).
    pub qpns: Option<Vec<u32>>,
    /// Destinations (None: all).
    pub dests: Option<Vec<Dest>>,
}

/// One destination of `IBJITTER_DEST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    Qpn(u32),
    Gid([u8; 16]),
    Lid(u16),
}

impl Selection {
    /// Parses `IBJITTER_OPS`, `IBJITTER_QPN`, `IBJITTER_DEST` (each may be absent).
    pub fn parse(
        ops: Option<&str>,
        qpn: Option<&str>,
        dest: Option<&str>,
    ) -> Result<Selection, String> {
        let ops = ops.map(parse_ops).transpose()?;
        let qpns = qpn
            .map(|v| list(v, "IBJITTER_QPN", |t| parse_qpn(t).map(Some)))
            .transpose()?;
        let dests = dest
            .map(|v| list(v, "IBJITTER_DEST", |t| parse_dest(t).map(Some)))
            .transpose()?;
        Ok(Selection { ops, qpns, dests })
    }

    /// Whether anything is filtered.
    pub fn any(&self) -> bool {
        self.ops.is_some() || self.qpns.is_some() || self.dests.is_some()
    }

    /// Whether QPs are filtered (by number or destination).
    pub fn by_qp(&self) -> bool {
        self.qpns.is_some() || self.dests.is_some()
    }

    /// For the startup line: ", only write sends on QPs 0x11, 0x12 to 10.0.0.2".
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if let Some(m) = self.ops {
            let names: Vec<&str> = CLASSES
                .iter()
                .filter(|(_, b)| m & b != 0)
                .map(|(n, _)| *n)
                .collect();
            s += &format!(" {} sends", names.join("/"));
        }
        if let Some(q) = &self.qpns {
            let q: Vec<String> = q.iter().map(|n| format!("{n:#x}")).collect();
            s += &format!(" on QP {}", q.join(", "));
        }
        if let Some(d) = &self.dests {
            let d: Vec<String> = d.iter().map(Dest::to_string).collect();
            s += &format!(" to {}", d.join(", "));
        }
        if self.by_qp() {
            s += " (verbs only: UCP messages are not delayed)";
        }
        if s.is_empty() {
            s
        } else {
            format!(", only{s}")
        }
    }
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Qpn(n) => write!(f, "qpn:{n:#x}"),
            Dest::Lid(l) => write!(f, "lid:{l}"),
            Dest::Gid(g) => {
                let a = std::net::Ipv6Addr::from(*g);
                match a.to_ipv4_mapped() {
                    Some(v4) => write!(f, "{v4}"),
                    None => write!(f, "{a}"),
                }
            }
        }
    }
}

fn list<T>(
    v: &str,
    var: &str,
    item: impl Fn(&str) -> Result<Option<T>, String>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for t in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if let Some(x) = item(t).map_err(|e| format!("{var}={}: {e}", shown(v.trim())))? {
            out.push(x);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{var}={}: expected a comma-separated list",
            shown(v.trim())
        ));
    }
    Ok(out)
}

fn parse_ops(v: &str) -> Result<u8, String> {
    let names: Vec<&str> = CLASSES.iter().map(|(n, _)| *n).collect();
    let bits = list(v, "IBJITTER_OPS", |t| {
        CLASSES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(t))
            .map(|(_, b)| Some(*b))
            .ok_or_else(|| format!("{} is not one of {}", quoted(t), names.join(", ")))
    })?;
    Ok(bits.into_iter().fold(0, |a, b| a | b))
}

fn parse_qpn(t: &str) -> Result<u32, String> {
    let n = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => t.parse(),
    };
    match n {
        Ok(n) if n < 1 << 24 => Ok(n),
        _ => Err(format!(
            "{} is not a QP number (24 bits, decimal or 0x hex)",
            quoted(t)
        )),
    }
}

fn parse_dest(t: &str) -> Result<Dest, String> {
    if let Some(q) = t.strip_prefix("qpn:") {
        return parse_qpn(q).map(Dest::Qpn);
    }
    if let Some(l) = t.strip_prefix("lid:") {
        return l
            .parse()
            .map(Dest::Lid)
            .map_err(|_| format!("{}: a LID is a 16-bit number", quoted(t)));
    }
    match t.strip_prefix("gid:").unwrap_or(t).parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => Ok(Dest::Gid(a.to_ipv6_mapped().octets())),
        Ok(IpAddr::V6(a)) => Ok(Dest::Gid(a.octets())),
        Err(_) => Err(format!(
            "{} is not qpn:N, lid:N, an IP address or a GID",
            quoted(t)
        )),
    }
}

/// The work-request opcodes of each class (`ibv_wr_opcode` values as bits).
pub const fn opcodes(classes: u8) -> u32 {
    let mut m = 0u32;
    if classes & SEND != 0 {
        m |= 1 << ibv_wr_opcode_IBV_WR_SEND
            | 1 << ibv_wr_opcode_IBV_WR_SEND_WITH_IMM
            | 1 << ibv_wr_opcode_IBV_WR_SEND_WITH_INV
            | 1 << ibv_wr_opcode_IBV_WR_TSO;
    }
    if classes & WRITE != 0 {
        m |= 1 << ibv_wr_opcode_IBV_WR_RDMA_WRITE | 1 << ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM;
    }
    if classes & READ != 0 {
        m |= 1 << ibv_wr_opcode_IBV_WR_RDMA_READ;
    }
    if classes & ATOMIC != 0 {
        m |= 1 << ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP
            | 1 << ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD
            | 1 << ibv_wr_opcode_IBV_WR_ATOMIC_WRITE;
    }
    m
}

/// The UCP class of a wrapped function, from its name.
pub const fn ucp_class(name: &str) -> u8 {
    const fn starts(s: &[u8], p: &[u8]) -> bool {
        if s.len() < p.len() {
            return false;
        }
        let mut i = 0;
        while i < p.len() {
            if s[i] != p[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    let s = name.as_bytes();
    if starts(s, b"ucp_put") {
        WRITE
    } else if starts(s, b"ucp_get") {
        READ
    } else if starts(s, b"ucp_atomic") {
        ATOMIC
    } else {
        SEND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_items_are_named() {
        let s = Selection::parse(
            Some("write, READ"),
            Some("17,0x1a"),
            Some("qpn:0x20,10.0.0.2,fe80::1,lid:5"),
        )
        .unwrap();
        assert_eq!(s.ops, Some(WRITE | READ));
        assert_eq!(s.qpns, Some(vec![17, 26]));
        let d = s.dests.as_ref().unwrap();
        assert_eq!(d[0], Dest::Qpn(32));
        assert_eq!(d[1].to_string(), "10.0.0.2");
        assert_eq!(d[2].to_string(), "fe80::1");
        assert_eq!(d[3], Dest::Lid(5));
        assert_eq!(
            s.describe(),
            ", only write/read sends on QP 0x11, 0x1a to qpn:0x20, 10.0.0.2, fe80::1, lid:5 \
             (verbs only: UCP messages are not delayed)"
        );
        assert!(Selection::parse(Some("writes"), None, None)
            .unwrap_err()
            .contains("IBJITTER_OPS=writes: \"writes\" is not one of send, write, read, atomic"));
        assert!(Selection::parse(None, Some("0x1000000"), None)
            .unwrap_err()
            .contains("24 bits"));
        assert!(Selection::parse(None, None, Some("10.0.0"))
            .unwrap_err()
            .contains("not qpn:N, lid:N, an IP address or a GID"));
        assert!(Selection::parse(None, Some(" , "), None).is_err());
        assert!(!Selection::parse(None, None, None).unwrap().any());
    }

    #[test]
    fn classes_cover_their_opcodes_and_ucp_names() {
        let w = opcodes(WRITE);
        assert!(w & (1 << ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM) != 0);
        assert!(w & (1 << ibv_wr_opcode_IBV_WR_SEND) == 0);
        assert_eq!(ucp_class("ucp_put_nbx"), WRITE);
        assert_eq!(ucp_class("ucp_get_nbi"), READ);
        assert_eq!(ucp_class("ucp_atomic_add64"), ATOMIC);
        assert_eq!(ucp_class("ucp_tag_send_nbx"), SEND);
    }
}

//! Selective injection: only some sends are delayed.
//!
//! - `IBJITTER_OPS=send,write,read,atomic`: by the work request's opcode class (a chain is
//!   selected when any of its requests is; UCP calls by what they do: tag/AM/stream sends are
//!   `send`, puts `write`, gets `read`, atomics `atomic`).
//! - `IBJITTER_QPN=LIST`: by the sending QP's own number (decimal or `0x` hex; on any device).
//! - `IBJITTER_DEST=LIST`: by where the QP is connected: `qpn:N` (the remote QP's number),
//!   an IPv4 or IPv6 address or a GID (RoCE's GID of that address), `lid:N`. Read from
//!   `ibv_modify_qp` as the QP is connected (RC, UC; rdma_cm calls it too): a matching QP
//!   joins a set the post path looks up (by the QP's address: QP numbers repeat across
//!   devices). UD QPs name their destination per work
//!   request (an address handle): they are never selected by destination.
//!
//! A send is delayed when it passes every filter given; the others are counted, not delayed.
//! QPN and destination filters apply to verbs sends only: UCP messages have no QP, and are
//! not delayed while one is given (the startup line says so).
//!
//! The post path reads atomics only: the opcode mask, and with a QP filter a probe of a
//! fixed open-addressing set of QP addresses (no lock, no allocation, no syscall).
use crate::verbs_abi::*;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

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
        if let Some(x) = item(t).map_err(|e| format!("{var}={}: {e}", v.trim()))? {
            out.push(x);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{var}={}: expected a comma-separated list",
            v.trim()
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
            .ok_or_else(|| format!("\"{t}\" is not one of {}", names.join(", ")))
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
            "\"{t}\" is not a QP number (24 bits, decimal or 0x hex)"
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
            .map_err(|_| format!("\"{t}\": a LID is a 16-bit number"));
    }
    match t.strip_prefix("gid:").unwrap_or(t).parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => Ok(Dest::Gid(a.to_ipv6_mapped().octets())),
        Ok(IpAddr::V6(a)) => Ok(Dest::Gid(a.octets())),
        Err(_) => Err(format!(
            "\"{t}\" is not qpn:N, lid:N, an IP address or a GID"
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

/// Selected opcodes (bits of `ibv_wr_opcode`); all while no `IBJITTER_OPS`.
static OPCODES: AtomicU32 = AtomicU32::new(u32::MAX);
/// Selected UCP classes; all while no `IBJITTER_OPS`. No UCP message is selected while QPs
/// are filtered.
static UCP_CLASSES: AtomicU32 = AtomicU32::new(u32::MAX);
/// QPs are filtered: by the static list alone ([`QPNS`]), or by the set ([`SET`]) when a
/// destination filter fills it.
static BY_QP: AtomicBool = AtomicBool::new(false);
static BY_DEST: AtomicBool = AtomicBool::new(false);
static QPNS: OnceLock<Vec<u32>> = OnceLock::new();
static DESTS: OnceLock<Vec<Dest>> = OnceLock::new();

/// The QPs connected to a selected destination, by address: open addressing (0 free,
/// [`GONE`] removed). A full set says so once.
const SET_SLOTS: usize = 1 << 14;
const GONE: usize = 1;
static SET: [AtomicUsize; SET_SLOTS] = [const { AtomicUsize::new(0) }; SET_SLOTS];

fn slots_of(key: usize) -> impl Iterator<Item = usize> {
    crate::patch::probe(key, SET_SLOTS)
}

fn set_contains(key: usize) -> bool {
    for i in slots_of(key).take(64) {
        match SET[i].load(Acquire) {
            0 => return false,
            k if k == key => return true,
            _ => {}
        }
    }
    false
}

fn set_insert(key: usize) {
    if set_contains(key) {
        return;
    }
    for i in slots_of(key).take(64) {
        let cur = SET[i].load(Acquire);
        if (cur == 0 || cur == GONE) && SET[i].compare_exchange(cur, key, AcqRel, Acquire).is_ok() {
            return;
        }
    }
    crate::say::warn_once("IBJITTER_DEST: too many selected QPs; later ones are not delayed");
}

fn set_remove(key: usize) {
    for i in slots_of(key).take(64) {
        match SET[i].load(Acquire) {
            0 => return,
            k if k == key => {
                SET[i].store(GONE, Release);
                return;
            }
            _ => {}
        }
    }
}

/// Activates `sel` (at load, before any post). Returns whether anything is filtered.
pub fn activate(sel: &Selection) -> bool {
    let ops = sel.ops.unwrap_or(SEND | WRITE | READ | ATOMIC);
    OPCODES.store(
        if sel.ops.is_some() {
            opcodes(ops)
        } else {
            u32::MAX
        },
        Release,
    );
    UCP_CLASSES.store(if sel.by_qp() { 0 } else { u32::from(ops) }, Release);
    if let Some(q) = &sel.qpns {
        let _ = QPNS.set(q.clone());
    }
    if let Some(d) = &sel.dests {
        let _ = DESTS.set(d.clone());
    }
    BY_DEST.store(sel.dests.is_some(), Release);
    BY_QP.store(sel.by_qp(), Release);
    sel.any()
}

fn in_static_list(qpn: u32) -> bool {
    QPNS.get().is_none_or(|l| l.contains(&qpn))
}

/// Whether a send on `qp` is selected (ops aside).
///
/// # Safety
/// `qp` a live QP.
#[inline]
pub unsafe fn qp_selected(qp: *const ibv_qp) -> bool {
    if !BY_QP.load(Relaxed) {
        return true;
    }
    if BY_DEST.load(Relaxed) {
        set_contains(qp as usize)
    } else {
        in_static_list((*qp).qp_num)
    }
}

/// Whether an `ibv_post_send` call is selected: its QP, and any of its work requests'
/// opcodes.
///
/// # Safety
/// `qp` a live QP, `wr` null or the application's list (read only).
#[inline(never)]
pub unsafe fn post_selected(qp: *mut ibv_qp, wr: *const ibv_send_wr) -> bool {
    if !qp_selected(qp) {
        return false;
    }
    let ops = OPCODES.load(Relaxed);
    if ops == u32::MAX {
        return true;
    }
    let mut cur = wr;
    while !cur.is_null() {
        if opcode_selected_with(ops, (*cur).opcode) {
            return true;
        }
        cur = (*cur).next;
    }
    false
}

fn opcode_selected_with(ops: u32, opcode: ibv_wr_opcode) -> bool {
    opcode < 32 && ops & (1 << opcode) != 0
}

/// Whether a work request of `opcode` is selected by `IBJITTER_OPS`.
#[inline]
pub fn opcode_selected(opcode: ibv_wr_opcode) -> bool {
    opcode_selected_with(OPCODES.load(Relaxed), opcode)
}

/// Whether the opcode filter is on (the `ibv_wr_*` API then learns the opcode in the
/// work-request calls, see [`crate::wr_ops`]).
pub fn by_opcode() -> bool {
    OPCODES.load(Relaxed) != u32::MAX
}

/// Whether a UCP call of `class` ([`SEND`], ...) is selected.
#[inline]
pub fn ucp_selected(class: u8) -> bool {
    UCP_CLASSES.load(Relaxed) & u32::from(class) != 0
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

/// After a successful `ibv_modify_qp`: a QP given its destination (`IBV_QP_DEST_QPN`,
/// `IBV_QP_AV`) joins or leaves the selected set.
///
/// # Safety
/// `qp` a live QP, `attr` the attributes just applied with `mask`.
pub unsafe fn qp_modified(qp: *mut ibv_qp, attr: *const ibv_qp_attr, mask: i32) {
    if !BY_DEST.load(Acquire) || qp.is_null() || attr.is_null() {
        return;
    }
    let mask = mask as u32;
    let (dest_qpn, av) = (
        mask & ibv_qp_attr_mask_IBV_QP_DEST_QPN != 0,
        mask & ibv_qp_attr_mask_IBV_QP_AV != 0,
    );
    if !dest_qpn && !av {
        return;
    }
    let a = &*attr;
    let hit = DESTS.get().is_some_and(|ds| {
        ds.iter().any(|d| match *d {
            Dest::Qpn(n) => dest_qpn && a.dest_qp_num == n,
            Dest::Gid(g) => av && a.ah_attr.is_global != 0 && a.ah_attr.grh.dgid.raw == g,
            Dest::Lid(l) => av && a.ah_attr.dlid == l,
        })
    });
    if hit && in_static_list((*qp).qp_num) {
        set_insert(qp as usize);
    } else {
        set_remove(qp as usize);
    }
}

/// Before `ibv_destroy_qp`: its number may come back for another QP.
///
/// # Safety
/// `qp` null or a live QP.
pub unsafe fn qp_destroyed(qp: *mut ibv_qp) {
    if BY_DEST.load(Acquire) && !qp.is_null() {
        set_remove(qp as usize);
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
        assert!(opcode_selected_with(
            w,
            ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM
        ));
        assert!(!opcode_selected_with(w, ibv_wr_opcode_IBV_WR_SEND));
        assert!(!opcode_selected_with(w, 40));
        assert_eq!(ucp_class("ucp_put_nbx"), WRITE);
        assert_eq!(ucp_class("ucp_get_nbi"), READ);
        assert_eq!(ucp_class("ucp_atomic_add64"), ATOMIC);
        assert_eq!(ucp_class("ucp_tag_send_nbx"), SEND);
    }

    #[test]
    fn the_set_finds_inserts_and_forgets() {
        let (a, b, c) = (
            0x7f00_0000_1000,
            0x7f00_0000_1000 + (SET_SLOTS << 40),
            0x5000,
        );
        for q in [a, b, c] {
            set_insert(q);
        }
        assert!(set_contains(a) && set_contains(b) && set_contains(c));
        set_remove(a);
        assert!(!set_contains(a) && set_contains(b));
        set_insert(a);
        assert!(set_contains(a));
    }
}

//! Frame decoding down to the InfiniBand transport: Ethernet (VLAN tags, RoCEv1 ethertype
//! 0x8915), IPv4/IPv6 + UDP 4791 (RoCEv2), native InfiniBand (LRH, GRH), ibdump's ERF records,
//! then the BTH and, where the opcode carries one, the AETH.
//!
//! Header layouts follow the InfiniBand Architecture Specification vol. 1 (chapter 9) and its
//! RoCEv2 annex A17. Every read is bounds-checked: any byte string decodes to a packet, to "not
//! RoCE", or to an error, never a panic (see the `pcap_decode` fuzz target).
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// UDP destination port of RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const ETHERTYPE_ROCE_V1: u16 = 0x8915;
/// IEEE 802.3 MAC control: PAUSE (opcode 0x0001) and priority flow control (0x0101).
const ETHERTYPE_MAC_CONTROL: u16 = 0x8808;
const MAC_CONTROL_PAUSE: u16 = 0x0001;
const MAC_CONTROL_PFC: u16 = 0x0101;
const IP_PROTO_UDP: u8 = 17;
/// GRH next-header value announcing an IBA transport header (the BTH).
const GRH_NEXT_IBA: u8 = 0x1b;
const BTH_LEN: usize = 12;
const ICRC_LEN: usize = 4;
const GRH_LEN: usize = 40;
const LRH_LEN: usize = 8;
const ERF_HEADER_LEN: usize = 16;

/// The capture link types this decoder understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// LINKTYPE_ETHERNET (1): tcpdump on a RoCE interface, or ibdump on a RoCE port.
    Ethernet,
    /// LINKTYPE_INFINIBAND (247): frames starting with the LRH.
    Infiniband,
    /// LINKTYPE_ERF (197): what ibdump writes for InfiniBand ports (ERF type 21 records).
    Erf,
}

impl Link {
    /// The link for a pcap link-type number, or a message saying why it cannot be read.
    pub fn from_linktype(linktype: i32) -> Result<Link, String> {
        match linktype {
            1 => Ok(Link::Ethernet),
            247 => Ok(Link::Infiniband),
            197 => Ok(Link::Erf),
            other => Err(format!(
                "link type {other}{} is not Ethernet or InfiniBand (RoCE needs Ethernet \
                 frames: capture with tcpdump -i <interface>, not -i any)",
                linktype_name(other)
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            )),
        }
    }
}

/// Names of link types people are likely to feed in by mistake.
fn linktype_name(linktype: i32) -> Option<&'static str> {
    Some(match linktype {
        0 => "BSD loopback",
        101 => "raw IP",
        105 => "802.11",
        113 => "Linux cooked",
        127 => "802.11 radiotap",
        228 => "raw IPv4",
        229 => "raw IPv6",
        276 => "Linux cooked v2",
        _ => return None,
    })
}

/// A packet endpoint: an IP address for RoCE (a GID is an IPv6 address), a LID for native
/// InfiniBand packets without a GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Lid(u16),
}

impl Addr {
    /// GIDs that are IPv4-mapped (::ffff:a.b.c.d, RoCEv2's IPv4 GIDs) read as IPv4.
    fn from_gid(gid: [u8; 16]) -> Addr {
        let v6 = Ipv6Addr::from(gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => Addr::V4(v4),
            None => Addr::V6(v6),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::V4(a) => write!(f, "{a}"),
            Addr::V6(a) => write!(f, "{a}"),
            Addr::Lid(l) => write!(f, "lid:{l}"),
        }
    }
}

/// The Base Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub solicited: bool,
    pub pad: u8,
    pub pkey: u16,
    /// Explicit congestion notification (IB FECN bit; RoCE marks ECN in the IP header instead).
    pub fecn: bool,
    /// Backward explicit congestion notification (IB BECN bit).
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

/// The ACK Extended Transport Header: ACK, RNR NAK or NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    pub syndrome: u8,
    pub msn: u32,
}

/// What an AETH syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    Ack,
    RnrNak,
    /// NAK with its code: 0 PSN sequence error, 1 invalid request, 2 remote access error,
    /// 3 remote operational error, 4 invalid RD request.
    Nak(u8),
    Reserved,
}

impl Aeth {
    pub fn kind(&self) -> AckKind {
        match self.syndrome >> 5 {
            0 => AckKind::Ack,
            1 => AckKind::RnrNak,
            3 => AckKind::Nak(self.syndrome & 0x1f),
            _ => AckKind::Reserved,
        }
    }
}

/// One decoded RoCE / InfiniBand transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: Addr,
    pub dst: Addr,
    pub bth: Bth,
    pub aeth: Option<Aeth>,
    /// Application payload: the transport length minus BTH, extended headers, pad and ICRC
    /// (what a WRITE moves; 0 for ACKs). `None` for opcodes whose headers are not known here.
    pub payload: Option<u32>,
    /// The IP header's ECN field (RoCEv2): 0 not ECN-capable, 1 ECT(1), 2 ECT(0), 3 CE
    /// (congestion experienced: marked by a switch). `None` without an IP header.
    pub ecn: Option<u8>,
}

/// ECN codepoint "congestion experienced".
pub const ECN_CE: u8 = 3;

/// An Ethernet MAC control frame: link-level flow control, which RoCE fabrics use to be
/// lossless (PFC per priority; PAUSE for the whole link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkControl {
    /// The sending port's MAC address.
    pub src_mac: [u8; 6],
    pub kind: LinkControlKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkControlKind {
    /// 802.3x PAUSE: stop sending for `quanta` × 512 bit times (0: resume).
    Pause { quanta: u16 },
    /// 802.1Qbb PFC: for each priority whose bit is set in `enabled`, pause for its quanta
    /// (0: resume that priority).
    Pfc { enabled: u8, quanta: [u16; 8] },
}

/// Decodes an Ethernet MAC control frame (PAUSE or PFC); `None` for anything else, other
/// links and other MAC control opcodes.
pub fn link_control(link: Link, frame: &[u8]) -> Option<LinkControl> {
    if link != Link::Ethernet {
        return None;
    }
    let h = frame.get(..16)?;
    if u16::from_be_bytes([h[12], h[13]]) != ETHERTYPE_MAC_CONTROL {
        return None;
    }
    let mut src_mac = [0u8; 6];
    src_mac.copy_from_slice(&h[6..12]);
    let kind = match u16::from_be_bytes([h[14], h[15]]) {
        MAC_CONTROL_PAUSE => {
            let q = frame.get(16..18)?;
            LinkControlKind::Pause {
                quanta: u16::from_be_bytes([q[0], q[1]]),
            }
        }
        MAC_CONTROL_PFC => {
            let b = frame.get(16..34)?;
            let mut quanta = [0u16; 8];
            for (k, q) in quanta.iter_mut().enumerate() {
                *q = u16::from_be_bytes([b[2 + 2 * k], b[3 + 2 * k]]);
            }
            LinkControlKind::Pfc {
                enabled: b[1],
                quanta,
            }
        }
        _ => return None,
    };
    Some(LinkControl { src_mac, kind })
}

/// Why a frame that looked like RoCE / InfiniBand could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The captured bytes end inside a header (a short snaplen, or a truncated record).
    Truncated { header: &'static str },
    /// A length field contradicts the headers it covers.
    BadLength { header: &'static str },
    /// An ERF record of a type other than InfiniBand or Ethernet.
    ErfType(u8),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { header } => {
                write!(f, "captured bytes end inside the {header}")
            }
            DecodeError::BadLength { header } => write!(f, "inconsistent length in the {header}"),
            DecodeError::ErfType(t) => {
                write!(f, "ERF record type {t} is not InfiniBand or Ethernet")
            }
        }
    }
}

/// Decodes one captured frame: `Ok(None)` for traffic that is not RoCE / IBA transport (ARP,
/// TCP, other UDP, raw IB packets).
pub fn decode(link: Link, frame: &[u8]) -> Result<Option<Packet>, DecodeError> {
    match link {
        Link::Ethernet => ethernet(frame),
        Link::Infiniband => infiniband(frame),
        Link::Erf => erf(frame),
    }
}

fn get<'a>(
    b: &'a [u8],
    at: usize,
    len: usize,
    header: &'static str,
) -> Result<&'a [u8], DecodeError> {
    b.get(
        at..at
            .checked_add(len)
            .ok_or(DecodeError::Truncated { header })?,
    )
    .ok_or(DecodeError::Truncated { header })
}

fn be16(b: &[u8], at: usize, header: &'static str) -> Result<u16, DecodeError> {
    let s = get(b, at, 2, header)?;
    Ok(u16::from_be_bytes([s[0], s[1]]))
}

fn gid(b: &[u8]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[..16]);
    g
}

fn ethernet(f: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let mut at = 12;
    let mut ethertype = be16(f, at, "Ethernet header")?;
    at += 2;
    while ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
        ethertype = be16(f, at + 2, "VLAN tag")?;
        at += 4;
    }
    let l3 = &f[at..];
    match ethertype {
        ETHERTYPE_IPV4 => ipv4(l3),
        ETHERTYPE_IPV6 => ipv6(l3),
        ETHERTYPE_ROCE_V1 => {
            // RoCEv1: a GRH directly in Ethernet; its payload length covers BTH..ICRC.
            let g = get(l3, 0, GRH_LEN, "GRH")?;
            if g[6] != GRH_NEXT_IBA {
                return Ok(None);
            }
            let len = u16::from_be_bytes([g[4], g[5]]) as usize;
            let (src, dst) = (Addr::from_gid(gid(&g[8..])), Addr::from_gid(gid(&g[24..])));
            transport(&l3[GRH_LEN..], len, src, dst).map(Some)
        }
        _ => Ok(None),
    }
}

fn ipv4(p: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let h = get(p, 0, 20, "IPv4 header")?;
    if h[0] >> 4 != 4 {
        return Err(DecodeError::BadLength {
            header: "IPv4 header",
        });
    }
    let ihl = (h[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([h[2], h[3]]) as usize;
    let frag = u16::from_be_bytes([h[6], h[7]]);
    if h[9] != IP_PROTO_UDP {
        return Ok(None);
    }
    // A fragment (offset set, or more-fragments) carries no complete UDP datagram to decode.
    if frag & 0x3fff != 0 {
        return Ok(None);
    }
    if ihl < 20 || total < ihl {
        return Err(DecodeError::BadLength {
            header: "IPv4 header",
        });
    }
    let src = Addr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
    let dst = Addr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
    let rest = p.get(ihl..).ok_or(DecodeError::Truncated {
        header: "IPv4 options",
    })?;
    let ecn = h[1] & 0x3;
    udp(rest, Some(total - ihl), src, dst).map(|p| {
        p.map(|p| Packet {
            ecn: Some(ecn),
            ..p
        })
    })
}

fn ipv6(p: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let h = get(p, 0, 40, "IPv6 header")?;
    let mut next = h[6];
    let mut len = u16::from_be_bytes([h[4], h[5]]) as usize;
    let src = Addr::from_gid(gid(&h[8..]));
    let dst = Addr::from_gid(gid(&h[24..]));
    let mut at = 40;
    // Hop-by-hop, routing and destination options may precede UDP.
    while matches!(next, 0 | 43 | 60) {
        let e = get(p, at, 2, "IPv6 extension header")?;
        let elen = (e[1] as usize + 1) * 8;
        next = e[0];
        at += elen;
        len = len.checked_sub(elen).ok_or(DecodeError::BadLength {
            header: "IPv6 header",
        })?;
    }
    if next != IP_PROTO_UDP {
        return Ok(None);
    }
    let rest = p.get(at..).ok_or(DecodeError::Truncated {
        header: "IPv6 extension header",
    })?;
    // Traffic class: the low nibble of byte 0 and the high nibble of byte 1; ECN its low 2 bits.
    let ecn = (h[1] >> 4) & 0x3;
    udp(rest, Some(len), src, dst).map(|p| {
        p.map(|p| Packet {
            ecn: Some(ecn),
            ..p
        })
    })
}

fn udp(
    u: &[u8],
    ip_payload: Option<usize>,
    src: Addr,
    dst: Addr,
) -> Result<Option<Packet>, DecodeError> {
    let h = get(u, 0, 8, "UDP header")?;
    if u16::from_be_bytes([h[2], h[3]]) != ROCE_V2_PORT {
        return Ok(None);
    }
    let len = u16::from_be_bytes([h[4], h[5]]) as usize;
    if len < 8 || ip_payload.is_some_and(|p| len > p) {
        return Err(DecodeError::BadLength {
            header: "UDP header",
        });
    }
    transport(&u[8..], len - 8, src, dst).map(Some)
}

fn infiniband(f: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let lrh = get(f, 0, LRH_LEN, "LRH")?;
    let lnh = lrh[1] & 0x3;
    // PktLen counts 4-byte words from the LRH through the ICRC (the VCRC excluded).
    let pkt_len = (u16::from_be_bytes([lrh[4], lrh[5]]) & 0x07ff) as usize * 4;
    let dlid = u16::from_be_bytes([lrh[2], lrh[3]]);
    let slid = u16::from_be_bytes([lrh[6], lrh[7]]);
    match lnh {
        // IBA local: the BTH follows the LRH.
        0b10 => {
            let len = pkt_len
                .checked_sub(LRH_LEN)
                .ok_or(DecodeError::BadLength { header: "LRH" })?;
            transport(&f[LRH_LEN..], len, Addr::Lid(slid), Addr::Lid(dlid)).map(Some)
        }
        // IBA global: a GRH, then the BTH.
        0b11 => {
            let g = get(f, LRH_LEN, GRH_LEN, "GRH")?;
            if g[6] != GRH_NEXT_IBA {
                return Ok(None);
            }
            let len = pkt_len
                .checked_sub(LRH_LEN + GRH_LEN)
                .ok_or(DecodeError::BadLength { header: "LRH" })?;
            let (src, dst) = (Addr::from_gid(gid(&g[8..])), Addr::from_gid(gid(&g[24..])));
            transport(&f[LRH_LEN + GRH_LEN..], len, src, dst).map(Some)
        }
        // Raw packets (IPv6 or ethertype payloads) carry no IBA transport.
        _ => Ok(None),
    }
}

fn erf(f: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let h = get(f, 0, ERF_HEADER_LEN, "ERF header")?;
    let mut at = ERF_HEADER_LEN;
    // Extension headers (type bit 7) chain 8-byte records while their own bit 7 is set.
    if h[8] & 0x80 != 0 {
        loop {
            let e = get(f, at, 8, "ERF extension header")?;
            at += 8;
            if e[0] & 0x80 == 0 {
                break;
            }
        }
    }
    match h[8] & 0x7f {
        21 => infiniband(&f[at..]),
        // ERF Ethernet records put a 2-byte offset/pad before the frame.
        2 => ethernet(f.get(at + 2..).ok_or(DecodeError::Truncated {
            header: "ERF header",
        })?),
        t => Err(DecodeError::ErfType(t)),
    }
}

/// Decodes BTH (and AETH) from `t`, which starts at the BTH; `len` is the transport length
/// (BTH through ICRC) from the enclosing header, which holds even when the capture was cut short.
fn transport(t: &[u8], len: usize, src: Addr, dst: Addr) -> Result<Packet, DecodeError> {
    let b = get(t, 0, BTH_LEN, "BTH")?;
    let opcode = b[0];
    let bth = Bth {
        opcode,
        solicited: b[1] & 0x80 != 0,
        pad: (b[1] >> 4) & 0x3,
        pkey: u16::from_be_bytes([b[2], b[3]]),
        fecn: b[4] & 0x80 != 0,
        becn: b[4] & 0x40 != 0,
        dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        ack_req: b[8] & 0x80 != 0,
        psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
    };
    let layout = opcode_layout(opcode);
    let aeth = match layout.and_then(|l| l.aeth_at) {
        Some(off) => {
            let a = get(t, BTH_LEN + off, 4, "AETH")?;
            Some(Aeth {
                syndrome: a[0],
                msn: u32::from_be_bytes([0, a[1], a[2], a[3]]),
            })
        }
        None => None,
    };
    let payload = match layout {
        Some(l) => Some(
            len.checked_sub(BTH_LEN + l.ext_len + bth.pad as usize + ICRC_LEN)
                .ok_or(DecodeError::BadLength { header: "BTH" })? as u32,
        ),
        None => None,
    };
    Ok(Packet {
        src,
        dst,
        bth,
        aeth,
        payload,
        ecn: None,
    })
}

/// Where an opcode's extended headers are: their total length after the BTH, and the AETH's
/// offset within them if there is one.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ext_len: usize,
    aeth_at: Option<usize>,
}

const RETH: usize = 16;
const IMM: usize = 4;
const AETH: usize = 4;
const DETH: usize = 8;
const XRCETH: usize = 4;

fn opcode_layout(opcode: u8) -> Option<Layout> {
    let (transport, op) = (opcode >> 5, opcode & 0x1f);
    let plain = |ext_len| {
        Some(Layout {
            ext_len,
            aeth_at: None,
        })
    };
    if opcode == CNP {
        // RoCEv2 CNP: 16 reserved bytes, no payload.
        return plain(16);
    }
    let rc_like = |op: u8| -> Option<Layout> {
        match op {
            0x00 | 0x01 | 0x02 | 0x04 | 0x07 | 0x08 | 0x0e => plain(0),
            0x03 | 0x05 | 0x09 => plain(IMM),
            0x06 | 0x0a | 0x0c => plain(RETH),
            0x0b => plain(RETH + IMM),
            0x0d | 0x0f | 0x10 | 0x11 => Some(Layout {
                ext_len: AETH,
                aeth_at: Some(0),
            }),
            // Atomic ACK: AETH + AtomicAckETH.
            0x12 => Some(Layout {
                ext_len: AETH + 8,
                aeth_at: Some(0),
            }),
            // Compare & swap, fetch & add: AtomicETH.
            0x13 | 0x14 => plain(28),
            // SEND with invalidate: IETH.
            0x16 | 0x17 => plain(4),
            _ => None,
        }
    };
    match transport {
        // RC, and UC (which uses a subset of the same opcodes).
        0 | 1 => rc_like(op),
        // UD: DETH, then ImmDt for SEND Only with Immediate.
        3 => match op {
            0x04 => plain(DETH),
            0x05 => plain(DETH + IMM),
            _ => None,
        },
        // XRC: requests carry an XRCETH before the RC extended headers; responses do not.
        5 => rc_like(op).map(|l| {
            if is_response(opcode) {
                l
            } else {
                Layout {
                    ext_len: l.ext_len + XRCETH,
                    aeth_at: l.aeth_at.map(|a| a + XRCETH),
                }
            }
        }),
        // RD (RDETH + DETH) is not implemented by any current HCA; counted, not decoded.
        _ => None,
    }
}

/// The RoCEv2 congestion notification packet's opcode.
pub const CNP: u8 = 0x81;

/// Responder-to-requester opcodes (READ responses, ACKs): their PSNs echo the requests'.
pub fn is_response(opcode: u8) -> bool {
    matches!(opcode & 0x1f, 0x0d..=0x12) && matches!(opcode >> 5, 0 | 1 | 5)
}

/// An RDMA READ request: it consumes one PSN per response packet, so the requester's next PSN
/// jumps by the response length.
pub fn is_read_request(opcode: u8) -> bool {
    opcode & 0x1f == 0x0c && matches!(opcode >> 5, 0 | 5)
}

/// The opcode's name, as in the specification's table (`RC RDMA WRITE Only`).
pub fn opcode_name(opcode: u8) -> String {
    if opcode == CNP {
        return "CNP".into();
    }
    let transport = match opcode >> 5 {
        0 => "RC",
        1 => "UC",
        2 => "RD",
        3 => "UD",
        5 => "XRC",
        _ => return format!("opcode 0x{opcode:02x}"),
    };
    let op = match opcode & 0x1f {
        0x00 => "SEND First",
        0x01 => "SEND Middle",
        0x02 => "SEND Last",
        0x03 => "SEND Last with Immediate",
        0x04 => "SEND Only",
        0x05 => "SEND Only with Immediate",
        0x06 => "RDMA WRITE First",
        0x07 => "RDMA WRITE Middle",
        0x08 => "RDMA WRITE Last",
        0x09 => "RDMA WRITE Last with Immediate",
        0x0a => "RDMA WRITE Only",
        0x0b => "RDMA WRITE Only with Immediate",
        0x0c => "RDMA READ Request",
        0x0d => "RDMA READ Response First",
        0x0e => "RDMA READ Response Middle",
        0x0f => "RDMA READ Response Last",
        0x10 => "RDMA READ Response Only",
        0x11 => "Acknowledge",
        0x12 => "ATOMIC Acknowledge",
        0x13 => "CmpSwap",
        0x14 => "FetchAdd",
        0x16 => "SEND Last with Invalidate",
        0x17 => "SEND Only with Invalidate",
        _ => return format!("{transport} opcode 0x{opcode:02x}"),
    };
    format!("{transport} {op}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(opcode: u8, qp: u32, psn: u32, ack_req: bool) -> Vec<u8> {
        let mut b = vec![opcode, 0, 0xff, 0xff, 0];
        b.extend_from_slice(&qp.to_be_bytes()[1..]);
        b.push(if ack_req { 0x80 } else { 0 });
        b.extend_from_slice(&psn.to_be_bytes()[1..]);
        b
    }

    #[test]
    fn native_ib_local_route_write_first() {
        // LRH (LNH = IBA local), BTH, RETH, 256 bytes payload, ICRC; PktLen in words.
        let total = LRH_LEN + BTH_LEN + RETH + 256 + ICRC_LEN;
        let mut f = vec![0x00, 0x02, 0x00, 0x05];
        f.extend_from_slice(&((total / 4) as u16).to_be_bytes());
        f.extend_from_slice(&7u16.to_be_bytes());
        f.extend(bth(0x06, 0x11, 42, false));
        f.resize(total, 0);
        let p = decode(Link::Infiniband, &f).unwrap().unwrap();
        assert_eq!((p.src, p.dst), (Addr::Lid(7), Addr::Lid(5)));
        assert_eq!((p.bth.dest_qp, p.bth.psn, p.payload), (0x11, 42, Some(256)));
        // A PktLen shorter than the headers it covers is an error, not a wrap-around.
        f[5] = 2;
        assert_eq!(
            decode(Link::Infiniband, &f),
            Err(DecodeError::BadLength { header: "BTH" })
        );
    }

    /// Ethernet + IPv4 (TOS `tos`) + UDP 4791 + an ACK-less RDMA WRITE Only of 8 bytes.
    fn roce_v4(tos: u8) -> Vec<u8> {
        let mut t = bth(0x0a, 7, 1, false);
        t.resize(BTH_LEN + RETH + 8 + ICRC_LEN, 0);
        let mut f = vec![0; 12];
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let total = (20 + 8 + t.len()) as u16;
        f.extend_from_slice(&[0x45, tos]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[
            0,
            0,
            0x40,
            0,
            64,
            IP_PROTO_UDP,
            0,
            0,
            10,
            0,
            0,
            1,
            10,
            0,
            0,
            2,
        ]);
        f.extend_from_slice(&[0xc0, 0]);
        f.extend_from_slice(&ROCE_V2_PORT.to_be_bytes());
        f.extend_from_slice(&((8 + t.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend(t);
        f
    }

    #[test]
    fn the_ip_ecn_field_and_mac_control_frames() {
        for (tos, ecn) in [(0x00, 0), (0x02, 2), (0x03, ECN_CE), (0xb9, 1)] {
            let p = decode(Link::Ethernet, &roce_v4(tos)).unwrap().unwrap();
            assert_eq!(p.ecn, Some(ecn), "tos {tos:#x}");
            assert_eq!(p.payload, Some(8));
        }
        // PAUSE from 02:..:07, quanta 0x1234; PFC pausing priorities 0 and 3.
        let mut pause = vec![
            0x01, 0x80, 0xc2, 0, 0, 0x01, 2, 0, 0, 0, 0, 7, 0x88, 0x08, 0, 1, 0x12, 0x34,
        ];
        pause.resize(60, 0);
        assert_eq!(decode(Link::Ethernet, &pause), Ok(None));
        let c = link_control(Link::Ethernet, &pause).unwrap();
        assert_eq!(c.src_mac, [2, 0, 0, 0, 0, 7]);
        assert_eq!(c.kind, LinkControlKind::Pause { quanta: 0x1234 });
        let mut pfc = pause[..14].to_vec();
        pfc.extend_from_slice(&[0x01, 0x01, 0, 0b1001, 0, 5, 0, 0, 0, 0, 0, 9]);
        pfc.resize(60, 0);
        match link_control(Link::Ethernet, &pfc).unwrap().kind {
            LinkControlKind::Pfc { enabled, quanta } => {
                assert_eq!(enabled, 0b1001);
                assert_eq!((quanta[0], quanta[2], quanta[3]), (5, 0, 9));
            }
            other => panic!("{other:?}"),
        }
        // Short frames and other links are not flow control.
        assert_eq!(link_control(Link::Ethernet, &pfc[..20]), None);
        assert_eq!(link_control(Link::Infiniband, &pfc), None);
    }

    #[test]
    fn aeth_syndromes() {
        let a = |s| {
            Aeth {
                syndrome: s,
                msn: 0,
            }
            .kind()
        };
        assert_eq!(a(0x1f), AckKind::Ack);
        assert_eq!(a(0x20), AckKind::RnrNak);
        assert_eq!(a(0x60), AckKind::Nak(0));
        assert_eq!(a(0x63), AckKind::Nak(3));
    }

    #[test]
    fn opcode_names_and_classes() {
        assert_eq!(opcode_name(0x0a), "RC RDMA WRITE Only");
        assert_eq!(opcode_name(0x11), "RC Acknowledge");
        assert_eq!(opcode_name(0x64), "UD SEND Only");
        assert_eq!(opcode_name(0x81), "CNP");
        assert!(is_response(0x11) && is_response(0x10) && !is_response(0x0a));
        assert!(is_read_request(0x0c) && !is_read_request(0x0d));
    }

    #[test]
    fn unsupported_link_types_are_named() {
        let e = Link::from_linktype(113).unwrap_err();
        assert!(
            e.starts_with("link type 113 (Linux cooked) is not Ethernet or InfiniBand"),
            "{e}"
        );
        assert!(Link::from_linktype(4242)
            .unwrap_err()
            .starts_with("link type 4242 is not"));
    }
}

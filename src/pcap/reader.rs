//! Streaming pcap / pcapng reading (through `pcap-parser`): packets are handed to a callback
//! one at a time out of a fixed buffer, so a multi-GB capture is read in bounded memory. A
//! capture cut off mid-record (tcpdump killed, disk full) ends the stream with a note, not an
//! error.
use super::decode::Link;
use pcap_parser::pcapng::Block;
use pcap_parser::{create_reader, PcapBlockOwned, PcapError};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Initial read buffer (also the read size); grown (up to [`MAX_BUFFER`]) only for a record
/// larger than it. Jumbo frames fit; larger buffers only cost set-up time on small files.
const BUFFER: usize = 1 << 16;
/// No sane capture record is larger than this (pcapng blocks are limited to 16 MiB in practice).
const MAX_BUFFER: usize = 256 << 20;

/// One captured frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Capture timestamp in ns since the epoch (pcap µs or ns, pcapng at any `if_tsresol`).
    pub ts_ns: u64,
    pub link: Link,
    /// The captured bytes (at most the snap length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
}

/// How a read ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadSummary {
    /// Records read (packets, whatever their protocol).
    pub frames: u64,
    pub format: &'static str,
    /// Set when the file ends inside a record: what was left, at which byte offset.
    pub truncated: Option<String>,
}

/// Timestamp decoding for one pcapng interface.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link: Link,
    /// Timestamp units per second.
    resolution: u64,
    offset_s: i64,
}

/// Reads `path` and calls `f` for each frame. Errors name the file and say what was wrong:
/// not a capture, an unsupported link type, a corrupt record.
pub fn for_each_frame<F>(path: &Path, f: F) -> Result<ReadSummary, String>
where
    F: FnMut(Frame<'_>),
{
    let name = path.display();
    let file = File::open(path).map_err(|e| format!("{name}: {e}"))?;
    // No BufReader: the parser reads whole buffers itself.
    read_frames(file, f).map_err(|e| format!("{name}: {e}"))
}

/// [`for_each_frame`] over any reader (tests, fuzzing); errors without the file name.
pub fn read_frames<R, F>(input: R, mut f: F) -> Result<ReadSummary, String>
where
    R: Read + Send,
    F: FnMut(Frame<'_>),
{
    let mut reader = match create_reader(BUFFER, input) {
        Ok(r) => r,
        Err(PcapError::Eof) => return Err("empty file (not a pcap or pcapng capture)".into()),
        Err(PcapError::ReadError) => return Err("read error".into()),
        Err(_) => return Err("not a pcap or pcapng capture (unrecognised file header)".into()),
    };
    let mut summary = ReadSummary::default();
    // Legacy pcap: one link type and resolution for the file. pcapng: per interface, in the
    // order of the interface description blocks of the current section.
    let mut legacy: Option<(Link, u64)> = None;
    let mut interfaces: Vec<Result<Interface, String>> = Vec::new();
    let mut capacity = BUFFER;
    loop {
        let offset = reader.consumed();
        match reader.next() {
            Ok((len, block)) => {
                match block {
                    PcapBlockOwned::LegacyHeader(h) => {
                        summary.format = "pcap";
                        let link = Link::from_linktype(h.network.0)?;
                        let res = if h.is_nanosecond_precision() {
                            1_000_000_000
                        } else {
                            1_000_000
                        };
                        legacy = Some((link, res));
                    }
                    PcapBlockOwned::Legacy(b) => {
                        let (link, res) = legacy.ok_or("pcap record before the file header")?;
                        summary.frames += 1;
                        f(Frame {
                            ts_ns: b.ts_sec as u64 * 1_000_000_000
                                + b.ts_usec as u64 * (1_000_000_000 / res),
                            link,
                            data: b.data,
                            orig_len: b.origlen,
                        });
                    }
                    PcapBlockOwned::NG(Block::SectionHeader(_)) => {
                        summary.format = "pcapng";
                        interfaces.clear();
                    }
                    PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                        // An unsupported interface is an error only if a packet uses it.
                        let i = Link::from_linktype(idb.linktype.0).and_then(|link| {
                            let resolution = idb
                                .ts_resolution()
                                .filter(|&r| r > 0)
                                .ok_or_else(|| format!("bad if_tsresol {}", idb.if_tsresol))?;
                            Ok(Interface {
                                link,
                                resolution,
                                offset_s: idb.ts_offset(),
                            })
                        });
                        interfaces.push(i);
                    }
                    PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                        let i = match interfaces.get(epb.if_id as usize) {
                            Some(Ok(i)) => *i,
                            Some(Err(e)) => {
                                return Err(format!("interface {}: {e}", epb.if_id));
                            }
                            None => {
                                return Err(format!(
                                    "packet at byte {offset} names interface {}, which is not described",
                                    epb.if_id
                                ))
                            }
                        };
                        summary.frames += 1;
                        let ticks = ((epb.ts_high as u64) << 32) | epb.ts_low as u64;
                        let ns = ticks as u128 * 1_000_000_000 / i.resolution as u128;
                        let ns = (ns as i128 + i.offset_s as i128 * 1_000_000_000).max(0);
                        f(Frame {
                            ts_ns: ns.min(u64::MAX as i128) as u64,
                            link: i.link,
                            data: epb.data,
                            orig_len: epb.origlen,
                        });
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                        // Simple packet blocks have no timestamp; they only count.
                        let link = match interfaces.first() {
                            Some(Ok(i)) => i.link,
                            _ => {
                                return Err("simple packet block without a usable interface".into())
                            }
                        };
                        summary.frames += 1;
                        f(Frame {
                            ts_ns: 0,
                            link,
                            data: spb.data,
                            orig_len: spb.origlen,
                        });
                    }
                    PcapBlockOwned::NG(_) => {}
                }
                reader.consume(len);
            }
            Err(PcapError::Eof) => break,
            Err(PcapError::UnexpectedEof) => {
                let left = reader.data().len();
                summary.truncated = Some(format!(
                    "the file ends inside a record: {left} bytes at byte offset {offset} ignored"
                ));
                break;
            }
            Err(PcapError::Incomplete(_)) => {
                reader.refill().map_err(|_| "read error")?;
            }
            Err(PcapError::BufferTooSmall) => {
                if capacity >= MAX_BUFFER {
                    return Err(format!(
                        "record at byte offset {offset} is larger than {} MiB",
                        MAX_BUFFER >> 20
                    ));
                }
                capacity *= 2;
                reader.grow(capacity);
                reader.refill().map_err(|_| "read error")?;
            }
            Err(PcapError::ReadError) => return Err("read error".into()),
            Err(PcapError::NomError(_, kind)) => {
                return Err(format!("corrupt record at byte offset {offset} ({kind:?})"))
            }
            Err(_) => return Err(format!("corrupt record at byte offset {offset}")),
        }
    }
    Ok(summary)
}

//! Wire-level analysis of RoCEv2 and InfiniBand captures (`ibjitter pcap`): what the flows
//! really did on the wire, to check the generator and the injector against.
//!
//! - [`reader`]: streaming pcap / pcapng reading, bounded memory, truncated tails reported.
//! - [`decode`]: Ethernet / IP / UDP / LRH / GRH / ERF down to the BTH and AETH.
//! - [`flows`]: per-flow counts, PSN checks (retransmissions, out-of-order), NAKs, series.
//! - [`ipd`]: inter-packet delay tables and histograms.
//! - [`sketch`]: a flow's gaps in bounded memory, for its percentiles.
pub mod decode;
pub mod flows;
pub mod ipd;
pub mod reader;
pub mod sketch;

pub use flows::{Analysis, Analyzer, Flow, FlowKey, Options};

use std::path::Path;

/// Reads and analyses a whole capture file.
pub fn analyze_file(
    path: &Path,
    options: Options,
) -> Result<(Analysis, reader::ReadSummary), String> {
    let mut a = Analyzer::new(options);
    let summary = reader::for_each_frame(path, |f| a.frame(f.ts_ns, f.link, f.data, f.orig_len))?;
    Ok((a.finish(), summary))
}

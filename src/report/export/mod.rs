//! Output formats for a run, one per file: the perftest-style text table, JSON, the per-flow
//! throughput time series (CSV) and the HdrHistogram interval log; `pcap` for `ibjitter pcap`.
pub mod hdrlog;
pub mod json;
pub mod pcap;
pub mod text;
pub mod timeseries;

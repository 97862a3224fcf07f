//! Output formats for a run, one per file: the perftest-style text table, JSON, the per-flow
//! throughput time series (CSV) and the HdrHistogram interval log; `incast` and `pcap` for
//! `ibjitter incast` and `ibjitter pcap`.
pub mod fct;
pub mod hdrlog;
pub mod incast;
pub mod json;
pub mod pairs;
pub mod pcap;
pub mod study;
pub mod table;
pub mod text;
pub mod timeseries;
pub mod tolerance;

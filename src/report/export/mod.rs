//! Output formats for a run, one per file: the perftest-style text table, JSON, the per-flow
//! throughput time series (CSV) and the HdrHistogram interval log.
pub mod hdrlog;
pub mod json;
pub mod text;
pub mod timeseries;

//! What `ibjitter serve` is asked to do.
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub device: Option<String>,
    pub ib_port: u8,
    pub gid_index: Option<i32>,
    /// Also accept flows connected through rdma_cm (`run --cm`), on the same port number in
    /// rdma_cm's own port space.
    pub cm: bool,
    pub bind: String,
    pub port: u16,
    /// Clients that start together (the start barrier's size).
    pub clients: u32,
    /// Exit after one group of clients has finished.
    pub once: bool,
    pub qp_timeout: u8,
    pub setup_timeout: Duration,
    pub start_timeout: Duration,
    /// The launcher releases the start barrier: `ready` on stdout, then a line on stdin.
    pub hold: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            device: None,
            ib_port: 1,
            gid_index: None,
            cm: false,
            bind: "0.0.0.0".into(),
            port: 18515,
            clients: 1,
            once: false,
            qp_timeout: 18,
            setup_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(120),
            hold: false,
        }
    }
}

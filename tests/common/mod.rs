//! Shared helpers for integration tests. Each test file that needs them says `mod common;`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod bench;
pub mod perftest;
pub mod study;

/// Reads a JSON file a test run wrote, failing the test with the path on any error.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

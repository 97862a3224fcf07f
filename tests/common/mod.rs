//! Shared helpers for integration tests. Each test file that needs them says `mod common;`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod bench;
pub mod perftest;

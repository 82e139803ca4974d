//! Pieces the benchmarks share. Each bench includes this dir with
//! `#[path = "support/mod.rs"] mod support;` and uses what it needs.
#![allow(dead_code)]

pub mod alloc;
pub mod cpu;
pub mod end_offsets;
pub mod feeds;
pub mod job;
pub mod kafka;
pub mod outputs;
pub mod producer;
pub mod report;
pub mod stats;
pub mod sustained;
pub mod versus;

/// The test broker's process (start, stop, restart), the same modules the tests use.
#[path = "../../tests/support/broker_process.rs"]
pub mod broker_process;
#[path = "../../tests/support/kafka_process.rs"]
pub mod kafka_process;
#[path = "../../tests/support/tansu_process.rs"]
pub mod tansu_process;
#[path = "../../tests/support/watchdog.rs"]
pub mod watchdog;

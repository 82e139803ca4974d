//! watchbridge: for every record of an input topic, watch an external resource and emit each
//! output not seen before, stamped with its event time. See `docs/architecture.md`.

pub mod avro;
pub mod bridge;
pub mod builder;
pub mod clock;
pub mod config;
pub mod demo;
pub mod engine;
pub mod formats;
pub mod internal_events;
pub mod kafka;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod ops_server;
pub mod poll;
pub mod pollers;
pub mod readiness;
pub mod reason;
pub mod schedule;
pub mod seen;
pub mod state;
pub mod table;
pub mod termination;
pub mod watch;
pub mod watermark;

/// The allocator of the `watchbridge` binary, and of the benchmarks that measure it:
/// mimalloc. The bridge allocates records and headers on its tasks' threads and frees many
/// on librdkafka's; with glibc's malloc about 30% of the end-to-end
/// benchmark's CPU went to malloc and free (`perf`, bench/RESULTS.md). Its `override`
/// feature (Cargo.toml) replaces `malloc` and `free` in the whole process, so librdkafka's
/// own allocations (a message, its header list, each header) use it too: with glibc's, one
/// header per record halved a plain producer's rate (issue 19, `make bench`).
pub use mimalloc::MiMalloc as Allocator;

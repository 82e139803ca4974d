//! watchbridge: for every record of an input topic, watch an external resource and emit each
//! output not seen before, stamped with its event time. See `docs/architecture.md`.
#![deny(missing_docs)]

// The library API (see the guide above): what a bridge is built from.
pub mod builder;
pub mod clock;
pub mod poll;
pub mod pollers;
pub mod reason;
pub mod schedule;
pub mod termination;
pub mod watermark;

pub use bridge::{BridgeError, StopSignal, STOP_MARGIN};
pub use builder::{Bridge, BridgeBuilder};
pub use clock::Millis;
pub use formats::time::TimestampAssigner;
pub use kafka::input::Input;

// The bridge's own parts. Public only for the `watchbridge` binary, the tests and the
// benchmarks, which use them directly; hidden from the documentation and not an API: they
// change without notice.
#[doc(hidden)]
pub mod avro;
#[doc(hidden)]
pub mod bridge;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod demo;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod formats;
#[doc(hidden)]
pub mod internal_events;
#[doc(hidden)]
pub mod kafka;
#[doc(hidden)]
pub mod limits;
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod metrics;
mod ops_server;
mod readiness;
#[doc(hidden)]
pub mod seen;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod table;
#[doc(hidden)]
pub mod watch;

/// The allocator of the `watchbridge` binary, and of the benchmarks that measure it:
/// mimalloc. The bridge allocates records and headers on its tasks' threads and frees many
/// on librdkafka's; with glibc's malloc about 30% of the end-to-end
/// benchmark's CPU went to malloc and free (`perf`, bench/RESULTS.md). Its `override`
/// feature (Cargo.toml) replaces `malloc` and `free` in the whole process, so librdkafka's
/// own allocations (a message, its header list, each header) use it too: with glibc's, one
/// header per record halved a plain producer's rate (issue 19, `make bench`).
pub use mimalloc::MiMalloc as Allocator;

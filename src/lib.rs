//! watchbridge: for every record of an input topic, watch an external resource and emit each
//! output not seen before, stamped with its event time.
//!
//! The `watchbridge` binary runs it configured by environment variables, with a built-in
//! poller (HTTP, files, shards). This library is the same bridge with parts of your own, in
//! Rust: a poller for a resource no built-in one reaches, termination conditions that keep
//! state, a watermark generator, a timestamp assigner. Everything else (Kafka, the state
//! topic that makes watches survive restarts and move between instances, exactly-once
//! outputs, watermarks, metrics, the operations server) is what `watchbridge run` does, and
//! is configured the same way: by the `WATCHBRIDGE_*` and `KAFKA_*` variables of
//! `docs/configuration.md`.
//!
//! # The parts
//!
//! - A **poller** ([`poll::Poller`] with [`pollers::Resolve`]) turns an input record into
//!   what to watch (`resolve`, once per input) and polls it (`poll`, on the schedule): each
//!   poll returns what it sees now as [`poll::Output`]s (a key that identifies the output
//!   across polls, the value to publish, its event time), optionally a watermark, and
//!   whether the set is final. The bridge emits each output once per watch.
//! - A **termination condition** ([`termination::Condition`], Beam's shape) decides when a
//!   watch stops. Nest yours with the built-in ones through [`termination::Termination`];
//!   its state is saved with the watch ([`termination::Condition::encode_state`]).
//! - A **watermark generator** ([`watermark::WatermarkGenerator`], Flink's shape) decides
//!   each input partition's watermark from its records; [`watermark::Generators`] makes one
//!   per partition.
//! - A **timestamp assigner** ([`TimestampAssigner`]) reads an input's event time.
//!
//! [`BridgeBuilder`] puts them together and gives a [`Bridge`] to run.
//!
//! # A poller, start to end
//!
//! ```no_run
//! use std::sync::Arc;
//! use serde_json::Value;
//! use watchbridge::poll::{Output, PollError, PollResult, Poller};
//! use watchbridge::pollers::{RenderError, Resolve};
//! use watchbridge::BridgeBuilder;
//!
//! /// Watches a directory per input `{"dir": "..."}`: each file is an output.
//! struct Files;
//!
//! impl Poller for Files {
//!     /// What a watch polls: here the directory's path.
//!     type Input = String;
//!
//!     fn poll(
//!         &self,
//!         dir: Arc<String>,
//!     ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
//!         async move {
//!             // The filesystem blocks: off the runtime's threads.
//!             let listed = tokio::task::spawn_blocking(move || list(&dir)).await;
//!             let files = match listed {
//!                 Ok(Ok(files)) => files,
//!                 // A failed poll is retried with backoff (`WATCHBRIDGE_RETRY_*`).
//!                 Ok(Err(e)) => return Err(PollError::transient("io", e.to_string())),
//!                 Err(e) => return Err(PollError::transient("io", e.to_string())),
//!             };
//!             // Key: the output's identity across polls. Value: what goes to the output
//!             // topic. Event time: the record's timestamp.
//!             let outputs = files
//!                 .into_iter()
//!                 .map(|(name, modified)| Output::new(name.clone(), name, modified))
//!                 .collect();
//!             Ok(PollResult::incomplete(outputs))
//!         }
//!     }
//! }
//!
//! /// Each file's name and modification time (epoch ms).
//! fn list(dir: &str) -> std::io::Result<Vec<(String, i64)>> {
//!     let mut files = Vec::new();
//!     for entry in std::fs::read_dir(dir)? {
//!         let entry = entry?;
//!         let modified = entry.metadata()?.modified()?;
//!         let ms = modified.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
//!         files.push((entry.file_name().to_string_lossy().into_owned(), ms.as_millis() as i64));
//!     }
//!     Ok(files)
//! }
//!
//! impl Resolve for Files {
//!     /// Once per input: an input without `dir` is refused (dead-lettered with this reason).
//!     fn resolve(&self, value: &Value, _key: &[u8]) -> Result<String, RenderError> {
//!         match value.get("dir").and_then(Value::as_str) {
//!             Some(dir) => Ok(dir.to_string()),
//!             None => Err(RenderError::Missing("/dir".into())),
//!         }
//!     }
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Topics, brokers, schedule, termination...: from WATCHBRIDGE_* variables, as for
//!     // `watchbridge run`; the code gives the poller.
//!     BridgeBuilder::new("directories", "files")?
//!         .poller(Files)
//!         .run_until_signal()?;
//!     Ok(())
//! }
//! ```
//!
//! The examples in `examples/` go further, each run by the tests against a real broker:
//! `cursor_poller` (a paged API followed by cursor, the cursor kept across restarts with
//! [`poll::Poller::resume_state`]), `stop_after_outputs` (a condition with state that
//! survives a restart) and `punctuated_watermarks` (watermarks carried by marker records).
//!
//! # What is not an API
//!
//! The modules not documented here are public only for the `watchbridge` binary, the tests
//! and the benchmarks; they change without notice.
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

pub use bridge::{stop_on_signals, BridgeError, StopSignal, STOP_MARGIN};
pub use builder::{Bridge, BridgeBuilder};
pub use clock::Millis;
pub use formats::time::TimestampAssigner;
pub use formats::watch_input::Input;

/// Log as `watchbridge run` does: lines on stderr, filtered by `WATCHBRIDGE_LOG` (default
/// `info`), as text (coloured only on a terminal) or, with `WATCHBRIDGE_LOG_FORMAT=json`,
/// one JSON object per line. The bridge logs through `tracing`; call this once at the start
/// of `main`, or install a subscriber of your own instead.
pub fn init_logging() {
    logging::init_from_env();
}

// The bridge's own parts. Public only for the `watchbridge` binary, the tests and the
// benchmarks, which use them directly; hidden from the documentation and not an API: they
// change without notice.
#[doc(hidden)]
pub mod avro;
#[doc(hidden)]
pub mod bridge;
#[doc(hidden)]
pub mod catch_up;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod config_error;
#[doc(hidden)]
pub mod control;
#[doc(hidden)]
pub mod demo;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod formats;
#[doc(hidden)]
pub mod identity;
#[doc(hidden)]
pub mod inspect;
#[doc(hidden)]
pub mod internal_events;
#[doc(hidden)]
pub mod kafka;
mod keyed;
#[doc(hidden)]
pub mod limits;
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod not_ready;
mod ops_server;
mod pages;
#[doc(hidden)]
pub mod readiness;
#[doc(hidden)]
pub mod secrets;
#[doc(hidden)]
pub mod seen;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod table;
#[doc(hidden)]
pub mod watch;

/// The README's code, compiled by `cargo test --doc` so that its library section stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The allocator of the `watchbridge` binary, and of the benchmarks that measure it:
/// mimalloc. The bridge allocates records and headers on its tasks' threads and frees many
/// on librdkafka's; with glibc's malloc about 30% of the end-to-end
/// benchmark's CPU went to malloc and free (`perf`, bench/RESULTS.md). Its `override`
/// feature (Cargo.toml) replaces `malloc` and `free` in the whole process, so librdkafka's
/// own allocations (a message, its header list, each header) use it too: with glibc's, one
/// header per record halved a plain producer's rate (issue 19, `make bench`).
pub use mimalloc::MiMalloc as Allocator;

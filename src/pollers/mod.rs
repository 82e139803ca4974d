//! Built-in pollers: what users point watchbridge at without writing code.
//!
//! - [`http`]: a JSON HTTP API, one URL per input (`WATCHBRIDGE_POLLER=http`, the default);
//!   `docs/pollers/http.md`.
//! - [`glob`]: the files matching a path pattern (`WATCHBRIDGE_POLLER=glob`);
//!   `docs/pollers/glob.md`.
//! - [`sharded`]: the shards `PREFIX-SSSSS-of-NNNNN` of one output
//!   (`WATCHBRIDGE_POLLER=sharded`); `docs/pollers/sharded.md`.
//! - [`object_store`]: the objects under an S3, GCS or Azure prefix
//!   (`WATCHBRIDGE_POLLER=object_store`); `docs/pollers/object_store.md`.
//!
//! Each derives what it watches from the input record once, when the watch starts
//! ([`Resolve`]); an input that cannot name a resource (a missing field, a value that would
//! escape its directory) is refused there, with a reason for the dead-letter topic, and never
//! becomes a watch. Each is configured by environment variables, parsed here into typed
//! configs whose errors name the variable.
//!
//! The file pollers fill their path pattern with
//! [`Template::render_glob`](template::Template::render_glob): a substituted value is one
//! literal path segment (never `/`, `..`, `.` or empty; its glob metacharacters match only
//! themselves), so an input can only name a directory or file inside the pattern's shape.
//! They list the filesystem on tokio's blocking pool, following symbolic links only inside
//! the watched directory by default, leaving cycles out, looking at a bounded number of
//! entries per poll, and stopping when the poll ends (`files.rs`).

// The built-in pollers and their parts: public for the binary and the tests, not an API.
#[doc(hidden)]
pub mod builtin;
#[doc(hidden)]
pub mod event_time;
mod files;
#[doc(hidden)]
pub mod glob;
#[doc(hidden)]
pub mod http;
#[doc(hidden)]
pub mod object_store;
#[doc(hidden)]
pub mod once;
#[doc(hidden)]
pub mod sharded;
#[doc(hidden)]
pub mod shards;
#[doc(hidden)]
pub mod template;

use crate::poll::Poller;
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;

pub use template::RenderError;

/// A poller that derives each watch's resource from its input record.
pub trait Resolve: Poller {
    /// Called once per input, before the watch starts. `Err` means the input cannot be
    /// watched; the runtime sends it to the dead-letter topic with the error as the reason
    /// (a poller of your own says [`RenderError::Missing`] for a field the input lacks,
    /// [`RenderError::Unusable`] for anything else).
    fn resolve(&self, value: &Value, key: &[u8]) -> Result<Self::Input, RenderError>;

    /// How to read an output's identity back from its value, if this poller can: a
    /// recovery then knows the outputs it reads back without a header naming them (a
    /// header on every record costs a producer a quarter of its rate). `None` (the
    /// default): in the `recovery` mode each output carries the `wb-id` header.
    fn output_key_reader(&self) -> Option<OutputKeyReader> {
        None
    }

    /// A restored watch's input, resolved again, takes back what
    /// [`Poller::resume_state`] saved. State it cannot
    /// read is ignored (the watch then polls as from its start, and its seen set drops what
    /// it already emitted), with a warning.
    fn resume(&self, _input: &Self::Input, _state: &[u8]) {}

    /// Waits for what the poller prepares beside the bridge's start (the HTTP poller's
    /// client) and says what could not be prepared: the start then fails with it, before
    /// any input is read. Called once, from a blocking thread.
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Reads an output's key ([`crate::poll::Output::key`]) back from the value the poller
/// gave it, exactly (`None`: not a value of this poller's). Run by a recovery on each
/// output it reads back without `wb-id`.
pub type OutputKeyReader = Arc<ReadOutputKey>;

/// The function an [`OutputKeyReader`] holds.
pub type ReadOutputKey = dyn Fn(&[u8]) -> Option<Bytes> + Send + Sync;

pub use crate::config_error::ConfigError;

//! The poll contract: what a poller is given and what it returns.
//!
//! This is Beam's `Watch.growthOf` `PollFn`: one poll returns the outputs it can see now
//! (each with a key that identifies it across polls and an event time), optionally a
//! watermark promising that no future output will be earlier, and whether the set is final.
//! Errors are values: a poller never panics on bad data (and if one does anyway, the engine
//! turns the panic into a failed poll, never a crash).

use crate::clock::Millis;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// One thing a poll saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Identity across polls: two outputs with equal keys are the same output.
    pub key: Bytes,
    /// The payload that goes to the output topic.
    pub value: Bytes,
    /// When the output happened, in epoch milliseconds (the Kafka record timestamp).
    pub event_time: Millis,
    /// Which version of the item `key` names this is (an `updated_at`, an ETag), where the
    /// user asked that an updated item be emitted again (`WATCHBRIDGE_HTTP_ITEM_VERSION`):
    /// the identity is then (key, version), and the output carries it in the
    /// `watchbridge-item-version` header. `None`: the key alone is the identity.
    pub version: Option<Bytes>,
}

impl Output {
    /// An output with identity `key`, payload `value` and event time `event_time`.
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>, event_time: Millis) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            event_time,
            version: None,
        }
    }

    /// The same output, as version `version` of its item.
    pub fn with_version(mut self, version: impl Into<Bytes>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Its identity across polls: the hash of its key, or of its key and version.
    pub fn identity(&self) -> crate::identity::OutputHash {
        crate::identity::hash_identity(&self.key, self.version.as_deref())
    }
}

/// Everything one poll saw, plus what the poller can promise about the future.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollResult {
    /// What the poll saw, new or not (the engine keeps only what a watch has not seen).
    pub outputs: Vec<Output>,
    /// No output seen by later polls will have an earlier event time than this.
    pub watermark: Option<Millis>,
    /// The set of outputs is final: the watch ends after this poll.
    pub complete: bool,
    /// The resource said to ask it nothing more for this long (an HTTP API whose
    /// `RateLimit-Remaining` is 0): every watch polling the same host waits
    /// ([`crate::limits::Limits::hold_host`]), up to `WATCHBRIDGE_RETRY_AFTER_MAX`.
    pub host_wait: Option<Duration>,
}

impl PollResult {
    /// A result that may grow on later polls.
    pub fn incomplete(outputs: Vec<Output>) -> Self {
        Self {
            outputs,
            watermark: None,
            complete: false,
            host_wait: None,
        }
    }

    /// A result that is final.
    pub fn complete(outputs: Vec<Output>) -> Self {
        Self {
            outputs,
            watermark: None,
            complete: true,
            host_wait: None,
        }
    }

    /// The same result, promising that no later output is earlier than `watermark`.
    pub fn with_watermark(mut self, watermark: Millis) -> Self {
        self.watermark = Some(watermark);
        self
    }
}

/// A failed poll. `kind` is a short, fixed label (used in metrics); `message` is for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct PollError {
    /// A short, fixed label: the `error` label of `watchbridge_polls_total`, e.g.
    /// `timeout`, `connect`, `status`.
    pub kind: &'static str,
    /// What happened, for people.
    pub message: String,
    /// The resource asked us to wait this long (HTTP `Retry-After`); the retry waits at least
    /// this, whatever the backoff says.
    pub retry_after: Option<Duration>,
    /// Retrying cannot help (e.g. the input names something that can never exist): the watch
    /// ends as `failed` at once instead of retrying.
    pub permanent: bool,
}

impl PollError {
    /// A transient failure: retried with backoff up to the retry limit.
    pub fn transient(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            permanent: false,
        }
    }

    /// A failure that retrying cannot fix.
    pub fn permanent(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            permanent: true,
            ..Self::transient(kind, message)
        }
    }

    /// The same error, asking that the retry wait at least `after`.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// A source of outputs for one input. Implementations hold their configuration (URL
/// template, glob, client) and derive the resource from the input on each poll.
///
/// The future is `'static` so the engine can run polls concurrently on the runtime's
/// threads; clone what you need (an `Arc`'d client) into it.
///
/// What the engine promises, which per-watch state in an `Input` (behind a `Mutex`) may
/// rely on: the polls of one watch never overlap (the next is scheduled only once the last
/// has ended); a poll past `WATCHBRIDGE_POLL_TIMEOUT` is cancelled (its future dropped, at
/// an `.await`) and counts as failed; and [`Poller::resume_state`] is read right after each
/// poll that did not end its watch, by the bridge's checkpoints.
pub trait Poller: Send + Sync + 'static {
    /// What a watch is started from (a decoded input record).
    type Input: Send + Sync + 'static;

    /// Poll the resource of `input` once: everything it shows now.
    fn poll(
        &self,
        input: Arc<Self::Input>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static;

    /// The key this poll is rate-limited under (for HTTP, the host), or `None` for no limit.
    fn rate_key(&self, _input: &Self::Input) -> Option<Arc<str>> {
        None
    }

    /// What of this watch's polling must survive a restart, as bytes the poller reads back
    /// in [`crate::pollers::Resolve::resume`] (the HTTP poller's `{last.*}` values). Saved
    /// with the watch's state record once the outputs found before it are delivered.
    /// `None` (the default): nothing; each poll depends only on the input.
    fn resume_state(&self, _input: &Self::Input) -> Option<Vec<u8>> {
        None
    }
}

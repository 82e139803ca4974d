//! A poller of your own: a JSON API paged by cursor.
//!
//! For each input record `{"user": 7}` the bridge starts a watch, and this poller reads that
//! user's events from
//!
//! ```text
//! GET {EXAMPLE_API_URL}/users/7/events              the first page
//! GET {EXAMPLE_API_URL}/users/7/events?cursor=c2    the page after it
//! → {"events": [{"id": "e1", "at": 1796000000000, ...}, ...], "next": "c2" | null}
//! ```
//!
//! following `next` until it is `null`. Each event becomes one output: key = its `id`
//! (the bridge emits each key once per watch), value = the event's JSON, event time = `at`.
//! The watch remembers the cursor it got to, and so does its saved state: after a restart it
//! asks from there, not from the first page.
//!
//! Run it like `watchbridge run` (every `WATCHBRIDGE_*` setting applies; the HTTP poller's
//! `WATCHBRIDGE_HTTP_*` ones do not, this poller replaces it):
//!
//! ```text
//! EXAMPLE_API_URL=http://127.0.0.1:8080 WATCHBRIDGE_BROKERS=127.0.0.1:9092 \
//! WATCHBRIDGE_INPUT_TOPIC=users WATCHBRIDGE_OUTPUT_TOPIC=events \
//!     cargo run --example cursor_poller
//! ```

use serde_json::Value;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use watchbridge::builder::BridgeBuilder;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::{RenderError, Resolve};

/// One poll reads at most this many pages. A user with a long backlog is read over several
/// polls (the cursor carries over), so one watch cannot hold a poll slot for minutes.
const MAX_PAGES_PER_POLL: usize = 10;

/// The poller: shared by every watch, so it holds only what they all use.
struct CursorPoller {
    /// One client for all watches: it keeps connections to the API open between polls.
    client: reqwest::Client,
    /// `EXAMPLE_API_URL`, without a trailing `/`.
    base: String,
    /// The API's host, the key polls are rate-limited under (`WATCHBRIDGE_HOST_RATE`).
    host: Arc<str>,
}

/// One watch's input: what `resolve` derived from the input record, plus the watch's own
/// progress. The engine hands it to `poll` behind an `Arc`, so what changes between polls
/// (the cursor) sits in a `Mutex`: interior mutability.
struct UserFeed {
    user: u64,
    /// Where the next poll starts (`None`: the first page): the last page read, which may
    /// have grown since (the events on it that were emitted already are dropped by the
    /// bridge, which remembers each watch's output keys), or the page after the last one a
    /// poll had time for.
    cursor: Mutex<Option<String>>,
}

impl Resolve for CursorPoller {
    /// Called once per input record, before its watch starts. An `Err` sends the record to
    /// the dead-letter topic with the error as its reason: decide here, not in `poll`, that
    /// an input can never work.
    fn resolve(&self, value: &Value, _key: &[u8]) -> Result<UserFeed, RenderError> {
        let user = value
            .pointer("/user")
            .ok_or_else(|| RenderError::Missing("/user".into()))?;
        let user = user.as_u64().ok_or_else(|| {
            RenderError::Unusable(format!("`/user` must be a whole number, not {user}"))
        })?;
        Ok(UserFeed {
            user,
            cursor: Mutex::new(None),
        })
    }

    /// A watch restored after a restart (or on another instance) gets back what
    /// `resume_state` saved. Bytes we cannot read (another version's) are ignored: the watch
    /// then reads from the first page, and the bridge still drops what it emitted before.
    fn resume(&self, feed: &UserFeed, state: &[u8]) {
        match std::str::from_utf8(state) {
            Ok(cursor) => *feed.cursor.lock().unwrap() = Some(cursor.to_string()),
            Err(_) => tracing::warn!(
                user = feed.user,
                "saved cursor is not UTF-8; reading from the first page"
            ),
        }
    }
}

impl Poller for CursorPoller {
    type Input = UserFeed;

    /// One poll. The returned future must be `'static` (the engine runs many polls at once
    /// on its threads), so it takes clones of what it uses, not `&self`.
    fn poll(
        &self,
        feed: Arc<UserFeed>,
    ) -> impl Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let client = self.client.clone();
        let url = format!("{}/users/{}/events", self.base, feed.user);
        async move {
            // Polls of one watch never overlap, so the cursor cannot change under us.
            let mut cursor = feed.cursor.lock().unwrap().clone();
            let mut outputs = Vec::new();
            for _ in 0..MAX_PAGES_PER_POLL {
                let page = get_page(&client, &url, cursor.as_deref()).await?;
                for event in page.events {
                    outputs.push(output(event)?);
                }
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            // Only a poll that succeeded moves the cursor: a failed one is retried from
            // where the last good one ended.
            *feed.cursor.lock().unwrap() = cursor;
            // Never `complete`: the feed can always grow. When a watch stops is up to the
            // termination condition (`WATCHBRIDGE_TERMINATION`).
            Ok(PollResult::incomplete(outputs))
        }
    }

    /// Every watch asks the same host: rate-limit them together.
    fn rate_key(&self, _feed: &UserFeed) -> Option<Arc<str>> {
        Some(self.host.clone())
    }

    /// Called after each poll; saved with the watch once the outputs that poll found are
    /// delivered, so a restart never skips an output it did not deliver.
    fn resume_state(&self, feed: &UserFeed) -> Option<Vec<u8>> {
        let cursor = feed.cursor.lock().unwrap();
        cursor.as_ref().map(|c| c.clone().into_bytes())
    }
}

/// One page of the API.
#[derive(serde::Deserialize)]
struct Page {
    events: Vec<Value>,
    next: Option<String>,
}

/// GET one page. Errors are values the engine understands: a `transient` one is retried
/// with backoff (`WATCHBRIDGE_RETRY_*`), a `permanent` one ends the watch as `failed`. The
/// `kind` is a metric label, so it is a short fixed word, never the message.
async fn get_page(
    client: &reqwest::Client,
    url: &str,
    cursor: Option<&str>,
) -> Result<Page, PollError> {
    let mut request = client.get(url);
    if let Some(cursor) = cursor {
        request = request.query(&[("cursor", cursor)]);
    }
    let response = request
        .send()
        .await
        .map_err(|e| PollError::transient("connect", e.to_string()))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        // No such user, and waiting will not make one.
        return Err(PollError::permanent("not_found", format!("{url}: 404")));
    }
    if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        // (An API that says how long to wait: `.with_retry_after(duration)` on the error,
        // and the retry waits at least that.)
        return Err(PollError::transient(
            "http_status",
            format!("{url}: {status}"),
        ));
    }
    if !status.is_success() {
        return Err(PollError::permanent(
            "http_status",
            format!("{url}: {status}"),
        ));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| PollError::transient("connect", format!("{url}: {e}")))?;
    serde_json::from_slice(&body)
        .map_err(|e| PollError::transient("bad_page", format!("{url}: {e}")))
}

/// An event as an output: its `id` says which output it is, `at` when it happened. An
/// event without them fails the poll as transient (a half-deployed API may mend); the retry
/// limit ends the watch if it does not.
fn output(event: Value) -> Result<Output, PollError> {
    let bad = |what: &str| PollError::transient("bad_event", format!("event {event}: {what}"));
    let id = event
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no string `id`"))?;
    let at = event
        .get("at")
        .and_then(Value::as_i64)
        .ok_or_else(|| bad("no integer `at`"))?;
    let key = id.to_string();
    Ok(Output::new(key, event.to_string(), at))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Log lines as `watchbridge run` writes them (WATCHBRIDGE_LOG, WATCHBRIDGE_LOG_FORMAT).
    watchbridge::init_logging();

    let base = std::env::var("EXAMPLE_API_URL").map_err(|_| "EXAMPLE_API_URL is not set")?;
    let host: Arc<str> = url::Url::parse(&base)?
        .host_str()
        .ok_or("EXAMPLE_API_URL has no host")?
        .into();
    let poller = CursorPoller {
        client: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()?,
        base: base.trim_end_matches('/').to_string(),
        host,
    };

    // Every other setting as `watchbridge run` reads it; runs until SIGTERM or Ctrl-C.
    BridgeBuilder::from_env()?
        .poller(poller)
        .run_until_signal()?;
    Ok(())
}

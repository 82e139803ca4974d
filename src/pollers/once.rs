//! `watchbridge poll-once`: resolve one input with the configured poller, poll it once and
//! print what came back, so settings can be checked against the real resource before the
//! bridge runs (which pointer finds the items, whether the times parse, what the key is).

use super::builtin::UsePoller;
use super::event_time::format_rfc3339;
use super::{RenderError, Resolve};
use crate::poll::{PollError, PollResult};
use serde_json::{json, Value};
use std::sync::Arc;

/// One input, as a record would bring it.
pub struct PollOnce {
    pub value: Value,
    pub key: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum PollOnceError {
    #[error("input refused (it would go to the dead-letter topic): {0}")]
    Refused(#[from] RenderError),
    #[error("poll failed ({}): {}", .0.kind, .0.message)]
    Failed(PollError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

impl UsePoller for PollOnce {
    type Output = Result<PollResult, PollOnceError>;

    fn with<P: Resolve>(self, poller: Arc<P>) -> Self::Output {
        let input = poller.resolve(&self.value, &self.key)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime
            .block_on(poller.poll(Arc::new(input)))
            .map_err(PollOnceError::Failed)
    }
}

/// One output as a JSON line: key, event time (both forms) and the value (as JSON when it
/// is JSON, else as text).
pub fn output_line(output: &crate::poll::Output) -> String {
    let value = serde_json::from_slice::<Value>(&output.value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&output.value).into_owned()));
    json!({
        "key": String::from_utf8_lossy(&output.key),
        "event_time": format_rfc3339(output.event_time),
        "event_time_ms": output.event_time,
        "value": value,
    })
    .to_string()
}

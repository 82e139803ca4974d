//! A termination condition of your own, with state that survives a restart.
//!
//! Each watch stops after it emitted `EXAMPLE_MAX_OUTPUTS` new outputs (default 5), or after
//! an hour, whichever comes first. The count is the condition's per-watch state; the bridge
//! saves it with the watch (`encode_state`) and reads it back when the watch is restored
//! (`decode_state`), after a crash or on another instance, so a watch killed at 3 outputs
//! emits 2 more, not 5.
//!
//! The poller is the built-in HTTP one, configured as for `watchbridge run`:
//!
//! ```text
//! WATCHBRIDGE_BROKERS=127.0.0.1:9092 WATCHBRIDGE_INPUT_TOPIC=users \
//! WATCHBRIDGE_OUTPUT_TOPIC=events WATCHBRIDGE_HTTP_URL='http://127.0.0.1:8080/users/{/id}' \
//! WATCHBRIDGE_HTTP_ITEMS=/events WATCHBRIDGE_HTTP_ITEM_KEY=/id WATCHBRIDGE_HTTP_ITEM_TIME=/at \
//! EXAMPLE_MAX_OUTPUTS=5 cargo run --example stop_after_outputs
//! ```

use std::time::Duration;
use watchbridge::builder::BridgeBuilder;
use watchbridge::reason::TerminatedReason;
use watchbridge::termination::{Condition, NewInput, Termination};
use watchbridge::Millis;

/// Stop after this many new outputs. One condition value serves every watch; what differs
/// per watch is its `State`.
#[derive(Debug)]
struct StopAfterOutputs {
    max: u64,
}

impl Condition for StopAfterOutputs {
    /// New outputs emitted so far.
    type State = u64;

    /// A new watch has emitted nothing. (A condition that sets a limit per input reads it
    /// from `input`: `input.input::<T>()` is the poller's input if it is a `T`.)
    fn for_new_input(&self, _now: Millis, _input: &NewInput<'_>) -> u64 {
        0
    }

    /// Told how many outputs a poll found that the watch never emitted before: count them.
    fn on_seen_new_output(&self, _now: Millis, new_outputs: usize, count: &mut u64) {
        *count += new_outputs as u64;
    }

    /// Nothing to do per poll: only outputs count.
    fn on_poll_complete(&self, _now: Millis, _count: &mut u64) {}

    /// Asked after every poll, and before one falls due. This stops the *polling*: the outputs of the poll that
    /// reached the limit are emitted, all of them, so a poll that finds 3 new outputs at a
    /// count of 4 ends the watch at 7.
    fn can_stop_polling(&self, _now: Millis, count: &u64) -> Option<TerminatedReason> {
        // The reason is the watch's last event, a log field and a metric label.
        (*count >= self.max).then(|| TerminatedReason::Custom("max_outputs".into()))
    }

    /// Saved with the watch after each poll: 8 bytes, little-endian. (Every watch keeps
    /// its state in memory and writes it with each checkpoint: keep it small.)
    fn encode_state(&self, count: &u64) -> Vec<u8> {
        count.to_le_bytes().to_vec()
    }

    /// The count back. An `Err` (bytes some other version wrote) is logged and the watch
    /// counts from 0 again, so say what was wrong.
    fn decode_state(&self, bytes: &[u8]) -> Result<u64, String> {
        let bytes: [u8; 8] = bytes
            .try_into()
            .map_err(|_| format!("{} bytes, not 8", bytes.len()))?;
        Ok(u64::from_le_bytes(bytes))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Log lines as `watchbridge run` writes them (WATCHBRIDGE_LOG, WATCHBRIDGE_LOG_FORMAT).
    watchbridge::init_logging();

    let max = match std::env::var("EXAMPLE_MAX_OUTPUTS") {
        Ok(text) => text
            .parse()
            .map_err(|e| format!("EXAMPLE_MAX_OUTPUTS={text:?}: {e}"))?,
        Err(_) => 5,
    };

    // Conditions nest like WATCHBRIDGE_TERMINATION's text form: this one displays as
    // `any(max_outputs, total(1h))`. The name given to `custom` is how it shows there.
    let termination = Termination::Any(vec![
        Termination::custom("max_outputs", StopAfterOutputs { max }),
        Termination::after_total_of(Duration::from_secs(3600)),
    ]);

    // Everything else from the environment, the poller too (WATCHBRIDGE_POLLER, default
    // `http`); our termination replaces WATCHBRIDGE_TERMINATION.
    BridgeBuilder::from_env()?
        .termination(termination)
        .run_builtin_poller_until_signal()?;
    Ok(())
}

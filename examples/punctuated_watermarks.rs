//! A watermark generator of your own: watermarks carried by marker records.
//!
//! The producer of the input topic knows when a stretch of event time is complete, and says
//! so in-band: besides the ordinary inputs (`{"id": 7}`, one watch each) it writes markers
//! `{"watermark": 1796000000000}` (epoch ms) to each partition. This bridge's watermark
//! for an input partition is the highest marker read on it (Flink calls such a generator
//! *punctuated*); ordinary records do not move it. Markers start no watch.
//!
//! The partition's published watermark (on `<output topic>.watermarks` and in-band in the
//! output topic) is still held back by the watches its inputs started, as always: a watch
//! that may emit an output at time `t` keeps the watermark at or below `t`.
//!
//! The poller is the built-in HTTP one, configured as for `watchbridge run`:
//!
//! ```text
//! WATCHBRIDGE_BROKERS=127.0.0.1:9092 WATCHBRIDGE_INPUT_TOPIC=users \
//! WATCHBRIDGE_OUTPUT_TOPIC=events WATCHBRIDGE_HTTP_URL='http://127.0.0.1:8080/users/{/id}' \
//! WATCHBRIDGE_HTTP_ITEMS=/events WATCHBRIDGE_HTTP_ITEM_KEY=/id WATCHBRIDGE_HTTP_ITEM_TIME=/at \
//!     cargo run --example punctuated_watermarks
//! ```

use serde_json::Value;
use watchbridge::builder::BridgeBuilder;
use watchbridge::watermark::{Generators, InputEvent, WatermarkGenerator, WatermarkOutput};
use watchbridge::Millis;

/// The watermark a marker record carries; `None` for an ordinary input.
fn marker(value: &Value) -> Option<Millis> {
    value.get("watermark")?.as_i64()
}

/// One per input partition (the bridge makes one when it is assigned the partition), so it
/// may keep per-partition state; this one needs none.
struct Punctuated;

impl WatermarkGenerator for Punctuated {
    /// Every input record of the partition, in order. `value` is `None` for a record that
    /// did not decode (it goes to the dead-letter topic).
    fn on_event(&mut self, event: &InputEvent<'_>, output: &mut WatermarkOutput) {
        if let Some(watermark) = event.value.and_then(marker) {
            // A lower marker than one before changes nothing: a watermark never goes back.
            output.emit_watermark(watermark);
        }
    }

    /// A periodic generator (say, highest timestamp seen minus a bound) would emit here;
    /// called after every record and every `WATCHBRIDGE_WATERMARK_INTERVAL`.
    fn on_periodic_emit(&mut self, _output: &mut WatermarkOutput) {}
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Log lines as `watchbridge run` writes them (WATCHBRIDGE_LOG, WATCHBRIDGE_LOG_FORMAT).
    watchbridge::init_logging();

    BridgeBuilder::from_env()?
        // Instead of WATCHBRIDGE_WATERMARK_STRATEGY; "punctuated" is its name in logs.
        .watermarks(Generators::custom("punctuated", |_partition| Punctuated))
        // A marker is not a watch: without this the HTTP poller would find no `/id` in it
        // and send it to the dead-letter topic. Skipped inputs are still read by the
        // generator above, and committed.
        .skip_inputs(|input| marker(&input.value).is_some())
        .run_builtin_poller_until_signal()?;
    Ok(())
}

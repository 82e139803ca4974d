//! The end offsets of every output partition, read every [`INTERVAL`] for all partition
//! tasks of the bridge. A task raises its checkpoint's output offsets to them once every
//! output it sent before reading them is handled (`DurableState::output_ends`), so that a
//! recovery reads the output topic only from about the last [`INTERVAL`] before its last
//! checkpoint, not from wherever this partition last wrote: an output partition that a
//! partition's watches never write to would otherwise be re-read from the start of the
//! partition's life at every recovery.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the ends are read (one ListOffsets request per output partition).
pub const INTERVAL: Duration = Duration::from_secs(5);

/// The latest ends read (`None` until the first read succeeds).
pub type OutputEnds = watch::Receiver<Option<Arc<Vec<i64>>>>;

/// Start reading the ends of `topic`'s `partitions` every [`INTERVAL`]; the reading stops
/// once every receiver is dropped.
pub fn start(config: ClientConfig, topic: Arc<str>, partitions: i32) -> OutputEnds {
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        let consumer: BaseConsumer = match config.create() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the output topic's end offsets; recoveries read back from each partition's last output");
                return;
            }
        };
        let consumer = Arc::new(consumer);
        loop {
            tokio::time::sleep(INTERVAL).await;
            if sender.is_closed() {
                return;
            }
            let (consumer, topic) = (consumer.clone(), topic.clone());
            let read = tokio::task::spawn_blocking(move || {
                (0..partitions)
                    .map(|p| {
                        consumer
                            .fetch_watermarks(&topic, p, Duration::from_secs(10))
                            .map(|(_, high)| high)
                    })
                    .collect::<Result<Vec<i64>, _>>()
            })
            .await;
            match read {
                Ok(Ok(ends)) => {
                    let _ = sender.send(Some(Arc::new(ends)));
                }
                // Next time; meanwhile the offsets rise with this partition's own outputs.
                Ok(Err(e)) => tracing::debug!(error = %e, "reading the output topic's end offsets"),
                Err(_) => return,
            }
        }
    });
    receiver
}

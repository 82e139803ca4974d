//! The control topic (`WATCHBRIDGE_CONTROL_TOPIC`, default `<group>.control`): the group's
//! standing orders, as Kafka Connect keeps a connector's target state in its config topic.
//!
//! An order given to any instance (`POST /pause`, `POST /watches/{key}/pause`, their
//! resumes) is written here; every instance reads the topic from its beginning at start and
//! follows it while it runs, and applies each order to its [`Pause`]. So a pause holds on
//! every instance, whichever one was asked, and survives restarts and rollouts. The topic is
//! compacted with one partition: the latest record per key is the order in force.
//!
//! | key | value | order |
//! |---|---|---|
//! | `pause` | `{"paused": true, "at_ms": …}` | every watch of the group paused (`false`: resumed) |
//! | `pause/<watch key>` | `{"paused": true, "at_ms": …}` | that watch paused; a tombstone resumes it |
//!
//! A record that is not an order (another key, a value that does not parse) is logged and
//! skipped: an order from a newer version does not stop this one.

use crate::control::Pause;
use crate::internal_events::PollingPaused;
use crate::kafka::health::KafkaContext;
use crate::kafka::leaders::electing;
use crate::kafka::refusal;
use crate::metrics::Metrics;
use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The key of the order that pauses every watch.
const PAUSE_ALL: &[u8] = b"pause";
/// The prefix of the key of an order that pauses one watch.
const PAUSE_ONE: &[u8] = b"pause/";

/// How long an order's writer waits for its own instance to have read it back.
const APPLIED_WITHIN: Duration = Duration::from_secs(15);

/// An order of the group's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Every watch paused (`true`) or resumed.
    PauseAll(bool),
    /// One watch paused or resumed.
    PauseOne(Bytes, bool),
}

#[derive(Serialize, Deserialize)]
struct PauseValue {
    paused: bool,
    #[serde(default)]
    at_ms: i64,
}

impl Order {
    /// Its record: key and value (`None`: a tombstone).
    pub fn record(&self, at_ms: i64) -> (Vec<u8>, Option<Vec<u8>>) {
        let value = |paused| serde_json::to_vec(&PauseValue { paused, at_ms }).ok();
        match self {
            Self::PauseAll(paused) => (PAUSE_ALL.to_vec(), value(*paused)),
            Self::PauseOne(key, paused) => {
                let mut k = PAUSE_ONE.to_vec();
                k.extend_from_slice(key);
                (k, paused.then(|| value(true)).flatten())
            }
        }
    }

    /// The order a record holds (`Ok(None)`: not an order this version knows).
    pub fn of_record(key: &[u8], value: Option<&[u8]>) -> Result<Option<Self>, String> {
        let paused = |value: Option<&[u8]>| -> Result<bool, String> {
            match value {
                None => Ok(false),
                Some(v) => serde_json::from_slice::<PauseValue>(v)
                    .map(|p| p.paused)
                    .map_err(|e| format!("its value is not a pause order: {e}")),
            }
        };
        if key == PAUSE_ALL {
            return Ok(Some(Self::PauseAll(paused(value)?)));
        }
        if let Some(watch) = key.strip_prefix(PAUSE_ONE) {
            return Ok(Some(Self::PauseOne(
                Bytes::copy_from_slice(watch),
                paused(value)?,
            )));
        }
        Ok(None)
    }

    fn apply(&self, pause: &Pause, metrics: Option<&Metrics>) {
        match self {
            Self::PauseAll(paused) => {
                if pause.is_paused() != *paused {
                    if let Some(m) = metrics {
                        PollingPaused { paused: *paused }.emit(m);
                    }
                }
                pause.set(*paused)
            }
            Self::PauseOne(key, paused) => pause.set_key(key.clone(), *paused),
        }
    }
}

/// How far this instance has read the control topic.
struct Applied {
    /// The next offset to read: every order before it is applied. `-1` until the first
    /// fetch has answered (a record or the end): an empty topic the brokers refuse to let
    /// this instance read must not pass for one read to its end.
    next: AtomicI64,
    moved: Notify,
    /// The brokers' refusal to let it read (what to grant), if they refused.
    refused: std::sync::Mutex<Option<String>>,
}

impl Default for Applied {
    fn default() -> Self {
        Self {
            next: AtomicI64::new(-1),
            moved: Notify::new(),
            refused: Default::default(),
        }
    }
}

impl Applied {
    fn advance(&self, next: i64) {
        if next > self.next.fetch_max(next, Ordering::SeqCst) {
            self.moved.notify_waiters();
        }
    }

    fn refuse(&self, what_to_grant: String) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(what_to_grant);
        self.moved.notify_waiters();
    }

    fn refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Wait until the orders before `offset` are applied, at most until `deadline`; `Err`
    /// with what to grant if the brokers refuse the reading.
    async fn reached(&self, offset: i64, deadline: Instant) -> Result<bool, String> {
        loop {
            let moved = self.moved.notified();
            if self.next.load(Ordering::SeqCst) >= offset {
                return Ok(true);
            }
            if let Some(refused) = self.refusal() {
                return Err(refused);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, moved).await.is_err() {
                return Ok(self.next.load(Ordering::SeqCst) >= offset);
            }
        }
    }
}

/// This instance's end of the control topic: it follows the topic, and writes orders.
pub struct ControlTopic {
    topic: String,
    producer: FutureProducer<KafkaContext>,
    applied: Arc<Applied>,
    /// Follows the topic until dropped.
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for ControlTopic {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The control topic's end offset (blocking), asked again while the brokers say "not now"
/// (a leader being elected: a topic this start created a moment ago, a broker restarting)
/// until `deadline`; anything else, or the deadline, is the start's error.
fn end_offset(
    consumer: &StreamConsumer<KafkaContext>,
    topic: &str,
    deadline: Instant,
) -> Result<i64, String> {
    loop {
        let timeout = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, 0, timeout) {
            Ok((_, end)) => return Ok(end),
            Err(e) => {
                let again = e.rdkafka_error_code().is_some_and(electing)
                    && Instant::now() + RETRY_AFTER < deadline;
                if !again {
                    return Err(format!(
                        "cannot read the end of the control topic {topic} \
                         (WATCHBRIDGE_CONTROL_TOPIC): {e}"
                    ));
                }
                tracing::debug!(error = %e, topic, "the control topic's end: asking again");
                // librdkafka answers from the metadata it has until it is asked again.
                let _ = consumer.fetch_metadata(Some(topic), Duration::from_secs(5).min(timeout));
                std::thread::sleep(RETRY_AFTER);
            }
        }
    }
}

/// How long the start waits before asking the control topic's end again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

impl ControlTopic {
    /// Read `topic` from its beginning into `pause` (returns once the orders present now
    /// are applied, or at `deadline`), then follow it. `reader`: the reader's settings
    /// ([`KafkaSettings::control_topic_reader`]: read committed, its end reported, nothing
    /// committed), `writer`: the writer's ([`KafkaSettings::control_topic_writer`]).
    ///
    /// [`KafkaSettings::control_topic_reader`]: super::clients::KafkaSettings::control_topic_reader
    /// [`KafkaSettings::control_topic_writer`]: super::clients::KafkaSettings::control_topic_writer
    pub async fn start(
        topic: &str,
        reader: ClientConfig,
        writer: ClientConfig,
        kafka: &KafkaContext,
        pause: Arc<Pause>,
        metrics: Arc<Metrics>,
        deadline: Instant,
    ) -> Result<Self, String> {
        let consumer: Arc<StreamConsumer<KafkaContext>> = Arc::new(
            reader
                .create_with_context(kafka.clone())
                .map_err(|e| format!("cannot create the control topic's reader: {e}"))?,
        );
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| e.to_string())?;
        consumer
            .assign(&assignment)
            .map_err(|e| format!("cannot read the control topic {topic}: {e}"))?;
        let end = {
            let (consumer, topic) = (consumer.clone(), topic.to_string());
            tokio::task::spawn_blocking(move || end_offset(&consumer, &topic, deadline))
                .await
                .map_err(|e| e.to_string())??
        };
        let producer: FutureProducer<KafkaContext> = writer
            .create_with_context(kafka.clone())
            .map_err(|e| format!("cannot create the control topic's writer: {e}"))?;
        let applied = Arc::new(Applied::default());
        let reader = tokio::spawn(follow(
            consumer,
            topic.to_string(),
            pause,
            metrics,
            applied.clone(),
        ));
        let this = Self {
            topic: topic.to_string(),
            producer,
            applied,
            reader,
        };
        if !this.applied.reached(end, deadline).await? {
            return Err(format!(
                "the control topic {topic} (WATCHBRIDGE_CONTROL_TOPIC) was not read to its end \
                 (offset {end}) within the start timeout"
            ));
        }
        Ok(this)
    }

    /// Write `order` and wait until this instance has applied it (so a status asked next
    /// shows it). Returns its offset.
    pub async fn give(&self, order: &Order) -> Result<i64, String> {
        let (key, value) = order.record(crate::clock::Clock::system().now_ms());
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
            .key(&key)
            .partition(0);
        if let Some(value) = &value {
            record = record.payload(value);
        }
        let delivered = self
            .producer
            .send(record, APPLIED_WITHIN)
            .await
            .map_err(|(e, _)| {
                format!(
                    "cannot write the order to the control topic {}: {e}",
                    self.topic
                )
            })?;
        let offset = delivered.offset;
        if !self
            .applied
            .reached(offset + 1, Instant::now() + APPLIED_WITHIN)
            .await?
        {
            return Err(format!(
                "the order is on the control topic {} (offset {offset}) but this instance \
                 has not read it back within {}s; every instance applies it once it does",
                self.topic,
                APPLIED_WITHIN.as_secs()
            ));
        }
        Ok(offset)
    }
}

/// Apply every record of the topic's partition, in order, forever.
async fn follow(
    consumer: Arc<StreamConsumer<KafkaContext>>,
    topic: String,
    pause: Arc<Pause>,
    metrics: Arc<Metrics>,
    applied: Arc<Applied>,
) {
    let mut last_error: Option<Instant> = None;
    loop {
        match consumer.recv().await {
            Ok(m) => {
                match Order::of_record(m.key().unwrap_or_default(), m.payload()) {
                    Ok(Some(order)) => {
                        tracing::info!(
                            topic,
                            offset = m.offset(),
                            order = ?order,
                            "applied an order of the control topic"
                        );
                        order.apply(&pause, Some(&metrics));
                    }
                    Ok(None) => tracing::warn!(
                        topic,
                        offset = m.offset(),
                        key = %String::from_utf8_lossy(m.key().unwrap_or_default()),
                        "a control topic record is not an order this version knows; skipped"
                    ),
                    Err(e) => tracing::warn!(
                        topic,
                        offset = m.offset(),
                        error = %e,
                        "a control topic record cannot be read; skipped"
                    ),
                }
                applied.advance(m.offset() + 1);
            }
            Err(rdkafka::error::KafkaError::PartitionEOF(_)) => {
                // The end: everything before the consumer's position is applied (its last
                // offsets may hold no record handed over, e.g. a transaction marker); an
                // empty topic has been read (its position may not be set yet: 0).
                let next = consumer.position().ok().and_then(|position| {
                    match position.elements_for_topic(&topic).first()?.offset() {
                        Offset::Offset(next) => Some(next),
                        _ => None,
                    }
                });
                applied.advance(next.unwrap_or(0));
            }
            Err(e) => {
                // The topic's own refusal (a group READ refused to its coordinator lookup is
                // the input consumer's to name: docs/brokers.md, "Least privilege").
                let topic_refused = |c: &RDKafkaErrorCode| {
                    *c == RDKafkaErrorCode::TopicAuthorizationFailed
                        || refusal::is_authentication(*c)
                };
                if let Some(code) = e.rdkafka_error_code().filter(topic_refused) {
                    applied.refuse(refusal::what_to_grant(
                        code,
                        "READ",
                        &format!("topic `{topic}` (WATCHBRIDGE_CONTROL_TOPIC)"),
                    ));
                }
                // Logged once a minute at most; librdkafka retries by itself.
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::error!(topic, error = %e, "cannot read the control topic");
                    last_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_trip_through_their_records() {
        for order in [
            Order::PauseAll(true),
            Order::PauseAll(false),
            Order::PauseOne(Bytes::from_static(b"user/1"), true),
            Order::PauseOne(Bytes::from_static(b"user/1"), false),
        ] {
            let (key, value) = order.record(5);
            assert_eq!(
                Order::of_record(&key, value.as_deref()),
                Ok(Some(order.clone()))
            );
        }
        // A resumed watch's order is a tombstone: compaction forgets it.
        assert_eq!(
            Order::PauseOne(Bytes::from_static(b"k"), false).record(1).1,
            None
        );
        assert_eq!(Order::of_record(b"restart/x", Some(b"{}")), Ok(None));
        assert!(Order::of_record(b"pause", Some(b"not json")).is_err());
    }

    #[test]
    fn applied_orders_set_the_pause() {
        let pause = Pause::default();
        Order::PauseOne(Bytes::from_static(b"a"), true).apply(&pause, None);
        assert!(pause.is_key_paused(b"a") && !pause.is_key_paused(b"b") && !pause.is_paused());
        Order::PauseAll(true).apply(&pause, None);
        assert!(pause.is_paused());
        Order::PauseOne(Bytes::from_static(b"a"), false).apply(&pause, None);
        Order::PauseAll(false).apply(&pause, None);
        assert!(!pause.is_key_paused(b"a") && !pause.is_paused());
    }
}

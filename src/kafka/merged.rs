//! The merged watermark over every partition of the input topic, across instances.
//!
//! Each instance publishes only the partitions it owns. The merged value must cover all of
//! them, so every instance reads the watermark topic back (it is small: one partition,
//! compacted, a record per change) and merges the latest value of each input partition
//! (min over the non-idle ones, never backwards, never below the last `merged` record; see
//! `watermark::topic`). Every instance exports that value as `watchbridge_watermark_ms`;
//! the owner of input partition 0 also publishes it, as the `merged` record, so there is one
//! writer however the partitions move.
//!
//! Nothing is published while the reader replays the topic (until it reaches the end it
//! found at its start: the last `merged` record may still come), nor by a new owner of
//! partition 0 before it has read what the previous writer wrote: either could publish a
//! value below one already on the topic.

use crate::clock::Clock;
use crate::internal_events::{MergedWatermarkChanged, WatermarkLag};
use crate::kafka::health::KafkaContext;
use crate::kafka::records::OutRecord;
use crate::kafka::reports::send_and_wait;
use crate::kafka::stats::BridgeProducer;
use crate::metrics::Metrics;
use crate::watermark::{SharedWatermarkTopic, WatermarkMessage, WatermarkTopic, END_OF_TIME};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct MergedPublisher {
    pub consumer_config: ClientConfig,
    /// The reader's context (its errors and log lines go to the bridge's broker health).
    pub kafka: KafkaContext,
    pub producer: BridgeProducer,
    pub input_topic: Arc<str>,
    pub watermark_topic: Arc<str>,
    pub interval: Duration,
    pub owns_first: Arc<AtomicBool>,
    /// Whether it publishes the merged value (record and metric) at all: not in a bounded
    /// run, which only reads the topic (for its partitions' floors) and publishes its final
    /// value itself.
    pub publishes: bool,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// What the topic's records say, applied here as they are read; shared with the
    /// partition tasks (the floor of a partition taken over).
    pub read_back: SharedWatermarkTopic,
    /// The offset after the last watermark record read (or the end the reader reached,
    /// past transaction markers and aborted records): a partition task taking a partition
    /// over waits until this passes the topic's end at its recovery, so that its floor is
    /// the last value the previous owner published.
    pub read_upto: Arc<std::sync::atomic::AtomicI64>,
}

/// How far the reader has got, which decides whether it may publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Replaying what was on the topic at the start: the values derived so far may be below
    /// what was already published (the last `merged` record may come later).
    Replaying,
    /// Caught up with the topic's end as it was at the start.
    CaughtUp,
}

impl MergedPublisher {
    /// Read the watermark topic and publish the merged value until `stop` resolves.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let consumer: Arc<StreamConsumer<KafkaContext>> = match self
            .consumer_config
            .clone()
            // librdkafka wants a group id even for an assigned (not subscribed) consumer;
            // nothing is committed under it.
            .set("group.id", "watchbridge-watermark-reader")
            .set("enable.auto.commit", "false")
            // Only committed watermarks (the exactly-once mode's are transactional).
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "100")
            // The end is reported: in the exactly-once mode the topic ends with a
            // transaction marker, which is never handed over as a record (`read_upto`); and
            // the replay is over only at the end.
            .set("enable.partition.eof", "true")
            // From offset 0, not from `Offset::Beginning`: a logical offset is looked up
            // first, and librdkafka puts that lookup off by a fixed 500 ms when the
            // partition's leader is not known yet — always so on a consumer just made. A
            // partition taken over, or at a start one whose sibling published first, waits
            // for this reader (`read_upto`). If retention deleted offset 0, the fetch is
            // out of range and starts again at the earliest record, whatever
            // `KAFKA_AUTO_OFFSET_RESET` says (the leader is known by then: no pause).
            .set("auto.offset.reset", "earliest")
            .create_with_context(self.kafka.clone())
        {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the watermark topic; no merged watermark");
                return;
            }
        };
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl
            .add_partition_offset(&self.watermark_topic, 0, Offset::Offset(0))
            .and_then(|_| consumer.assign(&tpl))
        {
            tracing::error!(error = %e, "cannot read the watermark topic; no merged watermark");
            return;
        }
        let mut reading = Reading::Replaying;
        // While this instance owns input partition 0 (it writes the `merged` records): from
        // which offset of the watermark topic on it may, i.e. once it has read every record
        // the previous writer wrote (`None`: not the writer, or not known yet).
        let mut writer_from: Option<WriterFrom> = None;
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut published = None;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                message = consumer.recv() => match message {
                    Ok(m) => {
                        self.read_upto.fetch_max(m.offset() + 1, Ordering::SeqCst);
                        match WatermarkMessage::parse(m.payload().unwrap_or_default()) {
                            Ok(message) => self.topic_state().apply(&message),
                            Err(e) => tracing::warn!(offset = m.offset(), error = %e, "skipping a record on the watermark topic"),
                        }
                    }
                    // At the end: past what no record stands for (markers, aborted records).
                    Err(KafkaError::PartitionEOF(_)) => {
                        if let Some(position) = self.position(&consumer) {
                            self.read_upto.fetch_max(position, Ordering::SeqCst);
                        }
                        reading = Reading::CaughtUp;
                    }
                    Err(e) => tracing::debug!(error = %e, "reading the watermark topic"),
                },
                _ = ticks.tick() => {
                    if !self.publishes || reading == Reading::Replaying {
                        continue;
                    }
                    let current = self.topic_state().merged();
                    // `Millis::MIN`: only partitions that never had a watermark; nothing to say.
                    if current.is_none_or(|c| c == crate::clock::Millis::MIN) {
                        continue;
                    }
                    let writer = self.writer(&consumer, &mut writer_from).await;
                    if current == published {
                        // Unchanged, but event time falls further behind as time passes.
                        WatermarkLag { watermark: current.unwrap_or_default(), now: self.clock.now_ms() }.emit(&self.metrics);
                        continue;
                    }
                    let watermark = current.unwrap_or_default();
                    if writer {
                        if !self.publish(watermark).await {
                            // Not on the topic: try again at the next tick.
                            continue;
                        }
                    } else if self.owns_first.load(Ordering::SeqCst) {
                        // Not the writer yet: neither record nor metric until it is.
                        continue;
                    }
                    published = current;
                    MergedWatermarkChanged { watermark, now: self.clock.now_ms() }.emit(&self.metrics);
                }
            }
        }
    }

    /// The topic's state, locked for one short step (never across an await).
    fn topic_state(&self) -> std::sync::MutexGuard<'_, WatermarkTopic> {
        self.read_back.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this instance writes the `merged` record now: it owns input partition 0 and
    /// has read the topic up to where it stood when it became the owner (so it has seen the
    /// last value the previous writer published; a value derived before could be below it).
    async fn writer(
        &self,
        consumer: &Arc<StreamConsumer<KafkaContext>>,
        writer_from: &mut Option<WriterFrom>,
    ) -> bool {
        if !self.owns_first.load(Ordering::SeqCst) {
            *writer_from = None;
            return false;
        }
        let from = match writer_from {
            Some(from) => *from,
            None => {
                let (consumer, topic) = (consumer.clone(), self.watermark_topic.clone());
                let end = tokio::task::spawn_blocking(move || {
                    consumer
                        .fetch_watermarks(&topic, 0, Duration::from_secs(5))
                        .map(|(_, high)| high)
                })
                .await;
                let from = match end {
                    Ok(Ok(end)) => WriterFrom {
                        offset: end,
                        since: tokio::time::Instant::now(),
                    },
                    _ => return false,
                };
                *writer_from = Some(from);
                from
            }
        };
        if self.read_upto.load(Ordering::SeqCst) >= from.offset {
            return true;
        }
        // An open transaction of the previous owner (exactly-once mode) ends within its
        // timeout; a topic that stays unreadable longer is logged and published anyway.
        if from.since.elapsed() > Duration::from_secs(60) {
            tracing::warn!(
                "the watermark topic was not read to its end in 60 s; publishing the merged \
                 watermark without the previous writer's last value"
            );
            *writer_from = Some(WriterFrom { offset: 0, ..from });
            return true;
        }
        false
    }

    /// The reader's position on the watermark topic (the offset it reads next).
    fn position(&self, consumer: &StreamConsumer<KafkaContext>) -> Option<i64> {
        let positions = consumer.position().ok()?;
        match positions.find_partition(&self.watermark_topic, 0)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }

    async fn publish(&self, watermark: crate::clock::Millis) -> bool {
        publish_merged(
            &self.producer,
            &self.watermark_topic,
            &self.input_topic,
            watermark,
        )
        .await
    }
}

#[derive(Debug, Clone, Copy)]
struct WriterFrom {
    offset: i64,
    since: tokio::time::Instant,
}

/// One `merged` record on the watermark topic.
pub async fn publish_merged(
    producer: &BridgeProducer,
    watermark_topic: &Arc<str>,
    input_topic: &str,
    watermark: crate::clock::Millis,
) -> bool {
    let message = WatermarkMessage::Merged {
        topic: input_topic.to_string(),
        watermark_ms: watermark,
    };
    let record = OutRecord::watermark(watermark_topic, None, message.key(), message.to_json());
    match send_and_wait(producer, &record, Duration::from_secs(10)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "the merged watermark could not be published");
            false
        }
    }
}

/// A bounded run that finished (every partition read to its end, every watch ended): the
/// end of time for each input partition (on the watermark topic and in-band) and then for
/// the merged value. Only then: a partition's end of time while another was still running,
/// or in a run that was then interrupted, would promise what did not happen.
pub async fn publish_end_of_time(producer: &BridgeProducer, topics: &EndOfTimeTopics) -> bool {
    let mut all = true;
    for partition in 0..topics.input_partitions {
        let message = WatermarkMessage::Partition {
            topic: topics.input_topic.to_string(),
            partition,
            watermark_ms: END_OF_TIME,
            idle: false,
        };
        let records = OutRecord::watermark_copies(
            &message,
            &topics.watermark_topic,
            &topics.output_topic,
            topics.output_partitions,
        );
        for record in records {
            if let Err(e) = send_and_wait(producer, &record, Duration::from_secs(10)).await {
                tracing::warn!(partition, error = %e, "the end of time could not be published");
                all = false;
            }
        }
    }
    // The merged value last, and only after every partition's.
    all && publish_merged(
        producer,
        &topics.watermark_topic,
        &topics.input_topic,
        END_OF_TIME,
    )
    .await
}

/// Where a bounded run's end of time goes.
pub struct EndOfTimeTopics {
    pub input_topic: Arc<str>,
    pub input_partitions: i32,
    pub watermark_topic: Arc<str>,
    pub output_topic: Arc<str>,
    pub output_partitions: i32,
}

//! The merged watermark over every partition of the input topic, across instances.
//!
//! Each instance publishes only the partitions it owns. The merged value must cover all of
//! them, so every instance reads the watermark topic back (it is small: one partition,
//! compacted, a record per change) and merges the latest value of each input partition
//! (min over the non-idle ones, never backwards; see `watermark::merged`). Every instance
//! exports that value as `watchbridge_watermark_ms`; the owner of input partition 0 also
//! publishes it, as the `merged` record, so there is one writer however the partitions
//! move.

use crate::clock::Clock;
use crate::internal_events::{MergedWatermarkChanged, WatermarkLag};
use crate::kafka::records::OutRecord;
use crate::kafka::stats::BridgeProducer;
use crate::metrics::Metrics;
use crate::watermark::{MergedWatermark, WatermarkMessage};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct MergedPublisher {
    pub consumer_config: ClientConfig,
    pub producer: BridgeProducer,
    pub input_topic: Arc<str>,
    pub input_partitions: i32,
    pub watermark_topic: Arc<str>,
    pub interval: Duration,
    pub owns_first: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// Shared with the partition tasks: the latest value of each partition on the topic.
    pub latest: Arc<std::sync::Mutex<std::collections::HashMap<i32, crate::clock::Millis>>>,
    /// The offset after the last watermark record read (or the end the reader reached,
    /// past transaction markers and aborted records): a partition task taking a partition
    /// over waits until this passes the topic's end at its recovery, so that its floor is
    /// the last value the previous owner published.
    pub read_upto: Arc<std::sync::atomic::AtomicI64>,
}

impl MergedPublisher {
    /// Read the watermark topic and publish the merged value until `stop` resolves.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let consumer: StreamConsumer<super::client::EofReader> = match self
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
            // transaction marker, which is never handed over as a record (`read_upto`).
            .set("enable.partition.eof", "true")
            .create_with_context(super::client::EofReader)
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the watermark topic; no merged watermark");
                return;
            }
        };
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl
            .add_partition_offset(&self.watermark_topic, 0, Offset::Beginning)
            .and_then(|_| consumer.assign(&tpl))
        {
            tracing::error!(error = %e, "cannot read the watermark topic; no merged watermark");
            return;
        }
        let mut merged = MergedWatermark::new();
        for p in 0..self.input_partitions {
            merged.assign(p);
        }
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
                        let Ok(WatermarkMessage::Partition { topic, partition, watermark_ms, idle }) =
                            WatermarkMessage::parse(m.payload().unwrap_or_default())
                        else {
                            continue;
                        };
                        if *topic == *self.input_topic && partition < self.input_partitions {
                            merged.set(partition, Some(watermark_ms), idle);
                            if let Ok(mut latest) = self.latest.lock() {
                                let value = latest.entry(partition).or_insert(watermark_ms);
                                *value = (*value).max(watermark_ms);
                            }
                        }
                    }
                    // At the end: past what no record stands for (markers, aborted records).
                    Err(KafkaError::PartitionEOF(_)) => {
                        if let Some(position) = self.position(&consumer) {
                            self.read_upto.fetch_max(position, Ordering::SeqCst);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "reading the watermark topic"),
                },
                _ = ticks.tick() => {
                    let current = merged.current();
                    // `Millis::MIN`: only partitions that never had a watermark; nothing to say.
                    if current.is_none_or(|c| c == crate::clock::Millis::MIN) {
                        continue;
                    }
                    if current == published {
                        // Unchanged, but event time falls further behind as time passes.
                        WatermarkLag { watermark: current.unwrap_or_default(), now: self.clock.now_ms() }.emit(&self.metrics);
                        continue;
                    }
                    published = current;
                    let watermark = current.unwrap_or_default();
                    MergedWatermarkChanged { watermark, now: self.clock.now_ms() }.emit(&self.metrics);
                    if self.owns_first.load(Ordering::SeqCst) {
                        self.publish(watermark).await;
                    }
                }
            }
        }
    }

    /// The reader's position on the watermark topic (the offset it reads next).
    fn position(&self, consumer: &StreamConsumer<super::client::EofReader>) -> Option<i64> {
        let positions = consumer.position().ok()?;
        match positions.find_partition(&self.watermark_topic, 0)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }

    async fn publish(&self, watermark: crate::clock::Millis) {
        publish_merged(
            &self.producer,
            &self.watermark_topic,
            &self.input_topic,
            watermark,
        )
        .await;
    }
}

/// One `merged` record on the watermark topic.
pub async fn publish_merged(
    producer: &BridgeProducer,
    watermark_topic: &Arc<str>,
    input_topic: &str,
    watermark: crate::clock::Millis,
) {
    let message = WatermarkMessage::Merged {
        topic: input_topic.to_string(),
        watermark_ms: watermark,
    };
    let record = OutRecord::watermark(watermark_topic, None, message.key(), message.to_json());
    if let Err((e, _)) = producer
        .send(record.to_future_record(), Duration::from_secs(10))
        .await
    {
        tracing::warn!(error = %e, "the merged watermark could not be published");
    }
}

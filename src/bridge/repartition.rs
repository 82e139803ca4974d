//! The repartition stage put together (`kafka::repartition`): with a watch key that is not
//! the record key (`WATCHBRIDGE_REPARTITION`), the bridge runs in two stages. The watch
//! side is the bridge as it is, reading the repartition topic as its input, keyed by the
//! watch key ([`watch_side`]); the repartition stage, beside it, reads the input topic in
//! the group `<group>.repartition` and writes the repartition topic.

use super::guarantee::{group_metadata, Producers};
use super::start::Start;
use super::BridgeError;
use crate::clock::Clock;
use crate::config::RunConfig;
use crate::formats::input::InputDecoder;
use crate::kafka::client::TopicLayout;
use crate::kafka::clients::KafkaSettings;
use crate::kafka::guarantee::Guarantee;
use crate::kafka::repartition::{RepartitionSettings, RepartitionStage, StageTransactions};
use crate::watermark::{Generators, UpstreamWatermarks};
use std::sync::Arc;

/// The watch side's settings when the inputs go through the repartition topic: that topic
/// is its input, its record key the watch key (`None`: no repartitioning).
pub(super) fn watch_side(config: &RunConfig) -> Option<RunConfig> {
    let topic = config.repartition_topic.clone()?;
    let mut watch = config.clone();
    watch.input_topic = topic;
    watch.watch_key = None;
    watch.repartition_topic = None;
    Some(watch)
}

/// The watch side's watermark generators: each partition's is the minimum of the input
/// partitions' in-band watermarks (`watermark::upstream`).
pub(super) fn upstream_generators(upstream_partitions: i32) -> Generators {
    Generators::custom("upstream", move |_| {
        UpstreamWatermarks::new(upstream_partitions)
    })
}

impl Start<'_> {
    /// The repartition stage of this run, started (`None`: the inputs do not go through the
    /// repartition topic). `decoder` reads the watch key where the settings say.
    pub(super) fn repartition_stage(
        &self,
        guarantee: Guarantee,
        producers: &Producers,
        decoder: Arc<InputDecoder>,
        layout: &TopicLayout,
        clock: Clock,
    ) -> Result<Option<RepartitionStage>, BridgeError> {
        let Some(upstream) = self.upstream else {
            return Ok(None);
        };
        let config = self.config;
        let group_id = format!("{}.repartition", config.group_id);
        let clients = KafkaSettings {
            group_id: group_id.clone(),
            ..self.clients.clone()
        };
        let mut consumer = clients.input_consumer(guarantee);
        consumer.set("enable.partition.eof", "false");
        // Its lag is its group's (`<group>.repartition`); no statistics to compute.
        consumer.remove("statistics.interval.ms");
        let transactions = match &producers.transactions {
            None => None,
            Some(t) => Some(StageTransactions {
                producer: t.producer.config.clone(),
                id_prefix: format!("watchbridge-{group_id}-{}", upstream.input_topic),
                group: Arc::new(group_metadata(&clients)?),
            }),
        };
        let settings = RepartitionSettings {
            input_topic: upstream.input_topic.as_str().into(),
            topic: config.input_topic.as_str().into(),
            partitions: layout.input_partitions,
            dlq_topic: config.dlq_topic.as_str().into(),
            group_id,
            decoder,
            consumer,
            handover: self.clients.group_metadata_client(),
            producer: self.clients.output_producer(guarantee),
            transactions,
            commit_interval: config.checkpoint_interval,
            generators: upstream
                .watermark_generators
                .clone()
                .unwrap_or_else(|| upstream.watermark_strategy.into()),
            watermark_interval: config.watermark_interval,
            idle_timeout: config.idle_timeout,
            stop_timeout: config.shutdown_timeout,
            metrics: self.metrics.clone(),
            clock,
            kafka: self.kafka.clone(),
        };
        RepartitionStage::start(settings)
            .map(Some)
            .map_err(BridgeError::Start)
    }
}

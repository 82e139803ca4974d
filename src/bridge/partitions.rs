//! The partition tasks put together: what they share (`kafka::partition::Shared`), the
//! group's input consumer whose callbacks start and stop them, and the watermark topic's
//! reader beside them (`kafka::merged`), which publishes the merged watermark.

use super::guarantee::Producers;
use super::start::Start;
use super::{BridgeError, StopSignal};
use crate::clock::Clock;
use crate::config::RunConfig;
use crate::control::Controls;
use crate::formats::output::OutputEncoder;
use crate::formats::Formats;
use crate::kafka::client::TopicLayout;
use crate::kafka::clients::{uses_the_consumer_protocol, Isolation};
use crate::kafka::consumer::{BridgeContext, NoCommitStart, Partitions};
use crate::kafka::delayed_restart::DeliveryWindow;
use crate::kafka::guarantee::Guarantee;
use crate::kafka::lease::Lease;
use crate::kafka::merged::{self, MergedPublisher, MergedWriterClaim};
use crate::kafka::output_ends;
use crate::kafka::partition::{Bounds, Shared, StateSettings, WatermarkSettings};
use crate::kafka::records::OutputLayout;
use crate::kafka::recovery::{Lookups, RecoverySource};
use crate::kafka::stats::BridgeProducer;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::pollers::{OutputKeyReader, Resolve};
use crate::watermark::{SharedWatermarkTopic, WatermarkTopic};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The watermark topic as this instance reads it back: kept by its reader
/// ([`MergedPublisher`]), read by the partition tasks (the floor of a partition taken over).
pub(super) struct WatermarkReadBack {
    /// What the topic's records say, applied as they are read.
    pub topic: SharedWatermarkTopic,
    /// How far the reader has read it.
    pub read_upto: Arc<AtomicI64>,
    /// How long a partition taken over waits at most for the reader
    /// (`merged::read_back_limit`).
    pub limit: Duration,
}

impl WatermarkReadBack {
    pub(super) fn new(start: &Start<'_>, layout: &TopicLayout, guarantee: Guarantee) -> Self {
        // What may hide a previous owner's last watermark from the reader is a transaction
        // the instances' producers left open: it ends within their timeout.
        let producers = start.clients.output_producer(guarantee);
        Self {
            topic: WatermarkTopic::shared(&start.config.input_topic, layout.input_partitions),
            read_upto: Arc::new(AtomicI64::new(0)),
            limit: merged::read_back_limit(producers.get("transaction.timeout.ms")),
        }
    }
}

/// How outputs are written, and how a recovery tells them apart when it reads them back.
pub(super) struct Outputs {
    /// Outputs' identities read back from their values (`None`: from their `wb-id` header).
    pub keys: Option<OutputKeyReader>,
    pub layout: OutputLayout,
}

impl Outputs {
    pub(super) fn choose<P: Resolve>(
        config: &RunConfig,
        layout: &TopicLayout,
        guarantee: Guarantee,
        encoder: &OutputEncoder,
        poller: &P,
    ) -> Self {
        // Outputs' identities read back from their values: where the poller can, and the
        // values are its items as it gave them (not Avro, whose datums a recovery would
        // decode).
        let keys = match encoder {
            OutputEncoder::Json => poller.output_key_reader(),
            OutputEncoder::Avro { .. } => None,
        };
        // `wb-id` only where a recovery reads outputs back and could not tell them apart
        // without it: not with at_least_once (which reads none), nor in the exactly-once
        // mode, whose every commit holds the hashes of the outputs it commits (a checkpoint
        // settles every record first).
        let layout = OutputLayout::choose(
            config.output_headers,
            layout.input_partitions,
            layout.output_partitions,
            guarantee == Guarantee::Recovery,
            keys.is_some(),
        );
        Self { keys, layout }
    }
}

/// What the start prepared for the partition tasks.
pub(super) struct TaskParts<P: Resolve> {
    pub poller: Arc<P>,
    pub layout: TopicLayout,
    pub guarantee: Guarantee,
    pub producers: Producers,
    pub formats: Formats,
    pub outputs: Outputs,
    pub limits: Limits,
    pub clock: Clock,
    /// The restores' offset lookups.
    pub lookups: Lookups,
    pub controls: Arc<Controls>,
}

/// The partition tasks as the input consumer's callbacks make them, and what the watermark
/// topic's reader shares with them.
pub(super) struct PartitionTasks<P: Resolve> {
    pub partitions: Arc<Partitions<P>>,
    /// Whether this instance writes the merged watermark (claimed by partition 0's task).
    pub merged_writer: Arc<MergedWriterClaim>,
    /// Whether this instance may write at all.
    pub lease: Arc<Lease>,
}

impl Start<'_> {
    /// The partition tasks, from `parts`, `read_back` and the input consumer's settings
    /// `consumer` (its group timeouts size the lease and the wait of a partition taken
    /// over; its `auto.offset.reset` says where a partition with no commit starts).
    pub(super) fn partition_tasks<P: Resolve>(
        &self,
        parts: TaskParts<P>,
        read_back: &WatermarkReadBack,
        consumer: &ClientConfig,
    ) -> PartitionTasks<P> {
        let delivery_window = parts.producers.delivery_window;
        let shared = Arc::new(self.shared(parts, read_back, consumer));
        let (merged_writer, lease) = (shared.merged_writer.clone(), shared.lease.clone());
        let no_commit = NoCommitStart::from_reset(consumer.get("auto.offset.reset"));
        let partitions = Arc::new(Partitions::new(
            shared,
            tokio::runtime::Handle::current(),
            no_commit,
            delivery_window,
            takeover_wait(consumer, delivery_window),
        ));
        PartitionTasks {
            partitions,
            merged_writer,
            lease,
        }
    }

    /// What every partition task shares.
    fn shared<P: Resolve>(
        &self,
        parts: TaskParts<P>,
        read_back: &WatermarkReadBack,
        consumer: &ClientConfig,
    ) -> Shared<P> {
        let (config, layout, producers) = (self.config, parts.layout, parts.producers);
        // On one broker a record is committed once appended: nothing to settle.
        let settle_outputs =
            producers.transactions.is_none() && !producers.delivery_window.is_zero();
        Shared {
            group_id: config.group_id.as_str().into(),
            poller: parts.poller,
            producer: producers.settings,
            producer_restarts: Default::default(),
            input_topic: config.input_topic.as_str().into(),
            output_topic: config.output_topic.as_str().into(),
            dlq_topic: config.dlq_topic.as_str().into(),
            decoder: parts.formats.decoder,
            encoder: parts.formats.encoder,
            output_layout: parts.outputs.layout,
            output_retention: layout.output_retention,
            repartitioned: layout.upstream_partitions.is_some(),
            rules: config.rules.clone(),
            poll_timeout: config.poll_timeout,
            limits: parts.limits,
            metrics: self.metrics.clone(),
            clock: parts.clock,
            positions: Arc::new(Mutex::new(HashMap::new())),
            transaction_positions: Arc::new(Mutex::new(HashMap::new())),
            lease: group_lease(consumer, &self.metrics),
            output_ends: output_ends::start(
                self.clients.output_ends_reader(),
                config.output_topic.as_str().into(),
                layout.output_partitions,
            ),
            stop_timeout: config.shutdown_timeout,
            input_hold_bytes: config.input_hold_bytes,
            skip_input: config.skip_input.clone(),
            watermarks: self.watermark_settings(&layout, read_back),
            state: StateSettings {
                recovery: self.recovery_source(
                    &layout,
                    parts.guarantee,
                    parts.outputs,
                    settle_outputs,
                    parts.lookups,
                ),
                guarantee: parts.guarantee,
                finished_retention: config.finished_retention,
                checkpoint_interval: config.checkpoint_interval,
            },
            readiness: self.readiness.clone(),
            transactions: producers.transactions,
            kafka: self.kafka.clone(),
            controls: parts.controls,
            merged_writer: Default::default(),
        }
    }

    fn watermark_settings(
        &self,
        layout: &TopicLayout,
        read_back: &WatermarkReadBack,
    ) -> WatermarkSettings {
        let config = self.config;
        let generators = match layout.upstream_partitions {
            // The inputs come through the repartition topic: the minimum of the input
            // partitions' in-band watermarks.
            Some(upstream) => super::repartition::upstream_generators(upstream),
            None => config
                .watermark_generators
                .clone()
                .unwrap_or_else(|| config.watermark_strategy.into()),
        };
        WatermarkSettings {
            generators,
            interval: config.watermark_interval,
            // Through the repartition topic, whether an input partition is idle is its own
            // marker's word (the stage times it out); the watch side's input is idle when
            // every one of them says so, not after a quiet spell between two markers.
            idle_timeout: match layout.upstream_partitions {
                Some(_) => Duration::MAX,
                None => config.idle_timeout,
            },
            topic: config.watermark_topic.as_str().into(),
            output_partitions: layout.output_partitions,
            read_back: read_back.topic.clone(),
            read_upto: read_back.read_upto.clone(),
            read_back_limit: read_back.limit,
        }
    }

    /// Where a partition's recovery reads from.
    fn recovery_source(
        &self,
        layout: &TopicLayout,
        guarantee: Guarantee,
        outputs: Outputs,
        settle_outputs: bool,
        lookups: Lookups,
    ) -> RecoverySource {
        let config = self.config;
        RecoverySource {
            consumer_config: self.clients.recovery_reader(Isolation::ReadCommitted),
            kafka: self.kafka.clone(),
            input_topic: config.input_topic.as_str().into(),
            group_id: config.group_id.clone(),
            watermark_topic: config.watermark_topic.as_str().into(),
            state_topic: config.state_topic.as_str().into(),
            output_topic: config.output_topic.as_str().into(),
            output_partitions: layout.output_partitions,
            outputs_by_input_partition: outputs.layout.by_input_partition,
            read_outputs: guarantee != Guarantee::AtLeastOnce,
            settle_outputs,
            output_keys: outputs.keys,
            lookups,
        }
    }

    /// The group's consumer of the input topic, made from `settings`, subscribed; in a
    /// bounded run, assigned every partition up to its end offset now.
    pub(super) fn input_consumer<P: Resolve>(
        &self,
        settings: &ClientConfig,
        tasks: &PartitionTasks<P>,
        layout: &TopicLayout,
        bounded: bool,
    ) -> Result<BaseConsumer<BridgeContext<P>>, BridgeError> {
        let config = self.config;
        let consumer: BaseConsumer<BridgeContext<P>> = settings
            .create_with_context(BridgeContext {
                partitions: tasks.partitions.clone(),
            })
            .map_err(|e| BridgeError::Start(format!("cannot create the consumer: {e}")))?;
        if bounded {
            assign_bounded(
                &consumer,
                &tasks.partitions,
                config,
                layout.input_partitions,
            )?;
            self.readiness.assignment_received(&self.metrics);
        } else {
            consumer.subscribe(&[&config.input_topic]).map_err(|e| {
                BridgeError::Start(format!("cannot subscribe to {}: {e}", config.input_topic))
            })?;
        }
        Ok(consumer)
    }

    /// The watermark topic read back, and the merged watermark over every input partition
    /// published (streaming runs; a bounded run only reads, for its partitions' floors, and
    /// publishes its final value at its end), with `producer`, the shared one.
    pub(super) fn merged_watermark<P: Resolve>(
        &self,
        tasks: &PartitionTasks<P>,
        producer: &BridgeProducer,
        bounded: bool,
        clock: Clock,
        read_back: WatermarkReadBack,
        lookups: Lookups,
    ) -> MergedWatermark {
        let config = self.config;
        let publisher = MergedPublisher {
            consumer_config: self.clients.watermark_reader(),
            kafka: self.kafka.clone(),
            producer: producer.clone(),
            input_topic: config.input_topic.as_str().into(),
            watermark_topic: config.watermark_topic.as_str().into(),
            interval: config.watermark_interval,
            claim: tasks.merged_writer.clone(),
            lease: tasks.lease.clone(),
            publishes: !bounded,
            metrics: self.metrics.clone(),
            clock,
            read_back: read_back.topic,
            read_upto: read_back.read_upto,
            lookups,
            readiness: self.readiness.clone(),
            read_back_limit: read_back.limit,
        };
        let stop = Arc::new(StopSignal::default());
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { publisher.run(async move { stop.stopped().await }).await })
        };
        MergedWatermark { stop, task }
    }
}

/// The watermark topic's reader and the merged watermark's publisher, running.
pub(super) struct MergedWatermark {
    stop: Arc<StopSignal>,
    task: tokio::task::JoinHandle<()>,
}

impl MergedWatermark {
    /// Stop it, and wait for it until `deadline` (200 ms at least).
    pub(super) async fn stop(self, deadline: Instant) {
        self.stop.stop();
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left.max(Duration::from_millis(200)), self.task).await;
    }
}

/// The consumer's group timeouts: `session.timeout.ms` and `heartbeat.interval.ms`
/// (librdkafka's defaults unless `KAFKA_*` set them).
struct GroupTimeouts {
    session: Duration,
    heartbeat: Duration,
}

impl GroupTimeouts {
    fn of(consumer: &ClientConfig) -> Self {
        let millis = |key: &str, default: u64| {
            Duration::from_millis(
                consumer
                    .get(key)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default),
            )
        };
        Self {
            session: millis("session.timeout.ms", 45_000),
            // KIP-848's broker default (`group.consumer.heartbeat.interval.ms`).
            heartbeat: millis(
                "heartbeat.interval.ms",
                if uses_the_consumer_protocol(consumer) {
                    5_000
                } else {
                    3_000
                },
            ),
        }
    }
}

/// The lease that keeps a stalled instance from writing (`kafka::lease`), sized by the
/// consumer's group timeouts.
fn group_lease(consumer: &ClientConfig, metrics: &Arc<Metrics>) -> Arc<Lease> {
    let group = GroupTimeouts::of(consumer);
    Lease::start(group.session, group.heartbeat, metrics.clone())
}

/// How long a partition the group assigns waits for its previous owner's records, logged
/// when it waits at all (`DeliveryWindow::takeover`).
fn takeover_wait(consumer: &ClientConfig, delivery_window: Duration) -> Duration {
    let group = GroupTimeouts::of(consumer);
    let wait = DeliveryWindow::takeover(delivery_window, group.session, group.heartbeat);
    if !wait.is_zero() {
        tracing::info!(
            wait_ms = wait.as_millis() as u64,
            session_timeout_ms = group.session.as_millis() as u64,
            "a partition the group assigns waits this long before it reads its outputs back: \
             a previous owner that died may have records still settling on the brokers (a \
             session timeout of the delivery window plus a heartbeat or more, \
             KAFKA_SESSION_TIMEOUT_MS, makes it none)"
        );
    }
    wait
}

/// A bounded run reads every partition itself (no group rebalancing) from the group's
/// committed offset (else the beginning) up to the end offset present now.
fn assign_bounded<P: Resolve>(
    consumer: &BaseConsumer<BridgeContext<P>>,
    partitions: &Partitions<P>,
    config: &RunConfig,
    count: i32,
) -> Result<(), BridgeError> {
    let timeout = Duration::from_secs(15);
    let topic = &config.input_topic;
    let mut tpl = TopicPartitionList::new();
    for p in 0..count {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl.clone(), timeout)
        .map_err(|e| {
            BridgeError::Start(format!("cannot read committed offsets of {topic}: {e}"))
        })?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..count {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout).map_err(|e| {
            BridgeError::Start(format!("cannot read the end offsets of {topic}: {e}"))
        })?;
        let start = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(rdkafka::Offset::Offset(o)) => o.max(low),
            _ => low,
        };
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Offset(start))
            .map_err(|e| BridgeError::Start(e.to_string()))?;
        tracing::info!(
            partition = p,
            start,
            end = high,
            "bounded run: reading up to the end offset present at start"
        );
        partitions.assign(p, Some(Bounds { start, end: high }));
    }
    consumer
        .assign(&assignment)
        .map_err(|e| BridgeError::Start(format!("cannot read {topic}: {e}")))
}

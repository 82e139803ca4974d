//! One task per assigned input partition. It owns the watches started from that partition
//! (its own [`Engine`]; no locks shared with other partitions), turns their new outputs into
//! records, and tracks which input offsets may be committed.
//!
//! It reads inputs from a bounded channel fed by the consumer thread. While the producer's
//! queue is full it stops reading (the channel fills, and the consumer thread pauses the
//! partition): backpressure, never a drop. Polls run in the engine's own tasks, so a slow
//! resource never holds up reading inputs.
//!
//! When the channel closes (the partition was revoked, or the bridge is stopping) it stops
//! its watches, delivers what they already emitted, publishes its final commit position and
//! reports [`Stopped`].

use super::input::{decode, Rejected};
use super::offsets::OffsetTracker;
use super::records::{OutRecord, OutRecordParts, Source};
use crate::clock::Clock;
use crate::clock::Millis;
use crate::engine::{Command, Engine, EngineConfig, Event};
use crate::internal_events::{
    InputConsumed, InputDeadLettered, LateOutput, OutputProduced, PartitionWatermarkChanged,
    ProduceFailed,
};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::pollers::Resolve;
use crate::watch::WatchRules;
use crate::watermark::{InputWatermark, PartitionWatermark, WatermarkMessage, WatermarkStrategy};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use rdkafka::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Attempts to deliver one record before it goes to the dead-letter topic instead.
const DELIVERY_ATTEMPTS: u32 = 5;

/// What every partition task of one bridge shares.
pub struct Shared<P: Resolve> {
    pub poller: Arc<P>,
    pub producer: FutureProducer,
    pub input_topic: Arc<str>,
    pub output_topic: Arc<str>,
    pub dlq_topic: Arc<str>,
    pub watch_key: Option<String>,
    pub rules: WatchRules,
    pub poll_timeout: Duration,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// Commit positions published by the tasks, taken by the consumer thread to store.
    pub positions: Arc<Mutex<HashMap<i32, i64>>>,
    /// How long a stopping task may spend delivering what its watches emitted.
    pub stop_timeout: Duration,
    pub watermarks: WatermarkSettings,
}

/// What the partition tasks need to publish watermarks.
#[derive(Debug, Clone)]
pub struct WatermarkSettings {
    pub strategy: WatermarkStrategy,
    pub interval: Duration,
    pub idle_timeout: Duration,
    pub topic: Arc<str>,
    /// In-band copies go to every one of the output topic's partitions.
    pub output_partitions: i32,
    /// The latest watermark of each input partition on the watermark topic, whoever
    /// published it (kept by the merged-watermark reader): a partition taken over from
    /// another instance continues from there instead of starting lower.
    pub latest: Arc<Mutex<HashMap<i32, Millis>>>,
}

/// In a bounded run, the offsets a partition task reads: from `start` up to `end` (the end
/// offset present when the run started).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub start: i64,
    pub end: i64,
}

/// A task's last word: what it committed and how many watches it stopped.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    pub partition: i32,
    pub position: Option<i64>,
    pub watches_stopped: usize,
}

/// A record on its way to the broker, and the input offset it counts against (`None` for
/// a watermark record, which no input caused).
struct Pending {
    record: OutRecord,
    origin: Option<i64>,
    attempt: u32,
    is_output: bool,
}

enum Delivery {
    Done(Pending, Result<(), KafkaError>),
    RetryDue(Pending),
}

pub struct PartitionTask<P: Resolve> {
    partition: i32,
    shared: Arc<Shared<P>>,
    inputs: mpsc::Receiver<OwnedMessage>,
    /// Dropped when a bounded run has read its last input: the engine then ends once every
    /// watch has.
    commands: Option<mpsc::Sender<Command<P::Input>>>,
    events: mpsc::Receiver<Event>,
    watermark: PartitionWatermark,
    min_hold: watch::Receiver<Option<Millis>>,
    bounds: Option<Bounds>,
    tracker: OffsetTracker,
    /// Watch commands sent, in order, waiting for the engine's Started/AlreadyWatching.
    starting: VecDeque<(Bytes, i64)>,
    /// Live watch → the offset of the input that started it.
    origins: HashMap<Bytes, i64>,
    deliveries: FuturesUnordered<BoxFuture<'static, Delivery>>,
}

impl<P: Resolve> PartitionTask<P> {
    /// Start the partition's engine and task; returns the task's future.
    pub fn spawn(
        partition: i32,
        shared: Arc<Shared<P>>,
        inputs: mpsc::Receiver<OwnedMessage>,
        bounds: Option<Bounds>,
    ) -> impl std::future::Future<Output = Stopped> + Send + 'static {
        let engine = Engine::new(
            shared.poller.clone(),
            EngineConfig {
                rules: shared.rules.clone(),
                poll_timeout: shared.poll_timeout,
                seed: None,
                checkpoints: false,
            },
            shared.limits.clone(),
            shared.clock,
            shared.metrics.clone(),
        );
        let min_hold = engine.min_hold();
        let (commands, engine_commands) = mpsc::channel(256);
        let (engine_events, events) = mpsc::channel(256);
        tokio::spawn(engine.run(engine_commands, engine_events));
        // A bounded run publishes one final watermark and does no periodic work (as Flink's
        // batch mode), so its generator tracks nothing.
        let generator = match bounds {
            Some(_) => InputWatermark::disabled(),
            None => InputWatermark::new(
                shared.watermarks.strategy,
                shared.watermarks.idle_timeout,
                shared.clock.now_ms(),
            ),
        };
        let task = Self {
            partition,
            shared,
            inputs,
            commands: Some(commands),
            events,
            watermark: PartitionWatermark::new(generator),
            min_hold,
            bounds,
            tracker: OffsetTracker::default(),
            starting: VecDeque::new(),
            origins: HashMap::new(),
            deliveries: FuturesUnordered::new(),
        };
        task.run()
    }

    async fn run(mut self) -> Stopped {
        let mut accepting = true;
        if self.bounds.is_some_and(|b| b.start >= b.end) {
            // Nothing to read in this bounded run.
            accepting = false;
            self.commands = None;
        }
        let mut ticks = tokio::time::interval(self.shared.watermarks.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let periodic = self.bounds.is_none();
        loop {
            tokio::select! {
                Some(delivery) = self.deliveries.next(), if !self.deliveries.is_empty() => {
                    self.on_delivery(delivery).await;
                }
                event = self.events.recv() => match event {
                    Some(event) => self.on_event(event).await,
                    // The engine ended: after our Shutdown, or (bounded) once every watch has.
                    None => break,
                },
                input = self.inputs.recv(), if accepting => match input {
                    Some(message) => {
                        let offset = message.offset();
                        if self.bounds.is_some_and(|b| offset >= b.end) {
                            continue;
                        }
                        self.on_input(message).await;
                        if self.bounds.is_some_and(|b| offset + 1 >= b.end) {
                            accepting = false;
                            self.commands = None;
                        }
                    }
                    None => {
                        accepting = false;
                        if let Some(commands) = self.commands.take() {
                            let _ = commands.send(Command::Shutdown).await;
                        }
                    }
                },
                _ = ticks.tick(), if periodic => self.tick_watermark().await,
            }
            self.publish_position();
        }
        let watches_stopped = self.origins.len();
        if self.bounds.is_some() {
            // Every watch of the bounded run has ended: event time is complete here.
            self.publish_watermark(Millis::MAX, false).await;
        }
        // Deliver what the watches already emitted, within the bound.
        let deadline = tokio::time::Instant::now() + self.shared.stop_timeout;
        while !self.deliveries.is_empty() {
            match tokio::time::timeout_at(deadline, self.deliveries.next()).await {
                Ok(Some(delivery)) => self.on_delivery(delivery).await,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        partition = self.partition,
                        undelivered = self.tracker.in_flight(),
                        "stopping before every record was acknowledged; their inputs stay uncommitted"
                    );
                    break;
                }
            }
            self.publish_position();
        }
        self.publish_position();
        Stopped {
            partition: self.partition,
            position: self.tracker.committed(),
            watches_stopped,
        }
    }

    /// Publish the partition's watermark if it changed since the last tick.
    async fn tick_watermark(&mut self) {
        let floor = self
            .shared
            .watermarks
            .latest
            .lock()
            .ok()
            .and_then(|l| l.get(&self.partition).copied());
        if let Some(floor) = floor {
            self.watermark.resume_from(floor);
        }
        let min_hold = *self.min_hold.borrow();
        let now = self.shared.clock.now_ms();
        if let Some(update) = self.watermark.update(min_hold, now) {
            // A partition that never had a watermark still says when it goes idle, so the
            // merged watermark stops waiting for it; its value is then the beginning of time.
            let watermark = update.watermark.unwrap_or(Millis::MIN);
            self.publish_watermark(watermark, update.idle).await;
        }
    }

    /// One watermark message on the watermark topic, and a copy in every output partition.
    async fn publish_watermark(&mut self, watermark: Millis, idle: bool) {
        PartitionWatermarkChanged {
            partition: self.partition,
            watermark,
            idle,
        }
        .emit(&self.shared.metrics);
        let message = WatermarkMessage::Partition {
            topic: self.shared.input_topic.to_string(),
            partition: self.partition,
            watermark_ms: watermark,
            idle,
        };
        let (key, json) = (message.key(), message.to_json());
        let settings = self.shared.watermarks.clone();
        let targets = std::iter::once((&settings.topic, None))
            .chain((0..settings.output_partitions).map(|p| (&self.shared.output_topic, Some(p))));
        let records: Vec<OutRecord> = targets
            .map(|(topic, partition)| {
                OutRecord::watermark(topic, partition, key.clone(), json.clone())
            })
            .collect();
        for record in records {
            self.send(Pending {
                record,
                origin: None,
                attempt: 1,
                is_output: false,
            })
            .await;
        }
    }

    fn publish_position(&mut self) {
        if let Some(position) = self.tracker.to_commit() {
            if let Ok(mut positions) = self.shared.positions.lock() {
                positions.insert(self.partition, position);
            }
        }
    }

    async fn on_input(&mut self, message: OwnedMessage) {
        InputConsumed.emit(&self.shared.metrics);
        let offset = message.offset();
        let now = self.shared.clock.now_ms();
        self.watermark
            .on_record(message.timestamp().to_millis().unwrap_or(now), now);
        let decoded = decode(
            message.key(),
            message.payload(),
            message.timestamp().to_millis(),
            self.shared.watch_key.as_deref(),
            self.shared.clock.now_ms(),
        )
        .and_then(|input| {
            let target = self
                .shared
                .poller
                .resolve(&input.value, &input.key)
                .map_err(|e| Rejected::Unresolvable(e.to_string()))?;
            Ok((input, target))
        });
        match decoded {
            Ok((input, target)) => {
                let command = Command::Watch {
                    key: input.key.clone(),
                    input: Arc::new(target),
                    input_time: input.timestamp,
                };
                if self.send_command(command).await {
                    // A watch holds its input's commit until it ends: watch state is in
                    // memory, so an input committed while its watch still ran would be lost
                    // with it in a crash or a rebalance (at least once, until durable
                    // state). Held from the moment the watch is asked for.
                    self.tracker.caused(offset);
                    self.starting.push_back((input.key, offset));
                }
            }
            Err(rejected) => {
                let error = rejected.to_string();
                InputDeadLettered {
                    partition: self.partition,
                    offset,
                    reason: rejected.kind(),
                    error: &error,
                }
                .emit(&self.shared.metrics);
                let record = OutRecord::dead_letter(
                    &self.shared.dlq_topic,
                    &OutRecordParts::of_message(&message),
                    Source {
                        topic: &self.shared.input_topic,
                        partition: self.partition,
                        offset,
                    },
                    rejected.kind(),
                    &error,
                );
                self.tracker.caused(offset);
                self.send(Pending {
                    record,
                    origin: Some(offset),
                    attempt: 1,
                    is_output: false,
                })
                .await;
            }
        }
        self.tracker.consumed(offset);
    }

    /// Send a command to the engine. While its queue is full, keep handling its events: the
    /// engine may itself be waiting for room to send one, and neither may wait on the other.
    async fn send_command(&mut self, mut command: Command<P::Input>) -> bool {
        let Some(commands) = self.commands.clone() else {
            return false;
        };
        loop {
            match commands.try_send(command) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
                Err(mpsc::error::TrySendError::Full(c)) => {
                    command = c;
                    tokio::select! {
                        permit = commands.reserve() => match permit {
                            Ok(permit) => {
                                permit.send(command);
                                return true;
                            }
                            Err(_) => return false,
                        },
                        Some(event) = self.events.recv() => Box::pin(self.on_event(event)).await,
                    }
                }
            }
        }
    }

    async fn on_event(&mut self, event: Event) {
        match event {
            Event::Started { key } => {
                if let Some((started, offset)) = self.starting.pop_front() {
                    debug_assert_eq!(started, key);
                    self.origins.insert(key, offset);
                }
            }
            Event::AlreadyWatching { .. } => {
                // No second watch: this input holds nothing.
                if let Some((_, offset)) = self.starting.pop_front() {
                    self.tracker.acknowledged(offset);
                }
            }
            Event::Outputs { key, outputs, .. } => {
                // Every watch has an origin once Started was seen; the fallback only guards
                // against a bug, by counting against the newest input (never committing past
                // an unacknowledged record).
                let origin = self.origins.get(&key).copied().unwrap_or(0);
                let first_seen = self.shared.clock.now_ms();
                for output in &outputs {
                    let mut record =
                        OutRecord::output(&self.shared.output_topic, &key, output, first_seen);
                    // Below the watermark this partition already published: still emitted
                    // (nothing is dropped), but marked, so a consumer can tell.
                    if self.watermark.is_late(output.event_time) {
                        LateOutput {
                            key: &output.key,
                            event_time: output.event_time,
                            watermark: self.watermark.published().unwrap_or_default(),
                        }
                        .emit(&self.shared.metrics);
                        record = record.late();
                    }
                    self.tracker.caused(origin);
                    self.send(Pending {
                        record,
                        origin: Some(origin),
                        attempt: 1,
                        is_output: true,
                    })
                    .await;
                }
            }
            Event::Terminated { key, .. } => {
                if let Some(offset) = self.origins.remove(&key) {
                    self.tracker.acknowledged(offset);
                }
            }
            // Durable state is not wired in yet: this runtime sends no `Restore` and runs its
            // engine without checkpoints, so these never arrive.
            Event::Restored { .. } | Event::RestoreRefused { .. } | Event::Checkpoint(_) => {}
        }
    }

    /// Hand a record to the producer. While its queue is full, wait for deliveries to make
    /// room (and read no input meanwhile: that is the backpressure).
    async fn send(&mut self, pending: Pending) {
        loop {
            match self
                .shared
                .producer
                .send_result(pending.record.to_future_record())
            {
                Ok(delivery) => {
                    self.deliveries.push(
                        async move {
                            let result = match delivery.await {
                                Ok(Ok(_)) => Ok(()),
                                Ok(Err((e, _))) => Err(e),
                                Err(_) => Err(KafkaError::Canceled),
                            };
                            Delivery::Done(pending, result)
                        }
                        .boxed(),
                    );
                    return;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    match self.deliveries.next().await {
                        Some(delivery) => Box::pin(self.on_delivery(delivery)).await,
                        None => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
                Err((error, _)) => {
                    self.delivery_failed(pending, error);
                    return;
                }
            }
        }
    }

    async fn on_delivery(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Done(pending, Ok(())) => {
                if pending.is_output {
                    OutputProduced.emit(&self.shared.metrics);
                }
                if let Some(origin) = pending.origin {
                    self.tracker.acknowledged(origin);
                }
            }
            Delivery::Done(pending, Err(error)) => self.delivery_failed(pending, error),
            Delivery::RetryDue(pending) => self.send(pending).await,
        }
    }

    /// Retry with backoff; after the last attempt, dead-letter it (a dead letter that cannot
    /// be delivered either is logged, counted and given up).
    fn delivery_failed(&mut self, pending: Pending, error: KafkaError) {
        let giving_up = pending.attempt >= DELIVERY_ATTEMPTS;
        let label = match &error {
            KafkaError::MessageProduction(code) => format!("{code:?}"),
            other => format!("{other:?}")
                .split('(')
                .next()
                .unwrap_or("other")
                .to_string(),
        };
        ProduceFailed {
            topic: &pending.record.topic,
            error: &error.to_string(),
            attempt: pending.attempt,
            giving_up,
        }
        .emit(&self.shared.metrics, &label);
        if !giving_up {
            let wait = Duration::from_millis(200 << pending.attempt.min(6));
            self.deliveries.push(
                async move {
                    tokio::time::sleep(wait).await;
                    Delivery::RetryDue(Pending {
                        attempt: pending.attempt + 1,
                        ..pending
                    })
                }
                .boxed(),
            );
            return;
        }
        let Some(origin) = pending.origin else {
            // A watermark record: a later one supersedes it.
            tracing::warn!(error = %error, "a watermark record could not be delivered");
            return;
        };
        if *pending.record.topic == *self.shared.dlq_topic {
            tracing::error!(error = %error, "a dead letter could not be delivered either; it is lost");
            self.tracker.acknowledged(origin);
            return;
        }
        let record = OutRecord::dead_letter(
            &self.shared.dlq_topic,
            &pending.record.parts(),
            Source {
                topic: &pending.record.topic,
                partition: -1,
                offset: -1,
            },
            "undeliverable",
            &error.to_string(),
        );
        // The dead letter takes the failed record's place in the commit accounting.
        let dead_letter = Pending {
            record,
            origin: Some(origin),
            attempt: 1,
            is_output: false,
        };
        self.deliveries
            .push(async move { Delivery::RetryDue(dead_letter) }.boxed());
    }
}

//! One input partition's task in the repartition stage: each input decoded only as far as
//! its watch key and time, written to the repartition topic (or, if it cannot be read, to
//! the dead-letter topic), its offset committed once that record is acknowledged (in the
//! exactly-once mode, in the transaction that holds it), and the partition's watermark
//! written into every repartition partition after the inputs it covers (module doc of
//! `super`).

use super::Shared;
use crate::clock::Millis;
use crate::control::crc32_partition;
use crate::formats::input::Attempt;
use crate::formats::watch_input::Rejected;
use crate::internal_events::{InputDeadLettered, InputRepartitioned};
use crate::kafka::health::KafkaContext;
use crate::kafka::offsets::OffsetTracker;
use crate::kafka::partition::blocking;
use crate::kafka::records::{
    input_source, input_timestamp, OutRecord, OutRecordParts, Source, INPUT_SOURCE, INPUT_TIMESTAMP,
};
use crate::watermark::{InputWatermark, WatermarkMessage};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use rdkafka::TopicPartitionList;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Records in flight per partition before the task stops taking inputs.
const MAX_IN_FLIGHT: usize = 20_000;

/// An unchanged watermark is written again this often: a watch-side partition that starts
/// again reads only what follows its commit, and learns every input partition's watermark
/// from the next markers.
const MARKER_EVERY: Duration = Duration::from_secs(1);

/// How long the transaction calls may block.
const TRANSACTION_CALL: Duration = Duration::from_secs(60);

/// Why a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Stopped (revoked, or the bridge stops): what it read is forwarded and committed.
    Done,
    /// A delivery or a transaction failed: read the partition again from its last commit.
    Restart,
    /// Its transactional producer was fenced (another instance owns the partition now, or
    /// a transaction outlived its timeout): read again after a longer wait, if still ours.
    Fenced,
}

type Delivery = BoxFuture<
    'static,
    (
        Option<i64>,
        Result<OwnedDeliveryResult, futures::channel::oneshot::Canceled>,
    ),
>;

pub(super) struct Forwarder {
    partition: i32,
    shared: Arc<Shared>,
    inputs: mpsc::Receiver<OwnedMessage>,
    lost: Arc<AtomicBool>,
    tracker: OffsetTracker,
    /// Deliveries awaited: the input offset each holds (`None`: a marker).
    in_flight: FuturesUnordered<Delivery>,
    watermark: InputWatermark,
    /// The watermark after each input that moved it, until the acknowledged position
    /// passes the input (the `recovery` mode's markers cover only what is acknowledged).
    moved: VecDeque<(i64, Millis)>,
    /// The watermark of the inputs below the acknowledged position.
    covered: Option<Millis>,
    /// The last marker written, and when.
    marker: Option<(Option<Millis>, bool, Instant)>,
    /// Records whose delivery failed outside transactions, to send again (their inputs'
    /// commits wait for them).
    resend: VecDeque<(Option<i64>, OwnedMessage)>,
    /// The exactly-once mode's own producer, and whether its transaction holds anything.
    transaction: Option<(FutureProducer<KafkaContext>, bool)>,
    last_commit: Instant,
}

impl Forwarder {
    pub(super) fn new(
        partition: i32,
        shared: Arc<Shared>,
        inputs: mpsc::Receiver<OwnedMessage>,
        lost: Arc<AtomicBool>,
    ) -> Self {
        let s = &shared.settings;
        let watermark = InputWatermark::with_generator(
            s.generators.make(partition),
            s.idle_timeout,
            s.clock.now_ms(),
        );
        Self {
            partition,
            inputs,
            lost,
            tracker: OffsetTracker::default(),
            in_flight: FuturesUnordered::new(),
            watermark,
            moved: VecDeque::new(),
            covered: None,
            marker: None,
            resend: VecDeque::new(),
            transaction: None,
            last_commit: Instant::now(),
            shared,
        }
    }

    pub(super) async fn run(mut self) -> Ended {
        if let Err(ended) = self.begin().await {
            return ended;
        }
        let mut tick = tokio::time::interval(self.shared.settings.watermark_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some((origin, message)) = self.resend.pop_front() {
                if let Err(ended) = self.send_again(origin, message).await {
                    return ended;
                }
                continue;
            }
            tokio::select! {
                // The tick first: ready once an interval, it cannot starve the others, and
                // under a flood of inputs it must still commit and mark.
                biased;
                _ = tick.tick() => {
                    if let Err(ended) = self.on_tick().await {
                        return ended;
                    }
                }
                Some((offset, result)) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    if let Err(ended) = self.delivered(offset, result).await {
                        return ended;
                    }
                }
                message = self.inputs.recv(), if self.in_flight.len() < MAX_IN_FLIGHT => {
                    match message {
                        Some(message) => {
                            if let Err(ended) = self.forward(message).await {
                                return ended;
                            }
                        }
                        None => break,
                    }
                }
            }
        }
        self.finish().await
    }

    /// The exactly-once mode: this partition's transactional producer (fencing any earlier
    /// one of the partition) and its first transaction.
    async fn begin(&mut self) -> Result<(), Ended> {
        let Some(t) = &self.shared.settings.transactions else {
            return Ok(());
        };
        let id = format!("{}-{}", t.id_prefix, self.partition);
        let producer: FutureProducer<KafkaContext> = t
            .producer
            .clone()
            .set("transactional.id", &id)
            .create_with_context(self.shared.settings.kafka.clone())
            .map_err(|e| {
                tracing::error!(partition = self.partition, error = %e, "repartition stage: cannot create the transactional producer");
                Ended::Restart
            })?;
        let ready = {
            let producer = producer.clone();
            blocking(move || {
                producer.init_transactions(TRANSACTION_CALL)?;
                producer.begin_transaction()
            })
            .await
        };
        if let Err(e) = ready {
            tracing::warn!(partition = self.partition, transactional_id = %id, error = %e, "repartition stage: the transactional producer could not start");
            return Err(ended_by(&e));
        }
        self.transaction = Some((producer, false));
        self.last_commit = Instant::now();
        Ok(())
    }

    fn producer(&self) -> &FutureProducer<KafkaContext> {
        match &self.transaction {
            Some((producer, _)) => producer,
            None => self
                .shared
                .producer
                .as_ref()
                .expect("the shared producer outside the exactly-once mode"),
        }
    }

    /// One input: to the repartition topic, keyed by its watch key, or to the dead-letter
    /// topic.
    async fn forward(&mut self, message: OwnedMessage) -> Result<(), Ended> {
        let offset = message.offset();
        let s = &self.shared.settings;
        let now = s.clock.now_ms();
        let decoded = loop {
            match s.decoder.decode(
                message.key(),
                message.payload(),
                message.timestamp().to_millis(),
                now,
            ) {
                Attempt::Done(decoded) => break decoded,
                Attempt::Fetch(id) => {
                    // Keep the input until the registry answers; nothing is dead-lettered
                    // for its absence.
                    while s.decoder.fetch(id).await.is_err() {
                        if self.lost.load(Ordering::SeqCst) {
                            return Err(Ended::Done);
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        };
        let time = s
            .decoder
            .watermark_time(&decoded, message.timestamp().to_millis(), now);
        if let Some(time) = time {
            let before = self.watermark.watermark();
            let value = decoded.as_ref().ok().map(|input| &input.value);
            self.watermark.on_record(time, value, now);
            if let Some(after) = self.watermark.watermark().filter(|w| Some(*w) != before) {
                self.moved.push_back((offset, after));
            }
        }
        let record = match decoded {
            Ok(input) => {
                InputRepartitioned.emit(&s.metrics);
                let source = Source {
                    topic: &s.input_topic,
                    partition: self.partition,
                    offset,
                };
                OutRecord {
                    topic: s.topic.clone(),
                    // As librdkafka's default partitioner would: the operations API's `crc32`
                    // answer names the watch's partition.
                    partition: Some(crc32_partition(&input.key, s.partitions)),
                    key: Some(input.key),
                    value: message.payload().map(Bytes::copy_from_slice),
                    // Stamped by librdkafka as it is sent; the input's own timestamp goes
                    // in a header (`records::INPUT_TIMESTAMP`, why there).
                    timestamp: None,
                    headers: std::iter::once(input_source(&source))
                        .chain(message.timestamp().to_millis().map(input_timestamp))
                        .collect(),
                }
            }
            Err(rejected) => self.dead_letter(&message, &rejected),
        };
        // The input's own headers, but a source a record re-sent from elsewhere may carry.
        let headers = message.headers().map(|h| {
            h.iter()
                .filter(|h| h.key != INPUT_SOURCE && h.key != INPUT_TIMESTAMP)
                .fold(OwnedHeaders::new(), |all, h| all.insert(h))
        });
        self.tracker.caused(offset);
        self.tracker.consumed(offset);
        self.send(Some(offset), &record, headers).await
    }

    fn dead_letter(&self, message: &OwnedMessage, rejected: &Rejected) -> OutRecord {
        let s = &self.shared.settings;
        let error = rejected.to_string();
        InputDeadLettered {
            partition: self.partition,
            offset: message.offset(),
            reason: rejected.kind(),
            error: &error,
        }
        .emit(&s.metrics);
        OutRecord::dead_letter(
            &s.dlq_topic,
            &OutRecordParts::of_message(message),
            Source {
                topic: &s.input_topic,
                partition: self.partition,
                offset: message.offset(),
            },
            rejected.kind(),
            &error,
        )
    }

    /// Hand `record` to the producer (waiting while its queue is full), its delivery
    /// awaited for `origin`'s commit. `headers`: the input's own, as they came (a
    /// repartitioned input keeps them: an operator's order travels in one).
    async fn send(
        &mut self,
        origin: Option<i64>,
        record: &OutRecord,
        headers: Option<OwnedHeaders>,
    ) -> Result<(), Ended> {
        let mut all = headers.unwrap_or_default();
        for (name, value) in &record.headers {
            all = all.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        loop {
            let mut future = FutureRecord::to(&record.topic).headers(all.clone());
            if let Some(p) = record.partition {
                future = future.partition(p);
            }
            if let Some(k) = &record.key {
                future = future.key(&k[..]);
            }
            if let Some(v) = &record.value {
                future = future.payload(&v[..]);
            }
            if let Some(t) = record.timestamp {
                future = future.timestamp(t);
            }
            match self.producer().send_result(future) {
                Ok(delivery) => {
                    self.in_flight
                        .push(Box::pin(async move { (origin, delivery.await) }));
                    if let Some((_, holds)) = &mut self.transaction {
                        *holds = true;
                    }
                    return Ok(());
                }
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    _,
                )) => {
                    // Make room: take the next report (or wait a little if none is ours).
                    match self.in_flight.next().await {
                        Some((offset, result)) => self.delivered(offset, result).await?,
                        None => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
                Err((e, _)) => {
                    tracing::warn!(partition = self.partition, error = %e, "repartition stage: the producer did not take a record; the partition is read again from its last commit");
                    self.abort().await;
                    return Err(Ended::Restart);
                }
            }
        }
    }

    /// A delivery report. Outside transactions a failed record is sent again (a copy that
    /// landed after all is harmless: the watch side starts nothing twice); in a
    /// transaction, the transaction is aborted and the partition read again.
    async fn delivered(
        &mut self,
        origin: Option<i64>,
        result: Result<OwnedDeliveryResult, futures::channel::oneshot::Canceled>,
    ) -> Result<(), Ended> {
        match result {
            Ok(Ok(_)) => {
                if let Some(offset) = origin {
                    self.tracker.acknowledged(offset);
                }
                Ok(())
            }
            Ok(Err((e, message))) if self.transaction.is_none() && origin.is_some() => {
                if self.lost.load(Ordering::SeqCst) {
                    return Err(Ended::Done);
                }
                tracing::warn!(partition = self.partition, error = %e, "repartition stage: a record was not delivered; sending it again");
                self.resend.push_back((origin, message));
                Ok(())
            }
            // A marker outside transactions: the next one says it again.
            Ok(Err(_)) if self.transaction.is_none() => Ok(()),
            Ok(Err((e, _))) => {
                tracing::warn!(partition = self.partition, error = %e, "repartition stage: a record of the transaction was not delivered; aborting it, the partition is read again from its last commit");
                self.abort().await;
                Err(Ended::Restart)
            }
            Err(_) => Err(Ended::Restart),
        }
    }

    /// A record whose delivery failed, sent again after a pause (a copy that landed after
    /// all is harmless: the watch side starts nothing twice).
    async fn send_again(
        &mut self,
        origin: Option<i64>,
        message: OwnedMessage,
    ) -> Result<(), Ended> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let record = OutRecord {
            topic: Arc::from(message.topic()),
            partition: Some(message.partition()),
            key: message.key().map(Bytes::copy_from_slice),
            value: message.payload().map(Bytes::copy_from_slice),
            timestamp: message.timestamp().to_millis(),
            headers: Vec::new(),
        };
        let headers = message.headers().cloned();
        // Its input's commit still waits: for this copy now.
        self.send(origin, &record, headers).await
    }

    async fn on_tick(&mut self) -> Result<(), Ended> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(Ended::Done);
        }
        if self.transaction.is_some() {
            if self.last_commit.elapsed() >= self.shared.settings.commit_interval {
                self.commit().await?;
            }
            return Ok(());
        }
        if let Some(position) = self.publish_position() {
            while let Some(&(offset, watermark)) = self.moved.front() {
                if offset >= position {
                    break;
                }
                self.covered = Some(watermark);
                self.moved.pop_front();
            }
        }
        let idle = self.in_flight.is_empty()
            && self.watermark.is_idle(self.shared.settings.clock.now_ms());
        self.mark(self.covered, idle).await
    }

    /// Write the partition's watermark into every repartition partition, if it changed or
    /// was last written [`MARKER_EVERY`] ago.
    async fn mark(&mut self, watermark: Option<Millis>, idle: bool) -> Result<(), Ended> {
        if let Some((w, i, at)) = self.marker {
            if w == watermark && i == idle && at.elapsed() < MARKER_EVERY {
                return Ok(());
            }
        }
        let s = self.shared.clone();
        let s = &s.settings;
        let message = WatermarkMessage::Partition {
            topic: s.input_topic.to_string(),
            partition: self.partition,
            watermark_ms: watermark.unwrap_or(Millis::MIN),
            idle,
        };
        let (key, json) = (message.key(), message.to_json());
        for partition in 0..s.partitions {
            let record = OutRecord::watermark(&s.topic, Some(partition), key.clone(), json.clone());
            self.send(None, &record, None).await?;
        }
        self.marker = Some((watermark, idle, Instant::now()));
        Ok(())
    }

    /// The exactly-once mode's commit: every record of the transaction acknowledged, the
    /// partition's watermark written after them, the input position committed with them.
    async fn commit(&mut self) -> Result<(), Ended> {
        while let Some((offset, result)) = self.in_flight.next().await {
            self.delivered(offset, result).await?;
        }
        let now = self.shared.settings.clock.now_ms();
        let idle = self.watermark.is_idle(now);
        self.mark(self.watermark.watermark(), idle).await?;
        while let Some((offset, result)) = self.in_flight.next().await {
            self.delivered(offset, result).await?;
        }
        self.last_commit = Instant::now();
        let position = self.tracker.next();
        let Some((producer, holds)) = self.transaction.as_mut() else {
            return Ok(());
        };
        if !*holds && position.is_none() {
            return Ok(());
        }
        let s = &self.shared.settings;
        let t = s
            .transactions
            .as_ref()
            .expect("transactions in the exactly-once mode");
        let mut offsets = TopicPartitionList::new();
        if let Some(position) = position {
            let _ = offsets.add_partition_offset(
                &s.input_topic,
                self.partition,
                rdkafka::Offset::Offset(position),
            );
        }
        let committed = {
            let (producer, group) = (producer.clone(), t.group.clone());
            blocking(move || {
                if position.is_some() {
                    producer.send_offsets_to_transaction(&offsets, &group, TRANSACTION_CALL)?;
                }
                producer.commit_transaction(TRANSACTION_CALL)?;
                producer.begin_transaction()
            })
            .await
        };
        match committed {
            Ok(()) => {
                *holds = false;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(partition = self.partition, error = %e, "repartition stage: the transaction did not commit; the partition is read again from its last commit");
                let ended = ended_by(&e);
                self.abort().await;
                Err(ended)
            }
        }
    }

    /// Abort the open transaction, if any (the partition is read again from its last
    /// commit).
    async fn abort(&mut self) {
        if let Some((producer, _)) = self.transaction.take() {
            let _ = blocking(move || {
                producer.abort_transaction(Timeout::After(Duration::from_secs(10)))
            })
            .await;
        }
    }

    /// The stop: what was read is delivered (within the stop timeout) and committed.
    async fn finish(mut self) -> Ended {
        if self.lost.load(Ordering::SeqCst) {
            self.abort().await;
            return Ended::Done;
        }
        if self.transaction.is_some() {
            let stop_timeout = self.shared.settings.stop_timeout;
            return match tokio::time::timeout(stop_timeout, self.commit()).await {
                Ok(Ok(())) => Ended::Done,
                Ok(Err(ended)) => ended,
                Err(_) => {
                    self.abort().await;
                    Ended::Done
                }
            };
        }
        let deadline = tokio::time::Instant::now() + self.shared.settings.stop_timeout;
        while !self.in_flight.is_empty() {
            match tokio::time::timeout_at(deadline, self.in_flight.next()).await {
                Ok(Some((offset, result))) => {
                    if self.delivered(offset, result).await.is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
        self.publish_position();
        Ended::Done
    }

    /// Outside transactions: the position below which every input's record is
    /// acknowledged, if it moved, published for the consumer thread to store and commit.
    fn publish_position(&mut self) -> Option<i64> {
        let position = self.tracker.to_commit()?;
        self.shared
            .positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.partition, position);
        Some(position)
    }
}

/// What a failed transactional call means: fenced (or another fatal error of the
/// producer), or an abort and a fresh start from the last commit.
fn ended_by(error: &KafkaError) -> Ended {
    let fatal = matches!(error, KafkaError::Transaction(e) if e.is_fatal());
    let fenced = matches!(
        error.rdkafka_error_code(),
        Some(
            rdkafka::types::RDKafkaErrorCode::ProducerFenced
                | rdkafka::types::RDKafkaErrorCode::InvalidProducerEpoch
        )
    );
    if fatal || fenced {
        Ended::Fenced
    } else {
        Ended::Restart
    }
}

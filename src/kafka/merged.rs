//! The merged watermark over every partition of the input topic, across instances.
//!
//! Each instance publishes only the partitions it owns. The merged value must cover all of
//! them, so every instance reads the watermark topic back (it is small: one partition,
//! compacted, a record per change) and merges the latest value of each input partition
//! (min over the non-idle ones, never backwards, never below the last `merged` record; see
//! `watermark::topic`). Every instance exports that value as
//! `watchbridge_watermark_timestamp_seconds`; the owner of input partition 0 also publishes
//! it, as the `merged` record, so there is one writer however the partitions move
//! ([`MergedWriterClaim`]: only while that partition's task runs with its state restored,
//! and only while the instance's lease lets it write).
//!
//! Nothing is published while the reader replays the topic (until it reaches the end it
//! found at its start: the last `merged` record may still come), nor by a new owner of
//! partition 0 before it has read what the previous writer wrote: either could publish a
//! value below one already on the topic. "What the previous writer wrote" ends at the
//! topic's high watermark, not at its last stable offset: a transaction another partition's
//! owner has open on the topic can come before it ([`ReadBackWait`]).

use crate::clock::Clock;
use crate::internal_events::{
    MergedWatermarkChanged, MergedWriterChanged, ReadBackOutcome, WatermarkLag, WatermarkReadBack,
};
use crate::kafka::health::KafkaContext;
use crate::kafka::produce::send_and_wait;
use crate::kafka::records::OutRecord;
use crate::kafka::recovery::Lookups;
use crate::kafka::stats::BridgeProducer;
use crate::metrics::Metrics;
use crate::readiness::{Readiness, WatermarkWaiter};
use crate::watermark::{SharedWatermarkTopic, WatermarkMessage, WatermarkTopic, END_OF_TIME};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub struct MergedPublisher {
    /// The reader's settings ([`KafkaSettings::watermark_reader`]: read committed, from
    /// offset 0, in the bridge's group, nothing committed).
    ///
    /// [`KafkaSettings::watermark_reader`]: super::clients::KafkaSettings::watermark_reader
    pub consumer_config: ClientConfig,
    /// The reader's context (its errors and log lines go to the bridge's broker health).
    pub kafka: KafkaContext,
    pub producer: BridgeProducer,
    pub input_topic: Arc<str>,
    pub watermark_topic: Arc<str>,
    pub interval: Duration,
    /// Whether this instance writes the `merged` record now, and since which claim.
    pub claim: Arc<MergedWriterClaim>,
    /// Whether this instance may write at all (not after a stall, until the group confirms
    /// its partitions): a stalled writer that runs again must not publish what it derived
    /// before the stall on top of the next writer's values.
    pub lease: Arc<crate::kafka::lease::Lease>,
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
    /// Looks the topic's end up for the new writer ([`Lookups::watermark_end`]).
    pub lookups: Lookups,
    /// Told while the new writer waits for the reader (`/readyz` says so).
    pub readiness: Arc<Readiness>,
    /// How long the new writer waits at most ([`read_back_limit`]).
    pub read_back_limit: Duration,
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
        let mut writer_from: Option<(u64, ReadBackWait)> = None;
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut published = None;
        let mut refusal_logged = None;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                message = consumer.recv() => match message {
                    Ok(m) => {
                        self.read_upto.fetch_max(m.offset() + 1, Ordering::SeqCst);
                        if OutRecord::is_settle(&m) {
                            // A restoring partition's (`partition/settle.rs`): no value.
                            continue;
                        }
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
                    // An ACL missing is no passing trouble: said at ERROR, once a minute.
                    Err(e) if e.rdkafka_error_code().is_some_and(super::refusal::is_refusal) => {
                        if refusal_logged.is_none_or(|at: std::time::Instant| at.elapsed() >= Duration::from_secs(60)) {
                            refusal_logged = Some(std::time::Instant::now());
                            tracing::error!(
                                error = %e,
                                topic = %self.watermark_topic,
                                "the brokers' authorizer refused READ on topic `{}` (the watermark \
                                 topic): no merged watermark, and a partition taken over cannot \
                                 read its previous owner's floor; grant READ on it (docs/brokers.md, \
                                 \"Least privilege\")",
                                self.watermark_topic
                            );
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "reading the watermark topic"),
                },
                _ = ticks.tick() => {
                    if !self.publishes || reading == Reading::Replaying {
                        continue;
                    }
                    // Every tick, whatever the value: a wait ends (and `/readyz` with it)
                    // though nothing is published.
                    let writer = self.writer(&mut writer_from).await;
                    let current = self.topic_state().merged();
                    // `Millis::MIN`: only partitions that never had a watermark; nothing to say.
                    if current.is_none_or(|c| c == crate::clock::Millis::MIN) {
                        continue;
                    }
                    if current == published {
                        // Unchanged, but event time falls further behind as time passes.
                        WatermarkLag { watermark: current.unwrap_or_default(), now: self.clock.now_ms() }.emit(&self.metrics);
                        continue;
                    }
                    let watermark = current.unwrap_or_default();
                    if writer {
                        if !self.lease.may_write() || !self.publish(watermark).await {
                            // Not on the topic: try again at the next tick.
                            continue;
                        }
                    } else if self.claim.current().is_some() {
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
    async fn writer(&self, writer_from: &mut Option<(u64, ReadBackWait)>) -> bool {
        let Some(claim) = self.claim.current() else {
            *writer_from = None;
            return false;
        };
        // A new claim (partition 0 restored again, here or after a takeover): what another
        // writer published meanwhile is read first.
        if writer_from.as_ref().is_none_or(|(from, _)| *from != claim) {
            let (lookups, topic) = (self.lookups.clone(), self.watermark_topic.clone());
            let end = tokio::task::spawn_blocking(move || lookups.watermark_end(&topic)).await;
            let Ok(Ok(end)) = end else {
                return false;
            };
            *writer_from = Some((
                claim,
                ReadBackWait::new(
                    WatermarkWaiter::Merged,
                    end,
                    self.read_back_limit,
                    self.readiness.clone(),
                    self.metrics.clone(),
                ),
            ));
        }
        writer_from
            .as_mut()
            .is_some_and(|(_, wait)| wait.passed(self.read_upto.load(Ordering::SeqCst)))
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

/// Which instance writes the `merged` record: the one whose task for input partition 0 runs
/// with its state restored. Not from the partition's assignment on: a task that waits to
/// start (its previous owner's records may still land, `kafka::delayed_restart`) has not
/// read them yet, and a task that ended (a failed delivery, a fencing) leaves the partition
/// waiting or to another instance; a claim kept through either made two writers, and the
/// stale one published a merged value below the other's (three nodes, `recovery`, chaos
/// seed 27: 5.7 s back). Each claim has its own number, so that the publisher reads what
/// was published before every new claim, even one that follows its own release at once.
#[derive(Debug, Default)]
pub struct MergedWriterClaim {
    /// The claim in force; 0: none.
    current: std::sync::atomic::AtomicU64,
    last: std::sync::atomic::AtomicU64,
}

impl MergedWriterClaim {
    /// Partition 0's task has restored its state: this instance writes until the task drops
    /// what this returns (it ended) or the partition is revoked ([`Self::release_any`]).
    pub fn claim(self: &Arc<Self>, metrics: &Arc<Metrics>) -> Claimed {
        let number = self.last.fetch_add(1, Ordering::SeqCst) + 1;
        self.current.store(number, Ordering::SeqCst);
        MergedWriterChanged { writing: true }.emit(metrics);
        Claimed {
            claims: self.clone(),
            number,
            metrics: metrics.clone(),
        }
    }

    /// A task's claim is over (a newer one is left alone).
    fn release(&self, claim: u64, metrics: &Metrics) {
        if self
            .current
            .compare_exchange(claim, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            MergedWriterChanged { writing: false }.emit(metrics);
        }
    }

    /// Partition 0 was taken from this instance: no claim holds, whichever task made it.
    pub fn release_any(&self, metrics: &Metrics) {
        if self.current.swap(0, Ordering::SeqCst) != 0 {
            MergedWriterChanged { writing: false }.emit(metrics);
        }
    }

    /// The claim in force, if any.
    pub fn current(&self) -> Option<u64> {
        Some(self.current.load(Ordering::SeqCst)).filter(|&c| c != 0)
    }
}

/// A task's claim to write the merged record, released when the task drops it.
pub struct Claimed {
    claims: Arc<MergedWriterClaim>,
    number: u64,
    metrics: Arc<Metrics>,
}

impl Drop for Claimed {
    fn drop(&mut self) {
        self.claims.release(self.number, &self.metrics);
    }
}

/// librdkafka's `transaction.timeout.ms` when it is not set.
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// After the transaction timeout: the coordinator aborts an expired transaction at its next
/// check (Kafka's `transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s), and
/// the reader then reads past its marker.
const READ_BACK_MARGIN: Duration = Duration::from_secs(20);

/// A wait that lasts this long is logged (`/readyz` says so from its start).
const REPORT_AFTER: Duration = Duration::from_secs(5);

/// How long a takeover waits at most for the reader to pass the previous owner's records:
/// what hides them from a `read_committed` reader is a transaction open on the topic,
/// which ends within `transaction.timeout.ms` (the instances' own setting, `timeout_ms`),
/// plus a margin. Longer, the topic cannot be read, and the takeover goes on without the
/// previous owner's last value (logged).
pub fn read_back_limit(timeout_ms: Option<&str>) -> Duration {
    let timeout = timeout_ms
        .and_then(|ms| ms.trim().parse().ok())
        .map_or(DEFAULT_TRANSACTION_TIMEOUT, Duration::from_millis);
    timeout + READ_BACK_MARGIN
}

/// One wait for the watermark topic's reader to pass `end`, the topic's high watermark when
/// a partition was taken over ([`Lookups::watermark_end`]): then it has read every record
/// the previous owner committed (a `read_committed` reader passes the high watermark once
/// every transaction open across it has ended). While it waits `/readyz` says so; a wait
/// of over `REPORT_AFTER` is logged, and one past the limit gives up (logged).
pub struct ReadBackWait {
    waiter: WatermarkWaiter,
    end: i64,
    since: tokio::time::Instant,
    limit: Duration,
    /// Whether it is over (read, or given up).
    over: bool,
    /// Whether `/readyz` was told, and whether the wait was logged.
    told: bool,
    logged: bool,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
}

impl ReadBackWait {
    pub fn new(
        waiter: WatermarkWaiter,
        end: i64,
        limit: Duration,
        readiness: Arc<Readiness>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            waiter,
            end,
            since: tokio::time::Instant::now(),
            limit,
            over: false,
            told: false,
            logged: false,
            readiness,
            metrics,
        }
    }

    /// Whether the wait is over, with the reader at `read_to`: it has passed the end, or
    /// the limit has.
    pub fn passed(&mut self, read_to: i64) -> bool {
        if self.over {
            return true;
        }
        let waited = self.since.elapsed();
        let outcome = if read_to >= self.end {
            ReadBackOutcome::Read
        } else if waited > self.limit {
            ReadBackOutcome::GaveUp
        } else {
            ReadBackOutcome::Waiting
        };
        let report = |outcome| {
            WatermarkReadBack {
                waiter: self.waiter,
                read_to,
                end: self.end,
                waited,
                outcome,
            }
            .emit(&self.metrics)
        };
        match outcome {
            ReadBackOutcome::Waiting => {
                if !self.told {
                    self.told = true;
                    self.readiness
                        .reading_watermarks(self.waiter, true, &self.metrics);
                }
                if !self.logged && waited > REPORT_AFTER {
                    self.logged = true;
                    report(outcome);
                }
                false
            }
            ReadBackOutcome::Read | ReadBackOutcome::GaveUp => {
                if self.logged || outcome == ReadBackOutcome::GaveUp {
                    report(outcome);
                }
                self.over = true;
                self.untell();
                true
            }
        }
    }

    fn untell(&mut self) {
        if std::mem::take(&mut self.told) {
            self.readiness
                .reading_watermarks(self.waiter, false, &self.metrics);
        }
    }
}

impl Drop for ReadBackWait {
    /// A wait left unfinished (the partition revoked, partition 0 no longer this
    /// instance's) is no reason not to be ready.
    fn drop(&mut self) {
        self.untell();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One writer of the merged record however partition 0 moves: a claim ends with its
    /// own task or with the partition's revocation, never with an older task's end, and
    /// every claim is new (the publisher reads what was published before each).
    #[test]
    fn a_claim_ends_with_its_own_task_or_the_revocation() {
        let metrics = Arc::new(Metrics::new());
        let claims = Arc::new(MergedWriterClaim::default());
        assert_eq!(claims.current(), None);
        let first = claims.claim(&metrics);
        assert_eq!(metrics.merged_watermark_writer.get(), 1);
        claims.release_any(&metrics);
        assert_eq!(claims.current(), None, "revoked: no writer here");
        assert_eq!(metrics.merged_watermark_writer.get(), 0);
        let second = claims.claim(&metrics);
        assert_ne!(first.number, second.number);
        drop(first);
        assert_eq!(
            claims.current(),
            Some(second.number),
            "an older task's end leaves it"
        );
        drop(second);
        assert_eq!(claims.current(), None);
        assert_eq!(metrics.merged_watermark_writer.get(), 0);
    }

    #[test]
    fn the_limit_is_the_transaction_timeout_and_a_margin() {
        assert_eq!(read_back_limit(None), Duration::from_secs(80));
        assert_eq!(read_back_limit(Some("10000")), Duration::from_secs(30));
        assert_eq!(
            read_back_limit(Some("not a number")),
            Duration::from_secs(80)
        );
    }

    #[test]
    fn a_wait_is_not_ready_until_the_reader_passes_the_end() {
        let (m, r) = (Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        r.assignment_received(&m);
        let wait = |r: &Arc<Readiness>, limit| {
            ReadBackWait::new(
                WatermarkWaiter::Partition(2),
                10,
                limit,
                r.clone(),
                m.clone(),
            )
        };
        let mut waiting = wait(&r, Duration::from_secs(60));
        assert!(!waiting.passed(9));
        assert!(r
            .check(&m)
            .unwrap_err()
            .to_string()
            .contains("input partition 2"));
        assert!(waiting.passed(10));
        assert_eq!(r.check(&m), Ok(()));
        // Once over, over.
        assert!(waiting.passed(0));
        // Left unfinished (revoked): ready again.
        let mut revoked = wait(&r, Duration::from_secs(60));
        assert!(!revoked.passed(3));
        assert!(r.check(&m).is_err());
        drop(revoked);
        assert_eq!(r.check(&m), Ok(()));
        // Past the limit it gives up.
        let mut stuck = wait(&r, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(stuck.passed(3));
        assert_eq!(r.check(&m), Ok(()));
    }
}

//! The repartition stage (issue 51): with `WATCHBRIDGE_WATCH_KEY` naming a field that is
//! not the record key, two inputs of one watch can land on two input partitions, and each
//! partition would start a watch of its own (every output twice). Beam's `Watch` and Kafka
//! Streams key by the watch's identity before they keep state; so does this stage. It
//! reads the input topic in a group of its own (`<group>.repartition`), reads each input's
//! watch key and event time, and writes the input (its value and headers as they came) to
//! the repartition topic, keyed by the watch key, at the record timestamp of its event
//! time, in the partition the key hashes to (CRC-32, librdkafka's default). The watch
//! side — the bridge as it is without this stage — reads the repartition topic as its
//! input: one watch key, one partition, one watch.
//!
//! What each stage commits, and why that is exactly once:
//!
//! - `recovery` (and `at_least_once`): an input's offset is stored for the group's commit
//!   once its repartition record (or its dead letter) is acknowledged. A crash before the
//!   commit writes it again: the repartition topic may hold an input twice. That is
//!   harmless: the watch side starts nothing for an input whose watch is live, or finished
//!   within `WATCHBRIDGE_FINISHED_RETENTION`, across its own restarts and takeovers (its
//!   state topic keeps both), and a failed watch started again by the copy emits only what
//!   it had not found.
//! - `exactly_once`: each input partition has a transactional producer of its own
//!   (`watchbridge-<group>.repartition-<input topic>-<partition>`, so the partition's next
//!   owner fences a stalled one); the repartition records and the input offsets go in one
//!   transaction, committed every `WATCHBRIDGE_CHECKPOINT_INTERVAL` (Kafka Streams'
//!   repartition topics work so), and the watch side reads the repartition topic
//!   `read_committed`. A failure aborts and reads the partition again from its last commit.
//!
//! Event time: an input partition's watermark (its generator, as the bridge's own
//! strategy makes it) travels in-band: every second, and whenever it changes, this stage
//! writes it into every partition of the repartition topic (`watchbridge-control:
//! watermark`, the watermark topic's message form), after the inputs it covers — in the
//! `recovery` mode only what lies below the acknowledged position, so that no input the
//! marker covers is still on its way. The watch side's input watermark is the minimum of
//! the markers of every input partition (`watermark::upstream`, Flink's rule after a
//! `keyBy`).

mod forward;

use crate::clock::Clock;
use crate::formats::input::InputDecoder;
use crate::kafka::consumer::{
    close_by, commit_stored, start_at, store_positions, without_start, ConsumerFailing,
    NoCommitStart,
};
use crate::kafka::health::{is_connection_error, KafkaContext};
use crate::metrics::Metrics;
use crate::watermark::Generators;
use forward::{Ended, Forwarder};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance,
};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Inputs buffered per partition between the stage's consumer thread and its task.
const INPUT_BUFFER: usize = 1024;

/// The wait before a partition whose task failed is read again from its last commit.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);

/// What the stage is made of (`bridge/repartition.rs` makes it from the run's settings).
pub struct RepartitionSettings {
    pub input_topic: Arc<str>,
    /// `<group>.repartition` unless `WATCHBRIDGE_REPARTITION_TOPIC` says otherwise.
    pub topic: Arc<str>,
    /// Its partition count (the input topic's, as the bridge creates it).
    pub partitions: i32,
    pub dlq_topic: Arc<str>,
    /// The stage's consumer group (`<group>.repartition`).
    pub group_id: String,
    /// Reads each input's watch key and time, as the bridge would.
    pub decoder: Arc<InputDecoder>,
    /// The group consumer of the input topic.
    pub consumer: ClientConfig,
    /// A client of the bridge's own group (`WATCHBRIDGE_GROUP_ID`), only to read where that
    /// group left the input topic: a partition the stage has no commit for starts there
    /// (the group ran without the repartition topic before), not from its beginning.
    pub handover: ClientConfig,
    /// The idempotent producer's settings (recovery, at_least_once).
    pub producer: ClientConfig,
    /// `Some` in the exactly-once mode.
    pub transactions: Option<StageTransactions>,
    pub commit_interval: Duration,
    pub generators: Generators,
    pub watermark_interval: Duration,
    pub idle_timeout: Duration,
    pub stop_timeout: Duration,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    pub kafka: KafkaContext,
}

/// The exactly-once mode's transactional producers.
pub struct StageTransactions {
    /// The producer settings with the transaction timeouts (`transactional.id` added per
    /// partition).
    pub producer: ClientConfig,
    /// `watchbridge-<group>.repartition-<input topic>`; the partition is appended.
    pub id_prefix: String,
    /// The stage's group, for `send_offsets_to_transaction`.
    pub group: Arc<ConsumerGroupMetadata>,
}

/// What the tasks share.
struct Shared {
    settings: RepartitionSettings,
    /// The idempotent producer of every task (not in the exactly-once mode).
    producer: Option<FutureProducer<KafkaContext>>,
    /// Commit positions the tasks publish, for the consumer thread to store.
    positions: Mutex<HashMap<i32, i64>>,
}

/// One assigned input partition's task, as the consumer thread sees it.
struct Running {
    inputs: mpsc::Sender<OwnedMessage>,
    ended: std_mpsc::Receiver<Ended>,
    lost: Arc<AtomicBool>,
}

/// The stage's partitions: shared by its consumer thread and its rebalance callbacks (both
/// run on that thread; the mutexes are never contended).
struct Stage {
    shared: Arc<Shared>,
    /// The bridge's own group's client (`RepartitionSettings::handover`).
    handover: Option<BaseConsumer>,
    runtime: tokio::runtime::Handle,
    running: Mutex<HashMap<i32, Running>>,
    /// Partitions whose task ended on a failure, and when they are read again.
    restarts: Mutex<HashMap<i32, Instant>>,
}

impl Stage {
    fn spawn(&self, partition: i32) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.contains_key(&partition) {
            return;
        }
        let (inputs, receiver) = mpsc::channel(INPUT_BUFFER);
        let (ended_tx, ended) = std_mpsc::channel();
        let lost = Arc::new(AtomicBool::new(false));
        let forwarder = Forwarder::new(partition, self.shared.clone(), receiver, lost.clone());
        self.runtime.spawn(async move {
            let _ = ended_tx.send(forwarder.run().await);
        });
        tracing::info!(partition, "repartition stage: input partition assigned");
        running.insert(
            partition,
            Running {
                inputs,
                ended,
                lost,
            },
        );
    }

    /// Stop the tasks of `partitions`: each forwards what it read, commits (or publishes
    /// its position) and ends, within the stop timeout; `lost`: they write nothing more.
    fn stop(&self, partitions: &[i32], lost: bool) {
        let removed: Vec<Running> = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            partitions
                .iter()
                .filter_map(|p| running.remove(p))
                .collect()
        };
        self.restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|p, _| !partitions.contains(p));
        let deadline = Instant::now() + self.shared.settings.stop_timeout + Duration::from_secs(1);
        let waiting: Vec<_> = removed
            .into_iter()
            .map(|r| {
                if lost {
                    r.lost.store(true, Ordering::SeqCst);
                }
                drop(r.inputs);
                (r.ended, r.lost)
            })
            .collect();
        for (ended, task_lost) in waiting {
            let left = deadline.saturating_duration_since(Instant::now());
            if ended.recv_timeout(left).is_err() {
                // Its partition's next owner may start now: it writes nothing more.
                task_lost.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Tasks that ended on their own (a failed delivery, an aborted transaction, a fenced
    /// producer): read again from the last commit after a backoff.
    fn reap(&self) {
        let now = Instant::now();
        let mut ended = Vec::new();
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&partition, r| match r.ended.try_recv() {
                Ok(why) => {
                    ended.push((partition, why));
                    false
                }
                Err(std_mpsc::TryRecvError::Empty) => true,
                Err(std_mpsc::TryRecvError::Disconnected) => {
                    ended.push((partition, Ended::Restart));
                    false
                }
            });
        let mut restarts = self.restarts.lock().unwrap_or_else(|p| p.into_inner());
        for (partition, why) in ended {
            let wait = match why {
                Ended::Fenced => RESTART_BACKOFF * 5,
                _ => RESTART_BACKOFF,
            };
            restarts.insert(partition, now + wait);
        }
    }

    /// Start again the partitions whose wait is over, from their last commit, if they are
    /// still this instance's.
    fn restart_due(&self, consumer: &BaseConsumer<StageContext>) {
        let due: Vec<i32> = {
            let mut restarts = self.restarts.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let due: Vec<i32> = restarts
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(p, _)| *p)
                .collect();
            for p in &due {
                restarts.remove(p);
            }
            due
        };
        if due.is_empty() || consumer.assignment_lost() {
            return;
        }
        let topic = &*self.shared.settings.input_topic;
        let assignment = consumer.assignment().ok();
        for partition in due {
            if assignment
                .as_ref()
                .is_none_or(|a| a.find_partition(topic, partition).is_none())
            {
                continue;
            }
            let start = match self.starts(consumer, &[partition]) {
                Ok(starts) => starts.get(&partition).copied().unwrap_or(self.no_commit()),
                Err(e) => {
                    tracing::warn!(partition, error = %e, "repartition stage: cannot read the partition's last commit; trying again");
                    self.retry_later(partition);
                    continue;
                }
            };
            if let Err(e) = consumer.seek(topic, partition, start, Duration::from_secs(10)) {
                tracing::warn!(partition, error = %e, "repartition stage: cannot read the partition again from its last commit; trying again");
                self.retry_later(partition);
                continue;
            }
            tracing::info!(partition, offset = ?start, "repartition stage: reading the partition again from its last commit");
            self.spawn(partition);
        }
    }

    /// Hand `message` to its partition's task, waiting while the task is behind (the
    /// stage's backpressure) unless a stop comes. A partition without a task (waiting to
    /// start again), or a stop, drops it: uncommitted, it is read again.
    fn route(&self, mut message: OwnedMessage, stop: &AtomicBool) {
        let inputs = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.get(&message.partition()).map(|r| r.inputs.clone())
        };
        let Some(inputs) = inputs else {
            return;
        };
        loop {
            match inputs.try_send(message) {
                Err(mpsc::error::TrySendError::Full(back)) if !stop.load(Ordering::Relaxed) => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                _ => return,
            }
        }
    }

    /// Store the positions the tasks published, for librdkafka to commit.
    fn store_positions(&self, consumer: &BaseConsumer<StageContext>) {
        let settings = &self.shared.settings;
        store_positions(consumer, &settings.input_topic, &self.shared.positions);
    }

    /// Commit what is stored (not in the exactly-once mode, whose transactions commit).
    fn commit(&self, consumer: &BaseConsumer<StageContext>) {
        if self.shared.settings.transactions.is_some() {
            return;
        }
        self.store_positions(consumer);
        if let Err(e) = commit_stored(consumer) {
            tracing::warn!(error = %e, "repartition stage: commit failed; uncommitted inputs are forwarded again (the watch side starts nothing twice)")
        }
    }

    fn all(&self) -> Vec<i32> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.keys().copied().collect()
    }

    /// Start `partition` again after [`RESTART_BACKOFF`].
    fn retry_later(&self, partition: i32) {
        self.restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(partition, Instant::now() + RESTART_BACKOFF);
    }

    /// Where a partition with no commit anywhere starts (`auto.offset.reset`).
    fn no_commit(&self) -> Offset {
        let reset = self.shared.settings.consumer.get("auto.offset.reset");
        match NoCommitStart::from_reset(reset) {
            NoCommitStart::End => Offset::End,
            NoCommitStart::First | NoCommitStart::Librdkafka => Offset::Beginning,
        }
    }

    /// Where each of `partitions` starts: the stage's own commit; else where the bridge's
    /// own group left the input topic, when it read it without the repartition topic
    /// (turning repartitioning on for a group that ran: what that group read was handled,
    /// and is not forwarded again). A partition with neither is left out. An error if the
    /// stage's own commits cannot be read.
    fn starts(
        &self,
        consumer: &BaseConsumer<StageContext>,
        partitions: &[i32],
    ) -> Result<HashMap<i32, Offset>, KafkaError> {
        let topic = &*self.shared.settings.input_topic;
        let mut asked = TopicPartitionList::new();
        for &p in partitions {
            asked.add_partition(topic, p);
        }
        let timeout = Duration::from_secs(5);
        let commit_of = |list: &TopicPartitionList, p: i32| match list
            .find_partition(topic, p)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        let own = consumer.committed_offsets(asked.clone(), timeout)?;
        let handed = self
            .handover
            .as_ref()
            .and_then(|h| h.committed_offsets(asked, timeout).ok());
        let mut starts = HashMap::new();
        for &p in partitions {
            if let Some(o) = commit_of(&own, p) {
                starts.insert(p, Offset::Offset(o));
            } else if let Some(o) = handed.as_ref().and_then(|c| commit_of(c, p)) {
                tracing::info!(
                    partition = p,
                    offset = o,
                    "repartition stage: no commit of its own; starting where the bridge's \
                     group left the input topic without the repartition topic (what it read \
                     before is not forwarded again)"
                );
                starts.insert(p, Offset::Offset(o));
            }
        }
        Ok(starts)
    }

    /// Explicit start offsets for a new assignment `tpl`, as [`Self::starts`] says; a
    /// partition it has none for is left to `auto.offset.reset`.
    fn set_start_offsets(&self, consumer: &BaseConsumer<StageContext>, tpl: &TopicPartitionList) {
        let topic = &*self.shared.settings.input_topic;
        let partitions = without_start(tpl, topic);
        if partitions.is_empty() {
            return;
        }
        if let Ok(starts) = self.starts(consumer, &partitions) {
            start_at(tpl, topic, &starts);
        }
    }
}

/// librdkafka's callbacks for the stage's consumer.
struct StageContext {
    stage: Arc<Stage>,
    kafka: KafkaContext,
}

impl ClientContext for StageContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.kafka.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.kafka.error(error, reason);
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.stage.set_start_offsets(consumer, tpl);
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            let lost = consumer.assignment_lost();
            self.stage.stop(&partitions, lost);
            if !lost {
                self.stage.commit(consumer);
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            for element in tpl.elements() {
                self.stage.spawn(element.partition());
            }
        }
    }
}

/// The running stage: its consumer thread.
pub struct RepartitionStage {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RepartitionStage {
    /// Subscribe to the input topic and forward what it holds, on a thread of its own,
    /// until [`stop`](Self::stop).
    pub fn start(settings: RepartitionSettings) -> Result<Self, String> {
        let producer = match settings.transactions {
            Some(_) => None,
            None => Some(
                settings
                    .producer
                    .create_with_context::<_, FutureProducer<KafkaContext>>(settings.kafka.clone())
                    .map_err(|e| format!("the repartition stage's producer: {e}"))?,
            ),
        };
        let kafka = settings.kafka.clone();
        let consumer_config = settings.consumer.clone();
        // Not having it only costs the handover: the stage then starts as a new group does.
        let handover = settings.handover.create::<BaseConsumer>().ok();
        let topic = settings.input_topic.clone();
        let shared = Arc::new(Shared {
            settings,
            producer,
            positions: Mutex::new(HashMap::new()),
        });
        let stage = Arc::new(Stage {
            shared,
            handover,
            runtime: tokio::runtime::Handle::current(),
            running: Mutex::new(HashMap::new()),
            restarts: Mutex::new(HashMap::new()),
        });
        let consumer: BaseConsumer<StageContext> = consumer_config
            .create_with_context(StageContext {
                stage: stage.clone(),
                kafka,
            })
            .map_err(|e| format!("the repartition stage's consumer: {e}"))?;
        consumer
            .subscribe(&[&topic])
            .map_err(|e| format!("the repartition stage cannot subscribe to {topic}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("watchbridge-repartition".into())
                .spawn(move || consume(consumer, stage, stop))
                .map_err(|e| format!("the repartition stage's thread: {e}"))?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop reading; forward and commit what was read (within the stop timeout), leave the
    /// group. Blocks: call it off the runtime's workers.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn consume(consumer: BaseConsumer<StageContext>, stage: Arc<Stage>, stop: Arc<AtomicBool>) {
    let mut failing = ConsumerFailing::default();
    while !stop.load(Ordering::Relaxed) {
        stage.reap();
        stage.restart_due(&consumer);
        stage.store_positions(&consumer);
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(message)) => {
                if failing.reads() {
                    tracing::info!("the repartition stage's consumer reads again");
                }
                stage.route(message.detach(), &stop)
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            // A lost connection is the broker health's to report (once per outage).
            Some(Err(e)) if e.rdkafka_error_code().is_some_and(is_connection_error) => {}
            Some(Err(e)) => {
                let settings = &stage.shared.settings;
                let (topic, group) = (&settings.input_topic, &settings.group_id);
                failing.failed(&e, topic, group, &settings.metrics);
            }
        }
    }
    let lost = consumer.assignment_lost();
    stage.stop(&stage.all(), lost);
    if !lost {
        stage.commit(&consumer);
    }
    // Leaving the group waits for its coordinator: bounded.
    let by = Instant::now() + Duration::from_secs(5);
    close_by(consumer, "watchbridge-repartition-close", by);
}

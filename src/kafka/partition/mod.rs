//! One task per assigned input partition. It owns the watches started from that partition
//! (its own [`Engine`]; no locks shared with other partitions), turns their new outputs into
//! records, keeps their durable state ([`DurableState`]) and tracks which input offsets may
//! be committed.
//!
//! Before it reads an input or polls, it recovers the partition ([`recovery`]): the watches
//! saved on the state topic, plus the outputs on the output topic past the last checkpoint.
//! Then, every `WATCHBRIDGE_CHECKPOINT_INTERVAL`, it writes what changed. An input is
//! committed once its watch's first state record is acknowledged (or once its dead letter
//! is, or at once if its watch was running or finished).
//!
//! It reads inputs from a bounded channel fed by the consumer thread. While the producer's
//! queue is full it stops reading (the channel fills, and the consumer thread pauses the
//! partition): backpressure, never a drop. Polls run in the engine's own tasks, so a slow
//! resource never holds up reading inputs.
//!
//! When the channel closes (the partition was revoked, or the bridge is stopping) it stops
//! its watches, delivers what they already emitted, writes a last checkpoint, publishes its
//! final commit position and reports [`Stopped`].
//!
//! Here: the task, its inputs and its engine's events. Beside it: `state.rs` (recovery and
//! checkpoints), `delivery.rs` (handing records over, delivery reports, retries, dead
//! letters), `producer.rs` (the partition's own producer, purged when the task is given
//! up), `watermarks.rs` (publishing the partition's watermark), `transaction.rs` (the
//! exactly-once mode: the producer is transactional; a checkpoint is a commit).

mod delivery;
mod producer;
mod settle;
mod state;
mod transaction;
mod watermarks;

pub use producer::ProducerRestarts;
pub(crate) use transaction::blocking;
pub use transaction::{Ending, TransactionSettings};

use super::durable::{DurableState, StateWrite};
use super::offsets::{OffsetTracker, Origins};
use super::records::{input_record_time, OutRecord, OutRecordParts, Source};
use super::recovery::{self, RecoverySource};
use super::state_lookup::{Again, CONTROL_HEADER};
use super::stats::{BridgeProducer, ProducerSettings};
use crate::clock::Clock;
use crate::clock::Millis;
use crate::engine::{Command, Engine, EngineConfig, Event, RestoreWatch};
use crate::formats::input::{Attempt, InputDecoder};
use crate::formats::watch_input::{Input, Rejected};
use crate::internal_events::{
    AfterProduceFailure, FailedWatchRestarted, InputConsumed, InputDeadLettered,
    InputForFinishedWatch, InputKeyedApart, InputSkipped, LateOutput, OutputDeadLettered,
    OutputPastRetention, OutputsProduced, PartitionRecovered, PartitionRecovering,
    PartitionRecoveryAbandoned, PartitionRestarting, PartitionWatermarkChanged, ProduceFailed,
    StateRecordWritten,
};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::pollers::Resolve;
use crate::readiness::Readiness;
use crate::seen::{OutputHash, SeenSet};
use crate::state::Registration;
use crate::watch::{Progress, WatchRules};
use crate::watermark::{
    Generators, InputWatermark, PartitionState, PartitionWatermark, WatermarkMessage,
};
use bytes::Bytes;
use delivery::{Deliveries, Kind, Pending};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What every partition task of one bridge shares.
/// Says which decoded inputs are not watches (markers for a punctuated watermark
/// generator, say): they are read, seen by the watermark generator, and committed.
#[derive(Clone)]
pub struct InputFilter(pub Arc<dyn Fn(&Input) -> bool + Send + Sync>);

impl std::fmt::Debug for InputFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InputFilter")
    }
}

pub struct Shared<P: Resolve> {
    pub poller: Arc<P>,
    /// How each task's own idempotent producer is made (outside the exactly-once mode,
    /// where `transactions` says): the same settings as the bridge's shared producer.
    pub producer: ProducerSettings,
    /// Each partition's wait before a new producer after its last one went fatal.
    pub producer_restarts: ProducerRestarts,
    pub input_topic: Arc<str>,
    /// `WATCHBRIDGE_GROUP_ID`, for errors that name it.
    pub group_id: Arc<str>,
    pub output_topic: Arc<str>,
    pub dlq_topic: Arc<str>,
    /// Reads input records in their format (`crate::formats`).
    pub decoder: Arc<crate::formats::input::InputDecoder>,
    /// Writes output values in the output format.
    pub encoder: Arc<crate::formats::output::OutputEncoder>,
    /// How outputs are written: their headers and partition (`records::OutputLayout`).
    pub output_layout: super::records::OutputLayout,
    /// The output topic's retention by time (`client::TopicLayout::output_retention`).
    pub output_retention: Option<Duration>,
    /// The input topic is the repartition topic (`bridge/repartition.rs`): an input's
    /// record timestamp is the one its record carries (`records::input_record_time`).
    pub repartitioned: bool,
    pub rules: WatchRules,
    pub poll_timeout: Duration,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// Commit positions published by the tasks, taken by the consumer thread to store.
    pub positions: Arc<Mutex<HashMap<i32, i64>>>,
    /// In the exactly-once mode, the input position each partition's last transaction
    /// committed (the consumer's lag metric needs it: the consumer commits nothing itself).
    pub transaction_positions: Arc<Mutex<HashMap<i32, i64>>>,
    /// How long a stopping task may spend delivering what its watches emitted.
    pub stop_timeout: Duration,
    /// Bytes of inputs the consumer thread holds for a task that is behind before it
    /// pauses its partition (`WATCHBRIDGE_INPUT_HOLD_BYTES`).
    pub input_hold_bytes: usize,
    pub watermarks: WatermarkSettings,
    /// Inputs that start no watch (a library user's filter; `None`: every input does).
    pub skip_input: Option<InputFilter>,
    pub state: StateSettings,
    /// Told when the recovery of a partition ends (what `/readyz` waits for).
    pub readiness: Arc<Readiness>,
    /// `Some` in the exactly-once mode: each task writes through a transactional producer
    /// of its own, and commits its input offsets in its transactions.
    pub transactions: Option<TransactionSettings>,
    /// Whether this instance may write at all (not after a stall that may have cost it its
    /// partitions, until the group confirms them).
    pub lease: Arc<super::lease::Lease>,
    /// The output topic's end offsets, read for every task (`kafka::output_ends`).
    pub output_ends: super::output_ends::OutputEnds,
    /// Whether the brokers can be reached; the context of the bridge's Kafka clients.
    pub kafka: crate::kafka::health::KafkaContext,
    /// The operations API's view of this instance's partitions (`control.rs`).
    pub controls: Arc<crate::control::Controls>,
    /// Whether this instance writes the merged watermark: claimed by partition 0's task
    /// once restored, released as it ends.
    pub merged_writer: Arc<crate::kafka::merged::MergedWriterClaim>,
}

/// What the partition tasks need to keep their watches durable.
#[derive(Clone)]
pub struct StateSettings {
    pub recovery: RecoverySource,
    /// The instance's guarantee, recorded on the state topic with every batch of state
    /// records (`~mode`): what a starting instance checks its own against.
    pub guarantee: crate::kafka::guarantee::Guarantee,
    pub finished_retention: Duration,
    pub checkpoint_interval: Duration,
}

/// What the partition tasks need to publish watermarks.
#[derive(Debug, Clone)]
pub struct WatermarkSettings {
    /// Each input partition's watermark generator (`WATCHBRIDGE_WATERMARK_STRATEGY`'s, or a
    /// library user's).
    pub generators: Generators,
    pub interval: Duration,
    pub idle_timeout: Duration,
    pub topic: Arc<str>,
    /// In-band copies go to every one of the output topic's partitions.
    pub output_partitions: i32,
    /// The state of each input partition on the watermark topic in the current run,
    /// whoever published it (kept by the watermark topic's reader): a partition taken over
    /// from another instance (or from an earlier run) continues from there instead of
    /// starting lower, and a bounded run flags outputs below it late.
    pub read_back: crate::watermark::SharedWatermarkTopic,
    /// How far the watermark topic's reader has read it.
    pub read_upto: Arc<std::sync::atomic::AtomicI64>,
    /// How long a partition taken over waits at most for that reader to pass its previous
    /// owner's records (`kafka::merged::read_back_limit`).
    pub read_back_limit: Duration,
}

/// In a bounded run, the offsets a partition task reads: from `start` up to `end` (the end
/// offset present when the run started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub start: i64,
    pub end: i64,
}

/// What the consumer thread hands a partition task.
#[derive(Debug)]
pub enum Feed {
    /// An input record.
    Record(OwnedMessage),
    /// The consumer reached the end of the partition: every offset below `position` has
    /// been handed over, or holds no record a consumer is handed (a transaction marker, an
    /// aborted or compacted-away record). Offset arithmetic cannot tell (the last record
    /// before the end need not be at `end - 1`); librdkafka's end-of-partition event and
    /// the consumer's position can.
    End { position: i64 },
}

/// A task's last word: what it committed, how many watches it stopped, and why it ended.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    pub partition: i32,
    pub position: Option<i64>,
    pub watches_stopped: usize,
    pub ending: Ending,
    /// Records it sent that were not acknowledged when it ended (outputs, state records,
    /// watermarks, dead letters): a stop that had to give up says how many.
    pub undelivered: usize,
    /// A bounded run's task that read its inputs to the end and saw every watch end: event
    /// time is complete for its partition. (When every partition's is, the run publishes
    /// the end of time.)
    pub end_of_time: bool,
}

/// Set by the consumer thread once the partition is no longer this instance's although its
/// task may still run (the assignment was lost, or the revocation stopped waiting for the
/// task): the task writes nothing more, and one waiting for deliveries stops waiting at
/// once ([`Lost::wait`]) to purge what its producer holds.
#[derive(Debug, Default)]
pub struct Lost {
    flag: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Lost {
    pub fn set(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once the partition is lost.
    pub async fn wait(&self) {
        loop {
            // Registered before the check: a `set` in between still wakes it.
            let notified = self.notify.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// A command sent to the engine, waiting for its answer (the engine answers in order).
enum Starting {
    /// A watch for the input at `offset` (a `Restore` when the read-back found outputs of
    /// an earlier run of it: `seen`).
    Input {
        key: Bytes,
        offset: i64,
        registration: Registration,
        progress: Progress,
        seen: Vec<OutputHash>,
        /// The seen chunks an earlier run of it (failed) left on the topic.
        stale_chunks: u32,
    },
    /// A watch brought back by the recovery, holding at `hold`.
    Recovered { hold: Millis },
}

impl Starting {
    /// The watermark hold of the watch it starts: counted by the task itself until the
    /// engine has answered (the engine reports the new hold just before its answer).
    fn hold(&self) -> Millis {
        match self {
            Self::Input { progress, .. } => progress.hold,
            Self::Recovered { hold } => *hold,
        }
    }
}

pub struct PartitionTask<P: Resolve> {
    partition: i32,
    shared: Arc<Shared<P>>,
    inputs: mpsc::Receiver<Feed>,
    /// Taken when the task tells the engine to shut down.
    commands: Option<mpsc::Sender<Command<P::Input>>>,
    /// A bounded run has read its last input and told the engine to drain.
    draining: bool,
    events: mpsc::Receiver<Event>,
    watermark: PartitionWatermark,
    /// The engine's minimum hold as of the last [`Event::Hold`] taken in: in event order,
    /// so it never covers less than the outputs taken in so far. (With the holds of the
    /// watches in `starting`, it is what holds the partition's watermark back.)
    min_hold: Option<Millis>,
    bounds: Option<Bounds>,
    tracker: OffsetTracker,
    /// Watch and restore commands sent, in order, waiting for the engine's answer.
    starting: VecDeque<Starting>,
    /// Watches whose end `durable` has taken in, to acknowledge to the engine
    /// ([`Command::Forget`]). Sent between two inputs, never while one is being handed over:
    /// a `Watch` decided before its key was known finished must reach the engine first, so
    /// that the engine, still remembering the end, refuses it.
    ended: Vec<Bytes>,
    /// The partition's watches as the state topic knows them (set by the recovery).
    durable: DurableState,
    /// State records of the last checkpoint not acknowledged yet: the next waits for them.
    checkpoint_in_flight: usize,
    /// The last checkpoint's offsets record, produced once the rest of it is acknowledged
    /// (not in the exactly-once mode, where the transaction commits them together).
    offsets_waiting: Option<StateWrite>,
    /// Set when a delivery failed in a way that leaves this task's view of the topics
    /// uncertain (an output that may or may not have landed): the task writes nothing
    /// more and ends, and the partition starts again from its durable state.
    abandoned: Option<KafkaError>,
    /// Set by the consumer thread once the partition is no longer this instance's (lost
    /// to a stall, or the revocation stopped waiting for this task): nothing more is
    /// written.
    lost: Arc<Lost>,
    output_ends: super::output_ends::OutputEnds,
    /// Whether an input whose watch key is not its record key was logged already.
    keyed_apart_seen: bool,
    /// Whether an output past the output topic's retention was logged already.
    past_retention_seen: bool,
    /// Stopping (the input channel closed): outputs the engine still hands over are not
    /// sent (that could take longer than the stop may), and the watches they belong to
    /// are saved live, not finished, so that after the recovery they emit them again.
    stopping: bool,
    /// Watches with outputs left unsent by the stop, and how many.
    unsent: HashMap<Bytes, usize>,
    /// The input partition's end offset at recovery: once read up to it, outputs found for
    /// watches whose input did not come again are forgotten.
    recovery_input_end: Option<i64>,
    deliveries: Deliveries,
    /// Watermark copies for the output partitions, held until the watermark topic has
    /// their value (`watermarks.rs`).
    in_band: watermarks::InBandCopies,
    /// Outputs acknowledged since the last [`publish_position`](Self::publish_position),
    /// which counts them (`watchbridge_outputs_produced_total`).
    produced: u64,
    /// An input waiting for its Avro schema to be fetched (no input is read meanwhile).
    waiting: Option<Waiting>,
    /// What the task writes through: its own producer (`producer.rs`), idempotent, or in
    /// the exactly-once mode transactional (`txn`).
    producer: BridgeProducer,
    txn: Option<transaction::Transaction>,
    /// When `producer` was made (a fatal error soon after delays the next one).
    producer_made: std::time::Instant,
    /// This partition's share of `WATCHBRIDGE_HOST_RATE`, this instance's while the task
    /// lives (`limits.rs`).
    _rate_share: crate::limits::PartitionShare,
    /// What the operations API shows of this partition (`control.rs`).
    status: Arc<Mutex<crate::control::PartitionStatus>>,
    /// The operations API's questions about the inputs of this partition's watches.
    input_queries: mpsc::Receiver<crate::control::TaskQuery>,
}

impl<P: Resolve> PartitionTask<P> {
    /// The partition's task; returns its future, which makes the partition's producer, then
    /// starts its engine and runs. The partition counts as recovering from here, before the
    /// caller reports the assignment, so that the instance never looks ready in between.
    pub fn spawn(
        partition: i32,
        shared: Arc<Shared<P>>,
        inputs: mpsc::Receiver<Feed>,
        bounds: Option<Bounds>,
        lost: Arc<Lost>,
    ) -> impl std::future::Future<Output = Stopped> + Send + 'static {
        let controls = shared.controls.register(partition);
        PartitionRecovering { partition }.emit(&shared.metrics);
        async move {
            let status = controls.status.clone();
            let stopped = match producer::OwnProducer::open(&shared, partition, &inputs).await {
                Ok(own) => {
                    let task = Self::new(
                        partition,
                        shared.clone(),
                        inputs,
                        bounds,
                        lost,
                        controls,
                        own,
                    );
                    task.run().await
                }
                Err(ending) => {
                    // Revoked (or stopping) before its producer could start, or it could not.
                    recovery_over(&shared, &status, partition, Some(ending));
                    Stopped::before_start(partition, ending)
                }
            };
            shared.controls.unregister(partition, &status);
            stopped
        }
    }

    /// The task, writing through `own`, with its engine started.
    fn new(
        partition: i32,
        shared: Arc<Shared<P>>,
        inputs: mpsc::Receiver<Feed>,
        bounds: Option<Bounds>,
        lost: Arc<Lost>,
        controls: crate::control::PartitionControls,
        own: producer::OwnProducer,
    ) -> Self {
        let crate::control::PartitionControls {
            messages: control_messages,
            input_queries,
            status,
            heartbeat,
        } = controls;
        let engine = Engine::new(
            shared.poller.clone(),
            EngineConfig {
                rules: shared.rules.clone(),
                poll_timeout: shared.poll_timeout,
                seed: None,
                checkpoints: true,
                remember_ended: true,
            },
            shared.limits.clone(),
            shared.clock,
            shared.metrics.clone(),
        )
        .with_controls(
            control_messages,
            shared.controls.pause.clone(),
            partition,
            heartbeat,
        );
        let (commands, engine_commands) = mpsc::channel(256);
        let (engine_events, events) = mpsc::channel(256);
        tokio::spawn(engine.run(engine_commands, engine_events));
        // A bounded run publishes one final watermark and does no periodic work (as Flink's
        // batch mode), so its generator tracks nothing.
        let generator = match bounds {
            Some(_) => InputWatermark::disabled(),
            None => InputWatermark::with_generator(
                shared.watermarks.generators.make(partition),
                shared.watermarks.idle_timeout,
                shared.clock.now_ms(),
            ),
        };
        // Replaced by the recovery's, before any input is read.
        let durable = DurableState::new(
            shared.state.recovery.state_topic.clone(),
            partition,
            0,
            Vec::new(),
            Vec::new(),
        );
        let output_ends = shared.output_ends.clone();
        let rate_share = shared.limits.own_partition();
        Self {
            partition,
            shared,
            inputs,
            commands: Some(commands),
            draining: false,
            events,
            watermark: PartitionWatermark::new(generator),
            min_hold: None,
            bounds,
            tracker: OffsetTracker::default(),
            starting: VecDeque::new(),
            ended: Vec::new(),
            durable,
            checkpoint_in_flight: 0,
            offsets_waiting: None,
            abandoned: None,
            lost,
            output_ends,
            keyed_apart_seen: false,
            past_retention_seen: false,
            stopping: false,
            unsent: HashMap::new(),
            recovery_input_end: None,
            deliveries: Deliveries::new(&own.producer),
            in_band: watermarks::InBandCopies::default(),
            produced: 0,
            waiting: None,
            producer: own.producer,
            txn: own.txn,
            producer_made: own.made,
            _rate_share: rate_share,
            status,
            input_queries,
        }
    }

    /// Run the task; as it ends, purge what its producer still holds (records of a task
    /// that was given up must never land once the partition's next owner writes).
    async fn run(mut self) -> Stopped {
        let stopped = self.work().await;
        self.purge_producer();
        stopped
    }

    async fn work(&mut self) -> Stopped {
        let recovered = self.recover().await;
        recovery_over(&self.shared, &self.status, self.partition, recovered.err());
        if let Err(ending) = recovered {
            // Revoked (or stopping) before the partition could be recovered: nothing
            // started.
            return Stopped::before_start(self.partition, ending);
        }
        // Input partition 0's owner writes the merged watermark, from its restore on (not
        // from the assignment: the previous writer's records are read by now); not a task
        // already told to stop. Released as this returns.
        let _merged_claim =
            (self.partition == 0 && !self.inputs.is_closed() && !self.lost.is_set())
                .then(|| self.shared.merged_writer.claim(&self.shared.metrics));
        let mut accepting = true;
        if self.bounds.is_some_and(|b| b.start >= b.end) {
            // Nothing to read in this bounded run.
            self.drain_engine().await;
        }
        let mut ticks = tokio::time::interval(self.shared.watermarks.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut checkpoints = tokio::time::interval(self.shared.state.checkpoint_interval);
        checkpoints.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let periodic = self.bounds.is_none();
        let mut ending = Ending::Done;
        loop {
            self.forget_ended().await;
            tokio::select! {
                Some(delivery) = self.deliveries.next(), if !self.deliveries.is_empty() => {
                    self.on_delivery(delivery).await;
                    // The rest of the reports that came with it, in one go: a report is
                    // one output, and a turn of this loop per output cost more than the
                    // output's own handling.
                    while self.abandoned.is_none() {
                        let Some(delivery) = self.deliveries.ready() else { break };
                        self.on_delivery(delivery).await;
                    }
                }
                event = self.events.recv() => match event {
                    Some(event) => self.on_event(event).await,
                    // The engine ended: after our Shutdown, or (bounded) once every watch has.
                    None => break,
                },
                Some(query) = self.input_queries.recv() => self.answer(query),
                // The input whose schema is being fetched, once it is (or the registry
                // said it does not know the id).
                () = fetched(&mut self.waiting), if self.waiting.is_some() => {
                    if let Some(waiting) = self.waiting.take() {
                        self.take_input(waiting.message).await;
                    }
                }
                // Not while an input waits for its schema: inputs are taken in order.
                input = self.inputs.recv(), if accepting && self.waiting.is_none() => match input {
                    Some(Feed::Record(message)) => self.take_input(message).await,
                    Some(Feed::End { position }) => {
                        self.read_to(position);
                        if self.bounds.is_some_and(|b| position >= b.end) {
                            self.drain_engine().await;
                        }
                    }
                    None => {
                        accepting = false;
                        self.begin_stop().await;
                    }
                },
                // Not once stopping: outputs left unsent then are emitted again after the
                // recovery, and the hold of their watches must still cover them.
                _ = ticks.tick(), if periodic && !self.stopping => self.tick_watermark().await,
                _ = checkpoints.tick() => {
                    if self.output_ends.has_changed().unwrap_or(false) {
                        if let Some(ends) = self.output_ends.borrow_and_update().clone() {
                            self.durable.output_ends(&ends);
                        }
                    }
                    if let Err(failure) = self.checkpoint(false).await {
                        ending = self.fail(failure).await;
                        break;
                    }
                }
            }
            if self.abandoned.is_some() {
                ending = self.abandon().await;
                break;
            }
            if self.waiting.is_some() && self.inputs.is_closed() {
                // Told to stop while an input waits for the registry (the input branch,
                // which would see the channel close, is off meanwhile): it is not
                // committed, and is read again after the partition's recovery.
                self.waiting = None;
                accepting = false;
                self.begin_stop().await;
            }
            self.publish_position();
        }
        if ending != Ending::Done {
            return Stopped {
                partition: self.partition,
                position: self.txn.as_ref().and_then(|t| t.committed),
                watches_stopped: 0,
                ending,
                undelivered: self.deliveries.len(),
                end_of_time: false,
            };
        }
        if !self.unsent.is_empty() {
            tracing::info!(
                partition = self.partition,
                watches = self.unsent.len(),
                outputs = self.unsent.values().sum::<usize>(),
                "stopping: outputs the watches had emitted but not handed over are not sent now; \
                 those watches are saved live and emit them again after the partition's recovery"
            );
        }
        let watches_stopped = self.durable.running();
        // A bounded run whose inputs were all read and whose watches all ended (the engine
        // drained, not shut down: a stop interrupts it): event time is complete here. The
        // bridge publishes the end of time once every partition got here (an interrupted
        // run publishes nothing: its watches did not finish, and a later run must not read
        // the end of time back).
        let end_of_time = self.bounds.is_some() && !self.stopping && self.unsent.is_empty();
        // Deliver what the watches already emitted, then their last checkpoint, within the
        // bound.
        let deadline = tokio::time::Instant::now() + self.shared.stop_timeout;
        self.drain_deliveries(deadline).await;
        if let Err(failure) = self.checkpoint(true).await {
            ending = self.fail(failure).await;
        }
        self.drain_deliveries(deadline).await;
        self.publish_position();
        let position = match &self.txn {
            Some(txn) => txn.committed,
            None => self.tracker.committed(),
        };
        Stopped {
            partition: self.partition,
            position,
            watches_stopped,
            ending,
            undelivered: self.deliveries.len(),
            end_of_time,
        }
    }

    /// A transaction could not commit: give it up, stop every watch (their seen sets hold
    /// outputs that were never committed), and say how the partition goes on.
    async fn fail(&mut self, failure: transaction::Failure) -> Ending {
        if let Some(commands) = self.commands.take() {
            // Not awaited here: the engine may be waiting for room on the event channel,
            // which this task no longer reads (and closes when it returns).
            tokio::spawn(async move {
                let _ = commands.send(Command::Shutdown).await;
            });
        }
        if let Some(txn) = self.txn.as_mut() {
            txn.abort(&failure, &self.shared.metrics).await;
        }
        failure.ending()
    }

    /// A delivery failed and the record may or may not be on the topic, or the producer
    /// met a fatal error (not in the exactly-once mode, where the transaction decides):
    /// stop the watches, write nothing more (no checkpoint: it would vouch for what this
    /// task believes), purge what the producer still holds, and take the reports of what
    /// was in flight, so that the partition's next recovery, which starts with a new
    /// producer once they have settled (`kafka::delayed_restart`, `settle.rs`), reads
    /// every record of this task that reached a topic.
    ///
    /// Purged, not waited for: after a failed delivery librdkafka (2.12) bumps the
    /// producer's epoch and sends the records behind it again under the new one, and one
    /// the broker had kept from its first send is then written twice, side by side (seen on
    /// three nodes: a batch of five outputs twice in a row, with one request in flight per
    /// connection; librdkafka issue 4953). A purged record that had landed is found by the
    /// read-back like any other.
    async fn abandon(&mut self) -> Ending {
        if let Some(commands) = self.commands.take() {
            tokio::spawn(async move {
                let _ = commands.send(Command::Shutdown).await;
            });
        }
        let waiting = self.deliveries.len();
        self.purge_producer();
        let lost = self.lost.clone();
        loop {
            let delivery = tokio::select! {
                delivery = self.deliveries.next() => delivery,
                () = lost.wait() => None,
            };
            let Some(delivery) = delivery else { break };
            // Acknowledgements still count (the commit position moves); nothing is sent.
            self.on_delivery(delivery).await;
        }
        if self.producer_fatal() {
            self.shared
                .producer_restarts
                .went_fatal(self.partition, self.producer_made);
        }
        self.publish_position();
        PartitionRestarting {
            partition: self.partition,
            error: &self
                .abandoned
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            in_flight: waiting,
        }
        .emit(&self.shared.metrics);
        let refused = self
            .abandoned
            .as_ref()
            .and_then(KafkaError::rdkafka_error_code)
            .is_some_and(crate::kafka::refusal::is_refusal);
        if refused {
            Ending::Refused
        } else {
            Ending::Restart
        }
    }

    /// Count the outputs acknowledged since the last call, and hand the commit position to
    /// the consumer thread (not in the exactly-once mode, where it is committed in the
    /// transactions).
    fn publish_position(&mut self) {
        if self.produced > 0 {
            OutputsProduced {
                count: std::mem::take(&mut self.produced),
            }
            .emit(&self.shared.metrics);
        }
        if self.txn.is_some() {
            return;
        }
        if let Some(position) = self.tracker.to_commit() {
            if let Ok(mut positions) = self.shared.positions.lock() {
                positions.insert(self.partition, position);
            }
            lock_status(&self.status).committed_offset = Some(position);
        }
    }

    /// Stop reading inputs: the engine shuts its watches down, the task then ends.
    async fn begin_stop(&mut self) {
        self.stopping = true;
        if let Some(commands) = self.commands.take() {
            let _ = commands.send(Command::Shutdown).await;
        }
    }

    /// An input record from the consumer: decoded and handed over, or, if its Avro schema
    /// must be fetched first, kept waiting for it (`waiting`), inputs behind it too.
    async fn take_input(&mut self, message: OwnedMessage) {
        let offset = message.offset();
        if self.take_upstream_watermark(&message) {
            return;
        }
        if self.bounds.is_some_and(|b| offset >= b.end) {
            // Past the bounded run's end: every input below it was read.
            self.read_to(offset);
        } else {
            let decoder = &self.shared.decoder;
            let now = self.shared.clock.now_ms();
            let record_time = input_record_time(&message, self.shared.repartitioned);
            match decoder.decode(message.key(), message.payload(), record_time, now) {
                Attempt::Fetch(id) => {
                    self.waiting = Some(Waiting {
                        message,
                        fetch: fetch_schema(decoder.clone(), id),
                    });
                    return;
                }
                Attempt::Done(decoded) => self.on_input(message, record_time, decoded).await,
            }
        }
        if self.bounds.is_some_and(|b| offset + 1 >= b.end) {
            self.drain_engine().await;
        }
    }

    /// `record_time`: the input's record timestamp (`records::input_record_time`).
    async fn on_input(
        &mut self,
        message: OwnedMessage,
        record_time: Option<Millis>,
        decoded: Result<Input, Rejected>,
    ) {
        InputConsumed.emit(&self.shared.metrics);
        let offset = message.offset();
        let now = self.shared.clock.now_ms();
        // The watermark follows input event times: the record timestamps, or with
        // WATCHBRIDGE_INPUT_TIME the times read from the values (an input without one
        // moves nothing).
        let time = self
            .shared
            .decoder
            .watermark_time(&decoded, record_time, now);
        if let Some(time) = time {
            let value = decoded.as_ref().ok().map(|input| &input.value);
            self.watermark.on_record(time, value, now);
        }
        if let Ok(input) = &decoded {
            if self
                .shared
                .skip_input
                .as_ref()
                .is_some_and(|skip| (skip.0)(input))
            {
                // Not a watch (a marker the watermark generator has seen): read, and
                // committed with the inputs around it.
                InputSkipped {
                    key: &input.key,
                    partition: self.partition,
                    offset,
                }
                .emit(&self.shared.metrics);
                self.input_done(offset);
                return;
            }
        }
        let decoded = decoded.and_then(|input| {
            let target = self
                .shared
                .poller
                .resolve(&input.value, &input.key)
                .map_err(|e| Rejected::Unresolvable(e.to_string()))?;
            // A watch whose record cannot be saved must not start: it would run unsaved,
            // its input committed, and be lost at the next restart.
            let registration = registration(&message, &input, &self.shared.decoder);
            registration
                .check_size(&input.key)
                .map_err(|e| Rejected::TooLarge(e.to_string()))?;
            Ok((input, target, registration))
        });
        if let Ok((input, ..)) = &decoded {
            let decoder = &self.shared.decoder;
            if decoder.watch_key.is_some() && !decoder.record_key_is(message.key(), &input.key) {
                InputKeyedApart {
                    watch_key: &input.key,
                    record_key: message.key(),
                    partition: self.partition,
                    first: !std::mem::replace(&mut self.keyed_apart_seen, true),
                }
                .emit(&self.shared.metrics);
            }
        }
        // An operator's order (`kafka/state_lookup.rs`): this input was produced again to
        // restart its ended watch, or to reset it (start it knowing no output).
        let again = message
            .headers()
            .and_then(|h| rdkafka::message::Headers::iter(h).find(|h| h.key == CONTROL_HEADER))
            .and_then(|h| Again::of_header(h.value.unwrap_or_default()));
        if let (Some(Again::Reset), Ok((input, ..))) = (again, &decoded) {
            if self.durable.forget_finished(&input.key) {
                tracing::info!(
                    partition = self.partition,
                    offset,
                    key = %String::from_utf8_lossy(&input.key),
                    "a finished watch is reset by an operator: it starts again knowing no output"
                );
            }
        }
        match decoded {
            Ok((input, _, _)) if self.durable.is_finished(&input.key) => {
                InputForFinishedWatch {
                    key: &input.key,
                    partition: self.partition,
                    offset,
                }
                .emit(&self.shared.metrics);
            }
            Ok((input, target, registration)) => {
                let progress = Progress::at_start(input.timestamp, now);
                // Outputs an earlier run of this watch delivered before a crash (found by the
                // read-back), or found before it failed: it starts knowing them, so they are
                // not emitted again.
                let mut seen = self.durable.take_preseen(&input.key).unwrap_or_default();
                let restart = self.durable.take_failed(&input.key);
                let stale_chunks = restart.as_ref().map_or(0, |r| r.chunks);
                if again == Some(Again::Reset) {
                    // Reset: what its earlier runs found is forgotten (their chunks are
                    // still deleted after its first record).
                    seen.clear();
                    if restart.is_some() {
                        tracing::info!(
                            partition = self.partition,
                            offset,
                            key = %String::from_utf8_lossy(&input.key),
                            "a failed watch is reset by an operator: it starts again knowing no output"
                        );
                    }
                } else if let Some(restart) = restart {
                    FailedWatchRestarted {
                        key: &input.key,
                        partition: self.partition,
                        offset,
                        seen: restart.seen.len(),
                    }
                    .emit(&self.shared.metrics);
                    seen.extend(restart.seen.iter());
                    seen.sort_unstable();
                    seen.dedup();
                }
                let command = if seen.is_empty() {
                    Command::Watch {
                        key: input.key.clone(),
                        input: Arc::new(target),
                        input_time: input.timestamp,
                    }
                } else {
                    Command::Restore(Box::new(RestoreWatch {
                        key: input.key.clone(),
                        input: Arc::new(target),
                        progress,
                        conditions: None,
                        seen: SeenSet::from_hashes(seen.iter().copied()),
                        next_poll: now,
                    }))
                };
                if self.send_command(command).await {
                    // The input's commit waits until its watch is on the state topic.
                    self.tracker.caused(offset);
                    self.starting.push_back(Starting::Input {
                        key: input.key,
                        offset,
                        registration,
                        progress,
                        seen,
                        stale_chunks,
                    });
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
                // Through the repartition topic, the input it came from is the source.
                let mut parts = OutRecordParts::of_message(&message);
                let upstream = parts.take_input_source();
                let source = match &upstream {
                    Some((topic, partition, offset)) => Source {
                        topic,
                        partition: *partition,
                        offset: *offset,
                    },
                    None => Source {
                        topic: &self.shared.input_topic,
                        partition: self.partition,
                        offset,
                    },
                };
                let record = OutRecord::dead_letter(
                    &self.shared.dlq_topic,
                    &parts,
                    source,
                    rejected.kind(),
                    &error,
                );
                self.tracker.caused(offset);
                self.send(Pending {
                    record,
                    origin: Origins::One(offset),
                    attempt: 1,
                    kind: Kind::DeadLetter,
                })
                .await;
            }
        }
        self.input_done(offset);
    }

    /// A question of the operations API about this partition's watches.
    fn answer(&self, query: crate::control::TaskQuery) {
        use crate::control::{EndedWatch, TaskQuery, WatchState};
        match query {
            TaskQuery::Input { key, reply } => {
                let _ = reply.send(self.durable.input_json(&key));
            }
            TaskQuery::Ended { key, reply } => {
                let show = |key: &[u8], at, reason: &str| EndedWatch {
                    key: String::from_utf8_lossy(key).into_owned(),
                    partition: self.partition,
                    state: WatchState::Finished,
                    reason: reason.to_string(),
                    ended_ms: at,
                };
                let ended = match key {
                    Some(key) => self
                        .durable
                        .ended_status(&key)
                        .map(|(at, reason)| show(&key, at, reason))
                        .into_iter()
                        .collect(),
                    None => self
                        .durable
                        .ended_watches()
                        .into_iter()
                        .map(|(key, at, reason)| show(key, at, reason))
                        .collect(),
                };
                let _ = reply.send(ended);
            }
        }
    }

    /// The input at `offset` has been handed over (to the engine, the dead-letter topic, or
    /// nowhere).
    fn input_done(&mut self, offset: i64) {
        self.tracker.consumed(offset);
        if self.recovery_input_end.is_some_and(|end| offset + 1 >= end) {
            // Every input not committed before the recovery has been read again.
            self.recovery_input_end = None;
            self.forget_preseen();
        }
    }

    /// Every input below `position` has been handed to this task (the consumer reached the
    /// end of the partition there, or a bounded run read past its end): the offsets between
    /// the last input and `position` hold no input (a transaction marker, a record compacted
    /// away) and may be committed, and once past the end noted at recovery, no uncommitted
    /// input is left to come again.
    fn read_to(&mut self, position: i64) {
        let position = match self.bounds {
            // Inputs past a bounded run's end are not read: not committed either.
            Some(b) => position.min(b.end),
            None => position,
        };
        if position > 0 && self.tracker.next().is_none_or(|next| next < position) {
            self.tracker.consumed(position - 1);
        }
        if self.recovery_input_end.is_some_and(|end| position >= end) {
            self.recovery_input_end = None;
            self.forget_preseen();
        }
    }

    /// Outputs found for watches whose input will not come again are not tracked further
    /// (they hold the output offsets back until forgotten).
    fn forget_preseen(&mut self) {
        let forgotten = self.durable.forget_preseen();
        if forgotten > 0 {
            tracing::warn!(
                partition = self.partition,
                watches = forgotten,
                "outputs were found on the output topic for watches of this partition that are \
                 neither saved nor coming again (written by an instance that no longer owned the \
                 partition?); they are not tracked further"
            );
        }
    }

    /// A bounded run has read its last input: the engine ends once every watch has (the
    /// input channel stays read, so that a stop still interrupts them).
    async fn drain_engine(&mut self) {
        if !std::mem::replace(&mut self.draining, true) {
            self.send_command(Command::Drain).await;
        }
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

    /// Tell the engine which ends `durable` has taken in: from here on, inputs for those
    /// keys meet their finished record instead.
    async fn forget_ended(&mut self) {
        while let Some(key) = self.ended.pop() {
            if !self.send_command(Command::Forget { key }).await {
                // The engine takes no more commands (and no more inputs come).
                self.ended.clear();
            }
        }
    }

    async fn on_event(&mut self, event: Event) {
        match event {
            Event::Started { key } | Event::Restored { key } => {
                if let Some(Starting::Input {
                    key: started,
                    offset,
                    registration,
                    progress,
                    seen,
                    stale_chunks,
                }) = self.starting.pop_front()
                {
                    debug_assert_eq!(started, key);
                    let now = self.shared.clock.now_ms();
                    let started = self.durable.started(
                        key.clone(),
                        registration,
                        progress,
                        now,
                        offset,
                        &seen,
                        stale_chunks,
                    );
                    let release = match started {
                        Ok(released) => released,
                        Err(_) => {
                            // Cannot happen (the engine refuses a key until its end is taken
                            // in): the watch already known keeps its origin and its ending.
                            tracing::error!(
                                partition = self.partition,
                                offset,
                                key = %String::from_utf8_lossy(&key),
                                "the engine started a watch for a key with a live or ending \
                                 watch; this input is not made durable"
                            );
                            Some(offset)
                        }
                    };
                    if let Some(offset) = release {
                        self.tracker.acknowledged(offset);
                    }
                }
            }
            Event::AlreadyWatching { .. } | Event::RestoreRefused { .. } => {
                // No second watch: this input holds nothing.
                if let Some(Starting::Input { offset, .. }) = self.starting.pop_front() {
                    self.tracker.acknowledged(offset);
                }
            }
            Event::AlreadyEnded { key } => {
                // Its watch ended after this input was sent, before its end was taken in:
                // as an input for a finished watch, it starts nothing and holds nothing.
                if let Some(Starting::Input { offset, .. }) = self.starting.pop_front() {
                    InputForFinishedWatch {
                        key: &key,
                        partition: self.partition,
                        offset,
                    }
                    .emit(&self.shared.metrics);
                    self.tracker.acknowledged(offset);
                }
            }
            Event::Checkpoint(c) => {
                let held_back = self.stopping || c.holding_back || self.unsent.contains_key(&c.key);
                let c = *c;
                self.durable.seen_without_output(&c.key, &c.silent_hashes);
                self.durable.checkpoint(
                    &c.key,
                    c.progress,
                    c.next_poll,
                    c.resume,
                    c.conditions,
                    held_back,
                )
            }
            Event::Hold { min } => self.min_hold = min,
            Event::Outputs { key, outputs, .. } if self.stopping => {
                *self.unsent.entry(key).or_default() += outputs.len();
            }
            Event::Outputs { key, outputs, .. } => {
                let first_seen = self.shared.clock.now_ms();
                // Found once per poll: each output's report finds its watch by its slot.
                let watch = self.durable.watch_slot(&key);
                for (n, output) in outputs.iter().enumerate() {
                    if self.inputs.is_closed() {
                        // Told to stop while this poll's outputs wait for room in the
                        // producer's queue: the rest are left for after the recovery.
                        self.stopping = true;
                        *self.unsent.entry(key.clone()).or_default() += outputs.len() - n;
                        break;
                    }
                    let hash = output.identity();
                    let mut record = OutRecord::output(
                        &self.shared.output_topic,
                        &key,
                        output,
                        hash,
                        self.partition,
                        first_seen,
                        self.shared.output_layout,
                    );
                    match self.shared.encoder.value(output) {
                        Ok(value) => record.value = Some(value),
                        Err(misfit) => {
                            let error = misfit.to_string();
                            OutputDeadLettered {
                                partition: self.partition,
                                watch_key: &key,
                                reason: "not_in_schema",
                                error: &error,
                            }
                            .emit(&self.shared.metrics);
                            record = record.misfit(&self.shared.dlq_topic, "not_in_schema", &error);
                        }
                    }
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
                    self.past_retention(&output.key, output.event_time, first_seen);
                    let ticket = self.durable.output_sent(watch);
                    let pending = Pending {
                        record,
                        origin: Origins::None,
                        attempt: 1,
                        kind: Kind::Output { hash, ticket },
                    };
                    // Sent at once unless the producer's queue is full (see `send_now`).
                    if let Some(waiting) = self.send_now(pending) {
                        self.send_waiting(waiting).await;
                    }
                }
            }
            Event::Terminated { key, reason, seen } => {
                let now = self.shared.clock.now_ms();
                // With outputs the stop left unsent, it stays live on the state topic.
                if !self.unsent.contains_key(&key) {
                    self.durable.terminated(&key, now, &reason, seen);
                }
                self.ended.push(key);
            }
        }
    }
}

impl<P: Resolve> PartitionTask<P> {
    /// Say so when an output written at `now` is too old (by its event time) for the
    /// output topic to keep it (`client::TopicLayout::output_retention`).
    fn past_retention(&mut self, key: &[u8], event_time: Millis, now: Millis) {
        let Some(retention) = self.shared.output_retention else {
            return;
        };
        if now.saturating_sub(event_time) > retention.as_millis() as Millis {
            OutputPastRetention {
                partition: self.partition,
                key,
                event_time,
                retention,
                first: !std::mem::replace(&mut self.past_retention_seen, true),
            }
            .emit(&self.shared.metrics);
        }
    }
}

impl Stopped {
    /// A task that ended before it started anything (revoked or stopping while it made its
    /// producer or recovered, or its producer could not start).
    fn before_start(partition: i32, ending: Ending) -> Self {
        Stopped {
            partition,
            position: None,
            watches_stopped: 0,
            ending,
            undelivered: 0,
            end_of_time: false,
        }
    }
}

/// The recovery of `partition` is over (recovered: `None`, or given up, and why): one
/// partition fewer recovering, so the instance may be ready now.
fn recovery_over<P: Resolve>(
    shared: &Shared<P>,
    status: &Mutex<crate::control::PartitionStatus>,
    partition: i32,
    ended: Option<Ending>,
) {
    match ended {
        None => {}
        // Its error is logged, and `/readyz` names it (`state.rs`): not "revoked".
        Some(Ending::NewerState) => shared.metrics.partitions_recovering.dec(),
        Some(_) => PartitionRecoveryAbandoned { partition }.emit(&shared.metrics),
    }
    let _ = shared.readiness.refresh(&shared.metrics);
    lock_status(status).recovering = false;
}

fn lock_status(
    status: &Mutex<crate::control::PartitionStatus>,
) -> std::sync::MutexGuard<'_, crate::control::PartitionStatus> {
    status.lock().unwrap_or_else(|p| p.into_inner())
}

/// The input record as a watch record keeps it: a JSON value as it came, any other as its
/// JSON form (what a restore resolves it from, with no registry or schema needed then).
fn registration(message: &OwnedMessage, input: &Input, decoder: &InputDecoder) -> Registration {
    let value = if decoder.keeps_raw_value() {
        Bytes::copy_from_slice(message.payload().unwrap_or_default())
    } else {
        Bytes::from(serde_json::to_vec(&input.value).unwrap_or_default())
    };
    Registration {
        key: message.key().map(Bytes::copy_from_slice),
        value,
        time: input.timestamp,
    }
}

/// An input whose Avro writer schema is being fetched.
struct Waiting {
    message: OwnedMessage,
    fetch: BoxFuture<'static, ()>,
}

async fn fetched(waiting: &mut Option<Waiting>) {
    match waiting {
        Some(w) => w.fetch.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Fetch schema `id` until the registry answers (with the schema, or that it does not know
/// it): an outage pauses the partition, it never dead-letters its inputs. Each failure is
/// logged and counted (`SchemaRegistryRequest`).
fn fetch_schema(decoder: Arc<InputDecoder>, id: u32) -> BoxFuture<'static, ()> {
    async move {
        let mut backoff = Duration::from_millis(100);
        while decoder.fetch(id).await.is_err() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }
    .boxed()
}

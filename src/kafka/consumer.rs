//! The consumer thread: one OS thread owns the group consumer. It polls librdkafka (which
//! runs rebalance callbacks on this thread), routes each input record to its partition's
//! task, pauses a partition whose task is not keeping up, and stores the commit positions
//! the tasks publish (librdkafka commits stored offsets every second, and we commit
//! synchronously on revocation and shutdown).
//!
//! A thread, not a task, because a revocation must block: before a partition goes to
//! another instance, its task stops its watches, delivers what they emitted, and its
//! offsets are committed. Blocking there is what librdkafka's rebalance callback is for.

use super::delayed_restart::DelayedRestarts;
use super::health::is_connection_error;
use super::list_offsets::list_offsets;
use super::partition::{Bounds, Ending, Feed, Lost, PartitionTask, Shared, Stopped};
use super::stats::consumer_lag;
use crate::internal_events::{
    ConsumerFailed, DelayReason, KafkaStatistics, PartitionAssigned, PartitionRevoked,
    RestartDelayed,
};
use crate::pollers::Resolve;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Headers;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Inputs buffered per partition between the consumer thread and the partition task.
const INPUT_BUFFER: usize = 512;

/// What a held input costs in memory, counted against the hold limit: its key,
/// value and headers' bytes plus the message's own fields.
fn held_size(feed: &Feed) -> usize {
    const OVERHEAD: usize = 160;
    match feed {
        Feed::Record(m) => {
            let headers = m.headers().map_or(0, |h| {
                h.iter()
                    .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len) + 48)
                    .sum()
            });
            OVERHEAD + m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + headers
        }
        Feed::End { .. } => OVERHEAD,
    }
}

/// One assigned partition, as the consumer thread sees it.
struct Assigned {
    inputs: mpsc::Sender<Feed>,
    /// Inputs (and ends of partition) the task had no room for, in order; past
    /// the hold limit the partition is paused until they have all gone to the task.
    held: VecDeque<Feed>,
    /// The bytes `held` stands for ([`held_size`]).
    held_bytes: usize,
    /// Paused because `held` reached the limit.
    paused: bool,
    stopped: std_mpsc::Receiver<Stopped>,
    /// A bounded run's range (a restarted task reads the rest of it).
    bounds: Option<Bounds>,
    /// Set when the partition is no longer this instance's although its task may still
    /// run (the assignment was lost, or the task outlived the revocation's wait): the task
    /// writes nothing more, and purges what its producer holds.
    lost: Arc<Lost>,
}

/// The partitions of one bridge, shared by the consumer thread and its rebalance callbacks
/// (both run on the consumer thread; the mutex is never contended).
pub struct Partitions<P: Resolve> {
    shared: Arc<Shared<P>>,
    runtime: tokio::runtime::Handle,
    assigned: Mutex<HashMap<i32, Assigned>>,
    /// The bridge is stopping: the final commit is the consumer thread's (a revocation
    /// during it commits nothing itself), and commit results are kept for it.
    stopping: AtomicBool,
    /// Commit failures reported while stopping (the final commit's among them).
    commit_failures: Mutex<Vec<String>>,
    /// A bounded run's partitions whose task ended without reaching the end of time (its
    /// watches did not all end, or it could not go on): the run's merged watermark may not
    /// be the end of time.
    incomplete: Mutex<Vec<i32>>,
    /// Where a partition with no committed offset starts (`auto.offset.reset`).
    no_commit: NoCommitStart,
    /// Partitions waiting to start again: fenced (for the group's word), or after a failed
    /// delivery (for its record to settle) (`kafka::delayed_restart`).
    waiting: Mutex<DelayedRestarts>,
    /// How long a failed delivery's record may still commit (`DeliveryWindow`; zero in
    /// the exactly-once mode, whose aborted records never commit).
    delivery_window: Duration,
    /// How long a partition the group assigns waits for its previous owner's records
    /// (`DeliveryWindow::takeover`).
    takeover_wait: Duration,
}

/// Where a partition the group has no commit for starts: librdkafka's
/// `auto.offset.reset` (`earliest` unless `KAFKA_AUTO_OFFSET_RESET` says otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCommitStart {
    /// `earliest` (`smallest`, `beginning`): the partition's first offset.
    First,
    /// `latest` (`largest`, `end`): its end.
    End,
    /// Anything else (`error`): as librdkafka does it.
    Librdkafka,
}

impl NoCommitStart {
    /// From the consumer's `auto.offset.reset` (librdkafka's default, `latest`, if unset).
    pub fn from_reset(reset: Option<&str>) -> Self {
        match reset.unwrap_or("latest") {
            "earliest" | "smallest" | "beginning" => Self::First,
            "latest" | "largest" | "end" => Self::End,
            _ => Self::Librdkafka,
        }
    }
}

/// How the consumer thread's stop went: what the bridge's stop reports when it gives up.
#[derive(Debug)]
pub struct ConsumerStopped {
    /// Each partition stopped at the end, with its task's report (`None`: it did not
    /// finish within the stop's deadline).
    pub partitions: Vec<(i32, Option<Stopped>)>,
    /// The final commit of the input positions (not in the exactly-once mode, whose
    /// transactions commit them): done, or why not.
    pub commit: Result<(), String>,
    /// Whether the consumer left its group in order within the deadline.
    pub closed: bool,
}

impl<P: Resolve> Partitions<P> {
    pub fn new(
        shared: Arc<Shared<P>>,
        runtime: tokio::runtime::Handle,
        no_commit: NoCommitStart,
        delivery_window: Duration,
        takeover_wait: Duration,
    ) -> Self {
        Self {
            delivery_window,
            takeover_wait,
            no_commit,
            shared,
            runtime,
            assigned: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            commit_failures: Mutex::new(Vec::new()),
            incomplete: Mutex::new(Vec::new()),
            waiting: Mutex::new(DelayedRestarts::default()),
        }
    }

    /// Start the task of a newly assigned partition (`bounds` in a bounded run).
    pub fn assign(&self, partition: i32, bounds: Option<Bounds>) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        if assigned.contains_key(&partition) {
            return;
        }
        let (inputs, receiver) = mpsc::channel(INPUT_BUFFER);
        let (stopped_tx, stopped) = std_mpsc::channel();
        // Rebalance callbacks run on the consumer thread, outside the runtime.
        let _runtime = self.runtime.enter();
        let lost = Arc::new(Lost::default());
        let task = PartitionTask::spawn(
            partition,
            self.shared.clone(),
            receiver,
            bounds,
            lost.clone(),
        );
        self.runtime.spawn(async move {
            let _ = stopped_tx.send(task.await);
        });
        PartitionAssigned {
            topic: &self.shared.input_topic,
            partition,
        }
        .emit(&self.shared.metrics);
        assigned.insert(
            partition,
            Assigned {
                inputs,
                held: VecDeque::new(),
                held_bytes: 0,
                paused: false,
                stopped,
                bounds,
                lost,
            },
        );
    }

    /// Stop the tasks of `partitions` and wait (until `deadline`) until each has delivered
    /// what its watches emitted and published its last position; their reports (`None`: not
    /// in time). `lost`: the group gave them to another instance already (this one stalled
    /// past its session): they stop without writing anything. A task that outlives the wait
    /// writes nothing more either.
    fn stop(
        &self,
        partitions: &[i32],
        deadline: Instant,
        lost: bool,
    ) -> Vec<(i32, Option<Stopped>)> {
        let removed: Vec<(i32, Assigned)> = {
            let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
            partitions
                .iter()
                .filter_map(|p| assigned.remove(p).map(|a| (*p, a)))
                .collect()
        };
        // Close every input channel first, so the tasks stop in parallel.
        let waiting: Vec<(i32, std_mpsc::Receiver<Stopped>, Arc<Lost>)> = removed
            .into_iter()
            .map(|(p, a)| {
                if lost {
                    a.lost.set();
                }
                drop(a.inputs);
                (p, a.stopped, a.lost)
            })
            .collect();
        let mut reports = Vec::with_capacity(waiting.len());
        for (partition, stopped, task_lost) in waiting {
            if partition == 0 {
                // Its task may outlive the wait below; the next owner's writes from now on.
                self.shared.merged_writer.release_any(&self.shared.metrics);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let report = stopped.recv_timeout(left).ok();
            if (lost || report.is_none()) && !self.delivery_window.is_zero() {
                // What it handed to librdkafka may still commit; should the partition come
                // back here, it waits for that (`kafka::delayed_restart`).
                let until = Instant::now() + self.delivery_window;
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                waiting.unsettled(partition, until);
            }
            if report.is_none() {
                // Its next owner may start now: from here on this task's writes would land
                // on top of that owner's. Told, it stops waiting and purges its producer.
                task_lost.set();
            }
            PartitionRevoked {
                topic: &self.shared.input_topic,
                partition,
                committed: report.and_then(|s| s.position),
                watches_stopped: report.map_or(0, |s| s.watches_stopped),
            }
            .emit(&self.shared.metrics);
            reports.push((partition, report));
        }
        reports
    }

    /// A revocation's bound: the tasks' own (`stop_timeout`) and a little more to report.
    fn revocation_deadline(&self) -> Instant {
        Instant::now() + self.shared.stop_timeout + Duration::from_secs(2)
    }

    /// A bounded run's partitions that ended without reaching the end of time.
    pub fn incomplete(&self) -> Vec<i32> {
        self.incomplete
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note_incomplete(&self, partition: i32) {
        self.incomplete
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(partition);
    }

    /// Handle the tasks that ended on their own: in a bounded run, done (every input read,
    /// every watch ended): forget them; an aborted transaction, or a delivery whose outcome
    /// is unknown: read the partition again from its last committed position with a new
    /// task, which recovers its state first (after a failed delivery, once its record has
    /// settled); fenced: the same once the group has had its word, if the partition is
    /// still assigned here (`kafka::delayed_restart`). Returns whether no partition is
    /// left.
    fn reap(&self, consumer: &BaseConsumer<BridgeContext<P>>) -> bool {
        let mut ended = Vec::new();
        {
            let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
            assigned.retain(|&partition, a| match a.stopped.try_recv() {
                Ok(report) => {
                    if report.ending == Ending::Done {
                        if a.bounds.is_some() && !report.end_of_time {
                            self.note_incomplete(partition);
                        }
                        PartitionRevoked {
                            topic: &self.shared.input_topic,
                            partition,
                            committed: report.position,
                            watches_stopped: report.watches_stopped,
                        }
                        .emit(&self.shared.metrics);
                    } else {
                        ended.push((partition, report, a.bounds));
                    }
                    false
                }
                Err(std_mpsc::TryRecvError::Empty) => true,
                Err(std_mpsc::TryRecvError::Disconnected) => false,
            });
        }
        for (partition, report, bounds) in ended {
            let now = Instant::now();
            let wait = match report.ending {
                Ending::Fenced => {
                    let confirm = self.shared.lease.confirm_window();
                    let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    waiting.fenced(partition, report.position, bounds, confirm, now)
                }
                Ending::Refused => {
                    let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    let backoff = waiting.refused(partition, report.position, bounds, now);
                    // What it sent before the refusal may still commit (a replicated
                    // cluster's window, as after a failed delivery).
                    if self.shared.transactions.is_none() && !self.delivery_window.is_zero() {
                        let window = self.delivery_window.max(backoff);
                        waiting.failed_delivery(partition, report.position, bounds, window, now);
                        window
                    } else {
                        backoff
                    }
                }
                // Nothing was sent: no delivery window to wait out.
                Ending::NewerState => {
                    let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    waiting.newer_state(partition, report.position, bounds, now)
                }
                Ending::Restart if self.shared.transactions.is_some() => {
                    let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    match waiting.aborted(partition, report.position, bounds, now) {
                        Some(wait) => wait,
                        None => {
                            drop(waiting);
                            self.restart_or_leave(consumer, partition, report.position, bounds);
                            continue;
                        }
                    }
                }
                _ if self.shared.transactions.is_none() && !self.delivery_window.is_zero() => {
                    let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                    let window = self.delivery_window;
                    waiting.failed_delivery(partition, report.position, bounds, window, now);
                    window
                }
                _ => {
                    self.restart_or_leave(consumer, partition, report.position, bounds);
                    continue;
                }
            };
            // Nothing it fetched meanwhile would be used.
            let _ = consumer.pause(&self.one(partition));
            let reason = match report.ending {
                Ending::Fenced => DelayReason::Fenced,
                Ending::Refused => DelayReason::Refused,
                Ending::NewerState => DelayReason::NewerState,
                Ending::Restart if self.shared.transactions.is_some() => DelayReason::Aborted,
                _ => DelayReason::FailedDelivery,
            };
            self.delayed(partition, reason, wait);
        }
        self.restart_waiting(consumer);
        self.assigned.lock().map_or(true, |a| a.is_empty())
            && self.waiting.lock().map_or(true, |w| w.is_empty())
    }

    /// [`restart`](Self::restart), or note a bounded run's partition left unfinished.
    fn restart_or_leave(
        &self,
        consumer: &BaseConsumer<BridgeContext<P>>,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
    ) {
        if !self.restart(consumer, partition, position, bounds) && bounds.is_some() {
            self.note_incomplete(partition);
        }
    }

    /// Start again the waiting partitions whose wait is over, if the group still assigns
    /// them here; forget them all once the assignment is lost.
    fn restart_waiting(&self, consumer: &BaseConsumer<BridgeContext<P>>) {
        let due = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if waiting.is_empty() {
                return;
            }
            if consumer.assignment_lost() {
                waiting
                    .forget_all()
                    .into_iter()
                    .map(|(p, w)| (p, w, false))
                    .collect::<Vec<_>>()
            } else {
                let assignment = consumer.assignment().ok();
                let ours = |partition: i32| {
                    assignment.as_ref().is_some_and(|a| {
                        a.find_partition(&self.shared.input_topic, partition)
                            .is_some()
                    })
                };
                waiting
                    .take_due(Instant::now())
                    .into_iter()
                    .map(|(p, w)| (p, w, ours(p)))
                    .collect()
            }
        };
        for (partition, waiting, ours) in due {
            if ours {
                self.restart_or_leave(consumer, partition, waiting.position, waiting.bounds);
            } else {
                self.leave_waiting(partition, waiting.bounds);
            }
            // After the restart, which counts the partition as recovering: `/readyz` never
            // says ready in between.
            self.wait_over(partition);
        }
    }

    /// A waiting partition is another instance's now: it is left (the group revokes it or
    /// has).
    fn leave_waiting(&self, partition: i32, bounds: Option<Bounds>) {
        if bounds.is_some() {
            self.note_incomplete(partition);
        }
        PartitionRevoked {
            topic: &self.shared.input_topic,
            partition,
            committed: None,
            watches_stopped: 0,
        }
        .emit(&self.shared.metrics);
    }

    /// The group assigned `partition`: its task starts now, or once records sent for it
    /// before may no longer commit (`kafka::delayed_restart`), paused until then.
    fn assigned_by_group(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32) {
        let wait = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.assigned(partition, self.takeover_wait, Instant::now())
        };
        let Some(wait) = wait else {
            self.assign(partition, None);
            return;
        };
        let _ = consumer.pause(&self.one(partition));
        self.delayed(partition, DelayReason::Settling, wait);
    }

    /// `partition` waits `wait` before its task starts: reported, and named by `/readyz`
    /// until it starts or leaves ([`Self::wait_over`]).
    fn delayed(&self, partition: i32, reason: DelayReason, wait: Duration) {
        RestartDelayed {
            partition,
            reason,
            wait,
        }
        .emit(&self.shared.metrics);
        let what = match reason {
            DelayReason::Fenced => "its state again once the group has said whether the partition is still this instance's",
            DelayReason::FailedDelivery => "its outputs back once a failed delivery's record has settled on the brokers",
            DelayReason::Settling => "its outputs back once records sent for it before (by this instance or its previous owner) have settled on the brokers",
            DelayReason::Aborted => "its inputs again after a backoff: its transactions abort again and again (the errors are logged; a topic the authorizer refuses to the transaction is one cause); nothing was dead-lettered or given up",
            DelayReason::Refused => "its inputs again after a backoff: the brokers refused it a write or a read (an ACL missing; the error is logged, docs/brokers.md \"Least privilege\"); nothing was dead-lettered or given up",
            // The task said which record and which versions (`partition/state.rs`): kept.
            DelayReason::NewerState => return,
        };
        let what = format!("{what} (a wait of {} ms)", wait.as_millis());
        let shared = &self.shared;
        shared
            .readiness
            .recovery_waits(partition, Some(&what), &shared.metrics);
    }

    /// `partition` no longer waits to start: it started, or left.
    fn wait_over(&self, partition: i32) {
        let shared = &self.shared;
        shared
            .readiness
            .recovery_waits(partition, None, &shared.metrics);
    }

    /// The group took `partitions` away: those waiting to restart do not.
    fn forget_waiting(&self, partitions: &[i32]) {
        let forgotten: Vec<i32> = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            partitions
                .iter()
                .copied()
                .filter(|p| waiting.forget(*p))
                .collect()
        };
        for partition in forgotten {
            self.wait_over(partition);
            self.leave_waiting(partition, None);
        }
    }

    /// Read `partition` again from its last committed position (`position`, else the
    /// group's) with a new task. Returns whether it did: not once the assignment is lost,
    /// nor when the position cannot be read or sought to (the partition is then left until
    /// the group assigns it again).
    fn restart(
        &self,
        consumer: &BaseConsumer<BridgeContext<P>>,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
    ) -> bool {
        if consumer.assignment_lost() {
            // The group gave our partitions away (this instance stalled past the session
            // timeout): starting this one again would fence its new owner.
            tracing::warn!(
                partition,
                "not restarting the partition: the assignment was lost"
            );
            return false;
        }
        let Some(start) = position.or_else(|| self.committed(consumer, partition)) else {
            tracing::error!(partition, "cannot read the partition's committed offset; it is left until the group assigns it again");
            return false;
        };
        let topic = &self.shared.input_topic;
        if let Err(e) = consumer.seek(
            topic,
            partition,
            Offset::Offset(start),
            Duration::from_secs(10),
        ) {
            tracing::error!(partition, error = %e, "cannot read the partition again from its last commit; it is left until the group assigns it again");
            return false;
        }
        let _ = consumer.resume(&self.one(partition));
        tracing::info!(
            partition,
            offset = start,
            "restarting the partition from its durable state and last committed input"
        );
        self.assign(partition, bounds.map(|b| Bounds { start, end: b.end }));
        true
    }

    /// The group's committed offset of `partition` (where `auto.offset.reset` says when
    /// nothing is committed).
    fn committed(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32) -> Option<i64> {
        self.start_offsets(consumer, &[partition], Duration::from_secs(10))
            .pop()
            .and_then(|(_, start)| start)
    }

    /// Where each of `partitions` starts: the group's committed offset, or, when nothing is
    /// committed, the partition's first offset or its end as `auto.offset.reset` says;
    /// `None` where the cluster did not say within `timeout` (or that setting leaves it to
    /// librdkafka). One request for the commits, one for the partitions without a commit
    /// (a lookup per partition, one after the other, took ~3 ms of a start on Tansu).
    fn start_offsets(
        &self,
        consumer: &BaseConsumer<BridgeContext<P>>,
        partitions: &[i32],
        timeout: Duration,
    ) -> Vec<(i32, Option<i64>)> {
        let topic = &self.shared.input_topic;
        let mut asked = TopicPartitionList::new();
        for &p in partitions {
            asked.add_partition(topic, p);
        }
        let commits = consumer.committed_offsets(asked, timeout).ok();
        // Per partition: `Some` of its commit (`None`: nothing committed); `None` where the
        // lookup failed.
        let commit_of = |p: i32| -> Option<Option<i64>> {
            let element = commits.as_ref()?.find_partition(topic, p)?;
            element.error().ok()?;
            Some(match element.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
        };
        let commits: Vec<(i32, Option<Option<i64>>)> =
            partitions.iter().map(|&p| (p, commit_of(p))).collect();
        // Partitions without a commit, asked where they start, in one request (unless
        // librdkafka decides that).
        let uncommitted: Vec<(&str, i32)> = commits
            .iter()
            .filter(|(_, commit)| *commit == Some(None))
            .map(|&(p, _)| (&**topic, p))
            .collect();
        let at = match self.no_commit {
            NoCommitStart::First => Some(Offset::Beginning),
            NoCommitStart::End => Some(Offset::End),
            NoCommitStart::Librdkafka => None,
        };
        let reset = match at {
            Some(at) if !uncommitted.is_empty() => {
                list_offsets(consumer, &uncommitted, at, timeout).ok()
            }
            _ => None,
        };
        commits
            .into_iter()
            .map(|(p, commit)| {
                let start = match commit {
                    Some(Some(o)) => Some(o),
                    Some(None) => reset.as_ref().and_then(|r| r.offset(topic, p).ok()),
                    None => None,
                };
                (p, start)
            })
            .collect()
    }

    /// Give a new assignment explicit start offsets before librdkafka takes it. Left
    /// unset, librdkafka looks the offsets up itself, and for a partition with no commit
    /// (a new group: every first start) it waits a fixed 100 ms before asking for the
    /// partition's first offset: a tenth of a second before the first input. A partition
    /// whose offset the cluster does not give here is left to librdkafka's own lookup.
    fn set_start_offsets(
        &self,
        consumer: &BaseConsumer<BridgeContext<P>>,
        tpl: &TopicPartitionList,
    ) {
        let topic = &self.shared.input_topic;
        let partitions = without_start(tpl, topic);
        if partitions.is_empty() {
            return;
        }
        let starts: HashMap<i32, Offset> = self
            .start_offsets(consumer, &partitions, Duration::from_secs(5))
            .into_iter()
            .filter_map(|(p, start)| Some((p, Offset::Offset(start?))))
            .collect();
        start_at(tpl, topic, &starts);
    }

    fn all(&self) -> Vec<i32> {
        let assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        assigned.keys().copied().collect()
    }

    /// The consumer reached the end of `partition`: tell its task where (after the records
    /// routed before, in order).
    fn end_of_partition(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32) {
        let position = consumer.position().ok().and_then(|tpl| {
            match tpl
                .find_partition(&self.shared.input_topic, partition)?
                .offset()
            {
                Offset::Offset(o) => Some(o),
                _ => None,
            }
        });
        if let Some(position) = position {
            self.route(consumer, partition, Feed::End { position });
        }
    }

    /// Hand a record to its partition's task; if the task is full, hold it, and pause the
    /// partition once it holds too much.
    ///
    /// The hold: how much a partition's task may fall behind (bytes of held inputs, see
    /// [`held_size`]) before its partition is paused: `WATCHBRIDGE_INPUT_HOLD_BYTES`, 16 MiB by
    /// default. Pausing is not free: librdkafka drops what it had fetched ahead for the
    /// partition and fetches it again on resume, so pausing as soon as the task's channel is
    /// full made a burst of new watches fetch each input many times over (Tansu on SQLite,
    /// which reads each record's headers with a query of its own, then spent its core on
    /// re-reads and started ~2,500 watches/s). Holding about what librdkafka itself reads
    /// ahead for a partition (`queued.min.messages`, 100,000 records: 18 MiB of small inputs
    /// as the hold counts them) makes a pause rare: with 4 MiB, 200,000 small inputs on 4
    /// partitions paused each partition once or twice and the re-reads halved the rate at
    /// which the bridge read them (`benches/scale.rs`: 17,319 against 30,621 watches/s).
    fn route(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32, message: Feed) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let Some(a) = assigned.get_mut(&partition) else {
            // Not ours (any more): not committed either, so its new owner reads it.
            return;
        };
        let message = if a.held.is_empty() {
            match a.inputs.try_send(message) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(message)) => message,
            }
        } else {
            message
        };
        a.held_bytes += held_size(&message);
        a.held.push_back(message);
        if !a.paused && a.held_bytes >= self.shared.input_hold_bytes {
            a.paused = true;
            let _ = consumer.pause(&self.one(partition));
            tracing::debug!(
                partition,
                held = a.held.len(),
                "partition paused: its task is catching up"
            );
        }
    }

    /// Retry held records; resume a partition once it has none left. Returns whether any
    /// partition still holds records.
    fn retry_held(&self, consumer: &BaseConsumer<BridgeContext<P>>) -> bool {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let mut still_held = false;
        for (&partition, a) in assigned.iter_mut() {
            if a.held.is_empty() {
                continue;
            }
            while let Some(message) = a.held.pop_front() {
                let size = held_size(&message);
                match a.inputs.try_send(message) {
                    Ok(()) => a.held_bytes -= size,
                    Err(mpsc::error::TrySendError::Full(message)) => {
                        a.held.push_front(message);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        a.held.clear();
                        a.held_bytes = 0;
                    }
                }
            }
            if a.held.is_empty() {
                // What a burst made it grow to is not kept (a small hold keeps its buffer
                // for the next one, as the delivery slots do).
                if a.held.capacity() > INPUT_BUFFER {
                    a.held = VecDeque::new();
                }
                if a.paused {
                    a.paused = false;
                    let _ = consumer.resume(&self.one(partition));
                    tracing::debug!(partition, "partition resumed");
                }
            } else {
                still_held = true;
            }
        }
        still_held
    }

    fn one(&self, partition: i32) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.shared.input_topic, partition);
        tpl
    }

    /// Store the positions the tasks published, for librdkafka to commit.
    fn store_positions(&self, consumer: &BaseConsumer<BridgeContext<P>>) {
        store_positions(consumer, &self.shared.input_topic, &self.shared.positions);
    }

    /// The final commit of a stop: the positions in `wanted`, asynchronously, then checked
    /// (the group's committed offsets, asked with a bounded timeout) until they are
    /// committed or `deadline`. (A synchronous commit waits as long as librdkafka likes:
    /// with every broker gone, for ever.)
    fn commit_until(
        &self,
        consumer: &BaseConsumer<BridgeContext<P>>,
        wanted: &[(i32, i64)],
        deadline: Instant,
    ) -> Result<(), String> {
        self.store_positions(consumer);
        if wanted.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for &(partition, offset) in wanted {
            tpl.add_partition_offset(&self.shared.input_topic, partition, Offset::Offset(offset))
                .map_err(|e| e.to_string())?;
        }
        consumer
            .commit(&tpl, CommitMode::Async)
            .map_err(|e| e.to_string())?;
        let mut last_error = None;
        loop {
            // Serves the commit's result (and any rebalance) meanwhile. Records are no
            // longer routed: uncommitted, they are read again.
            let _ = consumer.poll(Duration::from_millis(50));
            if let Some(e) = self
                .commit_failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
                .next_back()
            {
                last_error = Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(last_error.unwrap_or_else(|| {
                    "the brokers did not confirm it within WATCHBRIDGE_SHUTDOWN_TIMEOUT".into()
                }));
            }
            match consumer.committed_offsets(tpl.clone(), left.min(Duration::from_secs(1))) {
                Ok(committed) => {
                    let covers = wanted.iter().all(|&(p, o)| {
                        committed
                            .find_partition(&self.shared.input_topic, p)
                            .is_some_and(|e| matches!(e.offset(), Offset::Offset(c) if c >= o))
                    });
                    if covers {
                        return Ok(());
                    }
                }
                Err(e) => last_error = Some(e.to_string()),
            }
        }
    }

    fn commit(&self, consumer: &BaseConsumer<BridgeContext<P>>) {
        self.store_positions(consumer);
        if let Err(e) = commit_stored(consumer) {
            tracing::warn!(error = %e, "commit failed; uncommitted inputs will be read again")
        }
    }
}

/// Store the commit positions the tasks published in `positions` (partitions of `topic`),
/// for librdkafka to commit.
pub(crate) fn store_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    positions: &Mutex<HashMap<i32, i64>>,
) {
    let positions: Vec<(i32, i64)> = match positions.lock() {
        Ok(mut p) => p.drain().collect(),
        Err(_) => return,
    };
    if positions.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in positions {
        let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(offset));
    }
    if let Err(e) = consumer.store_offsets(&tpl) {
        // A partition revoked meanwhile: its new owner re-reads from the last commit.
        tracing::debug!(error = %e, "could not store offsets");
    }
}

/// Commit what is stored, synchronously; nothing stored since the last commit is no error.
pub(crate) fn commit_stored<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> KafkaResult<()> {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => Ok(()),
        other => other,
    }
}

/// Drop `consumer` (librdkafka's close: leaving its group waits for the group's
/// coordinator) on a thread of its own, waiting for it until `by`: whether it closed in
/// time. What is not done by then is left to that thread, which the process's exit ends.
pub(crate) fn close_by<C: ConsumerContext + 'static>(
    consumer: BaseConsumer<C>,
    thread_name: &str,
    by: Instant,
) -> bool {
    let (closed_tx, closed_rx) = std_mpsc::channel();
    let closing = std::thread::Builder::new()
        .name(thread_name.into())
        .spawn(move || {
            drop(consumer);
            let _ = closed_tx.send(());
        });
    closing.is_ok()
        && closed_rx
            .recv_timeout(by.saturating_duration_since(Instant::now()))
            .is_ok()
}

/// The partitions of `topic` in a new assignment `tpl` that have no start offset yet.
pub(crate) fn without_start(tpl: &TopicPartitionList, topic: &str) -> Vec<i32> {
    tpl.elements_for_topic(topic)
        .iter()
        .filter(|e| e.offset() == Offset::Invalid)
        .map(|e| e.partition())
        .collect()
}

/// Start the partitions of `topic` in `tpl` at `starts` (the list is librdkafka's, about
/// to be assigned: setting an element's offset sets what the assignment starts from).
pub(crate) fn start_at(tpl: &TopicPartitionList, topic: &str, starts: &HashMap<i32, Offset>) {
    for mut element in tpl.elements_for_topic(topic) {
        if let Some(&start) = starts.get(&element.partition()) {
            let _ = element.set_offset(start);
        }
    }
}

/// librdkafka's callbacks for the bridge's consumer.
pub struct BridgeContext<P: Resolve> {
    pub partitions: Arc<Partitions<P>>,
}

impl<P: Resolve> ClientContext for BridgeContext<P> {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.partitions
            .shared
            .kafka
            .health
            .log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.partitions.shared.kafka.health.error(error, reason);
    }

    /// The lag of the assigned partitions (`watchbridge_consumer_lag_messages`); a revoked
    /// partition's label goes with its revocation, and is not set again.
    fn stats(&self, statistics: Statistics) {
        let shared = &self.partitions.shared;
        let committed = shared
            .transaction_positions
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        let lag = consumer_lag(
            &statistics,
            &shared.input_topic,
            &self.partitions.all(),
            &committed,
        );
        KafkaStatistics::Consumer { lag: &lag }.emit(&shared.metrics);
    }
}

impl<P: Resolve> ConsumerContext for BridgeContext<P> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.partitions.set_start_offsets(consumer, tpl);
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            // Lost: this instance stalled past its session and the group gave the
            // partitions away; their new owners may be writing already.
            let lost = consumer.assignment_lost();
            if lost {
                tracing::warn!(
                    ?partitions,
                    "partitions lost (this instance was not heard from within the session \
                     timeout); they stop without writing anything"
                );
            } else {
                self.partitions.shared.lease.confirmed();
            }
            self.partitions.forget_waiting(&partitions);
            let deadline = self.partitions.revocation_deadline();
            self.partitions.stop(&partitions, deadline, lost);
            // While the bridge stops, its own final commit (bounded) covers them.
            if !lost && !self.partitions.stopping.load(Ordering::SeqCst) {
                self.partitions.commit(consumer);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let (true, Err(e)) = (self.partitions.stopping.load(Ordering::SeqCst), result) {
            tracing::debug!(error = %e, "commit failed while stopping");
            self.partitions
                .commit_failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.to_string());
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.partitions.shared.lease.confirmed();
                for element in tpl.elements() {
                    self.partitions
                        .assigned_by_group(consumer, element.partition());
                }
                // Also when empty: librdkafka reports every incremental assignment.
                let shared = &self.partitions.shared;
                shared.readiness.assignment_received(&shared.metrics);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }
}

/// A group consumer's errors other than a lost connection (an ACL missing on the input
/// topic or the group, a batch it cannot decode): never a silent loop. Each is counted;
/// logged at ERROR when it is new or every `ConsumerFailed::LOG_EVERY` while it lasts. The
/// bridge's input consumer also has `/readyz` say not ready, naming it, until the consumer
/// hands over a record or an end of partition again; the repartition stage's consumer
/// (`kafka/repartition/`) only logs and counts.
#[derive(Default)]
pub(crate) struct ConsumerFailing {
    /// The error and when it was last logged.
    last: Option<(String, Instant)>,
}

impl ConsumerFailing {
    /// `error` from the consumer of `topic` in `group`: counted, logged if due. Returns
    /// its text when it was logged.
    pub(crate) fn failed(
        &mut self,
        error: &KafkaError,
        topic: &str,
        group: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Option<&str> {
        let text = error.to_string();
        let log = match &self.last {
            Some((last, at)) => *last != text || at.elapsed() >= ConsumerFailed::LOG_EVERY,
            None => true,
        };
        ConsumerFailed {
            error,
            refused: error
                .rdkafka_error_code()
                .is_some_and(super::refusal::is_refusal),
            topic,
            group,
            log,
        }
        .emit(metrics);
        if !log {
            return None;
        }
        let (text, _) = self.last.insert((text, Instant::now()));
        Some(text)
    }

    /// The consumer handed something over: whether it had been failing until now.
    pub(crate) fn reads(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// [`ConsumerFailing`] for the bridge's input consumer, whose failing `/readyz` names.
fn consumer_failed<P: Resolve>(
    failing: &mut ConsumerFailing,
    error: &KafkaError,
    shared: &Shared<P>,
) {
    let (topic, group) = (&shared.input_topic, &shared.group_id);
    if let Some(text) = failing.failed(error, topic, group, &shared.metrics) {
        shared
            .readiness
            .consumer_failing(Some(text), &shared.metrics);
    }
}

/// The bridge's input consumer handed something over.
fn consumer_reads<P: Resolve>(failing: &mut ConsumerFailing, shared: &Shared<P>) {
    if failing.reads() {
        tracing::info!("the input consumer reads again");
        shared.readiness.consumer_failing(None, &shared.metrics);
    }
}

/// Run the consumer until `stop` is set (or, in a bounded run, every partition finished);
/// then stop every partition, commit, and leave the group, all by `deadline` (set before
/// `stop`; else the stop timeout from then) plus at most 1.5 s: a commit gets at least 1 s,
/// leaving the group at least 0.5 s. What librdkafka cannot finish by then (with every
/// broker gone it never does) is left to a thread of its own, which the process's exit
/// ends; the report says what was left.
pub fn consume<P: Resolve>(
    consumer: BaseConsumer<BridgeContext<P>>,
    partitions: Arc<Partitions<P>>,
    stop: Arc<AtomicBool>,
    deadline: Arc<OnceLock<Instant>>,
    bounded: bool,
) -> ConsumerStopped {
    let mut failing = ConsumerFailing::default();
    while !stop.load(Ordering::Relaxed) {
        partitions
            .shared
            .lease
            .confirm_unless_lost(consumer.assignment_lost());
        if partitions.reap(&consumer) && bounded {
            break;
        }
        let holding = partitions.retry_held(&consumer);
        partitions.store_positions(&consumer);
        let wait = if holding {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(wait) {
            None => {}
            Some(Ok(message)) => {
                consumer_reads(&mut failing, &partitions.shared);
                partitions.route(
                    &consumer,
                    message.partition(),
                    Feed::Record(message.detach()),
                )
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                consumer_reads(&mut failing, &partitions.shared);
                partitions.end_of_partition(&consumer, partition)
            }
            // A lost connection is the broker health's to report (once per outage); the
            // context has it already.
            Some(Err(e)) if e.rdkafka_error_code().is_some_and(is_connection_error) => {
                tracing::trace!(error = %e, "consumer connection error")
            }
            Some(Err(e)) => consumer_failed(&mut failing, &e, &partitions.shared),
        }
    }
    let deadline = *deadline.get_or_init(|| Instant::now() + partitions.shared.stop_timeout);
    partitions.stopping.store(true, Ordering::SeqCst);
    let all = partitions.all();
    // The tasks' own bound is the stop timeout from when they were told, just now.
    let lost = consumer.assignment_lost();
    let reports = partitions.stop(&all, deadline + Duration::from_millis(500), lost);
    let commit = if partitions.shared.transactions.is_some() || lost {
        // Their transactions committed the positions (or did not: see the reports).
        Ok(())
    } else {
        let wanted: Vec<(i32, i64)> = reports
            .iter()
            .filter_map(|(p, r)| Some((*p, r.as_ref()?.position?)))
            .collect();
        let by = deadline.max(Instant::now() + Duration::from_secs(1));
        partitions.commit_until(&consumer, &wanted, by)
    };
    // Leaving the group (librdkafka's close, in the consumer's drop) waits for the group
    // coordinator; on a thread of its own, so that the stop does not wait past its bound.
    let by = deadline.max(Instant::now() + Duration::from_millis(500));
    let closed = close_by(consumer, "watchbridge-consumer-close", by);
    ConsumerStopped {
        partitions: reports,
        commit,
        closed,
    }
}

#[cfg(test)]
mod tests {
    use super::NoCommitStart;

    /// Every spelling librdkafka takes for `auto.offset.reset`; unset is its default.
    #[test]
    fn a_partition_without_a_commit_starts_where_auto_offset_reset_says() {
        for first in ["earliest", "smallest", "beginning"] {
            assert_eq!(NoCommitStart::from_reset(Some(first)), NoCommitStart::First);
        }
        for end in ["latest", "largest", "end"] {
            assert_eq!(NoCommitStart::from_reset(Some(end)), NoCommitStart::End);
        }
        assert_eq!(NoCommitStart::from_reset(None), NoCommitStart::End);
        assert_eq!(
            NoCommitStart::from_reset(Some("error")),
            NoCommitStart::Librdkafka
        );
    }
}

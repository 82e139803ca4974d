//! The consumer thread: one OS thread owns the group consumer. It polls librdkafka (which
//! runs rebalance callbacks on this thread), routes each input record to its partition's
//! task, pauses a partition whose task is not keeping up, and stores the commit positions
//! the tasks publish (librdkafka commits stored offsets every second, and we commit
//! synchronously on revocation and shutdown).
//!
//! A thread, not a task, because a revocation must block: before a partition goes to
//! another instance, its task stops its watches, delivers what they emitted, and its
//! offsets are committed. Blocking there is what librdkafka's rebalance callback is for.

use super::partition::{Bounds, Ending, Feed, PartitionTask, Shared, Stopped};
use super::stats::consumer_lag;
use crate::internal_events::{KafkaStatistics, PartitionAssigned, PartitionRevoked};
use crate::pollers::Resolve;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Inputs buffered per partition between the consumer thread and the partition task.
const INPUT_BUFFER: usize = 512;

/// One assigned partition, as the consumer thread sees it.
struct Assigned {
    inputs: mpsc::Sender<Feed>,
    /// Inputs (and ends of partition) the task had no room for; the partition is paused
    /// while any wait here.
    held: VecDeque<Feed>,
    stopped: std_mpsc::Receiver<Stopped>,
    /// A bounded run's range (a restarted task reads the rest of it).
    bounds: Option<Bounds>,
}

/// The partitions of one bridge, shared by the consumer thread and its rebalance callbacks
/// (both run on the consumer thread; the mutex is never contended).
pub struct Partitions<P: Resolve> {
    shared: Arc<Shared<P>>,
    runtime: tokio::runtime::Handle,
    assigned: Mutex<HashMap<i32, Assigned>>,
    /// Whether this instance owns input partition 0, whose owner publishes the merged
    /// watermark.
    pub owns_first: Arc<AtomicBool>,
}

impl<P: Resolve> Partitions<P> {
    pub fn new(shared: Arc<Shared<P>>, runtime: tokio::runtime::Handle) -> Self {
        Self {
            shared,
            runtime,
            assigned: Mutex::new(HashMap::new()),
            owns_first: Arc::new(AtomicBool::new(false)),
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
        let task = PartitionTask::spawn(partition, self.shared.clone(), receiver, bounds);
        if partition == 0 {
            self.owns_first.store(true, Ordering::SeqCst);
        }
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
                stopped,
                bounds,
            },
        );
    }

    /// Stop the tasks of `partitions` and wait (bounded) until each has delivered what its
    /// watches emitted and published its last position.
    fn stop(&self, partitions: &[i32]) {
        let removed: Vec<(i32, Assigned)> = {
            let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
            partitions
                .iter()
                .filter_map(|p| assigned.remove(p).map(|a| (*p, a)))
                .collect()
        };
        // Close every input channel first, so the tasks stop in parallel.
        let waiting: Vec<(i32, std_mpsc::Receiver<Stopped>)> = removed
            .into_iter()
            .map(|(p, a)| {
                drop(a.inputs);
                (p, a.stopped)
            })
            .collect();
        // Their own bound is `stop_timeout`; allow a little more for them to report.
        let deadline =
            std::time::Instant::now() + self.shared.stop_timeout + Duration::from_secs(2);
        for (partition, stopped) in waiting {
            if partition == 0 {
                self.owns_first.store(false, Ordering::SeqCst);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let report = stopped.recv_timeout(left).ok();
            PartitionRevoked {
                topic: &self.shared.input_topic,
                partition,
                committed: report.and_then(|s| s.position),
                watches_stopped: report.map_or(0, |s| s.watches_stopped),
            }
            .emit(&self.shared.metrics);
        }
    }

    /// Handle the tasks that ended on their own: in a bounded run, done (every input read,
    /// every watch ended): forget them; in the exactly-once mode, an aborted transaction:
    /// read the partition again from its last committed position with a new task; fenced:
    /// leave the partition (another instance owns it now; the group takes it from this one
    /// at its next rebalance). Returns whether no partition is left.
    fn reap(&self, consumer: &BaseConsumer<BridgeContext<P>>) -> bool {
        let mut restart = Vec::new();
        let none_left = {
            let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
            assigned.retain(|&partition, a| match a.stopped.try_recv() {
                Ok(report) => {
                    match report.ending {
                        Ending::Done | Ending::Fenced => PartitionRevoked {
                            topic: &self.shared.input_topic,
                            partition,
                            committed: report.position,
                            watches_stopped: report.watches_stopped,
                        }
                        .emit(&self.shared.metrics),
                        Ending::Restart => restart.push((partition, report.position, a.bounds)),
                    }
                    false
                }
                Err(std_mpsc::TryRecvError::Empty) => true,
                Err(std_mpsc::TryRecvError::Disconnected) => false,
            });
            assigned.is_empty()
        };
        for (partition, position, bounds) in restart {
            if consumer.assignment_lost() {
                // The group gave our partitions away (this instance stalled past the
                // session timeout): starting this one again would fence its new owner.
                tracing::warn!(
                    partition,
                    "not restarting the partition: the assignment was lost"
                );
                continue;
            }
            let Some(start) = position.or_else(|| self.committed(consumer, partition)) else {
                tracing::error!(partition, "cannot read the partition's committed offset; it is left until the group assigns it again");
                continue;
            };
            let topic = &self.shared.input_topic;
            if let Err(e) = consumer.seek(
                topic,
                partition,
                Offset::Offset(start),
                Duration::from_secs(10),
            ) {
                tracing::error!(partition, error = %e, "cannot read the partition again from its last commit; it is left until the group assigns it again");
                continue;
            }
            let _ = consumer.resume(&self.one(partition));
            tracing::info!(
                partition,
                offset = start,
                "restarting the partition from its last committed transaction"
            );
            self.assign(partition, bounds.map(|b| Bounds { start, end: b.end }));
        }
        none_left && self.assigned.lock().map_or(true, |a| a.is_empty())
    }

    /// The group's committed offset of `partition` (the start when nothing is committed).
    fn committed(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32) -> Option<i64> {
        let committed = consumer
            .committed_offsets(self.one(partition), Duration::from_secs(10))
            .ok()?;
        match committed
            .find_partition(&self.shared.input_topic, partition)?
            .offset()
        {
            Offset::Offset(o) => Some(o),
            _ => consumer
                .fetch_watermarks(&self.shared.input_topic, partition, Duration::from_secs(10))
                .ok()
                .map(|(low, _)| low),
        }
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

    /// Hand a record to its partition's task; if the task is full, hold it and pause.
    fn route(&self, consumer: &BaseConsumer<BridgeContext<P>>, partition: i32, message: Feed) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let Some(a) = assigned.get_mut(&partition) else {
            // Not ours (any more): not committed either, so its new owner reads it.
            return;
        };
        if !a.held.is_empty() {
            a.held.push_back(message);
            return;
        }
        match a.inputs.try_send(message) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(message)) => {
                a.held.push_back(message);
                let _ = consumer.pause(&self.one(partition));
                tracing::debug!(partition, "partition paused: its task is catching up");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
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
                match a.inputs.try_send(message) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(message)) => {
                        a.held.push_front(message);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        a.held.clear();
                    }
                }
            }
            if a.held.is_empty() {
                let _ = consumer.resume(&self.one(partition));
                tracing::debug!(partition, "partition resumed");
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
        let positions: Vec<(i32, i64)> = match self.shared.positions.lock() {
            Ok(mut p) => p.drain().collect(),
            Err(_) => return,
        };
        if positions.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in positions {
            let _ = tpl.add_partition_offset(
                &self.shared.input_topic,
                partition,
                Offset::Offset(offset),
            );
        }
        if let Err(e) = consumer.store_offsets(&tpl) {
            // A partition revoked meanwhile: its new owner re-reads from the last commit.
            tracing::debug!(error = %e, "could not store offsets");
        }
    }

    fn commit(&self, consumer: &BaseConsumer<BridgeContext<P>>) {
        self.store_positions(consumer);
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => {}
            // Nothing stored since the last commit.
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(e) => {
                tracing::warn!(error = %e, "commit failed; uncommitted inputs will be read again")
            }
        }
    }
}

/// librdkafka's callbacks for the bridge's consumer.
pub struct BridgeContext<P: Resolve> {
    pub partitions: Arc<Partitions<P>>,
}

impl<P: Resolve> ClientContext for BridgeContext<P> {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        super::client::client_error(error, reason);
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
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            self.partitions.stop(&partitions);
            self.partitions.commit(consumer);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                for element in tpl.elements() {
                    self.partitions.assign(element.partition(), None);
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

/// Run the consumer until `stop` is set (or, in a bounded run, every partition finished);
/// then stop every partition, commit, and leave the group.
pub fn consume<P: Resolve>(
    consumer: BaseConsumer<BridgeContext<P>>,
    partitions: Arc<Partitions<P>>,
    stop: Arc<AtomicBool>,
    bounded: bool,
) {
    while !stop.load(Ordering::Relaxed) {
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
            Some(Ok(message)) => partitions.route(
                &consumer,
                message.partition(),
                Feed::Record(message.detach()),
            ),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(partition))) => {
                partitions.end_of_partition(&consumer, partition)
            }
            Some(Err(e)) => tracing::warn!(error = %e, "consumer error"),
        }
    }
    let all = partitions.all();
    partitions.stop(&all);
    partitions.commit(&consumer);
    consumer.unsubscribe();
}

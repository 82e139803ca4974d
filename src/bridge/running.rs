//! The bridge running: the consumer thread reads until a stop is asked for (or, in a
//! bounded run, until every partition is done), then the orderly stop, within one deadline
//! (see the module `bridge`): the consumer thread stopped, the watermark reader stopped, the
//! shared producer flushed, and what was not done reported.

use super::operations::Operations;
use super::partitions::MergedWatermark;
use super::start::Start;
use super::BridgeError;
use crate::config::RunConfig;
use crate::internal_events::StopGaveUp;
use crate::kafka::client::TopicLayout;
use crate::kafka::consumer::{consume, BridgeContext, ConsumerStopped, Partitions};
use crate::kafka::health::BrokerHealth;
use crate::kafka::merged::{publish_end_of_time, EndOfTimeTopics};
use crate::kafka::partition::Ending;
use crate::kafka::repartition::RepartitionStage;
use crate::kafka::stats::BridgeProducer;
use crate::pollers::Resolve;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::Producer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// A run under way: what its end and its stop need.
pub(super) struct Running<P: Resolve> {
    /// The repartition stage, when the inputs go through the repartition topic: stopped
    /// first, so that what it read reaches the watch side before that stops.
    pub repartition: Option<RepartitionStage>,
    pub consumer: ConsumerThread,
    /// The partition tasks (which of them a bounded run did not finish).
    pub partitions: Arc<Partitions<P>>,
    pub layout: TopicLayout,
    /// The shared producer (the merged watermark, a bounded run's end of time).
    pub producer: BridgeProducer,
    pub merged: MergedWatermark,
    /// The operations servers answer until the end.
    pub operations: Operations,
    /// Tasks that end with the run.
    pub background: JoinSet<()>,
}

impl<P: Resolve> Running<P> {
    /// Run until a stop is asked for, or a bounded run is done; then stop in order. An
    /// error if the stop gave up ([`BridgeError::StopGaveUp`]).
    pub(super) async fn until_stopped(mut self, start: &Start<'_>) -> Result<(), BridgeError> {
        let config = start.config;
        let finished = self.consumer.finished_unless(&start.stop).await;
        start.readiness.stopping(&start.metrics);
        // One deadline for the whole stop (a bounded run that finished has its own).
        let deadline = Instant::now() + config.shutdown_timeout;
        if let Some(stage) = self.repartition.take() {
            let _ = tokio::task::spawn_blocking(move || stage.stop()).await;
        }
        let consumer_stopped = match finished {
            Some(report) => {
                self.end_bounded_run(config).await;
                report
            }
            None => self.consumer.stop(deadline).await,
        };
        self.merged.stop(deadline).await;
        let undelivered = flush(&self.producer, deadline).await;
        let gave_up = stop_report(
            consumer_stopped.as_ref(),
            undelivered,
            config,
            &start.health,
            started_stop(deadline, config),
        );
        if gave_up {
            // Destroying a producer with records it cannot deliver waits for them: not here.
            let producer = self.producer;
            let _ = std::thread::Builder::new()
                .name("watchbridge-producer-close".into())
                .spawn(move || drop(producer));
        }
        drop(self.operations);
        drop(self.background);
        if gave_up {
            return Err(BridgeError::StopGaveUp);
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// A bounded run whose every input was read: the end of time published, if every
    /// partition got there.
    async fn end_bounded_run(&self, config: &RunConfig) {
        let incomplete = self.partitions.incomplete();
        if incomplete.is_empty() {
            tracing::info!("bounded run complete: every input read, every watch ended");
            let topics = EndOfTimeTopics {
                input_topic: config.input_topic.as_str().into(),
                input_partitions: self.layout.input_partitions,
                watermark_topic: config.watermark_topic.as_str().into(),
                output_topic: config.output_topic.as_str().into(),
                output_partitions: self.layout.output_partitions,
            };
            publish_end_of_time(&self.producer, &topics).await;
        } else {
            // No end of time for the merged value: not every partition got there.
            tracing::warn!(
                partitions = ?incomplete,
                "bounded run over, but these partitions did not finish (left to another \
                 instance, or could not be read again); their watermark and the merged \
                 one are not at the end of time"
            );
        }
    }
}

/// The consumer thread (`kafka::consumer::consume`), reading until it is told to stop or,
/// in a bounded run, until every partition is done.
pub(super) struct ConsumerThread {
    joined: tokio::task::JoinHandle<std::thread::Result<ConsumerStopped>>,
    stop: Arc<AtomicBool>,
    deadline: Arc<OnceLock<Instant>>,
}

impl ConsumerThread {
    pub(super) fn start<P: Resolve>(
        consumer: BaseConsumer<BridgeContext<P>>,
        partitions: Arc<Partitions<P>>,
        bounded: bool,
    ) -> Result<Self, BridgeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Arc::new(OnceLock::new());
        let thread = {
            let (stop, deadline) = (stop.clone(), deadline.clone());
            std::thread::Builder::new()
                .name("watchbridge-consumer".into())
                .spawn(move || consume(consumer, partitions, stop, deadline, bounded))
                .map_err(|e| BridgeError::Start(format!("cannot start the consumer thread: {e}")))?
        };
        let joined = tokio::task::spawn_blocking(move || thread.join());
        Ok(Self {
            joined,
            stop,
            deadline,
        })
    }

    /// Until the thread ends by itself (a bounded run done: `Some`, with its report if it
    /// has one), or `stop` is asked for (`None`).
    async fn finished_unless(
        &mut self,
        stop: &super::StopSignal,
    ) -> Option<Option<ConsumerStopped>> {
        tokio::select! {
            () = stop.stopped() => None,
            joined = &mut self.joined => Some(joined.ok().and_then(Result::ok)),
        }
    }

    /// Tell the thread to stop by `deadline`, and wait for its report (`None`: it did not
    /// end in time).
    async fn stop(self, deadline: Instant) -> Option<ConsumerStopped> {
        tracing::info!("stopping: no more input; stopping watches, delivering, committing");
        let _ = self.deadline.set(deadline);
        self.stop.store(true, Ordering::SeqCst);
        // The consumer thread ends by the deadline plus 1.5 s at most, unless
        // librdkafka blocks where no bound reaches it.
        let bound = deadline + Duration::from_secs(2);
        match tokio::time::timeout_at(bound.into(), self.joined).await {
            Ok(Ok(Ok(stopped))) => Some(stopped),
            _ => None,
        }
    }
}

/// Flush `producer` until `deadline` (half a second at least): how many records it did not
/// deliver.
async fn flush(producer: &BridgeProducer, deadline: Instant) -> u64 {
    let flush_for = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(500));
    let flushing = producer.clone();
    let flushed = tokio::task::spawn_blocking(move || flushing.flush(flush_for)).await;
    // A flush that succeeded saw no record left undelivered. The producer's queue length
    // afterwards is no count of records: it also counts librdkafka's pending callbacks and
    // log lines (with `KAFKA_DEBUG` set, a stop that had delivered everything reported "1
    // record(s) not delivered" one time in three).
    if let Ok(Err(e)) = &flushed {
        tracing::debug!(error = %e, "producer flush incomplete");
    }
    match flushed {
        Ok(Ok(())) => 0,
        _ => producer.in_flight_count().max(0) as u64,
    }
}

/// When the stop whose deadline is `deadline` began.
fn started_stop(deadline: Instant, config: &RunConfig) -> Instant {
    deadline
        .checked_sub(config.shutdown_timeout)
        .unwrap_or(deadline)
}

/// Whether the stop left anything undelivered or uncommitted; if so, say what (once, in
/// [`StopGaveUp`]). `undelivered`: records the shared producer still holds.
fn stop_report(
    consumer: Option<&ConsumerStopped>,
    undelivered: u64,
    config: &RunConfig,
    health: &BrokerHealth,
    began: Instant,
) -> bool {
    let mut not_delivered = undelivered;
    let mut not_committed: Vec<(i32, Option<i64>)> = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    match consumer {
        None => causes.push(
            "the consumer did not stop in time: inputs since its last commit are not committed"
                .into(),
        ),
        Some(stopped) => {
            for (partition, report) in &stopped.partitions {
                match report {
                    None => not_committed.push((*partition, None)),
                    Some(r) => {
                        // Its last checkpoint (or transaction) did not land: inputs from its
                        // committed position on are read again.
                        if r.ending != Ending::Done || r.undelivered > 0 {
                            not_committed.push((*partition, r.position));
                        }
                    }
                }
            }
            if let Err(e) = &stopped.commit {
                causes.push(format!("the final commit failed: {e}"));
                for (partition, report) in &stopped.partitions {
                    if let Some(position) = report.as_ref().and_then(|r| r.position) {
                        if !not_committed.iter().any(|(p, _)| p == partition) {
                            not_committed.push((*partition, Some(position)));
                        }
                    }
                }
            }
            // Each partition's own producer held these (the shared producer's, the merged
            // watermark's, are counted above).
            let own: usize = stopped
                .partitions
                .iter()
                .filter_map(|(_, r)| r.as_ref())
                .map(|r| r.undelivered)
                .sum();
            not_delivered += own as u64;
            if !stopped.closed && stopped.commit.is_ok() && not_committed.is_empty() {
                tracing::warn!(
                    "left the consumer group without saying goodbye (the group coordinator did \
                     not answer in time): the group gives this instance's partitions to \
                     others once its session times out"
                );
            }
        }
    }
    if not_delivered == 0 && not_committed.is_empty() && causes.is_empty() {
        return false;
    }
    not_committed.sort_unstable();
    if health.is_unreachable() {
        causes.insert(0, "every broker is unreachable".into());
    }
    if causes.is_empty() {
        causes.push("the brokers did not acknowledge everything in time".into());
    }
    let uncounted = match consumer {
        Some(stopped) => stopped
            .partitions
            .iter()
            .filter(|(_, r)| r.is_none())
            .count(),
        _ => 0,
    };
    StopGaveUp {
        took: began.elapsed(),
        timeout: config.shutdown_timeout,
        not_delivered,
        uncounted,
        not_committed: consumer.map(|_| not_committed.as_slice()),
        cause: &causes.join("; "),
    }
    .emit(health.metrics());
    true
}

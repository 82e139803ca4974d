//! Everything the engine reports about itself, in one place (after Vector's
//! `internal_events`): each event is a struct whose `emit` both writes the log line and
//! counts the metric, so the two cannot drift apart.

use crate::metrics::Metrics;
use crate::poll::PollError;
use crate::reason::TerminatedReason;
use std::time::Duration;

/// Watch keys are user data of any bytes; log them readably and bounded.
pub struct KeyDisplay<'a>(pub &'a [u8]);

impl std::fmt::Display for KeyDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MAX: usize = 128;
        let shown = &self.0[..self.0.len().min(MAX)];
        write!(f, "{}", String::from_utf8_lossy(shown).escape_debug())?;
        if self.0.len() > MAX {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

pub struct WatchStarted<'a> {
    pub key: &'a [u8],
}

impl WatchStarted<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), "watch started");
        m.watches_started.inc();
        m.watches_active.inc();
    }
}

/// A watch saved before a restart runs again. Counted as active, not as started.
pub struct WatchRestored<'a> {
    pub key: &'a [u8],
}

impl WatchRestored<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), "watch restored");
        m.watches_active.inc();
        m.watches_restored.inc();
    }
}

pub struct InputAlreadyWatching<'a> {
    pub key: &'a [u8],
}

impl InputAlreadyWatching<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), "input for a running watch ignored");
        m.watches_duplicate_inputs.inc();
    }
}

pub struct WatchTerminated<'a> {
    pub key: &'a [u8],
    pub reason: &'a TerminatedReason,
}

impl WatchTerminated<'_> {
    pub fn emit(&self, m: &Metrics) {
        if *self.reason == TerminatedReason::Failed {
            tracing::warn!(key = %KeyDisplay(self.key), reason = %self.reason, "watch failed");
        } else {
            tracing::debug!(key = %KeyDisplay(self.key), reason = %self.reason, "watch terminated");
        }
        m.watches_terminated
            .with_label_values(&[self.reason.as_str()])
            .inc();
        m.watches_active.dec();
    }
}

pub struct PollSucceeded {
    pub new_outputs: usize,
    pub duplicates: usize,
    /// Marked seen without being emitted (a first poll from `now`).
    pub silent: usize,
    pub duration: Duration,
}

impl PollSucceeded {
    pub fn emit(&self, m: &Metrics) {
        m.polls_ok.inc();
        m.poll_duration
            .with_label_values(&["ok"])
            .observe(self.duration.as_secs_f64());
        m.outputs_emitted.inc_by(self.new_outputs as u64);
        m.duplicates_suppressed.inc_by(self.duplicates as u64);
        if self.silent > 0 {
            m.outputs_seen_silently.inc_by(self.silent as u64);
        }
    }
}

pub struct PollFailed<'a> {
    pub key: &'a [u8],
    pub error: &'a PollError,
    pub failures: u32,
    pub duration: Duration,
    /// `None` when this failure ends the watch.
    pub retry_in: Option<Duration>,
}

impl PollFailed<'_> {
    pub fn emit(&self, m: &Metrics) {
        match self.retry_in {
            Some(retry) => tracing::info!(
                key = %KeyDisplay(self.key),
                error = %self.error,
                failures = self.failures,
                retry_in = %humantime::format_duration(retry),
                "poll failed; retrying"
            ),
            None => tracing::warn!(
                key = %KeyDisplay(self.key),
                error = %self.error,
                failures = self.failures,
                "poll failed; giving up"
            ),
        }
        m.polls_error
            .with_label_values(&["error", self.error.kind])
            .inc();
        m.poll_duration
            .with_label_values(&["error"])
            .observe(self.duration.as_secs_f64());
    }
}

/// A resource asked (`Retry-After`) for a longer wait than `WATCHBRIDGE_RETRY_AFTER_MAX`;
/// the watch waits the cap instead. Once per such failed poll.
pub struct RetryAfterCapped<'a> {
    pub key: &'a [u8],
    pub requested: Duration,
    pub cap: Duration,
}

impl RetryAfterCapped<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            key = %KeyDisplay(self.key),
            requested = %humantime::format_duration(self.requested),
            cap = %humantime::format_duration(self.cap),
            "Retry-After longer than WATCHBRIDGE_RETRY_AFTER_MAX; waiting the cap"
        );
        m.retry_after_capped.inc();
    }
}

pub struct PollRateLimited<'a> {
    pub host: &'a str,
    pub wait: Duration,
}

impl PollRateLimited<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::trace!(host = self.host, wait = ?self.wait, "poll deferred by rate limit");
        m.polls_deferred.inc();
    }
}

/// A host said to wait, and every watch of this instance polling it waits (its deferred
/// polls are counted by [`PollRateLimited`]).
pub struct HostHeld<'a> {
    pub host: &'a str,
    pub wait: Duration,
}

impl HostHeld<'_> {
    pub fn emit(&self) {
        tracing::info!(host = %crate::logging::outside(self.host), wait = %humantime::format_duration(self.wait), "the host said to wait: no watch polls it before then");
    }
}

pub struct PollStarted {
    pub lateness: Duration,
}

impl PollStarted {
    pub fn emit(&self, m: &Metrics) {
        m.poll_lateness.observe(self.lateness.as_secs_f64());
    }
}

/// One request to the schema registry and how it ended (failures logged: the caller
/// retries, so each is a warning, not an error).
pub struct SchemaRegistryRequest<'a, T, E> {
    /// `schema` (by id), `reference` (a referenced schema) or `register`.
    pub request: &'static str,
    pub result: &'a Result<Option<T>, E>,
}

impl<T, E: std::fmt::Display> SchemaRegistryRequest<'_, T, E> {
    pub fn emit(&self, m: &Metrics) {
        let result = match self.result {
            Ok(Some(_)) => "ok",
            Ok(None) => "not_found",
            Err(e) => {
                tracing::warn!(request = self.request, error = %e, "schema registry request failed; retried with backoff");
                "unavailable"
            }
        };
        m.schema_registry_requests
            .with_label_values(&[self.request, result])
            .inc();
    }
}

/// An output item that cannot be written in the output format (it does not fit
/// `WATCHBRIDGE_OUTPUT_SCHEMA`): it goes to the dead-letter topic, and its watch goes on.
pub struct OutputDeadLettered<'a> {
    pub partition: i32,
    pub watch_key: &'a [u8],
    pub reason: &'static str,
    pub error: &'a str,
}

impl OutputDeadLettered<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            partition = self.partition,
            watch_key = %crate::logging::outside(&String::from_utf8_lossy(self.watch_key)),
            reason = self.reason,
            error = self.error,
            "output sent to the dead-letter topic"
        );
        m.outputs_dead_lettered
            .with_label_values(&[self.reason])
            .inc();
    }
}

pub struct InputConsumed;

impl InputConsumed {
    pub fn emit(&self, m: &Metrics) {
        m.inputs_consumed.inc();
    }
}

/// An input that cannot become a watch; it goes to the dead-letter topic.
pub struct InputDeadLettered<'a> {
    pub partition: i32,
    pub offset: i64,
    /// [`crate::formats::watch_input::Rejected::kind`].
    pub reason: &'static str,
    pub error: &'a str,
}

impl InputDeadLettered<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            partition = self.partition,
            offset = self.offset,
            reason = self.reason,
            error = self.error,
            "input sent to the dead-letter topic"
        );
        m.inputs_dead_lettered
            .with_label_values(&[self.reason])
            .inc();
    }
}

/// Outputs the output topic acknowledged: counted per batch of reports, not per output (a
/// counter every partition task adds to is a cache line the cores pass back and forth).
pub struct OutputsProduced {
    pub count: u64,
}

impl OutputsProduced {
    pub fn emit(&self, m: &Metrics) {
        m.outputs_produced.inc_by(self.count);
    }
}

/// The broker did not take a record; it is retried, then dead-lettered.
pub struct ProduceFailed<'a> {
    pub topic: &'a str,
    pub error: &'a str,
    pub attempt: u32,
    pub then: AfterProduceFailure,
    /// The brokers' authorizer refused it (an ACL missing: `kafka::refusal`).
    pub refused: bool,
}

/// What happens to a record the producer could not deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterProduceFailure {
    Retry,
    DeadLetter,
    /// In the exactly-once mode: its transaction cannot commit; it is aborted and the
    /// partition starts again from its last commit.
    AbortTransaction,
    /// An output that may or may not be on the output topic (a timeout, a lost connection:
    /// librdkafka's "possibly persisted"): sending it again could write it twice, not
    /// sending it could lose it. The partition starts again from its durable state, whose
    /// read-back of the output topic finds it if it landed.
    RestartPartition,
    /// A watermark record: the partition's state is published again at the next tick.
    PublishAgain,
}

impl ProduceFailed<'_> {
    pub fn emit(&self, m: &Metrics, label: &str) {
        if self.refused {
            tracing::error!(
                topic = self.topic,
                error = self.error,
                "the brokers' authorizer refused WRITE on topic `{}`: grant the principal WRITE \
                 on it (docs/brokers.md, \"Least privilege\"); nothing is dead-lettered or \
                 committed, and the partition tries again after a backoff",
                self.topic
            );
            m.produce_failures.with_label_values(&[label]).inc();
            return;
        }
        match self.then {
            AfterProduceFailure::DeadLetter => tracing::error!(
                topic = self.topic,
                error = self.error,
                attempts = self.attempt,
                "record not delivered; sending it to the dead-letter topic"
            ),
            AfterProduceFailure::Retry => tracing::warn!(
                topic = self.topic,
                error = self.error,
                attempt = self.attempt,
                "record not delivered; retrying"
            ),
            AfterProduceFailure::AbortTransaction => tracing::warn!(
                topic = self.topic,
                error = self.error,
                "record not delivered; its transaction will be aborted"
            ),
            AfterProduceFailure::RestartPartition => tracing::warn!(
                topic = self.topic,
                error = self.error,
                "output not delivered (it may still be on the topic); the partition starts \
                 again from its durable state, which finds it if it landed"
            ),
            AfterProduceFailure::PublishAgain => tracing::warn!(
                topic = self.topic,
                error = self.error,
                "watermark record not delivered; the partition's watermark is published again \
                 at the next tick"
            ),
        }
        m.produce_failures.with_label_values(&[label]).inc();
    }
}

pub struct PartitionAssigned<'a> {
    pub topic: &'a str,
    pub partition: i32,
}

impl PartitionAssigned<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            topic = self.topic,
            partition = self.partition,
            "partition assigned; watching its inputs"
        );
        m.partitions_assigned.inc();
    }
}

pub struct PartitionRevoked<'a> {
    pub topic: &'a str,
    pub partition: i32,
    /// The offset committed for it (the next input to read), if any.
    pub committed: Option<i64>,
    pub watches_stopped: usize,
}

impl PartitionRevoked<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            topic = self.topic,
            partition = self.partition,
            committed = ?self.committed,
            watches_stopped = self.watches_stopped,
            "partition released; its watches stopped"
        );
        m.partitions_assigned.dec();
        let label = self.partition.to_string();
        let _ = m.partition_watermark.remove_label_values(&[&label]);
        let _ = m.consumer_lag.remove_label_values(&[&label]);
    }
}

/// A partition's published watermark (or idle flag) changed.
pub struct PartitionWatermarkChanged {
    pub partition: i32,
    pub watermark: crate::clock::Millis,
    pub idle: bool,
}

impl PartitionWatermarkChanged {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(
            partition = self.partition,
            watermark = self.watermark,
            idle = self.idle,
            "partition watermark"
        );
        let label = self.partition.to_string();
        match watermark_seconds(self.watermark) {
            Some(seconds) => m
                .partition_watermark
                .with_label_values(&[&label])
                .set(seconds),
            // Idle before its first watermark: still none, so no series.
            None => {
                let _ = m.partition_watermark.remove_label_values(&[&label]);
            }
        }
    }
}

/// The merged watermark over all input partitions moved.
pub struct MergedWatermarkChanged {
    pub watermark: crate::clock::Millis,
    pub now: crate::clock::Millis,
}

impl MergedWatermarkChanged {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(watermark = self.watermark, "merged watermark");
        match watermark_seconds(self.watermark) {
            Some(seconds) => m.watermark.set(seconds),
            None => m.watermark.clear(),
        }
        WatermarkLag {
            watermark: self.watermark,
            now: self.now,
        }
        .emit(m);
    }
}

/// How far the merged watermark is behind processing time, measured on every merge tick
/// (also while the watermark does not move, when the lag grows). Not logged: a gauge.
pub struct WatermarkLag {
    pub watermark: crate::clock::Millis,
    pub now: crate::clock::Millis,
}

impl WatermarkLag {
    pub fn emit(&self, m: &Metrics) {
        if self.watermark == crate::clock::Millis::MIN {
            m.watermark_lag.clear();
            return;
        }
        m.watermark_lag
            .set(self.now.saturating_sub(self.watermark).max(0) as f64 / 1000.0);
    }
}

/// A watermark (epoch ms) as Prometheus wants a timestamp: Unix seconds. The beginning of
/// time (`Millis::MIN`, "none yet") is no value at all, the end of time (the input ended)
/// `+Inf`.
fn watermark_seconds(watermark: crate::clock::Millis) -> Option<f64> {
    match watermark {
        crate::clock::Millis::MIN => None,
        crate::clock::END_OF_TIME => Some(f64::INFINITY),
        ms => Some(ms as f64 / 1000.0),
    }
}

/// An output whose event time is below its partition's published watermark.
pub struct LateOutput<'a> {
    pub key: &'a [u8],
    pub event_time: crate::clock::Millis,
    pub watermark: crate::clock::Millis,
}

impl LateOutput<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), event_time = self.event_time, watermark = self.watermark, "late output");
        m.late_outputs.inc();
    }
}

/// An output whose event time (its timestamp on the output topic) is older than the output
/// topic's `retention.ms`: written, but the broker deletes it at its next retention check.
/// Logged at WARN for a partition's first such output (`first`), counted always.
pub struct OutputPastRetention<'a> {
    pub partition: i32,
    pub key: &'a [u8],
    pub event_time: crate::clock::Millis,
    pub retention: std::time::Duration,
    pub first: bool,
}

impl OutputPastRetention<'_> {
    pub fn emit(&self, m: &Metrics) {
        if self.first {
            tracing::warn!(
                partition = self.partition,
                key = %KeyDisplay(self.key),
                event_time = self.event_time,
                retention_ms = self.retention.as_millis() as u64,
                "an output's event time is older than the output topic's retention.ms: the \
                 broker deletes it within minutes; keep such outputs with retention.ms=-1 (or \
                 longer than their age) on the output topic (docs/brokers.md, \"Retention and \
                 event time\"); further ones counted in watchbridge_outputs_past_retention_total"
            );
        }
        m.outputs_past_retention.inc();
    }
}

/// A partition's recovery began (it reads no input and polls nothing until it ends).
pub struct PartitionRecovering {
    pub partition: i32,
}

impl PartitionRecovering {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(
            partition = self.partition,
            "restoring the partition's state"
        );
        m.partitions_recovering.inc();
    }
}

/// The whole process stood still (no tick of the lease keeper) long enough to have lost its
/// group session: its partitions write nothing until the group confirms them.
pub struct InstanceStalled {
    pub stalled: std::time::Duration,
}

impl InstanceStalled {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            stalled_ms = self.stalled.as_millis() as u64,
            "this instance stood still long enough to lose its group session; its partitions \
             write nothing until the group confirms it still owns them"
        );
        m.instance_stalls.inc();
    }
}

/// This instance began or stopped writing the merged watermark record (`kafka::merged`).
pub struct MergedWriterChanged {
    pub writing: bool,
}

impl MergedWriterChanged {
    pub fn emit(&self, m: &Metrics) {
        if self.writing {
            tracing::info!(
                "this instance writes the merged watermark (input partition 0 restored here)"
            );
        } else {
            tracing::info!("this instance no longer writes the merged watermark (input partition 0 stopped here)");
        }
        m.merged_watermark_writer.set(i64::from(self.writing));
    }
}

/// A partition task gave up after a delivery whose outcome is unknown; the partition starts
/// again from its durable state.
pub struct PartitionRestarting<'a> {
    pub partition: i32,
    pub error: &'a str,
    /// Records that were in flight, waited for before the restart.
    pub in_flight: usize,
}

impl PartitionRestarting<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            partition = self.partition,
            error = self.error,
            records_waited_for = self.in_flight,
            "the partition starts again from its durable state: an output's delivery failed \
             and it may or may not be on the topic"
        );
        m.partition_restarts.inc();
    }
}

/// A partition's recovery could not read what it needs (`what` names the topic partitions
/// and the error: `kafka::recovery::Unreadable`); it tries again. The first failure of a
/// wait raises `watchbridge_partitions_recovery_waiting` and is logged at WARN; later ones
/// only when `log` says (the task logs them once a minute, not at every attempt).
pub struct RecoveryReadFailed<'a> {
    pub partition: i32,
    pub what: &'a str,
    /// Failed attempts of this wait so far, this one included.
    pub attempts: u32,
    pub waited: std::time::Duration,
    pub log: bool,
}

impl RecoveryReadFailed<'_> {
    pub fn emit(&self, m: &Metrics) {
        let (partition, what, attempts) = (self.partition, self.what, self.attempts);
        let waited_ms = self.waited.as_millis() as u64;
        if attempts == 1 {
            m.partitions_recovery_waiting.inc();
            tracing::warn!(
                partition,
                waiting_for = what,
                "the partition's recovery cannot read what it needs; it waits for it, trying \
                 again (the other partitions go on; /readyz names it)"
            );
        } else if self.log {
            tracing::warn!(
                partition,
                waiting_for = what,
                attempts,
                waited_ms,
                "the partition's recovery still waits"
            );
        } else {
            tracing::debug!(
                partition,
                waiting_for = what,
                attempts,
                "recovery read failed"
            );
        }
        m.recovery_read_failures
            .with_label_values(&[&partition.to_string()])
            .inc();
    }
}

/// How a wait of a partition's recovery ([`RecoveryReadFailed`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryWaitOutcome {
    /// What it waited for was read: the recovery goes on.
    Read,
    /// The partition was revoked (or the bridge stops) meanwhile.
    Abandoned,
    /// Past its limit (the watermark topic's end): it goes on without it.
    GaveUp,
}

/// A wait of a partition's recovery that had failed at least once is over.
pub struct RecoveryWaitEnded<'a> {
    pub partition: i32,
    pub what: &'a str,
    pub attempts: u32,
    pub waited: std::time::Duration,
    pub outcome: RecoveryWaitOutcome,
}

impl RecoveryWaitEnded<'_> {
    pub fn emit(&self, m: &Metrics) {
        let (partition, what, attempts) = (self.partition, self.what, self.attempts);
        let waited_ms = self.waited.as_millis() as u64;
        match self.outcome {
            RecoveryWaitOutcome::Read => tracing::info!(
                partition,
                attempts,
                waited_ms,
                "the partition's recovery reads again; restoring it"
            ),
            RecoveryWaitOutcome::Abandoned => {
                tracing::info!(
                    partition,
                    attempts,
                    waited_ms,
                    "the partition's recovery stopped waiting: revoked"
                )
            }
            RecoveryWaitOutcome::GaveUp => tracing::warn!(
                partition,
                waiting_for = what,
                attempts,
                waited_ms,
                "the end of the watermark topic could not be read within the transaction \
                 timeout; the partition goes on without its previous owner's last watermark \
                 (it may be published lower)"
            ),
        }
        m.partitions_recovery_waiting.dec();
    }
}

/// A partition's recovery was abandoned: it was revoked first.
pub struct PartitionRecoveryAbandoned {
    pub partition: i32,
}

impl PartitionRecoveryAbandoned {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            partition = self.partition,
            "partition revoked before its state was restored; nothing started"
        );
        m.partitions_recovering.dec();
    }
}

/// A partition's state was read back on assignment, before it polls or reads an input.
pub struct PartitionRecovered {
    pub partition: i32,
    pub watches: usize,
    pub finished: usize,
    pub state_records: u64,
    pub outputs_read: u64,
    /// Outputs of this partition's watches found past the last checkpoint.
    pub outputs_recovered: usize,
    /// Outputs in this partition's namesake without `wb-id` whose identity the poller
    /// could not read from their value: their watches may emit them again.
    pub outputs_unidentified: u64,
    pub undecodable: u64,
    pub took: std::time::Duration,
}

impl PartitionRecovered {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            partition = self.partition,
            watches = self.watches,
            finished = self.finished,
            state_records = self.state_records,
            outputs_read = self.outputs_read,
            outputs_recovered = self.outputs_recovered,
            undecodable = self.undecodable,
            took_ms = self.took.as_millis() as u64,
            "partition state restored"
        );
        if self.outputs_unidentified > 0 {
            tracing::warn!(
                partition = self.partition,
                outputs = self.outputs_unidentified,
                "outputs read back whose identity the poller could not read from their value \
                 (written by another poller's settings, or not by watchbridge): if they are \
                 this partition's, their watches emit them again"
            );
        }
        m.recovery_duration.observe(self.took.as_secs_f64());
        m.partitions_recovering.dec();
        m.outputs_recovered.inc_by(self.outputs_recovered as u64);
    }
}

/// An input whose watch already finished (within the retention): not started again.
pub struct InputForFinishedWatch<'a> {
    pub key: &'a [u8],
    pub partition: i32,
    pub offset: i64,
}

impl InputForFinishedWatch<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), partition = self.partition, offset = self.offset,
            "input for a watch that already finished; not started again (WATCHBRIDGE_FINISHED_RETENTION)");
        m.inputs_finished.inc();
    }
}

/// An operator ended a watch through the operations API (`POST /watches/{key}/stop`).
pub struct WatchStoppedByOperator<'a> {
    pub key: &'a [u8],
}

impl WatchStoppedByOperator<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(key = %KeyDisplay(self.key), "watch stopped by an operator (POST /watches/{{key}}/stop); it stays stopped within WATCHBRIDGE_FINISHED_RETENTION");
        m.control_actions.with_label_values(&["stop"]).inc();
    }
}

/// An operator asked for a watch's poll now (`POST /watches/{key}/poll`).
pub struct WatchPolledByOperator<'a> {
    pub key: &'a [u8],
}

impl WatchPolledByOperator<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(key = %KeyDisplay(self.key), "watch polled now at an operator's request (POST /watches/{{key}}/poll)");
        m.control_actions.with_label_values(&["poll"]).inc();
    }
}

/// The group's pause, given by an operator to any instance (`POST /pause`, `POST /resume`),
/// applied by this one from the control topic (at start too: it holds through restarts).
pub struct PollingPaused {
    pub paused: bool,
}

impl PollingPaused {
    pub fn emit(&self, m: &Metrics) {
        match self.paused {
            true => tracing::warn!("polling paused by an operator's order (POST /pause, kept on the control topic): no watch of the group polls until POST /resume"),
            false => tracing::info!("polling resumed by an operator's order (POST /resume)"),
        }
        m.polling_paused.set(i64::from(self.paused));
    }
}

/// An order an operator gave this instance's control API: `pause` or `resume` (of every
/// watch, or of `key`'s), `restart` or `reset` (of `key`'s watch, or of every failed one).
pub struct ControlAction<'a> {
    pub action: &'static str,
    pub key: Option<&'a [u8]>,
}

impl ControlAction<'_> {
    pub fn emit(&self, m: &Metrics) {
        match self.key {
            Some(key) => {
                tracing::warn!(action = self.action, key = %KeyDisplay(key), "an operator's order for one watch was given")
            }
            None => tracing::warn!(
                action = self.action,
                "an operator's order for the group was given"
            ),
        }
        m.control_actions.with_label_values(&[self.action]).inc();
    }
}

/// A control request of the operations API refused: no `WATCHBRIDGE_ADMIN_TOKEN`, or not
/// the request's.
pub struct ControlRefused<'a> {
    pub path: &'a str,
    pub why: &'static str,
}

impl ControlRefused<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            path = self.path,
            why = self.why,
            "operations API control request refused"
        );
        m.control_actions.with_label_values(&["refused"]).inc();
    }
}

/// An input the bridge's input filter says is not a watch (a library user's
/// `BridgeBuilder::skip_inputs`: a marker that only the watermark generator reads).
pub struct InputSkipped<'a> {
    pub key: &'a [u8],
    pub partition: i32,
    pub offset: i64,
}

impl InputSkipped<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::debug!(key = %KeyDisplay(self.key), partition = self.partition, offset = self.offset,
            "input skipped by the input filter: no watch started");
        m.inputs_skipped.inc();
    }
}

/// An input whose watch key (`WATCHBRIDGE_WATCH_KEY`) is not its record key: Kafka
/// partitions inputs by record key, and a watch is owned by its input's partition, so
/// inputs with this watch key may arrive on another partition too and start a second
/// watch there, which emits the same outputs. Logged once per partition task, counted
/// every time.
pub struct InputKeyedApart<'a> {
    pub watch_key: &'a [u8],
    pub record_key: Option<&'a [u8]>,
    pub partition: i32,
    /// Whether to log (the first in this partition task).
    pub first: bool,
}

impl InputKeyedApart<'_> {
    pub fn emit(&self, m: &Metrics) {
        if self.first {
            tracing::warn!(
                watch_key = %KeyDisplay(self.watch_key),
                record_key = %KeyDisplay(self.record_key.unwrap_or_default()),
                partition = self.partition,
                "an input's watch key (WATCHBRIDGE_WATCH_KEY) is not its record key: inputs \
                 with the same watch key on two input partitions start two watches, which \
                 emit the same outputs; key the input records by the watch key (logged once \
                 per partition; counted in watchbridge_inputs_keyed_apart_total)"
            );
        }
        m.inputs_keyed_apart.inc();
    }
}

/// An input the repartition stage wrote to the repartition topic (`kafka/repartition/`):
/// counted, not logged (one per input).
pub struct InputRepartitioned;

impl InputRepartitioned {
    pub fn emit(&self, m: &Metrics) {
        m.inputs_repartitioned.inc();
    }
}

/// An input whose watch failed (within the retention) came again: the watch starts again,
/// knowing the `seen` outputs it had found, and emits only what is new.
pub struct FailedWatchRestarted<'a> {
    pub key: &'a [u8],
    pub partition: i32,
    pub offset: i64,
    pub seen: usize,
}

impl FailedWatchRestarted<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(key = %KeyDisplay(self.key), partition = self.partition, offset = self.offset,
            seen = self.seen, "failed watch started again by its input; it emits only outputs it had not found");
        m.failed_watches_restarted.inc();
    }
}

/// The state topic acknowledged a record.
pub struct StateRecordWritten;

impl StateRecordWritten {
    pub fn emit(&self, m: &Metrics) {
        m.state_records_written.inc();
    }
}

/// A transaction of the exactly-once mode committed: what it carried is visible now.
pub struct TransactionCommitted {
    pub took: Duration,
}

impl TransactionCommitted {
    pub fn emit(&self, m: &Metrics) {
        m.transactions.with_label_values(&["committed"]).inc();
        m.transaction_commit_duration
            .observe(self.took.as_secs_f64());
    }
}

/// A transaction of the exactly-once mode was aborted: nothing it carried becomes visible,
/// and the partition starts again from its last committed transaction.
pub struct TransactionAborted<'a> {
    pub partition: i32,
    pub error: &'a str,
}

impl TransactionAborted<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            partition = self.partition,
            error = self.error,
            "transaction aborted; the partition restarts from its last committed transaction"
        );
        m.transactions.with_label_values(&["aborted"]).inc();
    }
}

/// Another producer with this partition's `transactional.id` started: another instance
/// owns the partition now, and this one writes nothing more for it.
pub struct TransactionFenced<'a> {
    pub partition: i32,
    pub error: &'a str,
}

impl TransactionFenced<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::error!(
            partition = self.partition,
            error = self.error,
            "fenced: another instance took this partition over (or the broker aborted the \
             transaction for its timeout); its writes here were rejected, and the partition \
             starts again with a new producer unless the group takes it from this instance"
        );
        m.transactions.with_label_values(&["fenced"]).inc();
    }
}

/// A partition that ended for a fencing or a failed delivery waits before it starts again
/// (`kafka::delayed_restart`).
pub struct RestartDelayed {
    pub partition: i32,
    pub reason: DelayReason,
    pub wait: Duration,
}

/// Why a partition waits before it starts (`kafka::delayed_restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayReason {
    /// Its producer was fenced: for the group to say whether it is still this instance's.
    Fenced,
    /// Its delivery failed: for the record to settle before the read-back.
    FailedDelivery,
    /// The group assigned it while records sent for it (by this instance before, or by its
    /// previous owner) may still commit.
    Settling,
    /// The brokers refused it a write or a read (an ACL missing): a backoff.
    Refused,
    /// Its transactions aborted more than once in a row: a backoff.
    Aborted,
    /// Its state holds records of a newer format version than this build reads
    /// (`state::versions`): a backoff.
    NewerState,
}

impl RestartDelayed {
    pub fn emit(&self, m: &Metrics) {
        let wait_ms = self.wait.as_millis() as u64;
        let partition = self.partition;
        match self.reason {
            DelayReason::Fenced => tracing::warn!(
                partition,
                wait_ms,
                "the partition's producer was fenced; unless the group takes the partition \
                 from this instance meanwhile (then another instance owns it), it starts again \
                 with a new producer (the broker aborted its transaction for its timeout, \
                 transaction.timeout.ms: a stall, or a commit that waited long)"
            ),
            DelayReason::FailedDelivery => tracing::warn!(
                partition,
                wait_ms,
                "a delivery failed; the partition starts again once its record has settled on \
                 the brokers (committed or dropped), so that the read-back sees whether it is \
                 there (replica.lag.time.max.ms + broker.session.timeout.ms)"
            ),
            DelayReason::Settling => tracing::info!(
                partition,
                wait_ms,
                "the partition was assigned while records sent for it before (by this instance \
                 or its previous owner) may still commit; it starts once they have settled, so \
                 that the read-back sees them"
            ),
            DelayReason::Aborted => tracing::error!(
                partition,
                wait_ms,
                "the partition's transactions abort again and again (the errors above say why: \
                 a topic the authorizer refuses to the transaction is one cause, docs/brokers.md \
                 \"Least privilege\"); nothing was dead-lettered or given up; it tries \
                 again after this backoff"
            ),
            DelayReason::Refused => tracing::error!(
                partition,
                wait_ms,
                "the brokers refused the partition a write or a read (an ACL missing: the \
                 error above names the topic, group or transactional id); nothing was \
                 dead-lettered or given up (its watch still owes it); it tries again after this \
                 backoff (docs/brokers.md, \"Least privilege\")"
            ),
            DelayReason::NewerState => tracing::warn!(
                partition,
                wait_ms,
                "the partition reads its state again after this backoff (a record of a newer \
                 state format: the error above)"
            ),
        }
        let reason = match self.reason {
            DelayReason::Fenced => "fenced",
            DelayReason::FailedDelivery => "failed_delivery",
            DelayReason::Settling => "settling",
            DelayReason::Refused => "refused",
            DelayReason::Aborted => "aborted",
            DelayReason::NewerState => "newer_state",
        };
        m.partition_restarts_delayed
            .with_label_values(&[reason])
            .inc();
    }
}

/// A wait for the watermark topic's reader to pass a previous owner's records (a
/// takeover's floor, the merged writer's first record: `kafka::merged::ReadBackWait`) that
/// took long: while it waits, still waiting, read at last, or given up.
pub struct WatermarkReadBack {
    pub waiter: crate::not_ready::WatermarkWaiter,
    /// The offset the reader has read to, and the topic's end it waits for.
    pub read_to: i64,
    pub end: i64,
    pub waited: Duration,
    pub outcome: ReadBackOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBackOutcome {
    Waiting,
    Read,
    /// Past its limit: it goes on without the previous owner's last value.
    GaveUp,
}

impl WatermarkReadBack {
    pub fn emit(&self, _: &Metrics) {
        let (waiter, read_to, end) = (self.waiter.to_string(), self.read_to, self.end);
        let waited_ms = self.waited.as_millis() as u64;
        match self.outcome {
            ReadBackOutcome::Waiting => tracing::warn!(
                waiter,
                read_to,
                end,
                waited_ms,
                "waiting to read the watermark topic to its end before publishing: the previous \
                 owner's last value may be behind a transaction open on it (it ends within its \
                 timeout), or the topic cannot be read"
            ),
            ReadBackOutcome::Read => tracing::info!(
                waiter,
                waited_ms,
                "the watermark topic is read to its end; publishing from the previous owner's \
                 last value"
            ),
            ReadBackOutcome::GaveUp => tracing::warn!(
                waiter,
                read_to,
                end,
                waited_ms,
                "the watermark topic was not read to its end within the transaction timeout; \
                 publishing without the previous owner's last value (it may be published lower)"
            ),
        }
    }
}

/// The input consumer met an error other than a lost connection: an ACL missing on the
/// input topic or the group, a batch it cannot decode. Counted each time; logged when
/// `log` (the caller logs a lasting error once every [`ConsumerFailed::LOG_EVERY`]), and
/// `/readyz` says so until the consumer reads again.
pub struct ConsumerFailed<'a> {
    pub error: &'a rdkafka::error::KafkaError,
    /// The brokers refused it (authentication or authorization: `kafka::refusal`).
    pub refused: bool,
    pub topic: &'a str,
    pub group: &'a str,
    pub log: bool,
}

impl ConsumerFailed<'_> {
    pub const LOG_EVERY: Duration = Duration::from_secs(30);

    pub fn emit(&self, m: &Metrics) {
        let code = self.error.rdkafka_error_code();
        if self.log {
            if self.refused {
                tracing::error!(
                    error = %self.error,
                    topic = self.topic,
                    group = self.group,
                    "the brokers refused the input consumer (an ACL missing: READ and DESCRIBE \
                     on topic `{}`, READ on group `{}`; docs/brokers.md, \"Least privilege\"); \
                     nothing is read or committed until it is granted",
                    self.topic,
                    self.group
                );
            } else {
                tracing::error!(
                    error = %self.error,
                    "the input consumer cannot read; nothing is committed past it, and /readyz \
                     says not ready until it reads again"
                );
            }
        }
        let label = code.map_or_else(|| "other".to_string(), |c| format!("{c:?}"));
        m.consumer_errors.with_label_values(&[&label]).inc();
    }
}

/// `/readyz` changed its answer (see `readiness.rs` for the rule).
pub struct ReadinessChanged {
    /// `None`: ready.
    pub not_ready: Option<crate::not_ready::NotReady>,
}

impl ReadinessChanged {
    pub fn emit(&self, m: &Metrics) {
        match &self.not_ready {
            None => {
                tracing::info!("ready: partitions assigned and their state restored");
                m.ready.set(1);
            }
            Some(reason) => {
                tracing::info!(reason = %reason, "not ready");
                m.ready.set(0);
            }
        }
    }
}

/// librdkafka's periodic statistics (`statistics.interval.ms`) of the bridge's producer or
/// its group consumer.
pub enum KafkaStatistics<'a> {
    /// Records in one producer's queue, waiting to be delivered, and what that producer
    /// reported before (`watchbridge_producer_queue_messages` is the sum over the bridge's
    /// producers: one per partition task and the shared one).
    Producer { queued_messages: u64, before: u64 },
    /// Consumer lag of each assigned input partition librdkafka knows it for.
    Consumer { lag: &'a [(i32, i64)] },
}

impl KafkaStatistics<'_> {
    pub fn emit(&self, m: &Metrics) {
        match self {
            KafkaStatistics::Producer {
                queued_messages,
                before,
            } => {
                tracing::trace!(queued_messages, "producer statistics");
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                m.producer_queue_messages
                    .add(count(*queued_messages) - count(*before));
            }
            KafkaStatistics::Consumer { lag } => {
                tracing::trace!(?lag, "consumer statistics");
                for (partition, lag) in lag.iter() {
                    m.consumer_lag
                        .with_label_values(&[&partition.to_string()])
                        .set(*lag);
                }
            }
        }
    }
}

/// How a try of the start's wait for the brokers is reported: the first failed try and
/// then one every [`WaitingForBrokers::REMIND_EVERY`] at warn, the others at debug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReport {
    First,
    Reminder,
    Quiet,
}

/// A try of the start to reach the brokers failed; it tries again (with backoff) until
/// `WATCHBRIDGE_START_TIMEOUT`.
pub struct WaitingForBrokers<'a> {
    pub brokers: &'a str,
    pub error: &'a str,
    pub waited: Duration,
    pub timeout: Duration,
    pub tries: u32,
    pub report: WaitReport,
}

impl WaitingForBrokers<'_> {
    /// How often a start that keeps waiting says so.
    pub const REMIND_EVERY: Duration = Duration::from_secs(30);

    pub fn emit(&self, m: &Metrics) {
        let give_up_in =
            humantime::format_duration(round_s(self.timeout.saturating_sub(self.waited)));
        let waited = humantime::format_duration(round_s(self.waited));
        match self.report {
            WaitReport::First => tracing::warn!(
                brokers = self.brokers,
                error = self.error,
                give_up_in = %give_up_in,
                "waiting for the brokers to answer (WATCHBRIDGE_BROKERS); trying again with \
                 backoff until WATCHBRIDGE_START_TIMEOUT"
            ),
            WaitReport::Reminder => tracing::warn!(
                brokers = self.brokers,
                error = self.error,
                waited = %waited,
                tries = self.tries,
                give_up_in = %give_up_in,
                "still waiting for the brokers to answer (WATCHBRIDGE_BROKERS)"
            ),
            WaitReport::Quiet => tracing::debug!(
                brokers = self.brokers,
                error = self.error,
                tries = self.tries,
                "the brokers did not answer yet"
            ),
        }
        m.brokers_reachable.set(0);
    }
}

/// The start reached the brokers (after waiting for them when `tries` > 1).
pub struct BrokersAnswered<'a> {
    pub brokers: &'a str,
    pub waited: Duration,
    pub tries: u32,
}

impl BrokersAnswered<'_> {
    pub fn emit(&self, m: &Metrics) {
        if self.tries > 1 {
            tracing::info!(
                brokers = self.brokers,
                waited = %humantime::format_duration(round_s(self.waited)),
                tries = self.tries,
                "brokers answered; starting"
            );
        }
        m.brokers_reachable.set(1);
    }
}

/// Every broker became unreachable while the bridge ran (librdkafka's `AllBrokersDown`,
/// confirmed by a metadata request that failed too). Reported once per outage, however
/// many clients librdkafka reports it for, and how often.
pub struct BrokersUnreachable<'a> {
    pub brokers: &'a str,
    pub error: &'a str,
}

impl BrokersUnreachable<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::warn!(
            brokers = self.brokers,
            error = self.error,
            "every broker is unreachable: records wait in the producer's queue and nothing is \
             committed until one answers again (its connection errors are logged at debug \
             meanwhile)"
        );
        m.broker_outages.inc();
        m.brokers_reachable.set(0);
    }
}

/// A broker answered again after an outage.
pub struct BrokersReachable<'a> {
    pub brokers: &'a str,
    pub down_for: Duration,
}

impl BrokersReachable<'_> {
    pub fn emit(&self, m: &Metrics) {
        tracing::info!(
            brokers = self.brokers,
            down_for = %humantime::format_duration(round_s(self.down_for)),
            "brokers reachable again"
        );
        m.brokers_reachable.set(1);
    }
}

/// A stop (SIGTERM, Ctrl-C) could not deliver or commit everything within
/// `WATCHBRIDGE_SHUTDOWN_TIMEOUT` and ended anyway. Nothing is lost: a record not
/// delivered was never checkpointed (its watch emits it again), and an input not committed
/// is read again, when the partition is next assigned.
pub struct StopGaveUp<'a> {
    pub took: Duration,
    pub timeout: Duration,
    /// Records not acknowledged, in all (that are known: see `uncounted`).
    pub not_delivered: u64,
    /// Partitions that did not finish stopping, whose records are not counted above (each
    /// partition's own producer in the exactly-once mode).
    pub uncounted: usize,
    /// Input partitions whose inputs are not all committed (from the offset given, where
    /// known); `None`: not known (the consumer did not stop in time).
    pub not_committed: Option<&'a [(i32, Option<i64>)]>,
    /// Why, in a few words (e.g. "every broker is unreachable").
    pub cause: &'a str,
}

impl StopGaveUp<'_> {
    pub fn emit(&self, _m: &Metrics) {
        let not_committed = match self.not_committed {
            None => "unknown (everything since the last commit)".to_string(),
            Some([]) => "none".to_string(),
            Some(partitions) => partitions
                .iter()
                .map(|(p, o)| match o {
                    Some(o) => format!("partition {p} (from offset {o})"),
                    None => format!("partition {p} (since its last commit)"),
                })
                .collect::<Vec<_>>()
                .join(", "),
        };
        let not_delivered = if self.uncounted > 0 {
            format!(
                "{} record(s) not delivered, besides those of {} partition(s) that did not \
                 finish stopping",
                self.not_delivered, self.uncounted
            )
        } else {
            format!("{} record(s) not delivered", self.not_delivered)
        };
        tracing::error!(
            took = %humantime::format_duration(round_ms(self.took)),
            timeout = %humantime::format_duration(self.timeout),
            not_delivered = self.not_delivered,
            not_committed = %not_committed,
            cause = self.cause,
            "the stop gave up at WATCHBRIDGE_SHUTDOWN_TIMEOUT: {not_delivered}; inputs not \
             committed: {not_committed}. Nothing is lost: what was not delivered was never \
             checkpointed, so its watch emits it again, and uncommitted inputs are read again, \
             when the partitions are next assigned"
        );
    }
}

fn round_s(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

//! The partition's durable state: its recovery on assignment and its checkpoints (the
//! bookkeeping is [`DurableState`]'s, the reads [`recovery`]'s).

use super::*;
use crate::internal_events::{RecoveryReadFailed, RecoveryWaitEnded, RecoveryWaitOutcome};
use crate::kafka::merged::ReadBackWait;
use crate::kafka::recovery::Unreadable;
use crate::metrics::Metrics;
use crate::readiness::WatermarkWaiter;
use crate::state::NewerState;

impl<P: Resolve> PartitionTask<P> {
    /// Read the partition's state back and restore its watches (retrying while the broker
    /// cannot be read). In the exactly-once mode the partition's transactional producer has
    /// started already (`producer.rs`): that fenced the previous owner and aborted what it
    /// left open, so the state read back is final. Fails with `Done` if the partition was
    /// revoked meanwhile.
    pub(super) async fn recover(&mut self) -> Result<(), transaction::Ending> {
        let started = std::time::Instant::now();
        // One wait for the settling and the read: reported once as it begins (and as what
        // it waits for changes), once as it ends.
        let mut wait = self.recovery_wait();
        if self.shared.state.recovery.settle_outputs {
            self.settle_outputs(&mut wait).await?;
        }
        let found = {
            let source = self.shared.state.recovery.clone();
            let partition = self.partition;
            match retry_read(wait, &self.inputs, None, move || {
                recovery::read(&source, partition)
            })
            .await
            {
                Some(found) => found,
                None => return Err(transaction::Ending::Done),
            }
        };
        let newer = NewerState::of(
            &self.shared.state.recovery.state_topic,
            self.partition,
            &found.newer,
        );
        if let Some(newer) = newer {
            // Before anything is written, read or started: the newer records stay as they
            // are (compaction keeps them), and so does the partition's input.
            tracing::error!(partition = self.partition, "{newer}");
            // Not ready until then: the consumer's wait keeps this (`consumer.rs`).
            self.shared.readiness.recovery_waits(
                self.partition,
                Some(&newer.waiting_for()),
                &self.shared.metrics,
            );
            return Err(transaction::Ending::NewerState);
        }
        let watermark_end = match found.watermark_unread {
            // The end could not be looked up: asked again, as long as a wait for the reader
            // may last (the watermark topic's one partition may be offline).
            Some(_) => {
                let (lookups, topic) = (
                    self.shared.state.recovery.lookups.clone(),
                    self.shared.state.recovery.watermark_topic.clone(),
                );
                let (wait, limit) = (self.recovery_wait(), self.shared.watermarks.read_back_limit);
                retry_read(wait, &self.inputs, Some(limit), move || {
                    lookups.watermark_end(&topic)
                })
                .await
            }
            None => found.watermark_end,
        };
        if let Some(end) = watermark_end {
            // The floor must be the previous owner's last value before this partition
            // publishes one or judges an output, or its watermark could go back. `end` is
            // the topic's high watermark: the value can be behind a transaction another
            // partition's owner has open on the topic (`merged::ReadBackWait`).
            let (read, shared) = (&self.shared.watermarks.read_upto, &self.shared);
            let mut wait = ReadBackWait::new(
                WatermarkWaiter::Partition(self.partition),
                end,
                shared.watermarks.read_back_limit,
                shared.readiness.clone(),
                shared.metrics.clone(),
            );
            while !wait.passed(read.load(std::sync::atomic::Ordering::SeqCst))
                && !self.inputs.is_closed()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if self.inputs.is_closed() {
            // Revoked while reading: the partition is someone else's now; start nothing.
            return Err(transaction::Ending::Done);
        }
        self.take_over_watermark();
        let mode = self.shared.state.guarantee;
        if let Some(last) = found.mode.as_deref().filter(|m| *m != mode.to_string()) {
            tracing::warn!(
                partition = self.partition,
                last_mode = last,
                mode = %mode,
                "the partition was last written by an instance of another \
                 WATCHBRIDGE_GUARANTEE; going on in this instance's"
            );
        }
        let (state_records, outputs_read, undecodable, outputs_unidentified) = (
            found.state_records,
            found.outputs_read,
            found.undecodable,
            found.unidentified,
        );
        self.recovery_input_end = found.input_end;
        let outputs_found: usize = found.outputs.values().map(Vec::len).sum();
        let finished = found.finished.len();
        let plan = recovery::plan(
            found,
            self.shared.poller.as_ref(),
            self.shared.state.recovery.state_topic.clone(),
            self.partition,
            millis_of(self.shared.state.finished_retention),
            self.shared.clock.now_ms(),
        );
        self.durable = plan.state;
        if self.recovery_input_end.is_none() {
            self.forget_preseen();
        }
        let mut writes = self.durable.tombstones(plan.tombstones);
        if plan.first_time {
            // Before any output: a later recovery reads the output topic back from here.
            writes.push(self.durable.offsets_record());
        }
        // Last: the partition's mode stays among its last records (see `with_mode`).
        writes.push(self.durable.mode_record(&mode.to_string()));
        self.send_state(writes).await;
        let watches = plan.restores.len();
        for restore in plan.restores {
            self.starting.push_back(Starting::Recovered {
                hold: restore.progress.hold,
            });
            if !self.send_command(Command::Restore(Box::new(restore))).await {
                break;
            }
        }
        // Its input is read from now on: the idle timeout runs from here, not from the
        // assignment (a recovery can take longer than the timeout).
        self.watermark.start_reading(self.shared.clock.now_ms());
        PartitionRecovered {
            partition: self.partition,
            watches,
            finished,
            state_records,
            outputs_read,
            outputs_recovered: outputs_found,
            outputs_unidentified,
            undecodable,
            took: started.elapsed(),
        }
        .emit(&self.shared.metrics);
        Ok(())
    }

    /// A wait of this partition's recovery, reported as [`RecoveryWait`] says.
    pub(super) fn recovery_wait(&self) -> RecoveryWait {
        RecoveryWait::new(
            self.partition,
            self.shared.readiness.clone(),
            self.shared.metrics.clone(),
        )
    }

    /// Write what changed since the last checkpoint, unless the last one is still in flight
    /// (`last`: the partition is being given up, write all progress). In the exactly-once
    /// mode the checkpoint commits the transaction: once every record sent since the last
    /// one is acknowledged (so the checkpoint covers every output), its state records go
    /// in, then the input position, then the commit.
    pub(super) async fn checkpoint(&mut self, last: bool) -> Result<(), transaction::Failure> {
        // What a burst of outputs or inputs grew, given back once the burst is over.
        self.deliveries.release_idle_capacity();
        if self.starting.is_empty() {
            self.starting = VecDeque::new();
        }
        if self.txn.is_none() {
            if self.checkpoint_in_flight == 0 {
                let writes = self
                    .durable
                    .checkpoint_records(self.shared.clock.now_ms(), last);
                let writes = self.with_mode(writes);
                self.send_state(writes).await;
            }
            return Ok(());
        }
        let started = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + self.shared.stop_timeout;
        self.settle_transaction(deadline).await?;
        // A broken transaction gets no checkpoint: it cannot commit (below, it fails).
        if self.txn.as_ref().is_none_or(|t| t.broken.is_none()) {
            let writes = self
                .durable
                .checkpoint_records(self.shared.clock.now_ms(), last);
            let writes = self.with_mode(writes);
            self.send_state(writes).await;
            self.settle_transaction(deadline).await?;
        }
        let position = self.tracker.to_commit();
        let metrics = self.shared.metrics.clone();
        if let Some(txn) = self.txn.as_mut() {
            txn.commit(position, &metrics, started).await?;
            if let (Some(position), Ok(mut positions)) =
                (txn.committed, self.shared.transaction_positions.lock())
            {
                positions.insert(self.partition, position);
            }
        }
        Ok(())
    }

    /// Exactly-once mode: wait until every record of the open transaction is acknowledged
    /// (or has failed, which breaks the transaction), at most until `deadline`.
    async fn settle_transaction(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<(), transaction::Failure> {
        if self.deliver_all(deadline).await {
            return Ok(());
        }
        let txn = self
            .txn
            .as_ref()
            .expect("only the exactly-once mode settles");
        Err(txn.failure(
            "records of the transaction were not acknowledged within WATCHBRIDGE_SHUTDOWN_TIMEOUT",
        ))
    }

    /// A checkpoint's `writes` with the partition's `~mode` record after them, if there are
    /// any: so that the mode is among the last few records of every partition an instance
    /// writes, where a starting instance reads it without reading the whole partition
    /// (`kafka/group_mode.rs`). One record of ~20 bytes per checkpoint that writes.
    fn with_mode(&self, mut writes: Vec<StateWrite>) -> Vec<StateWrite> {
        if !writes.is_empty() {
            let mode = self.shared.state.guarantee.to_string();
            writes.push(self.durable.mode_record(&mode));
        }
        writes
    }

    pub(super) async fn send_state(&mut self, writes: Vec<StateWrite>) {
        for write in writes {
            if self.lost.is_set() {
                // Not this instance's partition any more: its state is the new owner's.
                return;
            }
            if write.offsets && self.txn.is_none() && self.checkpoint_in_flight > 0 {
                // Produced once the records it vouches for are acknowledged (`on_delivery`).
                self.offsets_waiting = Some(write);
                continue;
            }
            let StateWrite { record, origin, .. } = write;
            let Some(record) = record else {
                self.tracker.acknowledged_all(&origin);
                continue;
            };
            self.checkpoint_in_flight += 1;
            self.send(Pending {
                record,
                origin,
                attempt: 1,
                kind: Kind::State,
            })
            .await;
        }
    }
}

/// Run `read` on a blocking thread until it succeeds, waiting with backoff between attempts
/// and reporting the wait (`wait`: log, metric, `/readyz`); `None` if the partition is
/// revoked meanwhile (or the bridge stops: `inputs` closed), or once `limit` has passed.
/// (Not a method: `&self` across the waits would make the task's future need `Sync`.)
async fn retry_read<T: Send + 'static>(
    mut wait: RecoveryWait,
    inputs: &mpsc::Receiver<Feed>,
    limit: Option<Duration>,
    read: impl Fn() -> Result<T, Unreadable> + Send + Clone + 'static,
) -> Option<T> {
    loop {
        let error = match tokio::task::spawn_blocking(read.clone()).await {
            Ok(Ok(read)) => {
                wait.over(RecoveryWaitOutcome::Read);
                return Some(read);
            }
            Ok(Err(e)) => e,
            Err(e) => Unreadable {
                partitions: Vec::new(),
                error: format!("the recovery failed: {e}"),
            },
        };
        let backoff = wait.failed(&error);
        if limit.is_some_and(|limit| wait.waited() + backoff > limit) {
            wait.over(RecoveryWaitOutcome::GaveUp);
            return None;
        }
        if !sleep_unless_closed(inputs, backoff).await {
            wait.over(RecoveryWaitOutcome::Abandoned);
            return None;
        }
    }
}

/// Sleep for `d`, or less if `inputs` closes meanwhile (the partition revoked, or the bridge
/// stopping): whether it is still open.
pub(super) async fn sleep_unless_closed(inputs: &mpsc::Receiver<Feed>, d: Duration) -> bool {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until && !inputs.is_closed() {
        tokio::time::sleep_until(until.min(tokio::time::Instant::now() + REVOKED_CHECK)).await;
    }
    !inputs.is_closed()
}

/// The first wait between a recovery's failed read and the next attempt; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// How often a wait looks whether the partition was revoked.
const REVOKED_CHECK: Duration = Duration::from_millis(200);
/// A wait that goes on is logged again this often (every attempt is counted).
const LOG_EVERY: Duration = Duration::from_secs(60);

/// One wait of a partition's recovery for something it cannot read: each failed attempt is
/// counted (`watchbridge_recovery_read_failures_total`), the first logged at WARN and the
/// later ones once a [`LOG_EVERY`]; `/readyz` names what it waits for; its end is logged
/// (and the partition leaves `watchbridge_partitions_recovery_waiting`), also when the wait
/// is dropped unfinished.
pub(super) struct RecoveryWait {
    partition: i32,
    readiness: Arc<crate::readiness::Readiness>,
    metrics: Arc<Metrics>,
    since: std::time::Instant,
    attempts: u32,
    /// What the last failure named, and when the wait was last logged.
    what: String,
    logged: std::time::Instant,
    over: bool,
}

impl RecoveryWait {
    fn new(
        partition: i32,
        readiness: Arc<crate::readiness::Readiness>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let now = std::time::Instant::now();
        Self {
            partition,
            readiness,
            metrics,
            since: now,
            attempts: 0,
            what: String::new(),
            logged: now,
            over: false,
        }
    }

    fn waited(&self) -> Duration {
        self.since.elapsed()
    }

    /// An attempt failed with `error`: reported; the backoff before the next.
    pub(super) fn failed(&mut self, error: &Unreadable) -> Duration {
        self.attempts += 1;
        let what = error.to_string();
        let changed = what != self.what;
        let log = changed || self.logged.elapsed() >= LOG_EVERY;
        if log {
            self.logged = std::time::Instant::now();
        }
        if changed {
            self.readiness
                .recovery_waits(self.partition, Some(&what), &self.metrics);
            self.what = what;
        }
        RecoveryReadFailed {
            partition: self.partition,
            what: &self.what,
            attempts: self.attempts,
            waited: self.waited(),
            log,
        }
        .emit(&self.metrics);
        let doublings = self.attempts.saturating_sub(1).min(8);
        (RETRY_FIRST * 2u32.pow(doublings)).min(RETRY_MAX)
    }

    /// The wait is over: reported if it had failed at all.
    pub(super) fn over(&mut self, outcome: RecoveryWaitOutcome) {
        if std::mem::replace(&mut self.over, true) || self.attempts == 0 {
            return;
        }
        self.readiness
            .recovery_waits(self.partition, None, &self.metrics);
        RecoveryWaitEnded {
            partition: self.partition,
            what: &self.what,
            attempts: self.attempts,
            waited: self.waited(),
            outcome,
        }
        .emit(&self.metrics);
    }
}

impl Drop for RecoveryWait {
    /// A wait left unfinished (the task ended meanwhile) is no reason not to be ready.
    fn drop(&mut self) {
        self.over(RecoveryWaitOutcome::Abandoned);
    }
}

fn millis_of(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

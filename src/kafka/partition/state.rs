//! The partition's durable state: its recovery on assignment and its checkpoints (the
//! bookkeeping is [`DurableState`]'s, the reads [`recovery`]'s).

use super::*;
use crate::kafka::merged::ReadBackWait;
use crate::readiness::WatermarkWaiter;

impl<P: Resolve> PartitionTask<P> {
    /// Read the partition's state back and restore its watches (retrying while the broker
    /// cannot be read). In the exactly-once mode the partition's transactional producer has
    /// started already (`producer.rs`): that fenced the previous owner and aborted what it
    /// left open, so the state read back is final. Fails with `Done` if the partition was
    /// revoked meanwhile.
    pub(super) async fn recover(&mut self) -> Result<(), transaction::Ending> {
        let started = std::time::Instant::now();
        let found = loop {
            let source = self.shared.state.recovery.clone();
            let partition = self.partition;
            match tokio::task::spawn_blocking(move || recovery::read(&source, partition)).await {
                Ok(Ok(found)) => break found,
                Ok(Err(e)) => {
                    tracing::error!(partition, error = %e, "cannot recover the partition's state; trying again")
                }
                Err(e) => {
                    tracing::error!(partition, error = %e, "the recovery failed; trying again")
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            // A closed input channel: revoked, or the bridge is stopping.
            if self.inputs.is_closed() {
                return Err(transaction::Ending::Done);
            }
        };
        if let Some(end) = found.watermark_end {
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

fn millis_of(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

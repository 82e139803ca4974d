//! Settling the output partitions before the read-back (without transactions, on a cluster
//! of several brokers).
//!
//! The read-back finds which outputs the previous task (this instance's, or a dead owner's)
//! wrote after its last checkpoint, reading each output partition up to its high watermark.
//! A record the leader appended but the in-sync replicas do not all have yet sits above the
//! high watermark, invisible, and commits later: the read-back misses it and its output is
//! emitted again, a duplicate. How long it may sit there has no bound a timer can wait out:
//! while the partition has fewer in-sync replicas than `min.insync.replicas` (a follower
//! paused, another catching up), Kafka 4 holds the high watermark (KIP-966) until one of
//! them has the record (seen on three nodes: a failed delivery during one node's pause,
//! another node paused 2 s later, the record committed after the read-back of the 14 s wait;
//! `kafka::delayed_restart` waits out the single faults).
//!
//! The watermark topic likewise: the partition's floor is the last value the previous owner
//! put there, and a value that commits after the floor was read makes the next task's
//! watermarks go back below it (seen on three nodes: a topic record 1.2 s above the three
//! after it, long chaos seed 6).
//!
//! So the task first writes a record of its own, a `watchbridge-control: settle` record,
//! to each output partition it reads back and to the watermark topic, and waits until each
//! is acknowledged (`acks=all`):
//! the high watermark is then past it, so every record the leader appended before it is
//! committed and the read-back sees it; one the leader did not keep is gone for good (a
//! leader that lost its leadership truncates what it appended alone). What is left: a
//! request the previous owner sent that the leader reads off its socket only after the
//! settle record (both waiting on a paused leader that was not fenced meanwhile).

use super::state::{sleep_unless_closed, RecoveryWait};
use super::*;
use crate::internal_events::RecoveryWaitOutcome;
use crate::kafka::produce::send_and_wait;
use crate::kafka::recovery::Unreadable;

/// How long a settle record may wait for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(10);

impl<P: Resolve> PartitionTask<P> {
    /// Write a settle record to each output partition the read-back reads (and the
    /// watermark topic) and wait until each is acknowledged, trying again while it fails:
    /// reported as part of the recovery's `wait` (log, metric, `/readyz`), which the read
    /// goes on with. `Done` if the partition is given up meanwhile.
    pub(super) async fn settle_outputs(
        &mut self,
        wait: &mut RecoveryWait,
    ) -> Result<(), transaction::Ending> {
        let source = &self.shared.state.recovery;
        // The output partitions it reads back, and the watermark topic's one partition,
        // whose last value is the partition's floor.
        let mut left: Vec<(Arc<str>, i32)> = recovery::outputs_read_back(source, self.partition)
            .into_iter()
            .map(|p| (source.output_topic.clone(), p))
            .chain([(source.watermark_topic.clone(), 0)])
            .collect();
        while !left.is_empty() {
            let sends = left.iter().map(|(topic, p)| {
                let record = OutRecord::settle(topic, *p, &self.shared.input_topic, self.partition);
                let producer = &self.producer;
                async move {
                    (
                        (topic.clone(), *p),
                        send_and_wait(producer, &record, QUEUE_WAIT).await,
                    )
                }
            });
            let mut failed = Vec::new();
            let mut error = String::new();
            for (target, outcome) in futures::future::join_all(sends).await {
                if let Err(e) = outcome {
                    failed.push(target);
                    error = format!("cannot settle the partitions before the read-back: {e}");
                }
            }
            if failed.is_empty() {
                break;
            }
            let partitions = failed.iter().map(|(t, p)| (t.to_string(), *p)).collect();
            left = failed;
            let backoff = wait.failed(&Unreadable { partitions, error });
            if !sleep_unless_closed(&self.inputs, backoff).await {
                wait.over(RecoveryWaitOutcome::Abandoned);
                return Err(transaction::Ending::Done);
            }
        }
        Ok(())
    }
}

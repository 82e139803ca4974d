//! The partition's own producer. Every task writes through a producer of its own: in the
//! exactly-once mode a transactional one (`transaction.rs`), in the other modes an
//! idempotent one with the same settings as the bridge's shared producer
//! ([`ProducerSettings`]). Its own, so that what it still holds when the task is given up
//! can be thrown away without touching another partition's records: librdkafka purges a
//! whole producer or nothing (issue 46, case 3: a revoked task that gave up waiting left its
//! outputs and state records in the shared producer's queue, and they landed after the
//! partition's next owner had restored it and emitted them again).
//!
//! What it costs: a librdkafka client per partition the instance owns: its main thread, its
//! internal broker thread, a thread per broker of the cluster and rdkafka's polling thread,
//! 3 + brokers threads (6 on a three-node cluster: measured with librdkafka 2.12, an instance
//! in `recovery` owning 4 partitions ran 67 threads, owning 2 ran 55; the bootstrap entries'
//! threads go once the brokers are known), and its connections to the brokers. Its queue
//! (`queue.buffering.max.messages`) is per partition too. Made when the task starts, before
//! the state read, as the transactional one always was: creating one spawns its
//! threads and returns; its producer id comes while the recovery reads.

use super::transaction::{Ending, Transaction};
use super::*;
use rdkafka::producer::{Producer, PurgeConfig};
use std::time::Instant;

/// The first wait before a new producer after one that went fatal soon after it was made.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest such wait.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// A producer that went fatal sooner than this after it was made counts as failing at once.
const FRESH: Duration = Duration::from_secs(60);

/// What a task writes through, made as it starts.
pub(super) struct OwnProducer {
    pub(super) producer: BridgeProducer,
    /// In the exactly-once mode, the producer's transactions.
    pub(super) txn: Option<Transaction>,
    /// When it was made ([`ProducerRestarts::went_fatal`]).
    pub(super) made: Instant,
}

impl OwnProducer {
    /// Make the partition's producer: transactional in the exactly-once mode (which fences
    /// the previous owner's), else idempotent, after the wait [`ProducerRestarts`] says (its
    /// last one went fatal). `Err` if the partition is given up meanwhile (`inputs`
    /// closed: revoked, or the bridge is stopping) or the producer cannot be made.
    pub(super) async fn open<P: Resolve>(
        shared: &Shared<P>,
        partition: i32,
        inputs: &mpsc::Receiver<Feed>,
    ) -> Result<OwnProducer, Ending> {
        let made = Instant::now();
        if let Some(settings) = &shared.transactions {
            let txn = Transaction::start(settings, shared.input_topic.clone(), partition, || {
                inputs.is_closed()
            })
            .await;
            return match txn {
                Ok(txn) => Ok(OwnProducer {
                    producer: txn.producer.clone(),
                    txn: Some(txn),
                    made,
                }),
                Err(_) if inputs.is_closed() => Err(Ending::Done),
                Err(failure) => Err(failure.ending()),
            };
        }
        let wait = shared.producer_restarts.wait(partition);
        if !wait.is_zero() {
            tracing::warn!(
                partition,
                wait = %humantime::format_duration(wait),
                "the partition's last producer met a fatal error soon after it was made; \
                 waiting before making another"
            );
            let until = tokio::time::Instant::now() + wait;
            while tokio::time::Instant::now() < until {
                if inputs.is_closed() {
                    return Err(Ending::Done);
                }
                tokio::time::sleep_until(
                    until.min(tokio::time::Instant::now() + Duration::from_millis(100)),
                )
                .await;
            }
        }
        match shared.producer.create(None) {
            Ok(producer) => Ok(OwnProducer {
                producer,
                txn: None,
                made: Instant::now(),
            }),
            Err(e) => {
                tracing::error!(partition, error = %e, "cannot create the partition's producer");
                shared.producer_restarts.went_fatal(partition, made);
                Err(Ending::Restart)
            }
        }
    }
}

impl<P: Resolve> PartitionTask<P> {
    /// Throw away what the partition's producer still holds, as the task ends: its queue,
    /// and its requests in flight, whose answers it no longer waits for nor retries. A task
    /// ends with records pending only when it is given up (its stop ran past
    /// `WATCHBRIDGE_SHUTDOWN_TIMEOUT`, the partition was lost, it restarts), and nothing it
    /// handed over may reach a topic once the partition's next owner has started: that owner
    /// restores from what reached the topics and emits the rest again (a duplicate when the
    /// old copy lands too), and a stale state record of this task landing after the owner's
    /// brings finished watches back and loses seen hashes.
    ///
    /// - A queued record was never sent: purged, it never lands.
    /// - A request in flight to a leader that has been deposed (why it goes unanswered: a
    ///   stalled or cut-off node, whose leadership moved after `broker.session.timeout.ms`)
    ///   cannot commit: with `acks=all` and `min.insync.replicas=2` a record commits only once
    ///   another in-sync replica has fetched it, the followers fetch from the new leader, the
    ///   controller refuses the old one's ISR changes (a stale leader epoch), and once the
    ///   old leader learns it is deposed it truncates its log to the new leader's. What made
    ///   such records land was librdkafka sending them again to the new leader (same
    ///   producer id and sequence numbers: accepted); purged, they are not sent again.
    /// - Where the guarantee stops: a purge stops this client, not the broker. A record the
    ///   leader has already appended and a follower fetched can still commit after the purge
    ///   (above the high watermark when the next owner read back: issue 46, case 4), and so
    ///   can a request in flight to a leader that is alive but slow. A fatal producer has
    ///   failed what it held already.
    pub(super) fn purge_producer(&self) {
        let pending = self.deliveries.len();
        if pending > 0 {
            tracing::warn!(
                partition = self.partition,
                records = pending,
                "the partition is given up with records not acknowledged; they are purged from \
                 its producer, so that none lands after its next owner starts"
            );
        }
        self.producer
            .purge(PurgeConfig::default().queue().inflight());
    }

    /// Whether the partition's producer met a fatal error (outside the exactly-once mode,
    /// whose transactions decide): it can write nothing more, and the partition restarts
    /// with a new one ([`Ending::Restart`]).
    pub(super) fn producer_fatal(&self) -> bool {
        self.txn.is_none() && self.producer.client().fatal_error().is_some()
    }
}

/// How long each partition waits before it makes a new idempotent producer: not at all,
/// unless its last one met a fatal error soon after it was made (a fresh producer that goes
/// fatal at once would otherwise restart the partition in a tight loop). The wait doubles
/// from `FIRST_WAIT` up to `MAX_WAIT` while each new producer fails within `FRESH` (the
/// constants above);
/// one that lived longer restarts at once.
#[derive(Default)]
pub struct ProducerRestarts {
    waits: Mutex<HashMap<i32, Duration>>,
}

impl ProducerRestarts {
    /// The producer of `partition` made at `made` met a fatal error (or could not be made).
    pub(super) fn went_fatal(&self, partition: i32, made: Instant) {
        let mut waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        let wait = waits.entry(partition).or_default();
        *wait = if made.elapsed() < FRESH {
            (*wait * 2).clamp(FIRST_WAIT, MAX_WAIT)
        } else {
            Duration::ZERO
        };
    }

    /// How long the next producer of `partition` waits before it is made.
    fn wait(&self, partition: i32) -> Duration {
        let waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        waits.get(&partition).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task waiting for deliveries is woken when its partition is lost, also when it
    /// began waiting before (or after) the flag was set.
    #[tokio::test]
    async fn a_lost_partition_wakes_its_waiting_task() {
        let lost = Arc::new(Lost::default());
        let waiting = tokio::spawn({
            let lost = lost.clone();
            async move { lost.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        lost.set();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), lost.wait())
            .await
            .expect("already lost: at once");
    }

    #[test]
    fn a_producer_that_goes_fatal_at_once_waits_longer_each_time() {
        let restarts = ProducerRestarts::default();
        assert_eq!(restarts.wait(3), Duration::ZERO, "never fatal: no wait");
        let now = Instant::now();
        let waits: Vec<Duration> = (0..8)
            .map(|_| {
                restarts.went_fatal(3, now);
                restarts.wait(3)
            })
            .collect();
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(restarts.wait(4), Duration::ZERO, "per partition");
        if let Some(long_ago) = now.checked_sub(FRESH + Duration::from_secs(1)) {
            restarts.went_fatal(3, long_ago);
            assert_eq!(restarts.wait(3), Duration::ZERO, "it had lived: at once");
        }
    }
}

//! The exactly-once mode (`WATCHBRIDGE_GUARANTEE=exactly_once`): the partition's own
//! transactional producer, and the checkpoint as a transaction commit.
//!
//! Everything the task writes between two checkpoints (outputs, dead letters, watermark
//! records, then the checkpoint's state records) goes into one transaction, committed with
//! the input position (`send_offsets_to_transaction`) once every record in it is
//! acknowledged. So a `read_committed` reader (the consumers of the output topic, the next
//! owner's recovery) sees all of it or none of it, and the input offsets move with it.
//!
//! The `transactional.id` is derived from the group, the input topic and the partition, so
//! the partition's next owner (after a rebalance, a crash, or while this instance is
//! stalled) calls `init_transactions` with the same id: the broker aborts whatever this
//! producer left open and rejects everything it sends from then on (fenced). That is how
//! Kafka Streams closes the zombie window (its first exactly-once design, a producer per
//! input partition). The offsets go with group metadata without a generation, so fencing
//! rests on the `transactional.id` alone and a rebalance that does not move the partition
//! does not abort its transaction.
//!
//! A failure aborts the transaction and ends the task with [`Ending::Restart`]: the
//! engine's seen sets include outputs that were never committed, so the task cannot go on;
//! the consumer thread starts the partition again from its last committed position, and
//! the new task recovers from the state topic like any new owner. Being fenced ends it with
//! [`Ending::Fenced`]: the partition is someone else's, or its transaction outlived
//! `transaction.timeout.ms` and the broker aborted it; the consumer thread tells the two
//! apart by what the group says (`kafka::fenced`). A refusal by the brokers' authorizer (an
//! ACL missing on a topic, the group or the transactional id) ends it with
//! [`Ending::Refused`]: nothing of the transaction is visible, nothing is dead-lettered, and
//! the partition starts again after a backoff (`kafka::delayed_restart`), until the ACL is
//! granted.

use super::*;
use crate::internal_events::{TransactionAborted, TransactionCommitted, TransactionFenced};
use crate::kafka::refusal;
use crate::kafka::stats::ProducerSettings;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

/// How long `init_transactions`, `send_offsets_to_transaction` and `commit_transaction` may
/// block (the first waits for a previous owner's open transaction to be aborted).
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What the partition tasks need to run transactions.
#[derive(Clone)]
pub struct TransactionSettings {
    /// The producers' settings (the bridge's, with idempotence, and the transaction
    /// timeouts); the `transactional.id` is added per partition.
    pub producer: ProducerSettings,
    /// `watchbridge-<group>-<input topic>`; the partition number is appended.
    pub id_prefix: String,
    /// The input group, for `send_offsets_to_transaction`.
    pub group: Arc<ConsumerGroupMetadata>,
}

/// Why a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Revoked, stopping, or (bounded) done.
    Done,
    /// Start the partition again from its durable state and its last committed input
    /// position: a transaction was aborted, or (without transactions) an output's delivery
    /// failed and it may or may not be on the topic.
    Restart,
    /// The producer was fenced: another instance owns the partition now, or the broker
    /// aborted a transaction that outlived its timeout (`kafka::fenced` waits to know).
    Fenced,
    /// The brokers refused a write or a read (an ACL missing, `kafka::refusal`): start
    /// again after a backoff, nothing dead-lettered nor given up.
    Refused,
    /// The recovery found state records of a newer format version than this build reads
    /// (`state::versions`): nothing was started, read, committed or written; start again
    /// after a backoff, by when an instance that reads them may own the partition.
    NewerState,
}

/// A transaction that could not be committed.
pub(super) enum Failure {
    /// Aborted (or abandoned): the partition must start again from its last commit.
    Aborted(String),
    /// This producer was fenced by the partition's next owner.
    Fenced(String),
    /// The brokers' authorizer refused something the transaction needs.
    Refused(String),
}

impl Failure {
    pub(super) fn ending(&self) -> Ending {
        match self {
            Failure::Aborted(_) => Ending::Restart,
            Failure::Fenced(_) => Ending::Fenced,
            Failure::Refused(_) => Ending::Refused,
        }
    }

    /// `Fenced` once librdkafka has raised a fatal error for `producer`.
    fn fatal(producer: &BridgeProducer) -> Option<Failure> {
        let (code, reason) = producer.client().fatal_error()?;
        Some(Failure::Fenced(format!("{reason} ({code:?})")))
    }

    /// What `error` means for the partition, given the state of `producer`: once librdkafka
    /// has raised a fatal error (fenced, above all) every later error is a consequence of
    /// it (records purged from the queue, say), and the producer is done for.
    /// A refusal first: librdkafka makes a refused transactional id fatal, and it is not a
    /// fencing.
    fn of(error: KafkaError, producer: &BridgeProducer) -> Failure {
        let fatal_code = producer.client().fatal_error().map(|(code, _)| code);
        if error
            .rdkafka_error_code()
            .into_iter()
            .chain(fatal_code)
            .any(refusal::is_refusal)
        {
            return Failure::Refused(error.to_string());
        }
        if let Some(fatal) = Failure::fatal(producer) {
            return fatal;
        }
        let fatal = match &error {
            KafkaError::Transaction(e) => e.is_fatal(),
            _ => false,
        };
        let fenced = fatal
            || matches!(
                error.rdkafka_error_code(),
                Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
            );
        if fenced {
            Failure::Fenced(error.to_string())
        } else {
            Failure::Aborted(error.to_string())
        }
    }
}

/// The partition's transactional producer and its open transaction.
pub(super) struct Transaction {
    pub(super) producer: BridgeProducer,
    group: Arc<ConsumerGroupMetadata>,
    input_topic: Arc<str>,
    partition: i32,
    open: bool,
    /// The first failure reported for a record of the open transaction: it cannot commit.
    pub(super) broken: Option<KafkaError>,
    /// The input position of the last committed transaction.
    pub(super) committed: Option<i64>,
}

impl Transaction {
    /// Create the partition's producer and fence every earlier one with its id (waits for
    /// the broker to abort what a previous owner left open). Retried while the broker
    /// cannot be reached, until `give_up` says the partition is no longer wanted.
    pub(super) async fn start(
        settings: &TransactionSettings,
        input_topic: Arc<str>,
        partition: i32,
        give_up: impl Fn() -> bool,
    ) -> Result<Transaction, Failure> {
        let id = format!("{}-{partition}", settings.id_prefix);
        loop {
            let producer = settings
                .producer
                .create(Some(&id))
                .map_err(|e| Failure::Aborted(format!("cannot create the producer: {e}")))?;
            let init = producer.clone();
            let result = blocking(move || init.init_transactions(TRANSACTION_TIMEOUT)).await;
            match result {
                Ok(()) => {
                    tracing::info!(partition, transactional_id = %id, "transactional producer ready; earlier producers of this partition are fenced");
                    return Ok(Transaction {
                        producer,
                        group: settings.group.clone(),
                        input_topic,
                        partition,
                        open: false,
                        broken: None,
                        committed: None,
                    });
                }
                Err(e) => {
                    let error = e.to_string();
                    match Failure::of(e, &producer) {
                        // Not again at once: the partition waits out its backoff.
                        refused @ Failure::Refused(_) => {
                            tracing::error!(
                                partition,
                                transactional_id = %id,
                                error,
                                "the brokers' authorizer refused WRITE on transactional id `{id}`: \
                                 grant the principal WRITE on the transactional ids prefixed \
                                 `{}` (docs/brokers.md, \"Least privilege\"); the partition tries \
                                 again after a backoff",
                                settings
                                    .id_prefix
                                    .strip_suffix(&*input_topic)
                                    .unwrap_or(&settings.id_prefix)
                            );
                            return Err(refused);
                        }
                        failure => {
                            tracing::error!(partition, transactional_id = %id, error, "cannot initialise the transactional producer; trying again");
                            if matches!(failure, Failure::Fenced(_)) {
                                return Err(Failure::Aborted(
                                    "the transactional producer could not be initialised".into(),
                                ));
                            }
                        }
                    }
                    if give_up() {
                        return Err(Failure::Aborted(
                            "the transactional producer could not be initialised".into(),
                        ));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    if give_up() {
                        return Err(Failure::Aborted("given up".into()));
                    }
                }
            }
        }
    }

    /// The failure `reason` stands for: fenced if the producer has met a fatal error.
    pub(super) fn failure(&self, reason: &str) -> Failure {
        Failure::fatal(&self.producer).unwrap_or_else(|| Failure::Aborted(reason.into()))
    }

    /// Open a transaction if none is: before the first record of a checkpoint interval.
    pub(super) fn begin(&mut self) {
        if self.open {
            return;
        }
        match self.producer.begin_transaction() {
            Ok(()) => self.open = true,
            Err(e) => {
                self.broken.get_or_insert(e);
            }
        }
    }

    /// Commit the open transaction with the input `position` (if it moved).
    pub(super) async fn commit(
        &mut self,
        position: Option<i64>,
        metrics: &Metrics,
        started: std::time::Instant,
    ) -> Result<(), Failure> {
        if let Some(error) = self.broken.take() {
            return Err(Failure::of(error, &self.producer));
        }
        if position.is_some() {
            self.begin();
        }
        if !self.open {
            return Ok(());
        }
        let producer = self.producer.clone();
        let group = self.group.clone();
        let mut offsets = TopicPartitionList::new();
        if let Some(position) = position {
            offsets
                .add_partition_offset(&self.input_topic, self.partition, Offset::Offset(position))
                .map_err(|e| Failure::Aborted(e.to_string()))?;
        }
        let result = blocking(move || {
            if offsets.count() > 0 {
                producer.send_offsets_to_transaction(&offsets, &group, TRANSACTION_TIMEOUT)?;
            }
            producer.commit_transaction(TRANSACTION_TIMEOUT)
        })
        .await;
        self.open = false;
        result.map_err(|e| Failure::of(e, &self.producer))?;
        if position.is_some() {
            self.committed = position;
        }
        TransactionCommitted {
            took: started.elapsed(),
        }
        .emit(metrics);
        Ok(())
    }

    /// Give up the open transaction: its records never become visible. (A fenced producer
    /// cannot abort; the broker did it already.)
    pub(super) async fn abort(&mut self, failure: &Failure, metrics: &Metrics) {
        match failure {
            Failure::Fenced(error) => TransactionFenced {
                partition: self.partition,
                error,
            }
            .emit(metrics),
            Failure::Aborted(error) | Failure::Refused(error) => {
                TransactionAborted {
                    partition: self.partition,
                    error,
                }
                .emit(metrics);
                let producer = self.producer.clone();
                if let Err(e) =
                    blocking(move || producer.abort_transaction(TRANSACTION_TIMEOUT)).await
                {
                    tracing::warn!(partition = self.partition, error = %e, "abort failed; the broker aborts the transaction when the partition's producer starts again or when it times out");
                }
            }
        }
        self.open = false;
    }
}

/// librdkafka's transactional calls block: run them off the async workers.
pub(crate) async fn blocking(
    call: impl FnOnce() -> Result<(), KafkaError> + Send + 'static,
) -> Result<(), KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

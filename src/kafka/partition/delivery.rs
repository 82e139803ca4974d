//! Handing records to the producer and what their delivery reports do: acknowledgements
//! move the commit position and the durable state. A failed output is never sent again
//! as a new record (the failed one may be on the topic after all: a duplicate): one the
//! broker refused for good goes to the dead-letter topic, any other failure (and any
//! failure once the partition's producer met a fatal error) starts the partition again from
//! its durable state (`PartitionTask::abandon`), with a new producer. State records are
//! retried until delivered (a retried chunk is harmless: the checkpoint's offsets record,
//! which vouches for it, waits for its acknowledgement), dead letters with backoff;
//! a watermark is published again at the next tick (a retried one could land after a later
//! one).

use super::*;
use crate::kafka::durable::SendTicket;
use crate::kafka::produce::Sender;
use crate::kafka::refusal;
use crate::kafka::reports::{Outcome, Report, Route, Undelivered};

/// Attempts to deliver one record before it goes to the dead-letter topic instead.
const DELIVERY_ATTEMPTS: u32 = 5;

/// A record on its way to the broker, and the input offset whose commit waits for it
/// (`None` for records no input's commit waits for: outputs, which the state topic and the
/// recovery's read-back account for, and watermarks).
pub(super) struct Pending {
    pub(super) record: OutRecord,
    pub(super) origin: Origins,
    pub(super) attempt: u32,
    pub(super) kind: Kind,
}

pub(super) enum Kind {
    /// A new output, whose key hashes to `hash`; its ticket names its watch.
    Output {
        hash: OutputHash,
        ticket: SendTicket,
    },
    /// A state-topic record: retried until delivered, never dead-lettered.
    State,
    DeadLetter,
    /// A watermark record; on the watermark topic without transactions, the number of its
    /// publication, whose in-band copies wait for it (`watermarks.rs`).
    Watermark {
        on_topic: Option<u64>,
    },
}

pub(super) enum Delivery {
    /// Delivered to (partition, offset), or failed.
    Done(Sent, Outcome),
    RetryDue(Pending),
}

/// What a record's slot keeps from its hand-over to its report. An output's record is not
/// kept: an output is never sent again, and the dead letter of one the broker refused is
/// made of the record librdkafka gives back with the report. So an output in flight holds
/// none of its bytes here, nor a reference to them, and its slot is small (outputs are
/// nearly every record). Other records are kept, to be sent again.
pub(super) struct Sent {
    pub(super) kept: Option<Box<OutRecord>>,
    pub(super) origin: Origins,
    pub(super) attempt: u32,
    pub(super) kind: Kind,
}

impl Sent {
    fn of(pending: Pending) -> Self {
        let Pending {
            record,
            origin,
            attempt,
            kind,
        } = pending;
        let kept = match kind {
            Kind::Output { .. } => None,
            _ => Some(Box::new(record)),
        };
        Self {
            kept,
            origin,
            attempt,
            kind,
        }
    }

    /// The record to send again (`attempt` now): every kind but an output's, kept.
    fn again(self, attempt: u32) -> Option<Pending> {
        Some(Pending {
            record: *self.kept?,
            origin: self.origin,
            attempt,
            kind: self.kind,
        })
    }
}

/// The records this task handed to the producer whose reports have not come back, and
/// those waiting to be sent again. A record's token (`reports.rs`) names its slot here; the
/// reports come back through the task's route in batches.
pub(super) struct Deliveries {
    route: Route,
    sender: Sender,
    slots: Vec<Option<Sent>>,
    free: Vec<u32>,
    in_flight: usize,
    /// Reports taken from the route, and how many of them were handled.
    batch: Vec<Report>,
    handled: usize,
    /// Records to send again once their backoff has passed (rare: dead letters, state
    /// records after a failure).
    retries: FuturesUnordered<BoxFuture<'static, Pending>>,
}

impl Deliveries {
    /// Reports of what is sent through `producer` come back here.
    pub(super) fn new(producer: &BridgeProducer) -> Self {
        Self {
            route: Route::open(producer),
            sender: Sender::new(producer),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            batch: Vec::new(),
            handled: 0,
            retries: FuturesUnordered::new(),
        }
    }

    /// Records sent and not reported yet, and records waiting to be sent again.
    pub(super) fn len(&self) -> usize {
        self.in_flight + self.retries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hand `pending` to the producer; refused (its queue full, say), it comes back (by
    /// value: it is sent again).
    #[allow(clippy::result_large_err)]
    fn send(&mut self, pending: Pending) -> Result<(), (KafkaError, Pending)> {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            (self.slots.len() - 1) as u32
        });
        let token = self.route.token(slot);
        match self.sender.send(&pending.record, token) {
            Ok(()) => {
                self.slots[slot as usize] = Some(Sent::of(pending));
                self.in_flight += 1;
                Ok(())
            }
            Err(e) => {
                self.free.push(slot);
                Err((e, pending))
            }
        }
    }

    /// Give back what a burst made the buffers grow to, once it is over (nothing in
    /// flight, every report handled). Called at each checkpoint: a busy partition keeps
    /// its buffers, an idle one holds none (up to a producer queue of records, a few hundred
    /// bytes each, on every partition an instance owns).
    pub(super) fn release_idle_capacity(&mut self) {
        if self.in_flight == 0 {
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        if self.handled == self.batch.len() {
            self.batch = Vec::new();
            self.handled = 0;
        }
    }

    /// Heap bytes held by the buffers (slots, free list, reports taken).
    #[cfg(test)]
    fn buffer_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Sent>>()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + self.batch.capacity() * std::mem::size_of::<Report>()
    }

    /// Send `pending` again once `after` has passed.
    fn retry(&mut self, after: Duration, pending: Pending) {
        self.retries.push(
            async move {
                tokio::time::sleep(after).await;
                pending
            }
            .boxed(),
        );
    }

    /// The next report already taken from the route, without waiting: the rest of the
    /// batch that [`next`](Self::next) began, handled in one go.
    pub(super) fn ready(&mut self) -> Option<Delivery> {
        while let Some(&(slot, _)) = self.batch.get(self.handled) {
            let outcome = std::mem::replace(&mut self.batch[self.handled].1, Ok((0, 0)));
            self.handled += 1;
            if let Some(sent) = self.slots.get_mut(slot as usize).and_then(Option::take) {
                self.free.push(slot);
                self.in_flight -= 1;
                return Some(Delivery::Done(sent, outcome));
            }
        }
        None
    }

    /// The next report, or a retry that is due; `None` once nothing is pending.
    /// Cancel-safe (what was taken from the route stays in `batch`).
    pub(super) async fn next(&mut self) -> Option<Delivery> {
        loop {
            if let Some(done) = self.ready() {
                return Some(done);
            }
            self.batch.clear();
            self.handled = 0;
            if self.is_empty() {
                return None;
            }
            tokio::select! {
                biased;
                n = self.route.recv_many(&mut self.batch, 4096), if self.in_flight > 0 => {
                    if n == 0 {
                        return None;
                    }
                }
                Some(pending) = self.retries.next(), if !self.retries.is_empty() => {
                    return Some(Delivery::RetryDue(pending));
                }
            }
        }
    }
}

impl<P: Resolve> PartitionTask<P> {
    /// Handle deliveries until none is pending or `deadline`.
    pub(super) async fn drain_deliveries(&mut self, deadline: tokio::time::Instant) {
        if !self.deliver_all(deadline).await {
            // Pending: outputs, state and watermark records, dead letters (and the inputs
            // whose commit waits for some of them).
            tracing::warn!(
                partition = self.partition,
                pending_deliveries = self.deliveries.len(),
                inputs_waiting = self.tracker.in_flight(),
                "stopping before every record was acknowledged; inputs waiting for them stay \
                 uncommitted, and the partition's next owner recovers the rest from the \
                 state and output topics"
            );
        }
    }

    /// Handle deliveries until none is pending (true) or `deadline` (false). Not once the
    /// partition is lost (false at once): it is another instance's, and what this task
    /// still has in flight is to be purged, not waited for.
    pub(super) async fn deliver_all(&mut self, deadline: tokio::time::Instant) -> bool {
        let lost = self.lost.clone();
        while !self.deliveries.is_empty() {
            let delivery = tokio::select! {
                delivery = tokio::time::timeout_at(deadline, self.deliveries.next()) => delivery,
                () = lost.wait() => return false,
            };
            match delivery {
                Ok(Some(delivery)) => self.on_delivery(delivery).await,
                Ok(None) => break,
                Err(_) => return false,
            }
            self.publish_position();
        }
        true
    }

    /// Hand a record to the producer. While its queue is full, wait for deliveries to make
    /// room (and read no input meanwhile: that is the backpressure).
    pub(super) async fn send(&mut self, pending: Pending) {
        if let Some(waiting) = self.send_now(pending) {
            self.send_waiting(waiting).await;
        }
    }

    /// [`Self::send`] without waiting, the usual case: `None` when the record went to the
    /// producer (or failed for good, or this task writes nothing more), the record back
    /// when it must wait (the producer's queue is full, or the lease is not confirmed).
    /// Not async, so that the outputs of a poll go out without building a future, and
    /// moving the record into it, per record.
    pub(super) fn send_now(&mut self, pending: Pending) -> Option<Pending> {
        if self.abandoned.is_some() || self.lost.is_set() {
            // Nothing more from this task: its successor starts from the topics.
            return None;
        }
        if !self.shared.lease.may_write() {
            return Some(pending);
        }
        if let Some(txn) = self.txn.as_mut() {
            txn.begin();
        }
        match self.deliveries.send(pending) {
            Ok(()) => None,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), refused)) => {
                Some(refused)
            }
            Err((error, refused)) => {
                let failure = Undelivered {
                    error,
                    record: Some(Box::new(refused.record.parts())),
                };
                self.delivery_failed(Sent::of(refused), failure);
                None
            }
        }
    }

    /// The rest of [`Self::send`] for a record [`Self::send_now`] gave back: wait until
    /// the lease allows writing, then for room in the producer's queue (handling the
    /// reports that make it), and send. Given up once the partition is lost: its producer
    /// may be stuck on a broker that does not answer, and the task must get to its purge.
    pub(super) async fn send_waiting(&mut self, pending: Pending) {
        let mut pending = pending;
        let lost = self.lost.clone();
        loop {
            if !may_write(self.shared.lease.clone(), lost.clone()).await {
                return;
            }
            match self.send_now(pending) {
                None => return,
                Some(refused) => pending = refused,
            }
            let delivery = tokio::select! {
                delivery = self.deliveries.next() => delivery,
                () = lost.wait() => return,
            };
            match delivery {
                Some(delivery) => Box::pin(self.on_delivery(delivery)).await,
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    pub(super) async fn on_delivery(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Done(sent, Ok((partition, offset))) => {
                match &sent.kind {
                    Kind::Output { hash, ticket } => {
                        self.produced += 1;
                        self.durable
                            .output_acknowledged(*ticket, *hash, partition, offset);
                    }
                    Kind::State => {
                        StateRecordWritten.emit(&self.shared.metrics);
                        self.checkpoint_in_flight -= 1;
                        if self.checkpoint_in_flight == 0 {
                            // The checkpoint's chunks and records are on the topic: now
                            // its offsets record may vouch for them.
                            if let Some(offsets) = self.offsets_waiting.take() {
                                self.send_state(vec![offsets]).await;
                            }
                        }
                    }
                    Kind::Watermark {
                        on_topic: Some(seq),
                    } => {
                        let seq = *seq;
                        Box::pin(self.watermark_on_topic(seq)).await;
                    }
                    Kind::DeadLetter | Kind::Watermark { .. } => {}
                }
                self.tracker.acknowledged_all(&sent.origin);
            }
            Delivery::Done(sent, Err(failure)) => self.delivery_failed(sent, failure),
            Delivery::RetryDue(pending) => self.send(pending).await,
        }
    }

    /// What a failed delivery leads to ([`after_failure`]), logged and counted once; then
    /// that: abort the transaction, restart the partition, publish the watermark again,
    /// retry with backoff, or dead-letter the record (a dead letter that cannot be delivered
    /// either is logged, counted and given up).
    pub(super) fn delivery_failed(&mut self, sent: Sent, failure: Undelivered) {
        let Undelivered { error, record } = failure;
        let then = if self.producer_fatal() {
            // Nothing more can be sent through it: not a record retried, nor a dead letter.
            AfterProduceFailure::RestartPartition
        } else {
            after_failure(&sent.kind, sent.attempt, &error, self.txn.is_some())
        };
        let topic = sent
            .kept
            .as_ref()
            .map_or(self.shared.output_topic.clone(), |r| r.topic.clone());
        ProduceFailed {
            topic: &topic,
            error: &error.to_string(),
            attempt: sent.attempt,
            then,
            refused: error
                .rdkafka_error_code()
                .is_some_and(refusal::is_authorization),
        }
        .emit(&self.shared.metrics, &failure_label(&error));
        match then {
            AfterProduceFailure::AbortTransaction => {
                if let Some(txn) = self.txn.as_mut() {
                    txn.broken.get_or_insert(error);
                }
                if matches!(sent.kind, Kind::State) {
                    self.checkpoint_in_flight -= 1;
                }
                return;
            }
            AfterProduceFailure::RestartPartition => {
                self.abandoned.get_or_insert(error);
                return;
            }
            AfterProduceFailure::PublishAgain => {
                if let Kind::Watermark {
                    on_topic: Some(seq),
                } = sent.kind
                {
                    self.in_band.failed(seq);
                }
                self.watermark.republish();
                return;
            }
            AfterProduceFailure::Retry => {
                let wait = Duration::from_millis(200 << sent.attempt.min(6));
                let attempt = sent.attempt + 1;
                if let Some(again) = sent.again(attempt) {
                    self.deliveries.retry(wait, again);
                }
                return;
            }
            AfterProduceFailure::DeadLetter => {}
        }
        let parts = match (&sent.kind, sent.kept) {
            (Kind::DeadLetter, Some(kept)) if is_too_large(&error) && kept.value.is_some() => {
                // A dead letter carries the refused record's value, so a record refused for
                // its size (by the producer's `message.max.bytes`, or a topic's
                // `max.message.bytes` no larger on the dead-letter topic) has a dead letter
                // refused the same way: send it without the value, so that the reason and
                // the record's key and headers are not lost with it.
                tracing::warn!(
                    error = %error,
                    bytes = kept.value.as_ref().map_or(0, |v| v.len()),
                    "a dead letter is too large; sending it without its value"
                );
                let dead_letter = Pending {
                    record: kept.without_value(),
                    origin: sent.origin,
                    attempt: 1,
                    kind: Kind::DeadLetter,
                };
                self.deliveries.retry(Duration::ZERO, dead_letter);
                return;
            }
            (Kind::DeadLetter, _) => {
                tracing::error!(error = %error, "a dead letter could not be delivered either; it is lost");
                self.tracker.acknowledged_all(&sent.origin);
                return;
            }
            // Not on the output topic, so not in the watch's saved seen set: a restored
            // watch would emit it again. Its dead letter is made of the record the report
            // gave back (the task kept none).
            (Kind::Output { ticket, .. }, _) => {
                self.durable.output_given_up(*ticket);
                record.map(|parts| *parts).unwrap_or_default()
            }
            // Never dead-lettered (`after_failure`).
            (Kind::State | Kind::Watermark { .. }, _) => return,
        };
        let record = OutRecord::dead_letter(
            &self.shared.dlq_topic,
            &parts,
            Source {
                topic: &topic,
                partition: -1,
                offset: -1,
            },
            "undeliverable",
            &error.to_string(),
        );
        // The dead letter takes the failed record's place in the commit accounting.
        let dead_letter = Pending {
            record,
            origin: sent.origin,
            attempt: 1,
            kind: Kind::DeadLetter,
        };
        self.deliveries.retry(Duration::ZERO, dead_letter);
    }
}

/// What a failed delivery of a record of `kind`, sent for the `attempt`th time, leads to.
/// - In a transaction a failed record cannot be sent again (and once the producer is
///   fenced, nothing can): the transaction is aborted at its commit, and the partition
///   starts again from its last one.
/// - An output that may or may not be on the topic (anything but a refusal for good) is not
///   sent again as a new record (a duplicate if it landed): the partition starts again from
///   its durable state. One refused for good goes to the dead-letter topic at once.
/// - A watermark is not sent again either: it could land after a later, higher value. The
///   partition's state is published again at the next tick (never below this one).
/// - A state record is never given up: a watch whose record is lost could not be restored.
///   (Its checkpoint stays in flight, so no later one overtakes it.)
/// - A dead letter is retried with backoff, up to [`DELIVERY_ATTEMPTS`].
/// - A refusal of the principal (an ACL missing: `kafka::refusal`), whatever the record:
///   the partition starts again after a backoff, its watch still owing it, nothing
///   dead-lettered (the dead-letter topic may be refused too) or given up.
fn after_failure(
    kind: &Kind,
    attempt: u32,
    error: &KafkaError,
    in_transaction: bool,
) -> AfterProduceFailure {
    use AfterProduceFailure::*;
    if in_transaction {
        return AbortTransaction;
    }
    if error.rdkafka_error_code().is_some_and(refusal::is_refusal) {
        return RestartPartition;
    }
    match kind {
        Kind::Output { .. } if refused_for_good(error) => DeadLetter,
        Kind::Output { .. } => RestartPartition,
        Kind::Watermark { .. } => PublishAgain,
        Kind::State => Retry,
        Kind::DeadLetter if attempt >= DELIVERY_ATTEMPTS => DeadLetter,
        Kind::DeadLetter => Retry,
    }
}

/// Whether a task may still write: not once its partition is another instance's (`lost`);
/// while the instance's lease is in doubt (after a stall), wait until the group confirms it
/// or the partition is lost. (Not a method: `&self` across the waits would make the task's
/// future need `Sync`.)
async fn may_write(lease: Arc<crate::kafka::lease::Lease>, lost: Arc<Lost>) -> bool {
    loop {
        if lost.is_set() {
            return false;
        }
        if lease.may_write() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the broker (or librdkafka, before sending) refused the record itself, so that it
/// is certainly not on the topic and never will be, however often it is sent: too large, or
/// invalid, or against a policy. Any other failure (a timeout, a lost connection, a broker
/// error) may have left it written. Not a refusal of the principal (an ACL): that is about
/// the bridge's rights, not the record, and passes once the ACL is granted.
fn refused_for_good(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        error,
        KafkaError::MessageProduction(
            MessageSizeTooLarge
                | MessageBatchTooLarge
                | InvalidMessageSize
                | InvalidRecord
                | InvalidTimestamp
                | PolicyViolation
                | UnsupportedForMessageFormat
        )
    )
}

/// A record refused for its size, by the producer itself or by the broker.
fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
    )
}

/// The error's kind, as the `error` label of `watchbridge_produce_failures_total`.
fn failure_label(error: &KafkaError) -> String {
    match error {
        KafkaError::MessageProduction(code) => format!("{code:?}"),
        other => format!("{other:?}")
            .split('(')
            .next()
            .unwrap_or("other")
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::health::{BrokerHealth, KafkaContext};

    /// An ACL missing is about the bridge's rights, not the record: never a dead letter
    /// (issue 47: an output refused `TopicAuthorizationFailed` was dead-lettered and its
    /// input committed), whatever was refused; a record too large still is.
    #[test]
    fn a_refusal_restarts_the_partition_and_dead_letters_nothing() {
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        let output = || Kind::Output {
            hash: 1,
            ticket: SendTicket::of_no_watch(),
        };
        for kind in [
            output(),
            Kind::DeadLetter,
            Kind::State,
            Kind::Watermark { on_topic: None },
        ] {
            assert_eq!(
                after_failure(&kind, DELIVERY_ATTEMPTS, &refused, false),
                AfterProduceFailure::RestartPartition
            );
            assert_eq!(
                after_failure(&kind, 1, &refused, true),
                AfterProduceFailure::AbortTransaction
            );
        }
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(
            after_failure(&output(), 1, &too_large, false),
            AfterProduceFailure::DeadLetter
        );
    }
    use crate::kafka::stats::ProducerStats;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::Producer;

    /// A producer that never reaches a broker: records wait in its queue, and the test
    /// reports them itself through the producer's routes.
    fn producer() -> BridgeProducer {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let health = BrokerHealth::new("127.0.0.1:9", metrics.clone());
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .create_with_context(ProducerStats::new(metrics, KafkaContext::new(health)))
            .expect("a producer")
    }

    fn state_record(n: usize) -> Pending {
        let topic: Arc<str> = Arc::from("state");
        Pending {
            record: OutRecord::state(&topic, 0, n.to_le_bytes().to_vec(), None),
            origin: Origins::None,
            attempt: 1,
            kind: Kind::State,
        }
    }

    /// An output in flight holds its slot and nothing else here: not its record (a
    /// `Pending` with one was about 220 bytes, moved half a dozen times per output).
    #[test]
    fn a_record_in_flight_takes_a_small_slot() {
        let slot = std::mem::size_of::<Option<Sent>>();
        assert!(slot <= 96, "{slot} bytes");
    }

    #[tokio::test]
    async fn a_burst_s_buffers_are_given_back_once_it_is_over() {
        let producer = producer();
        let mut deliveries = Deliveries::new(&producer);
        let burst = 1_000;
        for n in 0..burst {
            assert!(deliveries.send(state_record(n)).is_ok());
        }
        let routes = producer.context().routes.clone();
        for slot in 0..burst as u32 {
            routes.deliver(deliveries.route.token(slot), Ok((0, i64::from(slot))));
        }
        // While reports are still coming, nothing is given back.
        for _ in 0..burst / 2 {
            assert!(matches!(deliveries.next().await, Some(Delivery::Done(..))));
        }
        deliveries.release_idle_capacity();
        assert!(
            deliveries.buffer_bytes() > 0,
            "half the burst is still in flight"
        );
        for _ in burst / 2..burst {
            assert!(matches!(deliveries.next().await, Some(Delivery::Done(..))));
        }
        assert!(deliveries.is_empty());
        let held = deliveries.buffer_bytes();
        assert!(
            held > burst * 100,
            "the burst grew the buffers ({held} bytes)"
        );
        deliveries.release_idle_capacity();
        assert_eq!(deliveries.buffer_bytes(), 0, "the burst is over");
        // And they grow again for the next one.
        assert!(deliveries.send(state_record(0)).is_ok());
        assert_eq!(deliveries.len(), 1);
    }
}

//! Which librdkafka properties are for which kind of client. `KAFKA_*` variables become
//! properties of every client the bridge makes — consumers, producers, admin clients —
//! but librdkafka warns (`CONFWARN`) when a client is given a property of the other kind
//! and ignores it. So each client gets the properties of its kind and the general ones;
//! `KAFKA_CONSUMER_*` and `KAFKA_PRODUCER_*` name a property for one kind explicitly (and
//! win over the plain form for that kind).
//!
//! The lists are the `C` and `P` rows of `CONFIGURATION.md` of the librdkafka bundled with
//! `rdkafka-sys` (2.12.1), global and topic properties; everything else is for all.

/// The kind of a client, as far as its properties go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    Consumer,
    Producer,
    /// Admin clients and metadata-only clients: only the general properties.
    Other,
}

const CONSUMER_ONLY: &[&str] = &[
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "check.crcs",
    "consume.callback.max.messages",
    "consume_cb",
    "coordinator.query.interval.ms",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "fetch.error.backoff.ms",
    "fetch.max.bytes",
    "fetch.message.max.bytes",
    "fetch.min.bytes",
    "fetch.queue.backoff.ms",
    "fetch.wait.max.ms",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.protocol.type",
    "group.remote.assignor",
    "heartbeat.interval.ms",
    "isolation.level",
    "max.partition.fetch.bytes",
    "max.poll.interval.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "offset_commit_cb",
    "partition.assignment.strategy",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "rebalance_cb",
    "session.timeout.ms",
];

const PRODUCER_ONLY: &[&str] = &[
    "acks",
    "batch.num.messages",
    "batch.size",
    "compression.codec",
    "compression.level",
    "compression.type",
    "delivery.report.only.error",
    "delivery.timeout.ms",
    "dr_cb",
    "dr_msg_cb",
    "enable.gapless.guarantee",
    "enable.idempotence",
    "linger.ms",
    "message.send.max.retries",
    "message.timeout.ms",
    "msg_order_cmp",
    "partitioner",
    "partitioner_cb",
    "produce.offset.report",
    "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "queue.buffering.max.ms",
    "queuing.strategy",
    "request.required.acks",
    "request.timeout.ms",
    "retries",
    "sticky.partitioning.linger.ms",
    "transaction.timeout.ms",
    "transactional.id",
];

/// Whether a client of `kind` takes `property` (general properties go to every client).
pub fn is_for(property: &str, kind: ClientKind) -> bool {
    let consumer = CONSUMER_ONLY.contains(&property);
    let producer = PRODUCER_ONLY.contains(&property);
    match kind {
        ClientKind::Consumer => !producer,
        ClientKind::Producer => !consumer,
        ClientKind::Other => !consumer && !producer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_producer_and_general_properties_go_where_they_belong() {
        assert!(is_for("session.timeout.ms", ClientKind::Consumer));
        assert!(!is_for("session.timeout.ms", ClientKind::Producer));
        assert!(!is_for("linger.ms", ClientKind::Consumer));
        assert!(is_for("linger.ms", ClientKind::Producer));
        for kind in [
            ClientKind::Consumer,
            ClientKind::Producer,
            ClientKind::Other,
        ] {
            assert!(is_for("security.protocol", kind));
            assert!(is_for("sasl.password", kind));
        }
        assert!(!is_for("isolation.level", ClientKind::Other));
    }

    /// Every property listed is one librdkafka knows (a typo would leave the real property
    /// general). Callbacks cannot be set from text and are skipped. That the sides are
    /// librdkafka's own is checked end to end by `cli::kafka_properties_reach_only_the_clients_they_are_for`
    /// (no `CONFWARN`).
    #[test]
    fn the_lists_name_real_properties() {
        for property in CONSUMER_ONLY.iter().chain(PRODUCER_ONLY) {
            if property.ends_with("_cb") || *property == "msg_order_cmp" {
                continue;
            }
            let mut c = rdkafka::ClientConfig::new();
            // A value each accepts is not needed: an unknown name fails differently.
            c.set(*property, "1");
            if let Err(e) = c.create_native_config() {
                assert!(
                    !e.to_string().contains("No such configuration property"),
                    "{property}: {e}"
                );
            }
        }
    }
}

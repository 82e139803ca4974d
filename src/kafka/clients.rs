//! Every Kafka client configuration the bridge makes, by role, from one [`KafkaSettings`]:
//! the bootstrap brokers, the user's `KAFKA_*` properties ([`super::env`]) and the bridge's
//! group id, built once at start. One room, so that every client logs in as the user said
//! (issue 47: a copy made one way lost the password for some clients and not others), and
//! so that what the bridge insists on beside the user's properties — and which of its
//! defaults the user may override — is read in one place.
//!
//! Each client starts from the brokers and the user's properties of its kind
//! ([`super::properties`]); a role then puts the bridge's defaults under them (the input
//! consumer, the producers: `override_with`) or its own needs over them (the readers'
//! `isolation.level`, the producers' idempotence). A client's `transactional.id` is its
//! identity, not a setting: it is set where the client is made (each partition's
//! producer: `stats::ProducerSettings::create`), except the guarantee probe's.
//!
//! The small commands (`produce`, `consume`: `kafka/tools.rs`) make theirs here too, from
//! the environment ([`KafkaSettings::from_env`]), as they always did: the brokers, every
//! `KAFKA_*` property (not sorted by kind), then the client's `KAFKA_CONSUMER_*` or
//! `KAFKA_PRODUCER_*` ones, and nothing of the bridge's.

use super::env::{kafka_properties, KafkaProperties};
use super::guarantee::Guarantee;
use super::properties::{is_for, ClientKind};
use super::stats;
use super::transaction_timeout::TransactionTimeouts;
use crate::secrets::is_secret;
use rdkafka::ClientConfig;

/// What every Kafka client of the bridge is made from. No `Debug`: it holds the user's
/// secrets.
#[derive(Clone)]
pub struct KafkaSettings {
    /// The bootstrap servers (`WATCHBRIDGE_BROKERS`, or the embedded broker's).
    pub brokers: String,
    /// The user's `KAFKA_*` properties, by the clients they are for.
    pub properties: KafkaProperties,
    /// The bridge's consumer group (`WATCHBRIDGE_GROUP_ID`): the input consumer's, and the
    /// group id every reader names though it commits nothing (librdkafka wants one to find
    /// the group's coordinator), so that an ACL on it covers every group the bridge names
    /// (docs/brokers.md, "Least privilege").
    pub group_id: String,
}

/// A reader's `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Never what a transaction left open or aborted; the end offsets it looks up are the
    /// last stable ones.
    ReadCommitted,
    /// Everything written; the end offsets it looks up are the high watermarks.
    ReadUncommitted,
}

impl Isolation {
    fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

impl KafkaSettings {
    /// The settings of the small commands (`produce`, `consume`): `brokers` and the
    /// `KAFKA_*` variables of this process, with their consumers' group,
    /// `watchbridge-consume`.
    pub fn from_env(brokers: &str) -> Result<Self, String> {
        Ok(Self {
            brokers: brokers.to_string(),
            properties: kafka_properties(std::env::vars()).map_err(|e| e.to_string())?,
            group_id: "watchbridge-consume".to_string(),
        })
    }

    /// Log the user's Kafka properties once, secrets masked, each with the clients it goes
    /// to.
    pub fn log_properties(&self) {
        let props = &self.properties;
        let all = props.all.iter().map(|p| (p, None));
        let consumer = props.consumer.iter().map(|p| (p, Some("consumers")));
        let producer = props.producer.iter().map(|p| (p, Some("producers")));
        for ((key, value), only) in all.chain(consumer).chain(producer) {
            let shown = if is_secret(key) {
                "<redacted>"
            } else {
                value.as_str()
            };
            let clients = only.unwrap_or(
                match (
                    is_for(key, ClientKind::Consumer),
                    is_for(key, ClientKind::Producer),
                ) {
                    (true, true) => "all",
                    (true, false) => "consumers",
                    _ => "producers",
                },
            );
            tracing::info!(property = %key, value = %shown, clients, "Kafka property from KAFKA_* environment");
        }
    }

    /// Whether the user's `security.protocol` (`KAFKA_SECURITY_PROTOCOL`) is plaintext, or
    /// unset.
    pub fn is_plaintext(&self) -> bool {
        self.user_property("security.protocol")
            .is_none_or(|v| v.eq_ignore_ascii_case("plaintext"))
    }

    /// The user's value of `property` for every client (`KAFKA_*`, not the
    /// `KAFKA_CONSUMER_*` / `KAFKA_PRODUCER_*` forms).
    pub fn user_property(&self, property: &str) -> Option<&str> {
        self.properties
            .all
            .iter()
            .find(|(k, _)| k == property)
            .map(|(_, v)| v.as_str())
    }

    // The start's questions, and the clients that only ask for metadata.

    /// The admin client of the start (its wait for the brokers, the topics) and of the
    /// brokers' settings, and the consumer that asks again when a login may have been
    /// refused: only the general properties.
    pub fn admin(&self) -> ClientConfig {
        self.client(ClientKind::Other)
    }

    /// The producer that asks for a topic's metadata by name, which lets a broker with
    /// automatic topic creation create it.
    pub fn metadata_producer(&self) -> ClientConfig {
        self.client(ClientKind::Producer)
    }

    /// The consumer that confirms an outage with a metadata request (`kafka/health.rs`).
    pub fn health_probe(&self) -> ClientConfig {
        self.client(ClientKind::Consumer)
    }

    /// The consumer that reads the output partitions' end offsets (`kafka/output_ends.rs`):
    /// of no group.
    pub fn output_ends_reader(&self) -> ClientConfig {
        self.client(ClientKind::Consumer)
    }

    // The bridge's producers.

    /// Each partition task's own producer, and the shared one for what no partition owns
    /// (the merged watermark, a bounded run's end of time). Without transactions, one
    /// produce request is in flight per connection (`one_request_in_flight`).
    pub fn output_producer(&self, guarantee: Guarantee) -> ClientConfig {
        let mut c = self.producer();
        if guarantee != Guarantee::ExactlyOnce {
            one_request_in_flight(&mut c);
        }
        c
    }

    /// The exactly-once mode's producer of each partition, with the transaction timeouts
    /// fitted to the checkpoint interval (its `transactional.id` is set where it is made).
    pub fn transactional_producer(&self, timeouts: &TransactionTimeouts) -> ClientConfig {
        let mut c = self.output_producer(Guarantee::ExactlyOnce);
        c.set(
            "transaction.timeout.ms",
            timeouts.transaction.as_millis().to_string(),
        )
        .set(
            "message.timeout.ms",
            timeouts.message.as_millis().to_string(),
        );
        c
    }

    /// The control topic's writer (the group's standing orders).
    pub fn control_topic_writer(&self) -> ClientConfig {
        self.producer()
    }

    /// The operations API's producer, which produces inputs again (`kafka/state_lookup.rs`).
    pub fn state_lookup_writer(&self) -> ClientConfig {
        self.producer()
    }

    /// The settings every producer of the bridge starts from: idempotent, `acks=all`.
    fn producer(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("linger.ms", "5");
        c.set("compression.type", "lz4");
        override_with(&mut c, self.client(ClientKind::Producer));
        stats::enable(&mut c, &self.properties.all);
        // Required for "nothing lost, nothing twice" on the producer side.
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        c
    }

    // The input consumer.

    /// The group's consumer of the input topic.
    pub fn input_consumer(&self, guarantee: Guarantee) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("auto.offset.reset", "earliest");
        c.set("partition.assignment.strategy", "cooperative-sticky");
        c.set("auto.commit.interval.ms", "1000");
        // A fetch that finds records returns at once on Apache Kafka whatever this is:
        // there it only says how often an idle consumer asks (50 times a second per broker
        // instead of librdkafka's 2). Tansu 0.6 holds every fetch this long even when it has
        // records (its fetch loop sleeps out the wait before it looks at the bytes it
        // found): with librdkafka's 500 ms the first inputs of a start came ~0.3 s after
        // the partitions were ready, with 100 ms ~0.1 s, with 20 ms ~25 ms.
        c.set("fetch.wait.max.ms", "20");
        override_with(&mut c, self.client(ClientKind::Consumer));
        if uses_the_consumer_protocol(&c) {
            // KIP-848: the broker assigns, and librdkafka refuses a client-side assignor.
            c.remove("partition.assignment.strategy");
        }
        stats::enable(&mut c, &self.properties.all);
        c.set("group.id", &self.group_id);
        // Offsets are stored by us, only once what an input caused is acknowledged; in the
        // exactly-once mode they are committed in the partitions' transactions instead.
        c.set(
            "enable.auto.commit",
            if guarantee == Guarantee::ExactlyOnce {
                "false"
            } else {
                "true"
            },
        );
        c.set("enable.auto.offset.store", "false");
        // Each partition's end is reported (`Feed::End`): a bounded run ends there, and a
        // recovered partition knows its uncommitted inputs were all read again, even when
        // the last offsets hold no record a consumer is handed (a transaction marker).
        c.set("enable.partition.eof", "true");
        c
    }

    /// The client made only for the group's metadata, which the exactly-once mode's
    /// transactions commit offsets with. Made by the classic protocol's rules whatever
    /// `KAFKA_GROUP_PROTOCOL` says: under KIP-848's, librdkafka's metadata of a consumer
    /// that never joined made every transactional offset commit fail with
    /// `UNKNOWN_MEMBER_ID` (tests/secured.rs).
    pub fn group_metadata_client(&self) -> ClientConfig {
        let mut c = self.client(ClientKind::Consumer);
        c.set("group.id", &self.group_id).remove("group.protocol");
        c
    }

    // The readers: assigned partitions, never subscribed, nothing committed.

    /// A recovery's consumers (`kafka/recovery.rs`): each restore's reads (and the group
    /// mode's, `kafka/group_mode.rs`) with [`Isolation::ReadCommitted`], the shared offset
    /// lookups with either.
    pub fn recovery_reader(&self, isolation: Isolation) -> ClientConfig {
        let mut c = self.reader();
        // Readers: never what a transaction left open or aborted (the exactly-once mode's
        // records, the guarantee probe's record), whatever `KAFKA_ISOLATION_LEVEL` says.
        // (The end offsets looked up are then the last stable ones.)
        c.set("isolation.level", isolation.as_str())
            // The end of a partition is reported, so a read ends there even when the last
            // offsets hold no record a consumer sees (transaction markers, compacted away).
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "50");
        c
    }

    /// The guarantee probe's reader (`guarantee::probe_transaction`): it must not see the
    /// record of the transaction it aborted.
    pub fn guarantee_probe_reader(&self) -> ClientConfig {
        self.recovery_reader(Isolation::ReadCommitted)
    }

    /// The guarantee probe's producer: one real transaction under `transactional_id` (this
    /// process's own: two instances starting at once must not fence each other's probe).
    pub fn guarantee_probe_producer(&self, transactional_id: &str) -> ClientConfig {
        let mut c = self.producer();
        c.set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", "10000");
        c
    }

    /// The watermark topic's reader (`kafka/merged.rs`).
    pub fn watermark_reader(&self) -> ClientConfig {
        let mut c = self.reader();
        // Only committed watermarks (the exactly-once mode's are transactional).
        c.set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "100")
            // The end is reported: in the exactly-once mode the topic ends with a
            // transaction marker, which is never handed over as a record (`read_upto`); and
            // the replay is over only at the end.
            .set("enable.partition.eof", "true")
            // It reads from offset 0, not from `Offset::Beginning`: a logical offset is
            // looked up first, and librdkafka puts that lookup off by a fixed 500 ms when
            // the partition's leader is not known yet — always so on a consumer just made.
            // A partition taken over, or at a start one whose sibling published first,
            // waits for this reader (`read_upto`). If retention deleted offset 0, the fetch
            // is out of range and starts again at the earliest record, whatever
            // `KAFKA_AUTO_OFFSET_RESET` says (the leader is known by then: no pause).
            .set("auto.offset.reset", "earliest");
        c
    }

    /// The control topic's reader (`kafka/control_topic.rs`).
    pub fn control_topic_reader(&self) -> ClientConfig {
        let mut c = self.reader();
        c.set("isolation.level", "read_committed");
        // Its end is where it has read everything there was at start.
        c.set("enable.partition.eof", "true");
        c
    }

    /// The operations API's reader of the state topic (`kafka/state_lookup.rs`), which
    /// reads a partition to its end as `watchbridge consume -e` does.
    pub fn state_lookup_reader(&self) -> ClientConfig {
        to_its_end(self.reader())
    }

    // The small commands.

    /// `watchbridge produce`'s producer.
    pub fn tool_producer(&self) -> ClientConfig {
        let mut c = self.tool_client(ClientKind::Producer);
        c.set("enable.idempotence", "true")
            .set("message.timeout.ms", "15000");
        c
    }

    /// `watchbridge consume`'s reader (and `watchbridge state inspect`'s).
    pub fn tool_consumer(&self) -> ClientConfig {
        let mut c = self.tool_client(ClientKind::Consumer);
        c.set("group.id", &self.group_id);
        to_its_end(c)
    }

    /// A client of `kind` for the small commands: the brokers and the user's properties
    /// for every client, then those of `kind`.
    fn tool_client(&self, kind: ClientKind) -> ClientConfig {
        let own = match kind {
            ClientKind::Consumer => self.properties.consumer.as_slice(),
            ClientKind::Producer => self.properties.producer.as_slice(),
            ClientKind::Other => &[],
        };
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (key, value) in self.properties.all.iter().chain(own) {
            c.set(key, value);
        }
        c
    }

    /// The settings of the bridge's readers that are not the input consumer: the bridge's
    /// group id (see [`KafkaSettings::group_id`]), nothing committed.
    fn reader(&self) -> ClientConfig {
        let mut c = self.client(ClientKind::Consumer);
        c.set("group.id", &self.group_id);
        c.set("enable.auto.commit", "false");
        c
    }

    /// The settings every client of `kind` starts from: the brokers and the user's `KAFKA_*`
    /// properties of that kind ([`super::properties`]: a consumer property given to a
    /// producer only makes librdkafka warn), then its `KAFKA_CONSUMER_*` /
    /// `KAFKA_PRODUCER_*` ones; but not `statistics.interval.ms`: only the clients whose
    /// statistics become metrics ask for them ([`stats::enable`]); any other would log
    /// them.
    fn client(&self, kind: ClientKind) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c.set(
            "client.id",
            concat!("watchbridge-", env!("CARGO_PKG_VERSION")),
        );
        // librdkafka drops its bootstrap connection once it knows the broker by id; a
        // request on it then (a client's first: the group's coordinator, the start's
        // metadata) fails, and is sent again only after half of this (25 ms to 50 ms with
        // librdkafka's 100 ms; a start met it once or twice in two). A broker that is down
        // is still retried with backoff doubling up to `reconnect.backoff.max.ms` (10 s).
        c.set("reconnect.backoff.ms", "10");
        // A connection to every broker as soon as it is known, not once a request needs
        // one. With librdkafka's sparse connections, a connection is opened at most once
        // per ~11 ms (half the backoff above, at least 11 ms): the request sent again after
        // the bootstrap connection was dropped (the group's coordinator: the input
        // consumer's join, each restore's committed offset) waited for that, ~10 ms of a
        // fresh start's ~60 ms to its first poll on Tansu (`KAFKA_DEBUG=cgrp,broker`:
        // "still suppressed for 11ms"). And the idempotent producer asks for its producer
        // id only over a connection that is up; where none is it tries again 500 ms later
        // (librdkafka's PID timer): the first outputs of a fresh start waited 0.5–1 s for
        // that.
        c.set("enable.sparse.connections", "false");
        let own = match kind {
            ClientKind::Consumer => self.properties.consumer.as_slice(),
            ClientKind::Producer => self.properties.producer.as_slice(),
            ClientKind::Other => &[],
        };
        for (key, value) in self.properties.all.iter().chain(own) {
            if key != stats::INTERVAL_PROPERTY && is_for(key, kind) {
                c.set(key, value);
            }
        }
        c
    }
}

/// A reader that reads partitions to their end ([`super::tools::read_topic_with`]).
fn to_its_end(mut c: ClientConfig) -> ClientConfig {
    c.set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "50")
        // The end of a partition is where the consumer's position reaches its end offset,
        // which need not be a record's: a transactional writer's partition ends with a
        // commit marker, which is never handed to a reader.
        .set("enable.partition.eof", "true");
    c
}

/// `KAFKA_GROUP_PROTOCOL=consumer`: the group protocol of KIP-848, where the broker assigns
/// partitions and owns the group's timeouts (`group.consumer.session.timeout.ms`, …).
pub fn uses_the_consumer_protocol(consumer: &ClientConfig) -> bool {
    consumer
        .get("group.protocol")
        .is_some_and(|p| p.eq_ignore_ascii_case("consumer"))
}

/// Without transactions, one produce request in flight per broker connection, unless
/// `KAFKA_*` says otherwise. With several, a failed first request (a leader that moved, a
/// dropped connection: "possibly persisted") fails the ones behind it with
/// `OUT_OF_ORDER_SEQUENCE_NUMBER`, and librdkafka (2.12) bumps the producer's epoch and
/// sends all of them again: the first, if the broker had kept it, is then written twice,
/// side by side, and no delivery report says so (librdkafka issue 4953; seen on three
/// nodes: an output at two neighbouring offsets, both after the same restore). With one,
/// the first is sent again under its own sequence number, and the broker drops the copy.
/// In the exactly-once mode a bump aborts the transaction, copies included.
fn one_request_in_flight(c: &mut ClientConfig) {
    const IN_FLIGHT: [&str; 2] = ["max.in.flight.requests.per.connection", "max.in.flight"];
    if IN_FLIGHT.iter().all(|key| c.get(key).is_none()) {
        c.set(IN_FLIGHT[0], "1");
    }
}

/// Apply `other`'s settings over `c` (the user's `KAFKA_*` over our defaults). Each value
/// is read with `get`: `config_map()` shows secrets (`sasl.password`, …) as a placeholder,
/// and a copy made from it logged in with that placeholder.
fn override_with(c: &mut ClientConfig, other: ClientConfig) {
    for key in other.config_map().into_keys() {
        if let Some(value) = other.get(key) {
            c.set(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Settings from the `KAFKA_*` variables `env`, for the brokers `b:9092` and the group
    /// `grp`.
    fn settings(env: &[(&str, &str)]) -> KafkaSettings {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        KafkaSettings {
            brokers: "b:9092".to_string(),
            properties: kafka_properties(env).unwrap(),
            group_id: "grp".to_string(),
        }
    }

    /// Every client of the bridge, by role.
    fn every_role(s: &KafkaSettings) -> Vec<(&'static str, ClientConfig)> {
        let timeouts = TransactionTimeouts {
            transaction: Duration::from_secs(60),
            message: Duration::from_secs(55),
        };
        vec![
            ("admin", s.admin()),
            ("metadata producer", s.metadata_producer()),
            ("health probe", s.health_probe()),
            ("output ends reader", s.output_ends_reader()),
            ("output producer", s.output_producer(Guarantee::Recovery)),
            (
                "output producer (at least once)",
                s.output_producer(Guarantee::AtLeastOnce),
            ),
            (
                "output producer (exactly once)",
                s.output_producer(Guarantee::ExactlyOnce),
            ),
            (
                "transactional producer",
                s.transactional_producer(&timeouts),
            ),
            ("control topic writer", s.control_topic_writer()),
            ("state lookup writer", s.state_lookup_writer()),
            ("input consumer", s.input_consumer(Guarantee::Recovery)),
            (
                "input consumer (exactly once)",
                s.input_consumer(Guarantee::ExactlyOnce),
            ),
            ("group metadata client", s.group_metadata_client()),
            (
                "recovery reader",
                s.recovery_reader(Isolation::ReadCommitted),
            ),
            (
                "offset lookups (uncommitted)",
                s.recovery_reader(Isolation::ReadUncommitted),
            ),
            ("guarantee probe reader", s.guarantee_probe_reader()),
            (
                "guarantee probe producer",
                s.guarantee_probe_producer("probe"),
            ),
            ("watermark reader", s.watermark_reader()),
            ("control topic reader", s.control_topic_reader()),
            ("state lookup reader", s.state_lookup_reader()),
            ("produce command", s.tool_producer()),
            ("consume command", s.tool_consumer()),
        ]
    }

    /// Every client the bridge makes logs in as the user said, secrets included: rdkafka's
    /// `config_map()` shows `sasl.password` as a placeholder, and a copy made through it
    /// sent that placeholder (issue 47: SCRAM and PLAIN refused for the input consumer and
    /// the producers, while the start's admin client, made without a copy, logged in). And
    /// what each role insists on beside the user's settings is there.
    #[test]
    fn every_role_gets_the_users_security_settings_secrets_included() {
        let security = [
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_USERNAME", "alice"),
            ("KAFKA_SASL_PASSWORD", "alice-secret"),
            ("KAFKA_SSL_CA_LOCATION", "/etc/kafka/ca.pem"),
            ("KAFKA_SSL_KEY_PASSWORD", "key-secret"),
            ("KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", "oidc-secret"),
        ];
        let s = settings(&security);
        for (role, client) in every_role(&s) {
            assert_eq!(client.get("bootstrap.servers"), Some("b:9092"), "{role}");
            for (variable, value) in security {
                let key = variable["KAFKA_".len()..]
                    .to_ascii_lowercase()
                    .replace('_', ".");
                assert_eq!(client.get(&key), Some(value), "{role}: {key}");
            }
            let group = client.get("group.id");
            if role.contains("reader") && role != "output ends reader" || role.contains("lookups") {
                assert_eq!(group, Some("grp"), "{role}: the bridge's group");
                assert_eq!(client.get("enable.auto.commit"), Some("false"), "{role}");
                assert_eq!(client.get("enable.partition.eof"), Some("true"), "{role}");
                let isolation = client.get("isolation.level");
                if role == "offset lookups (uncommitted)" {
                    assert_eq!(isolation, Some("read_uncommitted"), "{role}");
                } else if role != "state lookup reader" {
                    assert_eq!(isolation, Some("read_committed"), "{role}");
                }
            }
            if role.contains("producer") && role != "metadata producer" || role.contains("writer") {
                assert_eq!(client.get("enable.idempotence"), Some("true"), "{role}");
            }
        }
    }

    /// What each role insists on, and which of its defaults the user may override.
    #[test]
    fn each_role_keeps_its_own_settings_over_the_users() {
        let s = settings(&[
            ("KAFKA_ISOLATION_LEVEL", "read_uncommitted"),
            ("KAFKA_ENABLE_AUTO_COMMIT", "true"),
            ("KAFKA_ENABLE_PARTITION_EOF", "false"),
            ("KAFKA_GROUP_ID", "other"),
            ("KAFKA_AUTO_OFFSET_RESET", "latest"),
            ("KAFKA_ACKS", "1"),
            ("KAFKA_LINGER_MS", "50"),
            ("KAFKA_STATISTICS_INTERVAL_MS", "1000"),
        ]);
        let recovery = s.recovery_reader(Isolation::ReadCommitted);
        assert_eq!(recovery.get("isolation.level"), Some("read_committed"));
        assert_eq!(recovery.get("group.id"), Some("grp"));
        assert_eq!(recovery.get("enable.auto.commit"), Some("false"));
        assert_eq!(recovery.get("statistics.interval.ms"), None, "not logged");
        let watermarks = s.watermark_reader();
        assert_eq!(watermarks.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(watermarks.get("fetch.wait.max.ms"), Some("100"));
        // The state lookup reads as the user says (`KAFKA_ISOLATION_LEVEL`).
        let lookup = s.state_lookup_reader();
        assert_eq!(lookup.get("isolation.level"), Some("read_uncommitted"));
        let producer = s.output_producer(Guarantee::Recovery);
        assert_eq!(producer.get("acks"), Some("all"));
        assert_eq!(
            producer.get("linger.ms"),
            Some("50"),
            "the user's over ours"
        );
        assert_eq!(producer.get("compression.type"), Some("lz4"));
        assert_eq!(producer.get("statistics.interval.ms"), Some("1000"));
        let consumer = s.input_consumer(Guarantee::Recovery);
        assert_eq!(consumer.get("group.id"), Some("grp"));
        assert_eq!(consumer.get("enable.auto.commit"), Some("true"));
        assert_eq!(consumer.get("enable.partition.eof"), Some("true"));
        assert_eq!(
            consumer.get("auto.offset.reset"),
            Some("latest"),
            "the user's"
        );
        assert_eq!(
            consumer.get("isolation.level"),
            Some("read_uncommitted"),
            "the user's"
        );
        let exactly_once = s.input_consumer(Guarantee::ExactlyOnce);
        assert_eq!(exactly_once.get("enable.auto.commit"), Some("false"));
        let timeouts = TransactionTimeouts {
            transaction: Duration::from_secs(60),
            message: Duration::from_secs(55),
        };
        let transactional = s.transactional_producer(&timeouts);
        assert_eq!(transactional.get("transaction.timeout.ms"), Some("60000"));
        assert_eq!(transactional.get("message.timeout.ms"), Some("55000"));
        assert_eq!(
            transactional.get("max.in.flight.requests.per.connection"),
            None
        );
        let probe = s.guarantee_probe_producer("probe-1");
        assert_eq!(probe.get("transactional.id"), Some("probe-1"));
        assert_eq!(probe.get("transaction.timeout.ms"), Some("10000"));
        assert_eq!(s.admin().get("isolation.level"), None, "consumers' only");
        assert_eq!(s.admin().get("acks"), None, "producers' only");
    }

    /// `KAFKA_GROUP_PROTOCOL=consumer` (KIP-848) leaves the assignor to the broker:
    /// librdkafka refuses `partition.assignment.strategy` beside it.
    #[test]
    fn the_consumer_group_protocol_leaves_the_assignor_to_the_broker() {
        let classic = settings(&[]).input_consumer(Guarantee::Recovery);
        assert_eq!(
            classic.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        let kip848 = settings(&[("KAFKA_GROUP_PROTOCOL", "consumer")]);
        let consumer = kip848.input_consumer(Guarantee::Recovery);
        assert_eq!(consumer.get("partition.assignment.strategy"), None);
        assert_eq!(consumer.get("group.protocol"), Some("consumer"));
        let made: Result<rdkafka::consumer::BaseConsumer, _> = consumer.create();
        assert!(made.is_ok(), "{:?}", made.err());
        assert_eq!(kip848.group_metadata_client().get("group.protocol"), None);
    }

    /// The producer connects to every broker at once (its producer id without the PID
    /// timer's 500 ms wait), unless the operator says otherwise; idempotence is not theirs
    /// to turn off.
    #[test]
    fn the_producer_connects_at_once_unless_told_otherwise() {
        let default = settings(&[]).output_producer(Guarantee::Recovery);
        assert_eq!(default.get("enable.sparse.connections"), Some("false"));
        let told = settings(&[
            ("KAFKA_PRODUCER_ENABLE_SPARSE_CONNECTIONS", "true"),
            ("KAFKA_ENABLE_IDEMPOTENCE", "false"),
        ])
        .output_producer(Guarantee::Recovery);
        assert_eq!(told.get("enable.sparse.connections"), Some("true"));
        assert_eq!(told.get("enable.idempotence"), Some("true"));
    }

    /// Every client retries a first request caught on the dropped bootstrap connection
    /// after 10 ms over a connection it opened at once, and the input consumer asks with a
    /// 20 ms fetch wait, unless the operator says otherwise.
    #[test]
    fn start_up_latencies_are_defaults_an_operator_can_override() {
        let (run, guarantee) = (settings(&[]), Guarantee::Recovery);
        let consumer = run.input_consumer(guarantee);
        assert_eq!(consumer.get("fetch.wait.max.ms"), Some("20"));
        assert_eq!(consumer.get("reconnect.backoff.ms"), Some("10"));
        assert_eq!(consumer.get("enable.sparse.connections"), Some("false"));
        // The restores' consumers and the start's client too.
        let other = run.admin();
        assert_eq!(other.get("enable.sparse.connections"), Some("false"));
        let producer = run.output_producer(guarantee);
        assert_eq!(producer.get("reconnect.backoff.ms"), Some("10"));
        let told = settings(&[
            ("KAFKA_RECONNECT_BACKOFF_MS", "100"),
            ("KAFKA_CONSUMER_FETCH_WAIT_MAX_MS", "500"),
            ("KAFKA_CONSUMER_ENABLE_SPARSE_CONNECTIONS", "true"),
        ]);
        let consumer = told.input_consumer(guarantee);
        assert_eq!(consumer.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(consumer.get("reconnect.backoff.ms"), Some("100"));
        assert_eq!(consumer.get("enable.sparse.connections"), Some("true"));
        let producer = told.output_producer(guarantee);
        assert_eq!(producer.get("reconnect.backoff.ms"), Some("100"));
    }

    /// Without transactions one produce request is in flight per connection (a resend
    /// after an epoch bump writes a kept record twice otherwise), unless the operator says
    /// otherwise.
    #[test]
    fn without_transactions_one_request_is_in_flight_unless_told_otherwise() {
        let default = settings(&[]);
        for guarantee in [Guarantee::Recovery, Guarantee::AtLeastOnce] {
            assert_eq!(
                default
                    .output_producer(guarantee)
                    .get("max.in.flight.requests.per.connection"),
                Some("1")
            );
        }
        let exactly_once = default.output_producer(Guarantee::ExactlyOnce);
        assert_eq!(
            exactly_once.get("max.in.flight.requests.per.connection"),
            None
        );
        for (setting, key) in [
            (
                "KAFKA_PRODUCER_MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION",
                "max.in.flight.requests.per.connection",
            ),
            ("KAFKA_PRODUCER_MAX_IN_FLIGHT", "max.in.flight"),
        ] {
            let told = settings(&[(setting, "5")]).output_producer(Guarantee::Recovery);
            assert_eq!(told.get(key), Some("5"), "{setting}");
        }
    }
}

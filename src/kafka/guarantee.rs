//! `WATCHBRIDGE_GUARANTEE`: what a crash, a restart, a rebalance or a stalled instance may do
//! to the output topic, and how the bridge decides when it is left to choose.
//!
//! - `exactly_once`: a transactional producer per input partition (`transactional.id` =
//!   `watchbridge-<group>-<input topic>-<partition>`). Outputs, state records, watermark
//!   records, dead letters and the input offsets commit in one transaction per checkpoint
//!   interval; a new owner's `init_transactions` fences the previous one (Kafka Streams'
//!   answer to zombies). Consumers of the output topic read `read_committed`.
//! - `recovery`: exactly once by recovery (the state topic plus a read-back of the output
//!   topic), on any Kafka-protocol broker; an instance stalled past the session timeout can
//!   still write twice (see docs/architecture.md, "What a crash does").
//! - `at_least_once`: as `recovery`, without the read-back of the output topic: a crash may
//!   emit again what was delivered after the last checkpoint; a recovery reads less.
//! - `auto` (the default): `exactly_once` where the broker supports transactions, else
//!   `recovery`.
//!
//! Whether it does is asked twice. First one ApiVersions request (v0, which every broker
//! answers) over plain TCP: no `EndTxn` in it, no transactions (where `security.protocol`
//! is TLS or SASL this step is skipped: the probe below, made with the bridge's own security
//! settings, answers for both, so a secured cluster gets the mode a plaintext one gets). Listing `EndTxn` is not enough: Tansu 0.6 lists it,
//! yet its transactions never complete (`init_transactions` hangs on its memory storage,
//! `EndTxn` is refused on SQLite, and where an abort completes it still hands the aborted
//! record to `read_committed` readers, as librdkafka's mock cluster does). So then one real
//! transaction: a producer with a `transactional.id` of its own writes one record to the
//! state topic and aborts it, and a `read_committed` reader reads that partition from
//! before the record to its end. Only if the abort completes and the reader does not see
//! the record, within [`PROBE_TIMEOUT`] each, is the mode `exactly_once`. (Every reader of
//! the state topic reads `read_committed`, so the aborted record is never seen again.)
//!
//! A question that fails for a transient reason ([`transient_code`]: a coordinator loading
//! or moving, a leader election, a timeout, brokers away; or ApiVersions unanswered) is
//! asked again with backoff until `WATCHBRIDGE_START_TIMEOUT`, then fails the start: it is
//! never taken for "no transactions"; nor is a refusal by the authorizer (a missing ACL on
//! the transactional ids), which fails the start naming the ACL. A fallback to `recovery`
//! is said at WARN, with why. On a fresh three-node cluster the first instance's
//! probe met a transaction coordinator still loading, chose `recovery`, and the instances
//! after it `exactly_once` (issue 46). Before any of this, the mode the group runs is read
//! from its state topic (`group_mode.rs`): `auto` takes it, a fixed setting of the other
//! mode is refused.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What the bridge promises about outputs across failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    ExactlyOnce,
    Recovery,
    AtLeastOnce,
}

impl fmt::Display for Guarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Guarantee::ExactlyOnce => "exactly_once",
            Guarantee::Recovery => "recovery",
            Guarantee::AtLeastOnce => "at_least_once",
        })
    }
}

/// The setting as given: a guarantee, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuaranteeSetting {
    Auto,
    Fixed(Guarantee),
}

impl GuaranteeSetting {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "auto" => Ok(Self::Auto),
            "exactly_once" => Ok(Self::Fixed(Guarantee::ExactlyOnce)),
            "recovery" => Ok(Self::Fixed(Guarantee::Recovery)),
            "at_least_once" => Ok(Self::Fixed(Guarantee::AtLeastOnce)),
            _ => Err(format!(
                "`{value}` is not one of auto, exactly_once, recovery, at_least_once"
            )),
        }
    }
}

/// The Kafka API key of EndTxn, which commits or aborts a transaction.
const END_TXN: i16 = 26;
/// The Kafka API key of ApiVersions.
const API_VERSIONS: i16 = 18;

/// Whether the broker at `bootstrap` (the first address of a `host:port,…` list that
/// answers) supports transactions: its ApiVersions response lists EndTxn.
pub fn broker_supports_transactions(bootstrap: &str, timeout: Duration) -> Result<bool, String> {
    let mut last = String::from("no address given");
    for server in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match api_keys(server, timeout) {
            Ok(keys) => return Ok(keys.contains(&END_TXN)),
            Err(e) => last = format!("{server}: {e}"),
        }
    }
    Err(last)
}

/// The API keys one broker supports, from an ApiVersions v0 request.
fn api_keys(server: &str, timeout: Duration) -> Result<Vec<i16>, String> {
    let addr = server
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(&api_versions_request(7))
        .map_err(|e| e.to_string())?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).map_err(|e| e.to_string())?;
    let size = i32::from_be_bytes(size);
    if !(6..=1 << 20).contains(&size) {
        return Err(format!("implausible ApiVersions response size {size}"));
    }
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body).map_err(|e| e.to_string())?;
    parse_api_versions(&body, 7)
}

/// Header v1 (api key, version 0, correlation id, client id) and an empty v0 body.
fn api_versions_request(correlation_id: i32) -> Vec<u8> {
    let client_id = b"watchbridge";
    let mut body = Vec::new();
    body.extend_from_slice(&API_VERSIONS.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&correlation_id.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    request
}

/// Correlation id, error code, then `[api key, min version, max version]`.
fn parse_api_versions(body: &[u8], correlation_id: i32) -> Result<Vec<i16>, String> {
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let part = body
            .get(at..at + n)
            .ok_or("truncated ApiVersions response")?;
        at += n;
        Ok(part)
    };
    let correlation = i32::from_be_bytes(take(4)?.try_into().unwrap());
    if correlation != correlation_id {
        return Err(format!("ApiVersions answered correlation id {correlation}"));
    }
    let error = i16::from_be_bytes(take(2)?.try_into().unwrap());
    if error != 0 {
        return Err(format!("ApiVersions failed with error code {error}"));
    }
    let count = i32::from_be_bytes(take(4)?.try_into().unwrap());
    if !(0..=10_000).contains(&count) {
        return Err(format!("implausible ApiVersions count {count}"));
    }
    (0..count)
        .map(|_| {
            let entry = take(6)?;
            Ok(i16::from_be_bytes([entry[0], entry[1]]))
        })
        .collect()
}

/// How long the probe transaction may take (a broker's transaction coordinator may first
/// have to load its log: about 2 s on a new Apache Kafka).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The key of the probe transaction's record (a recovery skips it: a broker without
/// transactions keeps it visible).
pub const PROBE_KEY: &[u8] = b"~watchbridge-transaction-probe";

/// Why the probe transaction did not prove the broker keeps transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// It may pass on another try: a coordinator loading or moving, a leader election, a
    /// timeout, a broker away. Never taken for "no transactions": on a fresh cluster the
    /// first instance's probe met a loading coordinator, chose `recovery`, and the
    /// instances after it `exactly_once` (issue 46).
    Transient(String),
    /// The broker answered, and does not keep the promise (it hands the aborted record to
    /// a `read_committed` reader, refuses the requests, or the settings are refused).
    Refused(String),
    /// The broker keeps transactions but this principal may not use them (an ACL is
    /// missing): not a reason to run another mode than the user's cluster allows; the
    /// start fails, naming the ACL.
    Denied(String),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Transient(e) | ProbeError::Refused(e) | ProbeError::Denied(e) => {
                f.write_str(e)
            }
        }
    }
}

/// Error codes that say "not now" rather than "no": the coordinator or a partition leader
/// is loading, moving or away, a request or the client timed out, the brokers are not
/// reachable for a moment.
pub fn transient_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::WaitingForCoordinator
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::PreferredLeaderNotAvailable
            | C::EligibleLeadersNotAvailable
            | C::ReplicaNotAvailable
            | C::BrokerNotAvailable
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::UnknownPartition
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::KafkaStorageError
            | C::ConcurrentTransactions
            | C::OffsetNotAvailable
            | C::UnstableOffsetCommit
            | C::ThrottlingQuotaExceeded
            | C::RequestTimedOut
            | C::NetworkException
            | C::OperationTimedOut
            | C::MessageTimedOut
            | C::TimedOutQueue
            | C::AllBrokersDown
            | C::BrokerTransportFailure
            | C::Resolve
            | C::QueueFull
            | C::Retry
            | C::PurgeQueue
            | C::PurgeInflight
    )
}

/// [`ProbeError`] of a client error at step `what`: transient where librdkafka calls a
/// transaction error retriable or the code is [`transient_code`].
fn probe_error(what: &str, e: &KafkaError) -> ProbeError {
    let retriable = matches!(e, KafkaError::Transaction(t) if t.is_retriable());
    let message = format!("{what}: {e}");
    if e.rdkafka_error_code()
        .is_some_and(super::refusal::is_authorization)
    {
        ProbeError::Denied(message)
    } else if retriable || e.rdkafka_error_code().is_some_and(transient_code) {
        ProbeError::Transient(message)
    } else {
        ProbeError::Refused(message)
    }
}

/// One real transaction, aborted, then read back: `Ok` if the broker completed the abort
/// and a `read_committed` reader does not see the record. `producer_config` is the
/// probe's transactional producer ([`KafkaSettings::guarantee_probe_producer`]: its
/// transactional id is this process's own), `consumer_config` its reader
/// ([`KafkaSettings::guarantee_probe_reader`]); the record goes to partition 0 of `topic`
/// (the state topic). The reader's errors and log lines go to `context` (its end of
/// partition is no error).
///
/// [`KafkaSettings::guarantee_probe_producer`]: super::clients::KafkaSettings::guarantee_probe_producer
/// [`KafkaSettings::guarantee_probe_reader`]: super::clients::KafkaSettings::guarantee_probe_reader
pub fn probe_transaction(
    producer_config: &ClientConfig,
    consumer_config: &ClientConfig,
    context: super::health::KafkaContext,
    topic: &str,
) -> Result<(), ProbeError> {
    let consumer: BaseConsumer<super::health::KafkaContext> = consumer_config
        .create_with_context(context)
        .map_err(|e| ProbeError::Refused(e.to_string()))?;
    let (_, before) = consumer
        .fetch_watermarks(topic, 0, PROBE_TIMEOUT)
        .map_err(|e| probe_error(&format!("end offset of {topic}/0"), &e))?;
    let producer: ThreadedProducer<DefaultProducerContext> = producer_config
        .create()
        .map_err(|e| ProbeError::Refused(e.to_string()))?;
    producer
        .init_transactions(PROBE_TIMEOUT)
        .map_err(|e| probe_error("init_transactions", &e))?;
    producer
        .begin_transaction()
        .map_err(|e| probe_error("begin_transaction", &e))?;
    producer
        .send(
            BaseRecord::<[u8], [u8]>::to(topic)
                .partition(0)
                .key(PROBE_KEY)
                .payload(&b""[..]),
        )
        .map_err(|(e, _)| probe_error("produce", &e))?;
    producer
        .flush(PROBE_TIMEOUT)
        .map_err(|e| probe_error("flush", &e))?;
    producer
        .abort_transaction(PROBE_TIMEOUT)
        .map_err(|e| probe_error("abort_transaction", &e))?;
    let mut from = TopicPartitionList::new();
    from.add_partition_offset(topic, 0, Offset::Offset(before))
        .and_then(|()| consumer.assign(&from))
        .map_err(|e| probe_error(&format!("read {topic}/0"), &e))?;
    let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) if m.key() == Some(PROBE_KEY) => {
                return Err(ProbeError::Refused(
                    "the broker hands an aborted record to a read_committed reader".into(),
                ))
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(()),
            _ => {}
        }
    }
    Err(ProbeError::Transient(format!(
        "{topic}/0 was not read to its end within {PROBE_TIMEOUT:?}"
    )))
}

/// The first wait between two tries of the probe, doubled after each up to the second.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(8));

/// Resolve `auto` against the broker (blocking). `plaintext` says whether the configured
/// `security.protocol` lets the ApiVersions request speak to the broker: on a TLS or SASL
/// listener only the probe transaction is asked, with the bridge's own security settings
/// (`probe`, [`probe_transaction`]), so a secured cluster gets the mode a plaintext one
/// gets. A question that fails for a transient reason (the broker not answering
/// ApiVersions, a [`ProbeError::Transient`]) is asked again with backoff until `deadline`
/// (`WATCHBRIDGE_START_TIMEOUT`), and then fails the start: it is never taken for "no
/// transactions"; nor is a missing ACL ([`ProbeError::Denied`]), which fails the start
/// naming it. A fallback to `recovery` is said at WARN, with why, and the why is returned
/// too (for `/readyz` and `watchbridge_guarantee_info`).
pub fn choose_auto(
    brokers: &str,
    plaintext: bool,
    deadline: std::time::Instant,
    mut probe: impl FnMut() -> Result<(), ProbeError>,
) -> Result<(Guarantee, Option<String>), String> {
    let (mut backoff, mut attempt) = (RETRY_BACKOFF.0, 0u32);
    loop {
        attempt += 1;
        let lists_end_txn = if plaintext {
            broker_supports_transactions(brokers, Duration::from_secs(5))
        } else {
            Ok(true)
        };
        let transient = match lists_end_txn {
            Ok(false) => {
                let why = "the brokers do not offer transactions (no EndTxn in ApiVersions)";
                tracing::warn!("WATCHBRIDGE_GUARANTEE=auto: {why}; using `recovery`");
                return Ok((Guarantee::Recovery, Some(why.to_string())));
            }
            Ok(true) => match probe() {
                Ok(()) => return Ok((Guarantee::ExactlyOnce, None)),
                Err(ProbeError::Refused(e)) => {
                    tracing::warn!(error = %e, "WATCHBRIDGE_GUARANTEE=auto: the brokers did not complete a probe transaction; using `recovery`");
                    let why = format!("the brokers did not complete a probe transaction: {e}");
                    return Ok((Guarantee::Recovery, Some(why)));
                }
                Err(ProbeError::Denied(e)) => {
                    return Err(format!(
                        "WATCHBRIDGE_GUARANTEE=auto: the probe transaction was refused: {e}. \
                         The exactly-once mode needs WRITE and DESCRIBE on the transactional \
                         ids prefixed `watchbridge-<WATCHBRIDGE_GROUP_ID>-` (docs/brokers.md, \
                         \"Least privilege\"): grant them, or set \
                         WATCHBRIDGE_GUARANTEE=recovery"
                    ))
                }
                Err(ProbeError::Transient(e)) => e,
            },
            Err(e) => format!("ApiVersions: {e}"),
        };
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(format!(
                "WATCHBRIDGE_GUARANTEE=auto: whether the broker keeps transactions could not be \
                 told within WATCHBRIDGE_START_TIMEOUT ({attempt} tries; the last: {transient}); \
                 a transient failure is not taken for \"no transactions\", which could make \
                 this instance run another mode than the rest of its group. Set \
                 WATCHBRIDGE_GUARANTEE to exactly_once or recovery to skip the question"
            ));
        }
        tracing::warn!(
            error = %transient,
            attempt,
            retry_in = ?backoff,
            "WATCHBRIDGE_GUARANTEE=auto: the probe transaction failed for a transient reason; \
             trying again (until WATCHBRIDGE_START_TIMEOUT)"
        );
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(RETRY_BACKOFF.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_setting_and_names_the_choices_on_a_bad_one() {
        assert_eq!(GuaranteeSetting::parse("auto"), Ok(GuaranteeSetting::Auto));
        assert_eq!(
            GuaranteeSetting::parse("Exactly-Once"),
            Ok(GuaranteeSetting::Fixed(Guarantee::ExactlyOnce))
        );
        assert_eq!(
            GuaranteeSetting::parse("recovery"),
            Ok(GuaranteeSetting::Fixed(Guarantee::Recovery))
        );
        assert_eq!(
            GuaranteeSetting::parse("at_least_once"),
            Ok(GuaranteeSetting::Fixed(Guarantee::AtLeastOnce))
        );
        let error = GuaranteeSetting::parse("twice").unwrap_err();
        assert!(
            error.contains("`twice`") && error.contains("exactly_once"),
            "{error}"
        );
    }

    #[test]
    fn reads_the_api_keys_of_an_api_versions_response() {
        let mut body = 7i32.to_be_bytes().to_vec();
        body.extend_from_slice(&0i16.to_be_bytes());
        body.extend_from_slice(&2i32.to_be_bytes());
        for (key, min, max) in [(0i16, 0i16, 9i16), (END_TXN, 0, 4)] {
            for v in [key, min, max] {
                body.extend_from_slice(&v.to_be_bytes());
            }
        }
        assert_eq!(parse_api_versions(&body, 7), Ok(vec![0, END_TXN]));
        assert!(
            parse_api_versions(&body, 8).is_err(),
            "another request's answer"
        );
        assert!(
            parse_api_versions(&body[..body.len() - 1], 7).is_err(),
            "truncated"
        );
    }

    #[test]
    fn the_request_is_an_api_versions_v0_request_with_its_size_first() {
        let request = api_versions_request(7);
        let size = i32::from_be_bytes(request[..4].try_into().unwrap()) as usize;
        assert_eq!(size, request.len() - 4);
        assert_eq!(&request[4..6], &API_VERSIONS.to_be_bytes());
        assert_eq!(&request[6..8], &0i16.to_be_bytes());
    }

    /// What makes `auto` ask again rather than settle on `recovery`: the coordinator
    /// loading, moving or away, a leader election, timeouts, brokers away; not a refusal.
    #[test]
    fn probe_errors_that_may_pass_on_another_try_are_transient() {
        use RDKafkaErrorCode as C;
        for code in [
            C::CoordinatorLoadInProgress,
            C::CoordinatorNotAvailable,
            C::NotCoordinator,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::RequestTimedOut,
            C::OperationTimedOut,
            C::MessageTimedOut,
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::ConcurrentTransactions,
            C::NotEnoughReplicas,
        ] {
            assert!(transient_code(code), "{code:?}");
            let e = probe_error("init_transactions", &KafkaError::Flush(code));
            assert!(matches!(e, ProbeError::Transient(_)), "{code:?}: {e:?}");
        }
        for code in [
            C::UnsupportedVersion,
            C::InvalidTransactionTimeout,
            C::InvalidConfig,
            C::ProducerFenced,
            C::Fatal,
            C::NotImplemented,
        ] {
            assert!(!transient_code(code), "{code:?}");
            let e = probe_error("abort_transaction", &KafkaError::Flush(code));
            assert!(matches!(e, ProbeError::Refused(_)), "{code:?}: {e:?}");
        }
        // A missing ACL is neither: it fails the start, naming it.
        for code in [
            C::TransactionalIdAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::TopicAuthorizationFailed,
        ] {
            let e = probe_error("init_transactions", &KafkaError::Flush(code));
            assert!(matches!(e, ProbeError::Denied(_)), "{code:?}: {e:?}");
        }
        let e = probe_error(
            "end offset of s/0",
            &KafkaError::MetadataFetch(C::CoordinatorLoadInProgress),
        );
        assert!(
            matches!(&e, ProbeError::Transient(m) if m.starts_with("end offset of s/0")),
            "{e:?}"
        );
    }

    /// A broker on `127.0.0.1` that answers every ApiVersions request listing EndTxn.
    fn lists_end_txn() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 4];
                let _ = stream.read_exact(&mut request);
                let mut body = vec![0u8; i32::from_be_bytes(request) as usize];
                let _ = stream.read_exact(&mut body);
                let mut answer = 7i32.to_be_bytes().to_vec();
                answer.extend_from_slice(&0i16.to_be_bytes());
                answer.extend_from_slice(&1i32.to_be_bytes());
                for v in [END_TXN, 0, 4] {
                    answer.extend_from_slice(&v.to_be_bytes());
                }
                let mut framed = (answer.len() as i32).to_be_bytes().to_vec();
                framed.extend_from_slice(&answer);
                let _ = stream.write_all(&framed);
            }
        });
        addr
    }

    /// `auto` asks again while the probe fails for a transient reason, and fails the start
    /// at the deadline rather than choose `recovery`; a refusal is `recovery` at once.
    #[test]
    fn auto_asks_again_after_a_transient_failure_and_never_takes_it_for_no_transactions() {
        let broker = lists_end_txn();
        let later = || std::time::Instant::now() + Duration::from_secs(30);
        let mut tries = 0;
        let chosen = choose_auto(&broker, true, later(), || {
            tries += 1;
            match tries {
                1 => Err(ProbeError::Transient(
                    "init_transactions: Coordinator load in progress".into(),
                )),
                _ => Ok(()),
            }
        });
        assert_eq!(
            (chosen.map(|c| c.0), tries),
            (Ok(Guarantee::ExactlyOnce), 2)
        );

        let started = std::time::Instant::now();
        let deadline = started + Duration::from_millis(1500);
        let e = choose_auto(&broker, true, deadline, || {
            Err(ProbeError::Transient("flush: Local: Timed out".into()))
        })
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(1500));
        assert!(
            e.contains("WATCHBRIDGE_START_TIMEOUT")
                && e.contains("flush: Local: Timed out")
                && e.contains("WATCHBRIDGE_GUARANTEE"),
            "{e}"
        );

        let mut tries = 0;
        let chosen = choose_auto(&broker, true, later(), || {
            tries += 1;
            Err(ProbeError::Refused(
                "the broker hands an aborted record to a read_committed reader".into(),
            ))
        });
        let (chosen, why) = chosen.unwrap();
        assert_eq!((chosen, tries), (Guarantee::Recovery, 1));
        assert!(why.unwrap().contains("aborted record"));
    }

    /// On a TLS or SASL listener the probe alone answers (issue 47: `auto` took `recovery`
    /// there without asking); a missing ACL fails the start rather than pick a mode.
    #[test]
    fn a_secured_listener_is_asked_by_the_probe_and_a_denial_is_no_choice() {
        // No broker at this address: the ApiVersions request must not be sent.
        let nowhere = "127.0.0.1:1";
        let later = std::time::Instant::now() + Duration::from_secs(30);
        assert_eq!(
            choose_auto(nowhere, false, later, || Ok(())),
            Ok((Guarantee::ExactlyOnce, None))
        );
        let e = choose_auto(nowhere, false, later, || {
            Err(ProbeError::Denied(
                "init_transactions: Broker: Transactional Id authorization failed".into(),
            ))
        })
        .unwrap_err();
        assert!(
            e.contains("Transactional Id authorization failed")
                && e.contains("watchbridge-<WATCHBRIDGE_GROUP_ID>-")
                && e.contains("WATCHBRIDGE_GUARANTEE=recovery"),
            "{e}"
        );
    }

    #[test]
    fn a_closed_port_is_an_error_naming_the_address() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let error =
            broker_supports_transactions(&format!("127.0.0.1:{port}"), Duration::from_millis(500))
                .unwrap_err();
        assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
    }
}

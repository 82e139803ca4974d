//! What differs between the two test brokers, pinned (docs/brokers.md): run on each
//! (`WATCHBRIDGE_TEST_BROKER=tansu|kafka`), every test asserts what *that* broker does, so a
//! Tansu release that gains transactions or compaction, or a Kafka setting that loses them,
//! fails here rather than silently changing what the other tests prove.
//!
//! - Transactions: on Apache Kafka an rdkafka transactional producer commits (a
//!   `read_committed` consumer sees the committed records, not an aborted one); on Tansu 0.6
//!   committing fails with an error naming EndTxn (`/work/shared/notes/tansu-0.6.md`), and
//!   yet a `read_committed` consumer reads the record of that failed transaction.
//! - Compaction: on Apache Kafka the log cleaner removes superseded values and, after
//!   `delete.retention.ms`, tombstones; on Tansu nothing is removed.
//! - DescribeConfigs: both describe a topic's `cleanup.policy` as created; for a topic
//!   created without one, Kafka describes its default (`delete`), Tansu nothing.

mod support;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::kafka::{broker, BrokerKind};

const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// Every record of the single-partition `topic` that a consumer with `isolation` reads from
/// the beginning within `window`, as (key, value) text.
fn read_all(topic: &str, isolation: &str, window: Duration) -> Vec<(String, String)> {
    let consumer: BaseConsumer = broker()
        .config()
        .set("group.id", format!("{topic}-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("create a consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + window;
    let mut read = Vec::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => read.push(text(&m.detach())),
            Some(Err(e)) => panic!("read {topic} ({isolation}): {e}"),
            None => {}
        }
    }
    read
}

fn text(m: &OwnedMessage) -> (String, String) {
    let s = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
    (
        s(m.key()).unwrap_or_default(),
        s(m.payload()).unwrap_or_else(|| "<tombstone>".into()),
    )
}

/// One transaction: begin, send `values` (key `k`), then commit or abort. The first step
/// that fails, named, with its error.
fn transaction(
    producer: &BaseProducer,
    topic: &str,
    values: &[&str],
    commit: bool,
) -> Result<(), String> {
    producer
        .begin_transaction()
        .map_err(|e| format!("begin_transaction: {e}"))?;
    for value in values {
        producer
            .send(BaseRecord::to(topic).key("k").payload(*value))
            .map_err(|(e, _)| format!("send: {e}"))?;
    }
    // Delivered (or failed) first: an abort does not wait for delivery reports.
    producer
        .flush(TXN_TIMEOUT)
        .map_err(|e| format!("flush: {e}"))?;
    if commit {
        producer
            .commit_transaction(TXN_TIMEOUT)
            .map_err(|e| format!("commit_transaction: {e}"))
    } else {
        producer
            .abort_transaction(TXN_TIMEOUT)
            .map_err(|e| format!("abort_transaction: {e}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transactions_commit_on_kafka_and_fail_at_end_txn_on_tansu() {
    let b = broker();
    let topic = b.unique_topic("txn");
    b.create_topic(&topic, 1).await;
    let producer: BaseProducer = b
        .config()
        .set("transactional.id", format!("{topic}-producer"))
        .set("message.timeout.ms", "15000")
        .set("transaction.timeout.ms", "15000")
        .create()
        .expect("create a transactional producer");
    let init = producer.init_transactions(TXN_TIMEOUT);
    match b.kind() {
        BrokerKind::Kafka => {
            init.expect("init_transactions on Kafka");
            transaction(&producer, &topic, &["committed-1"], true).expect("first transaction");
            transaction(&producer, &topic, &["aborted"], false).expect("aborted transaction");
            transaction(&producer, &topic, &["committed-2", "committed-3"], true)
                .expect("third transaction");
            let value = |read: Vec<(String, String)>| -> Vec<String> {
                read.into_iter().map(|(_, v)| v).collect()
            };
            let committed = value(read_all(&topic, "read_committed", Duration::from_secs(3)));
            assert_eq!(
                committed,
                ["committed-1", "committed-2", "committed-3"],
                "a read_committed consumer sees the committed records only"
            );
            // The aborted record was written all the same: an uncommitted read sees it.
            let uncommitted = value(read_all(&topic, "read_uncommitted", Duration::from_secs(3)));
            assert_eq!(
                uncommitted,
                ["committed-1", "aborted", "committed-2", "committed-3"]
            );
        }
        BrokerKind::Tansu => {
            // init_transactions succeeds, so it is no test of support; committing is.
            let outcome = init
                .map_err(|e| format!("init_transactions: {e}"))
                .and_then(|()| transaction(&producer, &topic, &["never-committed"], true));
            let error = outcome.expect_err(
                "a transaction committed on Tansu: it gained transactions, update \
                 docs/brokers.md and this test",
            );
            assert!(
                error.contains("EndTxn"),
                "on Tansu committing should fail naming EndTxn, got: {error}"
            );
            eprintln!("tansu: {error}");
            // And the record of that failed transaction is there for a read_committed
            // consumer all the same: Tansu neither commits nor hides transactional records.
            let committed = read_all(&topic, "read_committed", Duration::from_secs(2));
            assert_eq!(
                committed,
                [("k".to_string(), "never-committed".to_string())],
                "on Tansu a read_committed consumer sees the failed transaction's record"
            );
        }
    }
}

/// Topic configs that make Kafka's cleaner take a segment almost at once: segments roll
/// after 100 ms (on the next append), any dirty share is enough, tombstones go 1 s after
/// they were cleaned once.
const EAGER_COMPACTION: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "100"),
    ("min.cleanable.dirty.ratio", "0.01"),
    ("delete.retention.ms", "1000"),
    ("min.compaction.lag.ms", "0"),
];

#[tokio::test(flavor = "multi_thread")]
async fn the_log_cleaner_compacts_on_kafka_and_never_runs_on_tansu() {
    let b = broker();
    let topic = b.unique_topic("compacted");
    b.create_topic_with(&topic, 1, EAGER_COMPACTION).await;
    let producer: FutureProducer = b
        .config()
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .set("message.timeout.ms", "15000")
        .create()
        .expect("create a producer");
    let send = |key: String, value: Option<String>| {
        let producer = &producer;
        let topic = &topic;
        async move {
            let mut record = FutureRecord::<String, String>::to(topic).key(&key);
            if let Some(value) = &value {
                record = record.payload(value);
            }
            producer
                .send(record, Duration::from_secs(15))
                .await
                .unwrap_or_else(|(e, _)| panic!("produce {key} to {topic}: {e}"));
        }
    };
    // Keys k0..k9, three values each, then tombstones for k0..k4.
    let mut written = 0;
    for version in 1..=3 {
        for k in 0..10 {
            send(format!("k{k}"), Some(format!("v{version}"))).await;
            written += 1;
        }
    }
    for k in 0..5 {
        send(format!("k{k}"), None).await;
        written += 1;
    }
    // Compacted: k5..k9 with v3 only; k0..k4 gone once their tombstones are.
    let compacted: BTreeMap<String, String> = (5..10)
        .map(|k| (format!("k{k}"), "v3".to_string()))
        .collect();

    // The cleaner never takes the active segment: keep appending (one key, superseded
    // each time) so that segments roll, and read the topic from its beginning meanwhile.
    let window = match b.kind() {
        BrokerKind::Kafka => Duration::from_secs(60),
        // Long enough for Kafka's cleaner to have done it several times over.
        BrokerKind::Tansu => Duration::from_secs(10),
    };
    let started = Instant::now();
    let mut filler = 0;
    let mut records = Vec::new();
    while started.elapsed() < window {
        send("filler".into(), Some(format!("f{filler}"))).await;
        filler += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if filler % 10 != 0 {
            continue;
        }
        records = b.read_to_end(&topic).await.iter().map(text).collect();
        let keyed: BTreeMap<String, String> = records
            .iter()
            .filter(|(k, _)| k.starts_with('k'))
            .cloned()
            .collect();
        let k_records = records.iter().filter(|(k, _)| k.starts_with('k')).count();
        if b.kind() == BrokerKind::Kafka && keyed == compacted && k_records == compacted.len() {
            eprintln!(
                "compacted after {:.1?}: {} records read of {} written",
                started.elapsed(),
                records.len(),
                written + filler
            );
            return;
        }
    }
    match b.kind() {
        BrokerKind::Kafka => panic!(
            "Kafka's log cleaner did not compact {topic} within {window:?}: read {} records \
             of {} written: {records:?}",
            records.len(),
            written + filler
        ),
        BrokerKind::Tansu => {
            let records: Vec<(String, String)> =
                b.read_to_end(&topic).await.iter().map(text).collect();
            assert_eq!(
                records.len(),
                written + filler,
                "Tansu removed records from a compacted topic: it compacts now, update \
                 docs/brokers.md and this test"
            );
            let tombstones = records.iter().filter(|(_, v)| v == "<tombstone>").count();
            assert_eq!(tombstones, 5, "every tombstone is still there");
        }
    }
}

/// DescribeConfigs, which the bridge uses to refuse a state topic that is not compacted
/// (`src/kafka/client.rs`): both brokers describe a topic's `cleanup.policy` as it was
/// created; for a topic created without one, Kafka describes its default (`delete`), Tansu
/// 0.6 nothing (the bridge then warns that it cannot check, and goes on).
#[tokio::test(flavor = "multi_thread")]
async fn both_brokers_describe_a_topics_cleanup_policy() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let b = broker();
    let admin: AdminClient<DefaultClientContext> = b.config().create().unwrap();
    let mut policies = Vec::new();
    for created in [Some("compact"), Some("delete"), None] {
        let topic = b.unique_topic("describe");
        match created {
            Some(policy) => {
                b.create_topic_with(&topic, 1, &[("cleanup.policy", policy)])
                    .await
            }
            None => b.create_topic(&topic, 1).await,
        }
        let described = admin
            .describe_configs(
                [&ResourceSpecifier::Topic(&topic)],
                &AdminOptions::new().request_timeout(Some(Duration::from_secs(15))),
            )
            .await
            .expect("DescribeConfigs");
        let resource = described.into_iter().next().unwrap().expect("the topic");
        policies.push(resource.get("cleanup.policy").and_then(|e| e.value.clone()));
    }
    println!("{:?}: {policies:?}", b.kind());
    assert_eq!(
        policies[..2],
        [Some("compact".into()), Some("delete".into())]
    );
}

//! The Kafka test fixture against the real broker (Tansu): what the bridge's Kafka tests will
//! rely on — topics created with their partitions, records round-tripping with keys, headers,
//! partitions and CreateTime timestamps, and consumer-group commits read back.

mod support;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;
use support::kafka::{broker, header, headers};

const WAIT: Duration = Duration::from_secs(20);
/// A header value that isn't UTF-8.
const BINARY: &[u8] = &[0, 159, 146, 150, 255];

#[tokio::test]
async fn creates_topics_with_their_partitions() {
    let b = broker();
    let topic = b.unique_topic("create");
    assert_eq!(b.partitions(&topic), None, "a fresh name isn't a topic yet");
    b.create_topic(&topic, 3).await;
    assert_eq!(b.partitions(&topic), Some(3));
    // Creating it again is fine (the fixture treats "already exists" as done).
    b.create_topic(&topic, 3).await;
    assert_ne!(b.unique_topic("create"), topic);
}

#[tokio::test]
async fn records_round_trip_with_keys_headers_partitions_and_timestamps() {
    let b = broker();
    let topic = b.unique_topic("roundtrip");
    b.create_topic(&topic, 3).await;

    // One or more records per partition, with explicit CreateTime timestamps.
    let sent = [
        Sent::new(
            0,
            Some(b"k0"),
            b"v0",
            &[("trace", b"t0")],
            1_600_000_000_000,
        ),
        Sent::new(
            1,
            Some(b"k1"),
            b"v1",
            &[("a", b"1"), ("b", BINARY), ("empty", b"")],
            1_600_000_000_001,
        ),
        Sent::new(2, None, b"no key", &[], 1_000),
        Sent::new(
            1,
            Some(b"k1"),
            b"v1 again",
            &[("a", b"2")],
            1_600_000_000_002,
        ),
    ];
    let mut next_offset = [0i64; 3];
    for r in &sent {
        let (p, offset) = b
            .produce_at(
                &topic,
                Some(r.partition),
                r.key,
                r.value,
                r.headers,
                r.timestamp,
            )
            .await;
        assert_eq!(p, r.partition);
        assert_eq!(
            offset, next_offset[p as usize],
            "offsets count from 0 per partition"
        );
        next_offset[p as usize] += 1;
    }

    let mut got = b.consume(&topic, sent.len(), WAIT).await;
    got.sort_by_key(|m| (m.partition(), m.offset()));
    let mut want: Vec<&Sent> = sent.iter().collect();
    want.sort_by_key(|r| r.partition); // stable: keeps send order within a partition
    for (m, r) in got.iter().zip(want) {
        assert_eq!(m.topic(), topic);
        assert_eq!(m.partition(), r.partition);
        assert_eq!(m.key(), r.key);
        assert_eq!(m.payload(), Some(r.value));
        assert_eq!(m.timestamp(), Timestamp::CreateTime(r.timestamp));
        let expected: Vec<(String, Vec<u8>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        assert_eq!(headers(m), expected, "headers of {:?}", m.payload());
    }
    assert_eq!(header(&got[1], "b"), Some(BINARY));
    assert_eq!(header(&got[1], "empty"), Some(&b""[..]));
    assert_eq!(header(&got[1], "missing"), None);

    // Nothing beyond what was sent (the topic read to its end offsets), and reading again
    // starts from the beginning again.
    let again = b.read_to_end(&topic).await;
    assert_eq!(again.len(), sent.len());
}

#[tokio::test]
async fn produce_without_partition_uses_the_key_and_a_current_timestamp() {
    let b = broker();
    let topic = b.unique_topic("keyed");
    b.create_topic(&topic, 3).await;
    let before = now_ms();
    let (p1, _) = b.produce(&topic, None, Some(b"same"), b"1", &[]).await;
    let (p2, _) = b.produce(&topic, None, Some(b"same"), b"2", &[]).await;
    assert_eq!(p1, p2, "one key, one partition");

    let got = b.consume(&topic, 2, WAIT).await;
    assert_eq!(
        got.iter().map(|m| m.payload().unwrap()).collect::<Vec<_>>(),
        [b"1", b"2"]
    );
    for m in &got {
        assert_eq!(m.partition(), p1);
        match m.timestamp() {
            Timestamp::CreateTime(ts) => assert!(ts >= before && ts <= now_ms(), "{ts}"),
            other => panic!("expected CreateTime, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn consumer_group_commits_are_read_back() {
    let b = broker();
    let topic = b.unique_topic("commits");
    let group = b.unique_topic("group");
    b.create_topic(&topic, 2).await;
    assert_eq!(
        b.committed(&group, &topic, 2),
        [-1, -1],
        "nothing committed yet"
    );

    for (partition, n) in [(0, 3), (1, 2)] {
        for i in 0..n {
            b.produce(
                &topic,
                Some(partition),
                None,
                format!("{i}").as_bytes(),
                &[],
            )
            .await;
        }
    }

    // A real group member, as the bridge will be: subscribe, read everything, commit.
    let consumer: StreamConsumer = b
        .config()
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    for _ in 0..5 {
        tokio::time::timeout(WAIT, consumer.recv())
            .await
            .expect("group member reads the records")
            .unwrap();
    }
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    assert_eq!(b.committed(&group, &topic, 2), [3, 2]);

    // An explicit commit (here: rewinding partition 0) replaces the offset.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(1))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
    assert_eq!(b.committed(&group, &topic, 2), [1, 2]);
    drop(consumer);

    // Other groups are untouched.
    assert_eq!(b.committed("other", &topic, 2), [-1, -1]);
}

/// A record as the test sends it.
struct Sent<'a> {
    partition: i32,
    key: Option<&'a [u8]>,
    value: &'a [u8],
    headers: &'a [(&'a str, &'a [u8])],
    timestamp: i64,
}

impl<'a> Sent<'a> {
    fn new(
        partition: i32,
        key: Option<&'a [u8]>,
        value: &'a [u8],
        headers: &'a [(&'a str, &'a [u8])],
        timestamp: i64,
    ) -> Self {
        Self {
            partition,
            key,
            value,
            headers,
            timestamp,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

//! State format upgrades (issue 48, item 2): a state record written by a newer format version
//! stops its partition (fail closed: nothing read, committed or written there, the record
//! kept) until an instance that reads it takes the partition, while the other partitions
//! work; and the version-1 records of a real bridge, pinned in `tests/fixtures/state-v1.json`,
//! are restored by this build.
//!
//! Runs on Tansu (default) and on Apache Kafka (`WATCHBRIDGE_TEST_BROKER=kafka`).

mod support;

use bytes::Bytes;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::kafka::broker;
use support::ops_client::Ops;
use support::scenario::{
    assert_each_once, finished_feeds, free_port, output_key_counts, outputs_to_end,
    produce_user_to, user_output_keys, wait_for_outputs, Setup,
};
use watchbridge::state::{state_key, Part, WatchRecord, FORMAT_VERSION};

/// Produce one record (`value: None`: a tombstone) to `partition`; its offset.
async fn produce(topic: &str, partition: i32, key: &[u8], value: Option<&[u8]>) -> i64 {
    static PRODUCER: OnceLock<FutureProducer> = OnceLock::new();
    let producer = PRODUCER.get_or_init(|| {
        broker()
            .config()
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "15000")
            .create()
            .expect("create a producer")
    });
    let mut record = FutureRecord::<[u8], [u8]>::to(topic)
        .partition(partition)
        .key(key);
    if let Some(value) = value {
        record = record.payload(value);
    }
    match producer.send(record, Duration::from_secs(15)).await {
        Ok(delivery) => delivery.offset,
        Err((e, _)) => panic!("produce to {topic}/{partition}: {e}"),
    }
}

/// The state topic the bridge of `s` uses (`<group>.state`), made before it starts as the
/// bridge makes it (compacted, as many partitions as the input topic).
async fn create_state_topic(s: &Setup, partitions: i32) -> String {
    let topic = format!("{}.state", s.group);
    broker()
        .create_topic_with(&topic, partitions, &[("cleanup.policy", "compact")])
        .await;
    topic
}

/// Poll `/readyz` until `done` holds for its answer, or panic with the bridge's log.
async fn wait_for_readyz(
    ops: &Ops,
    bridge: &Bridge,
    within: Duration,
    done: impl Fn(&(u16, String)) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + within;
    loop {
        let answer = ops.get("/readyz").await;
        if let Some(answer) = answer.as_ref().filter(|a| done(a)) {
            return answer.clone();
        }
        assert!(
            Instant::now() < deadline,
            "/readyz answered {answer:?}; bridge log:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A watch record as the next format version would write it: a real version-1 record's
/// bytes with the version byte set to one more.
fn next_version_record(user: i64) -> (Vec<u8>, Vec<u8>) {
    let key = format!("user-{user}");
    let record = WatchRecord {
        watch_key: Bytes::from(key.clone()),
        input_key: Some(Bytes::from(key.clone())),
        input_value: Bytes::from(format!(r#"{{"id":{user}}}"#)),
        input_time: 1_796_000_000_000,
        arrived: 1_796_000_000_100,
        last_new: 1_796_000_000_100,
        polls: 3,
        hold: 1_796_000_000_000,
        next_poll: 1_796_000_000_200,
        empty_streak: 0,
        failures: 0,
        seen_chunks: 0,
        finished: None,
        resume: None,
        conditions: None,
    };
    let mut value = record.to_entry().unwrap().value;
    assert_eq!(value[0], FORMAT_VERSION);
    value[0] = FORMAT_VERSION + 1;
    (state_key(key.as_bytes(), Part::Watch), value)
}

/// The line of `log` that contains `text` (or panics with the log).
fn line_with<'a>(log: &'a str, text: &str) -> &'a str {
    log.lines()
        .find(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no log line says {text:?}:\n{log}"))
}

/// A state record of the next format version for a watch of input partition 1 (`user-5`):
/// the bridge keeps partition 1 stopped — its watch does not run, its input is not committed,
/// `/readyz` answers 503 naming it, an ERROR names both versions, the record, the watch key
/// and the state partition — while partition 0 works; the record is still the latest of its
/// key on the state topic once the bridge stopped (nothing was written to state partition
/// 1). Then, the record deleted (as a roll forward would make it readable), the same running
/// bridge recovers partition 1 within its backoff, and user-5's watch emits its outputs once.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_of_a_newer_format_stops_its_partition_until_it_can_be_read() {
    const P: i32 = 1;
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("upgrade-newer", 2).await;
    let state = create_state_topic(&s, 2).await;
    let (key, value) = next_version_record(5);
    let at = produce(&state, P, &key, Some(&value)).await;
    produce_user_to(&s.input, Some(0), 1).await;
    produce_user_to(&s.input, Some(P), 5).await;

    let port = free_port();
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let ops = Ops::new(port);
    let mut bridge = Bridge::start(&env);

    // Partition 0 works: its watch emits, and its input is committed.
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while broker().committed(&s.group, &s.input, 2)[0] < 1 {
        assert!(
            Instant::now() < deadline,
            "partition 0's input not committed:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Partition 1 stays stopped, and says why.
    let (status, body) = wait_for_readyz(&ops, &bridge, Duration::from_secs(30), |(_, body)| {
        body.contains(&format!("input partition {P}"))
    })
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("version 2"), "{body}");
    let log = bridge.log();
    let error = line_with(&log, "was written by state format version 2");
    for wanted in [
        "ERROR",
        "this build reads version 1",
        "user-5",
        &String::from_utf8_lossy(&key),
        &format!("{state}/{P}"),
        "docs/operations.md#upgrading",
    ] {
        assert!(error.contains(wanted), "{wanted:?} not in {error}");
    }
    let delayed = "watchbridge_partition_restarts_delayed_total{reason=\"newer_state\"}";
    assert!(
        ops.metric(delayed).await.is_some_and(|n| n >= 1.0),
        "{delayed}:\n{}",
        ops.get("/metrics").await.unwrap_or_default().1
    );
    // Its backoff passes at least once more: still stopped.
    bridge.wait_for_log_count(
        "was written by state format version 2",
        2,
        Duration::from_secs(30),
    );
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&outputs),
        user_output_keys([1]),
        &bridge.log(),
    );
    assert_eq!(
        broker().committed(&s.group, &s.input, 2)[P as usize],
        -1,
        "partition {P}'s input was committed:\n{}",
        bridge.log()
    );
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());

    // Nothing was written to state partition 1: the record is there, the latest of its key.
    let on_p: Vec<_> = broker()
        .read_to_end(&state)
        .await
        .into_iter()
        .filter(|m| m.partition() == P)
        .collect();
    let written: Vec<(i64, Vec<u8>)> = on_p
        .iter()
        .map(|m| (m.offset(), m.key().unwrap_or_default().to_vec()))
        .collect();
    assert_eq!(written, vec![(at, key.clone())], "state partition {P}");
    assert_eq!(on_p[0].payload(), Some(&value[..]));

    // Rolled forward: the record deleted while a bridge waits to read it. The same bridge
    // recovers the partition within its backoff; the watch emits its outputs once.
    let port = free_port();
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let ops = Ops::new(port);
    let mut bridge = Bridge::start(&env);
    bridge.wait_for_log("was written by state format version 2", Duration::from_secs(60));
    produce(&state, P, &key, None).await;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    wait_for_readyz(&ops, &bridge, Duration::from_secs(30), |(status, _)| {
        *status == 200
    })
    .await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(
        &output_key_counts(&outputs),
        user_output_keys([1, 5]),
        &bridge.log(),
    );
}

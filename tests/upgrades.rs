//! State format upgrades (issue 48, item 2): a state record written by a newer format version
//! stops its partition (fail closed: nothing read, committed or written there, the record
//! kept) until an instance that reads it takes the partition, while the other partitions
//! work; and the version-1 records of a real bridge, pinned in `tests/fixtures/state-v1.json`,
//! are restored by this build.
//!
//! Runs on Tansu (default; `recovery`) and on Apache Kafka (`WATCHBRIDGE_TEST_BROKER=kafka`;
//! the newer-version test in `exactly_once`, which `auto` picks there). ~7 s on Tansu, ~15 s
//! on Kafka (after its start), two cores.

mod support;

use bytes::Bytes;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use serde_json::{json, Value};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::{Reply, Seen, TestServer};
use support::kafka::broker;
use support::ops_client::Ops;
use support::scenario::{
    assert_each_once, finished_feeds, free_port, output_key_counts, outputs_to_end,
    produce_user_to, user_output_keys, wait_for_outputs, Setup,
};
use watchbridge::state::{decode_entry, state_key, Entry, Part, WatchRecord, FORMAT_VERSION};

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
    ops.wait_until(bridge, "/readyz", within, |a| a.is_some_and(&done))
        .await
        .expect("an answer that `done` took")
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
    // Never ready meanwhile, not even between a wait and the next attempt.
    let log = bridge.log();
    assert!(!log.contains("ready: partitions assigned"), "{log}");
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
    bridge.wait_for_log(
        "was written by state format version 2",
        Duration::from_secs(60),
    );
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

/// The golden records of format version 1: what a real bridge wrote (below).
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/state-v1.json");

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The event time of the fixture feeds' items.
const T0: i64 = 1_796_000_000_000;

/// User 7's feed goes on (its items `u7-a`, `u7-b`, and with `more` `u7-c`); user 8's is
/// final after `u8-a`, `u8-b`.
fn fixture_feeds(seen: &Seen, more: bool) -> Reply {
    let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
    let mut events = vec![
        json!({"id": format!("u{user}-a"), "at": T0 + user * 1000}),
        json!({"id": format!("u{user}-b"), "at": T0 + user * 1000 + 500}),
    ];
    if more && user == 7 {
        events.push(json!({"id": "u7-c", "at": T0 + 7_900}));
    }
    Reply::json(json!({"events": events, "done": user == 8}))
}

/// Writes `tests/fixtures/state-v1.json` from a real bridge of this build: run it only to
/// make the fixture again for a new format version's reader test, never to "fix" the
/// restore test (`cargo test --test upgrades -- --ignored write_the_state_v1_fixture`).
/// A bridge (`recovery`, one partition) gets the inputs of user 7, whose feed goes on (a
/// live watch with a seen chunk), and user 8, whose feed is final (a finished watch); once
/// their four outputs are out and checkpointed, it stops; every record of its state topic,
/// in order, goes into the file.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "makes the fixture; not a test"]
async fn write_the_state_v1_fixture() {
    let server = TestServer::start(|seen| fixture_feeds(seen, false)).await;
    let s = Setup::new("fixture-v1", 1).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_GUARANTEE", "recovery".into()));
    produce_user_to(&s.input, Some(0), 7).await;
    produce_user_to(&s.input, Some(0), 8).await;
    let mut bridge = Bridge::start(&env);
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    // Checkpoints past the first outputs: user 7's progress and chunk, user 8's end.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let state = format!("{}.state", s.group);
    let records: Vec<Value> = broker()
        .read_to_end(&state)
        .await
        .iter()
        .filter(|m| m.key() != Some(b"~watchbridge-transaction-probe"))
        .map(|m| {
            let key = m.key().unwrap_or_default();
            let kind = match decode_entry(key, m.payload()).expect("this build reads it") {
                Entry::Watch(w) if w.finished.is_some() => "finished watch",
                Entry::Watch(_) => "live watch",
                Entry::Seen { .. } => "seen chunk",
                Entry::Tombstone { .. } | Entry::StartsDeleted { .. } => "tombstone",
                Entry::OutputOffsets(_) => "output offsets",
                Entry::Starts(_) => "starts",
                Entry::Mode(_) => "mode",
            };
            json!({
                "offset": m.offset(),
                "kind": kind,
                "key": String::from_utf8_lossy(key),
                "key_hex": hex(key),
                "value_hex": m.payload().map(hex),
            })
        })
        .collect();
    let fixture = json!({
        "about": "State records of format version 1 as a real bridge wrote them (one \
                  partition, WATCHBRIDGE_GUARANTEE=recovery): user-7's watch live with a seen \
                  chunk (outputs u7-a, u7-b), user-8's finished (u8-a, u8-b). Made by \
                  tests/upgrades.rs write_the_state_v1_fixture; read back by \
                  a_bridge_restores_the_state_of_format_version_1 and src/state/codec/tests.rs. \
                  Never edit: a format change gets a new version and keeps reading these.",
        "format_version": FORMAT_VERSION,
        "broker": broker().kind().name(),
        "outputs": ["u7-a", "u7-b", "u8-a", "u8-b"],
        "records": records,
    });
    let text = serde_json::to_string_pretty(&fixture).unwrap() + "\n";
    std::fs::create_dir_all(std::path::Path::new(FIXTURE).parent().unwrap()).unwrap();
    std::fs::write(FIXTURE, text).unwrap();
}

/// The state a bridge of format version 1 wrote (the golden records of
/// `tests/fixtures/state-v1.json`, produced to a new group's state topic) is restored by
/// this build: user 7's live watch goes on knowing its outputs (it emits only `u7-c`, new in
/// its feed), and user 8's finished watch is not started again, not even by its input
/// coming again. Pins format version 1: a change that cannot read it fails here.
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_restores_the_state_of_format_version_1() {
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).expect("the fixture")).unwrap();
    assert_eq!(fixture["format_version"], 1);
    let server = TestServer::start(|seen| fixture_feeds(seen, true)).await;
    let s = Setup::new("upgrade-v1", 1).await;
    let state = create_state_topic(&s, 1).await;
    let records = fixture["records"].as_array().unwrap();
    assert!(records.len() >= 5, "{records:?}");
    for r in records {
        let key = unhex(r["key_hex"].as_str().unwrap());
        let value = r["value_hex"].as_str().map(unhex);
        produce(&state, 0, &key, value.as_deref()).await;
    }
    // User 8's input again (a re-delivery): a finished watch is remembered.
    produce_user_to(&s.input, Some(0), 8).await;
    let port = free_port();
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_GUARANTEE", "recovery".into()));
    // The fixture's finished watch ended when it was made: remembered for longer than that.
    env.push(("WATCHBRIDGE_FINISHED_RETENTION", "100years".into()));
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let ops = Ops::new(port);
    let mut bridge = Bridge::start(&env);
    wait_for_outputs(&s.output, 1, Duration::from_secs(60)).await;
    wait_for_readyz(&ops, &bridge, Duration::from_secs(30), |(status, _)| {
        *status == 200
    })
    .await;
    // Polled again a few times, and user 8's input read and committed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while broker().committed(&s.group, &s.input, 1)[0] < 1 {
        assert!(
            Instant::now() < deadline,
            "user 8's input not committed:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let polled = server.requests().len();
    while server.requests().len() < polled + 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let log = bridge.log();
    assert!(
        log.contains("partition state restored partition=0 watches=1 finished=1"),
        "{log}"
    );
    assert!(log.contains("undecodable=0"), "{log}");
    let outputs = outputs_to_end(&s.output).await;
    assert_each_once(&output_key_counts(&outputs), ["u7-c"], &log);
    let asked: Vec<String> = server.requests().into_iter().map(|r| r.target).collect();
    assert!(asked.iter().all(|t| t == "/users/7/events"), "{asked:?}");
}

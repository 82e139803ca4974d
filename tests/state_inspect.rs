//! `watchbridge state inspect` against the test broker: records the test writes to a state
//! topic with the bridge's own encoders read back field by field (and filtered by `--key`
//! and `--partition`), its errors, and the state a real bridge wrote.

mod support;

use bytes::Bytes;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::kafka::broker;
use support::scenario::{feeds, produce_user, wait_for_outputs, Setup};
use watchbridge::state::{Finished, OutputOffsets, SeenChunk, Starts, WatchRecord};

/// The records' timestamps: 2026-11-30T00:53:20Z, plus the offset written at.
const TS: i64 = 1_796_000_000_000;

/// Produce one record (`value: None`: a tombstone) to `partition` with timestamp `ts`; its
/// offset.
async fn produce(topic: &str, partition: i32, key: &[u8], value: Option<&[u8]>, ts: i64) -> i64 {
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
        .key(key)
        .timestamp(ts);
    if let Some(value) = value {
        record = record.payload(value);
    }
    match producer.send(record, Duration::from_secs(15)).await {
        Ok(delivery) => delivery.offset,
        Err((e, _)) => panic!("produce to {topic}/{partition}: {e}"),
    }
}

/// `watchbridge state inspect --brokers <test broker> --topic <topic> <args>`: exit code,
/// stdout's lines parsed as JSON, stderr.
fn inspect(topic: &str, args: &[&str]) -> (i32, Vec<Value>, String) {
    inspect_at(broker().bootstrap(), topic, args)
}

fn inspect_at(brokers: &str, topic: &str, args: &[&str]) -> (i32, Vec<Value>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
            command.env_remove(name);
        }
    }
    let out = command
        .args(["state", "inspect", "--brokers", brokers, "--topic", topic])
        .args(args)
        .env("WATCHBRIDGE_LOG", "warn,librdkafka=off,rdkafka=off")
        .output()
        .expect("run watchbridge state inspect");
    let stdout = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}"))
        })
        .collect();
    (out.status.code().unwrap_or(-1), lines, stderr)
}

/// The lines by (partition, offset).
fn by_position(lines: &[Value]) -> BTreeMap<(i64, i64), &Value> {
    let map: BTreeMap<_, _> = lines
        .iter()
        .map(|l| {
            let at = (
                l["partition"].as_i64().unwrap(),
                l["offset"].as_i64().unwrap(),
            );
            (at, l)
        })
        .collect();
    assert_eq!(map.len(), lines.len(), "a record printed twice: {lines:#?}");
    map
}

fn rfc3339(ms: i64) -> String {
    watchbridge::pollers::event_time::format_rfc3339(ms)
}

fn watch_a() -> WatchRecord {
    let mut conditions = Vec::new();
    for (name, state) in [(&b"productive"[..], &[1u8, 0, 0, 0, 1][..]), (b"n2", b"")] {
        conditions.extend_from_slice(&(name.len() as u16).to_le_bytes());
        conditions.extend_from_slice(name);
        conditions.extend_from_slice(&(state.len() as u32).to_le_bytes());
        conditions.extend_from_slice(state);
    }
    WatchRecord {
        watch_key: Bytes::from_static(b"user-1"),
        input_key: Some(Bytes::from_static(b"user-1")),
        input_value: Bytes::from_static(br#"{"id":1,"name":"a"}"#),
        input_time: TS - 60_000,
        arrived: TS - 50_000,
        last_new: TS - 40_000,
        polls: 17,
        hold: TS - 30_000,
        next_poll: TS + 5_000,
        empty_streak: 3,
        failures: 2,
        seen_chunks: 2,
        finished: None,
        resume: Some(Bytes::from_static(br#"{"cursor":"c-9"}"#)),
        conditions: Some(conditions.into()),
    }
}

fn watch_b() -> WatchRecord {
    WatchRecord {
        watch_key: Bytes::from_static(&[0xff, 0x01, b'x']),
        input_key: None,
        input_value: Bytes::from_static(b"not json"),
        input_time: TS - 6_000,
        arrived: TS - 5_000,
        last_new: TS - 4_000,
        polls: 1,
        hold: TS - 3_000,
        next_poll: TS - 2_000,
        empty_streak: 0,
        failures: 0,
        seen_chunks: 0,
        finished: Some(Finished {
            at: TS - 1_000,
            reason: "stable".into(),
        }),
        resume: None,
        conditions: None,
    }
}

/// A live watch with no chunks, as a starts record lists it.
fn started(key: &'static [u8], polls: u64) -> WatchRecord {
    WatchRecord {
        watch_key: Bytes::from_static(key),
        input_key: Some(Bytes::from_static(key)),
        input_value: Bytes::from_static(b"{}"),
        input_time: TS,
        arrived: TS + 100,
        last_new: TS + 100,
        polls,
        hold: TS,
        next_poll: TS + 200,
        empty_streak: 0,
        failures: 0,
        seen_chunks: 0,
        finished: None,
        resume: None,
        conditions: None,
    }
}

/// Every kind of state record, written by the test with the bridge's encoders (and two that
/// are not state records), read back by `state inspect` field by field; `--hashes`, `--key`
/// and `--partition` choose what is printed.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_prints_what_was_written_to_the_state_topic_field_by_field() {
    let b = broker();
    let topic = b.unique_topic("inspect-state");
    b.create_topic(&topic, 2).await;

    // Partition 0: a watch, its two chunks, the output offsets, then chunk 1 deleted.
    let a = watch_a();
    let e = a.to_entry().unwrap();
    let a_at = produce(&topic, 0, &e.key, Some(&e.value), TS).await;
    let chunk0 = SeenChunk::new(0, vec![1, 2, 0xabc]).unwrap();
    let e = chunk0.to_entry(b"user-1").unwrap();
    let c0_at = produce(&topic, 0, &e.key, Some(&e.value), TS + 1).await;
    let chunk1 = SeenChunk::new(1, vec![u128::MAX]).unwrap();
    let e = chunk1.to_entry(b"user-1").unwrap();
    let c1_at = produce(&topic, 0, &e.key, Some(&e.value), TS + 2).await;
    let offsets = OutputOffsets {
        offsets: vec![(0, 12), (1, 7)],
    };
    let e = offsets.to_entry().unwrap();
    let oo_at = produce(&topic, 0, &e.key, Some(&e.value), TS + 3).await;
    let t_at = produce(&topic, 0, b"6:user-1/s/1", None, TS + 4).await;

    // Partition 1: a finished watch with a key that is not UTF-8, a starts record listing
    // user-1 and user-3, two records that do not decode, a deleted starts record.
    let wb = watch_b();
    let e = wb.to_entry().unwrap();
    let b_at = produce(&topic, 1, &e.key, Some(&e.value), TS + 10).await;
    let starts = Starts {
        seq: 1,
        watches: vec![started(b"user-3", 0), started(b"user-1", 0)],
    };
    let e = starts.to_entry().unwrap();
    let s_at = produce(&topic, 1, &e.key, Some(&e.value), TS + 11).await;
    let bad_at = produce(&topic, 1, b"6:user-1/w", Some(&[1, 9]), TS + 12).await;
    let junk_at = produce(&topic, 1, b"junk", Some(b"xyz"), TS + 13).await;
    let sd_at = produce(&topic, 1, b"~starts/1", None, TS + 14).await;

    let (code, lines, stderr) = inspect(&topic, &["--hashes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("10 records read") && stderr.contains("2 undecodable"),
        "{stderr}"
    );
    let at = by_position(&lines);
    assert_eq!(at.len(), 10, "{lines:#?}");
    let line = |p: i64, o: i64| *at.get(&(p, o)).unwrap_or_else(|| panic!("no line {p}:{o}"));

    let l = line(0, a_at);
    assert_eq!(l["timestamp_ms"], TS);
    assert_eq!(l["timestamp"], "2026-11-30T00:53:20Z");
    let w = &a;
    assert_eq!(
        *l,
        json!({
            "partition": 0, "offset": a_at, "timestamp": rfc3339(TS), "timestamp_ms": TS,
            "kind": "watch", "key": "user-1", "record_key": "6:user-1/w",
            "input_key": "user-1",
            "input_value": {"id": 1, "name": "a"}, "input_value_format": "json",
            "input_time": rfc3339(w.input_time), "input_time_ms": w.input_time,
            "arrived": rfc3339(w.arrived), "arrived_ms": w.arrived,
            "last_new": rfc3339(w.last_new), "last_new_ms": w.last_new,
            "polls": 17,
            "hold": rfc3339(w.hold), "hold_ms": w.hold,
            "next_poll": rfc3339(w.next_poll), "next_poll_ms": w.next_poll,
            "empty_streak": 3, "failures": 2, "seen_chunks": 2,
            "finished": null,
            // base64 of {"cursor":"c-9"}
            "resume": {"base64": "eyJjdXJzb3IiOiJjLTkifQ==", "text": r#"{"cursor":"c-9"}"#},
            "conditions": [
                {"name": "productive", "state_base64": "AQAAAAE="},
                {"name": "n2", "state_base64": ""},
            ],
        })
    );
    let l = line(0, c0_at);
    assert_eq!(l["kind"], "seen_chunk");
    assert_eq!(l["key"], "user-1");
    assert_eq!(l["record_key"], "6:user-1/s/0");
    assert_eq!(l["index"], 0);
    assert_eq!(l["hash_count"], 3);
    assert_eq!(
        l["hashes"],
        json!([
            "00000000000000000000000000000001",
            "00000000000000000000000000000002",
            "00000000000000000000000000000abc",
        ])
    );
    let l = line(0, c1_at);
    assert_eq!((&l["index"], &l["hash_count"]), (&json!(1), &json!(1)));
    assert_eq!(l["hashes"], json!(["f".repeat(32)]));
    let l = line(0, oo_at);
    assert_eq!(l["kind"], "output_offsets");
    assert_eq!(l["key"], Value::Null);
    assert_eq!(l["record_key"], "~output-offsets");
    assert_eq!(
        l["offsets"],
        json!([{"partition": 0, "offset": 12}, {"partition": 1, "offset": 7}])
    );
    let l = line(0, t_at);
    assert_eq!(l["kind"], "tombstone");
    assert_eq!(l["key"], "user-1");
    assert_eq!((&l["part"], &l["index"]), (&json!("seen_chunk"), &json!(1)));
    assert_eq!(l["timestamp_ms"], TS + 4);

    let l = line(1, b_at);
    assert_eq!(l["kind"], "watch");
    // base64 of ff 01 78
    assert_eq!(
        (&l["key"], &l["key_base64"]),
        (&json!("/wF4"), &json!(true))
    );
    assert_eq!(l["record_key_base64"], true);
    assert_eq!(l["input_key"], Value::Null);
    assert_eq!(l["input_value"], "not json");
    assert_eq!(l["input_value_format"], "text");
    assert_eq!(
        l["finished"],
        json!({"at": rfc3339(TS - 1_000), "at_ms": TS - 1_000, "reason": "stable"})
    );
    assert_eq!(
        (&l["resume"], &l["conditions"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(l["polls"], 1);
    let l = line(1, s_at);
    assert_eq!(l["kind"], "starts");
    assert_eq!(l["key"], Value::Null);
    assert_eq!(l["record_key"], "~starts/1");
    assert_eq!(l["seq"], 1);
    assert_eq!(l["member_count"], 2);
    let members: Vec<&Value> = l["members"].as_array().unwrap().iter().collect();
    assert_eq!(members[0]["key"], "user-3");
    assert_eq!(members[1]["key"], "user-1");
    assert_eq!(members[1]["arrived"], rfc3339(TS + 100));
    assert_eq!(members[1]["next_poll_ms"], TS + 200);
    assert!(l.get("member").is_none(), "{l}");
    let l = line(1, bad_at);
    assert_eq!(l["kind"], "undecodable");
    assert_eq!(l["key"], "user-1");
    assert_eq!(l["error"], "unknown state record type 9");
    assert_eq!(l["value_base64"], "AQk=");
    let l = line(1, junk_at);
    assert_eq!(l["kind"], "undecodable");
    assert_eq!(l["key"], Value::Null);
    assert_eq!(l["record_key"], "junk");
    assert!(
        l["error"].as_str().unwrap().contains("bad state key"),
        "{l}"
    );
    assert_eq!(l["value_base64"], "eHl6");
    let l = line(1, sd_at);
    assert_eq!(l["kind"], "tombstone");
    assert_eq!((&l["part"], &l["seq"]), (&json!("starts"), &json!(1)));

    // Without --hashes, only their count.
    let (code, lines, stderr) = inspect(&topic, &["--partition", "0"]);
    assert_eq!(code, 0, "{stderr}");
    let at = by_position(&lines);
    assert!(at[&(0, c0_at)].get("hashes").is_none());
    assert_eq!(at[&(0, c0_at)]["hash_count"], 3);
    // --partition: that partition's records, all of them.
    assert_eq!(
        at.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([(0, a_at), (0, c0_at), (0, c1_at), (0, oo_at), (0, t_at)])
    );
    let (code, lines, stderr) = inspect(&topic, &["--partition", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        by_position(&lines).keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([(1, b_at), (1, s_at), (1, bad_at), (1, junk_at), (1, sd_at)])
    );

    // --key: the watch's record, chunks and tombstone, the starts record that lists it
    // (with its member's fields), the undecodable record under its key; on both partitions.
    let (code, lines, stderr) = inspect(&topic, &["--key", "user-1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("10 records read from {topic}, 6 printed")),
        "{stderr}"
    );
    let at = by_position(&lines);
    assert_eq!(
        at.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            (0, a_at),
            (0, c0_at),
            (0, c1_at),
            (0, t_at),
            (1, s_at),
            (1, bad_at)
        ])
    );
    let member = &at[&(1, s_at)]["member"];
    assert_eq!(member["key"], "user-1");
    assert_eq!(member["input_value"], json!({}));
    assert_eq!(member["polls"], 0);
    assert_eq!(member["arrived_ms"], TS + 100);
    // Filters combine; a key nothing has prints nothing.
    let (code, lines, _) = inspect(&topic, &["--key", "user-1", "--partition", "1"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let (code, lines, _) = inspect(&topic, &["--key", "user-3"]);
    assert_eq!(code, 0);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["member"]["key"], "user-3");
    let (code, lines, stderr) = inspect(&topic, &["--key", "nobody"]);
    assert_eq!((code, lines.len()), (0, 0), "{stderr}");
}

/// An empty state topic prints nothing and ends at once; a missing topic, a partition it
/// does not have and brokers nobody listens on are errors naming the setting, exit 1.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_errors_name_the_setting_at_fault() {
    let b = broker();
    let topic = b.unique_topic("inspect-empty");
    b.create_topic(&topic, 3).await;
    let (code, lines, stderr) = inspect(&topic, &[]);
    assert_eq!((code, lines.len()), (0, 0), "{stderr}");
    assert!(stderr.contains("0 records read"), "{stderr}");

    let missing = b.unique_topic("inspect-missing");
    let (code, lines, stderr) = inspect(&missing, &[]);
    assert_eq!((code, lines.len()), (1, 0), "{stderr}");
    assert!(
        stderr.contains(&format!("error: topic {missing} (--topic) does not exist")),
        "{stderr}"
    );

    let (code, _, stderr) = inspect(&topic, &["--partition", "3"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--partition 3: topic") && stderr.contains("(it has 0, 1, 2)"),
        "{stderr}"
    );

    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("127.0.0.1:{port}");
    let (code, lines, stderr) = inspect_at(&nowhere, &topic, &[]);
    assert_eq!((code, lines.len()), (1, 0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "from the brokers {nowhere} (--brokers, WATCHBRIDGE_BROKERS)"
        )),
        "{stderr}"
    );
}

/// The state a real bridge wrote: its watch's latest record (its own, or a starts record's
/// member) holds the input it was started from and the polls it made; its seen chunk holds
/// both outputs; the partition's output offsets are there.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_reads_the_state_a_real_bridge_wrote() {
    // Never done: the watch keeps polling until the bridge stops.
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let s = Setup::new("inspect-bridge", 1).await;
    let mut bridge = Bridge::start(&s.env(&server));
    produce_user(&s.input, 7).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    // A few polls more, and a checkpoint after them (every 500 ms).
    let polled = std::time::Instant::now();
    while server
        .requests()
        .iter()
        .filter(|r| r.target.starts_with("/users/7/"))
        .count()
        < 3
    {
        assert!(
            polled.elapsed() < Duration::from_secs(30),
            "{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());

    let state = format!("{}.state", s.group);
    let (code, lines, stderr) = inspect(&state, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("0 undecodable"), "{stderr}\n{lines:#?}");
    assert!(
        lines.iter().any(|l| l["kind"] == "output_offsets"),
        "{lines:#?}"
    );
    // Every partition written records the writer's guarantee (what a start checks).
    let modes = ["exactly_once", "recovery", "at_least_once"];
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == "mode" && l["mode"].as_str().is_some_and(|m| modes.contains(&m))),
        "{lines:#?}"
    );
    let (code, lines, stderr) = inspect(&state, &["--key", "user-7"]);
    assert_eq!(code, 0, "{stderr}");
    let at = by_position(&lines);
    // The latest of its own records and the starts records listing it.
    let latest = at
        .values()
        .rev()
        .find(|l| l["kind"] == "watch" || l["kind"] == "starts")
        .unwrap_or_else(|| panic!("no record of user-7: {lines:#?}"));
    let w = if latest["kind"] == "starts" {
        &latest["member"]
    } else {
        latest
    };
    assert_eq!(w["key"], "user-7", "{lines:#?}");
    assert_eq!(w["input_key"], "user-7", "{w}");
    assert_eq!(w["input_value"], json!({"id": 7}), "{w}");
    assert_eq!(w["input_value_format"], "json", "{w}");
    assert!(w["polls"].as_u64().unwrap() > 0, "{w}");
    assert_eq!(w["finished"], Value::Null, "{w}");
    assert_eq!(w["seen_chunks"], 1, "{w}");
    assert!(
        w["arrived_ms"].as_i64().unwrap() <= w["next_poll_ms"].as_i64().unwrap(),
        "{w}"
    );
    // docs/operations.md's example line has the fields a real watch line has.
    let own = at
        .values()
        .find(|l| l["kind"] == "watch")
        .unwrap_or_else(|| panic!("no watch record of user-7: {lines:#?}"));
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let example: Value = docs
        .lines()
        .find(|l| l.starts_with(r#"{"partition":"#))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("docs/operations.md has an example line");
    let fields = |v: &Value| {
        v.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(fields(&example), fields(own), "{example}\n{own}");
    let chunk = at
        .values()
        .rev()
        .find(|l| l["kind"] == "seen_chunk" && l["index"] == 0)
        .unwrap_or_else(|| panic!("no seen chunk of user-7: {lines:#?}"));
    assert_eq!(chunk["hash_count"], 2, "{chunk}");
}

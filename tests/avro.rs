//! Avro and the schema registry end to end, on the real test broker, against records
//! written and read by another implementation: Python's `confluent-kafka` (its
//! `AvroSerializer`/`AvroDeserializer` with its real `SchemaRegistryClient`) and `fastavro`
//! (tests/python/avro_tool.py), through the in-memory registry the demo uses
//! (`watchbridge::avro::registry_server`).
//!
//! - Avro inputs (two writer schema versions mid-topic) with the event time in a field:
//!   Avro outputs a Python consumer decodes, each expected output once, watermarks driven
//!   by the field (never by the record timestamps), undecodable records dead-lettered with
//!   their reason.
//! - A registry outage: the inputs wait, nothing is dead-lettered or lost, and they go on
//!   when it is back.
//! - Bare datums of a fixed schema in, the user's output schema out: an item that does not
//!   fit goes to the dead-letter topic and the watch goes on.

mod support;

use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::{broker, header};
use support::python::avro_tool;
use support::scenario::partition_watermarks;
use watchbridge::avro::registry_server::RegistryServer;
use watchbridge::watermark::WatermarkMessage;

const HOUR: i64 = 3_600_000;
/// Outputs per user: each user's feed has this many events, final.
const EVENTS: i64 = 3;

const USER_V1: &str = r#"{"type": "record", "name": "User", "namespace": "test",
  "fields": [{"name": "id", "type": "long"},
             {"name": "joined", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}"#;
/// Version 2: a field added with a default (a compatible change).
const USER_V2: &str = r#"{"type": "record", "name": "User", "namespace": "test",
  "fields": [{"name": "id", "type": "long"},
             {"name": "joined", "type": {"type": "long", "logicalType": "timestamp-millis"}},
             {"name": "plan", "type": "string", "default": "free"}]}"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn write_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Python's `AvroDeserializer` reading `records`' values through `registry`: one JSON
/// value per record, in order.
fn python_decoded(registry: &RegistryServer, topic: &str, records: &[OwnedMessage]) -> Vec<Value> {
    let hex_values: Vec<String> = records.iter().map(|m| hex(m.payload().unwrap())).collect();
    let url = registry.url();
    avro_tool(
        &["deserialize", "--registry", &url, "--topic", topic],
        &hex_values,
    )
    .iter()
    .map(|line| serde_json::from_str(line).unwrap())
    .collect()
}

/// Python's `AvroSerializer` writing `records` (JSON) for `topic` with the schema in the
/// file `schema`, registering it in `registry`: one framed value per record.
fn python_serialized(
    registry: &RegistryServer,
    topic: &str,
    schema: &str,
    records: &[String],
) -> Vec<Vec<u8>> {
    let url = registry.url();
    avro_tool(
        &[
            "serialize",
            "--registry",
            &url,
            "--topic",
            topic,
            "--schema",
            schema,
        ],
        records,
    )
    .iter()
    .map(|h| unhex(h))
    .collect()
}

/// Produce `values` to partition 0 of `topic`, keyed `r<n>`, with the record timestamp
/// `record_time`.
async fn produce_all(topic: &str, values: &[Vec<u8>], record_time: i64) {
    for (n, value) in values.iter().enumerate() {
        let key = format!("r{n}");
        broker()
            .produce_at(
                topic,
                Some(0),
                Some(key.as_bytes()),
                value,
                &[],
                record_time,
            )
            .await;
    }
}

/// The joined time of user `id`: two hours ago plus `id` seconds, far from the record
/// timestamps (now), so a watermark shows which one drove it.
fn joined(base: i64, id: i64) -> i64 {
    base + id * 1000
}

/// Feeds: user `id` has events `<id>-0..` at its joined time + 1, 2, 3 s, final.
fn feeds(base: i64) -> impl Fn(&support::http_server::Seen) -> Reply {
    move |seen| {
        let id: i64 = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let events: Vec<Value> = (0..EVENTS)
            .map(|k| json!({"id": format!("{id}-{k}"), "at": joined(base, id) + (k + 1) * 1000, "n": k}))
            .collect();
        Reply::json(json!({"events": events, "done": true}))
    }
}

fn expected(base: i64, users: &[i64]) -> BTreeMap<String, i64> {
    users
        .iter()
        .flat_map(|&id| {
            (0..EVENTS).map(move |k| (format!("{id}-{k}"), joined(base, id) + (k + 1) * 1000))
        })
        .collect()
}

struct Topics {
    input: String,
    output: String,
    dlq: String,
    watermarks: String,
}

async fn topics(name: &str) -> Topics {
    let input = broker().unique_topic(name);
    broker().create_topic(&input, 1).await;
    Topics {
        output: format!("{input}-out"),
        dlq: format!("{input}.dlq"),
        watermarks: format!("{input}-out.watermarks"),
        input,
    }
}

fn bridge_env(
    t: &Topics,
    server: &TestServer,
    registry: &RegistryServer,
) -> Vec<(&'static str, String)> {
    vec![
        ("WATCHBRIDGE_INPUT_TOPIC", t.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", t.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", format!("{}-group", t.input)),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
        ("WATCHBRIDGE_WATCH_KEY", "/id".into()),
        ("WATCHBRIDGE_INPUT_FORMAT", "avro".into()),
        ("WATCHBRIDGE_SCHEMA_REGISTRY_URL", registry.url()),
        // No idleness within the test: the watermark stays the one the inputs drove.
        ("WATCHBRIDGE_IDLE_TIMEOUT", "10m".into()),
    ]
}

/// The output topic's records up to its end offsets, watermark records left out.
async fn outputs(topic: &str) -> Vec<OwnedMessage> {
    broker()
        .read_to_end(topic)
        .await
        .into_iter()
        .filter(|m| header(m, "watchbridge-control").is_none())
        .collect()
}

/// Waits until `check` holds, for at most `within`; panics with `what` and the log if not.
async fn wait_until(
    bridge: &Bridge,
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_inputs_timed_by_a_field_become_avro_outputs_that_python_decodes() {
    let registry = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = topics("avro-e2e").await;
    let base = now_ms() - 2 * HOUR;
    let server = TestServer::start(feeds(base)).await;

    // Users 1-3 written with version 1 of the schema, 4-5 with version 2 (a new id), by
    // Python's AvroSerializer, which registers both under `<input>-value`.
    let lines = |ids: &[i64], v2: bool| -> Vec<String> {
        ids.iter()
            .map(|&id| {
                let mut r = json!({"id": id, "joined": joined(base, id)});
                if v2 {
                    r["plan"] = json!("pro");
                }
                r.to_string()
            })
            .collect()
    };
    let serialize = |schema: &str, ids: &[i64], v2: bool| {
        let file = write_file(&dir, if v2 { "v2.avsc" } else { "v1.avsc" }, schema);
        python_serialized(&registry, &t.input, &file, &lines(ids, v2))
    };
    let mut values = serialize(USER_V1, &[1, 2, 3], false);
    values.extend(serialize(USER_V2, &[4, 5], true));
    let ids: Vec<u32> = values
        .iter()
        .map(|v| u32::from_be_bytes(v[1..5].try_into().unwrap()))
        .collect();
    assert_eq!(values[0][0], 0, "the wire format's magic byte");
    assert_ne!(ids[0], ids[3], "version 2 has an id of its own: {ids:?}");
    // Records that must not become watches, each with its reason.
    let good = values.clone();
    let bad = [
        (br#"{"id": 9}"#.to_vec(), "not_avro"),
        (
            [&[0u8, 0, 0, 0x27, 0x0f][..], &good[0][5..]].concat(),
            "unknown_schema",
        ),
        (good[0][..good[0].len() - 3].to_vec(), "not_avro"),
    ];
    values.extend(bad.iter().map(|(v, _)| v.clone()));
    let record_time = now_ms();
    produce_all(&t.input, &values, record_time).await;

    let mut env = bridge_env(&t, &server, &registry);
    env.extend([
        ("WATCHBRIDGE_INPUT_TIME", "/joined".to_string()),
        ("WATCHBRIDGE_OUTPUT_FORMAT", "avro".to_string()),
    ]);
    let mut bridge = Bridge::start(&env);
    let want = expected(base, &[1, 2, 3, 4, 5]);
    // Every watch ended (its feed is final): the watermark is the largest joined time
    // minus the default bound of 5 s (and 1 ms, as Flink's bounded out-of-orderness).
    let watermark = joined(base, 5) - 5_000 - 1;
    wait_until(
        &bridge,
        Duration::from_secs(60),
        "every output and the final watermark",
        async || {
            let (n, w) = (
                outputs(&t.output).await.len(),
                partition_watermarks(&t.watermarks).await,
            );
            n >= want.len() && w.last() == Some(&watermark)
        },
    )
    .await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());

    // Python's AvroDeserializer reads every output through the same registry.
    let records = outputs(&t.output).await;
    let decoded = python_decoded(&registry, &t.output, &records);
    assert_eq!(decoded.len(), records.len());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (record, envelope) in records.iter().zip(&decoded) {
        let line = envelope.to_string();
        let key = envelope["key"].as_str().unwrap().to_string();
        let event_time = want
            .get(&key)
            .copied()
            .unwrap_or_else(|| panic!("unexpected output {line}"));
        let at = time::OffsetDateTime::parse(
            envelope["event_time"]
                .as_str()
                .unwrap_or_else(|| panic!("{line}")),
            &time::format_description::well_known::Iso8601::DEFAULT,
        )
        .unwrap();
        assert_eq!(
            (at.unix_timestamp_nanos() / 1_000_000) as i64,
            event_time,
            "{line}"
        );
        assert_eq!(record.timestamp().to_millis(), Some(event_time), "{line}");
        let item: Value = serde_json::from_str(envelope["item"].as_str().unwrap()).unwrap();
        assert_eq!(item["id"], json!(key), "{line}");
        *seen.entry(key).or_default() += 1;
    }
    let not_once: Vec<_> = want.keys().filter(|k| seen.get(*k) != Some(&1)).collect();
    assert!(
        not_once.is_empty(),
        "not exactly once: {not_once:?} (seen {seen:?})"
    );

    // The watermark followed the field: never near the record timestamps (now).
    let values = partition_watermarks(&t.watermarks).await;
    assert!(!values.is_empty());
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "went back: {values:?}"
    );
    assert!(
        values.iter().all(|&w| w <= watermark),
        "above the inputs' times: {values:?} (record time {record_time})"
    );

    // The bad records, dead-lettered with their reasons, in order.
    let dead = broker().read_to_end(&t.dlq).await;
    let kinds: Vec<String> = dead
        .iter()
        .map(|m| String::from_utf8_lossy(header(m, "watchbridge-error-kind").unwrap()).into_owned())
        .collect();
    assert_eq!(
        kinds,
        bad.iter().map(|(_, k)| k.to_string()).collect::<Vec<_>>(),
        "{}",
        bridge.log()
    );
    assert_eq!(
        dead[1].payload().unwrap(),
        &bad[1].0[..],
        "a dead letter keeps the value as it came"
    );
    // The output schema is registered under the topic strategy's subject.
    assert!(registry.requests_to(&format!("/subjects/{}-value", t.output)) > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_outage_pauses_the_inputs_and_loses_nothing() {
    let registry = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = topics("avro-outage").await;
    let base = now_ms() - HOUR;
    let server = TestServer::start(feeds(base)).await;
    let file = write_file(&dir, "v1.avsc", USER_V1);
    let lines: Vec<String> = (1..=3)
        .map(|id| json!({"id": id, "joined": joined(base, id)}).to_string())
        .collect();
    let values = python_serialized(&registry, &t.input, &file, &lines);
    produce_all(&t.input, &values, now_ms()).await;
    // The registry goes down before the bridge has seen any schema.
    registry.fail_with(Some(503));
    let before = registry.requests_to("/schemas/ids/");
    let mut env = bridge_env(&t, &server, &registry);
    // Shorter than the outage: a partition whose inputs wait for their schema is not idle
    // (it has inputs; their times are not known yet).
    env.push(("WATCHBRIDGE_IDLE_TIMEOUT", "1s".into()));
    let mut bridge = Bridge::start(&env);
    wait_until(
        &bridge,
        Duration::from_secs(30),
        "the bridge retrying the registry",
        async || registry.requests_to("/schemas/ids/") >= before + 3,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle: Vec<WatermarkMessage> = broker()
        .read_to_end(&t.watermarks)
        .await
        .iter()
        .filter_map(|m| WatermarkMessage::parse(m.payload()?).ok())
        .filter(|m| matches!(m, WatermarkMessage::Partition { idle: true, .. }))
        .collect();
    assert!(
        idle.is_empty(),
        "idle while inputs wait: {idle:?}\n{}",
        bridge.log()
    );
    assert!(
        outputs(&t.output).await.is_empty(),
        "an output without its input's schema?"
    );
    assert!(
        broker().read_to_end(&t.dlq).await.is_empty(),
        "an outage dead-lettered an input:\n{}",
        bridge.log()
    );
    assert!(
        bridge.log().contains("schema registry request failed"),
        "{}",
        bridge.log()
    );

    registry.fail_with(None);
    let want = expected(base, &[1, 2, 3]);
    wait_until(
        &bridge,
        Duration::from_secs(60),
        "the outputs once the registry is back",
        async || outputs(&t.output).await.len() >= want.len(),
    )
    .await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in outputs(&t.output).await {
        let item: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        *seen
            .entry(item["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        seen,
        want.keys()
            .map(|k| (k.clone(), 1))
            .collect::<BTreeMap<_, _>>()
    );
    assert!(broker().read_to_end(&t.dlq).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn bare_datums_in_and_the_users_schema_out_with_a_misfit_dead_lettered() {
    let registry = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = topics("avro-bare").await;
    let base = now_ms() - HOUR;
    // Event `n` = 1 of every user carries a string where the output schema wants a long.
    let server = TestServer::start(move |seen| {
        let id: i64 = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let events: Vec<Value> = (0..EVENTS)
            .map(|k| {
                let n = if k == 1 { json!("one") } else { json!(k) };
                json!({"id": format!("{id}-{k}"), "at": joined(base, id) + (k + 1) * 1000, "n": n})
            })
            .collect();
        Reply::json(json!({"events": events, "done": true}))
    })
    .await;
    let input_schema = write_file(&dir, "v1.avsc", USER_V1);
    let output_schema = write_file(
        &dir,
        "event.avsc",
        r#"{"type": "record", "name": "Event", "namespace": "test",
            "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"},
                       {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}"#,
    );
    let lines: Vec<String> = (1..=2)
        .map(|id| json!({"id": id, "joined": joined(base, id)}).to_string())
        .collect();
    let values: Vec<Vec<u8>> = avro_tool(&["schemaless", "--schema", &input_schema], &lines)
        .iter()
        .map(|h| unhex(h))
        .collect();
    produce_all(&t.input, &values, now_ms()).await;
    let mut env = bridge_env(&t, &server, &registry);
    env.extend([
        ("WATCHBRIDGE_INPUT_SCHEMA", input_schema.clone()),
        ("WATCHBRIDGE_INPUT_TIME", "/joined".to_string()),
        ("WATCHBRIDGE_OUTPUT_FORMAT", "avro".to_string()),
        ("WATCHBRIDGE_OUTPUT_SCHEMA", output_schema),
        ("WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY", "record".to_string()),
    ]);
    let mut bridge = Bridge::start(&env);
    wait_until(
        &bridge,
        Duration::from_secs(60),
        "the outputs and the dead letters",
        async || {
            outputs(&t.output).await.len() >= 4 && broker().read_to_end(&t.dlq).await.len() >= 2
        },
    )
    .await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());

    let records = outputs(&t.output).await;
    let decoded = python_decoded(&registry, &t.output, &records);
    let mut ids: Vec<&str> = decoded.iter().map(|v| v["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["1-0", "1-2", "2-0", "2-2"], "{decoded:?}");
    for v in &decoded {
        assert!(v["n"].is_i64(), "{v}");
    }
    // The misfits: on the dead-letter topic as JSON, with the place that did not fit.
    let dead = broker().read_to_end(&t.dlq).await;
    assert_eq!(dead.len(), 2, "{}", bridge.log());
    for m in &dead {
        assert_eq!(
            header(m, "watchbridge-error-kind"),
            Some(&b"not_in_schema"[..])
        );
        let error = String::from_utf8_lossy(header(m, "watchbridge-error").unwrap()).into_owned();
        assert!(error.contains("/n"), "{error}");
        let item: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        assert_eq!(item["n"], json!("one"));
    }
    assert!(
        registry.requests_to("/subjects/test.Event") > 0,
        "the record strategy's subject"
    );
}

/// A few bytes that declare a 100 MB string are refused under the bridge's own limit
/// (64 MiB, `formats::AVRO_MAX_ALLOCATION`), not apache-avro's default (512 MiB), which
/// would allocate them before finding the datum short.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_avro_length_is_dead_lettered_under_the_bridges_limit() {
    let registry = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = topics("avro-hostile").await;
    let server = TestServer::start(feeds(now_ms())).await;
    let schema = write_file(
        &dir,
        "name.avsc",
        r#"{"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]}"#,
    );
    // A string of 100,000,000 bytes, and nothing after it.
    let mut hostile = Vec::new();
    watchbridge::avro::wire::write_long(&mut hostile, 100_000_000);
    produce_all(&t.input, &[hostile], now_ms()).await;
    let mut env = bridge_env(&t, &server, &registry);
    env.push(("WATCHBRIDGE_INPUT_SCHEMA", schema));
    let mut bridge = Bridge::start(&env);
    wait_until(
        &bridge,
        Duration::from_secs(30),
        "the dead letter",
        async || !broker().read_to_end(&t.dlq).await.is_empty(),
    )
    .await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    let dead = broker().read_to_end(&t.dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "watchbridge-error-kind"),
        Some(&b"not_avro"[..])
    );
    let error =
        String::from_utf8_lossy(header(&dead[0], "watchbridge-error").unwrap()).into_owned();
    assert!(
        error.contains(&watchbridge::formats::AVRO_MAX_ALLOCATION.to_string()),
        "{error}"
    );
}

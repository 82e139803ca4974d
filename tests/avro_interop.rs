//! The in-memory schema registry (src/avro/registry_server.rs) against the real Python
//! Confluent client (confluent-kafka's `schema_registry` client, AvroSerializer and
//! AvroDeserializer, through tests/python/avro_tool.py): what the Python serializer
//! registers and frames, the registry resolves, and the Python deserializer reads back; a
//! new schema version gets a new id; fastavro's bare datums decode with apache-avro; an
//! outage reaches the Python client as an error. No Kafka broker; everything on loopback.
//! Each test prints (stderr) the registry paths the Python client asked for.

mod support;

use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::io::Write;
use std::process::Output;
use support::python::{avro_tool, run_avro_tool};
use watchbridge::avro::registry_server::RegistryServer;

/// The registry on a runtime of its own (the Python tools run from the test's thread).
struct Registry {
    // Dropped first: the server stops before its runtime goes.
    server: RegistryServer,
    runtime: tokio::runtime::Runtime,
    /// The requests the Python tool made (not the test's own checks).
    python_requests: RefCell<Vec<String>>,
}

impl Registry {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = {
            let _entered = runtime.enter();
            RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap()
        };
        Self {
            server,
            runtime,
            python_requests: RefCell::default(),
        }
    }

    /// [`avro_tool`], recording the requests it made.
    fn tool(&self, args: &[&str], stdin_lines: &[String]) -> Vec<String> {
        let before = self.server.requests() as usize;
        let out = avro_tool(args, stdin_lines);
        self.record_since(before);
        out
    }

    /// [`run_avro_tool`], recording the requests it made.
    fn tool_output(&self, args: &[&str], stdin_lines: &[String]) -> Output {
        let before = self.server.requests() as usize;
        let out = run_avro_tool(args, stdin_lines);
        self.record_since(before);
        out
    }

    fn record_since(&self, before: usize) {
        let log = self.server.request_log();
        self.python_requests
            .borrow_mut()
            .extend(log.into_iter().skip(before));
    }

    /// Status and JSON body of a GET.
    fn get(&self, path: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.server.url());
        self.runtime.block_on(async {
            let response = reqwest::get(url).await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                serde_json::from_str(&response.text().await.unwrap()).unwrap(),
            )
        })
    }

    /// Print what the Python client asked the registry for.
    fn log_requests(&self, test: &str) {
        eprintln!("{test}: the Python client asked the registry:");
        for request in self.python_requests.borrow().iter() {
            eprintln!("  {request}");
        }
    }
}

/// Version 1 of the test's record schema: the types whose JSON form avro_tool.py converts.
const EVENT_V1: &str = r#"{"type": "record", "name": "Event", "namespace": "watchbridge.test", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "payload", "type": "bytes"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}}
]}"#;

/// Version 2: a field added with a default (a backward-compatible change).
const EVENT_V2: &str = r#"{"type": "record", "name": "Event", "namespace": "watchbridge.test", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "payload", "type": "bytes"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "source", "type": "string", "default": "web"}
]}"#;

fn schema_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn lines(values: &[Value]) -> Vec<String> {
    values.iter().map(Value::to_string).collect()
}

fn inputs() -> Vec<Value> {
    vec![
        json!({"id": 1, "name": "ada", "at": 1796033100000_i64, "payload": "AAEC/w==", "note": null, "tags": ["a", "b"]}),
        json!({"id": -2, "name": "", "at": 0, "payload": "", "note": "héllo", "tags": []}),
    ]
}

/// The framing: magic byte 0, the schema id in 4 bytes big-endian, then the datum.
fn unframe(hex: &str) -> (u32, Vec<u8>) {
    let bytes = decode_hex(hex);
    assert!(bytes.len() >= 5, "too short for the wire format: {hex}");
    assert_eq!(bytes[0], 0, "magic byte of {hex}");
    let id = u32::from_be_bytes(bytes[1..5].try_into().unwrap());
    (id, bytes[5..].to_vec())
}

fn decode_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex {hex}");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect(hex))
        .collect()
}

fn canonical(text: &str) -> String {
    Schema::parse_str(text).unwrap().canonical_form()
}

#[allow(deprecated)] // apache-avro 0.22 deprecates it for GenericDatumReader; same decoding
fn decode_datum(schema: &Schema, datum: &[u8]) -> Avro {
    let mut reader = datum;
    let value = apache_avro::from_avro_datum(schema, &mut reader, None).unwrap();
    assert!(
        reader.is_empty(),
        "{} bytes left after the datum",
        reader.len()
    );
    value
}

/// Version 1 records as Rust decodes them.
fn expected_v1_values() -> Vec<Avro> {
    let record =
        |id: i64, name: &str, at: i64, payload: &[u8], note: Option<&str>, tags: &[&str]| {
            Avro::Record(vec![
                ("id".into(), Avro::Long(id)),
                ("name".into(), Avro::String(name.into())),
                ("at".into(), Avro::TimestampMillis(at)),
                ("payload".into(), Avro::Bytes(payload.to_vec())),
                (
                    "note".into(),
                    match note {
                        None => Avro::Union(0, Box::new(Avro::Null)),
                        Some(n) => Avro::Union(1, Box::new(Avro::String(n.into()))),
                    },
                ),
                (
                    "tags".into(),
                    Avro::Array(tags.iter().map(|t| Avro::String(t.to_string())).collect()),
                ),
            ])
        };
    vec![
        record(1, "ada", 1796033100000, &[0, 1, 2, 255], None, &["a", "b"]),
        record(-2, "", 0, &[], Some("héllo"), &[]),
    ]
}

/// What the Python deserializer prints for `inputs()`: the same, but the timestamp as the
/// datetime it decodes to, in ISO 8601.
fn expected_roundtrip() -> Vec<Value> {
    let mut values = inputs();
    values[0]["at"] = json!("2026-11-30T10:05:00+00:00");
    values[1]["at"] = json!("1970-01-01T00:00:00+00:00");
    values
}

#[test]
fn python_serializer_registers_frames_and_reads_back_through_the_registry() {
    let registry = Registry::start();
    let url = registry.server.url();
    let v1 = schema_file(EVENT_V1);
    let serialize_v1 = [
        "serialize",
        "--registry",
        &url,
        "--topic",
        "events",
        "--schema",
        v1.path().to_str().unwrap(),
    ];
    let framed = registry.tool(&serialize_v1, &lines(&inputs()));
    assert_eq!(framed.len(), 2, "{framed:?}");

    // The wire format, the id the registry gave, and the datum Rust reads.
    let schema = Schema::parse_str(EVENT_V1).unwrap();
    let mut ids = Vec::new();
    for (hex, expected) in framed.iter().zip(expected_v1_values()) {
        let (id, datum) = unframe(hex);
        ids.push(id);
        assert_eq!(decode_datum(&schema, &datum), expected);
    }
    assert_eq!(ids, [1, 1]);
    let (status, body) = registry.get(&format!("/schemas/ids/{}", ids[0]));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        canonical(body["schema"].as_str().unwrap()),
        canonical(EVENT_V1)
    );
    let (_, subjects) = registry.get("/subjects");
    assert_eq!(subjects, json!(["events-value"]));

    // A second process (no client cache): the same schema keeps its id.
    let again = registry.tool(&serialize_v1, &lines(&inputs()[..1]));
    assert_eq!(again, framed[..1]);

    // Back through the Python deserializer, which fetches the schema by id.
    let deserialize = ["deserialize", "--registry", &url, "--topic", "events"];
    let decoded: Vec<Value> = registry
        .tool(&deserialize, &framed)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decoded, expected_roundtrip());

    // Version 2 under the same subject: a new id, a new version; both versions still read.
    let v2 = schema_file(EVENT_V2);
    let mut serialize_v2 = serialize_v1;
    serialize_v2[6] = v2.path().to_str().unwrap();
    let mut input_v2 = inputs()[0].clone();
    input_v2["source"] = json!("api");
    let framed_v2 = registry.tool(&serialize_v2, &lines(&[input_v2]));
    let (id_v2, _) = unframe(&framed_v2[0]);
    assert_ne!(id_v2, ids[0]);
    assert_eq!(
        registry.get("/subjects/events-value/versions").1,
        json!([1, 2])
    );
    let (_, latest) = registry.get("/subjects/events-value/versions/latest");
    assert_eq!(
        (latest["id"].clone(), latest["version"].clone()),
        (json!(id_v2), json!(2))
    );
    let mut both = framed[..1].to_vec();
    both.push(framed_v2[0].clone());
    let decoded: Vec<Value> = registry
        .tool(&deserialize, &both)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut expected_v2 = expected_roundtrip()[0].clone();
    expected_v2["source"] = json!("api");
    assert_eq!(decoded, [expected_roundtrip()[0].clone(), expected_v2]);

    registry.log_requests("serialize/deserialize");
    assert!(
        registry
            .server
            .requests_to("/subjects/events-value/versions")
            >= 3
    );
    assert!(registry.server.requests_to("/schemas/ids/") >= 2);
}

#[test]
fn record_subject_strategies_register_under_the_record_name() {
    let registry = Registry::start();
    let url = registry.server.url();
    let v1 = schema_file(EVENT_V1);
    for strategy in ["record", "topic_record"] {
        let out = registry.tool(
            &[
                "serialize",
                "--registry",
                &url,
                "--topic",
                "events",
                "--schema",
                v1.path().to_str().unwrap(),
                "--subject-strategy",
                strategy,
            ],
            &lines(&inputs()[..1]),
        );
        // The same schema under another subject: the same global id.
        assert_eq!(unframe(&out[0]).0, 1);
    }
    assert_eq!(
        registry.get("/subjects").1,
        json!(["events-watchbridge.test.Event", "watchbridge.test.Event"])
    );
    registry.log_requests("subject strategies");
}

#[test]
fn fastavro_schemaless_datums_decode_in_rust() {
    let v1 = schema_file(EVENT_V1);
    let out = avro_tool(
        &["schemaless", "--schema", v1.path().to_str().unwrap()],
        &lines(&inputs()),
    );
    let schema = Schema::parse_str(EVENT_V1).unwrap();
    let decoded: Vec<Avro> = out
        .iter()
        .map(|hex| decode_datum(&schema, &decode_hex(hex)))
        .collect();
    assert_eq!(decoded, expected_v1_values());
}

#[test]
fn a_registry_outage_fails_the_python_serializer() {
    let registry = Registry::start();
    registry.server.fail_with(Some(503));
    let url = registry.server.url();
    let v1 = schema_file(EVENT_V1);
    let output = registry.tool_output(
        &[
            "serialize",
            "--registry",
            &url,
            "--topic",
            "events",
            "--schema",
            v1.path().to_str().unwrap(),
            "--retries",
            "1",
        ],
        &lines(&inputs()[..1]),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it succeeded: {stderr}");
    assert!(output.stdout.is_empty());
    assert!(
        stderr.contains("Injected failure") && stderr.contains("50001"),
        "{stderr}"
    );
    // It retried the 503 once, as configured.
    assert_eq!(
        registry
            .server
            .requests_to("/subjects/events-value/versions"),
        2
    );
    registry.log_requests("outage");
}

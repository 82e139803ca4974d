//! Input records → the JSON value, watch key and event time a watch starts from, in the
//! input's format (`WATCHBRIDGE_INPUT_FORMAT`, `WATCHBRIDGE_INPUT_KEY_FORMAT`).
//!
//! Decoding is synchronous except for one thing: an Avro value whose writer schema is not
//! cached yet. Then [`Attempt::Fetch`] names the schema id; the partition task fetches it
//! ([`InputDecoder::fetch`], retried with backoff while the registry is down: the partition
//! waits, nothing is dropped or dead-lettered for it) and decodes the record again.

use super::time::TimestampAssigner;
use super::watch_input::{Input, Rejected};
use super::{InputFormat, KeyFormat};
use crate::avro::registry::{RegistryClient, Unavailable, WriterSchema};
use crate::avro::wire::{unframe, FrameError};
use crate::clock::Millis;
use apache_avro::Schema;
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;

/// How the bridge reads its input records.
pub struct InputDecoder {
    pub value_format: InputFormat,
    pub key_format: KeyFormat,
    /// Resolves the schema ids of framed Avro values (and keys).
    pub registry: Option<Arc<RegistryClient>>,
    /// `WATCHBRIDGE_INPUT_SCHEMA`: the writer schema of bare Avro datums (without it, Avro
    /// values are in the wire format, their schemas from the registry).
    pub schema: Option<Arc<Schema>>,
    /// JSON pointer to the watch key in the value (`None`: the record key).
    pub watch_key: Option<String>,
    /// How an input's event time is read (`None`: its record timestamp).
    pub time: Option<Arc<dyn TimestampAssigner>>,
}

/// What decoding a record came to.
#[derive(Debug)]
pub enum Attempt {
    Done(Result<Input, Rejected>),
    /// The writer schema with this id must be fetched first.
    Fetch(u32),
}

impl InputDecoder {
    /// JSON values with the record key as the watch key and the record timestamp as the
    /// event time: what the bridge did before formats were settable.
    pub fn json(watch_key: Option<String>) -> Self {
        Self {
            value_format: InputFormat::Json,
            key_format: KeyFormat::Raw,
            registry: None,
            schema: None,
            watch_key,
            time: None,
        }
    }

    /// The same decoder with another watch key and, if given, key format: the repartition
    /// stage reads the watch key where the settings say, and the watch side finds it as the
    /// record key the stage wrote, as it came (`kafka/repartition/`).
    pub fn with_watch_key(&self, watch_key: Option<String>, key_format: Option<KeyFormat>) -> Self {
        Self {
            value_format: self.value_format,
            key_format: key_format.unwrap_or(self.key_format),
            registry: self.registry.clone(),
            schema: self.schema.clone(),
            watch_key,
            time: self.time.clone(),
        }
    }

    /// The event time a record decoded to `decoded` gives its partition's watermark: the
    /// input's time; for a record that did not decode, its record timestamp (`now` without
    /// one), unless the time is read from the value (`WATCHBRIDGE_INPUT_TIME`), which it
    /// could not be: then none (it moves nothing).
    pub fn watermark_time(
        &self,
        decoded: &Result<Input, Rejected>,
        record_time: Option<Millis>,
        now: Millis,
    ) -> Option<Millis> {
        match decoded {
            Ok(input) => Some(input.timestamp),
            Err(_) if self.time.is_some() => None,
            Err(_) => Some(record_time.unwrap_or(now)),
        }
    }

    /// Decode one record. `now` stands in for a record without a timestamp.
    pub fn decode(
        &self,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        timestamp: Option<Millis>,
        now: Millis,
    ) -> Attempt {
        let value = match self.value(payload.unwrap_or_default()) {
            Ok(Ok(value)) => value,
            Ok(Err(rejected)) => return Attempt::Done(Err(rejected)),
            Err(id) => return Attempt::Fetch(id),
        };
        let key = match self.key(key, &value) {
            Ok(Ok(key)) => key,
            Ok(Err(rejected)) => return Attempt::Done(Err(rejected)),
            Err(id) => return Attempt::Fetch(id),
        };
        let record_time = timestamp.unwrap_or(now);
        let timestamp = match &self.time {
            None => record_time,
            Some(time) => match time.extract_timestamp(&value, record_time) {
                Ok(t) => t,
                Err(e) => return Attempt::Done(Err(Rejected::NoTime(e))),
            },
        };
        Attempt::Done(Ok(Input {
            key,
            value,
            timestamp,
        }))
    }

    /// Fetch the writer schema `id` into the cache. `Ok` also when the registry does not
    /// know it: the next [`InputDecoder::decode`] dead-letters the record then.
    pub async fn fetch(&self, id: u32) -> Result<(), Unavailable> {
        match &self.registry {
            Some(registry) => registry.fetch(id).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Whether the record key, read in the key format, is `watch_key` (with
    /// `WATCHBRIDGE_WATCH_KEY`, inputs should be keyed by their watch key: see
    /// `InputKeyedApart`). A key that cannot be read here (an Avro key whose schema is not
    /// cached) counts as matching: no warning on a guess.
    pub fn record_key_is(&self, key: Option<&[u8]>, watch_key: &[u8]) -> bool {
        match self.record_key(key) {
            Ok(Ok(key)) => key == watch_key,
            Ok(Err(_)) => false,
            Err(_) => true,
        }
    }

    /// Whether the state topic can keep an input's value as it came (JSON), rather than
    /// its decoded JSON form (which a restart reads back without the registry).
    pub fn keeps_raw_value(&self) -> bool {
        self.value_format == InputFormat::Json
    }

    /// The record value as JSON. `Err(id)`: schema `id` must be fetched first.
    fn value(&self, payload: &[u8]) -> Result<Result<Value, Rejected>, u32> {
        match self.value_format {
            InputFormat::Json => Ok(if payload.is_empty() {
                Err(Rejected::NotJson("the record has no value".into()))
            } else {
                serde_json::from_slice(payload).map_err(|e| Rejected::NotJson(e.to_string()))
            }),
            InputFormat::String => Ok(std::str::from_utf8(payload)
                .map(|s| serde_json::json!({ "value": s }))
                .map_err(|e| Rejected::NotString(format!("the value is not UTF-8: {e}")))),
            InputFormat::Avro => self.avro_value(payload),
        }
    }

    /// A bare datum of `WATCHBRIDGE_INPUT_SCHEMA` when it is set, else a framed one (its
    /// writer schema from the registry), as JSON.
    fn avro_value(&self, bytes: &[u8]) -> Result<Result<Value, Rejected>, u32> {
        match &self.schema {
            Some(schema) => Ok(if bytes.is_empty() {
                Err(Rejected::NotAvro("the record has no value".into()))
            } else {
                read_datum(schema, &[], bytes)
            }),
            None => self.framed(bytes),
        }
    }

    /// A value in the Confluent wire format as JSON. `Err(id)`: fetch schema `id` first.
    fn framed(&self, bytes: &[u8]) -> Result<Result<Value, Rejected>, u32> {
        let Some(registry) = &self.registry else {
            return Ok(Err(Rejected::NotAvro(
                "no schema registry to read it with (WATCHBRIDGE_SCHEMA_REGISTRY_URL)".into(),
            )));
        };
        let (id, datum) = match unframe(bytes) {
            Ok(framed) => framed,
            Err(FrameError::Empty) => {
                return Ok(Err(Rejected::NotAvro("the record has no value".into())))
            }
            Err(e) => return Ok(Err(Rejected::NotAvro(e.to_string()))),
        };
        match registry.cached(id) {
            None => Err(id),
            Some(Err(unknown)) => Ok(Err(Rejected::UnknownSchema(unknown.to_string()))),
            Some(Ok(writer)) => Ok(read_framed(&writer, datum)),
        }
    }

    /// The watch key: a field of the value, or the record key in the key format.
    fn key(&self, key: Option<&[u8]>, value: &Value) -> Result<Result<Bytes, Rejected>, u32> {
        match &self.watch_key {
            Some(pointer) => Ok(key_field(value, pointer)),
            None => self.record_key(key),
        }
    }

    /// The record key as a watch key, read in the key format.
    fn record_key(&self, key: Option<&[u8]>) -> Result<Result<Bytes, Rejected>, u32> {
        let key = match key {
            Some(k) if !k.is_empty() => k,
            _ => {
                return Ok(Err(Rejected::NoKey(
                    "the record has no key (set WATCHBRIDGE_WATCH_KEY to take the watch key from the value)"
                        .into(),
                )))
            }
        };
        let decoded = match self.key_format {
            KeyFormat::Raw => return Ok(Ok(Bytes::copy_from_slice(key))),
            KeyFormat::String => {
                return Ok(match std::str::from_utf8(key) {
                    Ok(_) => Ok(Bytes::copy_from_slice(key)),
                    Err(e) => Err(Rejected::NoKey(format!("the record key is not UTF-8: {e}"))),
                })
            }
            KeyFormat::Json => serde_json::from_slice::<Value>(key)
                .map_err(|e| Rejected::NoKey(format!("the record key is not JSON: {e}"))),
            KeyFormat::Avro => match self.framed(key)? {
                Ok(v) => Ok(v),
                Err(e) => Err(Rejected::NoKey(format!("the record key: {e}"))),
            },
        };
        Ok(decoded.and_then(|v| {
            scalar_key(&v).ok_or_else(|| {
                Rejected::NoKey("the record key decodes to no string, number or boolean".into())
            })
        }))
    }
}

/// The watch key a decoded field gives: a string as is, a number or boolean as its JSON
/// text; an empty string or anything else is no key.
fn scalar_key(v: &Value) -> Option<Bytes> {
    match v {
        Value::String(s) if !s.is_empty() => Some(Bytes::from(s.clone().into_bytes())),
        Value::Number(_) | Value::Bool(_) => Some(Bytes::from(v.to_string().into_bytes())),
        _ => None,
    }
}

fn key_field(value: &Value, pointer: &str) -> Result<Bytes, Rejected> {
    match value.pointer(pointer) {
        Some(Value::String(s)) if s.is_empty() => Err(Rejected::NoKey(format!(
            "the field at WATCHBRIDGE_WATCH_KEY `{pointer}` is empty"
        ))),
        Some(v) => scalar_key(v).ok_or_else(|| {
            Rejected::NoKey(format!(
                "the field at WATCHBRIDGE_WATCH_KEY `{pointer}` is not a string, number or boolean"
            ))
        }),
        None => Err(Rejected::NoKey(format!(
            "the value has no field at WATCHBRIDGE_WATCH_KEY `{pointer}`"
        ))),
    }
}

fn read_framed(writer: &WriterSchema, datum: &[u8]) -> Result<Value, Rejected> {
    read_datum(&writer.schema, &writer.references, datum).map_err(|e| match e {
        Rejected::NotAvro(m) => Rejected::NotAvro(format!("with schema id {}: {m}", writer.id)),
        other => other,
    })
}

/// One Avro datum, written with `writer` (whose named references are `references`), mapped
/// to JSON. Every byte must be used: bytes left over mean the datum was written with
/// another schema.
pub(crate) fn read_datum(
    writer: &Schema,
    references: &[Schema],
    bytes: &[u8],
) -> Result<Value, Rejected> {
    use apache_avro::reader::datum::GenericDatumReader;
    // Before apache-avro's first read in the process sets its default (512 MiB).
    super::limit_avro_allocations();
    let not_avro = |e: apache_avro::Error| Rejected::NotAvro(e.to_string());
    let datum_reader = GenericDatumReader::builder(writer)
        .writer_schemata(references.iter().collect())
        .map_err(not_avro)?
        .build()
        .map_err(not_avro)?;
    let mut cursor = std::io::Cursor::new(bytes);
    let value = datum_reader.read_value(&mut cursor).map_err(not_avro)?;
    let left = bytes.len() - cursor.position() as usize;
    if left > 0 {
        return Err(Rejected::NotAvro(format!(
            "{left} bytes are left after the datum (was it written with another schema?)"
        )));
    }
    crate::avro::json::to_json_with_references(&value, writer, references)
        .map_err(|e| Rejected::NotAvro(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::time::{InputTime, TimeFallback};
    use serde_json::json;

    /// `decode` as JSON input with `watch_key`, expecting an answer (no schema to fetch).
    fn decode(
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: Option<Millis>,
        watch_key: Option<&str>,
        now: Millis,
    ) -> Result<Input, Rejected> {
        match InputDecoder::json(watch_key.map(String::from)).decode(key, value, timestamp, now) {
            Attempt::Done(result) => result,
            Attempt::Fetch(id) => panic!("JSON needs no schema, asked for {id}"),
        }
    }

    #[test]
    fn the_watch_key_is_the_record_key_or_a_field() {
        let i = decode(Some(b"u-1"), Some(br#"{"id": 7}"#), Some(5), None, 9).unwrap();
        assert_eq!((i.key.as_ref(), i.timestamp), (&b"u-1"[..], 5));
        assert_eq!(i.value, json!({"id": 7}));
        let i = decode(None, Some(br#"{"id": 7}"#), None, Some("/id"), 9).unwrap();
        assert_eq!((i.key.as_ref(), i.timestamp), (&b"7"[..], 9));
        let i = decode(
            Some(b"x"),
            Some(br#"{"u": {"name": "ada"}}"#),
            None,
            Some("/u/name"),
            9,
        )
        .unwrap();
        assert_eq!(i.key.as_ref(), b"ada");
    }

    #[test]
    fn undecodable_or_keyless_records_say_why() {
        let e = decode(Some(b"k"), Some(b"{oops"), None, None, 0).unwrap_err();
        assert_eq!(e.kind(), "not_json");
        assert!(e.to_string().contains("key must be a string"), "{e}");
        assert!(decode(Some(b"k"), None, None, None, 0)
            .unwrap_err()
            .to_string()
            .contains("no value"));
        let e = decode(None, Some(b"{}"), None, None, 0).unwrap_err();
        assert_eq!(e.kind(), "no_key");
        assert!(e.to_string().contains("WATCHBRIDGE_WATCH_KEY"), "{e}");
        assert_eq!(
            decode(Some(b""), Some(b"{}"), None, None, 0)
                .unwrap_err()
                .kind(),
            "no_key"
        );
        for value in [
            &br#"{}"#[..],
            br#"{"id": ""}"#,
            br#"{"id": [1]}"#,
            br#"{"id": null}"#,
        ] {
            let e = decode(None, Some(value), None, Some("/id"), 0).unwrap_err();
            assert_eq!(e.kind(), "no_key", "{e}");
            assert!(e.to_string().contains("`/id`"), "{e}");
        }
    }

    fn avro_decoder(schema: &str) -> InputDecoder {
        InputDecoder {
            value_format: InputFormat::Avro,
            schema: Some(Arc::new(Schema::parse_str(schema).unwrap())),
            ..InputDecoder::json(Some("/id".into()))
        }
    }

    fn done(a: Attempt) -> Result<Input, Rejected> {
        match a {
            Attempt::Done(r) => r,
            Attempt::Fetch(id) => panic!("asked for schema {id}"),
        }
    }

    const USER: &str = r#"{"type":"record","name":"User","fields":[
        {"name":"id","type":"long"},
        {"name":"email","type":["null","string"],"default":null},
        {"name":"joined","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

    fn user_datum(id: i64, email: Option<&str>, joined: i64) -> Vec<u8> {
        use apache_avro::types::Value as A;
        let schema = Schema::parse_str(USER).unwrap();
        let email = match email {
            Some(e) => A::Union(1, Box::new(A::String(e.into()))),
            None => A::Union(0, Box::new(A::Null)),
        };
        let value = A::Record(vec![
            ("id".into(), A::Long(id)),
            ("email".into(), email),
            ("joined".into(), A::TimestampMillis(joined)),
        ]);
        apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
            .build()
            .unwrap()
            .write_value_to_vec(value)
            .unwrap()
    }

    #[test]
    fn bare_avro_datums_are_read_with_the_input_schema_and_addressed_by_pointers() {
        let d = avro_decoder(USER);
        let i = done(d.decode(
            None,
            Some(&user_datum(42, Some("a@b.c"), 1_733_087_616_123)),
            Some(1),
            9,
        ))
        .unwrap();
        assert_eq!(i.key.as_ref(), b"42");
        assert_eq!(
            i.value,
            json!({"id": 42, "email": "a@b.c", "joined": "2024-12-01T21:13:36.123Z"})
        );
        assert_eq!(
            i.timestamp, 1,
            "the record timestamp without WATCHBRIDGE_INPUT_TIME"
        );
        let i = done(d.decode(None, Some(&user_datum(7, None, 0)), None, 9)).unwrap();
        assert_eq!(i.value["email"], Value::Null);
    }

    #[test]
    fn a_hostile_length_is_a_dead_letter() {
        // (That the bridge's own limit is the one in force is checked on the real binary, in
        // tests/avro.rs: apache-avro keeps it in a process-wide global, which the other
        // tests of this binary may set first.)
        let d = avro_decoder(
            r#"{"type":"record","name":"R","fields":[{"name":"id","type":"string"}]}"#,
        );
        // A string of 600,000,000 bytes, and nothing after it: more than
        // either limit allows.
        let mut datum = Vec::new();
        crate::avro::wire::write_long(&mut datum, 600_000_000);
        let e = done(d.decode(None, Some(&datum), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "not_avro", "{e}");
    }

    #[test]
    fn avro_that_does_not_decode_says_why() {
        let d = avro_decoder(USER);
        let datum = user_datum(42, Some("a@b.c"), 5);
        // Truncated.
        let e = done(d.decode(None, Some(&datum[..datum.len() - 2]), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "not_avro", "{e}");
        // Bytes left over: written with another schema.
        let mut longer = datum.clone();
        longer.extend_from_slice(b"\x02\x02");
        let e = done(d.decode(None, Some(&longer), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "not_avro");
        assert!(e.to_string().contains("left after the datum"), "{e}");
        // JSON is not Avro of this schema.
        let e = done(d.decode(None, Some(br#"{"id": 1}"#), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "not_avro", "{e}");
    }

    #[test]
    fn the_event_time_comes_from_a_field_or_the_record_timestamp_by_setting() {
        let mut d = avro_decoder(USER);
        d.time = Some(Arc::new(InputTime {
            pointer: "/joined".into(),
            unit: super::super::time::TimeUnit::Millis,
            fallback: TimeFallback::DeadLetter,
        }));
        let i = done(d.decode(
            None,
            Some(&user_datum(1, None, 1_733_087_616_123)),
            Some(5),
            9,
        ))
        .unwrap();
        assert_eq!(i.timestamp, 1_733_087_616_123);
        // A JSON input without the field: dead letter, or the record timestamp.
        let mut j = InputDecoder::json(None);
        let at = |fallback| {
            Some(Arc::new(InputTime {
                pointer: "/at".into(),
                unit: super::super::time::TimeUnit::Seconds,
                fallback,
            }) as Arc<dyn TimestampAssigner>)
        };
        j.time = at(TimeFallback::DeadLetter);
        let e = done(j.decode(Some(b"k"), Some(b"{}"), Some(5), 9)).unwrap_err();
        assert_eq!(e.kind(), "no_time");
        assert!(e.to_string().contains("`/at`"), "{e}");
        let i = done(j.decode(Some(b"k"), Some(br#"{"at": 1733087616}"#), Some(5), 9)).unwrap();
        assert_eq!(i.timestamp, 1_733_087_616_000);
        j.time = at(TimeFallback::RecordTimestamp);
        let i = done(j.decode(Some(b"k"), Some(b"{}"), Some(5), 9)).unwrap();
        assert_eq!(i.timestamp, 5);
    }

    #[test]
    fn string_values_and_key_formats() {
        let d = InputDecoder {
            value_format: InputFormat::String,
            key_format: KeyFormat::Json,
            ..InputDecoder::json(None)
        };
        let i = done(d.decode(Some(b"\"u-1\""), Some(b"hello"), None, 0)).unwrap();
        assert_eq!(i.value, json!({"value": "hello"}));
        assert_eq!(i.key.as_ref(), b"u-1", "a JSON string key is its text");
        let i = done(d.decode(Some(b"17"), Some(b"x"), None, 0)).unwrap();
        assert_eq!(i.key.as_ref(), b"17");
        assert!(d.record_key_is(Some(b"\"u-1\""), b"u-1"));
        assert!(!d.record_key_is(Some(b"u-1"), b"u-1"), "not JSON");
        assert!(!d.record_key_is(None, b"u-1"));
        let e = done(d.decode(Some(b"{oops"), Some(b"x"), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "no_key");
        let e = done(d.decode(Some(b"[1]"), Some(b"x"), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "no_key");
        let e = done(d.decode(Some(b"\"k\""), Some(b"\xff\xfe"), None, 0)).unwrap_err();
        assert_eq!(e.kind(), "not_string");
        let s = InputDecoder {
            key_format: KeyFormat::String,
            ..InputDecoder::json(None)
        };
        assert_eq!(
            done(s.decode(Some(b"\xff"), Some(b"{}"), None, 0))
                .unwrap_err()
                .kind(),
            "no_key"
        );
    }

    #[test]
    fn framed_values_need_the_magic_byte_before_any_registry_request() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let registry = RegistryClient::new(
            crate::avro::registry::RegistrySettings {
                // Nothing listens there: no request may be made for these records.
                url: "http://127.0.0.1:9".parse().unwrap(),
                auth: crate::avro::registry::RegistryAuth::None,
                ca_pem: None,
                timeout: std::time::Duration::from_millis(100),
            },
            metrics,
        )
        .unwrap();
        let d = InputDecoder {
            value_format: InputFormat::Avro,
            registry: Some(Arc::new(registry)),
            ..InputDecoder::json(Some("/id".into()))
        };
        for (value, why) in [
            (&b"{\"id\":1}"[..], "magic byte"),
            (b"\x00\x00\x01", "5-byte header"),
            (b"", "no value"),
        ] {
            let e = done(d.decode(None, Some(value), None, 0)).unwrap_err();
            assert_eq!(e.kind(), "not_avro");
            assert!(e.to_string().contains(why), "{e}");
        }
        match d.decode(None, Some(b"\x00\x00\x00\x00\x07\x02"), None, 0) {
            Attempt::Fetch(7) => {}
            other => panic!("expected a fetch of schema 7, got {other:?}"),
        }
    }

    /// A decoder of framed values through `server`, keys in `key_format`.
    fn framed_decoder(
        server: &crate::avro::registry_server::RegistryServer,
        key_format: KeyFormat,
    ) -> InputDecoder {
        let registry = RegistryClient::new(
            crate::avro::registry::RegistrySettings {
                url: server.url().parse().unwrap(),
                auth: crate::avro::registry::RegistryAuth::None,
                ca_pem: None,
                timeout: std::time::Duration::from_secs(5),
            },
            Arc::new(crate::metrics::Metrics::new()),
        )
        .unwrap();
        InputDecoder {
            value_format: InputFormat::Avro,
            key_format,
            registry: Some(Arc::new(registry)),
            ..InputDecoder::json(None)
        }
    }

    fn write(schema: &Schema, schemata: &[&Schema], value: apache_avro::types::Value) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema)
            .schemata(schemata.to_vec())
            .unwrap()
            .build()
            .unwrap()
            .write_value_to_vec(value)
            .unwrap()
    }

    /// Decode, fetching every schema asked for first (as the partition task does).
    async fn decode_fetching(
        d: &InputDecoder,
        key: &[u8],
        value: &[u8],
    ) -> Result<Input, Rejected> {
        loop {
            match d.decode(Some(key), Some(value), Some(1), 0) {
                Attempt::Done(r) => return r,
                Attempt::Fetch(id) => d.fetch(id).await.unwrap(),
            }
        }
    }

    #[tokio::test]
    async fn avro_keys_and_values_with_schema_references_come_through_the_registry() {
        use apache_avro::types::Value as A;
        let server =
            crate::avro::registry_server::RegistryServer::start("127.0.0.1:0".parse().unwrap())
                .unwrap();
        let address = r#"{"type":"record","name":"Address","namespace":"t","fields":[{"name":"city","type":"string"}]}"#;
        let user = r#"{"type":"record","name":"User","namespace":"t","fields":[{"name":"id","type":"long"},{"name":"home","type":"t.Address"}]}"#;
        server.register("address", address);
        // Registered with its reference, as a Confluent client does.
        let http = reqwest::Client::new();
        let answer = http
            .post(format!("{}/subjects/users-value/versions", server.url()))
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .body(json!({"schema": user, "references": [{"name": "t.Address", "subject": "address", "version": 1}]}).to_string())
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        let user_id = answer["id"].as_u64().unwrap() as u32;
        let key_id = server.register("users-key", r#""string""#);
        let (address_schema, user_schema) = {
            let (u, refs) = Schema::parse_str_with_list(user, [address]).unwrap();
            (refs.into_iter().next().unwrap(), u)
        };
        let value = write(
            &user_schema,
            &[&address_schema],
            A::Record(vec![
                ("id".into(), A::Long(7)),
                (
                    "home".into(),
                    A::Record(vec![("city".into(), A::String("Oslo".into()))]),
                ),
            ]),
        );
        let key = write(&Schema::String, &[], A::String("user-7".into()));
        let d = framed_decoder(&server, KeyFormat::Avro);
        let input = decode_fetching(
            &d,
            &crate::avro::wire::frame(key_id, &key),
            &crate::avro::wire::frame(user_id, &value),
        )
        .await
        .unwrap();
        assert_eq!(input.key.as_ref(), b"user-7");
        assert_eq!(input.value, json!({"id": 7, "home": {"city": "Oslo"}}));
        // Once fetched, no more requests for these ids.
        let requests = server.requests();
        let again = d.decode(
            Some(&crate::avro::wire::frame(key_id, &key)),
            Some(&crate::avro::wire::frame(user_id, &value)),
            None,
            0,
        );
        assert!(matches!(again, Attempt::Done(Ok(_))), "{again:?}");
        assert_eq!(server.requests(), requests);
        // An id the registry does not know: a dead letter, not a wait.
        let e = decode_fetching(
            &d,
            &crate::avro::wire::frame(key_id, &key),
            &crate::avro::wire::frame(999, &value),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), "unknown_schema", "{e}");
    }
}

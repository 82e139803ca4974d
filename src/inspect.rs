//! `watchbridge state inspect`: the state topic as readable JSON lines, one per record, for
//! debugging and support tickets.
//!
//! Reading is [`crate::kafka::tools::read_topic`] (what `watchbridge consume -e` reads with):
//! every partition, or one, from the beginning to the end offsets present at the start.
//! Each record is decoded with [`decode_entry`], the bridge's own reader, and described by
//! [`describe`], which is pure. A record that does not decode is a line of kind
//! `undecodable` with the error and its bytes, or `newer_version` if a newer build wrote it;
//! the reading goes on.
//!
//! Every line has `partition`, `offset`, `timestamp` (RFC 3339, `null` if the record has
//! none) and `timestamp_ms`, `kind`, `key` (the watch key; `null` for records that are not
//! a watch's) and `record_key` (the Kafka record key). Byte strings are text when they are
//! UTF-8; otherwise base64, with `<field>_base64: true` beside them. Times are RFC 3339 with
//! `<field>_ms` beside them (epoch milliseconds), the time `null` when it is out of range.
//!
//! With the repartition topic (`WATCHBRIDGE_REPARTITION`, docs/architecture.md "Two
//! stages") the state is the watch side's: a record's `partition` is the repartition
//! topic's (its watch key's CRC-32), not the input partition its input arrived on; the
//! repartition stage keeps no state.
//!
//! | `kind`           | fields |
//! |------------------|--------|
//! | `watch`          | `input_key`, `input_value` (`input_value_format`: `json`, `text` or `base64`), `input_time`, `arrived`, `last_new`, `polls`, `hold`, `next_poll`, `empty_streak`, `failures`, `seen_chunks`, `finished` (`{at, at_ms, reason}` or `null`), `resume` (`{base64, text}` or `null`), `conditions` (`[{name, state_base64}]` or `null`) |
//! | `seen_chunk`     | `index`, `hash_count`, and with `--hashes` `hashes` (32 hex digits each) |
//! | `tombstone`      | `part` (`watch`, `seen_chunk`, `output_offsets`, `starts`, `mode`), `index` (a chunk's) or `seq` (a starts record's) |
//! | `output_offsets` | `offsets`: `[{partition, offset}]` |
//! | `mode`           | `mode`: the guarantee of the partition's last writer |
//! | `starts`         | `seq`, `member_count`, `members` (`[{key, arrived, next_poll, polls}]`); with `--key`, `member`: that watch's fields as in a `watch` line |
//! | `newer_version`  | `version` (the format version it was written by), `error`, `value_base64`: a record of a newer build, which this one cannot read; its partition stops at recovery (`crate::state::versions`) |
//! | `undecodable`    | `error`, `value_base64` (`null` for a record with no value) |

use std::io::Write;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::clock::Millis;
use crate::kafka::tools::{read_topic, ReadError};
use crate::state::codec::{
    decode_entry, parse_state_key, DecodeError, Entry, OutputOffsets, Part, Starts, WatchRecord,
    OUTPUT_OFFSETS_KEY,
};
use crate::termination::Termination;
use rdkafka::Message;

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only the records of this watch key: its watch record, seen chunks and tombstones, and
    /// the starts records that list it (an undecodable record too, if its key names it).
    pub key: Option<Vec<u8>>,
    /// Only this partition.
    pub partition: Option<i32>,
    /// Each seen chunk's hashes too, not only their count.
    pub hashes: bool,
}

/// What an inspection read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records read.
    pub read: usize,
    /// Lines printed (after `--key`).
    pub printed: usize,
    /// Of those, lines of kind `undecodable` or `newer_version`: records this build cannot
    /// read.
    pub undecodable: usize,
}

/// Read `topic` from `brokers` and write one JSON line per record (that `options` keeps) to
/// `out`, stopping at the end offsets present at the start.
pub fn inspect(
    brokers: &str,
    topic: &str,
    options: &Options,
    out: &mut impl Write,
) -> Result<Summary, ReadError> {
    let mut summary = Summary::default();
    summary.read = read_topic(brokers, topic, options.partition, true, |m| {
        let timestamp = m.timestamp().to_millis();
        let Some(line) = describe(
            m.partition(),
            m.offset(),
            timestamp,
            m.key(),
            m.payload(),
            options,
        ) else {
            return Ok(());
        };
        summary.printed += 1;
        if matches!(line.kind(), Some("undecodable" | "newer_version")) {
            summary.undecodable += 1;
        }
        writeln!(out, "{line}")
    })?;
    out.flush().map_err(ReadError::Output)?;
    Ok(summary)
}

/// One record as a JSON object, or `None` if `options.key` leaves it out.
pub fn describe(
    partition: i32,
    offset: i64,
    timestamp_ms: Option<i64>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    options: &Options,
) -> Option<Line> {
    let record_key = key.unwrap_or_default();
    let mut line = Line::default();
    line.insert("partition".into(), partition.into());
    line.insert("offset".into(), offset.into());
    line.insert(
        "timestamp".into(),
        timestamp_ms.map_or(Value::Null, rfc3339),
    );
    line.insert("timestamp_ms".into(), timestamp_ms.into());
    let wanted = |watch_key: &[u8]| options.key.as_deref().is_none_or(|k| k == watch_key);
    // A tombstone under the output-offsets key reads back as empty offsets; here it is
    // shown for what it is.
    let entry = match (record_key, value) {
        (OUTPUT_OFFSETS_KEY, None) => Ok(None),
        _ => decode_entry(record_key, value).map(Some),
    };
    match entry {
        Ok(None) => {
            options.key.is_none().then_some(())?;
            kind(&mut line, "tombstone", None, record_key);
            line.insert("part".into(), "output_offsets".into());
        }
        Ok(Some(Entry::Watch(w))) => {
            wanted(&w.watch_key).then_some(())?;
            kind(&mut line, "watch", Some(&w.watch_key[..]), record_key);
            watch_fields(&mut line, &w);
        }
        Ok(Some(Entry::Seen { watch_key, chunk })) => {
            wanted(&watch_key).then_some(())?;
            kind(&mut line, "seen_chunk", Some(&watch_key[..]), record_key);
            line.insert("index".into(), chunk.index().into());
            line.insert("hash_count".into(), chunk.hashes().len().into());
            if options.hashes {
                let hashes = chunk.hashes().iter().map(|h| format!("{h:032x}"));
                line.insert("hashes".into(), hashes.collect());
            }
        }
        Ok(Some(Entry::Tombstone { watch_key, part })) => {
            wanted(&watch_key).then_some(())?;
            kind(&mut line, "tombstone", Some(&watch_key[..]), record_key);
            match part {
                Part::Watch => {
                    line.insert("part".into(), "watch".into());
                }
                Part::Seen(n) => {
                    line.insert("part".into(), "seen_chunk".into());
                    line.insert("index".into(), n.into());
                }
            }
        }
        Ok(Some(Entry::OutputOffsets(o))) => {
            options.key.is_none().then_some(())?;
            kind(&mut line, "output_offsets", None, record_key);
            line.put("offsets".into(), &output_offsets(&o));
        }
        Ok(Some(Entry::Starts(s))) => {
            let member = match &options.key {
                None => None,
                Some(k) => Some(s.watches.iter().find(|w| w.watch_key == k[..])?),
            };
            kind(&mut line, "starts", None, record_key);
            starts_fields(&mut line, &s);
            if let Some(w) = member {
                let mut fields = Line::default();
                bytes_field(&mut fields, "key", &w.watch_key);
                watch_fields(&mut fields, w);
                line.put("member".into(), &fields);
            }
        }
        Ok(Some(Entry::Mode(mode))) => {
            options.key.is_none().then_some(())?;
            match mode {
                Some(m) => {
                    kind(&mut line, "mode", None, record_key);
                    line.insert("mode".into(), m.mode.into());
                }
                None => {
                    kind(&mut line, "tombstone", None, record_key);
                    line.insert("part".into(), "mode".into());
                }
            }
        }
        Ok(Some(Entry::StartsDeleted { seq })) => {
            options.key.is_none().then_some(())?;
            kind(&mut line, "tombstone", None, record_key);
            line.insert("part".into(), "starts".into());
            line.insert("seq".into(), seq.into());
        }
        Err(e) => {
            let watch_key = parse_state_key(record_key).ok().map(|(k, _)| k);
            if options.key.is_some() {
                wanted(watch_key?).then_some(())?;
            }
            match e {
                DecodeError::NewerVersion { found } => {
                    kind(&mut line, "newer_version", watch_key, record_key);
                    line.insert("version".into(), found.into());
                }
                _ => kind(&mut line, "undecodable", watch_key, record_key),
            }
            line.insert("error".into(), e.to_string().into());
            line.insert(
                "value_base64".into(),
                value.map_or(Value::Null, |v| BASE64.encode(v).into()),
            );
        }
    }
    Some(line)
}

/// One output line: a JSON object whose fields print in the order they were put in
/// (`partition`, `offset`, ... first), unlike a `serde_json::Map`, which sorts them.
#[derive(Debug, Default)]
pub struct Line(Vec<(String, Box<RawValue>)>);

impl Line {
    fn insert(&mut self, key: String, value: Value) {
        self.put(key, &value);
    }

    fn put(&mut self, key: String, value: &impl Serialize) {
        let raw =
            serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned());
        self.0.push((key, raw));
    }

    /// The `kind` field.
    pub fn kind(&self) -> Option<&str> {
        let (_, raw) = self.0.iter().find(|(k, _)| k == "kind")?;
        raw.get().strip_prefix('"')?.strip_suffix('"')
    }
}

impl Serialize for Line {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

/// `kind`, `key` (the watch key, or `null`) and `record_key`.
fn kind(line: &mut Line, kind: &str, watch_key: Option<&[u8]>, record_key: &[u8]) {
    line.insert("kind".into(), kind.into());
    match watch_key {
        Some(k) => bytes_field(line, "key", k),
        None => {
            line.insert("key".into(), Value::Null);
        }
    }
    bytes_field(line, "record_key", record_key);
}

/// A watch record's fields, after its key.
fn watch_fields(line: &mut Line, w: &WatchRecord) {
    match &w.input_key {
        Some(k) => bytes_field(line, "input_key", k),
        None => {
            line.insert("input_key".into(), Value::Null);
        }
    }
    let (value, format) = match serde_json::from_slice::<Value>(&w.input_value) {
        Ok(v) => (v, "json"),
        Err(_) => match std::str::from_utf8(&w.input_value) {
            Ok(text) => (text.into(), "text"),
            Err(_) => (BASE64.encode(&w.input_value).into(), "base64"),
        },
    };
    line.insert("input_value".into(), value);
    line.insert("input_value_format".into(), format.into());
    time_field(line, "input_time", w.input_time);
    time_field(line, "arrived", w.arrived);
    time_field(line, "last_new", w.last_new);
    line.insert("polls".into(), w.polls.into());
    time_field(line, "hold", w.hold);
    time_field(line, "next_poll", w.next_poll);
    line.insert("empty_streak".into(), w.empty_streak.into());
    line.insert("failures".into(), w.failures.into());
    line.insert("seen_chunks".into(), w.seen_chunks.into());
    line.insert(
        "finished".into(),
        w.finished.as_ref().map_or(
            Value::Null,
            |f| json!({"at": rfc3339(f.at), "at_ms": f.at, "reason": f.reason}),
        ),
    );
    line.insert(
        "resume".into(),
        w.resume.as_ref().map_or(Value::Null, |r| {
            let mut resume = serde_json::Map::new();
            resume.insert("base64".into(), BASE64.encode(r).into());
            if let Some(text) = printable(r) {
                resume.insert("text".into(), text.into());
            }
            resume.into()
        }),
    );
    line.insert(
        "conditions".into(),
        w.conditions
            .as_ref()
            .map_or(Value::Null, |c| match Termination::saved_custom_states(c) {
                Ok(states) => states
                    .into_iter()
                    .map(
                        |(name, state)| json!({"name": name, "state_base64": BASE64.encode(state)}),
                    )
                    .collect(),
                Err(error) => json!({"error": error, "base64": BASE64.encode(c)}),
            }),
    );
}

fn starts_fields(line: &mut Line, s: &Starts) {
    line.insert("seq".into(), s.seq.into());
    line.insert("member_count".into(), s.watches.len().into());
    let members = s.watches.iter().map(|w| {
        let mut member = Line::default();
        bytes_field(&mut member, "key", &w.watch_key);
        time_field(&mut member, "arrived", w.arrived);
        time_field(&mut member, "next_poll", w.next_poll);
        member.insert("polls".into(), w.polls.into());
        member
    });
    line.put("members".into(), &members.collect::<Vec<_>>());
}

fn output_offsets(o: &OutputOffsets) -> Vec<Line> {
    let offset = |&(partition, offset): &(i32, i64)| {
        let mut line = Line::default();
        line.insert("partition".into(), partition.into());
        line.insert("offset".into(), offset.into());
        line
    };
    o.offsets.iter().map(offset).collect()
}

/// `name`: the bytes as text if they are UTF-8, else as base64 with `<name>_base64: true`.
fn bytes_field(line: &mut Line, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            line.insert(name.into(), text.into());
        }
        Err(_) => {
            line.insert(name.into(), BASE64.encode(bytes).into());
            line.insert(format!("{name}_base64"), true.into());
        }
    }
}

/// `name` in RFC 3339 and `<name>_ms`.
fn time_field(line: &mut Line, name: &str, ms: Millis) {
    line.insert(name.into(), rfc3339(ms));
    line.insert(format!("{name}_ms"), ms.into());
}

/// RFC 3339, or `null` for a time out of its range (the hold of a watch with none is
/// `i64::MIN`).
fn rfc3339(ms: Millis) -> Value {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .map_or(Value::Null, Value::from)
}

/// The bytes as text if they are UTF-8 without control characters other than whitespace.
fn printable(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|t| !t.chars().any(|c| c.is_control() && !c.is_whitespace()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::codec::{Finished, SeenChunk};
    use bytes::Bytes;

    fn watch(key: &[u8]) -> WatchRecord {
        WatchRecord {
            watch_key: Bytes::copy_from_slice(key),
            input_key: Some(Bytes::from_static(b"ik")),
            input_value: Bytes::from_static(br#"{"id": 7}"#),
            input_time: 1_000,
            arrived: 2_000,
            last_new: 3_000,
            polls: 4,
            hold: i64::MIN,
            next_poll: 6_000,
            empty_streak: 1,
            failures: 0,
            seen_chunks: 1,
            finished: None,
            resume: None,
            conditions: None,
        }
    }

    fn line(key: &[u8], value: Option<&[u8]>, options: &Options) -> Option<Value> {
        let line = describe(0, 5, Some(1_796_000_000_000), Some(key), value, options)?;
        Some(serde_json::from_str(&line.to_string()).unwrap())
    }

    #[test]
    fn a_watch_record_reads_as_its_fields() {
        let mut w = watch(b"user-1");
        w.resume = Some(Bytes::from_static(br#"{"last":{"cursor":"c1"}}"#));
        w.finished = Some(Finished {
            at: 7_000,
            reason: "stable".into(),
        });
        let mut conditions = Vec::new();
        conditions.extend_from_slice(&2u16.to_le_bytes());
        conditions.extend_from_slice(b"n1");
        conditions.extend_from_slice(&3u32.to_le_bytes());
        conditions.extend_from_slice(&[1, 2, 3]);
        w.conditions = Some(conditions.into());
        let e = w.to_entry().unwrap();
        // The fields print in a fixed order, the record's place first.
        let text = describe(
            0,
            5,
            Some(1_796_000_000_000),
            Some(&e.key),
            Some(&e.value),
            &Options::default(),
        )
        .unwrap()
        .to_string();
        assert!(
            text.starts_with(concat!(
                r#"{"partition":0,"offset":5,"timestamp":"2026-11-30T00:53:20Z","#,
                r#""timestamp_ms":1796000000000,"kind":"watch","key":"user-1","#,
                r#""record_key":"6:user-1/w","input_key":"ik","input_value":{"id":7},"#,
                r#""input_value_format":"json","input_time":"1970-01-01T00:00:01Z","#,
            )),
            "{text}"
        );
        let l = line(&e.key, Some(&e.value), &Options::default()).unwrap();
        assert_eq!(l["kind"], "watch");
        assert_eq!(l["key"], "user-1");
        assert_eq!(l["record_key"], "6:user-1/w");
        assert_eq!(l["timestamp"], "2026-11-30T00:53:20Z");
        assert_eq!(l["input_key"], "ik");
        assert_eq!(l["input_value"], json!({"id": 7}));
        assert_eq!(l["input_value_format"], "json");
        assert_eq!(l["input_time"], "1970-01-01T00:00:01Z");
        assert_eq!(l["arrived_ms"], 2_000);
        assert_eq!(l["hold"], Value::Null);
        assert_eq!(l["hold_ms"], i64::MIN);
        assert_eq!(l["polls"], 4);
        assert_eq!(
            l["finished"],
            json!({"at": "1970-01-01T00:00:07Z", "at_ms": 7000, "reason": "stable"})
        );
        assert_eq!(l["resume"]["text"], r#"{"last":{"cursor":"c1"}}"#);
        assert_eq!(
            l["conditions"],
            json!([{"name": "n1", "state_base64": "AQID"}])
        );
        assert!(l.get("key_base64").is_none());
    }

    #[test]
    fn bytes_that_are_not_text_are_base64_with_a_flag() {
        let mut w = watch(&[0xff, 0x00]);
        w.input_value = Bytes::from_static(&[0xfe]);
        w.resume = Some(Bytes::from_static(&[0x01]));
        w.conditions = Some(Bytes::from_static(&[9]));
        let e = w.to_entry().unwrap();
        let l = line(&e.key, Some(&e.value), &Options::default()).unwrap();
        assert_eq!(l["key"], "/wA=");
        assert_eq!(l["key_base64"], true);
        assert_eq!(l["record_key_base64"], true);
        assert_eq!(l["input_value"], "/g==");
        assert_eq!(l["input_value_format"], "base64");
        assert_eq!(l["resume"], json!({"base64": "AQ=="}));
        assert!(l["conditions"]["error"]
            .as_str()
            .unwrap()
            .contains("cut short"));
    }

    #[test]
    fn records_that_do_not_decode_are_lines_too() {
        let l = line(b"6:user-1/w", Some(b"\x01\x09"), &Options::default()).unwrap();
        assert_eq!(l["kind"], "undecodable");
        assert_eq!(l["key"], "user-1");
        assert_eq!(l["error"], "unknown state record type 9");
        assert_eq!(l["value_base64"], "AQk=");
        let l = line(b"garbage", None, &Options::default()).unwrap();
        assert_eq!(l["kind"], "undecodable");
        assert_eq!(l["key"], Value::Null);
        assert_eq!(l["value_base64"], Value::Null);
        // Filtered by key, one whose key names no watch is left out.
        let only = Options {
            key: Some(b"user-1".to_vec()),
            ..Options::default()
        };
        assert!(line(b"garbage", None, &only).is_none());
        assert!(line(b"6:user-1/w", Some(b"\x01\x09"), &only).is_some());
    }

    /// A record a newer build wrote is told apart from damage: its version, and why it
    /// cannot be read; counted with the undecodable ones.
    #[test]
    fn a_record_of_a_newer_format_version_is_its_own_kind() {
        let mut v = watch(b"user-1").to_entry().unwrap().value;
        v[0] = 2;
        let l = line(b"6:user-1/w", Some(&v), &Options::default()).unwrap();
        assert_eq!(l["kind"], "newer_version");
        assert_eq!(l["key"], "user-1");
        assert_eq!(l["version"], 2);
        assert_eq!(
            l["error"],
            "written by state format version 2; this build reads version 1"
        );
        assert_eq!(l["value_base64"], BASE64.encode(&v));
        let l = line(b"~mode", Some(&[3, 5]), &Options::default()).unwrap();
        assert_eq!(
            (&l["kind"], &l["version"]),
            (&json!("newer_version"), &json!(3))
        );
    }

    #[test]
    fn the_key_filter_keeps_a_watchs_records_and_the_starts_listing_it() {
        let only = Options {
            key: Some(b"a".to_vec()),
            ..Options::default()
        };
        let mut b = watch(b"b");
        b.seen_chunks = 0;
        let mut a = watch(b"a");
        a.seen_chunks = 0;
        let starts = Starts {
            seq: 3,
            watches: vec![b.clone(), a.clone()],
        }
        .to_entry()
        .unwrap();
        let l = line(&starts.key, Some(&starts.value), &only).unwrap();
        assert_eq!(l["kind"], "starts");
        assert_eq!(l["member_count"], 2);
        assert_eq!(l["members"][1]["key"], "a");
        assert_eq!(l["member"]["key"], "a");
        assert_eq!(l["member"]["input_value"], json!({"id": 7}));
        let all = line(&starts.key, Some(&starts.value), &Options::default()).unwrap();
        assert!(all.get("member").is_none());
        let only_c = Options {
            key: Some(b"c".to_vec()),
            ..Options::default()
        };
        assert!(line(&starts.key, Some(&starts.value), &only_c).is_none());
        let chunk = SeenChunk::new(0, vec![1, 2])
            .unwrap()
            .to_entry(b"b")
            .unwrap();
        assert!(line(&chunk.key, Some(&chunk.value), &only).is_none());
        let offsets = OutputOffsets {
            offsets: vec![(0, 4)],
        }
        .to_entry()
        .unwrap();
        assert!(line(&offsets.key, Some(&offsets.value), &only).is_none());
        let l = line(&offsets.key, Some(&offsets.value), &Options::default()).unwrap();
        assert_eq!(l["offsets"], json!([{"partition": 0, "offset": 4}]));
        let l = line(&offsets.key, None, &Options::default()).unwrap();
        assert_eq!(l["kind"], "tombstone");
        assert_eq!(l["part"], "output_offsets");
    }
}

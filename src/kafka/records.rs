//! The records watchbridge writes: one per new output, and dead letters.
//!
//! An output record: key = watch key, timestamp = the output's event time, value = the
//! output, partition = its input partition's number where the two topics have as many
//! partitions ([`OutputLayout`]), else where the partitioner puts its key. No header by
//! default: a recovery reads the output topic back and knows an output's watch by its key,
//! its input partition by where it is, and its identity from its value (the poller's
//! [`crate::pollers::OutputKeyReader`]). Where it cannot (the topics' partition counts
//! differ, Avro outputs, a poller that cannot read keys back: the files pollers), the
//! `recovery` mode adds one header, `wb-id` (20 bytes: the XXH3-128 hash of the output's
//! identity, then the number of the input partition whose watch found it, both
//! big-endian). None in the exactly-once mode (each commit holds the hashes of the outputs
//! it commits) nor with `at_least_once` (which reads nothing back).
//! Why so lean: every header costs librdkafka allocations on every output, and one halved a
//! plain producer's rate (`make bench`). `WATCHBRIDGE_OUTPUT_HEADERS` adds readable ones
//! ([`OutputHeaders`]): `watchbridge-output-key`, `watchbridge-input-partition` (decimal)
//! and `watchbridge-first-seen` (processing time in ms, decimal). A dead letter keeps the
//! original key, value and headers, and adds `watchbridge-error`, `watchbridge-error-kind`
//! and `watchbridge-source-{topic,partition,offset}`; one refused for its size goes without
//! the value, with `watchbridge-value-dropped` (the value's size in bytes) instead.

use crate::clock::Millis;
use crate::poll::Output;
use crate::seen::OutputHash;
use bytes::Bytes;
use rdkafka::message::Headers;
use std::borrow::Cow;
use std::sync::Arc;

pub const RECOVERY_ID: &str = "wb-id";
pub const OUTPUT_KEY: &str = "watchbridge-output-key";
pub const INPUT_PARTITION: &str = "watchbridge-input-partition";
pub const FIRST_SEEN: &str = "watchbridge-first-seen";
pub const ERROR: &str = "watchbridge-error";
pub const ERROR_KIND: &str = "watchbridge-error-kind";
pub const SOURCE_TOPIC: &str = "watchbridge-source-topic";
pub const SOURCE_PARTITION: &str = "watchbridge-source-partition";
pub const SOURCE_OFFSET: &str = "watchbridge-source-offset";
pub const LATE: &str = "watchbridge-late";
/// The item version of an output (`poll::Output::version`), part of its identity: on every
/// output that has one, so that a recovery that reads the identity from the key (header or
/// value) reads the version beside it.
pub const ITEM_VERSION: &str = "watchbridge-item-version";
pub const VALUE_DROPPED: &str = "watchbridge-value-dropped";
pub const CONTROL: &str = "watchbridge-control";
/// On a repartition record (`kafka/repartition/`): where its input came from,
/// `<topic>/<partition>/<offset>` (a topic name holds no `/`), so that a dead letter the
/// watch side makes of it names the input, not the repartition topic.
pub const INPUT_SOURCE: &str = "watchbridge-input-source";
/// The `CONTROL` value of a settle record ([`OutRecord::settle`]).
const SETTLE: &[u8] = b"settle";
/// The [`CONTROL`] value of a watermark record.
const WATERMARK: &[u8] = b"watermark";

/// Whether `message` carries `watchbridge-control: <value>`.
fn is_control(message: &impl rdkafka::Message, value: &[u8]) -> bool {
    message.headers().is_some_and(|headers| {
        headers
            .iter()
            .any(|h| h.key == CONTROL && h.value == Some(value))
    })
}

/// The headers each output carries: the readable ones `WATCHBRIDGE_OUTPUT_HEADERS` asks
/// for, and `wb-id` where a recovery reads outputs back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputHeaders {
    pub output_key: bool,
    pub input_partition: bool,
    pub first_seen: bool,
    /// `wb-id`: set by the bridge from its guarantee, not by the setting.
    pub recovery_id: bool,
}

impl OutputHeaders {
    /// The names `WATCHBRIDGE_OUTPUT_HEADERS` accepts, in the order they are written.
    pub const NAMES: [&'static str; 3] = ["output_key", "input_partition", "first_seen"];

    /// `WATCHBRIDGE_OUTPUT_HEADERS`: `none`, `all`, or a comma-separated list of
    /// [`Self::NAMES`].
    pub fn parse(setting: &str) -> Result<Self, String> {
        let mut headers = Self::default();
        for name in setting.split(',').map(str::trim) {
            match name {
                "none" | "" => {}
                "all" => {
                    headers.output_key = true;
                    headers.input_partition = true;
                    headers.first_seen = true;
                }
                "output_key" => headers.output_key = true,
                "input_partition" => headers.input_partition = true,
                "first_seen" => headers.first_seen = true,
                other => {
                    return Err(format!(
                        "`{other}` is not a header watchbridge writes; use none, all, or a \
                         comma-separated list of {}",
                        Self::NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(headers)
    }

    fn count(&self) -> usize {
        [
            self.recovery_id,
            self.output_key,
            self.input_partition,
            self.first_seen,
        ]
        .iter()
        .filter(|on| **on)
        .count()
    }
}

/// How outputs are written: their headers and their partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputLayout {
    pub headers: OutputHeaders,
    /// Each output goes to the output partition numbered as its input partition, not where
    /// the partitioner puts its key, so that a recovery knows whose an output is from
    /// where it is. A watch's outputs stay together (and in order) either way.
    pub by_input_partition: bool,
}

impl OutputLayout {
    /// The layout of a bridge whose input and output topics have `input_partitions` and
    /// `output_partitions`: by input partition where they are as many; `wb-id` where a
    /// recovery reads outputs back (`reads_back`) and could not tell them apart without it:
    /// outputs placed by key (whose input partition is not where they are), or values it
    /// cannot read identities from (`keys_from_values`: the poller reads keys back from
    /// values and the values are the items as the poller returned them).
    pub fn choose(
        headers: OutputHeaders,
        input_partitions: i32,
        output_partitions: i32,
        reads_back: bool,
        keys_from_values: bool,
    ) -> Self {
        let by_input_partition = input_partitions == output_partitions;
        Self {
            headers: OutputHeaders {
                recovery_id: reads_back && !(by_input_partition && keys_from_values),
                ..headers
            },
            by_input_partition,
        }
    }
}

/// The `wb-id` header's value: the output's hash and the input partition, big-endian.
pub fn recovery_id(hash: OutputHash, input_partition: i32) -> [u8; 20] {
    let mut id = [0; 20];
    id[..16].copy_from_slice(&hash.to_be_bytes());
    id[16..].copy_from_slice(&input_partition.to_be_bytes());
    id
}

/// A `wb-id` header's value read back: (hash, input partition), if it is one.
pub fn parse_recovery_id(value: &[u8]) -> Option<(OutputHash, i32)> {
    let id: &[u8; 20] = value.try_into().ok()?;
    let hash = OutputHash::from_be_bytes(id[..16].try_into().ok()?);
    let partition = i32::from_be_bytes(id[16..].try_into().ok()?);
    Some((hash, partition))
}

/// A header's name: watchbridge's own are static (no allocation per output), an input's
/// (copied into its dead letter) owned.
pub type HeaderName = Cow<'static, str>;

/// A record to produce, owned, so it can be sent again after a failed delivery.
#[derive(Debug, Clone)]
pub struct OutRecord {
    pub topic: Arc<str>,
    /// `None`: the partitioner picks (by key).
    pub partition: Option<i32>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub timestamp: Option<Millis>,
    pub headers: Vec<(HeaderName, Option<Bytes>)>,
}

/// Where a record that becomes a dead letter came from.
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl OutRecord {
    /// One new output of the watch `watch_key` of `input_partition`, whose identity hashes
    /// to `hash`, written as `layout` says.
    pub fn output(
        topic: &Arc<str>,
        watch_key: &Bytes,
        output: &Output,
        hash: OutputHash,
        input_partition: i32,
        first_seen: Millis,
        layout: OutputLayout,
    ) -> Self {
        let with = layout.headers;
        let mut headers: Vec<(HeaderName, Option<Bytes>)> = Vec::with_capacity(with.count());
        if with.recovery_id {
            let id = recovery_id(hash, input_partition);
            headers.push((RECOVERY_ID.into(), Some(Bytes::copy_from_slice(&id))));
        }
        if with.output_key {
            headers.push((OUTPUT_KEY.into(), Some(output.key.clone())));
        }
        if with.input_partition {
            let partition = Bytes::from(input_partition.to_string());
            headers.push((INPUT_PARTITION.into(), Some(partition)));
        }
        if with.first_seen {
            let first_seen = Bytes::from(first_seen.to_string());
            headers.push((FIRST_SEEN.into(), Some(first_seen)));
        }
        if let Some(version) = &output.version {
            headers.push((ITEM_VERSION.into(), Some(version.clone())));
        }
        Self {
            topic: topic.clone(),
            partition: layout.by_input_partition.then_some(input_partition),
            key: Some(watch_key.clone()),
            value: Some(output.value.clone()),
            // Kafka has no timestamps before the epoch; such an output goes without one.
            timestamp: (output.event_time >= 0).then_some(output.event_time),
            headers,
        }
    }

    /// A dead letter for a record (its key, value, timestamp and headers), with the reason.
    pub fn dead_letter(
        dlq: &Arc<str>,
        original: &OutRecordParts,
        source: Source<'_>,
        kind: &str,
        error: &str,
    ) -> Self {
        let mut headers = original.headers.clone();
        headers.extend([
            (ERROR.into(), Some(Bytes::from(error.to_string()))),
            (ERROR_KIND.into(), Some(Bytes::from(kind.to_string()))),
            (
                SOURCE_TOPIC.into(),
                Some(Bytes::from(source.topic.to_string())),
            ),
            (
                SOURCE_PARTITION.into(),
                Some(Bytes::from(source.partition.to_string())),
            ),
            (
                SOURCE_OFFSET.into(),
                Some(Bytes::from(source.offset.to_string())),
            ),
        ]);
        Self {
            topic: dlq.clone(),
            partition: None,
            key: original.key.clone(),
            value: original.value.clone(),
            timestamp: original.timestamp,
            headers,
        }
    }

    /// The same record without its value, marked `watchbridge-value-dropped: <bytes>`: the
    /// dead letter of a record refused for its size, which its value makes as large.
    pub fn without_value(mut self) -> Self {
        let size = self.value.take().map_or(0, |v| v.len());
        self.headers
            .push((VALUE_DROPPED.into(), Some(Bytes::from(size.to_string()))));
        self
    }

    /// This output as a dead letter: an item the output format cannot hold (it does not fit
    /// `WATCHBRIDGE_OUTPUT_SCHEMA`) goes to `dlq` as it came (JSON), with the reason, and
    /// its watch goes on.
    pub fn misfit(mut self, dlq: &Arc<str>, kind: &str, error: &str) -> Self {
        self.topic = dlq.clone();
        self.headers.extend([
            (ERROR.into(), Some(Bytes::from(error.to_string()))),
            (ERROR_KIND.into(), Some(Bytes::from(kind.to_string()))),
        ]);
        self
    }

    /// Mark an output as late: its event time is below its partition's published watermark.
    pub fn late(mut self) -> Self {
        self.headers
            .push((LATE.into(), Some(Bytes::from_static(b"true"))));
        self
    }

    /// A watermark record: on the watermark topic (`partition: None`), or in-band in one
    /// output partition, marked `watchbridge-control: watermark`.
    pub fn watermark(topic: &Arc<str>, partition: Option<i32>, key: String, json: String) -> Self {
        Self {
            topic: topic.clone(),
            partition,
            key: Some(Bytes::from(key)),
            value: Some(Bytes::from(json)),
            timestamp: None,
            headers: vec![(CONTROL.into(), Some(Bytes::from_static(WATERMARK)))],
        }
    }

    /// A settle record (`partition/settle.rs`): a control record in output partition
    /// `partition` that input partition `input_partition`'s task writes, and waits for, before
    /// it reads the outputs back. Consumers skip it as every `watchbridge-control` record.
    pub fn settle(
        output_topic: &Arc<str>,
        partition: i32,
        input_topic: &str,
        input_partition: i32,
    ) -> Self {
        let json = serde_json::json!({
            "type": "settle",
            "topic": input_topic,
            "partition": input_partition,
        });
        Self {
            topic: output_topic.clone(),
            partition: Some(partition),
            key: Some(Bytes::from(format!(
                "settle:{input_topic}:{input_partition}"
            ))),
            value: Some(Bytes::from(json.to_string())),
            timestamp: None,
            headers: vec![(CONTROL.into(), Some(Bytes::from_static(SETTLE)))],
        }
    }

    /// Whether `message` is a settle record ([`OutRecord::settle`]): it carries no value
    /// for a reader of the watermark topic.
    pub fn is_settle(message: &impl rdkafka::Message) -> bool {
        is_control(message, SETTLE)
    }

    /// Whether `message` is a watermark record ([`OutRecord::watermark`]): on the
    /// repartition topic, an input partition's watermark in-band.
    pub fn is_watermark(message: &impl rdkafka::Message) -> bool {
        is_control(message, WATERMARK)
    }

    /// A partition's watermark as it is published: one record on the watermark topic and a
    /// copy in each of the output topic's `output_partitions` partitions (in-band).
    pub fn watermark_copies(
        message: &crate::watermark::WatermarkMessage,
        watermark_topic: &Arc<str>,
        output_topic: &Arc<str>,
        output_partitions: i32,
    ) -> Vec<Self> {
        let (key, json) = (message.key(), message.to_json());
        std::iter::once((watermark_topic, None))
            .chain((0..output_partitions).map(|p| (output_topic, Some(p))))
            .map(|(topic, partition)| Self::watermark(topic, partition, key.clone(), json.clone()))
            .collect()
    }

    /// A state-topic record (`value` `None`: a tombstone) on state partition `partition`,
    /// the number of the input partition whose watches it describes.
    pub fn state(topic: &Arc<str>, partition: i32, key: Vec<u8>, value: Option<Vec<u8>>) -> Self {
        Self {
            topic: topic.clone(),
            partition: Some(partition),
            key: Some(Bytes::from(key)),
            value: value.map(Bytes::from),
            timestamp: None,
            headers: Vec::new(),
        }
    }

    pub fn parts(&self) -> OutRecordParts {
        OutRecordParts {
            key: self.key.clone(),
            value: self.value.clone(),
            timestamp: self.timestamp,
            headers: self.headers.clone(),
        }
    }
}

/// The content of a record, without its destination.
#[derive(Debug, Clone, Default)]
pub struct OutRecordParts {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub timestamp: Option<Millis>,
    pub headers: Vec<(HeaderName, Option<Bytes>)>,
}

/// The record timestamp of the input a repartition record carries: the record itself is
/// stamped when the stage writes it, so that the repartition topic's time retention counts
/// from then, not from the input's timestamp (an input with an old timestamp, forwarded
/// now, would be deleted at the broker's next retention check, before the watch side read
/// it, were it stamped with it).
pub const INPUT_TIMESTAMP: &str = "watchbridge-input-timestamp";

/// A repartition record's [`INPUT_TIMESTAMP`] header for an input stamped `timestamp`.
pub fn input_timestamp(timestamp: Millis) -> (HeaderName, Option<Bytes>) {
    let value = Bytes::from(timestamp.to_string());
    (INPUT_TIMESTAMP.into(), Some(value))
}

/// The record timestamp of the input `message` is or, `repartitioned`, carries
/// ([`INPUT_TIMESTAMP`]; a repartition record without it, written before it existed, is
/// stamped with its input's timestamp).
pub fn input_record_time(message: &impl rdkafka::Message, repartitioned: bool) -> Option<Millis> {
    let carried = || {
        let headers = message.headers()?;
        let header = headers.iter().find(|h| h.key == INPUT_TIMESTAMP)?;
        std::str::from_utf8(header.value?).ok()?.parse().ok()
    };
    match repartitioned {
        true => carried().or_else(|| message.timestamp().to_millis()),
        false => message.timestamp().to_millis(),
    }
}

/// A repartition record's [`INPUT_SOURCE`] header for the input at `source`.
pub fn input_source(source: &Source<'_>) -> (HeaderName, Option<Bytes>) {
    let value = format!("{}/{}/{}", source.topic, source.partition, source.offset);
    (INPUT_SOURCE.into(), Some(Bytes::from(value)))
}

impl OutRecordParts {
    /// Take out the [`INPUT_SOURCE`] header a repartition record carries: the input's
    /// topic, partition and offset (`None`: no such header, or not readable).
    pub fn take_input_source(&mut self) -> Option<(String, i32, i64)> {
        let at = self.headers.iter().position(|(k, _)| k == INPUT_SOURCE)?;
        let (_, value) = self.headers.remove(at);
        let text = String::from_utf8(value?.to_vec()).ok()?;
        let mut parts = text.rsplitn(3, '/');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        Some((parts.next()?.to_string(), partition, offset))
    }

    /// Copy an input record's content (for its dead letter).
    pub fn of_message(m: &impl rdkafka::Message) -> Self {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_string().into(),
                            h.value.map(Bytes::copy_from_slice),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            key: m.key().map(Bytes::copy_from_slice),
            value: m.payload().map(Bytes::copy_from_slice),
            timestamp: m.timestamp().to_millis(),
            headers,
        }
    }
}

#[cfg(test)]
mod tests {

    /// The watch side takes an input's time from the header its repartition record
    /// carries, and only there.
    #[test]
    fn an_inputs_record_time_is_the_carried_one_on_the_repartition_topic() {
        use rdkafka::message::{OwnedHeaders, OwnedMessage, Timestamp};
        let headers = OwnedHeaders::new().insert(rdkafka::message::Header {
            key: INPUT_TIMESTAMP,
            value: Some("1000"),
        });
        let m = |headers: Option<OwnedHeaders>| {
            OwnedMessage::new(
                None,
                None,
                "t".into(),
                Timestamp::CreateTime(5_000),
                0,
                0,
                headers,
            )
        };
        assert_eq!(
            input_record_time(&m(Some(headers.clone())), true),
            Some(1_000)
        );
        assert_eq!(input_record_time(&m(Some(headers)), false), Some(5_000));
        assert_eq!(
            input_record_time(&m(None), true),
            Some(5_000),
            "written before it"
        );
    }
    use super::*;

    #[test]
    fn a_repartition_record_names_its_input_for_a_dead_letter() {
        let source = Source {
            topic: "users.v2",
            partition: 3,
            offset: 1234,
        };
        let mut parts = OutRecordParts {
            headers: vec![
                ("trace".into(), Some(Bytes::from_static(b"x"))),
                input_source(&source),
            ],
            ..Default::default()
        };
        assert_eq!(
            parts.take_input_source(),
            Some(("users.v2".into(), 3, 1234))
        );
        assert_eq!(parts.headers.len(), 1, "taken out: {:?}", parts.headers);
        assert_eq!(parts.take_input_source(), None);
    }

    #[test]
    fn a_dead_letter_without_its_value_says_how_large_it_was() {
        let record = OutRecord {
            topic: Arc::from("t.dlq"),
            partition: None,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(vec![b'x'; 5000])),
            timestamp: Some(7),
            headers: vec![(ERROR.into(), Some(Bytes::from_static(b"too large")))],
        };
        let stripped = record.without_value();
        assert_eq!(stripped.value, None);
        assert_eq!(stripped.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(stripped.timestamp, Some(7));
        assert_eq!(
            stripped.headers,
            [
                (ERROR.into(), Some(Bytes::from_static(b"too large"))),
                (VALUE_DROPPED.into(), Some(Bytes::from_static(b"5000"))),
            ]
        );
    }

    fn headers_of(r: &OutRecord) -> Vec<(&str, Bytes)> {
        r.headers
            .iter()
            .map(|(k, v)| (k.as_ref(), v.clone().unwrap()))
            .collect()
    }

    #[test]
    fn outputs_carry_the_watch_key_event_time_and_only_the_headers_asked_for() {
        let topic: Arc<str> = "out".into();
        let output = Output::new("ev-9", "{\"a\":1}", 1_700_000_000_000);
        let hash = crate::seen::hash_key(b"ev-9");
        let build = |headers| {
            OutRecord::output(
                &topic,
                &Bytes::from_static(b"user-1"),
                &output,
                hash,
                3,
                1_700_000_000_500,
                OutputLayout {
                    headers,
                    by_input_partition: false,
                },
            )
        };
        // The default where a recovery reads outputs back: one short header.
        let r = build(OutputHeaders {
            recovery_id: true,
            ..OutputHeaders::default()
        });
        assert_eq!(r.key.as_deref(), Some(&b"user-1"[..]));
        assert_eq!(r.timestamp, Some(1_700_000_000_000));
        let h = headers_of(&r);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[0].0, RECOVERY_ID);
        assert_eq!(h[0].1.len(), 20);
        assert_eq!(parse_recovery_id(&h[0].1), Some((hash, 3)));
        // at_least_once, nothing asked for: no header, and no header list to allocate.
        let bare = build(OutputHeaders::default());
        assert!(bare.headers.is_empty());
        assert_eq!(bare.headers.capacity(), 0);
        // Everything readable too.
        let mut all = OutputHeaders::parse("all").unwrap();
        all.recovery_id = true;
        let full = build(all);
        let h = headers_of(&full);
        assert_eq!(
            h.len(),
            4,
            "the watch key is the record's key, not a header too"
        );
        assert_eq!(h[1], (OUTPUT_KEY, Bytes::from_static(b"ev-9")));
        assert_eq!(h[2], (INPUT_PARTITION, Bytes::from_static(b"3")));
        assert_eq!(h[3], (FIRST_SEEN, Bytes::from_static(b"1700000000500")));
        let early = OutRecord::output(
            &topic,
            &Bytes::new(),
            &Output::new("k", "v", -5),
            0,
            0,
            0,
            OutputLayout::default(),
        );
        assert_eq!(early.timestamp, None);
    }

    #[test]
    fn outputs_go_without_a_header_where_a_recovery_can_tell_them_apart_without_one() {
        let none = OutputHeaders::default();
        // As many partitions, keys read back from values: nothing but key, value, time, and
        // the input partition's number as the partition.
        let lean = OutputLayout::choose(none, 4, 4, true, true);
        assert_eq!(
            lean,
            OutputLayout {
                headers: none,
                by_input_partition: true
            }
        );
        let output = Output::new("ev-9", "{\"id\":\"ev-9\"}", 1_700_000_000_000);
        let r = OutRecord::output(
            &"out".into(),
            &Bytes::from_static(b"user-1"),
            &output,
            crate::seen::hash_key(b"ev-9"),
            3,
            0,
            lean,
        );
        assert_eq!((r.partition, r.headers.len()), (Some(3), 0));
        // The identity cannot be read back from the value: `wb-id`.
        let opaque = OutputLayout::choose(none, 4, 4, true, false);
        assert!(opaque.headers.recovery_id && opaque.by_input_partition);
        // The output topic has more partitions: placed by key, so `wb-id` names the input
        // partition.
        let wider = OutputLayout::choose(none, 4, 8, true, true);
        assert!(wider.headers.recovery_id && !wider.by_input_partition);
        // Nothing read back (at_least_once, exactly_once): no `wb-id` at all.
        let unread = OutputLayout::choose(none, 4, 8, false, false);
        assert!(!unread.headers.recovery_id);
        // The readable headers asked for stay.
        let asked = OutputHeaders::parse("output_key").unwrap();
        assert!(
            OutputLayout::choose(asked, 4, 4, true, true)
                .headers
                .output_key
        );
    }

    #[test]
    fn the_output_headers_setting_names_what_it_does_not_know() {
        assert_eq!(
            OutputHeaders::parse("none").unwrap(),
            OutputHeaders::default()
        );
        let some = OutputHeaders::parse("first_seen, output_key").unwrap();
        assert!(some.first_seen && some.output_key && !some.input_partition);
        assert!(
            !some.recovery_id,
            "wb-id is the bridge's, not the setting's"
        );
        let e = OutputHeaders::parse("output_key,trace").unwrap_err();
        assert!(e.contains("`trace`") && e.contains("first_seen"), "{e}");
    }

    #[test]
    fn a_recovery_id_is_twenty_bytes_or_nothing() {
        let id = recovery_id(u128::MAX - 5, 17);
        assert_eq!(parse_recovery_id(&id), Some((u128::MAX - 5, 17)));
        assert_eq!(parse_recovery_id(&id[..19]), None);
        assert_eq!(parse_recovery_id(b"3"), None);
    }

    #[test]
    fn dead_letters_keep_the_original_and_say_where_it_came_from() {
        let original = OutRecordParts {
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"{oops")),
            timestamp: Some(5),
            headers: vec![("trace".into(), Some(Bytes::from_static(b"t1")))],
        };
        let dlq: Arc<str> = "in.dlq".into();
        let r = OutRecord::dead_letter(
            &dlq,
            &original,
            Source {
                topic: "in",
                partition: 3,
                offset: 42,
            },
            "not_json",
            "value is not JSON",
        );
        assert_eq!(&*r.topic, "in.dlq");
        assert_eq!(r.value.as_deref(), Some(&b"{oops"[..]));
        let get = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("trace"), "t1");
        assert_eq!(get(ERROR_KIND), "not_json");
        assert_eq!(get(SOURCE_PARTITION), "3");
        assert_eq!(get(SOURCE_OFFSET), "42");
        assert_eq!(get(SOURCE_TOPIC), "in");
    }
}

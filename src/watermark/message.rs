//! Watermarks as Kafka records on the watermark topic, so consumers of the output topic can
//! tell when an event time is complete.
//!
//! One record per change, keyed `partition-<p>` for an input partition's watermark and
//! `merged` for the instance's merged one, its value one line of JSON:
//!
//! ```text
//! {"kind":"watermark","scope":"partition","topic":"<input topic>","partition":3,"watermark_ms":1700000000000,"idle":false}
//! {"kind":"watermark","scope":"merged","topic":"<input topic>","watermark_ms":1700000000000}
//! ```
//!
//! The field order is part of the format (readers may compare text), and serde_json sorts
//! an object's keys unless built with `preserve_order`, so the text is laid out here and
//! serde_json only escapes the topic. [`WatermarkMessage::parse`] reads either form back,
//! ignoring fields it does not know.

use crate::clock::Millis;
use serde_json::Value;

/// The record key of the merged watermark.
pub const MERGED_KEY: &str = "merged";

/// The record key of an input partition's watermark.
pub fn partition_key(partition: i32) -> String {
    format!("partition-{partition}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatermarkMessage {
    /// One input partition's watermark and whether it is idle.
    Partition {
        topic: String,
        partition: i32,
        watermark_ms: Millis,
        idle: bool,
    },
    /// The merged watermark over the partitions this instance holds.
    Merged { topic: String, watermark_ms: Millis },
}

/// A watermark topic value that is not a watermark message, saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a watermark message: {0}")]
pub struct MessageError(pub String);

impl WatermarkMessage {
    /// The record key: `partition-<p>` or `merged`.
    pub fn key(&self) -> String {
        match self {
            Self::Partition { partition, .. } => partition_key(*partition),
            Self::Merged { .. } => MERGED_KEY.to_owned(),
        }
    }

    /// The record value (see the module doc for the exact form).
    pub fn to_json(&self) -> String {
        match self {
            Self::Partition {
                topic,
                partition,
                watermark_ms,
                idle,
            } => format!(
                r#"{{"kind":"watermark","scope":"partition","topic":{},"partition":{partition},"watermark_ms":{watermark_ms},"idle":{idle}}}"#,
                json_string(topic)
            ),
            Self::Merged {
                topic,
                watermark_ms,
            } => format!(
                r#"{{"kind":"watermark","scope":"merged","topic":{},"watermark_ms":{watermark_ms}}}"#,
                json_string(topic)
            ),
        }
    }

    /// Read a record value back.
    pub fn parse(value: &[u8]) -> Result<Self, MessageError> {
        let bad = |m: String| Err(MessageError(m));
        let doc: Value = match serde_json::from_slice(value) {
            Ok(doc) => doc,
            Err(e) => return bad(format!("value is not JSON: {e}")),
        };
        let Some(obj) = doc.as_object() else {
            return bad("value is not a JSON object".to_owned());
        };
        let field = |name: &str| obj.get(name).ok_or_else(|| missing(name));
        match field("kind")?.as_str() {
            Some("watermark") => {}
            _ => return bad(r#""kind" is not "watermark""#.to_owned()),
        }
        let topic = field("topic")?
            .as_str()
            .ok_or_else(|| wrong("topic", "a string"))?
            .to_owned();
        let watermark_ms = field("watermark_ms")?
            .as_i64()
            .ok_or_else(|| wrong("watermark_ms", "a whole number of milliseconds"))?;
        match field("scope")?.as_str() {
            Some("partition") => {
                let partition = field("partition")?
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .filter(|p| *p >= 0)
                    .ok_or_else(|| wrong("partition", "a partition number"))?;
                let idle = field("idle")?
                    .as_bool()
                    .ok_or_else(|| wrong("idle", "true or false"))?;
                Ok(Self::Partition {
                    topic,
                    partition,
                    watermark_ms,
                    idle,
                })
            }
            Some("merged") => Ok(Self::Merged {
                topic,
                watermark_ms,
            }),
            _ => bad(r#""scope" is neither "partition" nor "merged""#.to_owned()),
        }
    }
}

fn json_string(s: &str) -> String {
    Value::from(s).to_string()
}

fn missing(name: &str) -> MessageError {
    MessageError(format!("no \"{name}\" field"))
}

fn wrong(name: &str, expected: &str) -> MessageError {
    MessageError(format!("\"{name}\" is not {expected}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn partition_msg() -> WatermarkMessage {
        WatermarkMessage::Partition {
            topic: "inputs".into(),
            partition: 3,
            watermark_ms: 1_700_000_000_000,
            idle: false,
        }
    }

    #[test]
    fn the_exact_json_and_keys() {
        let p = partition_msg();
        assert_eq!(
            p.to_json(),
            r#"{"kind":"watermark","scope":"partition","topic":"inputs","partition":3,"watermark_ms":1700000000000,"idle":false}"#
        );
        assert_eq!(p.key(), "partition-3");
        let m = WatermarkMessage::Merged {
            topic: "inputs".into(),
            watermark_ms: -5,
        };
        assert_eq!(
            m.to_json(),
            r#"{"kind":"watermark","scope":"merged","topic":"inputs","watermark_ms":-5}"#
        );
        assert_eq!(m.key(), "merged");
        assert_eq!(partition_key(0), "partition-0");
    }

    #[test]
    fn the_topic_is_escaped() {
        let m = WatermarkMessage::Merged {
            topic: "a\"b\\c\n".into(),
            watermark_ms: 1,
        };
        assert_eq!(
            m.to_json(),
            r#"{"kind":"watermark","scope":"merged","topic":"a\"b\\c\n","watermark_ms":1}"#
        );
        assert_eq!(WatermarkMessage::parse(m.to_json().as_bytes()), Ok(m));
    }

    #[test]
    fn parse_reads_both_forms_back_and_ignores_unknown_fields() {
        let p = partition_msg();
        assert_eq!(WatermarkMessage::parse(p.to_json().as_bytes()), Ok(p));
        let text =
            br#"{"watermark_ms":7,"extra":[1],"topic":"t","scope":"merged","kind":"watermark"}"#;
        assert_eq!(
            WatermarkMessage::parse(text),
            Ok(WatermarkMessage::Merged {
                topic: "t".into(),
                watermark_ms: 7
            })
        );
    }

    #[test]
    fn parse_says_what_is_wrong() {
        let err = |s: &str| {
            WatermarkMessage::parse(s.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(err("nope").starts_with("not a watermark message: value is not JSON: "));
        assert_eq!(
            err("[1]"),
            "not a watermark message: value is not a JSON object"
        );
        assert_eq!(
            err(r#"{"kind":"output"}"#),
            r#"not a watermark message: "kind" is not "watermark""#
        );
        assert_eq!(
            err(r#"{"kind":"watermark","scope":"merged","topic":"t"}"#),
            r#"not a watermark message: no "watermark_ms" field"#
        );
        assert_eq!(
            err(r#"{"kind":"watermark","scope":"merged","topic":"t","watermark_ms":1.5}"#),
            r#"not a watermark message: "watermark_ms" is not a whole number of milliseconds"#
        );
        assert_eq!(
            err(r#"{"kind":"watermark","scope":"all","topic":"t","watermark_ms":1}"#),
            r#"not a watermark message: "scope" is neither "partition" nor "merged""#
        );
        assert_eq!(
            err(
                r#"{"kind":"watermark","scope":"partition","topic":"t","watermark_ms":1,"partition":-1,"idle":false}"#
            ),
            r#"not a watermark message: "partition" is not a partition number"#
        );
        assert_eq!(
            err(
                r#"{"kind":"watermark","scope":"partition","topic":"t","watermark_ms":1,"partition":1}"#
            ),
            r#"not a watermark message: no "idle" field"#
        );
        assert_eq!(
            err(r#"{"kind":"watermark","scope":"partition","topic":7,"watermark_ms":1}"#),
            r#"not a watermark message: "topic" is not a string"#
        );
    }

    proptest! {
        #[test]
        fn encode_then_parse_gives_the_same_message(
            topic in any::<String>(),
            partition in 0i32..=i32::MAX,
            watermark_ms in any::<i64>(),
            idle in any::<bool>(),
            merged in any::<bool>(),
        ) {
            let msg = if merged {
                WatermarkMessage::Merged { topic, watermark_ms }
            } else {
                WatermarkMessage::Partition { topic, partition, watermark_ms, idle }
            };
            let json = msg.to_json();
            prop_assert_eq!(WatermarkMessage::parse(json.as_bytes()), Ok(msg), "{}", json);
        }
    }
}

//! Input records → what a watch is started from: the watch key (the record key, or the
//! field `WATCHBRIDGE_WATCH_KEY` points at), the decoded JSON value, and the record's
//! timestamp. A record that cannot be decoded or has no key is [`Rejected`], with the reason
//! the dead-letter record carries (the partition task adds `unresolvable` and `too_large`).

use crate::clock::Millis;
use bytes::Bytes;
use serde_json::Value;

/// A decoded input record.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub key: Bytes,
    pub value: Value,
    pub timestamp: Millis,
}

/// Why an input record cannot become a watch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("value is not JSON: {0}")]
    NotJson(String),
    #[error("{0}")]
    NoKey(String),
    /// The poller cannot derive a resource from it (a missing field, an unsafe value).
    #[error("{0}")]
    Unresolvable(String),
    /// Its watch record would be larger than a state record may be: its watch could not be
    /// saved (and would be lost at the next restart while its input is committed).
    #[error("its watch cannot be saved to the state topic: {0}")]
    TooLarge(String),
}

impl Rejected {
    /// A fixed label for metrics and the `watchbridge-error-kind` header.
    pub fn kind(&self) -> &'static str {
        match self {
            Rejected::NotJson(_) => "not_json",
            Rejected::NoKey(_) => "no_key",
            Rejected::Unresolvable(_) => "unresolvable",
            Rejected::TooLarge(_) => "too_large",
        }
    }
}

/// Decode one record. `watch_key` is a JSON pointer into the value, or `None` for the
/// record key; `now` stands in for a record without a timestamp.
pub fn decode(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    timestamp: Option<Millis>,
    watch_key: Option<&str>,
    now: Millis,
) -> Result<Input, Rejected> {
    let payload = payload.unwrap_or_default();
    let value: Value = serde_json::from_slice(payload).map_err(|e| {
        Rejected::NotJson(if payload.is_empty() {
            "the record has no value".to_string()
        } else {
            e.to_string()
        })
    })?;
    let key = match watch_key {
        None => match key {
            Some(k) if !k.is_empty() => Bytes::copy_from_slice(k),
            _ => {
                return Err(Rejected::NoKey(
                    "the record has no key (set WATCHBRIDGE_WATCH_KEY to take the watch key from the value)"
                        .into(),
                ))
            }
        },
        Some(pointer) => match value.pointer(pointer) {
            Some(Value::String(s)) if !s.is_empty() => Bytes::from(s.clone().into_bytes()),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Bytes::from(v.to_string().into_bytes()),
            Some(Value::String(_)) => {
                return Err(Rejected::NoKey(format!(
                    "the field at WATCHBRIDGE_WATCH_KEY `{pointer}` is empty"
                )))
            }
            Some(_) => {
                return Err(Rejected::NoKey(format!(
                    "the field at WATCHBRIDGE_WATCH_KEY `{pointer}` is not a string, number or boolean"
                )))
            }
            None => {
                return Err(Rejected::NoKey(format!(
                    "the value has no field at WATCHBRIDGE_WATCH_KEY `{pointer}`"
                )))
            }
        },
    };
    Ok(Input {
        key,
        value,
        timestamp: timestamp.unwrap_or(now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}

//! An input's event time from a field of its value (`WATCHBRIDGE_INPUT_TIME`), as Flink's
//! `TimestampAssigner` and Kafka Connect's `TimestampExtractor` take it: the record
//! timestamp is often when a producer wrote it, the field when the thing happened.
//!
//! A number is an epoch time in the declared unit (`WATCHBRIDGE_INPUT_TIME_UNIT`: `ms`,
//! the default, `s` or `us`; a fraction is allowed, e.g. seconds `1733087616.5`); a string
//! is an RFC 3339 time with its offset (`2026-12-01T21:13:36.123Z`), or an epoch number
//! written as text. An Avro `timestamp-*` field maps to RFC 3339 text, so it is read the
//! same way (`crate::avro::json`).

use crate::clock::Millis;
use serde_json::Value;

/// The unit of an epoch number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Seconds,
    Millis,
    Micros,
}

impl std::str::FromStr for TimeUnit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "s" => Ok(Self::Seconds),
            "ms" => Ok(Self::Millis),
            "us" => Ok(Self::Micros),
            other => Err(format!("`{other}` is not a unit: use `ms`, `s` or `us`")),
        }
    }
}

/// What to do with an input whose time field is missing or unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFallback {
    /// Send it to the dead-letter topic (reason `no_time`).
    DeadLetter,
    /// Use its record timestamp.
    RecordTimestamp,
}

impl std::str::FromStr for TimeFallback {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dead_letter" => Ok(Self::DeadLetter),
            "record_timestamp" => Ok(Self::RecordTimestamp),
            other => Err(format!(
                "`{other}` is not a fallback: use `dead_letter` or `record_timestamp`"
            )),
        }
    }
}

/// Where an input's time is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputTime {
    pub pointer: String,
    pub unit: TimeUnit,
    pub fallback: TimeFallback,
}

/// Reads an input's event time (Flink's `TimestampAssigner`): the time its watch's first
/// hold starts at and its partition's watermark generator sees. `WATCHBRIDGE_INPUT_TIME`
/// is one ([`InputTime`]); without any, an input's time is its record timestamp.
pub trait TimestampAssigner: Send + Sync + std::fmt::Debug + 'static {
    /// The event time of the input whose decoded value is `value`; `record_timestamp` is
    /// its Kafka record timestamp (the time it was read, for a record without one). `Err`:
    /// the input has no usable time, and is dead-lettered with reason `no_time` and this
    /// message.
    fn extract_timestamp(&self, value: &Value, record_timestamp: Millis) -> Result<Millis, String>;
}

/// `WATCHBRIDGE_INPUT_TIME`: the field's time, or its fallback.
impl TimestampAssigner for InputTime {
    fn extract_timestamp(&self, value: &Value, record_timestamp: Millis) -> Result<Millis, String> {
        match (self.read(value), self.fallback) {
            (Ok(t), _) => Ok(t),
            (Err(_), TimeFallback::RecordTimestamp) => Ok(record_timestamp),
            (Err(e), TimeFallback::DeadLetter) => Err(e),
        }
    }
}

/// Epoch milliseconds of year 10000: later (or as far before 1970) is not a time a
/// watermark can mean; most likely a unit mix-up (microseconds read as milliseconds).
const LIMIT_MS: i128 = 253_402_300_800_000;

impl InputTime {
    /// The time of `value`, or why it has none (the dead-letter reason).
    pub fn read(&self, value: &Value) -> Result<Millis, String> {
        let pointer = &self.pointer;
        let field = value.pointer(pointer).ok_or_else(|| {
            format!("the value has no field at WATCHBRIDGE_INPUT_TIME `{pointer}`")
        })?;
        let ms = match field {
            Value::Number(n) => self.epoch(&n.to_string()),
            Value::String(s) if looks_numeric(s) => self.epoch(s),
            Value::String(s) => rfc3339(s),
            _ => Err("is neither a number nor a string".to_string()),
        };
        ms.map_err(|e| {
            format!(
                "the field at WATCHBRIDGE_INPUT_TIME `{pointer}` ({}) {e}",
                crate::logging::outside(&field.to_string())
            )
        })
    }

    fn epoch(&self, text: &str) -> Result<Millis, String> {
        let per_ms: f64 = match self.unit {
            TimeUnit::Seconds => 1000.0,
            TimeUnit::Millis => 1.0,
            TimeUnit::Micros => 0.001,
        };
        // Integers exactly (an i64 of microseconds does not fit an f64), fractions as f64.
        let ms: i128 = match text.parse::<i128>() {
            Ok(n) => match self.unit {
                TimeUnit::Seconds => n.saturating_mul(1000),
                TimeUnit::Millis => n,
                TimeUnit::Micros => n.div_euclid(1000),
            },
            Err(_) => match text.parse::<f64>() {
                Ok(f) if f.is_finite() => (f * per_ms).floor() as i128,
                _ => return Err("is not a number".to_string()),
            },
        };
        in_range(ms)
    }
}

fn looks_numeric(s: &str) -> bool {
    let s = s.strip_prefix('-').unwrap_or(s);
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

fn rfc3339(s: &str) -> Result<Millis, String> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("is not an RFC 3339 time with an offset ({e})"))?;
    in_range(t.unix_timestamp_nanos().div_euclid(1_000_000))
}

fn in_range(ms: i128) -> Result<Millis, String> {
    if (-LIMIT_MS..LIMIT_MS).contains(&ms) {
        Ok(ms as Millis)
    } else {
        Err("is beyond year 9999 (is the unit, WATCHBRIDGE_INPUT_TIME_UNIT, right?)".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(unit: TimeUnit) -> InputTime {
        InputTime {
            pointer: "/t".into(),
            unit,
            fallback: TimeFallback::DeadLetter,
        }
    }

    #[test]
    fn epoch_numbers_are_read_in_their_unit() {
        let ms = at(TimeUnit::Millis);
        assert_eq!(
            ms.read(&json!({"t": 1_733_087_616_123_i64})),
            Ok(1_733_087_616_123)
        );
        assert_eq!(
            ms.read(&json!({"t": "1733087616123"})),
            Ok(1_733_087_616_123)
        );
        let s = at(TimeUnit::Seconds);
        assert_eq!(s.read(&json!({"t": 1_733_087_616})), Ok(1_733_087_616_000));
        assert_eq!(
            s.read(&json!({"t": 1_733_087_616.5})),
            Ok(1_733_087_616_500)
        );
        let us = at(TimeUnit::Micros);
        assert_eq!(
            us.read(&json!({"t": 1_733_087_616_123_456_i64})),
            Ok(1_733_087_616_123)
        );
        // Before 1970, rounded down like every other time.
        assert_eq!(us.read(&json!({"t": -1500})), Ok(-2));
    }

    #[test]
    fn rfc3339_text_is_read_with_its_offset() {
        let t = at(TimeUnit::Millis);
        assert_eq!(
            t.read(&json!({"t": "2024-12-01T21:13:36.123Z"})),
            Ok(1_733_087_616_123)
        );
        assert_eq!(
            t.read(&json!({"t": "2024-12-01T22:13:36.123456+01:00"})),
            Ok(1_733_087_616_123)
        );
    }

    #[test]
    fn a_missing_or_unreadable_time_says_where_and_why() {
        let t = at(TimeUnit::Millis);
        let e = t.read(&json!({"x": 1})).unwrap_err();
        assert!(e.contains("no field") && e.contains("`/t`"), "{e}");
        for (value, why) in [
            (json!({"t": "yesterday"}), "RFC 3339"),
            // An Avro local-timestamp maps to text without an offset: not a point in time.
            (json!({"t": "2024-12-01T21:13:36.123"}), "RFC 3339"),
            (json!({"t": true}), "neither a number nor a string"),
            (json!({"t": null}), "neither"),
            // Microseconds read as milliseconds.
            (json!({"t": 1_733_087_616_123_456_i64}), "year 9999"),
        ] {
            let e = t.read(&value).unwrap_err();
            assert!(e.contains(why) && e.contains("`/t`"), "{value}: {e}");
        }
    }

    #[test]
    fn settings_parse_or_name_the_choices() {
        assert_eq!("s".parse::<TimeUnit>(), Ok(TimeUnit::Seconds));
        assert!("sec".parse::<TimeUnit>().unwrap_err().contains("`ms`"));
        assert_eq!(
            "record_timestamp".parse::<TimeFallback>(),
            Ok(TimeFallback::RecordTimestamp)
        );
        assert!("skip".parse::<TimeFallback>().is_err());
    }
}

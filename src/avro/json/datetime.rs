//! The logical types of time both ways: dates, times of day, timestamps (UTC and local) in
//! their text or as the numbers Avro holds, and durations.

use super::mismatch::Path;
use super::scalars::{bytes, integer, Mode};
use super::Mismatch;
use apache_avro::types::Value;
use apache_avro::{Days, Duration, Millis, Months};
use serde_json::Value as Json;
use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, UtcOffset};

#[derive(Clone, Copy)]
pub(super) enum TimeUnit {
    Millis,
    Micros,
    Nanos,
}

impl TimeUnit {
    fn nanos(self) -> i64 {
        match self {
            TimeUnit::Millis => 1_000_000,
            TimeUnit::Micros => 1_000,
            TimeUnit::Nanos => 1,
        }
    }

    /// Digits of the unit's fraction of a second.
    fn digits(self) -> usize {
        match self {
            TimeUnit::Millis => 3,
            TimeUnit::Micros => 6,
            TimeUnit::Nanos => 9,
        }
    }
}

/// Julian day of 1970-01-01, Avro's day 0.
const EPOCH_JULIAN_DAY: i32 = 2_440_588;
const NANOS_PER_DAY: i64 = 86_400_000_000_000;

pub(super) fn date_json(days: i32) -> Json {
    days.checked_add(EPOCH_JULIAN_DAY)
        .and_then(|julian| Date::from_julian_day(julian).ok())
        .filter(|date| (0..=9999).contains(&date.year()))
        .map_or_else(
            || Json::from(days),
            |date| {
                Json::String(format!(
                    "{:04}-{:02}-{:02}",
                    date.year(),
                    u8::from(date.month()),
                    date.day()
                ))
            },
        )
}

pub(super) fn time_json(count: i64, unit: TimeUnit) -> Json {
    match count.checked_mul(unit.nanos()) {
        Some(nanos) if (0..NANOS_PER_DAY).contains(&nanos) => {
            let seconds = nanos / 1_000_000_000;
            Json::String(format!(
                "{:02}:{:02}:{:02}.{}",
                seconds / 3600,
                seconds / 60 % 60,
                seconds % 60,
                fraction(nanos % 1_000_000_000, unit)
            ))
        }
        _ => Json::from(count),
    }
}

/// The fraction of a second in `unit`'s digits.
fn fraction(nanos: i64, unit: TimeUnit) -> String {
    format!("{:0width$}", nanos / unit.nanos(), width = unit.digits())
}

pub(super) fn timestamp_json(count: i64, unit: TimeUnit, utc: bool) -> Json {
    let nanos = i128::from(count) * i128::from(unit.nanos());
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) if (0..=9999).contains(&t.year()) => Json::String(format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{}{}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            fraction(i64::from(t.nanosecond()), unit),
            if utc { "Z" } else { "" }
        )),
        _ => Json::from(count),
    }
}

/// `"YYYY-MM-DD"` as days since 1970-01-01.
pub(super) fn parse_date(text: &str) -> Option<i32> {
    let b = text.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let year: i32 = digits_value(&b[0..4])?.try_into().ok()?;
    let month = Month::try_from(u8::try_from(digits_value(&b[5..7])?).ok()?).ok()?;
    let day = u8::try_from(digits_value(&b[8..10])?).ok()?;
    let date = Date::from_calendar_date(year, month, day).ok()?;
    Some(date.to_julian_day() - EPOCH_JULIAN_DAY)
}

fn digits_value(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
    })
}

/// A time of day, `"HH:MM:SS[.fraction]"` or a count of `unit` since midnight, as that
/// count; a finer fraction is truncated.
pub(super) fn time_count(json: &Json, unit: TimeUnit) -> Option<i64> {
    let nanos_per = unit.nanos();
    let count = match json {
        Json::String(s) => parse_time_nanos(s)? / nanos_per,
        _ => integer(json)?,
    };
    (0..NANOS_PER_DAY / nanos_per)
        .contains(&count)
        .then_some(count)
}

fn parse_time_nanos(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let (h, m, s) = (
        digits_value(&b[0..2])?,
        digits_value(&b[3..5])?,
        digits_value(&b[6..8])?,
    );
    if h > 23 || m > 59 || s > 59 {
        return None;
    }
    let nanos = match &b[8..] {
        [] => 0,
        [b'.', part @ ..] if (1..=9).contains(&part.len()) => {
            digits_value(part)? * 10u32.pow(9 - part.len() as u32)
        }
        _ => return None,
    };
    Some(
        (i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(s)) * 1_000_000_000 + i64::from(nanos),
    )
}

/// A timestamp, RFC 3339 text or a count of `unit` since the epoch, as that count. A local
/// timestamp's text has no zone (or `Z`), and is read as wall-clock time.
pub(super) fn timestamp_count(
    json: &Json,
    unit: TimeUnit,
    utc: bool,
    path: &Path,
) -> Result<i64, Mismatch> {
    let what = match (utc, unit) {
        (true, TimeUnit::Millis) => "a timestamp-millis (RFC 3339 text or epoch milliseconds)",
        (true, TimeUnit::Micros) => "a timestamp-micros (RFC 3339 text or epoch microseconds)",
        (true, TimeUnit::Nanos) => "a timestamp-nanos (RFC 3339 text or epoch nanoseconds)",
        (false, TimeUnit::Millis) => "a local-timestamp-millis (text without zone or a number)",
        (false, TimeUnit::Micros) => "a local-timestamp-micros (text without zone or a number)",
        (false, TimeUnit::Nanos) => "a local-timestamp-nanos (text without zone or a number)",
    };
    let count = match json {
        Json::String(s) => {
            let parsed = match OffsetDateTime::parse(s, &Rfc3339) {
                Ok(t) if utc || t.offset() == UtcOffset::UTC => Some(t),
                Ok(_) => None,
                Err(_) if !utc => OffsetDateTime::parse(&format!("{s}Z"), &Rfc3339).ok(),
                Err(_) => None,
            };
            parsed.and_then(|t| {
                i64::try_from(
                    t.unix_timestamp_nanos()
                        .div_euclid(i128::from(unit.nanos())),
                )
                .ok()
            })
        }
        _ => integer(json),
    };
    count.ok_or_else(|| path.expected(what, json))
}

pub(super) fn duration_value(json: &Json, path: &Path, mode: Mode) -> Result<Value, Mismatch> {
    if mode == Mode::Default {
        let raw: [u8; 12] = bytes(json, mode)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| path.expected("12 duration bytes as code points", json))?;
        return Ok(Value::Duration(Duration::from(raw)));
    }
    let object = json.as_object().ok_or_else(|| {
        path.expected(
            "a duration {\"months\": n, \"days\": n, \"millis\": n}",
            json,
        )
    })?;
    let part = |name: &str| -> Result<u32, Mismatch> {
        let at = Path::Key(path, name);
        let item = object
            .get(name)
            .ok_or_else(|| path.mismatch(format!("missing field `{name}` of a duration")))?;
        integer(item)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| at.expected("an unsigned 32-bit integer", item))
    };
    Ok(Value::Duration(Duration::new(
        Months::new(part("months")?),
        Days::new(part("days")?),
        Millis::new(part("millis")?),
    )))
}

#[cfg(test)]
mod tests {
    use crate::avro::json::tests::{mismatch, round_trip, schema, written_as};
    use crate::avro::json::to_json;
    use apache_avro::types::Value;
    use apache_avro::{Days, Duration, Millis, Months};
    use serde_json::json;

    #[test]
    fn dates_and_times() {
        round_trip(
            r#"{"type": "int", "logicalType": "date"}"#,
            Value::Date(20_788),
            json!("2026-12-01"),
        );
        round_trip(
            r#"{"type": "int", "logicalType": "date"}"#,
            Value::Date(-1),
            json!("1969-12-31"),
        );
        round_trip(
            r#"{"type": "int", "logicalType": "time-millis"}"#,
            Value::TimeMillis(76_416_123),
            json!("21:13:36.123"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "time-micros"}"#,
            Value::TimeMicros(76_416_000_042),
            json!("21:13:36.000042"),
        );
        written_as(
            r#"{"type": "int", "logicalType": "date"}"#,
            json!(20_788),
            json!("2026-12-01"),
        );
        written_as(
            r#"{"type": "int", "logicalType": "time-millis"}"#,
            json!("21:13:36"),
            json!("21:13:36.000"),
        );
        written_as(
            r#"{"type": "int", "logicalType": "time-millis"}"#,
            json!(1),
            json!("00:00:00.001"),
        );
    }

    const AT_MILLIS: i64 = 1_796_159_616_123; // 2026-12-01T21:13:36.123Z

    #[test]
    fn timestamps_are_rfc3339_utc() {
        round_trip(
            r#"{"type": "long", "logicalType": "timestamp-millis"}"#,
            Value::TimestampMillis(AT_MILLIS),
            json!("2026-12-01T21:13:36.123Z"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "timestamp-micros"}"#,
            Value::TimestampMicros(AT_MILLIS * 1000 + 456),
            json!("2026-12-01T21:13:36.123456Z"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "timestamp-nanos"}"#,
            Value::TimestampNanos(AT_MILLIS * 1_000_000 + 456_789),
            json!("2026-12-01T21:13:36.123456789Z"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "timestamp-millis"}"#,
            Value::TimestampMillis(-1),
            json!("1969-12-31T23:59:59.999Z"),
        );
    }

    #[test]
    fn local_timestamps_have_no_zone() {
        round_trip(
            r#"{"type": "long", "logicalType": "local-timestamp-millis"}"#,
            Value::LocalTimestampMillis(AT_MILLIS),
            json!("2026-12-01T21:13:36.123"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "local-timestamp-micros"}"#,
            Value::LocalTimestampMicros(AT_MILLIS * 1000),
            json!("2026-12-01T21:13:36.123000"),
        );
        round_trip(
            r#"{"type": "long", "logicalType": "local-timestamp-nanos"}"#,
            Value::LocalTimestampNanos(AT_MILLIS * 1_000_000 + 7),
            json!("2026-12-01T21:13:36.123000007"),
        );
        let local = r#"{"type": "long", "logicalType": "local-timestamp-millis"}"#;
        written_as(
            local,
            json!("2026-12-01T21:13:36.123Z"),
            json!("2026-12-01T21:13:36.123"),
        );
        assert_eq!(
            mismatch(local, json!("2026-12-01T21:13:36+01:00")),
            "at the top: expected a local-timestamp-millis (text without zone or a number), \
             found \"2026-12-01T21:13:36+01:00\""
        );
    }

    #[test]
    fn timestamps_are_read_from_text_with_any_offset_or_epoch_numbers() {
        let millis = r#"{"type": "long", "logicalType": "timestamp-millis"}"#;
        written_as(millis, json!(AT_MILLIS), json!("2026-12-01T21:13:36.123Z"));
        written_as(
            millis,
            json!("2026-12-01T22:13:36.123+01:00"),
            json!("2026-12-01T21:13:36.123Z"),
        );
        // A finer fraction is truncated to the unit.
        written_as(
            millis,
            json!("2026-12-01T21:13:36.123999Z"),
            json!("2026-12-01T21:13:36.123Z"),
        );
        let micros = r#"{"type": "long", "logicalType": "timestamp-micros"}"#;
        written_as(
            micros,
            json!(AT_MILLIS * 1000),
            json!("2026-12-01T21:13:36.123000Z"),
        );
        assert_eq!(
            mismatch(millis, json!("yesterday")),
            "at the top: expected a timestamp-millis (RFC 3339 text or epoch milliseconds), \
             found \"yesterday\""
        );
    }

    #[test]
    fn a_timestamp_beyond_year_9999_stays_a_number() {
        let schema = schema(r#"{"type": "long", "logicalType": "timestamp-millis"}"#);
        assert_eq!(
            to_json(&Value::TimestampMillis(i64::MAX), &schema).unwrap(),
            json!(i64::MAX)
        );
    }

    #[test]
    fn duration_is_an_object() {
        let schema = r#"{"type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}"#;
        round_trip(
            schema,
            Value::Duration(Duration::new(Months::new(1), Days::new(2), Millis::new(3))),
            json!({"months": 1, "days": 2, "millis": 3}),
        );
        assert_eq!(
            mismatch(schema, json!({"months": 1, "days": -2, "millis": 3})),
            "at /days: expected an unsigned 32-bit integer, found -2"
        );
        assert_eq!(
            mismatch(schema, json!({"months": 1, "days": 2})),
            "at the top: missing field `millis` of a duration"
        );
    }
}

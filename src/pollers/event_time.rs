//! Event times and watermarks as resources write them: an RFC 3339 timestamp with an offset
//! (`2026-11-30T14:00:00.250+01:00`) or integer epoch milliseconds (`1764511200250`).
//! Everything becomes epoch milliseconds, the unit of Kafka record timestamps.

use crate::clock::Millis;
use serde_json::Value;
use std::time::SystemTime;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Read a JSON value as an event time. The error says what the value was, for the poll error.
pub fn from_json(value: &Value) -> Result<Millis, String> {
    match value {
        Value::Number(n) => n.as_i64().ok_or_else(|| {
            format!(
                "{} is not an integer number of epoch milliseconds",
                truncate(&n.to_string())
            )
        }),
        Value::String(s) => parse_rfc3339(s),
        other => Err(format!(
            "{} is neither an RFC 3339 string nor integer epoch milliseconds",
            truncate(&other.to_string())
        )),
    }
}

/// Parse an RFC 3339 timestamp (an offset or `Z` is required) to epoch milliseconds.
pub fn parse_rfc3339(text: &str) -> Result<Millis, String> {
    let t = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| {
        format!(
            "`{}` is not an RFC 3339 timestamp such as 2026-11-30T14:00:00Z ({e})",
            truncate(text)
        )
    })?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as Millis)
}

/// Format epoch milliseconds as RFC 3339 in UTC, e.g. `2026-11-30T14:00:00.25Z`.
pub fn format_rfc3339(ms: Millis) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// A file's modification time in epoch milliseconds (times before 1970 are negative).
pub fn from_system_time(t: SystemTime) -> Millis {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => crate::clock::millis(d),
        Err(e) => -crate::clock::millis(e.duration()),
    }
}

/// A resource's value in an error message: escaped and bounded
/// ([`crate::logging::outside`]), whatever the resource sent where a time should be.
fn truncate(s: &str) -> String {
    crate::logging::outside(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_rfc3339_with_any_offset_and_epoch_millis() {
        assert_eq!(from_json(&json!("1970-01-01T00:00:01Z")), Ok(1000));
        assert_eq!(from_json(&json!("1970-01-01T01:00:01.250+01:00")), Ok(1250));
        assert_eq!(
            from_json(&json!("2026-11-30T14:00:00-05:30")),
            Ok(1796067000000)
        );
        assert_eq!(from_json(&json!(1764511200250_i64)), Ok(1764511200250));
    }

    #[test]
    fn says_what_it_could_not_read() {
        let e = from_json(&json!("2026-11-30 14:00")).unwrap_err();
        assert!(e.contains("`2026-11-30 14:00` is not an RFC 3339"), "{e}");
        // No offset: ambiguous, refused rather than guessed.
        assert!(from_json(&json!("2026-11-30T14:00:00")).is_err());
        assert!(from_json(&json!(1.5))
            .unwrap_err()
            .contains("not an integer"));
        assert!(from_json(&json!(true)).unwrap_err().contains("neither"));
        // Bounded (crate::logging::OUTSIDE_MAX) and escaped: one line, whatever was sent.
        let long = format!("x\n{}", "x".repeat(5000));
        let e = from_json(&json!(long)).unwrap_err();
        assert!(e.len() < crate::logging::OUTSIDE_MAX + 200, "{e}");
        assert!(e.contains("more bytes") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn formats_utc() {
        assert_eq!(format_rfc3339(1250), "1970-01-01T00:00:01.25Z");
        assert_eq!(
            parse_rfc3339(&format_rfc3339(1764511200250)),
            Ok(1764511200250)
        );
    }
}

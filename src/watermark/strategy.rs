//! How an input partition's watermark follows the timestamps of its records.
//!
//! The text form (a setting's value) is one of
//!
//! ```text
//! bounded(<duration>)   records may arrive up to <duration> out of order (humantime: 5s, 1m 30s; 0s allowed)
//! monotonic             records arrive in timestamp order
//! none                  the input does not drive the watermark; only the watches' holds do
//! ```
//!
//! Names are case-insensitive and whitespace may surround any token; the duration itself is
//! read by humantime as written (its units are case-sensitive: `M` is months).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A watermark strategy: the shape of Flink's `WatermarkStrategy.forBoundedOutOfOrderness`,
/// `forMonotonousTimestamps` and `noWatermarks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkStrategy {
    /// Records are at most this much out of order: the watermark trails the highest
    /// timestamp seen by the bound.
    Bounded(Duration),
    /// Timestamps never go down: the watermark follows the highest timestamp seen.
    Monotonic,
    /// No watermark from the input's timestamps.
    None,
}

/// Five seconds of disorder, Flink's customary example bound: enough for producers that
/// batch or retry, small enough that windows close promptly.
impl Default for WatermarkStrategy {
    fn default() -> Self {
        Self::Bounded(Duration::from_secs(5))
    }
}

/// A strategy text that does not parse. Displays as one line saying what was expected, so
/// it can be printed as-is when the bridge refuses its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a watermark strategy: {reason}")]
pub struct StrategyError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

const EXPECTED: &str = "expected bounded(<duration>), monotonic or none";

impl FromStr for WatermarkStrategy {
    type Err = StrategyError;

    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let fail = |reason: String| StrategyError {
            input: s.to_owned(),
            reason,
        };
        let text = s.trim();
        if text.eq_ignore_ascii_case("monotonic") {
            return Ok(Self::Monotonic);
        }
        if text.eq_ignore_ascii_case("none") {
            return Ok(Self::None);
        }
        let arg = strip_prefix_ignore_case(text, "bounded")
            .and_then(|rest| rest.trim_start().strip_prefix('('))
            .and_then(|rest| rest.strip_suffix(')'))
            .ok_or_else(|| fail(EXPECTED.to_owned()))?
            .trim();
        if arg.is_empty() {
            return Err(fail(
                "bounded(<duration>) needs a duration, e.g. bounded(5s)".to_owned(),
            ));
        }
        humantime::parse_duration(arg)
            .map(Self::Bounded)
            .map_err(|e| {
                fail(format!(
                    "invalid duration `{arg}` in bounded(<duration>): {e}"
                ))
            })
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// The normal form, which [`FromStr`] reads back.
impl fmt::Display for WatermarkStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bounded(d) => write!(f, "bounded({})", humantime::format_duration(*d)),
            Self::Monotonic => f.write_str("monotonic"),
            Self::None => f.write_str("none"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> WatermarkStrategy {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        match s.parse::<WatermarkStrategy>() {
            Ok(w) => panic!("{s:?} parsed as {w:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_three_forms_parse_case_insensitively_with_surrounding_whitespace() {
        let secs = |s| WatermarkStrategy::Bounded(Duration::from_secs(s));
        assert_eq!(ok("bounded(5s)"), secs(5));
        assert_eq!(ok("  BOUNDED ( 1m 30s )\n"), secs(90));
        assert_eq!(ok("Bounded(0s)"), secs(0));
        assert_eq!(
            ok("bounded(250ms)"),
            WatermarkStrategy::Bounded(Duration::from_millis(250))
        );
        assert_eq!(ok("monotonic"), WatermarkStrategy::Monotonic);
        assert_eq!(ok(" MonoTonic "), WatermarkStrategy::Monotonic);
        assert_eq!(ok("none"), WatermarkStrategy::None);
        assert_eq!(ok("NONE\t"), WatermarkStrategy::None);
    }

    #[test]
    fn display_prints_the_normal_form_and_the_default_is_bounded_5s() {
        assert_eq!(WatermarkStrategy::default().to_string(), "bounded(5s)");
        assert_eq!(ok(" BOUNDED( 90s )").to_string(), "bounded(1m 30s)");
        assert_eq!(ok("bounded(0s)").to_string(), "bounded(0s)");
        assert_eq!(ok("Monotonic").to_string(), "monotonic");
        assert_eq!(ok("None").to_string(), "none");
    }

    #[test]
    fn errors_quote_the_input_and_say_what_was_expected() {
        assert_eq!(
            err("boundd(5s)"),
            "`boundd(5s)` is not a watermark strategy: expected bounded(<duration>), monotonic or none"
        );
        assert_eq!(
            err(""),
            "`` is not a watermark strategy: expected bounded(<duration>), monotonic or none"
        );
        assert_eq!(
            err("bounded 5s"),
            "`bounded 5s` is not a watermark strategy: expected bounded(<duration>), monotonic or none"
        );
        assert_eq!(
            err("bounded(5s"),
            "`bounded(5s` is not a watermark strategy: expected bounded(<duration>), monotonic or none"
        );
        assert_eq!(
            err("monotonic()"),
            "`monotonic()` is not a watermark strategy: expected bounded(<duration>), monotonic or none"
        );
        assert_eq!(
            err("bounded( )"),
            "`bounded( )` is not a watermark strategy: bounded(<duration>) needs a duration, e.g. bounded(5s)"
        );
        let bad_unit = err("bounded(5x)");
        assert!(
            bad_unit.starts_with(
                "`bounded(5x)` is not a watermark strategy: invalid duration `5x` in bounded(<duration>): "
            ),
            "{bad_unit}"
        );
        assert!(bad_unit.contains("unknown time unit \"x\""), "{bad_unit}");
        // The duration's units are humantime's, case and all.
        assert!(err("bounded(5S)").contains("invalid duration `5S`"));
    }

    proptest! {
        #[test]
        fn display_then_parse_gives_the_same_strategy(
            kind in 0u8..3,
            ms in 0u64..10 * 365 * 24 * 3_600_000,
            nanos in prop_oneof![Just(0u32), 0u32..1_000_000],
            upper in any::<bool>(),
        ) {
            let s = match kind {
                0 => WatermarkStrategy::Bounded(Duration::from_millis(ms) + Duration::from_nanos(nanos.into())),
                1 => WatermarkStrategy::Monotonic,
                _ => WatermarkStrategy::None,
            };
            let text = s.to_string();
            // Only the name changes case: humantime's units are case-sensitive.
            let text = if upper {
                match text.split_once('(') {
                    Some((name, rest)) => format!(" {}({rest} ", name.to_uppercase()),
                    None => text.to_uppercase(),
                }
            } else {
                text
            };
            prop_assert_eq!(ok(&text), s, "{}", text);
        }

        #[test]
        fn parsing_any_text_never_panics(s in any::<String>()) {
            if let Ok(w) = s.parse::<WatermarkStrategy>() {
                prop_assert_eq!(ok(&w.to_string()), w);
            }
        }
    }
}

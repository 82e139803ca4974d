//! A server's own rate-limit signals, beside `Retry-After`: when a response says no request
//! is left in the current window, how long until there is one. The engine then holds every
//! watch polling that host for as long (`limits.rs`), up to `WATCHBRIDGE_RETRY_AFTER_MAX`.
//!
//! Read, in this order (the first that says "none left" decides):
//! - `RateLimit: limit=100, remaining=0, reset=30` (IETF draft, up to -07) and
//!   `RateLimit: "default";r=0;t=30` (from -08): reset in seconds;
//! - `RateLimit-Remaining: 0` with `RateLimit-Reset: 30` (the drafts' separate fields);
//! - `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` (GitHub, GitLab and many more),
//!   whose reset is seconds or, above 10^9, a Unix time (GitHub's).
//!
//! A count left above 0, or a reset that is missing or not a whole number, says nothing.

use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Above this, an `X-RateLimit-Reset` is a Unix time, not seconds (10^9 s is 31 years).
const UNIX_TIME_FROM: u64 = 1_000_000_000;

/// How long the server says to wait before its next request, if it says none is left.
pub fn wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    structured(headers)
        .or_else(|| {
            fields(
                headers,
                "ratelimit-remaining",
                "ratelimit-reset",
                false,
                now,
            )
        })
        .or_else(|| {
            fields(
                headers,
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
                true,
                now,
            )
        })
}

/// HTTP's delta-seconds (`Retry-After: 120` too): digits only, and more than a `u64`
/// holds is as long as can be (the schedule caps it).
pub fn delta_seconds(text: &str) -> Option<u64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().unwrap_or(u64::MAX))
}

/// A field's number, also quoted (the structured form allows `"30"`).
fn number(text: &str) -> Option<u64> {
    delta_seconds(text.trim().trim_matches('"'))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok()
}

/// `RateLimit: remaining=0, reset=30` or `RateLimit: "name";r=0;t=30`.
fn structured(headers: &HeaderMap) -> Option<Duration> {
    let value = header(headers, "ratelimit")?;
    let (mut remaining, mut reset) = (None, None);
    for part in value.split([',', ';']) {
        let Some((name, v)) = part.split_once('=') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "remaining" | "r" => remaining = number(v),
            "reset" | "t" => reset = number(v),
            _ => {}
        }
    }
    if remaining? != 0 {
        return None;
    }
    reset.map(Duration::from_secs)
}

fn fields(
    headers: &HeaderMap,
    remaining: &str,
    reset: &str,
    may_be_unix_time: bool,
    now: SystemTime,
) -> Option<Duration> {
    if number(header(headers, remaining)?)? != 0 {
        return None;
    }
    let reset = number(header(headers, reset)?)?;
    if may_be_unix_time && reset > UNIX_TIME_FROM {
        let at = UNIX_EPOCH + Duration::from_secs(reset);
        return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
    }
    Some(Duration::from_secs(reset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, value.parse().unwrap());
        }
        h
    }

    const NOW: u64 = 1_800_000_000;

    fn wait_of(pairs: &[(&'static str, &str)]) -> Option<Duration> {
        wait(&headers(pairs), UNIX_EPOCH + Duration::from_secs(NOW))
    }

    #[test]
    fn each_form_of_none_left_gives_the_wait_until_the_reset() {
        let s = Duration::from_secs;
        assert_eq!(
            wait_of(&[("ratelimit", "limit=10, remaining=0, reset=7")]),
            Some(s(7))
        );
        assert_eq!(
            wait_of(&[("ratelimit", "\"default\";r=0;t=12")]),
            Some(s(12))
        );
        assert_eq!(
            wait_of(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "30")]),
            Some(s(30))
        );
        assert_eq!(
            wait_of(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "60")]),
            Some(s(60))
        );
        // GitHub's: a Unix time.
        let at = (NOW + 42).to_string();
        assert_eq!(
            wait_of(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &at)]),
            Some(s(42))
        );
        let past = (NOW - 5).to_string();
        assert_eq!(
            wait_of(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &past)]),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn requests_left_or_an_unreadable_reset_say_nothing() {
        for pairs in [
            &[][..],
            &[("ratelimit", "limit=10, remaining=3, reset=7")][..],
            &[("ratelimit", "remaining=0")][..],
            &[("ratelimit-remaining", "1"), ("ratelimit-reset", "30")][..],
            &[("ratelimit-remaining", "0")][..],
            &[("ratelimit-remaining", "0"), ("ratelimit-reset", "soon")][..],
            &[("ratelimit-remaining", "0"), ("ratelimit-reset", "-5")][..],
            &[
                ("x-ratelimit-remaining", "none"),
                ("x-ratelimit-reset", "5"),
            ][..],
        ] {
            assert_eq!(wait_of(pairs), None, "{pairs:?}");
        }
    }
}

//! One page of a response, read with the pointers the user configured: its items become
//! outputs; the watermark, "complete" flag and next page come along.

use super::{checked, raw};
use super::{shown, HttpConfig};
use crate::clock::Millis;
use crate::logging::outside;
use crate::poll::{Output, PollError};
use crate::pollers::event_time;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

/// An item's key: the text of a string at `pointer`, the JSON text of any other value
/// there; `None` where there is nothing (or null). The output's value is the item's JSON
/// text, so a recovery gets the same key back from it (`HttpPoller::output_key_reader`).
pub(super) fn item_key(item: &RawValue, pointer: &str) -> Option<Vec<u8>> {
    key_of(raw::at(item, pointer)?.get())
}

/// The key that the value at an item's key pointer makes (see [`item_key`]), from that
/// value's text. A string without escapes (the usual id) is its text between the quotes,
/// taken without parsing.
fn key_of(text: &str) -> Option<Vec<u8>> {
    if let Some(inner) = plain_string(text) {
        return Some(inner.as_bytes().to_vec());
    }
    match serde_json::from_str(text).ok()? {
        Value::String(s) => Some(s.into_bytes()),
        Value::Null => None,
        other => Some(other.to_string().into_bytes()),
    }
}

/// The text between the quotes of a JSON string without escapes: the key as it is.
fn plain_string(text: &str) -> Option<&str> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// An item's event time from the text of the value at its time pointer. Integer epoch
/// milliseconds (the usual time) are read from the text without building a number.
fn time_of(text: &str) -> Result<Millis, String> {
    if let Ok(ms) = text.parse::<Millis>() {
        return Ok(ms);
    }
    let value = serde_json::from_str(text).unwrap_or(Value::Null);
    event_time::from_json(&value)
}

#[derive(Debug, Default)]
pub(super) struct Page {
    pub outputs: Vec<Output>,
    pub watermark: Option<Millis>,
    pub complete: bool,
    pub next: Option<Url>,
    /// The next page's cursor, when `WATCHBRIDGE_HTTP_NEXT` gave one rather than a URL
    /// (`{last.cursor}`).
    pub cursor: Option<String>,
}

impl Page {
    /// `first_seen` is the event time of items without a time field. `items_left` is what
    /// is left of the poll's `WATCHBRIDGE_HTTP_MAX_POLL_ITEMS`: a page with more items fails
    /// (`over_budget`) before they become outputs.
    pub fn parse(
        body: &Bytes,
        config: &HttpConfig,
        first_seen: Millis,
        url: &Url,
        items_left: usize,
    ) -> Result<Self, PollError> {
        // Checked as JSON by the same walk that finds the page's fields (`raw.rs`); then the
        // items, checked text, split and read by pointer without a parser (`checked.rs`).
        let malformed = |e: &dyn std::fmt::Display| {
            PollError::transient(
                "malformed_json",
                format!("{}: response is not JSON: {e}", shown(url)),
            )
        };
        let text = std::str::from_utf8(body).map_err(|e| malformed(&e))?;
        let [items, watermark, complete, next] = raw::at_each_checked(
            text,
            [
                Some(config.items.as_str()),
                config.watermark.as_deref(),
                config.complete.as_deref(),
                config.next.as_deref(),
            ],
        )
        .map_err(|e| malformed(&e))?;
        let missing =
            |what: String| PollError::transient("missing_field", format!("{}: {what}", shown(url)));
        let pointers = [
            Some(config.item_key.as_str()),
            config.item_time.as_deref(),
            config.item_version.as_deref(),
        ];
        let items = items
            .and_then(|items| checked::elements_at(items.get(), pointers))
            .ok_or_else(|| {
                missing(format!(
                    "response has no array at WATCHBRIDGE_HTTP_ITEMS `{}`",
                    config.items
                ))
            })?;
        if items.len() > items_left {
            return Err(PollError::transient(
                "over_budget",
                format!(
                    "{url}: the poll's pages hold more than WATCHBRIDGE_HTTP_MAX_POLL_ITEMS ({} items)",
                    config.max_poll_items
                ),
            ));
        }
        let mut outputs = Vec::with_capacity(items.len());
        for (i, (item, [key, time, version])) in items.into_iter().enumerate() {
            // A plain string (the usual id) is a view of the body, like the item's text;
            // anything else is made into a key of its own.
            let key = key.and_then(|k| match plain_string(k) {
                Some(inner) => Some(body.slice_ref(inner.as_bytes())),
                None => key_of(k).map(Bytes::from),
            });
            let Some(key) = key else {
                return Err(missing(format!(
                    "item {i} has no WATCHBRIDGE_HTTP_ITEM_KEY `{}`",
                    config.item_key
                )));
            };
            let event_time = match &config.item_time {
                None => first_seen,
                Some(p) => {
                    let t = time.ok_or_else(|| {
                        missing(format!("item {i} has no WATCHBRIDGE_HTTP_ITEM_TIME `{p}`"))
                    })?;
                    time_of(t).map_err(|e| {
                        PollError::transient(
                            "bad_time",
                            format!(
                                "{}: item {i}, WATCHBRIDGE_HTTP_ITEM_TIME `{p}`: {e}",
                                shown(url)
                            ),
                        )
                    })?
                }
            };
            // The item's text as the response wrote it: a view of the body, not a copy (the
            // body lives until the last of its outputs is handed to the producer, which
            // copies it).
            let mut output = Output::new(key, body.slice_ref(item.as_bytes()), event_time);
            // Read as a key is (the text of a string, else the JSON text); an item without
            // one (or null) is its key alone.
            output.version = version.and_then(key_of).map(Bytes::from);
            outputs.push(output);
        }
        let watermark = match raw::parse(watermark) {
            None | Some(Value::Null) => None,
            Some(w) => Some(event_time::from_json(&w).map_err(|e| {
                PollError::transient(
                    "bad_time",
                    format!("{}: WATCHBRIDGE_HTTP_WATERMARK: {e}", shown(url)),
                )
            })?),
        };
        let complete = match raw::parse(complete) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(PollError::transient(
                    "missing_field",
                    format!(
                        "{}: WATCHBRIDGE_HTTP_COMPLETE is {}, not true or false",
                        shown(url),
                        outside(&other.to_string())
                    ),
                ))
            }
        };
        let (next, cursor) = match raw::parse(next) {
            None => (None, None),
            Some(v) => (next_page(&v, url, &config.cursor_param)?, cursor_of(&v)),
        };
        Ok(Self {
            outputs,
            watermark,
            complete,
            next,
            cursor,
        })
    }
}

/// The value at `WATCHBRIDGE_HTTP_NEXT`: nothing (`null`, `""`, `false`), a URL (absolute, or
/// relative to this page: it starts with `/`, `?`, `./` or `../`), or a cursor, which
/// replaces the cursor parameter of this page's URL.
fn next_page(value: &Value, url: &Url, cursor_param: &str) -> Result<Option<Url>, PollError> {
    let cursor = match value {
        Value::Null | Value::Bool(false) => return Ok(None),
        Value::String(s) if s.is_empty() => return Ok(None),
        Value::String(s) if is_url(s) => {
            return url.join(s).map(Some).map_err(|e| {
                PollError::transient(
                    "bad_next",
                    format!(
                        "{}: WATCHBRIDGE_HTTP_NEXT `{}` is not a URL: {e}",
                        shown(url),
                        crate::logging::url(s)
                    ),
                )
            })
        }
        value => cursor_of(value).ok_or_else(|| {
            PollError::transient(
                "bad_next",
                format!(
                    "{}: WATCHBRIDGE_HTTP_NEXT is {}, not a URL or cursor",
                    shown(url),
                    outside(&value.to_string())
                ),
            )
        })?,
    };
    let mut next = url.clone();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != cursor_param)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    next.query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair(cursor_param, &cursor);
    Ok(Some(next))
}

/// A next-page value that is a URL rather than a cursor.
fn is_url(s: &str) -> bool {
    ["http://", "https://", "/", "?", "./", "../"]
        .iter()
        .any(|p| s.starts_with(p))
}

/// A next-page value that is a cursor: a string that is not a URL, or a number.
fn cursor_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() && !is_url(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn url() -> Url {
        Url::parse("http://h/items?tenant=a&cursor=old").unwrap()
    }

    /// An item key is the text of a JSON string, or the JSON text of any other value as the
    /// response wrote it: `1` and `"1"` are one output on purpose; big integers stay exact.
    #[test]
    fn item_keys_are_string_text_or_exact_json_text() {
        let mut config = HttpConfig::new("http://h/").unwrap();
        config.item_key = "/id".into();
        let body = br#"[{"id": 1}, {"id": "1"}, {"id": 1.0}, {"id": true}, {"id": "true"},
            {"id": 12345678901234567890123}, {"id": 12345678901234567890124}, {"id": [1, "a"]},
            {"id": "a\"b"}, {"id": "caf\u00e9"}, {"id": ""}]"#;
        let page = Page::parse(&Bytes::from_static(body), &config, 0, &url(), usize::MAX).unwrap();
        let keys: Vec<_> = page
            .outputs
            .iter()
            .map(|o| String::from_utf8(o.key.to_vec()).unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "1",
                "1",
                "1.0",
                "true",
                "true",
                "12345678901234567890123",
                "12345678901234567890124",
                r#"[1,"a"]"#,
                "a\"b",
                "café",
                ""
            ]
        );
        // The output value is the item as the response wrote it.
        assert_eq!(
            &page.outputs[5].value[..],
            br#"{"id": 12345678901234567890123}"#
        );
    }

    /// A recovery reads outputs back without a header naming them: every output's key
    /// comes back from its value, exactly, whatever the key's JSON type or where it is.
    #[test]
    fn every_item_key_is_read_back_from_its_output_value() {
        use crate::pollers::Resolve;
        for pointer in ["/id", "/meta/ref", ""] {
            let mut config = HttpConfig::new("http://h/").unwrap();
            config.item_key = pointer.into();
            let body =
                br#"[{"id": 1, "meta": {"ref": "r\u00e9-1"}}, {"id": "1", "meta": {"ref": 2.50}},
                {"id": 12345678901234567890123, "meta": {"ref": [1, {"b": null}]}},
                {"id": "caf\u00e9 \"q\"", "meta": {"ref": true}}]"#;
            let page =
                Page::parse(&Bytes::from_static(body), &config, 0, &url(), usize::MAX).unwrap();
            let poller = super::super::HttpPoller::new(config).unwrap();
            let reader = poller
                .output_key_reader()
                .expect("the HTTP poller reads keys back");
            assert_eq!(page.outputs.len(), 4);
            for output in &page.outputs {
                assert_eq!(
                    reader(&output.value).as_deref(),
                    Some(&output.key[..]),
                    "pointer `{pointer}`, value {}",
                    String::from_utf8_lossy(&output.value)
                );
            }
        }
        let reader = super::super::HttpPoller::new(HttpConfig::new("http://h/").unwrap())
            .unwrap()
            .output_key_reader()
            .unwrap();
        assert_eq!(reader(b"not json"), None);
    }

    /// An item's time: integer epoch milliseconds or an RFC 3339 string; anything else
    /// fails the page with `bad_time`, a missing time with `missing_field`.
    #[test]
    fn item_times_are_integer_milliseconds_or_rfc3339() {
        let mut config = HttpConfig::new("http://h/").unwrap();
        config.item_key = "/id".into();
        config.item_time = Some("/t".into());
        let time = |t: &str| {
            let body = format!(r#"[{{"id": 1, "t": {t}}}]"#);
            Page::parse(&Bytes::from(body), &config, 7, &url(), usize::MAX)
                .map(|page| page.outputs[0].event_time)
                .map_err(|e| e.kind)
        };
        assert_eq!(time("1700000000123"), Ok(1_700_000_000_123));
        assert_eq!(time("-5"), Ok(-5));
        assert_eq!(time("0"), Ok(0));
        assert_eq!(time(r#""2026-11-30T14:00:00.25Z""#), Ok(1_796_047_200_250));
        for bad in [
            "1.5",
            "1e3",
            "99999999999999999999",
            "null",
            "true",
            r#""yesterday""#,
        ] {
            assert_eq!(time(bad), Err("bad_time"), "{bad}");
        }
        let body = br#"[{"id": 1}]"#;
        let e = Page::parse(&Bytes::from_static(body), &config, 7, &url(), usize::MAX).unwrap_err();
        assert_eq!(e.kind, "missing_field");
    }

    #[test]
    fn next_is_a_url_or_a_cursor() {
        let n = |v: Value| {
            next_page(&v, &url(), "cursor")
                .unwrap()
                .map(|u| u.to_string())
        };
        assert_eq!(n(json!(null)), None);
        assert_eq!(n(json!("")), None);
        assert_eq!(n(json!(false)), None);
        assert_eq!(n(json!("/items?page=2")).unwrap(), "http://h/items?page=2");
        assert_eq!(n(json!("?page=2")).unwrap(), "http://h/items?page=2");
        assert_eq!(n(json!("http://h/x")).unwrap(), "http://h/x");
        assert_eq!(
            n(json!("abc/+=")).unwrap(),
            "http://h/items?tenant=a&cursor=abc%2F%2B%3D"
        );
        assert_eq!(n(json!(42)).unwrap(), "http://h/items?tenant=a&cursor=42");
        assert_eq!(
            next_page(&json!([1]), &url(), "cursor").unwrap_err().kind,
            "bad_next"
        );
    }
}

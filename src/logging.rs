//! Log lines on stderr, filtered by `WATCHBRIDGE_LOG` (default `info`), as text for people
//! or as one JSON object per line for log collectors (`WATCHBRIDGE_LOG_FORMAT=json`). What
//! is logged is the same either way. Secrets never are (one rule: [`crate::secrets::is_secret`]
//! for names, [`redact_url`] for URLs, header values never), and text from outside the
//! bridge enters a message only through [`outside`]: escaped and bounded.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// `WATCHBRIDGE_LOG` when unset: what the bridge does, and librdkafka's warnings.
pub const DEFAULT_FILTER: &str = "info";

/// `WATCHBRIDGE_LOG_FORMAT`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields at the top level.
    Json,
}

/// Install the global subscriber as `watchbridge run` does: `WATCHBRIDGE_LOG` filters
/// (default `info`), `WATCHBRIDGE_LOG_FORMAT` (`text`, the default, or `json`) shapes the
/// lines. For a program built on the library ([`crate::init_logging`]).
pub fn init_from_env() {
    let format = match std::env::var("WATCHBRIDGE_LOG_FORMAT") {
        Ok(f) if f.eq_ignore_ascii_case("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    init(format, None);
}

/// A layer that hears every event whatever `WATCHBRIDGE_LOG` says (the demo's record of
/// how each watch ended).
pub type Listener = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync + 'static>;

/// Install the global subscriber. For `demo` (`Some(listener)`) the default filter is
/// `error`: its view shows the dead letters and failed watches the warnings are about, and
/// log lines would scramble a view redrawn in place; `demo` also gets the layer that
/// records how each watch ended, whatever the filter.
pub fn init(format: LogFormat, demo: Option<Listener>) {
    let default = if demo.is_some() {
        "error"
    } else {
        DEFAULT_FILTER
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("WATCHBRIDGE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    match demo {
        // One global filter. (A per-layer filter beside an absent `Option` layer dropped
        // events of some targets: seen with `info,librdkafka=warn`.)
        None => tracing_subscriber::registry()
            .with(filter)
            .with(lines(format))
            .init(),
        // The demo's endings layer must see every watch ending whatever WATCHBRIDGE_LOG says,
        // so only the log output is filtered.
        Some(listener) => tracing_subscriber::registry()
            .with(listener)
            .with(lines(format).with_filter(filter))
            .init(),
    }
}

/// Log lines on stderr in `format`; text is coloured only on a terminal.
fn lines<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => layer
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
    }
}

/// Most bytes of one piece of outside text (see [`outside`]) shown in a message.
pub const OUTSIDE_MAX: usize = 256;

/// What a secret shows as, wherever a setting, URL or property is shown.
pub const REDACTED: &str = "<redacted>";

/// Text that came from outside the bridge (a response body, header or JSON value, an item
/// key, an input value, a file name), made safe for one message or log line: control
/// characters (`\n`, `\r`, `\u{2028}`, bidi overrides, …) and `\` are escaped as Rust does
/// (`\n`, `\u{2028}`, `\\`), so it cannot forge or split a log line, and it is cut after
/// [`OUTSIDE_MAX`] bytes with `…(N more bytes)`, so it cannot flood the log. Every place such
/// text enters an error message or a log field goes through this (or [`url`]).
pub fn outside(text: &str) -> Outside<'_> {
    Outside(std::borrow::Cow::Borrowed(text))
}

/// A URL (or URL template) for a message: its secrets redacted ([`redact_url`]), then shown
/// as [`outside`] text.
pub fn url(text: &str) -> Outside<'_> {
    Outside(redact_url(text))
}

/// See [`outside`].
pub struct Outside<'a>(std::borrow::Cow<'a, str>);

impl std::fmt::Display for Outside<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let text: &str = &self.0;
        let mut end = text.len().min(OUTSIDE_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        for c in text[..end].chars() {
            let plain = !c.is_control()
                && c != '\\'
                && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
            if plain {
                f.write_char(c)?;
            } else if c.is_control() || c == '\\' {
                write!(f, "{}", c.escape_debug())?;
            } else {
                write!(f, "{}", c.escape_unicode())?;
            }
        }
        if end < text.len() {
            write!(f, "…({} more bytes)", text.len() - end)?;
        }
        Ok(())
    }
}

/// `text`, a URL or URL template, with its secrets replaced by [`REDACTED`]: the user info
/// (`https://user:pass@host/` → `https://<redacted>@host/`; a user name alone can be a
/// token) and the value of every query parameter whose name [`crate::secrets::is_secret`]
/// calls secret (`?access_token=…`, `?api_key=…`, `?sig=…`). The rule is the one for
/// `KAFKA_*` properties; header values (`WATCHBRIDGE_HTTP_HEADERS`) are never shown at all.
pub fn redact_url(text: &str) -> std::borrow::Cow<'_, str> {
    let authority_start = text.find("://").map_or(0, |i| i + 3);
    let authority_end = text[authority_start..]
        .find(['/', '?', '#'])
        .map_or(text.len(), |i| authority_start + i);
    let userinfo = text[authority_start..authority_end].rfind('@');
    let query = text[authority_end..]
        .find('?')
        .map(|i| authority_end + i + 1);
    let secret_query = query.is_some_and(|q| {
        let end = text[q..].find('#').map_or(text.len(), |i| q + i);
        text[q..end]
            .split('&')
            .any(|pair| crate::secrets::is_secret(pair.split('=').next().unwrap_or("")))
    });
    if userinfo.is_none() && !secret_query {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..authority_start]);
    match userinfo {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&text[authority_start + at..authority_end]);
        }
        None => out.push_str(&text[authority_start..authority_end]),
    }
    let Some(q) = query else {
        out.push_str(&text[authority_end..]);
        return std::borrow::Cow::Owned(out);
    };
    out.push_str(&text[authority_end..q]);
    let end = text[q..].find('#').map_or(text.len(), |i| q + i);
    for (i, pair) in text[q..end].split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, _)) if crate::secrets::is_secret(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(pair),
        }
    }
    out.push_str(&text[end..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_is_one_escaped_bounded_line() {
        assert_eq!(
            outside("plain text, ünïcode").to_string(),
            "plain text, ünïcode"
        );
        assert_eq!(
            outside("a\nERROR forged\r\t\u{1b}[31m\\ \u{2028}\u{202e}").to_string(),
            r"a\nERROR forged\r\t\u{1b}[31m\\ \u{2028}\u{202e}"
        );
        let huge = "é".repeat(1000);
        let shown = outside(&huge).to_string();
        assert!(shown.ends_with("…(1744 more bytes)"), "{shown}");
        assert_eq!(shown.chars().filter(|c| *c == 'é').count(), 128);
    }

    #[test]
    fn urls_lose_user_info_and_secret_query_values() {
        let r = |t| redact_url(t).into_owned();
        assert_eq!(r("http://h:8/a?b=c#d"), "http://h:8/a?b=c#d");
        assert_eq!(r("https://ada:pw@h/x"), "https://<redacted>@h/x");
        assert_eq!(r("https://tok@h"), "https://<redacted>@h");
        assert_eq!(
            r("http://u:p@{key}:8080/x"),
            "http://<redacted>@{key}:8080/x"
        );
        assert_eq!(
            r("http://h/x?tenant=a&access_token=t1&API-KEY=k&sig=s&key=k2&keyword=x#f"),
            "http://h/x?tenant=a&access_token=<redacted>&API-KEY=<redacted>&sig=<redacted>&key=<redacted>&keyword=x#f"
        );
        // A `@` in the path or query is not user info.
        assert_eq!(r("http://h/a@b?c=@d"), "http://h/a@b?c=@d");
        assert_eq!(
            url("http://u:p@h/\n").to_string(),
            r"http://<redacted>@h/\n"
        );
    }
}

//! Incremental requests: `{last.time}`, `{last.time_ms}`, `{last.key}` and `{last.cursor}`
//! in the URL template are what the watch has seen so far, so an API that filters by
//! `since=` is asked only for what is new (castorm's offset templating in Kafka Connect).
//!
//! They live in the watch's [`super::HttpTarget`], move on after each successful poll, and
//! are saved with the watch's state record ([`crate::poll::Poller::resume_state`]) once the
//! outputs found before them are delivered, so a restart continues from them.

use crate::clock::Millis;
use crate::poll::Output;
use crate::pollers::event_time::format_rfc3339;
use crate::pollers::template::LastField;
use serde::{Deserialize, Serialize};

/// What the watch has seen: the newest output (by event time; of outputs with the same
/// time, the last one read) and the last cursor a page gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Last {
    #[serde(rename = "t", skip_serializing_if = "Option::is_none", default)]
    pub time: Option<Millis>,
    #[serde(rename = "k", skip_serializing_if = "Option::is_none", default)]
    pub key: Option<String>,
    #[serde(rename = "c", skip_serializing_if = "Option::is_none", default)]
    pub cursor: Option<String>,
}

impl Last {
    /// A placeholder's value: empty while the watch has none (a first poll asks for
    /// everything, as `since=` usually means).
    pub fn value(&self, field: LastField) -> String {
        match field {
            LastField::Time => self.time.map(format_rfc3339).unwrap_or_default(),
            LastField::TimeMs => self.time.map(|t| t.to_string()).unwrap_or_default(),
            LastField::Key => self.key.clone().unwrap_or_default(),
            LastField::Cursor => self.cursor.clone().unwrap_or_default(),
        }
    }

    /// After a successful poll that read `outputs` and, last, `cursor` (if any page gave
    /// one). An output older than the newest seen does not move them back.
    pub fn advance(&mut self, outputs: &[Output], cursor: Option<String>) {
        for o in outputs {
            if self.time.is_none_or(|t| o.event_time >= t) {
                self.time = Some(o.event_time);
                self.key = Some(String::from_utf8_lossy(&o.key).into_owned());
            }
        }
        if cursor.is_some() {
            self.cursor = cursor;
        }
    }

    /// The bytes saved with the watch's record: compact JSON (`{"t":…,"k":…,"c":…}`), so a
    /// state dump shows them readably.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("strings and numbers serialize")
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(key: &str, t: Millis) -> Output {
        Output::new(key.to_string(), "{}", t)
    }

    #[test]
    fn the_newest_output_and_the_last_cursor_are_kept() {
        let mut last = Last::default();
        assert_eq!(last.value(LastField::Time), "");
        last.advance(&[out("a", 1_000), out("c", 3_000), out("b", 2_000)], None);
        assert_eq!(last.value(LastField::Time), "1970-01-01T00:00:03Z");
        assert_eq!(last.value(LastField::TimeMs), "3000");
        assert_eq!(last.value(LastField::Key), "c");
        assert_eq!(last.value(LastField::Cursor), "");
        // Older outputs do not move it back; a tie goes to the last one read.
        last.advance(&[out("z", 500), out("d", 3_000)], Some("cur-9".into()));
        assert_eq!(last.value(LastField::Key), "d");
        assert_eq!(last.value(LastField::Cursor), "cur-9");
        // A poll with no cursor keeps the last one.
        last.advance(&[], None);
        assert_eq!(last.value(LastField::Cursor), "cur-9");
        assert_eq!(Last::decode(&last.encode()), Some(last.clone()));
        assert_eq!(
            String::from_utf8(last.encode()).unwrap(),
            r#"{"t":3000,"k":"d","c":"cur-9"}"#
        );
        assert_eq!(Last::decode(b"not json"), None);
    }
}

//! What a watch is started from: the watch key (the record key, or the field
//! `WATCHBRIDGE_WATCH_KEY` points at), the input value as JSON, and its event time (the
//! record timestamp, or the field `WATCHBRIDGE_INPUT_TIME` points at). Decoding them in the
//! input's format is `super::input`'s. A record that cannot become a watch is
//! [`Rejected`], with the reason the dead-letter record carries (the partition task adds
//! `unresolvable` and `too_large`).

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
    /// Not an Avro datum of its schema (wrong magic byte, truncated, another schema).
    #[error("value is not Avro: {0}")]
    NotAvro(String),
    #[error("{0}")]
    NotString(String),
    /// Framed with a schema id the registry does not know.
    #[error("value cannot be decoded: {0}")]
    UnknownSchema(String),
    /// `WATCHBRIDGE_INPUT_TIME` finds no time in it.
    #[error("{0}")]
    NoTime(String),
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
            Rejected::NotAvro(_) => "not_avro",
            Rejected::NotString(_) => "not_string",
            Rejected::UnknownSchema(_) => "unknown_schema",
            Rejected::NoTime(_) => "no_time",
            Rejected::NoKey(_) => "no_key",
            Rejected::Unresolvable(_) => "unresolvable",
            Rejected::TooLarge(_) => "too_large",
        }
    }
}

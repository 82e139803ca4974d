//! What a [`Mismatch`] says: where (the JSON pointer of the place, built only when something
//! is wrong) and what (schemas and values named as messages name them).

use apache_avro::types::Value;
use apache_avro::Schema;
use serde_json::Value as Json;
use std::fmt;

/// Why a JSON item does not fit a schema (or a value does not fit the schema given with it):
/// the JSON pointer of the offending place and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pointer: String,
    detail: String,
}

impl Mismatch {
    /// The JSON pointer of the offending place; `""` is the whole item.
    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// What was expected there and what was found, without the place.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pointer.is_empty() {
            write!(f, "at the top: {}", self.detail)
        } else {
            write!(f, "at {}: {}", self.pointer, self.detail)
        }
    }
}

impl std::error::Error for Mismatch {}

/// Where in the JSON we are, as a chain on the stack: the pointer text is only built when
/// something is wrong.
pub(super) enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn pointer(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Key(parent, key) => {
                format!(
                    "{}/{}",
                    parent.pointer(),
                    key.replace('~', "~0").replace('/', "~1")
                )
            }
            Path::Index(parent, index) => format!("{}/{index}", parent.pointer()),
        }
    }

    pub(super) fn mismatch(&self, detail: impl Into<String>) -> Mismatch {
        Mismatch {
            pointer: self.pointer(),
            detail: detail.into(),
        }
    }

    pub(super) fn expected(&self, what: impl fmt::Display, found: &Json) -> Mismatch {
        self.mismatch(format!("expected {what}, found {}", shown(found)))
    }
}

/// A found value for a message: one line, at most 64 characters.
fn shown(json: &Json) -> String {
    let text = json.to_string();
    match text.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// A schema as messages name it.
pub(super) fn describe(schema: &Schema) -> String {
    match schema {
        Schema::Null => "null".into(),
        Schema::Boolean => "a boolean".into(),
        Schema::Int => "an int".into(),
        Schema::Long => "a long".into(),
        Schema::Float => "a float".into(),
        Schema::Double => "a double".into(),
        Schema::Bytes => "bytes (base64)".into(),
        Schema::String => "a string".into(),
        Schema::Array(_) => "an array".into(),
        Schema::Map(_) => "a map (object)".into(),
        Schema::Union(_) => "a union".into(),
        Schema::Record(r) => format!("record `{}` (object)", r.name.name()),
        Schema::Enum(e) => format!("enum `{}`", e.name.name()),
        Schema::Fixed(f) => format!("fixed `{}` ({} bytes, base64)", f.name.name(), f.size),
        Schema::Decimal(d) => format!("a decimal with scale {}", d.scale),
        Schema::BigDecimal => "a big-decimal".into(),
        Schema::Uuid(_) => "a uuid".into(),
        Schema::Date => "a date".into(),
        Schema::TimeMillis => "a time-millis".into(),
        Schema::TimeMicros => "a time-micros".into(),
        Schema::TimestampMillis => "a timestamp-millis".into(),
        Schema::TimestampMicros => "a timestamp-micros".into(),
        Schema::TimestampNanos => "a timestamp-nanos".into(),
        Schema::LocalTimestampMillis => "a local-timestamp-millis".into(),
        Schema::LocalTimestampMicros => "a local-timestamp-micros".into(),
        Schema::LocalTimestampNanos => "a local-timestamp-nanos".into(),
        Schema::Duration(_) => "a duration".into(),
        Schema::Ref { name } => format!("`{}`", name.name()),
    }
}

/// A value as messages name it.
pub(super) fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Union(..) => "a union value",
        Value::Record(_) => "a record value",
        Value::Array(_) => "an array value",
        Value::Map(_) => "a map value",
        Value::Decimal(_) => "a decimal value",
        _ => "a value of another type",
    }
}

//! How a decoded Avro value becomes the JSON value the bridge works with (`to_json`), and
//! how a JSON item becomes an Avro value of a user's output schema (`from_json`).
//!
//! The bridge addresses records with JSON pointers (URL templates, `WATCHBRIDGE_WATCH_KEY`),
//! so an Avro record is first turned into plain JSON by one documented rule. The rule is
//! *not* Avro's own JSON encoding: a union gives the value of the branch taken, unwrapped,
//! so that `/email` of a `["null", "string"]` field is the string itself, and a pointer does
//! not depend on which branch was written.
//!
//! Both functions take the schema (the one the value was decoded with, or the output
//! schema), because a decimal's scale lives only in its schema, and named references
//! (recursive types) are resolved through it.
//!
//! | Avro type                         | JSON                                                         |
//! |-----------------------------------|--------------------------------------------------------------|
//! | `null`                            | `null`                                                       |
//! | `boolean`                         | `true` / `false`                                             |
//! | `int`, `long`                     | number                                                       |
//! | `float`, `double`                 | number; NaN and ±infinity, which JSON cannot hold: `"NaN"`, `"Infinity"`, `"-Infinity"` |
//! | `string`                          | string                                                       |
//! | `bytes`, `fixed`                  | string, standard base64 with padding                         |
//! | `enum`                            | the symbol, a string                                         |
//! | `array`                           | array                                                        |
//! | `map`                             | object                                                       |
//! | `record`                          | object of its fields                                         |
//! | union                             | the value of the branch taken, unwrapped (`["null","string"]` gives `null` or the string) |
//! | `date`                            | `"YYYY-MM-DD"`                                               |
//! | `time-millis`                     | `"HH:MM:SS.mmm"`                                             |
//! | `time-micros`                     | `"HH:MM:SS.uuuuuu"`                                          |
//! | `timestamp-millis`                | RFC 3339 UTC, 3 fraction digits: `"2026-12-01T21:13:36.123Z"` |
//! | `timestamp-micros`                | the same with 6 fraction digits                              |
//! | `timestamp-nanos`                 | the same with 9 fraction digits                              |
//! | `local-timestamp-millis/micros/nanos` | the same text without the `Z` (a local timestamp has no zone) |
//! | `decimal` (bytes or fixed)        | string of the exact decimal with the schema's scale: `"12.30"`, `"-0.05"` |
//! | `big-decimal`                     | string of the exact decimal: `"12.345"`                      |
//! | `uuid`                            | canonical hyphenated lowercase string                        |
//! | `duration`                        | `{"months": n, "days": n, "millis": n}`                      |
//!
//! A date or timestamp outside the years 0000–9999, and a time of day outside the day, has
//! no such text and stays the number Avro holds (days, or units since the epoch or since
//! midnight). A decimal whose plain text would need more than 100 padding zeros is written
//! as its unscaled digits and an exponent (`"1E+1000"`), so a hostile `big-decimal` cannot
//! blow up into a huge string.
//!
//! `from_json` is the inverse, with these allowances:
//!
//! - `int`/`long` take a JSON number that is an integer in range (`3.0` and `3e2` count;
//!   `3.5` and out-of-range numbers are a `Mismatch`, never wrapped or rounded);
//!   `float`/`double` take any number and the three strings above.
//! - `bytes`/`fixed` take base64 (padding optional); `fixed` must decode to its size.
//! - `decimal` takes a string or a number (its exact text), rescaled to the schema's scale
//!   only if no digit is lost and it fits the precision; else a `Mismatch`.
//! - `date` takes `"YYYY-MM-DD"` or a day number; `time-*` take `"HH:MM:SS[.fraction]"` or
//!   the number of units since midnight; `timestamp-*` take RFC 3339 text with any offset or
//!   the number of units since the epoch (ms for `-millis`, µs for `-micros`, ns for
//!   `-nanos`); `local-timestamp-*` take the text without a zone (or with `Z`) or a number.
//!   A finer fraction than the type holds is truncated to its unit.
//! - `uuid` takes any text form the `uuid` crate parses; `duration` takes the object above.
//! - A record takes each schema field from the object by name; a missing field takes its
//!   default (the Avro JSON default: bytes as `"\u00ff"` code points, a union's default for
//!   its first branch), else it is a `Mismatch`. **Object members the schema does not name
//!   are ignored**, so an item may carry more than the output schema keeps.
//! - A union takes the first branch that accepts the value; only `null` takes JSON `null`.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use apache_avro::schema::{
    DecimalSchema, InnerDecimalSchema, Name, NamesRef, RecordSchema, ResolvedSchema, UnionSchema,
};
use apache_avro::types::Value;
use apache_avro::{BigDecimal, Days, Decimal, Duration, Millis, Months, Schema, Uuid};
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use serde_json::Value as Json;
use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, UtcOffset};

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

/// The JSON value of a decoded Avro `value`, by the rule in the module doc.
///
/// `schema` is the schema `value` was decoded with (the reader schema if one was given):
/// it gives decimals their scale. An error means value and schema disagree, which a value
/// decoded with that schema never does.
pub fn to_json(value: &Value, schema: &Schema) -> Result<Json, Mismatch> {
    to_json_with_references(value, schema, &[])
}

/// [`to_json`] for a schema that refers to named types defined in `references` (a
/// registry schema's references, fetched with it).
pub fn to_json_with_references(
    value: &Value,
    schema: &Schema,
    references: &[Schema],
) -> Result<Json, Mismatch> {
    let names = Names::with_references(schema, references);
    value_to_json(value, schema, None, &names, &Path::Root)
}

/// The Avro value of `json` on `schema`, by the inverse rule in the module doc, ready for
/// `apache_avro::writer::datum::GenericDatumWriter` (or `to_avro_datum`) with `schema`.
pub fn from_json(json: &Json, schema: &Schema) -> Result<Value, Mismatch> {
    let names = Names::new(schema);
    json_to_value(json, schema, None, &names, &Path::Root, Mode::Item)
}

// ---------------------------------------------------------------------------------------
// Places and names

/// Where in the JSON we are, as a chain on the stack: the pointer text is only built when
/// something is wrong.
enum Path<'a> {
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

    fn mismatch(&self, detail: impl Into<String>) -> Mismatch {
        Mismatch {
            pointer: self.pointer(),
            detail: detail.into(),
        }
    }

    fn expected(&self, what: impl fmt::Display, found: &Json) -> Mismatch {
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

/// The named types of the root schema, resolved only when a `Schema::Ref` is met (most
/// schemas have none, and then cost nothing).
struct Names<'s> {
    root: &'s Schema,
    /// Schemas that define types `root` refers to (a registry schema's references).
    references: &'s [Schema],
    map: OnceCell<Option<NamesRef<'s>>>,
}

impl<'s> Names<'s> {
    fn new(root: &'s Schema) -> Self {
        Self::with_references(root, &[])
    }

    fn with_references(root: &'s Schema, references: &'s [Schema]) -> Self {
        Names {
            root,
            references,
            map: OnceCell::new(),
        }
    }

    /// `schema`, or the named type it refers to.
    fn resolve(
        &self,
        schema: &'s Schema,
        namespace: Option<&str>,
        path: &Path,
    ) -> Result<&'s Schema, Mismatch> {
        let mut schema = schema;
        while let Schema::Ref { name } = schema {
            let map = self.map.get_or_init(|| {
                // The referenced schemas first: apache-avro resolves in order.
                let all = self.references.iter().chain([self.root]).collect();
                ResolvedSchema::new_with_schemata(all)
                    .ok()
                    .map(|resolved| resolved.get_names().clone())
            });
            let full: Name = name.fully_qualified_name(namespace).into_owned();
            schema = map
                .as_ref()
                .and_then(|names| names.get(&full).copied())
                .ok_or_else(|| {
                    path.mismatch(format!(
                        "the schema refers to `{}`, which it does not define",
                        full.fullname(None)
                    ))
                })?;
        }
        Ok(schema)
    }
}

/// The namespace inside a named schema, for references in it.
fn inner_namespace<'s>(name: &'s Name, enclosing: Option<&'s str>) -> Option<&'s str> {
    name.namespace().or(enclosing)
}

/// A schema as messages name it.
fn describe(schema: &Schema) -> String {
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
fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Union(..) => "a union value",
        Value::Record(_) => "a record value",
        Value::Array(_) => "an array value",
        Value::Map(_) => "a map value",
        Value::Decimal(_) => "a decimal value",
        _ => "a value of another type",
    }
}

// ---------------------------------------------------------------------------------------
// Avro → JSON

fn value_to_json<'s>(
    value: &Value,
    schema: &'s Schema,
    namespace: Option<&'s str>,
    names: &Names<'s>,
    path: &Path,
) -> Result<Json, Mismatch> {
    let schema = names.resolve(schema, namespace, path)?;
    let wrong = || {
        path.mismatch(format!(
            "the schema says {}, but the value is {}",
            describe(schema),
            value_kind(value)
        ))
    };
    Ok(match (value, schema) {
        (Value::Union(index, inner), Schema::Union(union)) => {
            let branch = usize::try_from(*index)
                .ok()
                .and_then(|i| union.variants().get(i))
                .ok_or_else(wrong)?;
            value_to_json(inner, branch, namespace, names, path)?
        }
        (Value::Record(fields), Schema::Record(record)) => {
            let namespace = inner_namespace(&record.name, namespace);
            let mut object = serde_json::Map::new();
            for (name, field) in fields {
                let at = Path::Key(path, name);
                let field_schema = record
                    .lookup
                    .get(name)
                    .and_then(|&i| record.fields.get(i))
                    .map(|f| &f.schema)
                    .ok_or_else(|| at.mismatch("the value has a field the schema does not"))?;
                object.insert(
                    name.clone(),
                    value_to_json(field, field_schema, namespace, names, &at)?,
                );
            }
            Json::Object(object)
        }
        (Value::Array(items), Schema::Array(array)) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    value_to_json(item, &array.items, namespace, names, &Path::Index(path, i))
                })
                .collect::<Result<_, _>>()?,
        ),
        (Value::Map(entries), Schema::Map(map)) => Json::Object(
            entries
                .iter()
                .map(|(key, item)| {
                    value_to_json(item, &map.types, namespace, names, &Path::Key(path, key))
                        .map(|json| (key.clone(), json))
                })
                .collect::<Result<_, _>>()?,
        ),
        (Value::Decimal(decimal), Schema::Decimal(d)) => {
            Json::String(decimal_text(unscaled_text(decimal), scale_i64(d)))
        }
        (Value::Bytes(bytes) | Value::Fixed(_, bytes), Schema::Decimal(d)) => Json::String(
            decimal_text(unscaled_text(&Decimal::from(bytes)), scale_i64(d)),
        ),
        (
            Value::Union(..)
            | Value::Record(_)
            | Value::Array(_)
            | Value::Map(_)
            | Value::Decimal(_),
            _,
        ) => return Err(wrong()),
        // A plain int or long where the schema has a logical type (a value built by hand
        // rather than decoded) reads as that logical type.
        (Value::Int(n), Schema::Date) => date_json(*n),
        (Value::Int(n), Schema::TimeMillis) => time_json(i64::from(*n), TimeUnit::Millis),
        (Value::Long(n), Schema::TimeMicros) => time_json(*n, TimeUnit::Micros),
        (Value::Long(n), Schema::TimestampMillis) => timestamp_json(*n, TimeUnit::Millis, true),
        (Value::Long(n), Schema::TimestampMicros) => timestamp_json(*n, TimeUnit::Micros, true),
        (Value::Long(n), Schema::TimestampNanos) => timestamp_json(*n, TimeUnit::Nanos, true),
        (Value::Long(n), Schema::LocalTimestampMillis) => {
            timestamp_json(*n, TimeUnit::Millis, false)
        }
        (Value::Long(n), Schema::LocalTimestampMicros) => {
            timestamp_json(*n, TimeUnit::Micros, false)
        }
        (Value::Long(n), Schema::LocalTimestampNanos) => timestamp_json(*n, TimeUnit::Nanos, false),
        (leaf, _) => leaf_json(leaf),
    })
}

/// The JSON of a value whose JSON does not depend on its schema.
fn leaf_json(value: &Value) -> Json {
    match value {
        Value::Null => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Int(n) => Json::from(*n),
        Value::Long(n) => Json::from(*n),
        Value::Float(f) if f.is_finite() => Json::from(*f),
        Value::Float(f) => non_finite_json(f64::from(*f)),
        Value::Double(f) if f.is_finite() => Json::from(*f),
        Value::Double(f) => non_finite_json(*f),
        Value::String(s) => Json::String(s.clone()),
        Value::Bytes(bytes) | Value::Fixed(_, bytes) => Json::String(STANDARD.encode(bytes)),
        Value::Enum(_, symbol) => Json::String(symbol.clone()),
        Value::Date(days) => date_json(*days),
        Value::TimeMillis(n) => time_json(i64::from(*n), TimeUnit::Millis),
        Value::TimeMicros(n) => time_json(*n, TimeUnit::Micros),
        Value::TimestampMillis(n) => timestamp_json(*n, TimeUnit::Millis, true),
        Value::TimestampMicros(n) => timestamp_json(*n, TimeUnit::Micros, true),
        Value::TimestampNanos(n) => timestamp_json(*n, TimeUnit::Nanos, true),
        Value::LocalTimestampMillis(n) => timestamp_json(*n, TimeUnit::Millis, false),
        Value::LocalTimestampMicros(n) => timestamp_json(*n, TimeUnit::Micros, false),
        Value::LocalTimestampNanos(n) => timestamp_json(*n, TimeUnit::Nanos, false),
        Value::BigDecimal(big) => {
            let (unscaled, scale) = big.as_bigint_and_exponent();
            Json::String(decimal_text(unscaled.to_string(), scale))
        }
        Value::Uuid(uuid) => Json::String(uuid.hyphenated().to_string()),
        Value::Duration(d) => serde_json::json!({
            "months": u32::from(d.months()),
            "days": u32::from(d.days()),
            "millis": u32::from(d.millis()),
        }),
        // Containers and decimals are handled with their schema; a value of these kinds
        // never reaches here.
        Value::Union(_, inner) => leaf_json(inner),
        Value::Record(_) | Value::Array(_) | Value::Map(_) | Value::Decimal(_) => Json::Null,
    }
}

fn non_finite_json(f: f64) -> Json {
    Json::String(
        if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .into(),
    )
}

#[derive(Clone, Copy)]
enum TimeUnit {
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

fn date_json(days: i32) -> Json {
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

fn time_json(count: i64, unit: TimeUnit) -> Json {
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

fn timestamp_json(count: i64, unit: TimeUnit, utc: bool) -> Json {
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

fn scale_i64(decimal: &DecimalSchema) -> i64 {
    i64::try_from(decimal.scale).unwrap_or(i64::MAX)
}

/// The unscaled integer of a decimal, in decimal digits (`"-1234"`).
fn unscaled_text(decimal: &Decimal) -> String {
    BigDecimal::new(decimal.clone().into(), 0)
        .as_bigint_and_exponent()
        .0
        .to_string()
}

/// Most zeros a decimal's text is padded with before it is written with an exponent.
const MAX_PADDING: i64 = 100;

/// The text of `unscaled × 10^-scale`, exactly (`("-5", 2)` → `"-0.05"`).
fn decimal_text(unscaled: String, scale: i64) -> String {
    let (sign, digits) = match unscaled.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", unscaled.as_str()),
    };
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    if scale < -MAX_PADDING || scale.saturating_sub(len) > MAX_PADDING {
        let exponent = scale.checked_neg().map_or_else(
            || format!("+{}", i128::from(scale).abs()),
            |e| format!("{e:+}"),
        );
        return format!("{sign}{digits}E{exponent}");
    }
    if scale <= 0 {
        if digits == "0" {
            return "0".into();
        }
        let zeros = "0".repeat(usize::try_from(-scale).unwrap_or(0));
        return format!("{sign}{digits}{zeros}");
    }
    let scale = usize::try_from(scale).unwrap_or(0);
    if digits.len() <= scale {
        let zeros = "0".repeat(scale - digits.len());
        format!("{sign}0.{zeros}{digits}")
    } else {
        let (whole, part) = digits.split_at(digits.len() - scale);
        format!("{sign}{whole}.{part}")
    }
}

// ---------------------------------------------------------------------------------------
// JSON → Avro

/// What the JSON being read is: an item, or a default from the schema, which Avro writes
/// differently (bytes as code points, a union's default for its first branch).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Item,
    Default,
}

fn json_to_value<'s>(
    json: &Json,
    schema: &'s Schema,
    namespace: Option<&'s str>,
    names: &Names<'s>,
    path: &Path,
    mode: Mode,
) -> Result<Value, Mismatch> {
    let schema = names.resolve(schema, namespace, path)?;
    let expected = || path.expected(describe(schema), json);
    Ok(match schema {
        Schema::Null => match json {
            Json::Null => Value::Null,
            _ => return Err(expected()),
        },
        Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(expected)?),
        Schema::Int => Value::Int(
            integer(json)
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| path.expected("an int (32-bit integer)", json))?,
        ),
        Schema::Long => Value::Long(
            integer(json).ok_or_else(|| path.expected("a long (64-bit integer)", json))?,
        ),
        Schema::Float => {
            let f = float(json).ok_or_else(expected)?;
            // A finite number beyond a float's range would become infinity: refused.
            let narrow = f as f32;
            if f.is_finite() && !narrow.is_finite() {
                return Err(path.expected("a float (out of its range)", json));
            }
            Value::Float(narrow)
        }
        Schema::Double => Value::Double(float(json).ok_or_else(expected)?),
        Schema::Bytes => Value::Bytes(bytes(json, mode).ok_or_else(expected)?),
        Schema::String => Value::String(json.as_str().ok_or_else(expected)?.to_owned()),
        Schema::Fixed(fixed) => {
            let bytes = bytes(json, mode)
                .filter(|b| b.len() == fixed.size)
                .ok_or_else(expected)?;
            Value::Fixed(fixed.size, bytes)
        }
        Schema::Enum(e) => {
            let symbol = json.as_str().ok_or_else(expected)?;
            let index = e
                .symbols
                .iter()
                .position(|s| s == symbol)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| {
                    path.expected(
                        format_args!("one of the symbols of enum `{}`", e.name.name()),
                        json,
                    )
                })?;
            Value::Enum(index, symbol.to_owned())
        }
        Schema::Array(array) => {
            let items = json.as_array().ok_or_else(expected)?;
            Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        json_to_value(
                            item,
                            &array.items,
                            namespace,
                            names,
                            &Path::Index(path, i),
                            mode,
                        )
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
        Schema::Map(map) => {
            let object = json.as_object().ok_or_else(expected)?;
            Value::Map(
                object
                    .iter()
                    .map(|(key, item)| {
                        json_to_value(
                            item,
                            &map.types,
                            namespace,
                            names,
                            &Path::Key(path, key),
                            mode,
                        )
                        .map(|value| (key.clone(), value))
                    })
                    .collect::<Result<HashMap<_, _>, _>>()?,
            )
        }
        Schema::Union(union) => union_value(json, union, namespace, names, path, mode)?,
        Schema::Record(record) => record_value(json, record, namespace, names, path, mode)?,
        Schema::Decimal(decimal) => decimal_value(json, decimal, path, mode)?,
        Schema::BigDecimal => {
            let text = number_text(json).ok_or_else(expected)?;
            Value::BigDecimal(BigDecimal::from_str(&text).map_err(|_| expected())?)
        }
        Schema::Uuid(_) => Value::Uuid(
            json.as_str()
                .and_then(|s| Uuid::parse_str(s).ok())
                .ok_or_else(expected)?,
        ),
        Schema::Date => Value::Date(match json {
            Json::String(s) => {
                parse_date(s).ok_or_else(|| path.expected("a date \"YYYY-MM-DD\"", json))?
            }
            _ => integer(json)
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| path.expected("a date (\"YYYY-MM-DD\" or a day number)", json))?,
        }),
        Schema::TimeMillis => {
            let millis = time_count(json, TimeUnit::Millis).ok_or_else(expected)?;
            Value::TimeMillis(i32::try_from(millis).map_err(|_| expected())?)
        }
        Schema::TimeMicros => {
            Value::TimeMicros(time_count(json, TimeUnit::Micros).ok_or_else(expected)?)
        }
        Schema::TimestampMillis => {
            Value::TimestampMillis(timestamp_count(json, TimeUnit::Millis, true, path)?)
        }
        Schema::TimestampMicros => {
            Value::TimestampMicros(timestamp_count(json, TimeUnit::Micros, true, path)?)
        }
        Schema::TimestampNanos => {
            Value::TimestampNanos(timestamp_count(json, TimeUnit::Nanos, true, path)?)
        }
        Schema::LocalTimestampMillis => {
            Value::LocalTimestampMillis(timestamp_count(json, TimeUnit::Millis, false, path)?)
        }
        Schema::LocalTimestampMicros => {
            Value::LocalTimestampMicros(timestamp_count(json, TimeUnit::Micros, false, path)?)
        }
        Schema::LocalTimestampNanos => {
            Value::LocalTimestampNanos(timestamp_count(json, TimeUnit::Nanos, false, path)?)
        }
        Schema::Duration(_) => duration_value(json, path, mode)?,
        Schema::Ref { .. } => return Err(expected()),
    })
}

/// A union takes the first branch that accepts the value. When the value is not null and
/// the union has one branch besides null, that branch's own error says more than "none of
/// the branches", so it is the one reported.
fn union_value<'s>(
    json: &Json,
    union: &'s UnionSchema,
    namespace: Option<&'s str>,
    names: &Names<'s>,
    path: &Path,
    mode: Mode,
) -> Result<Value, Mismatch> {
    let branches = union.variants();
    let wrap = |index: usize, value: Value| {
        u32::try_from(index)
            .map(|i| Value::Union(i, Box::new(value)))
            .map_err(|_| path.mismatch("a union of more than 2^32 branches"))
    };
    // A default is for the first branch (the Avro spec); some writers allow a default of a
    // later branch, which the search below then finds.
    if mode == Mode::Default {
        if let Some(Ok(value)) = branches
            .first()
            .map(|first| json_to_value(json, first, namespace, names, path, mode))
        {
            return wrap(0, value);
        }
    }
    let mut only_error = None;
    let non_null = branches
        .iter()
        .filter(|b| !matches!(b, Schema::Null))
        .count();
    for (index, branch) in branches.iter().enumerate() {
        if json.is_null() != matches!(branch, Schema::Null) {
            continue;
        }
        match json_to_value(json, branch, namespace, names, path, mode) {
            Ok(value) => return wrap(index, value),
            Err(error) => only_error = Some(error),
        }
    }
    match only_error {
        Some(error) if non_null == 1 && !json.is_null() => Err(error),
        _ => {
            let kinds: Vec<String> = branches.iter().map(describe).collect();
            Err(path.expected(format_args!("one of: {}", kinds.join(", ")), json))
        }
    }
}

fn record_value<'s>(
    json: &Json,
    record: &'s RecordSchema,
    namespace: Option<&'s str>,
    names: &Names<'s>,
    path: &Path,
    mode: Mode,
) -> Result<Value, Mismatch> {
    let object = json
        .as_object()
        .ok_or_else(|| path.expected(describe_record(record), json))?;
    let namespace = inner_namespace(&record.name, namespace);
    let mut fields = Vec::with_capacity(record.fields.len());
    for field in &record.fields {
        let at = Path::Key(path, &field.name);
        let value = match (object.get(&field.name), &field.default) {
            (Some(item), _) => json_to_value(item, &field.schema, namespace, names, &at, mode)?,
            (None, Some(default)) => {
                json_to_value(default, &field.schema, namespace, names, &at, Mode::Default)
                    .map_err(|e| {
                        at.mismatch(format!(
                            "the default of field `{}` does not fit its schema: {}",
                            field.name, e.detail
                        ))
                    })?
            }
            (None, None) => {
                return Err(path.mismatch(format!("missing field `{}` (no default)", field.name)));
            }
        };
        fields.push((field.name.clone(), value));
    }
    Ok(Value::Record(fields))
}

fn describe_record(record: &RecordSchema) -> String {
    format!("record `{}` (object)", record.name.name())
}

/// The text of a JSON number or string that should hold a number. With serde_json's
/// `arbitrary_precision` a number's text is the one in the item, digit for digit.
fn number_text(json: &Json) -> Option<String> {
    match json {
        Json::Number(n) => Some(n.to_string()),
        Json::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// A JSON number that is an integer in `i64` range (`3.0` and `3e2` count).
fn integer(json: &Json) -> Option<i64> {
    let Json::Number(n) = json else { return None };
    if let Some(n) = n.as_i64() {
        return Some(n);
    }
    let (negative, digits) = scaled_digits(&n.to_string(), 0, 20).ok()?;
    let magnitude: i128 = digits.parse().ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

fn float(json: &Json) -> Option<f64> {
    match json {
        Json::Number(n) => n.as_f64().filter(|f| f.is_finite()),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// Base64 with or without padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An item's bytes are base64; a default's are code points 0–255, one per byte (Avro's
/// JSON encoding of bytes, which schemas use for defaults).
fn bytes(json: &Json, mode: Mode) -> Option<Vec<u8>> {
    let text = json.as_str()?;
    match mode {
        Mode::Item => BASE64.decode(text).ok(),
        Mode::Default => text.chars().map(|c| u8::try_from(c).ok()).collect(),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum DecimalError {
    NotANumber,
    DigitsLost,
    TooManyDigits,
}

/// The unscaled digits of the decimal `text` at `scale` (sign apart, no leading zeros), if
/// no digit is lost and they are at most `max_digits`: `("-1.5", 2, _)` → `(true, "150")`.
fn scaled_digits(
    text: &str,
    scale: u64,
    max_digits: usize,
) -> Result<(bool, String), DecimalError> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (
            &rest[..at],
            rest[at + 1..]
                .parse::<i64>()
                .map_err(|_| DecimalError::NotANumber)?,
        ),
        None => (rest, 0),
    };
    let (whole, part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && part.is_empty() || !all_digits(whole) || !all_digits(part) {
        return Err(DecimalError::NotANumber);
    }
    let mut digits = format!("{whole}{part}");
    // value = digits × 10^(exponent - part.len()); unscaled = value × 10^scale.
    let shift = i128::from(exponent) - part.len() as i128 + i128::from(scale);
    let significant = digits.trim_start_matches('0').len();
    if shift >= 0 {
        if significant > 0 {
            let padded = significant as i128 + shift;
            if padded > max_digits as i128 {
                return Err(DecimalError::TooManyDigits);
            }
            digits.push_str(&"0".repeat(usize::try_from(shift).unwrap_or(0)));
        }
    } else {
        let cut = usize::try_from(-shift).unwrap_or(usize::MAX);
        let keep = digits.len().saturating_sub(cut);
        if digits[keep..].bytes().any(|b| b != b'0') {
            return Err(DecimalError::DigitsLost);
        }
        digits.truncate(keep);
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok((false, "0".into()));
    }
    if digits.len() > max_digits {
        return Err(DecimalError::TooManyDigits);
    }
    Ok((negative, digits.to_owned()))
}

fn decimal_value(
    json: &Json,
    decimal: &DecimalSchema,
    path: &Path,
    mode: Mode,
) -> Result<Value, Mismatch> {
    let fixed_size = match &decimal.inner {
        InnerDecimalSchema::Fixed(fixed) => Some(fixed.size),
        InnerDecimalSchema::Bytes => None,
    };
    if mode == Mode::Default {
        // A default is the two's-complement bytes, as code points.
        let raw = bytes(json, mode)
            .filter(|b| fixed_size.is_none_or(|size| b.len() == size))
            .ok_or_else(|| path.expected("decimal bytes as code points", json))?;
        return Ok(Value::Decimal(Decimal::from(raw)));
    }
    let text =
        number_text(json).ok_or_else(|| path.expected("a decimal (a string or a number)", json))?;
    let scale = u64::try_from(decimal.scale).unwrap_or(u64::MAX);
    let (negative, digits) = match scaled_digits(&text, scale, decimal.precision) {
        Ok(scaled) => scaled,
        Err(DecimalError::NotANumber) => {
            return Err(path.expected("a decimal (a string or a number)", json));
        }
        Err(DecimalError::DigitsLost) => {
            return Err(path.expected(format_args!("a decimal with scale {}", decimal.scale), json));
        }
        Err(DecimalError::TooManyDigits) => {
            return Err(path.expected(
                format_args!(
                    "a decimal of at most {} digits with scale {}",
                    decimal.precision, decimal.scale
                ),
                json,
            ));
        }
    };
    let sign = if negative { "-" } else { "" };
    let raw = BigDecimal::from_str(&format!("{sign}{digits}"))
        .map_err(|_| path.expected("a decimal (a string or a number)", json))?
        .as_bigint_and_exponent()
        .0
        .to_signed_bytes_be();
    if let Some(size) = fixed_size.filter(|&size| raw.len() > size) {
        return Err(path.expected(format_args!("a decimal that fits in {size} bytes"), json));
    }
    Ok(Value::Decimal(Decimal::from(raw)))
}

/// `"YYYY-MM-DD"` as days since 1970-01-01.
fn parse_date(text: &str) -> Option<i32> {
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
fn time_count(json: &Json, unit: TimeUnit) -> Option<i64> {
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
fn timestamp_count(json: &Json, unit: TimeUnit, utc: bool, path: &Path) -> Result<i64, Mismatch> {
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

fn duration_value(json: &Json, path: &Path, mode: Mode) -> Result<Value, Mismatch> {
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
    use super::*;
    use apache_avro::reader::datum::GenericDatumReader;
    use apache_avro::writer::datum::GenericDatumWriter;
    use serde_json::json;

    fn schema(text: &str) -> Schema {
        Schema::parse_str(text).unwrap()
    }

    fn decode(schema: &Schema, bytes: &[u8]) -> Value {
        GenericDatumReader::builder(schema)
            .build()
            .unwrap()
            .read_value(&mut &bytes[..])
            .unwrap()
    }

    fn to_avro_datum(schema: &Schema, value: Value) -> apache_avro::AvroResult<Vec<u8>> {
        GenericDatumWriter::builder(schema)
            .build()?
            .write_value_to_vec(value)
    }

    /// `value` written and read back gives `expected` as JSON, and that JSON written with
    /// `from_json` gives the same bytes.
    fn round_trip(schema_text: &str, value: Value, expected: Json) {
        let schema = schema(schema_text);
        let bytes = to_avro_datum(&schema, value).unwrap();
        let json = to_json(&decode(&schema, &bytes), &schema).unwrap();
        assert_eq!(json, expected, "{schema_text}");
        let back = from_json(&json, &schema).unwrap();
        assert_eq!(
            to_avro_datum(&schema, back).unwrap(),
            bytes,
            "{schema_text}"
        );
    }

    /// As `round_trip`, comparing decoded values instead of bytes (a map's entries are
    /// written in hash order).
    fn round_trip_value(schema_text: &str, value: Value, expected: Json) {
        let schema = schema(schema_text);
        let bytes = to_avro_datum(&schema, value).unwrap();
        let decoded = decode(&schema, &bytes);
        let json = to_json(&decoded, &schema).unwrap();
        assert_eq!(json, expected, "{schema_text}");
        let back = from_json(&json, &schema).unwrap();
        let again = to_avro_datum(&schema, back).unwrap();
        assert_eq!(decode(&schema, &again), decoded, "{schema_text}");
    }

    /// The message `from_json` gives for `json` on `schema`.
    fn mismatch(schema_text: &str, json: Json) -> String {
        from_json(&json, &schema(schema_text))
            .unwrap_err()
            .to_string()
    }

    /// `json` written with `from_json` reads back as `expected`.
    fn written_as(schema_text: &str, json: Json, expected: Json) {
        let schema = schema(schema_text);
        let value = from_json(&json, &schema).unwrap();
        let bytes = to_avro_datum(&schema, value).unwrap();
        assert_eq!(
            to_json(&decode(&schema, &bytes), &schema).unwrap(),
            expected
        );
    }

    #[test]
    fn primitives() {
        round_trip(r#""null""#, Value::Null, json!(null));
        round_trip(r#""boolean""#, Value::Boolean(true), json!(true));
        round_trip(r#""int""#, Value::Int(-42), json!(-42));
        round_trip(r#""long""#, Value::Long(i64::MAX), json!(i64::MAX));
        round_trip(r#""float""#, Value::Float(0.1), json!(0.1));
        round_trip(r#""double""#, Value::Double(-2.5e-300), json!(-2.5e-300));
        round_trip(r#""string""#, Value::String("héllo".into()), json!("héllo"));
    }

    #[test]
    fn non_finite_floats_are_strings() {
        round_trip(r#""double""#, Value::Double(f64::NAN), json!("NaN"));
        round_trip(
            r#""double""#,
            Value::Double(f64::INFINITY),
            json!("Infinity"),
        );
        round_trip(
            r#""float""#,
            Value::Float(f32::NEG_INFINITY),
            json!("-Infinity"),
        );
        round_trip(r#""float""#, Value::Float(f32::NAN), json!("NaN"));
    }

    #[test]
    fn bytes_and_fixed_are_base64() {
        round_trip(
            r#""bytes""#,
            Value::Bytes(vec![0, 1, 254, 255]),
            json!("AAH+/w=="),
        );
        round_trip(
            r#"{"type": "fixed", "name": "F", "size": 3}"#,
            Value::Fixed(3, vec![b'a', b'b', b'c']),
            json!("YWJj"),
        );
        // Padding is optional on the way in.
        written_as(r#""bytes""#, json!("AAH+/w"), json!("AAH+/w=="));
    }

    #[test]
    fn enum_is_its_symbol() {
        round_trip(
            r#"{"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}"#,
            Value::Enum(1, "GREEN".into()),
            json!("GREEN"),
        );
    }

    #[test]
    fn array_map_and_record() {
        round_trip(
            r#"{"type": "array", "items": "int"}"#,
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            json!([1, 2]),
        );
        round_trip_value(
            r#"{"type": "map", "values": "string"}"#,
            Value::Map(HashMap::from([
                ("a".to_owned(), Value::String("x".into())),
                ("b".to_owned(), Value::String("y".into())),
            ])),
            json!({"a": "x", "b": "y"}),
        );
        round_trip(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}"#,
            Value::Record(vec![
                ("id".into(), Value::Long(7)),
                ("name".into(), Value::String("ann".into())),
            ]),
            json!({"id": 7, "name": "ann"}),
        );
    }

    #[test]
    fn union_is_the_branch_taken_unwrapped() {
        let union = r#"["null", "string"]"#;
        round_trip(union, Value::Union(0, Box::new(Value::Null)), json!(null));
        round_trip(
            union,
            Value::Union(1, Box::new(Value::String("a".into()))),
            json!("a"),
        );
        // The first branch that accepts: an integer goes to the int, a fraction to the double.
        let schema = schema(r#"["null", "int", "double", "string"]"#);
        assert_eq!(
            from_json(&json!(3), &schema).unwrap(),
            Value::Union(1, Box::new(Value::Int(3)))
        );
        assert_eq!(
            from_json(&json!(3.5), &schema).unwrap(),
            Value::Union(2, Box::new(Value::Double(3.5)))
        );
        assert_eq!(
            from_json(&json!(null), &schema).unwrap(),
            Value::Union(0, Box::new(Value::Null))
        );
    }

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

    const PRICE: &str =
        r#"{"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}"#;
    const FIXED_PRICE: &str = r#"{"type": "fixed", "name": "P", "size": 3,
        "logicalType": "decimal", "precision": 6, "scale": 2}"#;

    #[test]
    fn decimals_are_exact_strings_with_the_schema_scale() {
        round_trip(
            PRICE,
            Value::Decimal(Decimal::from(vec![0x04, 0xD2])),
            json!("12.34"),
        );
        round_trip(
            PRICE,
            Value::Decimal(Decimal::from(vec![0xFB])),
            json!("-0.05"),
        );
        round_trip(PRICE, Value::Decimal(Decimal::from(vec![0])), json!("0.00"));
        // -1234, sign-extended into three bytes.
        round_trip(
            FIXED_PRICE,
            Value::Decimal(Decimal::from(vec![0xFF, 0xFB, 0x2E])),
            json!("-12.34"),
        );
        round_trip(
            r#"{"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 0}"#,
            Value::Decimal(Decimal::from(vec![0x04, 0xD2])),
            json!("1234"),
        );
    }

    #[test]
    fn decimals_are_read_from_strings_and_numbers_when_no_digit_is_lost() {
        written_as(PRICE, json!("12.3"), json!("12.30"));
        written_as(PRICE, json!(12.3), json!("12.30"));
        written_as(PRICE, json!(-7), json!("-7.00"));
        written_as(PRICE, json!("1.2e1"), json!("12.00"));
        written_as(PRICE, json!("12.3400"), json!("12.34"));
        written_as(PRICE, json!("-0.00"), json!("0.00"));
        written_as(FIXED_PRICE, json!("-9999.99"), json!("-9999.99"));
        assert_eq!(
            mismatch(PRICE, json!("12.345")),
            "at the top: expected a decimal with scale 2, found \"12.345\""
        );
        assert_eq!(
            mismatch(PRICE, json!("12345.6")),
            "at the top: expected a decimal of at most 6 digits with scale 2, found \"12345.6\""
        );
        assert_eq!(
            mismatch(PRICE, json!("1e999999999")),
            "at the top: expected a decimal of at most 6 digits with scale 2, \
             found \"1e999999999\""
        );
        assert_eq!(
            mismatch(PRICE, json!("12,5")),
            "at the top: expected a decimal (a string or a number), found \"12,5\""
        );
    }

    #[test]
    fn big_decimal_keeps_its_own_scale() {
        let big = r#"{"type": "bytes", "logicalType": "big-decimal"}"#;
        round_trip(
            big,
            Value::BigDecimal(BigDecimal::from_str("-12.345").unwrap()),
            json!("-12.345"),
        );
        round_trip(
            big,
            Value::BigDecimal(BigDecimal::from_str("0.000001").unwrap()),
            json!("0.000001"),
        );
        // A negative scale is written out in full; the value, not its scale, comes back.
        round_trip_value(
            big,
            Value::BigDecimal(BigDecimal::from_str("1e3").unwrap()),
            json!("1000"),
        );
        round_trip(
            big,
            Value::BigDecimal(BigDecimal::from_str("1e1000").unwrap()),
            json!("1E+1000"),
        );
    }

    #[test]
    fn uuid_is_hyphenated_lowercase() {
        let uuid = Uuid::parse_str("A1A2A3A4-B1B2-C1C2-D1D2-D3D4D5D6D7D8").unwrap();
        round_trip(
            r#"{"type": "string", "logicalType": "uuid"}"#,
            Value::Uuid(uuid),
            json!("a1a2a3a4-b1b2-c1c2-d1d2-d3d4d5d6d7d8"),
        );
        round_trip(
            r#"{"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}"#,
            Value::Uuid(uuid),
            json!("a1a2a3a4-b1b2-c1c2-d1d2-d3d4d5d6d7d8"),
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

    const ORDER: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "string"},
        {"name": "user", "type": ["null", {"type": "record", "name": "User", "fields": [
            {"name": "name", "type": "string"},
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
        ]}]},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
            "precision": 6, "scale": 2}},
        {"name": "seller", "type": ["null", "shop.User"], "default": null}
    ]}"#;

    #[test]
    fn nested_record_in_a_union_with_null() {
        let present = Value::Record(vec![
            ("id".into(), Value::String("o1".into())),
            (
                "user".into(),
                Value::Union(
                    1,
                    Box::new(Value::Record(vec![
                        ("name".into(), Value::String("ann".into())),
                        (
                            "tags".into(),
                            Value::Array(vec![Value::String("vip".into())]),
                        ),
                    ])),
                ),
            ),
            (
                "price".into(),
                Value::Decimal(Decimal::from(vec![0x04, 0xD2])),
            ),
            ("seller".into(), Value::Union(0, Box::new(Value::Null))),
        ]);
        round_trip(
            ORDER,
            present,
            json!({"id": "o1", "user": {"name": "ann", "tags": ["vip"]}, "price": "12.34",
                   "seller": null}),
        );
        let absent = Value::Record(vec![
            ("id".into(), Value::String("o2".into())),
            ("user".into(), Value::Union(0, Box::new(Value::Null))),
            ("price".into(), Value::Decimal(Decimal::from(vec![0]))),
            (
                "seller".into(),
                Value::Union(
                    1,
                    Box::new(Value::Record(vec![
                        ("name".into(), Value::String("bo".into())),
                        ("tags".into(), Value::Array(vec![])),
                    ])),
                ),
            ),
        ]);
        round_trip(
            ORDER,
            absent,
            json!({"id": "o2", "user": null, "price": "0.00",
                   "seller": {"name": "bo", "tags": []}}),
        );
    }

    #[test]
    fn missing_fields_take_their_default_or_are_a_mismatch() {
        // `seller` and `user.tags` are missing and have defaults; `extra` is not in the
        // schema and is ignored.
        written_as(
            ORDER,
            json!({"id": "o3", "user": {"name": "cy"}, "price": 1, "extra": {"x": 1}}),
            json!({"id": "o3", "user": {"name": "cy", "tags": []}, "price": "1.00",
                   "seller": null}),
        );
        assert_eq!(
            mismatch(ORDER, json!({"id": "o3", "user": {"tags": []}, "price": 1})),
            "at /user: missing field `name` (no default)"
        );
        assert_eq!(
            mismatch(ORDER, json!({"user": null, "price": 1})),
            "at the top: missing field `id` (no default)"
        );
    }

    #[test]
    fn defaults_use_avro_json_encoding() {
        let schema = r#"{"type": "record", "name": "R", "fields": [
            {"name": "b", "type": "bytes", "default": "\u00ff\u0001"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"},
                "default": 1796159616123},
            {"name": "n", "type": ["int", "null"], "default": 5},
            {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["R", "G"]},
                "default": "G"},
            {"name": "inner", "type": {"type": "record", "name": "I", "fields": [
                {"name": "x", "type": "int", "default": 1}]}, "default": {}}
        ]}"#;
        written_as(
            schema,
            json!({}),
            json!({"b": "/wE=", "at": "2026-12-01T21:13:36.123Z", "n": 5, "color": "G",
                   "inner": {"x": 1}}),
        );
    }

    #[test]
    fn map_of_arrays() {
        round_trip_value(
            r#"{"type": "map", "values": {"type": "array", "items": "long"}}"#,
            Value::Map(HashMap::from([
                (
                    "a".to_owned(),
                    Value::Array(vec![Value::Long(1), Value::Long(2)]),
                ),
                ("b".to_owned(), Value::Array(vec![])),
            ])),
            json!({"a": [1, 2], "b": []}),
        );
    }

    const LIST: &str = r#"{"type": "record", "name": "Node", "namespace": "ll", "fields": [
        {"name": "value", "type": "int"},
        {"name": "next", "type": ["null", "Node"]}
    ]}"#;

    #[test]
    fn recursive_linked_list() {
        let node = |value, next| {
            Value::Record(vec![
                ("value".into(), Value::Int(value)),
                ("next".into(), next),
            ])
        };
        let end = Value::Union(0, Box::new(Value::Null));
        let list = node(
            1,
            Value::Union(
                1,
                Box::new(node(2, Value::Union(1, Box::new(node(3, end))))),
            ),
        );
        round_trip(
            LIST,
            list,
            json!({"value": 1, "next": {"value": 2, "next": {"value": 3, "next": null}}}),
        );
        assert_eq!(
            mismatch(
                LIST,
                json!({"value": 1, "next": {"value": "two", "next": null}})
            ),
            "at /next/value: expected an int (32-bit integer), found \"two\""
        );
    }

    #[test]
    fn mismatches_name_the_place() {
        assert_eq!(
            mismatch(r#""int""#, json!(3_000_000_000_i64)),
            "at the top: expected an int (32-bit integer), found 3000000000"
        );
        assert_eq!(
            mismatch(r#""long""#, json!(1.5)),
            "at the top: expected a long (64-bit integer), found 1.5"
        );
        assert_eq!(
            mismatch(r#""long""#, json!("18446744073709551616")),
            "at the top: expected a long (64-bit integer), found \"18446744073709551616\""
        );
        assert_eq!(
            mismatch(r#"{"type": "array", "items": "boolean"}"#, json!([true, 1])),
            "at /1: expected a boolean, found 1"
        );
        assert_eq!(
            mismatch(
                r#"{"type": "map", "values": "string"}"#,
                json!({"a/b~c": 1})
            ),
            "at /a~1b~0c: expected a string, found 1"
        );
        assert_eq!(
            mismatch(
                r#"{"type": "enum", "name": "Color", "symbols": ["RED"]}"#,
                json!("BLUE")
            ),
            "at the top: expected one of the symbols of enum `Color`, found \"BLUE\""
        );
        assert_eq!(
            mismatch(
                r#"{"type": "fixed", "name": "F", "size": 2}"#,
                json!("YWJj")
            ),
            "at the top: expected fixed `F` (2 bytes, base64), found \"YWJj\""
        );
        assert_eq!(
            mismatch(r#""bytes""#, json!("not base64!")),
            "at the top: expected bytes (base64), found \"not base64!\""
        );
        assert_eq!(
            mismatch(r#"["null", "int", "string"]"#, json!(true)),
            "at the top: expected one of: null, an int, a string, found true"
        );
        assert_eq!(
            mismatch(r#"["null", "string"]"#, json!(1)),
            "at the top: expected a string, found 1"
        );
        assert_eq!(
            mismatch(r#""string""#, json!(null)),
            "at the top: expected a string, found null"
        );
        assert_eq!(
            mismatch(r#""null""#, json!(0)),
            "at the top: expected null, found 0"
        );
        assert_eq!(
            mismatch(ORDER, json!({"id": "o", "user": null, "price": "12.345"})),
            "at /price: expected a decimal with scale 2, found \"12.345\""
        );
        assert_eq!(
            mismatch(ORDER, json!([])),
            "at the top: expected record `Order` (object), found []"
        );
        assert_eq!(
            mismatch(r#""float""#, serde_json::from_str("1e300").unwrap()),
            "at the top: expected a float (out of its range), found 1e+300"
        );
        assert_eq!(
            mismatch(
                r#"{"type": "int", "logicalType": "time-millis"}"#,
                json!("24:00:00")
            ),
            "at the top: expected a time-millis, found \"24:00:00\""
        );
        assert_eq!(
            mismatch(
                r#"{"type": "int", "logicalType": "date"}"#,
                json!("2026-02-30")
            ),
            "at the top: expected a date \"YYYY-MM-DD\", found \"2026-02-30\""
        );
        assert_eq!(
            mismatch(
                r#"{"type": "string", "logicalType": "uuid"}"#,
                json!("nope")
            ),
            "at the top: expected a uuid, found \"nope\""
        );
    }

    #[test]
    fn long_found_values_are_cut() {
        let message = mismatch(r#""int""#, json!("x".repeat(200)));
        assert_eq!(
            message,
            format!(
                "at the top: expected an int (32-bit integer), found \"{}…",
                "x".repeat(63)
            )
        );
    }

    #[test]
    fn integers_in_other_notations_count() {
        written_as(r#""int""#, json!(3.0), json!(3));
        written_as(r#""long""#, json!(1e3), json!(1000));
    }

    #[test]
    fn to_json_reports_a_value_the_schema_does_not_describe() {
        let error = to_json(
            &Value::Decimal(Decimal::from(vec![1])),
            &schema(r#""bytes""#),
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "at the top: the schema says bytes (base64), but the value is a decimal value"
        );
    }
}

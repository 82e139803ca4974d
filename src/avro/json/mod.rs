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
//!
//! One file a concept: Avro to JSON (`avro_to_json.rs`), JSON to Avro (`json_to_avro.rs`),
//! the logical types of time (`datetime.rs`) and decimals (`decimal.rs`) both ways, named
//! types and references (`names.rs`), and what a `Mismatch` says (`mismatch.rs`).

mod avro_to_json;
mod datetime;
mod decimal;
mod json_to_avro;
mod mismatch;
mod names;
mod scalars;
#[cfg(test)]
mod tests;

pub use mismatch::Mismatch;

use apache_avro::types::Value;
use apache_avro::Schema;
use avro_to_json::value_to_json;
use json_to_avro::json_to_value;
use mismatch::Path;
use names::Names;
use scalars::Mode;
use serde_json::Value as Json;

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

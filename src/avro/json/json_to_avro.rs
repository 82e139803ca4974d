//! A JSON item as an Avro value of a schema, by the inverse rule in the [module doc](super),
//! with its allowances.

use super::datetime::{duration_value, parse_date, time_count, timestamp_count, TimeUnit};
use super::decimal::decimal_value;
use super::mismatch::{describe, Path};
use super::names::{inner_namespace, Names};
use super::scalars::{bytes, float, integer, number_text, Mode};
use super::Mismatch;
use apache_avro::schema::{RecordSchema, UnionSchema};
use apache_avro::types::Value;
use apache_avro::{BigDecimal, Schema, Uuid};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::str::FromStr;

pub(super) fn json_to_value<'s>(
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
                            field.name,
                            e.detail()
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

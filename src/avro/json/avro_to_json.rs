//! A decoded Avro value as JSON, by the rule in the [module doc](super).

use super::datetime::{date_json, time_json, timestamp_json, TimeUnit};
use super::decimal::{decimal_text, scale_i64, unscaled_text};
use super::mismatch::{describe, value_kind, Path};
use super::names::{inner_namespace, Names};
use super::Mismatch;
use apache_avro::types::Value;
use apache_avro::{Decimal, Schema};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::Value as Json;

pub(super) fn value_to_json<'s>(
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

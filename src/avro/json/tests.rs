//! Round trips of every kind of value, and what a mismatch says; the shared helpers the
//! tests of the logical types use too.

use super::*;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Decimal, Uuid};
use serde_json::json;
use std::collections::HashMap;

pub(super) fn schema(text: &str) -> Schema {
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
pub(super) fn round_trip(schema_text: &str, value: Value, expected: Json) {
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
pub(super) fn round_trip_value(schema_text: &str, value: Value, expected: Json) {
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
pub(super) fn mismatch(schema_text: &str, json: Json) -> String {
    from_json(&json, &schema(schema_text))
        .unwrap_err()
        .to_string()
}

/// `json` written with `from_json` reads back as `expected`.
pub(super) fn written_as(schema_text: &str, json: Json, expected: Json) {
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

//! Decimals both ways: `decimal` at its schema's scale and `big-decimal` at its own, as
//! exact text, and read back only when no digit is lost.

use super::mismatch::Path;
use super::scalars::{bytes, number_text, scaled_digits, DecimalError, Mode};
use super::Mismatch;
use apache_avro::schema::{DecimalSchema, InnerDecimalSchema};
use apache_avro::types::Value;
use apache_avro::{BigDecimal, Decimal};
use serde_json::Value as Json;
use std::str::FromStr;

pub(super) fn scale_i64(decimal: &DecimalSchema) -> i64 {
    i64::try_from(decimal.scale).unwrap_or(i64::MAX)
}

/// The unscaled integer of a decimal, in decimal digits (`"-1234"`).
pub(super) fn unscaled_text(decimal: &Decimal) -> String {
    BigDecimal::new(decimal.clone().into(), 0)
        .as_bigint_and_exponent()
        .0
        .to_string()
}

/// Most zeros a decimal's text is padded with before it is written with an exponent.
const MAX_PADDING: i64 = 100;

/// The text of `unscaled × 10^-scale`, exactly (`("-5", 2)` → `"-0.05"`).
pub(super) fn decimal_text(unscaled: String, scale: i64) -> String {
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

pub(super) fn decimal_value(
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

#[cfg(test)]
mod tests {
    use crate::avro::json::tests::{mismatch, round_trip, round_trip_value, written_as};
    use apache_avro::types::Value;
    use apache_avro::{BigDecimal, Decimal};
    use serde_json::json;
    use std::str::FromStr;

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
}

//! The JSON scalars an Avro value is read from: numbers (as text, as integers, as
//! floats), decimal digits at a scale, and bytes (base64 in an item, code points in a
//! schema's default). Shared by the general mapping and its logical types.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use serde_json::Value as Json;

/// What the JSON being read is: an item, or a default from the schema, which Avro writes
/// differently (bytes as code points, a union's default for its first branch).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Item,
    Default,
}

/// The text of a JSON number or string that should hold a number. With serde_json's
/// `arbitrary_precision` a number's text is the one in the item, digit for digit.
pub(super) fn number_text(json: &Json) -> Option<String> {
    match json {
        Json::Number(n) => Some(n.to_string()),
        Json::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// A JSON number that is an integer in `i64` range (`3.0` and `3e2` count).
pub(super) fn integer(json: &Json) -> Option<i64> {
    let Json::Number(n) = json else { return None };
    if let Some(n) = n.as_i64() {
        return Some(n);
    }
    let (negative, digits) = scaled_digits(&n.to_string(), 0, 20).ok()?;
    let magnitude: i128 = digits.parse().ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

pub(super) fn float(json: &Json) -> Option<f64> {
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
pub(super) fn bytes(json: &Json, mode: Mode) -> Option<Vec<u8>> {
    let text = json.as_str()?;
    match mode {
        Mode::Item => BASE64.decode(text).ok(),
        Mode::Default => text.chars().map(|c| u8::try_from(c).ok()).collect(),
    }
}

/// Why decimal text has no exact digits at a scale.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DecimalError {
    NotANumber,
    DigitsLost,
    TooManyDigits,
}

/// The unscaled digits of the decimal `text` at `scale` (sign apart, no leading zeros), if
/// no digit is lost and they are at most `max_digits`: `("-1.5", 2, _)` → `(true, "150")`.
pub(super) fn scaled_digits(
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

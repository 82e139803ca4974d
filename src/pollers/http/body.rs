//! `WATCHBRIDGE_HTTP_BODY`: the JSON body a POST sends, made from the input with the URL
//! template's placeholders, `{/json/pointer}` (that field of the input value) and `{key}`
//! (the watch key).
//!
//! Where a placeholder sits decides what replaces it, and neither way can an input change
//! the body's structure:
//!
//! - **Inside a JSON string** (`"name": "user {/name}"`): the value's text (a string's
//!   own text, a number as written, `true`/`false`) escaped by JSON's rules, so a `"` or `\`
//!   in it stays inside the string: `x", "admin": true` is sent as `x\", \"admin\": true`.
//!   An object, array or `null` there is refused (it has no text).
//! - **Standing as a whole value** (`"id": {/id}`, `[{key}]`): the input's JSON value
//!   itself (any type: a number exactly as written, an object with all it holds; `{key}` is
//!   a JSON string). A value is one whole JSON value, so it can only fill its own place.
//!
//! Only `{/…}` and `{key}` are placeholders: JSON's own braces never start with `/` or
//! `key}` outside a string, so no escaping is needed there. Inside a string, write the
//! brace of a literal `{key}` or `{/…}` as `\u007b` (JSON reads it as `{`).
//!
//! A template that could make something other than JSON for some input (a placeholder
//! glued to other text outside a string, `{"a": x{/id}}`; a missing bracket) fails the
//! start: with every placeholder in a string filled by `1` and every one standing as a
//! value filled by `null` (which no neighbouring text can turn into another valid token),
//! it must be JSON.

use crate::pollers::RenderError;
use serde_json::Value;
use std::fmt;

#[derive(Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Placeholder {
        /// `None`: `{key}`; else a JSON pointer into the input value.
        pointer: Option<String>,
        /// Inside a JSON string (escaped text) rather than standing as a value.
        in_string: bool,
    },
}

/// A parsed `WATCHBRIDGE_HTTP_BODY`.
#[derive(Clone, PartialEq, Eq)]
pub struct BodyTemplate {
    parts: Vec<Part>,
}

/// Not the template's text: a body may carry something secret (it is hidden from `--help`
/// too); how many placeholders it has is enough to tell templates apart.
impl fmt::Debug for BodyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let placeholders = self
            .parts
            .iter()
            .filter(|p| matches!(p, Part::Placeholder { .. }))
            .count();
        write!(f, "BodyTemplate({placeholders} placeholders)")
    }
}

impl BodyTemplate {
    /// Parse and check `text` (see the module's doc). The error says why, never quoting the
    /// text (it may hold a secret), only where.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let (mut in_string, mut escaped) = (false, false);
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let column = text.len() - rest.len() + 1;
            if in_string && escaped {
                escaped = false;
            } else if in_string && c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = !in_string;
            } else if c == '{' && (rest.starts_with("{/") || rest.starts_with("{key}")) {
                let end = rest.find('}').ok_or_else(|| {
                    format!("the placeholder at column {column} has no closing `}}`")
                })?;
                let name = &rest[1..end];
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                parts.push(Part::Placeholder {
                    pointer: (name != "key").then(|| name.to_string()),
                    in_string,
                });
                rest = &rest[end + 1..];
                continue;
            }
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let template = Self { parts };
        let sample = template.sample();
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&sample) {
            return Err(format!(
                "is not JSON whatever the input ({e}, with each placeholder inside a string filled by `1` and each standing as a value by `null`): a placeholder outside a string must stand alone as a whole value (`\"id\": {{/id}}`), one inside a string is replaced by its text (`\"q\": \"user {{/id}}\"`)"
            ));
        }
        Ok(template)
    }

    /// The body with every placeholder filled by a sample (see [`parse`](Self::parse)).
    fn sample(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.as_str(),
                Part::Placeholder {
                    in_string: true, ..
                } => "1",
                Part::Placeholder {
                    in_string: false, ..
                } => "null",
            })
            .collect()
    }

    /// The body for one input. An input that cannot fill it (a missing field, an object
    /// inside a string, a key that is not UTF-8) is refused with the reason, which sends it
    /// to the dead-letter topic as the URL's errors do.
    pub fn render(&self, input: &Value, key: &[u8]) -> Result<String, RenderError> {
        let mut out = String::new();
        for part in &self.parts {
            let (pointer, in_string) = match part {
                Part::Literal(s) => {
                    out.push_str(s);
                    continue;
                }
                Part::Placeholder { pointer, in_string } => (pointer, *in_string),
            };
            let key_value;
            let value = match pointer {
                Some(p) => input
                    .pointer(p)
                    .ok_or_else(|| RenderError::Missing(p.clone()))?,
                None => {
                    let key = std::str::from_utf8(key).map_err(|_| RenderError::KeyNotUtf8)?;
                    key_value = Value::String(key.to_string());
                    &key_value
                }
            };
            if in_string {
                let number_or_bool;
                let text = match value {
                    Value::String(s) => s.as_str(),
                    Value::Number(_) | Value::Bool(_) => {
                        number_or_bool = value.to_string();
                        &number_or_bool
                    }
                    other => {
                        let what = match other {
                            Value::Null => "null",
                            Value::Array(_) => "an array",
                            _ => "an object",
                        };
                        let placeholder = pointer.clone().unwrap_or_else(|| "key".into());
                        return Err(RenderError::NotScalar(placeholder, what));
                    }
                };
                let quoted = Value::String(text.to_string()).to_string();
                out.push_str(&quoted[1..quoted.len() - 1]);
            } else {
                out.push_str(&value.to_string());
            }
        }
        // By construction JSON (the start checked the template's shape; every value is
        // JSON's own writing); checked once per watch, so a mistake here is a dead letter
        // with a reason, not a stream of requests the server refuses.
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&out) {
            return Err(RenderError::Unusable(format!(
                "WATCHBRIDGE_HTTP_BODY does not make JSON for this input: {e}"
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, input: Value) -> Value {
        let body = BodyTemplate::parse(template)
            .unwrap()
            .render(&input, b"k-1")
            .unwrap();
        serde_json::from_str(&body).unwrap()
    }

    #[test]
    fn only_slash_and_key_placeholders_are_replaced() {
        assert_eq!(
            render(
                r#"{"q": "query{user{id}} {foo} \u007bkey} \"{key}\"", "k": {key}}"#,
                json!({})
            ),
            json!({"q": "query{user{id}} {foo} {key} \"k-1\"", "k": "k-1"})
        );
    }

    #[test]
    fn a_value_in_a_string_has_text_and_one_standing_alone_is_the_inputs_json() {
        let input: Value = serde_json::from_str(
            r#"{"s": "a\"b", "n": 1.50, "b": true, "o": {"x": [1]}, "z": null}"#,
        )
        .unwrap();
        assert_eq!(
            render(
                r#"{"s": "{/s}", "n": "{/n}", "b": "{/b}", "o": {/o}, "z": {/z}, "sv": {/s}}"#,
                input
            ),
            json!({"s": "a\"b", "n": "1.50", "b": "true", "o": {"x": [1]}, "z": null, "sv": "a\"b"})
        );
        let t = BodyTemplate::parse(r#"{"z": "{/z}"}"#).unwrap();
        assert_eq!(
            t.render(&json!({"z": null}), b"k"),
            Err(RenderError::NotScalar("/z".into(), "null"))
        );
    }

    #[test]
    fn the_template_text_never_shows_in_debug_or_errors() {
        let t = BodyTemplate::parse(r#"{"token": "s3cret", "id": {/id}}"#).unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
        let e = BodyTemplate::parse(r#"{"token": "s3cret", "id": x{/id}}"#).unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(e.contains("column"), "says where: {e}");
    }
}

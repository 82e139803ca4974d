//! Templates that turn an input into a resource address: `{/json/pointer}` is replaced by
//! that field of the input value, `{key}` by the watch key, e.g.
//! `http://127.0.0.1:8080/users/{/id}/events`.
//!
//! A substituted value is percent-encoded as one URL component (everything but RFC 3986's
//! unreserved characters is encoded), so an input can never change the URL's structure:
//! `../admin` becomes `..%2Fadmin`, one opaque segment. A placeholder placed in the scheme
//! or host does let the input choose them; [`Template::origin_placeholders`] finds those so
//! the HTTP poller can refuse them.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;
use std::fmt;

/// Everything except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The longest file name (one path segment) Linux file systems take, in bytes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// The longest path the kernel takes, in bytes, its terminating NUL included (`PATH_MAX`).
pub const PATH_MAX: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// A JSON pointer into the input value (RFC 6901, starts with `/`).
    Pointer(String),
    Key,
    /// A value from the watch's own progress (`{last.time}`, …), filled at each poll.
    Last(LastField),
}

/// What a watch remembers of its last polls, for incremental requests (`{last.time}`,
/// `{last.time_ms}`, `{last.key}`, `{last.cursor}` in the HTTP poller's URL template).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastField {
    /// The newest output's event time, RFC 3339 in UTC.
    Time,
    /// The same, as epoch milliseconds.
    TimeMs,
    /// The newest output's key.
    Key,
    /// The last cursor a page gave at `WATCHBRIDGE_HTTP_NEXT`.
    Cursor,
}

impl LastField {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "last.time" => Self::Time,
            "last.time_ms" => Self::TimeMs,
            "last.key" => Self::Key,
            "last.cursor" => Self::Cursor,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Time => "last.time",
            Self::TimeMs => "last.time_ms",
            Self::Key => "last.key",
            Self::Cursor => "last.cursor",
        }
    }
}

/// Where a placeholder sits in a URL template ([`Template::origin_placeholders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginPart {
    Scheme,
    /// User info, host or port.
    Authority,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    parts: Vec<Part>,
}

/// A template that cannot be parsed, with the byte offset of the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at column {} of template `{}`", position + 1, crate::logging::url(text))]
pub struct TemplateError {
    pub message: String,
    pub position: usize,
    pub text: String,
}

/// Why an input could not fill a template. The input goes to the dead-letter topic with this
/// as the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The input has no field at this JSON pointer.
    #[error("input has no field at JSON pointer `{0}`")]
    Missing(String),
    /// The field at this JSON pointer is of this JSON type, not a scalar.
    #[error("field at JSON pointer `{0}` is {1}, not a string, number or boolean")]
    NotScalar(String, &'static str),
    /// The watch key is needed as text and is not UTF-8.
    #[error("watch key is not UTF-8")]
    KeyNotUtf8,
    /// The filled template does not name something the poller may reach.
    #[error("{0}")]
    Unusable(String),
    /// A value that would fill a path segment is not one (it holds `/`, is `..`, ...).
    #[error("value for `{{{placeholder}}}` must be one path segment: {reason}")]
    NotOneSegment {
        /// The placeholder it was for.
        placeholder: String,
        /// Why it is not one segment.
        reason: &'static str,
    },
}

impl Template {
    /// Parse `text`. `{` opens a placeholder (`{key}` or `{/pointer}`); `{{` and `}}` stand
    /// for literal braces.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let err = |message: String, position: usize| TemplateError {
            message,
            position,
            text: text.to_string(),
        };
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => {
                    return Err(err(
                        "unmatched `}` (write `}}` for a literal brace)".into(),
                        i,
                    ))
                }
                '{' => {
                    let rest = &text[i + 1..];
                    let Some(end) = rest.find('}') else {
                        return Err(err("unclosed `{`".into(), i));
                    };
                    let name = &rest[..end];
                    let part = if name == "key" {
                        Part::Key
                    } else if name.starts_with('/') {
                        Part::Pointer(name.to_string())
                    } else if let Some(field) = LastField::parse(name) {
                        Part::Last(field)
                    } else {
                        return Err(err(
                            format!("unknown placeholder `{{{name}}}` (expected `{{key}}`, a JSON pointer such as `{{/id}}`, or `{{last.time}}`, `{{last.time_ms}}`, `{{last.key}}`, `{{last.cursor}}`)"),
                            i,
                        ));
                    };
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(part);
                    // Skip the placeholder's characters and its closing brace.
                    while chars.peek().is_some_and(|&(j, _)| j <= i + 1 + end) {
                        chars.next();
                    }
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Self {
            text: text.to_string(),
            parts,
        })
    }

    /// The placeholders in the scheme or the authority (user info, host, port) of a URL
    /// template, in order, each with where it sits: an input that fills one of them chooses
    /// where a request goes. The authority starts after the first `://` and ends at the
    /// first `/`, `?`, `#` or `\\` of the template's own text; without a `://`, everything
    /// counts as the scheme.
    pub fn origin_placeholders(&self) -> Vec<(String, OriginPart)> {
        let mut found = Vec::new();
        let mut part = OriginPart::Scheme;
        let mut scheme = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(text) => {
                    for c in text.chars() {
                        match part {
                            OriginPart::Scheme => {
                                scheme.push(c);
                                if scheme.ends_with("://") {
                                    part = OriginPart::Authority;
                                }
                            }
                            OriginPart::Authority if matches!(c, '/' | '?' | '#' | '\\') => {
                                return found;
                            }
                            OriginPart::Authority => {}
                        }
                    }
                }
                Part::Pointer(pointer) => {
                    found.push((format!("{{{pointer}}}"), part));
                    // Not part of a literal `://`.
                    scheme.push('\0');
                }
                Part::Key => {
                    found.push(("{key}".to_string(), part));
                    scheme.push('\0');
                }
                Part::Last(field) => {
                    found.push((format!("{{{}}}", field.name()), part));
                    scheme.push('\0');
                }
            }
        }
        found
    }

    /// The `{last.*}` placeholders, in order, each with whether it sits in the query (after
    /// the template's own first `?`).
    pub fn last_placeholders(&self) -> Vec<(LastField, bool)> {
        let mut in_query = false;
        let mut found = Vec::new();
        for p in &self.parts {
            match p {
                Part::Literal(text) => in_query |= text.contains('?'),
                Part::Last(field) => found.push((*field, in_query)),
                Part::Pointer(_) | Part::Key => {}
            }
        }
        found
    }

    /// The template with the input's values in place (encoded as [`render`](Self::render)
    /// encodes them), its `{last.*}` placeholders left for [`render_last`](Self::render_last)
    /// at each poll.
    pub fn bind(&self, input: &Value, key: &[u8]) -> Result<Template, RenderError> {
        let mut lasts = Vec::new();
        let text = self.render_url(input, key, |field, at| lasts.push((at, field)))?;
        let mut parts = Vec::new();
        let mut from = 0;
        for (at, field) in lasts {
            parts.push(Part::Literal(text[from..at].to_string()));
            parts.push(Part::Last(field));
            from = at;
        }
        parts.push(Part::Literal(text[from..].to_string()));
        Ok(Template {
            text: self.text.clone(),
            parts,
        })
    }

    /// A [bound](Self::bind) template filled with the watch's last values (`value` gives
    /// each, empty when the watch has none yet), percent-encoded as one component.
    pub fn render_last(&self, value: impl Fn(LastField) -> String) -> String {
        let mut out = String::with_capacity(self.text.len() + 32);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Last(field) => out.extend(utf8_percent_encode(&value(*field), COMPONENT)),
                Part::Pointer(_) | Part::Key => {
                    debug_assert!(false, "render_last on a template that was not bound")
                }
            }
        }
        out
    }

    /// Whether the template reads the input value at all (if not, only the key matters).
    pub fn uses_input(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Pointer(_)))
    }

    /// Fill a URL template: every substituted value is percent-encoded as one component.
    ///
    /// A value that is exactly `.` or `..` is refused: URL parsers read such a path segment
    /// as a directory step (and `%2e%2e` too, so encoding cannot help). An empty value is
    /// refused before the query (`?`) or fragment (`#`): `/users/{/id}` with an empty id
    /// would name `/users/`, another resource (the collection); in the query or fragment it
    /// is just an empty value.
    pub fn render(&self, input: &Value, key: &[u8]) -> Result<String, RenderError> {
        self.render_url(input, key, no_last)
    }

    /// [`render`](Self::render), calling `last` with each `{last.*}` placeholder (left empty)
    /// and where in the output it stands.
    fn render_url(
        &self,
        input: &Value,
        key: &[u8],
        last: impl FnMut(LastField, usize),
    ) -> Result<String, RenderError> {
        self.render_with(input, key, push_literal, last, |placeholder, value, out| {
            // Values are percent-encoded, so a `?` or `#` written so far is the template's.
            if value.is_empty() && !out.contains(['?', '#']) {
                return Err(RenderError::NotOneSegment {
                    placeholder: placeholder.to_string(),
                    reason: "it is empty, and an empty path value would name another resource (`/users/{/id}` would poll `/users/`)",
                });
            }
            if value == "." || value == ".." {
                return Err(RenderError::NotOneSegment {
                    placeholder: placeholder.to_string(),
                    reason: "`.` and `..` are directory steps in a URL path",
                });
            }
            out.extend(utf8_percent_encode(value, COMPONENT));
            Ok(())
        })
    }

    /// Fill a glob pattern template: every substituted value must be one literal path
    /// segment. A value containing `/`, `..` or NUL, or one that is empty or `.`, is refused
    /// (it could name another directory), and so is one longer than a file name may be
    /// ([`NAME_MAX`]: no file could match it); glob metacharacters in it are escaped so they
    /// match only themselves.
    pub fn render_glob(&self, input: &Value, key: &[u8]) -> Result<String, RenderError> {
        self.render_path(input, key, |value, out| {
            out.push_str(&glob::Pattern::escape(value))
        })
    }

    /// Fill a template whose values name path segments of an object key (the object-store
    /// poller's prefix): the rule of [`render_glob`](Self::render_glob), so an input cannot
    /// leave its prefix, with values as they are (a key has no metacharacters).
    pub fn render_segments(&self, input: &Value, key: &[u8]) -> Result<String, RenderError> {
        self.render_path(input, key, |value, out| out.push_str(value))
    }

    /// Fill a template whose values are each one path segment, written by `write`.
    fn render_path(
        &self,
        input: &Value,
        key: &[u8],
        write: impl Fn(&str, &mut String),
    ) -> Result<String, RenderError> {
        self.render_with(
            input,
            key,
            push_literal,
            no_last,
            |placeholder, value, out| {
                one_segment(placeholder, value)?;
                write(value, out);
                Ok(())
            },
        )
    }

    /// Fill a glob pattern template ([`render_glob`](Self::render_glob)) and also return the
    /// directory it watches: the longest prefix of the pattern made of whole path segments
    /// without a glob metacharacter, with substituted values as they are (not escaped), e.g.
    /// `/data/a*` for `/data/{/tenant}/*.csv` and tenant `a*`. Only the template's own text
    /// can hold metacharacters (`*`, `?`, `[`); a pattern without any watches the directory
    /// of its last segment. Empty for a relative pattern whose first segment is not literal.
    pub(crate) fn render_glob_dir(
        &self,
        input: &Value,
        key: &[u8],
    ) -> Result<(String, String), RenderError> {
        let pattern = self.render_glob(input, key)?;
        // The same walk with values raw (render_glob has accepted them: no `/`, no NUL) and
        // the template's metacharacters marked by NUL, which nothing else here contains.
        let marked = self.render_with(
            input,
            key,
            |s, out| {
                out.extend(s.chars().map(|c| match c {
                    '*' | '?' | '[' => '\0',
                    c => c,
                }))
            },
            no_last,
            |_, value, out| {
                out.push_str(value);
                Ok(())
            },
        )?;
        let literal = &marked[..marked.find('\0').unwrap_or(marked.len())];
        let dir = match literal.rfind('/') {
            Some(0) => "/",
            Some(i) => &literal[..i],
            None => "",
        };
        Ok((pattern, dir.to_string()))
    }

    /// The template with every placeholder replaced by `fill` (to check, when the template
    /// is configured, that its own text is a valid pattern).
    pub(crate) fn with_placeholders_as(&self, fill: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.as_str(),
                Part::Pointer(_) | Part::Key | Part::Last(_) => fill,
            })
            .collect()
    }

    /// Walk the parts, handing the template's own text to `literal` and each substituted
    /// value to `encode` (which appends it to the output or refuses it). `placeholder` is
    /// `key` or the pointer, for error messages. A `{last.*}` placeholder adds nothing; `last`
    /// is told where it stands in the output.
    fn render_with(
        &self,
        input: &Value,
        key: &[u8],
        literal: impl Fn(&str, &mut String),
        mut last: impl FnMut(LastField, usize),
        encode: impl Fn(&str, &str, &mut String) -> Result<(), RenderError>,
    ) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.text.len() + 16);
        for part in &self.parts {
            match part {
                Part::Literal(s) => literal(s, &mut out),
                Part::Key => {
                    let key = std::str::from_utf8(key).map_err(|_| RenderError::KeyNotUtf8)?;
                    encode("key", key, &mut out)?;
                }
                Part::Pointer(p) => {
                    let value = input
                        .pointer(p)
                        .ok_or_else(|| RenderError::Missing(p.clone()))?;
                    let number_or_bool;
                    let text = match value {
                        Value::String(s) => s.as_str(),
                        Value::Number(n) => {
                            number_or_bool = n.to_string();
                            &number_or_bool
                        }
                        Value::Bool(b) => {
                            if *b {
                                "true"
                            } else {
                                "false"
                            }
                        }
                        Value::Null => return Err(RenderError::NotScalar(p.clone(), "null")),
                        Value::Array(_) => {
                            return Err(RenderError::NotScalar(p.clone(), "an array"))
                        }
                        Value::Object(_) => {
                            return Err(RenderError::NotScalar(p.clone(), "an object"))
                        }
                    };
                    encode(p, text, &mut out)?;
                }
                // Filled at each poll by `render_last`; empty until then (the HTTP poller
                // allows them only in the query, where empty is just empty).
                Part::Last(field) => last(*field, out.len()),
            }
        }
        Ok(out)
    }
}

/// A substituted value must be one path segment: not empty, `.`, or longer than
/// [`NAME_MAX`], and without `/`, `..` or NUL (any could name another directory).
fn one_segment(placeholder: &str, value: &str) -> Result<(), RenderError> {
    let unsafe_because = if value.is_empty() {
        Some("it is empty")
    } else if value == "." {
        Some("it is `.`")
    } else if value.contains('/') {
        Some("it contains `/`")
    } else if value.contains("..") {
        Some("it contains `..`")
    } else if value.contains('\0') {
        Some("it contains NUL")
    } else if value.len() > NAME_MAX {
        Some("it is longer than 255 bytes, the longest file name (NAME_MAX)")
    } else {
        None
    };
    match unsafe_because {
        Some(reason) => Err(RenderError::NotOneSegment {
            placeholder: placeholder.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// For templates without `{last.*}` (path patterns refuse it at start).
fn no_last(_: LastField, _: usize) {}

fn push_literal(s: &str, out: &mut String) {
    out.push_str(s);
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template bound to an input, then filled with no last values, is what `render`
    /// makes of the same input; and it refuses what `render` refuses.
    #[test]
    fn bind_fills_the_input_as_render_does() {
        let t = Template::parse("http://h/u/{/id}?t={/t}&k={key}&since={last.time}&x=1").unwrap();
        let input = serde_json::json!({"id": "a b", "t": ""});
        let bound = t.bind(&input, b"k1").unwrap();
        assert_eq!(
            bound.render_last(|_| String::new()),
            t.render(&input, b"k1").unwrap()
        );
        assert_eq!(
            bound.render_last(|f| format!("<{}>", f.name())),
            "http://h/u/a%20b?t=&k=k1&since=%3Clast.time%3E&x=1"
        );
        let empty_path = serde_json::json!({"id": "", "t": "x"});
        assert!(t.bind(&empty_path, b"k1").is_err());
        assert!(t.render(&empty_path, b"k1").is_err());
    }
    use serde_json::json;

    fn t(s: &str) -> Template {
        Template::parse(s).unwrap()
    }

    #[test]
    fn fills_pointers_and_the_key() {
        let tpl = t("http://127.0.0.1:8080/users/{/id}/events?tenant={/org/name}&k={key}");
        let input = json!({"id": 42, "org": {"name": "acme"}});
        assert_eq!(
            tpl.render(&input, b"u-1").unwrap(),
            "http://127.0.0.1:8080/users/42/events?tenant=acme&k=u-1"
        );
        assert!(tpl.uses_input());
        assert!(!t("http://h/{key}").uses_input());
    }

    #[test]
    fn substituted_values_cannot_change_the_url_structure() {
        let tpl = t("http://127.0.0.1:8080/users/{/id}/events");
        for (evil, expected) in [
            ("../admin", "..%2Fadmin"),
            ("x?y=1#frag", "x%3Fy%3D1%23frag"),
            ("@evil.example:80", "%40evil.example%3A80"),
            ("a b/c%2F", "a%20b%2Fc%252F"),
            ("ü", "%C3%BC"),
        ] {
            let url = tpl.render(&json!({ "id": evil }), b"k").unwrap();
            assert_eq!(
                url,
                format!("http://127.0.0.1:8080/users/{expected}/events")
            );
        }
        let host = t("http://{key}.example/x");
        assert_eq!(
            host.render(&json!({}), b"a/b@c").unwrap(),
            "http://a%2Fb%40c.example/x"
        );
    }

    #[test]
    fn placeholders_in_the_scheme_or_authority_are_found() {
        use OriginPart::*;
        let found = |s: &str| t(s).origin_placeholders();
        assert_eq!(found("http://h:8080/{key}?a={/a}#{/f}"), []);
        assert_eq!(found("http://h?{key}"), []);
        assert_eq!(found("http://h\\{key}"), []);
        assert_eq!(found("http://{{h}}/{key}"), []);
        assert_eq!(found("http://{key}:8080/"), [("{key}".into(), Authority)]);
        assert_eq!(
            found("http://u:{/pw}@h-{/region}.example:{/port}/x/{/id}"),
            [
                ("{/pw}".into(), Authority),
                ("{/region}".into(), Authority),
                ("{/port}".into(), Authority)
            ]
        );
        assert_eq!(
            found("{/scheme}://{key}/"),
            [("{/scheme}".into(), Scheme), ("{key}".into(), Authority)]
        );
        assert_eq!(found("http{key}://h/"), [("{key}".into(), Scheme)]);
    }

    #[test]
    fn literal_braces_are_written_doubled() {
        assert_eq!(
            t("/a{{b}}/{key}").render(&json!({}), b"k").unwrap(),
            "/a{b}/k"
        );
    }

    #[test]
    fn bad_templates_name_the_problem_and_its_column() {
        let e = Template::parse("http://h/{id}").unwrap_err();
        assert!(e.message.contains("unknown placeholder `{id}`"), "{e}");
        assert_eq!(e.position, 9);
        assert!(e.to_string().contains("column 10"), "{e}");
        assert_eq!(
            Template::parse("http://h/{/id").unwrap_err().message,
            "unclosed `{`"
        );
        assert!(Template::parse("a}b")
            .unwrap_err()
            .message
            .contains("unmatched `}`"));
    }

    #[test]
    fn inputs_that_cannot_fill_the_template_say_why() {
        let tpl = t("/u/{/id}");
        assert_eq!(
            tpl.render(&json!({"name": "x"}), b"k"),
            Err(RenderError::Missing("/id".into()))
        );
        assert_eq!(
            tpl.render(&json!({"id": {"a": 1}}), b"k"),
            Err(RenderError::NotScalar("/id".into(), "an object"))
        );
        assert_eq!(
            t("/{key}").render(&json!({}), &[0xff]),
            Err(RenderError::KeyNotUtf8)
        );
    }

    #[test]
    fn glob_values_are_one_literal_segment() {
        let tpl = t("/data/{/tenant}/*.csv");
        assert_eq!(
            tpl.render_glob(&json!({"tenant": "acme"}), b"k").unwrap(),
            "/data/acme/*.csv"
        );
        // Metacharacters match only themselves.
        assert_eq!(
            tpl.render_glob(&json!({"tenant": "a*b?[c]"}), b"k")
                .unwrap(),
            "/data/a[*]b[?][[]c[]]/*.csv"
        );
        let pattern = tpl.render_glob(&json!({"tenant": "a*"}), b"k").unwrap();
        let p = glob::Pattern::new(&pattern).unwrap();
        assert!(p.matches("/data/a*/x.csv"));
        assert!(!p.matches("/data/ab/x.csv"));
        for (evil, why) in [
            ("../other", "`/`"),
            ("a/b", "`/`"),
            ("..", "`..`"),
            ("x..y", "`..`"),
            ("", "empty"),
            (".", "`.`"),
            ("a\0b", "NUL"),
        ] {
            let e = tpl
                .render_glob(&json!({ "tenant": evil }), b"k")
                .unwrap_err();
            assert!(e.to_string().contains(why), "{evil:?}: {e}");
            assert!(e.to_string().contains("`{/tenant}`"), "{e}");
        }
        let e = t("/data/{key}/*")
            .render_glob(&json!({}), b"a/b")
            .unwrap_err();
        assert!(e.to_string().starts_with("value for `{key}`"), "{e}");
    }

    #[test]
    fn glob_dir_is_the_literal_prefix_with_values_unescaped() {
        let dir = |tpl: &str, input: Value| {
            let (pattern, dir) = t(tpl).render_glob_dir(&input, b"k").unwrap();
            assert_eq!(pattern, t(tpl).render_glob(&input, b"k").unwrap());
            dir
        };
        let acme = json!({"tenant": "acme"});
        assert_eq!(dir("/data/{/tenant}/*.csv", acme.clone()), "/data/acme");
        assert_eq!(dir("/data/{/tenant}/x.csv", acme.clone()), "/data/acme");
        assert_eq!(dir("/data/{/tenant}/**/*.csv", acme.clone()), "/data/acme");
        assert_eq!(dir("/data/*/{/tenant}/x", acme.clone()), "/data");
        assert_eq!(dir("/data/{/tenant}-*/x", acme.clone()), "/data");
        assert_eq!(dir("/data/[ab]/x", acme.clone()), "/data");
        assert_eq!(dir("/*.csv", acme.clone()), "/");
        assert_eq!(dir("/out/{key}/part-?", acme), "/out/k");
        // A value's metacharacters are literal: they are part of the directory, unescaped.
        for tenant in ["a*", "a?", "*", "[x]"] {
            let input = json!({ "tenant": tenant });
            assert_eq!(
                dir("/data/{/tenant}/*.csv", input),
                format!("/data/{tenant}")
            );
        }
        // Values are checked as render_glob checks them.
        assert!(t("/data/{/tenant}/*")
            .render_glob_dir(&json!({"tenant": "../x"}), b"k")
            .is_err());
    }

    #[test]
    fn an_empty_value_in_a_url_path_is_refused() {
        // `/users/{/id}` with an empty id would poll `/users/`, the collection.
        for tpl in [
            "http://h/users/{/id}",
            "http://h/users/{/id}/events",
            "http://h/users/x{/id}",
        ] {
            let e = t(tpl).render(&json!({"id": ""}), b"k").unwrap_err();
            assert!(e.to_string().contains("`{/id}`"), "{tpl}: {e}");
            assert!(e.to_string().contains("empty"), "{tpl}: {e}");
        }
        let e = t("http://h/users/{key}")
            .render(&json!({}), b"")
            .unwrap_err();
        assert!(e.to_string().contains("`{key}`"), "{e}");
        // In the query or the fragment an empty value is just an empty value.
        assert_eq!(
            t("http://h/u?tenant={/t}#{/f}")
                .render(&json!({"t": "", "f": ""}), b"k")
                .unwrap(),
            "http://h/u?tenant=#"
        );
    }

    #[test]
    fn integers_are_substituted_exactly() {
        let input: Value = serde_json::from_str(
            r#"{"id": 12345678901234567890123, "neg": -98765432109876543210, "x": 1.50}"#,
        )
        .unwrap();
        assert_eq!(
            t("http://h/u/{/id}/{/neg}/{/x}")
                .render(&input, b"k")
                .unwrap(),
            "http://h/u/12345678901234567890123/-98765432109876543210/1.50"
        );
        assert_eq!(
            t("/d/{/id}/*").render_glob(&input, b"k").unwrap(),
            "/d/12345678901234567890123/*"
        );
    }

    #[test]
    fn glob_values_longer_than_a_file_name_are_refused() {
        let tpl = t("/data/{/tenant}/*.csv");
        let ok = "a".repeat(NAME_MAX);
        assert!(tpl.render_glob(&json!({ "tenant": ok }), b"k").is_ok());
        let long = "a".repeat(NAME_MAX + 1);
        let e = tpl
            .render_glob(&json!({ "tenant": long }), b"k")
            .unwrap_err();
        assert!(e.to_string().contains("longer than 255 bytes"), "{e}");
    }

    #[test]
    fn placeholders_can_be_filled_with_a_sample() {
        assert_eq!(
            t("/data/{/tenant}/{key}-*.csv").with_placeholders_as("x"),
            "/data/x/x-*.csv"
        );
    }
}

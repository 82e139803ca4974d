//! The text form of [`Termination`], both ways.
//!
//! ```text
//! condition := "never"
//!            | "total" "(" duration ")"      duration: humantime, e.g. 500ms, 5m, 1h 30m
//!            | "stable" "(" duration ")"
//!            | "polls" "(" integer ")"        integer >= 1
//!            | "any" "(" condition ("," condition)* ")"
//!            | "all" "(" condition ("," condition)* ")"
//! ```
//!
//! Names are lowercase; whitespace may appear between any two tokens. Nesting is limited to
//! [`MAX_DEPTH`] levels so a hostile or mistaken value cannot overflow the stack.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::Termination;

/// How deeply conditions may nest (a bare leaf is depth 1).
pub const MAX_DEPTH: usize = 32;

const EXPECTED: &str = "expected never, total, stable, polls, any, all";

/// A termination condition that does not parse, pointing at the offending token.
///
/// Displays as the message, then the input, then a caret line under the bad token, so it
/// can be printed as-is when the bridge refuses its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(self))]
pub struct ParseError {
    /// What is wrong.
    pub message: String,
    /// Byte offset of the bad token in `input` (`input.len()` for "end of input").
    pub position: usize,
    /// Byte length of the bad token (0 at end of input).
    pub len: usize,
    /// The text as given.
    pub input: String,
}

impl ParseError {
    /// 1-based column, in characters, of the bad token.
    pub fn column(&self) -> usize {
        self.input
            .get(..self.position)
            .map_or(self.position, |s| s.chars().count())
            + 1
    }
}

fn render(e: &ParseError) -> String {
    // Whitespace controls are shown as spaces so the caret line stays aligned with the input
    // (a multi-line environment variable would otherwise break it).
    let shown: String = e
        .input
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let carets = e
        .input
        .get(e.position..e.position.saturating_add(e.len))
        .map_or(1, |s| s.chars().count())
        .max(1);
    format!(
        "{} at column {}\n  {}\n  {}{}",
        e.message,
        e.column(),
        shown,
        " ".repeat(e.column() - 1),
        "^".repeat(carets)
    )
}

pub(super) fn parse(text: &str) -> Result<Termination, ParseError> {
    let mut p = Parser { src: text, pos: 0 };
    p.skip_ws();
    if p.at_end() {
        return Err(p.error(
            p.pos,
            0,
            format!("empty termination condition ({EXPECTED})"),
        ));
    }
    let t = p.condition(1)?;
    p.skip_ws();
    if !p.at_end() {
        let start = p.pos;
        let rest = text[start..].trim_end();
        let hint = if rest.starts_with(',') {
            " (combine conditions with any(...) or all(...))"
        } else {
            ""
        };
        return Err(p.error(
            start,
            rest.len(),
            format!("unexpected `{rest}` after a complete condition{hint}"),
        ));
    }
    Ok(t)
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn error(&self, position: usize, len: usize, message: String) -> ParseError {
        ParseError {
            message,
            position,
            len,
            input: self.src.to_owned(),
        }
    }

    /// The span of the token at `at`: a word, a single character, or nothing at the end.
    fn token_at(&self, at: usize) -> (usize, &'a str) {
        let rest: &'a str = &self.src[at..];
        let word = rest.bytes().take_while(|&b| is_word(b)).count();
        let len = match rest.chars().next() {
            None => 0,
            Some(_) if word > 0 => word,
            Some(c) => c.len_utf8(),
        };
        (len, &rest[..len])
    }

    /// "found `x`" / "found end of input" for the token at the cursor, as an error.
    fn unexpected(&self, what: &str) -> ParseError {
        let (len, tok) = self.token_at(self.pos);
        let found = if len == 0 {
            "end of input".to_owned()
        } else {
            format!("`{tok}`")
        };
        self.error(self.pos, len, format!("{what}, found {found}"))
    }

    fn condition(&mut self, depth: usize) -> Result<Termination, ParseError> {
        self.skip_ws();
        let start = self.pos;
        let (len, name) = self.token_at(start);
        if len == 0 || !is_word(self.src.as_bytes()[start]) {
            return Err(self.unexpected(&format!("expected a condition ({EXPECTED})")));
        }
        if depth > MAX_DEPTH {
            return Err(self.error(
                start,
                len,
                format!("conditions nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        self.pos += len;
        match name {
            "never" => {
                self.skip_ws();
                if self.peek() == Some(b'(') {
                    let open = self.pos;
                    let end = self.matching_paren(open);
                    return Err(self.error(
                        open,
                        end - open,
                        "`never` takes no arguments (write just `never`)".to_owned(),
                    ));
                }
                Ok(Termination::Never)
            }
            "total" | "stable" => {
                self.open(name)?;
                let (at, arg) = self.argument();
                if arg.is_empty() {
                    return Err(
                        self.unexpected(&format!("`{name}` needs a duration such as `{name}(5m)`"))
                    );
                }
                let d = self.duration(at, arg)?;
                self.close(name)?;
                Ok(if name == "total" {
                    Termination::Total(d)
                } else {
                    Termination::Stable(d)
                })
            }
            "polls" => {
                self.open(name)?;
                let (at, arg) = self.argument();
                if arg.is_empty() {
                    return Err(self.unexpected("`polls` needs a count such as `polls(10)`"));
                }
                let n = self.count(at, arg)?;
                self.close(name)?;
                Ok(Termination::Polls(n))
            }
            "any" | "all" => {
                self.open(name)?;
                self.skip_ws();
                if self.peek() == Some(b')') {
                    self.pos += 1;
                    return Err(self.error(
                        start,
                        self.pos - start,
                        format!("`{name}()` needs at least one condition"),
                    ));
                }
                let mut children = Vec::new();
                loop {
                    children.push(self.condition(depth + 1)?);
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b')') => {
                            self.pos += 1;
                            break;
                        }
                        _ => {
                            return Err(
                                self.unexpected(&format!("expected `,` or `)` in `{name}(...)`"))
                            )
                        }
                    }
                }
                Ok(if name == "any" {
                    Termination::Any(children)
                } else {
                    Termination::All(children)
                })
            }
            _ => {
                let hint = match name.to_ascii_lowercase().as_str() {
                    lower @ ("never" | "total" | "stable" | "polls" | "any" | "all") => {
                        format!("; names are lowercase: `{lower}`")
                    }
                    _ => String::new(),
                };
                Err(self.error(
                    start,
                    len,
                    format!("unknown condition `{name}` ({EXPECTED}{hint})"),
                ))
            }
        }
    }

    fn open(&mut self, name: &str) -> Result<(), ParseError> {
        self.skip_ws();
        if self.peek() == Some(b'(') {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("expected `(` after `{name}`")))
        }
    }

    fn close(&mut self, name: &str) -> Result<(), ParseError> {
        self.skip_ws();
        if self.peek() == Some(b')') {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("expected `)` to close `{name}(`")))
        }
    }

    /// A leaf's argument: the text up to the next delimiter, trimmed, with its offset. The
    /// cursor is left after the trimmed text.
    fn argument(&mut self) -> (usize, &'a str) {
        self.skip_ws();
        let start = self.pos;
        let len = self.src.as_bytes()[start..]
            .iter()
            .take_while(|&&b| !matches!(b, b'(' | b')' | b','))
            .count();
        let src: &'a str = self.src;
        let arg = src[start..start + len].trim_end();
        self.pos = start + arg.len();
        (start, arg)
    }

    /// End (exclusive) of the parenthesised group opening at `open`, or the end of input.
    fn matching_paren(&self, open: usize) -> usize {
        let mut depth = 0usize;
        for (i, b) in self.src.bytes().enumerate().skip(open) {
            match b {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
        }
        self.src.len()
    }

    fn duration(&self, at: usize, arg: &str) -> Result<Duration, ParseError> {
        use humantime::DurationError as E;
        let err = match humantime::parse_duration(arg) {
            Ok(d) => return Ok(d),
            Err(e) => e,
        };
        // Narrow the caret to the part humantime complains about when it says which.
        let (pos, len, reason) = match &err {
            E::UnknownUnit { start, end, .. } if end > start && arg.get(*start..*end).is_some() => {
                (at + start, end - start, err.to_string())
            }
            E::InvalidCharacter(off) | E::NumberExpected(off) if arg.get(*off..).is_some() => {
                let what = if matches!(err, E::InvalidCharacter(_)) {
                    "invalid character"
                } else {
                    "expected a number"
                };
                let (len, tok) = self.token_at(at + off);
                // A word or one character; it cannot run past `arg`, which ends at a
                // delimiter, whitespace or the end of input.
                let found = if len > 0 {
                    format!("`{tok}`")
                } else {
                    "the end".to_owned()
                };
                (at + off, len, format!("{what} at {found}"))
            }
            _ => (at, arg.len(), err.to_string()),
        };
        Err(self.error(pos, len, format!("invalid duration `{arg}`: {reason}")))
    }

    fn count(&self, at: usize, arg: &str) -> Result<u64, ParseError> {
        let bad = |message: String| Err(self.error(at, arg.len(), message));
        if !arg.bytes().all(|b| b.is_ascii_digit()) {
            return bad(format!(
                "`polls` takes a whole number of polls >= 1, found `{arg}`"
            ));
        }
        match arg.parse::<u64>() {
            Ok(0) => bad("`polls(0)` would stop before the first poll; n must be >= 1".to_owned()),
            Ok(n) => Ok(n),
            Err(_) => bad(format!(
                "`polls({arg})` is too large (at most {})",
                u64::MAX
            )),
        }
    }
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl FromStr for Termination {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        parse(s)
    }
}

/// The text form, which [`Termination::parse`] reads back. Custom conditions display as
/// their name, and empty `any()`/`all()` as such; neither parses.
impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, name: &str, cs: &[Termination]| {
            write!(f, "{name}(")?;
            for (i, c) in cs.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{c}")?;
            }
            f.write_str(")")
        };
        match self {
            Termination::Never => f.write_str("never"),
            Termination::Total(d) => write!(f, "total({})", humantime::format_duration(*d)),
            Termination::Stable(d) => write!(f, "stable({})", humantime::format_duration(*d)),
            Termination::Polls(n) => write!(f, "polls({n})"),
            Termination::Any(cs) => list(f, "any", cs),
            Termination::All(cs) => list(f, "all", cs),
            Termination::Custom(c) => f.write_str(c.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> Termination {
        match Termination::parse(s) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    fn err(s: &str) -> ParseError {
        match Termination::parse(s) {
            Ok(t) => panic!("{s:?} parsed as {t:?}"),
            Err(e) => e,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn each_form_parses_to_its_value() {
        use Termination::*;
        assert_eq!(ok("never"), Never);
        assert_eq!(ok("total(5m)"), Total(secs(300)));
        assert_eq!(ok("total(500ms)"), Total(Duration::from_millis(500)));
        assert_eq!(ok("stable(1m30s)"), Stable(secs(90)));
        assert_eq!(ok("stable(1h 30m)"), Stable(secs(5_400)));
        assert_eq!(ok("total(0s)"), Total(Duration::ZERO));
        assert_eq!(ok("polls(10)"), Polls(10));
        assert_eq!(
            ok("any(total(5m), stable(1m))"),
            Any(vec![Total(secs(300)), Stable(secs(60))])
        );
        assert_eq!(ok("all(polls(3))"), All(vec![Polls(3)]));
        assert_eq!(
            ok(" \tany ( all( never ,polls( 2 ) ) ,\n  stable ( 1h 30m ) ) \n"),
            Any(vec![All(vec![Never, Polls(2)]), Stable(secs(5_400))])
        );
        assert_eq!("polls(3)".parse::<Termination>(), Ok(Polls(3)));
    }

    #[test]
    fn display_is_the_text_form() {
        let t = ok("any( stable(1m30s), all(polls(3),never), total(1500ms) )");
        assert_eq!(
            t.to_string(),
            "any(stable(1m 30s), all(polls(3), never), total(1s 500ms))"
        );
        assert_eq!(ok(&t.to_string()), t);
    }

    #[test]
    fn error_display_points_at_the_bad_token() {
        let e = err("any(total(5m), stabel(1m))");
        assert_eq!(
            e.to_string(),
            "unknown condition `stabel` (expected never, total, stable, polls, any, all) \
             at column 16\n  any(total(5m), stabel(1m))\n                 ^^^^^^"
        );
        // At the end of input there is still one caret, just past the text.
        let e = err("total(5m");
        assert!(e.to_string().ends_with("\n  total(5m\n          ^"), "{e}");
        // Line breaks in the input are shown as spaces so the caret stays aligned.
        let e = err("any(\n  stabel(1m))");
        assert!(
            e.to_string()
                .ends_with("\n  any(   stabel(1m))\n         ^^^^^^"),
            "{e}"
        );
        // Columns count characters, not bytes.
        let e = err("total(5m) é");
        assert_eq!((e.position, e.len, e.column()), (10, 2, 11));
        assert!(
            e.to_string().ends_with("\n  total(5m) é\n            ^"),
            "{e}"
        );
    }

    /// Each bad input: where the error points (byte offset, byte length) and part of what
    /// it says.
    #[test]
    fn errors_point_at_the_bad_token() {
        let cases: &[(&str, usize, usize, &str)] = &[
            // unknown names
            (
                "any(total(5m), stabel(1m))",
                15,
                6,
                "unknown condition `stabel`",
            ),
            ("Total(5m)", 0, 5, "names are lowercase: `total`"),
            (
                "forever",
                0,
                7,
                "expected never, total, stable, polls, any, all",
            ),
            ("(total(5m))", 0, 1, "expected a condition"),
            ("any(,)", 4, 1, "expected a condition (expected never"),
            ("any(total(5m),)", 14, 1, "expected a condition"),
            ("any(total(5m), )", 15, 1, "found `)`"),
            // missing parentheses
            ("total 5m", 6, 2, "expected `(` after `total`, found `5m`"),
            (
                "total",
                5,
                0,
                "expected `(` after `total`, found end of input",
            ),
            ("any", 3, 0, "expected `(` after `any`"),
            (
                "total(5m",
                8,
                0,
                "expected `)` to close `total(`, found end of input",
            ),
            (
                "total(5m, 1s)",
                8,
                1,
                "expected `)` to close `total(`, found `,`",
            ),
            (
                "stable(1m(",
                9,
                1,
                "expected `)` to close `stable(`, found `(`",
            ),
            ("polls(3", 7, 0, "expected `)` to close `polls(`"),
            (
                "any(total(5m) stable(1m))",
                14,
                6,
                "expected `,` or `)` in `any(...)`",
            ),
            ("all(total(5m)", 13, 0, "found end of input"),
            // bad durations, with humantime's reason
            (
                "total(5x)",
                7,
                1,
                "invalid duration `5x`: unknown time unit \"x\"",
            ),
            ("total(5 parsecs)", 8, 7, "unknown time unit \"parsecs\""),
            ("total(5)", 6, 1, "invalid duration `5`: time unit needed"),
            (
                "stable(5m!)",
                9,
                1,
                "invalid duration `5m!`: invalid character at `!`",
            ),
            (
                "stable(m)",
                7,
                1,
                "invalid duration `m`: expected a number at `m`",
            ),
            ("total(99999999999999999999y)", 6, 21, "number is too large"),
            (
                "total()",
                6,
                1,
                "`total` needs a duration such as `total(5m)`, found `)`",
            ),
            ("stable(  )", 9, 1, "`stable` needs a duration"),
            // polls
            ("polls(0)", 6, 1, "n must be >= 1"),
            (
                "polls(1.5)",
                6,
                3,
                "whole number of polls >= 1, found `1.5`",
            ),
            ("polls(-1)", 6, 2, "whole number"),
            ("polls( ten )", 7, 3, "found `ten`"),
            ("polls(99999999999999999999)", 6, 20, "too large"),
            ("polls()", 6, 1, "`polls` needs a count"),
            // empty lists
            ("any()", 0, 5, "`any()` needs at least one condition"),
            ("all( )", 0, 6, "`all()` needs at least one condition"),
            ("any(all())", 4, 5, "`all()` needs at least one condition"),
            // trailing garbage
            (
                "total(5m) x",
                10,
                1,
                "unexpected `x` after a complete condition",
            ),
            ("total(5m))", 9, 1, "unexpected `)`"),
            (
                "total(5m), stable(1m) ",
                9,
                12,
                "combine conditions with any(...) or all(...)",
            ),
            ("never never", 6, 5, "unexpected `never`"),
            // empty input
            ("", 0, 0, "empty termination condition"),
            ("  \n", 3, 0, "empty termination condition"),
            // never takes no arguments
            ("never()", 5, 2, "`never` takes no arguments"),
            ("never(5m)", 5, 4, "`never` takes no arguments"),
            (
                "any(never (1, (2)), total(1s))",
                10,
                8,
                "`never` takes no arguments",
            ),
            ("never(", 5, 1, "`never` takes no arguments"),
        ];
        for &(input, position, len, fragment) in cases {
            let e = err(input);
            assert_eq!((e.position, e.len), (position, len), "{input:?}: {e}");
            assert!(e.message.contains(fragment), "{input:?}: {e}");
            assert_eq!(e.input, input);
        }
    }

    #[test]
    fn nesting_is_limited() {
        let nest = |levels: usize| format!("{}never{}", "any(".repeat(levels), ")".repeat(levels));
        // 31 levels of `any` plus the leaf is the deepest allowed.
        assert!(Termination::parse(&nest(MAX_DEPTH - 1)).is_ok());
        let e = err(&nest(MAX_DEPTH));
        assert_eq!((e.position, e.len), (4 * MAX_DEPTH, 5), "{e}");
        assert!(e.message.contains("nested more than 32 levels deep"), "{e}");
        // Far deeper input fails the same way instead of overflowing the stack.
        let e = err(&nest(100_000));
        assert_eq!(e.position, 4 * MAX_DEPTH);
    }

    /// Inputs assembled from grammar fragments reach the parser's deeper paths more often
    /// than arbitrary text.
    fn token_soup() -> impl Strategy<Value = String> {
        let token = prop::sample::select(vec![
            "never", "total", "stable", "polls", "any", "all", "(", ")", ",", " ", "5m", "0", "3",
            "1h 30m", "x", "é", "\n", "ms",
        ]);
        prop::collection::vec(token, 0..24).prop_map(|ts| ts.concat())
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_errors_stay_in_bounds(
            s in prop_oneof![any::<String>(), token_soup()]
        ) {
            match Termination::parse(&s) {
                Ok(t) => prop_assert_eq!(ok(&t.to_string()), t),
                Err(e) => {
                    prop_assert!(e.position + e.len <= s.len(), "{e:?}");
                    prop_assert!(s.is_char_boundary(e.position), "{e:?}");
                    prop_assert!(s.is_char_boundary(e.position + e.len), "{e:?}");
                    prop_assert!(!e.message.is_empty());
                    let _ = e.to_string();
                }
            }
        }
    }
}

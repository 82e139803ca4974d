//! Reading JSON text that is already checked: a page's items, once the walk of the whole
//! page ([`super::raw::at_each_checked`]) has read every byte of it as JSON.
//!
//! Checked text needs no parser to be split: where a value ends is its closing quote (the
//! first not escaped) or bracket (at its own depth, outside strings), or the next comma,
//! bracket or blank after a number or word. So a page's items, each with its members (its
//! key and time found among them), are split in one pass that jumps through strings with
//! `memchr` ([`elements_at`]). Through serde (a `Vec<&RawValue>` split, then a walk per
//! item that read each member's name and skipped or captured its value) this took ~10% of
//! the bridge's CPU in `vs_python`'s steady state, ~6.6% now. Text that is not valid JSON
//! gives `None` or nonsense, never a panic: only a page's checked items come here.

use super::raw::unescape;

/// The index just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        // A number, `true`, `false` or `null`.
        _ => Some(
            b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .map_or(b.len(), |n| i + n),
        ),
    }
}

/// The index just past the string whose opening quote is at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        j += memchr::memchr2(b'"', b'\\', b.get(j..)?)?;
        if b[j] == b'"' {
            return Some(j + 1);
        }
        // An escape: the next character is not the end, whatever it is.
        j += 2;
    }
}

fn skip_blanks(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The members of the object whose `{` is at `i` in `text` (each name between its quotes,
/// escapes as written, and its value) into `members`; the index just past the object.
fn object_at<'a>(text: &'a str, i: usize, members: &mut Vec<(&'a str, &'a str)>) -> Option<usize> {
    let b = text.as_bytes();
    members.clear();
    let mut i = skip_blanks(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        let end = string_end(b, i)?;
        let name = text.get(i + 1..end - 1)?;
        i = skip_blanks(b, end);
        (b.get(i) == Some(&b':')).then_some(())?;
        i = skip_blanks(b, i + 1);
        let end = value_end(b, i)?;
        members.push((name, text.get(i..end)?));
        i = skip_blanks(b, end);
        match b.get(i)? {
            b',' => i = skip_blanks(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Each element of the array `text` as `(start, end)` to `each`, which may also take the
/// element's end itself (an object it split: `Some(end)`); `None` if `text` is not an array.
fn each_element(text: &str, mut each: impl FnMut(usize) -> Option<usize>) -> Option<()> {
    let b = text.as_bytes();
    let mut i = skip_blanks(b, 0);
    (b.get(i) == Some(&b'[')).then_some(())?;
    i = skip_blanks(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(());
    }
    loop {
        i = skip_blanks(b, each(i)?);
        match b.get(i)? {
            b',' => i = skip_blanks(b, i + 1),
            b']' => return Some(()),
            _ => return None,
        }
    }
}

/// The elements of the array `text`, each as written, or `None` if it is not an array.
pub fn elements(text: &str) -> Option<Vec<&str>> {
    let mut found = Vec::new();
    each_element(text, |i| {
        let end = value_end(text.as_bytes(), i)?;
        found.push(text.get(i..end)?);
        Some(end)
    })?;
    Some(found)
}

/// An array's element as written, and the text at each of the pointers asked for in it.
pub type Element<'a, const N: usize> = (&'a str, [Option<&'a str>; N]);

/// The elements of the array `text`, each as written and with the text at each of
/// `pointers` in it (as [`at_each`]), or `None` if `text` is not an array. An object
/// element is read once, for its end and its members together.
pub fn elements_at<'a, const N: usize>(
    text: &'a str,
    pointers: [Option<&str>; N],
) -> Option<Vec<Element<'a, N>>> {
    let mut found = Vec::new();
    let mut members = Vec::new();
    each_element(text, |i| {
        if text.as_bytes()[i] == b'{' {
            let end = object_at(text, i, &mut members)?;
            let element = text.get(i..end)?;
            found.push((element, pointers.map(|p| at_pointer(element, &members, p?))));
            Some(end)
        } else {
            let end = value_end(text.as_bytes(), i)?;
            let element = text.get(i..end)?;
            found.push((element, at_each(element, pointers)));
            Some(end)
        }
    })?;
    Some(found)
}

/// The text at each of `pointers` (RFC 6901; `""` is the whole of `text`) in the value
/// `text`, as `Value::pointer` finds it (of a name that comes twice, the last), or `None`
/// where nothing is or the pointer is `None`.
pub fn at_each<'a, const N: usize>(
    text: &'a str,
    pointers: [Option<&str>; N],
) -> [Option<&'a str>; N] {
    let text = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
    let mut members = Vec::new();
    let is_object = text.starts_with('{') && object_at(text, 0, &mut members).is_some();
    pointers.map(|pointer| {
        let pointer = pointer?;
        if is_object {
            at_pointer(text, &members, pointer)
        } else if pointer.is_empty() {
            Some(text)
        } else {
            let mut here = text;
            for token in pointer.strip_prefix('/')?.split('/') {
                here = at_token(here, token)?;
            }
            Some(here)
        }
    })
}

/// The text at `pointer` in the object `text`, whose `members` are split already.
fn at_pointer<'a>(text: &'a str, members: &[(&'a str, &'a str)], pointer: &str) -> Option<&'a str> {
    if pointer.is_empty() {
        return Some(text);
    }
    let mut tokens = pointer.strip_prefix('/')?.split('/');
    let token = unescape(tokens.next()?);
    let mut here = members
        .iter()
        .rev()
        .find(|(name, _)| same_name(name, &token))
        .map(|(_, v)| *v)?;
    for token in tokens {
        here = at_token(here, token)?;
    }
    Some(here)
}

/// The value under `token` (unescaped as RFC 6901 says) in the value `text`: an object's
/// member so named (the last one), or an array's element so numbered (digits only, no
/// leading zero but `0` itself, as `Value::pointer`).
fn at_token<'a>(text: &'a str, token: &str) -> Option<&'a str> {
    let token = unescape(token);
    match text.as_bytes().first()? {
        b'{' => {
            let mut members = Vec::new();
            object_at(text, 0, &mut members)?;
            members
                .iter()
                .rev()
                .find(|(name, _)| same_name(name, &token))
                .map(|(_, v)| *v)
        }
        b'[' => {
            let digits = token.bytes().all(|b| b.is_ascii_digit());
            if !digits || token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
                return None;
            }
            elements(text)?.get(token.parse::<usize>().ok()?).copied()
        }
        _ => None,
    }
}

/// Whether a member name as written (between its quotes) is `wanted` once unescaped.
fn same_name(written: &str, wanted: &str) -> bool {
    if !written.contains('\\') {
        return written == wanted;
    }
    serde_json::from_str::<String>(&format!("\"{written}\"")).is_ok_and(|n| n == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use serde_json::Value;

    /// Checked texts with what makes splitting hard: quotes, backslashes, commas and
    /// brackets in strings, escapes before a quote, blanks everywhere, non-ASCII text.
    const ARRAYS: [&str; 9] = [
        "[]",
        " [ ] ",
        "[1]",
        r#"[1, "a", null, true, -2.5e3, {}, [], 0]"#,
        r#"[{"id": "a,b]", "p": "x\"y"}, {"id": "}{", "q": [1, [2, {"r": ","}]]}]"#,
        r#"["\\", "\\\"", "a\\", "\"]\"", "\u005d,"]"#,
        "[\n\t{\"a\": 1}\r\n ,\n [ \"b\" ] ,false]",
        r#"[{"id": "café ☕", "t": 1700000000123}, "ünï,cödé"]"#,
        r#"[{"a~b": 1, "c/d": 2, "e\"f": 3, "g\\h": 4, "\u0069": 5, "i": 6, "": 7}]"#,
    ];

    /// An array's elements are what serde splits it into, text for text; what is not an
    /// array has none.
    #[test]
    fn elements_are_what_serde_splits_an_array_into() {
        for text in ARRAYS {
            let by_serde: Vec<&RawValue> = serde_json::from_str(text).unwrap();
            let by_serde: Vec<&str> = by_serde.iter().map(|e| e.get()).collect();
            assert_eq!(elements(text), Some(by_serde), "{text}");
        }
        for text in ["{}", r#"{"a": [1]}"#, "1", r#""[1]""#, "null"] {
            assert_eq!(elements(text), None, "{text}");
        }
    }

    /// Every pointer finds the value `Value::pointer` finds, in the same text.
    #[test]
    fn pointers_find_what_value_pointer_finds() {
        let doc = r#" {"a": {"b~c": [10, {"d/e": "x"}, null]}, "n": 1.50, "n": 2,
            "s": "q\"]}", "e\"f": true, "": {"": 0}, "g\\h": [[], {}], "\u0069": 5,
            "00": "zz", "arr": [{"k": 1}, {"k": 2}]} "#;
        let pointers = [
            "",
            "/a",
            "/a/b~0c",
            "/a/b~0c/0",
            "/a/b~0c/1/d~1e",
            "/a/b~0c/2",
            "/a/b~0c/3",
            "/a/b~0c/01",
            "/a/b~0c/-",
            "/a/x",
            "/n",
            "/s",
            "/e\"f",
            "/",
            "//",
            "/g\\h",
            "/g\\h/0",
            "/g\\h/1",
            "/i",
            "/00",
            "/arr/1/k",
            "/arr/1/k/0",
            "/s/0",
            "/n/0",
            "/missing",
        ];
        let value: Value = serde_json::from_str(doc).unwrap();
        for pointer in pointers {
            let [found] = at_each(doc, [Some(pointer)]);
            let found: Option<Value> = found.map(|t| serde_json::from_str(t).unwrap());
            assert_eq!(found.as_ref(), value.pointer(pointer), "{pointer}");
        }
        for text in ARRAYS {
            let value: Value = serde_json::from_str(text).unwrap();
            for pointer in [
                "/0",
                "/1",
                "/0/id",
                "/0/q/1/1/r",
                "/0/a~0b",
                "/0/c~1d",
                "/0/i",
            ] {
                let [found] = at_each(text, [Some(pointer)]);
                let found: Option<Value> = found.map(|t| serde_json::from_str(t).unwrap());
                assert_eq!(found.as_ref(), value.pointer(pointer), "{text} {pointer}");
            }
        }
        // Each element of an array with its pointers, in one pass: as above, element by
        // element.
        for text in ARRAYS {
            let values: Vec<Value> = serde_json::from_str(text).unwrap();
            let pointers = [Some("/id"), Some("/q/1/1/r"), Some("/i"), Some(""), None];
            let found = elements_at(text, pointers).unwrap();
            assert_eq!(found.len(), values.len(), "{text}");
            for ((element, at), value) in found.iter().zip(&values) {
                assert_eq!(serde_json::from_str::<Value>(element).unwrap(), *value);
                for (pointer, at) in pointers.iter().zip(at) {
                    let at: Option<Value> = at.map(|t| serde_json::from_str(t).unwrap());
                    let want = pointer.and_then(|p| value.pointer(p));
                    assert_eq!(at.as_ref(), want, "{text} {pointer:?}");
                }
            }
        }
        assert!(elements_at(r#"{"a": 1}"#, [Some("/a")]).is_none());
        let [a, none, n] = at_each(doc, [Some("/a/b~0c/0"), None, Some("/n")]);
        assert_eq!((a, none, n), (Some("10"), None, Some("2")));
        assert_eq!(at_each("7", [Some("/0"), Some("")]), [None, Some("7")]);
    }
}

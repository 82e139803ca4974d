//! Reading a response by JSON pointer without building its tree.
//!
//! A page used to be parsed into a `serde_json::Value` (every item a tree of maps and
//! strings) and each item then written back out as its output's value: together a third of
//! the bridge's CPU in `vs_python`'s steady state. Here each pointer walks the raw text
//! one level at a time: the members it does not follow are skipped unallocated
//! ([`IgnoredAny`]), and only the value at its end (a key, a time, a flag) is read. The
//! walk of a whole page's top level is also its check as JSON ([`at_each_checked`]), so a
//! page is read once for that and for its fields. The items found are then read as checked
//! text (`checked.rs`). An item's output value is its own text, as the response wrote it.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// The raw value at `pointer` (RFC 6901: `""` is the whole value) in `raw`, or `None`
/// where nothing is (as `Value::pointer` answers).
pub fn at<'a>(raw: &'a RawValue, pointer: &str) -> Option<&'a RawValue> {
    let [found] = at_each(raw, [Some(pointer)]);
    found
}

/// [`at`] for several pointers, with one walk through `raw`'s top level for all of them
/// (a page's items, watermark, flag and next link; an item's key and time). A `None`
/// pointer finds nothing.
pub fn at_each<'a, const N: usize>(
    raw: &'a RawValue,
    pointers: [Option<&str>; N],
) -> [Option<&'a RawValue>; N] {
    let mut found = walk(raw.get(), pointers, false).unwrap_or([None; N]);
    for (i, pointer) in pointers.iter().enumerate() {
        if *pointer == Some("") {
            found[i] = Some(raw);
        }
    }
    found
}

/// [`at_each`] in a whole response's text, which the same walk checks is one JSON value
/// (every byte is read once: the members no pointer follows are checked as they are
/// skipped), so that a page is read once rather than checked first and walked after.
pub fn at_each_checked<'a, const N: usize>(
    text: &'a str,
    pointers: [Option<&str>; N],
) -> Result<[Option<&'a RawValue>; N], serde_json::Error> {
    if pointers.contains(&Some("")) {
        // A pointer to the whole document needs it as one raw value: checked by that.
        let doc: &RawValue = serde_json::from_str(text)?;
        return Ok(at_each(doc, pointers));
    }
    walk(text, pointers, true)
}

/// The walk of [`at_each`]: the top level of `text` once for every pointer's first token,
/// then each found member down the rest of its pointer. `whole`: walk (and so check) all
/// of `text`, to its end, even when no pointer has a first token.
fn walk<'a, const N: usize>(
    text: &'a str,
    pointers: [Option<&str>; N],
    whole: bool,
) -> Result<[Option<&'a RawValue>; N], serde_json::Error> {
    let mut firsts: [Option<Cow<'_, str>>; N] = std::array::from_fn(|_| None);
    let mut rests: [Option<&str>; N] = [None; N];
    for (i, pointer) in pointers.iter().enumerate() {
        let Some(path) = pointer.and_then(|p| p.strip_prefix('/')) else {
            continue;
        };
        let (first, rest) = path
            .split_once('/')
            .map_or((path, None), |(f, r)| (f, Some(r)));
        firsts[i] = Some(unescape(first));
        rests[i] = rest;
    }
    if !whole && firsts.iter().all(Option::is_none) {
        return Ok([None; N]);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let members = Step(&firsts).deserialize(&mut de)?;
    if whole {
        de.end()?;
    }
    let mut found: [Option<&'a RawValue>; N] = [None; N];
    for i in 0..N {
        if firsts[i].is_none() {
            continue;
        }
        found[i] = members[i].and_then(|member| {
            let mut here = member;
            for token in rests[i].into_iter().flat_map(|rest| rest.split('/')) {
                let token = [Some(unescape(token))];
                let mut de = serde_json::Deserializer::from_str(here.get());
                here = Step(&token).deserialize(&mut de).ok()?[0]?;
            }
            Some(here)
        });
    }
    Ok(found)
}

/// A pointer token as RFC 6901 unescapes it (`~1` is `/`, `~0` is `~`).
pub(super) fn unescape(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// A raw value parsed (a key, a time, a flag: small).
pub fn parse(raw: Option<&RawValue>) -> Option<Value> {
    serde_json::from_str(raw?.get()).ok()
}

/// One pointer step for several pointers at once: for each name, the member so named of an
/// object (the last one, if the name comes twice, as `Value` keeps), or the element so
/// numbered of an array; `None` names are not looked for.
struct Step<'t, 'n, const N: usize>(&'t [Option<Cow<'n, str>>; N]);

impl<'de, const N: usize> DeserializeSeed<'de> for Step<'_, '_, N> {
    type Value = [Option<&'de RawValue>; N];

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for Step<'_, '_, N> {
    type Value = [Option<&'de RawValue>; N];

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = [None; N];
        while let Some(Name(name)) = map.next_key()? {
            let wanted = || self.0.iter().map(|t| t.as_deref() == Some(&*name));
            if wanted().any(|w| w) {
                let value: &RawValue = map.next_value()?;
                for (i, w) in wanted().enumerate() {
                    if w {
                        found[i] = Some(value);
                    }
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // As `Value::pointer`: digits only, no leading zero but `0` itself.
        let indexes: [Option<usize>; N] = std::array::from_fn(|i| {
            let t = self.0[i].as_deref()?;
            (t.bytes().all(|b| b.is_ascii_digit()) && !(t.len() > 1 && t.starts_with('0')))
                .then(|| t.parse().ok())
                .flatten()
        });
        let mut found = [None; N];
        let mut i = 0;
        loop {
            if indexes.contains(&Some(i)) {
                let Some(element) = seq.next_element::<&RawValue>()? else {
                    break;
                };
                for (k, index) in indexes.iter().enumerate() {
                    if *index == Some(i) {
                        found[k] = Some(element);
                    }
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    // A scalar has no members.
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok([None; N])
    }
    // `arbitrary_precision` hands a number over as a one-member map named by serde_json's
    // private marker: a pointer into a number finds nothing, as with `Value::pointer`,
    // unless its token is that marker's name (`$serde_json::private::Number`), which then
    // finds the number's text.
}

/// An object member's name, borrowed where the text has no escapes.
struct Name<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value at `pointer` in `raw`, parsed (only it).
    fn value_at(raw: &RawValue, pointer: &str) -> Option<Value> {
        parse(at(raw, pointer))
    }

    /// Every pointer finds what `Value::pointer` finds, in the same document.
    #[test]
    fn pointers_find_what_value_pointer_finds() {
        let text = r#" {"a": {"b~c": [10, {"d/e": "x"}, null]}, "n": 1.50,
            "big": 12345678901234567890123, "s": "t", "dup": 1, "dup": 2, "esc\u0061": true,
            "list": [[0, 1], [2, [3]]], "": {"": 7}} "#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let tree: Value = serde_json::from_str(text).unwrap();
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
            "/a/b~0c/+1",
            "/n",
            "/big",
            "/s",
            "/s/0",
            "/dup",
            "/escа",
            "/esca",
            "/list/1/1/0",
            "/list/0/x",
            "/",
            "//",
            "/missing",
            "a",
            "/n/x",
            "/big/x",
        ];
        for p in pointers {
            assert_eq!(value_at(raw, p).as_ref(), tree.pointer(p), "pointer `{p}`");
        }
        // All at once, in one walk of the top level: the same answers.
        let each = at_each(raw, pointers.map(Some));
        for (p, found) in pointers.iter().zip(each) {
            assert_eq!(
                parse(found).as_ref(),
                tree.pointer(p),
                "pointer `{p}`, at once"
            );
        }
        assert_eq!(at_each(raw, [None, Some("/s")]).map(parse)[0], None);
        // And the checked walk of the text: the same answers.
        let checked = at_each_checked(text, pointers.map(Some)).unwrap();
        for (p, found) in pointers.iter().zip(checked) {
            assert_eq!(
                parse(found).as_ref(),
                tree.pointer(p),
                "pointer `{p}`, checked"
            );
        }
    }

    /// The checked walk refuses every text that is not one JSON value, wherever the fault
    /// is: in a member it follows, in one it skips, or after the value; and takes every
    /// text that is one.
    #[test]
    fn a_checked_walk_refuses_what_is_not_one_json_value() {
        let pointers = [Some("/items"), Some("/next/cursor"), None];
        for bad in [
            "",
            "   ",
            r#"{"items": [1,}"#,
            r#"{"items": [1, 2]"#,
            r#"{"items": []} x"#,
            r#"{"items": []}{}"#,
            r#"{"other": "\q", "items": []}"#,
            r#"{"other": tru, "items": []}"#,
            r#"{"other": [1 2], "items": []}"#,
            r#"{"other": 01, "items": []}"#,
            r#"{"items": [], "next": {"cursor": }}"#,
            r#"{"items": [{"id": "a}]}"#,
            r#"{'items': []}"#,
            r#"[1, 2"#,
            "nul",
        ] {
            assert!(
                serde_json::from_str::<Value>(bad).is_err(),
                "the case itself is JSON: {bad}"
            );
            assert!(
                at_each_checked(bad, pointers).is_err(),
                "taken as JSON: {bad}"
            );
            assert!(at_each_checked(bad, [Some(""), None]).is_err(), "{bad}");
        }
        for good in [
            r#" {"items": [{"id": "a\"b"}], "other": {"x": [1, 2.5e3, null, true]}} "#,
            r#"[{"id": 1}]"#,
            "7",
            r#""text""#,
        ] {
            let tree: Value = serde_json::from_str(good).unwrap();
            let found = at_each_checked(good, pointers).unwrap();
            assert_eq!(parse(found[0]).as_ref(), tree.pointer("/items"), "{good}");
            let [whole] = at_each_checked(good, [Some("")]).unwrap();
            assert_eq!(parse(whole), Some(tree), "{good}");
        }
    }
}

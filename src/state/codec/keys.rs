//! The keys of a watch's records: `<len>:<watch key>/w` and `<len>:<watch key>/s/<n>`, one
//! spelling for each `(watch, part)`, which compaction relies on.

use super::DecodeError;

/// Which record of a watch a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The watch record: `<len>:<watch key>/w`.
    Watch,
    /// Seen chunk `n`: `<len>:<watch key>/s/<n>`.
    Seen(u32),
}

/// The state topic key of one record of a watch: `<len>:<watch key>/w` or
/// `<len>:<watch key>/s/<n>`, where `<len>` is the watch key's length in bytes and `<n>` the
/// chunk number, both in decimal ASCII without leading zeros, and the watch key is copied
/// as is. See [`parse_state_key`] for why every `(watch key, part)` has exactly one key.
pub fn state_key(watch_key: &[u8], part: Part) -> Vec<u8> {
    let mut key = Vec::with_capacity(watch_key.len() + 20);
    key.extend_from_slice(watch_key.len().to_string().as_bytes());
    key.push(b':');
    key.extend_from_slice(watch_key);
    match part {
        Part::Watch => key.extend_from_slice(b"/w"),
        Part::Seen(n) => {
            key.extend_from_slice(b"/s/");
            key.extend_from_slice(n.to_string().as_bytes());
        }
    }
    key
}

/// The watch key and part a state key names: the inverse of [`state_key`].
///
/// The length prefix says where the watch key ends, so a watch key may hold any bytes (`/`,
/// `:`, digits, invalid UTF-8) and still be read back exactly. Only the canonical spelling is
/// accepted (no leading zeros, no sign, nothing after the part), so a key that parses is the
/// one `state_key` makes: one `(watch, part)` never has two keys, which compaction relies on
/// (two spellings would be two keys, never compacted against each other).
pub fn parse_state_key(key: &[u8]) -> Result<(&[u8], Part), DecodeError> {
    let bad = |m: String| Err(DecodeError::Key(m));
    let Some(colon) = key.iter().position(|&b| b == b':') else {
        return bad("no `:` after the watch key's length".into());
    };
    let len = match canonical_decimal(&key[..colon]) {
        Some(len) => len,
        None => {
            return bad(format!(
                "the watch key's length `{}` is not a decimal number without leading zeros",
                String::from_utf8_lossy(&key[..colon])
            ))
        }
    };
    let rest = &key[colon + 1..];
    if len > rest.len() as u64 {
        return bad(format!(
            "the watch key's length {len} exceeds the {} byte(s) after it",
            rest.len()
        ));
    }
    let (watch_key, suffix) = rest.split_at(len as usize);
    let part = match suffix {
        b"/w" => Part::Watch,
        _ => match suffix.strip_prefix(b"/s/") {
            Some(n) => match canonical_decimal(n).and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Part::Seen(n),
                None => {
                    return bad(format!(
                        "the chunk number `{}` is not a decimal u32 without leading zeros",
                        String::from_utf8_lossy(n)
                    ))
                }
            },
            None => {
                return bad(format!(
                    "unknown part `{}` after the watch key (expected `/w` or `/s/<n>`)",
                    String::from_utf8_lossy(suffix)
                ))
            }
        },
    };
    Ok((watch_key, part))
}

/// `digits` as a number if it is written the way `to_string` writes one: ASCII digits, no
/// leading zero unless it is `0`, and small enough for a u64 (at most 19 digits).
pub(super) fn canonical_decimal(digits: &[u8]) -> Option<u64> {
    let canonical = match digits {
        [] => false,
        [b'0'] => true,
        [first, ..] => *first != b'0' && digits.len() <= 19,
    };
    if !canonical || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::codec::tests::bytes;
    use proptest::prelude::*;

    #[test]
    fn malformed_keys_are_refused_with_the_reason() {
        let err = |k: &[u8]| parse_state_key(k).unwrap_err().to_string();
        assert!(err(b"abc/w").contains("no `:`"));
        assert!(err(b"03:abc/w").contains("length `03`"));
        assert!(err(b":abc/w").contains("length ``"));
        assert!(err(b"9:abc/w").contains("length 9 exceeds the 5 byte(s)"));
        assert!(err(b"3:abc/x").contains("unknown part `/x`"));
        assert!(err(b"3:abc/w/").contains("unknown part `/w/`"));
        assert!(err(b"3:abc/s/07").contains("chunk number `07`"));
        assert!(err(b"3:abc/s/4294967296").contains("chunk number `4294967296`"));
        assert!(err(b"3:abc/s/").contains("chunk number ``"));
        assert_eq!(
            parse_state_key(b"3:abc/s/4294967295"),
            Ok((&b"abc"[..], Part::Seen(u32::MAX)))
        );
        // A watch key that itself looks like a key: the length decides.
        assert_eq!(
            parse_state_key(b"5:3:a/w/w"),
            Ok((&b"3:a/w"[..], Part::Watch))
        );
    }

    fn any_part() -> impl Strategy<Value = Part> {
        prop_oneof![Just(Part::Watch), any::<u32>().prop_map(Part::Seen)]
    }

    proptest! {
        #[test]
        fn keys_round_trip_for_any_watch_key(watch_key in bytes(64), part in any_part()) {
            let key = state_key(&watch_key, part);
            prop_assert_eq!(parse_state_key(&key), Ok((&watch_key[..], part)));
        }

        /// Keys are injective: different (watch key, part) pairs never share a key. Watch keys
        /// from a tiny alphabet full of the separators make near-collisions likely.
        #[test]
        fn distinct_watch_parts_have_distinct_keys(
            a in prop::collection::vec(prop::sample::select(b"0/:sw1".to_vec()), 0..8),
            pa in any_part(),
            b in prop::collection::vec(prop::sample::select(b"0/:sw1".to_vec()), 0..8),
            pb in any_part(),
        ) {
            prop_assert_eq!(state_key(&a, pa) == state_key(&b, pb), (a, pa) == (b, pb));
        }

        /// Any bytes that parse as a key are that key's one spelling.
        #[test]
        fn keys_that_parse_are_canonical(key in prop::collection::vec(any::<u8>(), 0..40)) {
            if let Ok((watch_key, part)) = parse_state_key(&key) {
                prop_assert_eq!(state_key(watch_key, part), key);
            }
        }

        #[test]
        fn key_like_bytes_parse_only_in_canonical_form(
            len in prop::collection::vec(prop::sample::select(b"0123:".to_vec()), 0..4),
            rest in prop::collection::vec(prop::sample::select(b"0123/sw:".to_vec()), 0..12),
        ) {
            let key = [len, rest].concat();
            if let Ok((watch_key, part)) = parse_state_key(&key) {
                prop_assert_eq!(state_key(watch_key, part), key);
            }
        }
    }
}

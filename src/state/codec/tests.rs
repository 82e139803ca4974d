//! The format's contract: records round trip, their bytes are pinned, the golden records
//! of version 1 still decode, and damage is named, never a panic.

use super::*;
use proptest::prelude::*;

fn watch_record() -> WatchRecord {
    WatchRecord {
        watch_key: Bytes::from_static(b"k"),
        input_key: Some(Bytes::from_static(b"ik")),
        input_value: Bytes::from_static(b"{}"),
        input_time: 1,
        arrived: 2,
        last_new: 3,
        polls: 4,
        hold: 5,
        next_poll: 6,
        empty_streak: 7,
        failures: 8,
        seen_chunks: 9,
        finished: Some(Finished {
            at: 10,
            reason: "final".into(),
        }),
        resume: None,
        conditions: None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The format is a contract with records already on a broker: these bytes must not
/// change without a new version number.

#[test]
fn a_mode_record_round_trips_under_its_own_key_only() {
    let record = ModeRecord {
        mode: "exactly_once".into(),
    };
    let entry = record.to_entry().unwrap();
    assert_eq!(entry.key, MODE_KEY);
    assert_eq!(
        entry.value,
        [
            &[FORMAT_VERSION, TYPE_MODE, 12, 0, 0, 0][..],
            b"exactly_once"
        ]
        .concat()
    );
    assert_eq!(
        decode_entry(MODE_KEY, Some(&entry.value)),
        Ok(Entry::Mode(Some(record)))
    );
    assert_eq!(decode_entry(MODE_KEY, None), Ok(Entry::Mode(None)));
    let offsets = OutputOffsets::default().encode();
    assert!(matches!(
        decode_entry(MODE_KEY, Some(&offsets)),
        Err(DecodeError::Mismatch(_))
    ));
    assert!(decode_entry(OUTPUT_OFFSETS_KEY, Some(&entry.value)).is_err());
    assert!(decode_entry(MODE_KEY, Some(&entry.value[..8])).is_err());
}

#[test]
fn output_offsets_round_trip_under_their_own_key_and_refuse_short_values() {
    let o = OutputOffsets {
        offsets: vec![(0, 17), (1, 0), (2, i64::MAX)],
    };
    let entry = o.to_entry().unwrap();
    assert_eq!(entry.key, OUTPUT_OFFSETS_KEY);
    assert_eq!(entry.value.len(), 6 + 3 * 12);
    assert_eq!(
        decode_entry(&entry.key, Some(&entry.value)),
        Ok(Entry::OutputOffsets(o))
    );
    // A count the bytes cannot hold is refused, not trusted.
    let mut v = entry.value.clone();
    v[2..6].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Record::decode(&v),
        Err(DecodeError::Truncated {
            field: "offsets",
            ..
        })
    ));
    // Offsets under a watch's key are not taken for a watch.
    let key = state_key(b"w", Part::Watch);
    assert!(matches!(
        decode_entry(&key, Some(&entry.value)),
        Err(DecodeError::Mismatch(_))
    ));
}

#[test]
fn starts_records_round_trip_under_their_own_key_and_hold_only_new_live_watches() {
    let mut other = watch_record();
    other.watch_key = Bytes::from_static(b"other");
    other.finished = None;
    other.seen_chunks = 0;
    let mut first = other.clone();
    first.watch_key = Bytes::from_static(b"first");
    let starts = Starts {
        seq: 17,
        watches: vec![first, other],
    };
    let entry = starts.to_entry().unwrap();
    assert_eq!(entry.key, b"~starts/17");
    assert_eq!(entry.value.len(), starts.encoded_len());
    assert_eq!(
        decode_entry(&entry.key, Some(&entry.value)),
        Ok(Entry::Starts(starts.clone()))
    );
    assert_eq!(
        decode_entry(&entry.key, None),
        Ok(Entry::StartsDeleted { seq: 17 })
    );
    // Another number under the key, a malformed number, a finished member, a member
    // with chunks: refused.
    assert!(matches!(
        decode_entry(b"~starts/18", Some(&entry.value)),
        Err(DecodeError::Mismatch(_))
    ));
    assert!(matches!(
        decode_entry(b"~starts/017", None),
        Err(DecodeError::Key(_))
    ));
    for bad in [
        |w: &mut WatchRecord| w.finished = watch_record().finished,
        |w: &mut WatchRecord| w.seen_chunks = 1,
    ] {
        let mut s = starts.clone();
        bad(&mut s.watches[1]);
        assert!(matches!(
            Record::decode(&s.encode()),
            Err(DecodeError::Invalid {
                field: "member",
                ..
            })
        ));
    }
    // A count the bytes cannot hold is cut short, not allocated.
    let mut lying = starts.encode();
    lying[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Record::decode(&lying),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn the_encodings_are_pinned() {
    assert_eq!(
        hex(&watch_record().encode()),
        concat!(
            "01",               // format version 1
            "01",               // watch record
            "01000000",         // watch key: 1 byte
            "6b",               //   "k"
            "01",               // input key present
            "02000000",         //   2 bytes
            "696b",             //   "ik"
            "02000000",         // input value: 2 bytes
            "7b7d",             //   "{}"
            "0100000000000000", // input time
            "0200000000000000", // arrived
            "0300000000000000", // last new
            "0400000000000000", // polls
            "0500000000000000", // hold
            "0600000000000000", // next poll
            "07000000",         // empty streak
            "08000000",         // failures
            "09000000",         // seen chunks
            "01",               // finished
            "0a00000000000000", //   at 10
            "05000000",         //   reason: 5 bytes
            "66696e616c",       //   "final"
        )
    );
    let chunk = SeenChunk::new(3, vec![1, u128::MAX - 1]).unwrap();
    assert_eq!(
        hex(&chunk.encode()),
        concat!(
            "01",                               // format version 1
            "02",                               // seen chunk
            "03000000",                         // index 3
            "02000000",                         // 2 hashes
            "01000000000000000000000000000000", // 1
            "feffffffffffffffffffffffffffffff", // u128::MAX - 1
        )
    );
    assert_eq!(state_key(b"order-1", Part::Watch), b"7:order-1/w");
    assert_eq!(state_key(b"order-1", Part::Seen(12)), b"7:order-1/s/12");
    assert_eq!(state_key(b"", Part::Seen(0)), b"0:/s/0");
}

#[test]
fn a_wrong_version_or_type_is_named() {
    let mut v = watch_record().encode();
    v[0] = 2;
    let e = Record::decode(&v).unwrap_err();
    assert_eq!(e, DecodeError::NewerVersion { found: 2 });
    assert_eq!(
        e.to_string(),
        "written by state format version 2; this build reads version 1"
    );
    v[0] = 0;
    let e = Record::decode(&v).unwrap_err();
    assert_eq!(e, DecodeError::Version { found: 0 });
    assert_eq!(
        e.to_string(),
        "unsupported state format version 0 (this build reads version 1)"
    );
    let e = Record::decode(&[1, 9]).unwrap_err();
    assert_eq!(e.to_string(), "unknown state record type 9");
}

/// The records a real bridge wrote in format version 1 (`tests/fixtures/state-v1.json`,
/// which `tests/upgrades.rs` restores on a broker) decode under their keys and encode
/// back to the same bytes: a change to the format that would misread them fails here.
#[test]
fn the_golden_records_of_version_1_decode_and_encode_back_to_the_same_bytes() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/fixtures/state-v1.json")).unwrap();
    assert_eq!(fixture["format_version"], 1);
    let unhex = |v: &serde_json::Value| -> Option<Vec<u8>> {
        let text = v.as_str()?;
        Some(
            (0..text.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
                .collect(),
        )
    };
    let mut kinds = std::collections::BTreeSet::new();
    for r in fixture["records"].as_array().unwrap() {
        let key = unhex(&r["key_hex"]).unwrap();
        let value = unhex(&r["value_hex"]);
        let entry = decode_entry(&key, value.as_deref());
        assert!(entry.is_ok(), "{r}: {entry:?}");
        if let Some(value) = value {
            assert_eq!(Record::decode(&value).unwrap().encode(), value, "{r}");
        }
        kinds.insert(r["kind"].as_str().unwrap().to_string());
    }
    for kind in [
        "live watch",
        "finished watch",
        "seen chunk",
        "output offsets",
        "mode",
    ] {
        assert!(kinds.contains(kind), "{kind} not in the fixture: {kinds:?}");
    }
}

/// A record of a newer version is named as such under any key of the format's (a digit
/// or `~` first), even one this build cannot parse (a later format may spell keys
/// otherwise), and never as damage; under a foreign key, or inside a version-1 starts
/// record, the same byte is damage.
#[test]
fn a_newer_version_is_told_apart_from_damage_under_any_key() {
    let newer = |mut v: Vec<u8>| {
        v[0] = FORMAT_VERSION + 1;
        v
    };
    let w = newer(watch_record().encode());
    let keys: [&[u8]; 5] = [
        b"1:k/w",
        OUTPUT_OFFSETS_KEY,
        MODE_KEY,
        b"~starts/3",
        b"7:later/x/format",
    ];
    for key in keys {
        assert_eq!(
            decode_entry(key, Some(&w)),
            Err(DecodeError::NewerVersion { found: 2 }),
            "{}",
            String::from_utf8_lossy(key)
        );
    }
    assert_eq!(
        decode_entry(b"1:k/w", Some(&[0xff])),
        Err(DecodeError::NewerVersion { found: 0xff })
    );
    assert!(matches!(
        decode_entry(b"1:k/w", None),
        Ok(Entry::Tombstone { .. })
    ));
    // A key of no state record's: a foreign record, whatever its first byte.
    assert!(matches!(
        decode_entry(b"junk", Some(&w)),
        Err(DecodeError::Key(_))
    ));
    // Damage of the current version stays damage.
    let mut damaged = watch_record().encode();
    damaged[1] = 9;
    assert_eq!(
        decode_entry(b"1:k/w", Some(&damaged)),
        Err(DecodeError::UnknownType { found: 9 })
    );
    let mut member = watch_record();
    member.finished = None;
    member.seen_chunks = 0;
    let mut starts = Starts {
        seq: 1,
        watches: vec![member],
    }
    .encode();
    starts[14] = FORMAT_VERSION + 1; // the member's own version byte
    let e = decode_entry(b"~starts/1", Some(&starts)).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Invalid {
                field: "member",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn truncation_names_the_byte_and_the_field() {
    let v = watch_record().encode();
    // Cut inside the input value's length prefix: bytes 0-1 header, 2-6 watch key, 7 flag,
    // 8-13 input key, 14.. the input value's length.
    let e = Record::decode(&v[..16]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "truncated at byte 14: input value needs 4 byte(s), 2 left"
    );
    // Every proper prefix is truncated (never decoded as something shorter).
    for cut in 0..v.len() {
        assert!(
            matches!(
                Record::decode(&v[..cut]),
                Err(DecodeError::Truncated { .. })
            ),
            "prefix of {cut} bytes"
        );
    }
    assert_eq!(
        Record::decode(&[]).unwrap_err().to_string(),
        "truncated at byte 0: format version needs 1 byte(s), 0 left"
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut v = SeenChunk::new(0, vec![7]).unwrap().encode();
    let end = v.len();
    v.extend_from_slice(b"xyz");
    let e = Record::decode(&v).unwrap_err();
    assert_eq!(e, DecodeError::Trailing { at: end, count: 3 });
    assert_eq!(
        e.to_string(),
        "3 trailing byte(s) after the record, which ends at byte 26"
    );
}

#[test]
fn bad_flags_and_reasons_are_invalid() {
    let mut v = watch_record().encode();
    v[7] = 2; // the input key flag
    assert_eq!(
        Record::decode(&v).unwrap_err().to_string(),
        "invalid input key flag at byte 7: 2 is neither 0 nor 1"
    );
    let mut v = watch_record().encode();
    let last = v.len() - 1;
    v[last] = 0xff; // inside the reason
    let e = Record::decode(&v).unwrap_err().to_string();
    assert!(e.starts_with("invalid finish reason at byte"), "{e}");
}

#[test]
fn chunks_hold_at_most_the_limit() {
    let full = vec![0; MAX_HASHES_PER_CHUNK];
    let chunk = SeenChunk::new(0, full.clone()).unwrap();
    let entry = chunk.to_entry(b"some watch").unwrap();
    assert!(entry.key.len() + entry.value.len() < MAX_RECORD_BYTES);
    assert_eq!(Record::decode(&entry.value), Ok(Record::Seen(chunk)));
    let mut over = full;
    over.push(0);
    assert_eq!(
        SeenChunk::new(0, over).unwrap_err(),
        TooManyHashes {
            hashes: MAX_HASHES_PER_CHUNK + 1
        }
    );
    // A count over the limit is refused before the hashes are even looked for.
    let mut v = vec![FORMAT_VERSION, TYPE_SEEN_CHUNK, 0, 0, 0, 0];
    v.extend_from_slice(&(MAX_HASHES_PER_CHUNK as u32 + 1).to_le_bytes());
    assert_eq!(
        Record::decode(&v).unwrap_err().to_string(),
        "invalid hash count at byte 6: 32769 hashes exceed the limit of 32768"
    );
}

#[test]
fn an_oversized_watch_record_is_refused() {
    let mut w = watch_record();
    w.input_value = Bytes::from(vec![b'x'; MAX_RECORD_BYTES]);
    let e = w.to_entry().unwrap_err();
    assert_eq!(
        e.bytes,
        w.encoded_len() + state_key(b"k", Part::Watch).len()
    );
    w.input_value = Bytes::from(vec![b'x'; 900_000]);
    assert!(w.to_entry().is_ok());
}

#[test]
fn entries_are_checked_against_their_keys() {
    let w = watch_record();
    let entry = w.to_entry().unwrap();
    assert_eq!(
        decode_entry(&entry.key, Some(&entry.value)),
        Ok(Entry::Watch(w.clone()))
    );
    let other = state_key(b"other", Part::Watch);
    assert!(matches!(
        decode_entry(&other, Some(&entry.value)),
        Err(DecodeError::Mismatch(_))
    ));
    let chunk = SeenChunk::new(4, vec![1, 2]).unwrap();
    let c = chunk.to_entry(b"k").unwrap();
    assert_eq!(
        decode_entry(&c.key, Some(&c.value)),
        Ok(Entry::Seen {
            watch_key: Bytes::from_static(b"k"),
            chunk: chunk.clone()
        })
    );
    let e = decode_entry(&state_key(b"k", Part::Seen(5)), Some(&c.value)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "record does not match its key: seen chunk 4 under the key of chunk 5"
    );
    assert!(matches!(
        decode_entry(&entry.key, Some(&c.value)),
        Err(DecodeError::Mismatch(_))
    ));
    assert!(matches!(
        decode_entry(&c.key, Some(&entry.value)),
        Err(DecodeError::Mismatch(_))
    ));
    assert_eq!(
        decode_entry(&c.key, None),
        Ok(Entry::Tombstone {
            watch_key: Bytes::from_static(b"k"),
            part: Part::Seen(4)
        })
    );
}

pub(super) fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn any_watch_record() -> impl Strategy<Value = WatchRecord> {
    let finished = prop::option::of((any::<i64>(), ".{0,12}"))
        .prop_map(|f| f.map(|(at, reason)| Finished { at, reason }));
    (
        (bytes(40), prop::option::of(bytes(40)), bytes(200)),
        (any::<i64>(), any::<i64>(), any::<i64>(), any::<u64>()),
        (any::<i64>(), any::<i64>()),
        (any::<u32>(), any::<u32>(), any::<u32>()),
        finished,
    )
        .prop_map(
            |(
                (watch_key, input_key, input_value),
                (input_time, arrived, last_new, polls),
                (hold, next_poll),
                (empty_streak, failures, seen_chunks),
                finished,
            )| WatchRecord {
                watch_key,
                input_key,
                input_value,
                input_time,
                arrived,
                last_new,
                polls,
                hold,
                next_poll,
                empty_streak,
                failures,
                seen_chunks,
                finished,
                resume: None,
                conditions: None,
            },
        )
        .prop_flat_map(|w| {
            (prop::option::of(bytes(30)), prop::option::of(bytes(30))).prop_map(
                move |(resume, conditions)| WatchRecord {
                    // With conditions after it, an empty resume state reads as none.
                    resume: resume.filter(|r| !r.is_empty() || conditions.is_none()),
                    conditions,
                    ..w.clone()
                },
            )
        })
}

fn any_chunk() -> impl Strategy<Value = SeenChunk> {
    (any::<u32>(), prop::collection::vec(any::<u128>(), 0..100))
        .prop_map(|(i, h)| SeenChunk::new(i, h).unwrap())
}

proptest! {
    #[test]
    fn watch_records_round_trip(w in any_watch_record()) {
        let entry = w.to_entry().unwrap();
        prop_assert_eq!(entry.value.len(), w.encoded_len());
        prop_assert_eq!(Record::decode(&entry.value), Ok(Record::Watch(w.clone())));
        prop_assert_eq!(decode_entry(&entry.key, Some(&entry.value)), Ok(Entry::Watch(w)));
    }

    #[test]
    fn seen_chunks_round_trip(c in any_chunk(), watch_key in bytes(40)) {
        let entry = c.to_entry(&watch_key).unwrap();
        prop_assert_eq!(entry.value.len(), c.encoded_len());
        prop_assert_eq!(Record::decode(&entry.value), Ok(Record::Seen(c.clone())));
        prop_assert_eq!(
            decode_entry(&entry.key, Some(&entry.value)),
            Ok(Entry::Seen { watch_key, chunk: c })
        );
    }


    #[test]
    fn decoding_random_bytes_never_panics(v in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = Record::decode(&v);
        let _ = decode_entry(&v, Some(&v));
    }

    /// Random bytes rarely get past the version byte; damaged real records go deeper.
    #[test]
    fn decoding_damaged_records_never_panics(
        w in any_watch_record(),
        c in any_chunk(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        for mut v in [w.encode(), c.encode()] {
            for (at, byte) in &edits {
                let i = at.index(v.len());
                v[i] = *byte;
            }
            let cut = cut.index(v.len() + 1);
            if let Ok(record) = Record::decode(&v[..cut]) {
                // Whatever decodes encodes back to the same bytes.
                prop_assert_eq!(record.encode(), &v[..cut]);
            }
        }
    }
}

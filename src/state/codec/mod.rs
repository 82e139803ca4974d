//! The state topic's binary format: record keys, record values, and their errors.
//!
//! See the [module documentation](super) for the layout and why it is so. Everything here is
//! pure: bytes in, values out. Decoding never panics and never allocates more than the input
//! it was given could hold, whatever the bytes (a length field is checked against the bytes
//! left before anything is reserved for it).
//!
//! One file a concept: the keys of a watch's records (`keys.rs`), the watch record
//! (`watch.rs`), seen chunks (`seen.rs`), starts records (`starts.rs`), the records of a
//! partition as a whole (`partition.rs`: output offsets, mode), and the field encoding they
//! share (`fields.rs`). Here: the format's version and limits, its errors, and a record
//! read back whole ([`Record`], [`decode_entry`]).

mod fields;
mod keys;
mod partition;
mod seen;
mod starts;
#[cfg(test)]
mod tests;
mod watch;

pub use keys::{parse_state_key, state_key, Part};
pub use partition::{ModeRecord, OutputOffsets, MODE_KEY, OUTPUT_OFFSETS_KEY};
pub use seen::SeenChunk;
pub use starts::{starts_key, Starts};
pub use watch::{Finished, WatchRecord};

use bytes::Bytes;
use fields::Reader;
use starts::parse_starts_key;

/// The version byte every record value starts with, and the one this build writes. A reader
/// refuses other versions rather than guessing; a format change bumps it and teaches the
/// reader the old one too (the rules, and how a change is rolled out: [`super::versions`]).
pub const FORMAT_VERSION: u8 = 1;

/// Most hashes one seen chunk may hold (16 bytes each: 512 KiB), so a chunk record stays well
/// under Kafka's default 1 MB message limit whatever the watch. The journal's chunks are
/// smaller by default (see [`DEFAULT_CHUNK_HASHES`](super::DEFAULT_CHUNK_HASHES)); this is
/// the format's bound, checked on both sides.
pub const MAX_HASHES_PER_CHUNK: usize = 32_768;

/// Most bytes of key plus value one state record may have. Kafka's default
/// `max.message.bytes` is 1 MiB for a whole batch; 1,000,000 leaves room for batch and record
/// headers.
pub const MAX_RECORD_BYTES: usize = 1_000_000;

/// Record type byte of a [`WatchRecord`].
const TYPE_WATCH: u8 = 1;
/// Record type byte of a [`SeenChunk`].
const TYPE_SEEN_CHUNK: u8 = 2;
/// Record type byte of [`OutputOffsets`].
const TYPE_OUTPUT_OFFSETS: u8 = 3;
/// Record type byte of a [`Starts`] record.
const TYPE_STARTS: u8 = 4;
/// Record type byte of a [`ModeRecord`].
const TYPE_MODE: u8 = 5;

/// Why bytes read from the state topic are not a state record (or key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A version this build never wrote and no build will (0): damage.
    #[error(
        "unsupported state format version {found} (this build reads version {FORMAT_VERSION})"
    )]
    Version { found: u8 },
    /// Written by a newer build: not damage, but state this build cannot read. A recovery
    /// stops the partition on it rather than skip it ([`super::versions`]).
    #[error("written by state format version {found}; this build reads version {FORMAT_VERSION}")]
    NewerVersion { found: u8 },
    #[error("unknown state record type {found}")]
    UnknownType { found: u8 },
    #[error("truncated at byte {at}: {field} needs {needed} byte(s), {available} left")]
    Truncated {
        at: usize,
        field: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("{count} trailing byte(s) after the record, which ends at byte {at}")]
    Trailing { at: usize, count: usize },
    #[error("invalid {field} at byte {at}: {detail}")]
    Invalid {
        at: usize,
        field: &'static str,
        detail: String,
    },
    #[error("bad state key: {0}")]
    Key(String),
    #[error("record does not match its key: {0}")]
    Mismatch(String),
}

/// A state record would be larger than [`MAX_RECORD_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state record of {bytes} bytes (key and value) exceeds the limit of {MAX_RECORD_BYTES}")]
pub struct TooLarge {
    pub bytes: usize,
}

/// A seen chunk would hold more than [`MAX_HASHES_PER_CHUNK`] hashes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a seen chunk of {hashes} hashes exceeds the limit of {MAX_HASHES_PER_CHUNK}")]
pub struct TooManyHashes {
    pub hashes: usize,
}

/// Any state record value.
// Decoded one at a time and taken apart at once (a watch record is never kept as a
// `Record`), so boxing the large variant would only add an allocation per record read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Watch(WatchRecord),
    Seen(SeenChunk),
    OutputOffsets(OutputOffsets),
    Starts(Starts),
    Mode(ModeRecord),
}

/// A record ready to produce: its key and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl StateEntry {
    fn checked(key: Vec<u8>, value: Vec<u8>) -> Result<Self, TooLarge> {
        let bytes = key.len() + value.len();
        if bytes > MAX_RECORD_BYTES {
            return Err(TooLarge { bytes });
        }
        Ok(Self { key, value })
    }
}

/// One record read back from the state topic, checked against its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Watch(WatchRecord),
    Seen {
        watch_key: Bytes,
        chunk: SeenChunk,
    },
    /// A record with no value: that key is deleted.
    Tombstone {
        watch_key: Bytes,
        part: Part,
    },
    /// The partition's [`OutputOffsets`] (key [`OUTPUT_OFFSETS_KEY`]).
    OutputOffsets(OutputOffsets),
    /// A [`Starts`] record (key [`starts_key`]).
    Starts(Starts),
    /// A deleted [`Starts`] record.
    StartsDeleted {
        seq: u32,
    },
    /// The partition's [`ModeRecord`] (key [`MODE_KEY`]; `None`: deleted).
    Mode(Option<ModeRecord>),
}

/// Decode a record read from the state topic (`value` is `None` for a tombstone) and check
/// that it is the record its key names: a watch record under `/w` with the same watch key,
/// chunk `n` under `/s/<n>`.
pub fn decode_entry(key: &[u8], value: Option<&[u8]>) -> Result<Entry, DecodeError> {
    // A newer version first, under any key of the format's (a watch's starts with a digit,
    // the others with `~`), even one this build cannot parse: a later format may spell its
    // keys otherwise, and its record must not pass for a damaged one. A key outside those
    // is no state record of any version (a foreign record: skipped as before).
    let ours = matches!(key.first(), Some(b'0'..=b'9' | b'~'));
    if let Some(&found) = value.and_then(<[u8]>::first).filter(|_| ours) {
        if found > FORMAT_VERSION {
            return Err(DecodeError::NewerVersion { found });
        }
    }
    if key == OUTPUT_OFFSETS_KEY {
        return match value.map(Record::decode).transpose()? {
            Some(Record::OutputOffsets(o)) => Ok(Entry::OutputOffsets(o)),
            Some(_) => Err(DecodeError::Mismatch(
                "a watch record or seen chunk under the output-offsets key".into(),
            )),
            None => Ok(Entry::OutputOffsets(OutputOffsets::default())),
        };
    }
    if key == MODE_KEY {
        return match value.map(Record::decode).transpose()? {
            Some(Record::Mode(m)) => Ok(Entry::Mode(Some(m))),
            Some(_) => Err(DecodeError::Mismatch(
                "a record other than a mode record under the mode key".into(),
            )),
            None => Ok(Entry::Mode(None)),
        };
    }
    if let Some(seq) = parse_starts_key(key) {
        let seq = seq?;
        return match value.map(Record::decode).transpose()? {
            Some(Record::Starts(s)) if s.seq == seq => Ok(Entry::Starts(s)),
            Some(Record::Starts(s)) => Err(DecodeError::Mismatch(format!(
                "starts record {} under the key of starts record {seq}",
                s.seq
            ))),
            Some(_) => Err(DecodeError::Mismatch(
                "a record other than a starts record under a starts key".into(),
            )),
            None => Ok(Entry::StartsDeleted { seq }),
        };
    }
    let (watch_key, part) = parse_state_key(key)?;
    let Some(value) = value else {
        return Ok(Entry::Tombstone {
            watch_key: Bytes::copy_from_slice(watch_key),
            part,
        });
    };
    let mismatch = |m: String| Err(DecodeError::Mismatch(m));
    match (part, Record::decode(value)?) {
        (Part::Watch, Record::Watch(w)) if w.watch_key == watch_key => Ok(Entry::Watch(w)),
        (Part::Watch, Record::Watch(_)) => {
            mismatch("the watch record names another watch key".into())
        }
        (Part::Seen(n), Record::Seen(chunk)) if chunk.index == n => Ok(Entry::Seen {
            watch_key: Bytes::copy_from_slice(watch_key),
            chunk,
        }),
        (Part::Seen(n), Record::Seen(chunk)) => mismatch(format!(
            "seen chunk {} under the key of chunk {n}",
            chunk.index
        )),
        (Part::Watch, Record::Seen(_)) => mismatch("a seen chunk under a watch record key".into()),
        (Part::Seen(_), Record::Watch(_)) => {
            mismatch("a watch record under a seen chunk key".into())
        }
        (_, Record::OutputOffsets(_)) => mismatch("output offsets under a watch's key".into()),
        (_, Record::Starts(_)) => mismatch("a starts record under a watch's key".into()),
        (_, Record::Mode(_)) => mismatch("a mode record under a watch's key".into()),
    }
}

impl Record {
    /// Decode a record value of any type. Errors say what is wrong and where.
    pub fn decode(value: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { buf: value, pos: 0 };
        let version = r.u8("format version")?;
        if version > FORMAT_VERSION {
            return Err(DecodeError::NewerVersion { found: version });
        }
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version { found: version });
        }
        let record = match r.u8("record type")? {
            TYPE_WATCH => Record::Watch(WatchRecord::decode_body(&mut r)?),
            TYPE_SEEN_CHUNK => Record::Seen(SeenChunk::decode_body(&mut r)?),
            TYPE_OUTPUT_OFFSETS => Record::OutputOffsets(OutputOffsets::decode_body(&mut r)?),
            TYPE_STARTS => Record::Starts(Starts::decode_body(&mut r)?),
            TYPE_MODE => Record::Mode(ModeRecord::decode_body(&mut r)?),
            found => return Err(DecodeError::UnknownType { found }),
        };
        r.finish()?;
        Ok(record)
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            Record::Watch(w) => w.encode(),
            Record::Seen(c) => c.encode(),
            Record::OutputOffsets(o) => o.encode(),
            Record::Starts(b) => b.encode(),
            Record::Mode(m) => m.encode(),
        }
    }
}

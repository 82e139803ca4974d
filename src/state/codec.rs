//! The state topic's binary format: record keys, record values, and their errors.
//!
//! See the [module documentation](super) for the layout and why it is so. Everything here is
//! pure: bytes in, values out. Decoding never panics and never allocates more than the input
//! it was given could hold, whatever the bytes (a length field is checked against the bytes
//! left before anything is reserved for it).

use crate::clock::Millis;
use crate::reason::TerminatedReason;
use crate::seen::OutputHash;
use bytes::Bytes;

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

/// What a [`Starts`] record's key starts with: `~starts/<seq>` (`<seq>` decimal, no leading
/// zeros). It does not start with a digit, so it is no watch's key.
const STARTS_KEY_PREFIX: &[u8] = b"~starts/";

/// The key of a partition's [`OutputOffsets`] record. It does not start with a digit, so it
/// is no watch's key.
pub const OUTPUT_OFFSETS_KEY: &[u8] = b"~output-offsets";

/// The key of a partition's [`ModeRecord`]. It does not start with a digit, so it is no
/// watch's key.
pub const MODE_KEY: &[u8] = b"~mode";

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

// ---------------------------------------------------------------------------------------
// Keys

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
fn canonical_decimal(digits: &[u8]) -> Option<u64> {
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

// ---------------------------------------------------------------------------------------
// Records

/// One watch's registration and progress (key `<len>:<watch key>/w`), rewritten whenever
/// they change. All times are epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRecord {
    /// The watch key (also in the record's key; a reader checks that they agree).
    pub watch_key: Bytes,
    /// The input record's key (`None`: the record had none; the watch key then came from
    /// its value).
    pub input_key: Option<Bytes>,
    /// The input record's value as read from the input topic: a restore decodes it again to
    /// re-resolve the resource.
    pub input_value: Bytes,
    /// The input record's timestamp.
    pub input_time: Millis,
    /// Processing time the input arrived at (`total` counts from it).
    pub arrived: Millis,
    /// Processing time of the last poll with a new output; the arrival until one (`stable`).
    pub last_new: Millis,
    /// Successful polls completed (`polls`).
    pub polls: u64,
    /// The watch's watermark hold.
    pub hold: Millis,
    /// When the next poll is due (processing time). For a watch whose poll was in flight at
    /// the checkpoint, the time that poll was due: it is polled again at once on restore.
    pub next_poll: Millis,
    /// Successful polls in a row without a new output (the backoff step).
    pub empty_streak: u32,
    /// Failed polls in a row (the retry step).
    pub failures: u32,
    /// How many seen chunks (`/s/0` ..) the watch had when this record was written.
    pub seen_chunks: u32,
    /// Set once the watch has ended: it is kept (without its seen chunks) until the finished
    /// retention passes, so a re-delivered input does not start it again. A watch that
    /// ended `failed` keeps its seen chunks as long (`seen_chunks` lists them), so that a
    /// re-delivered input starts it again knowing them.
    pub finished: Option<Finished>,
    /// The poller's own state of the watch that must survive a restart (the HTTP poller's
    /// `{last.*}` values, as it encodes them), as of outputs all delivered. Written after
    /// the other fields only when set, so records from before it read as `None`.
    pub resume: Option<Bytes>,
    /// The states of the watch's user termination conditions
    /// ([`Termination::save_custom`](crate::termination::Termination::save_custom)'s bytes),
    /// as of the same poll as `resume`. Written after `resume` (an empty `resume` then stands
    /// for none) only when set, so records from before it read as `None`.
    pub conditions: Option<Bytes>,
}

/// When and why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub at: Millis,
    /// [`TerminatedReason::as_str`]: a fixed name, or a user condition's name.
    pub reason: String,
}

impl Finished {
    pub fn new(at: Millis, reason: &TerminatedReason) -> Self {
        Self {
            at,
            reason: reason.as_str().to_string(),
        }
    }
}

/// Part of one watch's seen set (key `<len>:<watch key>/s/<index>`): output-key hashes in the
/// order they were first seen, at most [`MAX_HASHES_PER_CHUNK`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenChunk {
    index: u32,
    hashes: Vec<OutputHash>,
}

impl SeenChunk {
    pub fn new(index: u32, hashes: Vec<OutputHash>) -> Result<Self, TooManyHashes> {
        if hashes.len() > MAX_HASHES_PER_CHUNK {
            return Err(TooManyHashes {
                hashes: hashes.len(),
            });
        }
        Ok(Self { index, hashes })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn hashes(&self) -> &[OutputHash] {
        &self.hashes
    }

    pub fn into_hashes(self) -> Vec<OutputHash> {
        self.hashes
    }
}

/// Where, on each output partition, outputs not yet in this state partition's seen chunks
/// may start (key [`OUTPUT_OFFSETS_KEY`]): a recovery reads the output topic from these
/// offsets to its end and adds what it finds to the seen sets. Written after the seen chunks
/// it vouches for, so a reader that sees it sees them too.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutputOffsets {
    /// `(output partition, offset)`, one per output partition.
    pub offsets: Vec<(i32, i64)>,
}

impl OutputOffsets {
    /// The value bytes: version, type, count (u32), then each partition (i32) and offset
    /// (i64), little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + 12 * self.offsets.len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_OUTPUT_OFFSETS);
        let count = u32::try_from(self.offsets.len()).expect("fewer than 2^32 partitions");
        out.extend_from_slice(&count.to_le_bytes());
        for (partition, offset) in &self.offsets {
            out.extend_from_slice(&partition.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        out
    }

    /// Key and value.
    pub fn to_entry(&self) -> Result<StateEntry, TooLarge> {
        StateEntry::checked(OUTPUT_OFFSETS_KEY.to_vec(), self.encode())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let count = r.u32("offset count")? as usize;
        // Checked against the bytes left before anything is reserved.
        let raw = r.take(12usize.saturating_mul(count), "offsets")?;
        let offsets = raw
            .chunks_exact(12)
            .map(|b| {
                let partition = i32::from_le_bytes(b[..4].try_into().unwrap_or([0; 4]));
                let offset = i64::from_le_bytes(b[4..].try_into().unwrap_or([0; 8]));
                (partition, offset)
            })
            .collect();
        Ok(Self { offsets })
    }
}

/// The guarantee (`WATCHBRIDGE_GUARANTEE`) of the instance that last wrote the partition
/// (key [`MODE_KEY`]), written with every batch of state records a partition writes, so
/// that it is among a partition's last records: an instance starting reads it there, and
/// refuses to join a group that runs another mode (`kafka/group_mode.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeRecord {
    /// The mode's name: `exactly_once`, `recovery` or `at_least_once`.
    pub mode: String,
}

impl ModeRecord {
    /// The value bytes: version, type, then the name as a length-prefixed string.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + self.mode.len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_MODE);
        put_bytes(&mut out, self.mode.as_bytes());
        out
    }

    /// Key and value.
    pub fn to_entry(&self) -> Result<StateEntry, TooLarge> {
        StateEntry::checked(MODE_KEY.to_vec(), self.encode())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            mode: r.string("mode")?,
        })
    }
}

/// The first records of the watches one checkpoint started, in one record (key
/// `~starts/<seq>`, [`starts_key`]): a broker that writes records one at a time (Tansu on
/// SQLite) writes one record per checkpoint instead of one per new watch. A member is live
/// with no seen chunks. A member's own record (`<len>:<watch key>/w`), written later, takes
/// its place: whichever of the two is later on the partition wins. The record is deleted
/// once every member has its own record (see `kafka/durable.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Starts {
    /// Numbers the partition's starts records (1, 2, ...), in the order they were written.
    pub seq: u32,
    pub watches: Vec<WatchRecord>,
}

impl Starts {
    /// The value bytes: version, type, seq (u32), count (u32), then each member's watch
    /// record value as a length-prefixed byte string.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_STARTS);
        out.extend_from_slice(&self.seq.to_le_bytes());
        let count = u32::try_from(self.watches.len()).expect("a record holds fewer");
        out.extend_from_slice(&count.to_le_bytes());
        for w in &self.watches {
            put_bytes(&mut out, &w.encode());
        }
        out
    }

    /// Bytes of [`Starts::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        10 + self.watches.iter().map(Self::member_len).sum::<usize>()
    }

    /// What one member adds to [`Starts::encoded_len`].
    pub fn member_len(w: &WatchRecord) -> usize {
        4 + w.encoded_len()
    }

    /// Key and value (refused above [`MAX_RECORD_BYTES`]: the writer splits its members
    /// over records below that).
    pub fn to_entry(&self) -> Result<StateEntry, TooLarge> {
        StateEntry::checked(starts_key(self.seq), self.encode())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let seq = r.u32("starts number")?;
        let count = r.u32("member count")? as usize;
        // Each member takes at least its length prefix: a count the bytes cannot hold
        // reserves nothing.
        let mut watches = Vec::with_capacity(count.min(r.buf.len() / 4));
        for _ in 0..count {
            let at = r.pos;
            let bytes = r.bytes("member")?;
            // A member's version is its starts record's: another one inside is damage.
            let member = Record::decode(bytes).map_err(|e| match e {
                DecodeError::NewerVersion { found } => DecodeError::Invalid {
                    at,
                    field: "member",
                    detail: format!("format version {found} inside a version-1 starts record"),
                },
                e => e,
            })?;
            match member {
                Record::Watch(w) if w.finished.is_none() && w.seen_chunks == 0 => watches.push(w),
                _ => {
                    return Err(DecodeError::Invalid {
                        at,
                        field: "member",
                        detail: "not a live watch record without seen chunks".into(),
                    })
                }
            }
        }
        Ok(Self { seq, watches })
    }
}

/// The key of starts record `seq`.
pub fn starts_key(seq: u32) -> Vec<u8> {
    let mut key = STARTS_KEY_PREFIX.to_vec();
    key.extend_from_slice(seq.to_string().as_bytes());
    key
}

/// The number a starts record's key names, if it is one (`Err`: a starts key, malformed).
fn parse_starts_key(key: &[u8]) -> Option<Result<u32, DecodeError>> {
    let digits = key.strip_prefix(STARTS_KEY_PREFIX)?;
    Some(
        canonical_decimal(digits)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                DecodeError::Key(format!(
                    "the starts number `{}` is not a decimal u32 without leading zeros",
                    String::from_utf8_lossy(digits)
                ))
            }),
    )
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

impl WatchRecord {
    /// The value bytes. Prefer [`WatchRecord::to_entry`], which also checks the size.
    ///
    /// # Panics
    /// If a byte field is 4 GiB or longer (a u32 length prefix cannot say so); `to_entry`
    /// refuses far smaller records first.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_WATCH);
        put_bytes(&mut out, &self.watch_key);
        match &self.input_key {
            None => out.push(0),
            Some(k) => {
                out.push(1);
                put_bytes(&mut out, k);
            }
        }
        put_bytes(&mut out, &self.input_value);
        for t in [self.input_time, self.arrived, self.last_new] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&self.polls.to_le_bytes());
        for t in [self.hold, self.next_poll] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for n in [self.empty_streak, self.failures, self.seen_chunks] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        match &self.finished {
            None => out.push(0),
            Some(f) => {
                out.push(1);
                out.extend_from_slice(&f.at.to_le_bytes());
                put_bytes(&mut out, f.reason.as_bytes());
            }
        }
        if self.resume.is_some() || self.conditions.is_some() {
            put_bytes(&mut out, self.resume.as_deref().unwrap_or_default());
        }
        if let Some(conditions) = &self.conditions {
            put_bytes(&mut out, conditions);
        }
        debug_assert_eq!(out.len(), self.encoded_len());
        out
    }

    /// Bytes of [`WatchRecord::encode`]'s output, computed without encoding.
    pub fn encoded_len(&self) -> usize {
        2 + (4 + self.watch_key.len())
            + 1
            + self.input_key.as_ref().map_or(0, |k| 4 + k.len())
            + (4 + self.input_value.len())
            + 6 * 8
            + 3 * 4
            + 1
            + self.finished.as_ref().map_or(0, |f| 8 + 4 + f.reason.len())
            + match (&self.resume, &self.conditions) {
                (None, None) => 0,
                (resume, _) => 4 + resume.as_ref().map_or(0, Bytes::len),
            }
            + self.conditions.as_ref().map_or(0, |c| 4 + c.len())
    }

    /// Key and value, unless together they exceed [`MAX_RECORD_BYTES`] (an input value near
    /// the input topic's own limit can do that).
    pub fn to_entry(&self) -> Result<StateEntry, TooLarge> {
        self.check_size()?;
        StateEntry::checked(state_key(&self.watch_key, Part::Watch), self.encode())
    }

    /// Whether [`WatchRecord::to_entry`] would succeed, computed without encoding.
    pub fn check_size(&self) -> Result<(), TooLarge> {
        let bytes = state_key(&self.watch_key, Part::Watch).len() + self.encoded_len();
        if bytes > MAX_RECORD_BYTES {
            return Err(TooLarge { bytes });
        }
        Ok(())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let watch_key = Bytes::copy_from_slice(r.bytes("watch key")?);
        let input_key = match r.flag("input key flag")? {
            false => None,
            true => Some(Bytes::copy_from_slice(r.bytes("input key")?)),
        };
        let input_value = Bytes::copy_from_slice(r.bytes("input value")?);
        let input_time = r.i64("input time")?;
        let arrived = r.i64("arrival time")?;
        let last_new = r.i64("last new output time")?;
        let polls = r.u64("poll count")?;
        let hold = r.i64("hold")?;
        let next_poll = r.i64("next poll time")?;
        let empty_streak = r.u32("empty streak")?;
        let failures = r.u32("failure count")?;
        let seen_chunks = r.u32("seen chunk count")?;
        let finished = match r.flag("finished flag")? {
            false => None,
            true => Some(Finished {
                at: r.i64("finish time")?,
                reason: r.string("finish reason")?,
            }),
        };
        // Optional, last: absent in records written before it existed.
        let resume = match r.pos < r.buf.len() {
            false => None,
            true => Some(Bytes::copy_from_slice(r.bytes("poller resume state")?)),
        };
        let conditions = match r.pos < r.buf.len() {
            false => None,
            true => Some(Bytes::copy_from_slice(
                r.bytes("termination condition states")?,
            )),
        };
        // An empty resume state written only to place the conditions after it is none.
        let resume = resume.filter(|r| !r.is_empty() || conditions.is_none());
        Ok(Self {
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
            resume,
            conditions,
        })
    }
}

impl SeenChunk {
    /// The value bytes: version, type, index (u32), count (u32), then each hash as 16
    /// little-endian bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_SEEN_CHUNK);
        out.extend_from_slice(&self.index.to_le_bytes());
        // At most MAX_HASHES_PER_CHUNK (checked by `new`), so it fits.
        out.extend_from_slice(&(self.hashes.len() as u32).to_le_bytes());
        for h in &self.hashes {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out
    }

    /// Bytes of [`SeenChunk::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        2 + 4 + 4 + 16 * self.hashes.len()
    }

    /// Key and value for the watch `watch_key`. Fails only for a watch key of nearly 500 KB
    /// (a full chunk is 512 KiB).
    pub fn to_entry(&self, watch_key: &[u8]) -> Result<StateEntry, TooLarge> {
        StateEntry::checked(state_key(watch_key, Part::Seen(self.index)), self.encode())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let index = r.u32("chunk index")?;
        let at = r.pos;
        let count = r.u32("hash count")? as usize;
        if count > MAX_HASHES_PER_CHUNK {
            return Err(DecodeError::Invalid {
                at,
                field: "hash count",
                detail: format!("{count} hashes exceed the limit of {MAX_HASHES_PER_CHUNK}"),
            });
        }
        // Taken in one piece first, so a count the bytes cannot hold allocates nothing.
        let raw = r.take(16 * count, "hashes")?;
        let hashes = raw
            .chunks_exact(16)
            .map(|b| OutputHash::from_le_bytes(b.try_into().unwrap_or([0; 16])))
            .collect();
        Ok(Self { index, hashes })
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

/// A length-prefixed byte string: u32 little-endian length, then the bytes.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a state record field of 4 GiB or more");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads fields front to back, naming the field and byte offset of whatever goes wrong.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(DecodeError::Truncated {
                at: self.pos,
                field,
                needed: n,
                available,
            });
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, field)?;
        let mut a = [0; N];
        a.copy_from_slice(bytes);
        Ok(a)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_le_bytes)
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_le_bytes)
    }

    /// A presence byte: 0 or 1, nothing else.
    fn flag(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::Invalid {
                at,
                field,
                detail: format!("{other} is neither 0 nor 1"),
            }),
        }
    }

    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u32(field)? as usize;
        self.take(len, field)
    }

    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let at = self.pos + 4;
        let bytes = self.bytes(field)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| DecodeError::Invalid {
            at,
            field,
            detail: format!("not UTF-8 ({e})"),
        })
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            count => Err(DecodeError::Trailing {
                at: self.pos,
                count,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
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
            serde_json::from_str(include_str!("../../tests/fixtures/state-v1.json")).unwrap();
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

    fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
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

    fn any_part() -> impl Strategy<Value = Part> {
        prop_oneof![Just(Part::Watch), any::<u32>().prop_map(Part::Seen)]
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
}

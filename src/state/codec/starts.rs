//! Starts records: the first records of the watches one checkpoint started, together under
//! one key (`~starts/<seq>`).

use super::fields::{put_bytes, Reader};
use super::keys::canonical_decimal;
use super::watch::WatchRecord;
use super::{DecodeError, Record, StateEntry, TooLarge, FORMAT_VERSION, TYPE_STARTS};

/// What a [`Starts`] record's key starts with: `~starts/<seq>` (`<seq>` decimal, no leading
/// zeros). It does not start with a digit, so it is no watch's key.
const STARTS_KEY_PREFIX: &[u8] = b"~starts/";

/// The first records of the watches one checkpoint started, in one record (key
/// `~starts/<seq>`, [`starts_key`]): a broker that writes records one at a time (Tansu on
/// SQLite) writes one record per checkpoint instead of one per new watch. A member is live
/// with no seen chunks. A member's own record (`<len>:<watch key>/w`), written later, takes
/// its place: whichever of the two is later on the partition wins. The record is deleted
/// once every member has its own record (see `kafka/durable/starts.rs`).
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

    pub(super) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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
pub(super) fn parse_starts_key(key: &[u8]) -> Option<Result<u32, DecodeError>> {
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

//! Seen chunks: a watch's seen set, in records of at most [`MAX_HASHES_PER_CHUNK`] hashes.

use super::fields::Reader;
use super::keys::{state_key, Part};
use super::{
    DecodeError, StateEntry, TooLarge, TooManyHashes, FORMAT_VERSION, MAX_HASHES_PER_CHUNK,
    TYPE_SEEN_CHUNK,
};
use crate::seen::OutputHash;

/// Part of one watch's seen set (key `<len>:<watch key>/s/<index>`): output-key hashes in the
/// order they were first seen, at most [`MAX_HASHES_PER_CHUNK`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenChunk {
    pub(super) index: u32,
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

    pub(super) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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

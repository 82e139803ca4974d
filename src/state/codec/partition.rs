//! The records of a partition as a whole, each under a key of its own that no watch's key
//! can be: its output offsets and its mode.

use super::fields::{put_bytes, Reader};
use super::{DecodeError, StateEntry, TooLarge, FORMAT_VERSION, TYPE_MODE, TYPE_OUTPUT_OFFSETS};

/// The key of a partition's [`OutputOffsets`] record. It does not start with a digit, so it
/// is no watch's key.
pub const OUTPUT_OFFSETS_KEY: &[u8] = b"~output-offsets";

/// The key of a partition's [`ModeRecord`]. It does not start with a digit, so it is no
/// watch's key.
pub const MODE_KEY: &[u8] = b"~mode";

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

    pub(super) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
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

    pub(super) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            mode: r.string("mode")?,
        })
    }
}

//! Durable watch state: what the state topic holds, and how a watch becomes records and back.
//!
//! The storage format, as pure code: bytes in, values out, no I/O. The bridge writes these
//! records from `kafka/durable/` (checkpoints) and reads them back in `kafka/recovery.rs`
//! (on assignment), keeping the order of writes described below.
//!
//! # The state topic
//!
//! A compacted topic with as many partitions as the input topic. A watch's records go to the
//! partition with the number of the input partition its input came from (set explicitly when
//! producing, not derived from the key), so restoring input partition `p` reads state
//! partition `p` alone. Per watch there are:
//!
//! | key                          | value                         | written                       |
//! |------------------------------|-------------------------------|-------------------------------|
//! | `<len>:<watch key>/w`        | [`WatchRecord`]               | whenever the watch changes    |
//! | `<len>:<watch key>/s/<n>`    | [`SeenChunk`] `n` (0, 1, ...) | when its hashes are new       |
//! | `~output-offsets` (one)      | [`OutputOffsets`]             | after a checkpoint's records  |
//! | `~starts/<n>` (n = 1, 2, ..) | [`Starts`]: new watches' records | a checkpoint's new watches |
//! | `~mode` (one)                | [`ModeRecord`]: the writer's guarantee | last of every batch of state writes |
//!
//! ## Keys
//!
//! `<len>` is the watch key's length in bytes, in decimal ASCII without leading zeros; the
//! watch key follows as is; then `/w` or `/s/` and the chunk number, also decimal without
//! leading zeros ([`state_key`], [`parse_state_key`]). Because the length says where the
//! watch key ends, any watch key round-trips, whatever bytes it holds (`/`, `:`, digits, not
//! UTF-8), and no two `(watch key, part)` pairs share a key. The parser accepts only this
//! canonical spelling, so each pair also has exactly one key — compaction needs that, as two
//! spellings of one record would never replace each other. A text watch key stays readable
//! in a console consumer (`7:order-1/s/0`). Keys that do not start with an ASCII digit are
//! reserved for records that are not per watch: [`OUTPUT_OFFSETS_KEY`], where a recovery
//! starts reading the output topic back, [`starts_key`]s, and [`MODE_KEY`], the guarantee
//! the partition's last writer ran (a bridge older than it logs it as unreadable and skips
//! it).
//!
//! ## Values
//!
//! Every value starts with a format version byte ([`FORMAT_VERSION`], now 1) and a record
//! type byte (1: watch record, 2: seen chunk, 3: output offsets, 4: starts, 5: mode); then fixed-width little-endian integers and
//! byte strings prefixed by a u32 little-endian length, in the order the types document
//! (`WatchRecord::encode`, `SeenChunk::encode`; the exact bytes are pinned by a test, and
//! records a real bridge wrote by `tests/fixtures/state-v1.json`). A
//! reader refuses a version it does not know, an unknown type, a value cut short, and bytes
//! left over, naming what and at which byte ([`DecodeError`]); it never panics, whatever the
//! bytes. A version newer than its own is told apart from damage
//! ([`DecodeError::NewerVersion`]): its partition stops rather than skip it ([`versions`]). A key plus value never exceeds [`MAX_RECORD_BYTES`] (1,000,000: under Kafka's
//! default 1 MiB limit); the `to_entry` functions refuse to make a larger one (only a watch
//! record whose input value is itself near 1 MB can be, and the bridge starts no watch for
//! such an input: [`Registration::check_size`]).
//!
//! - A **watch record** holds what the watch was started from (the input record's key,
//!   value and timestamp; the value is decoded again on restore to re-resolve the
//!   resource), its progress (arrival, last new output, polls, hold, next poll time, backoff
//!   and retry steps), how many seen chunks it has, and, once it ended, when and why.
//! - A **seen chunk** holds output-key hashes (XXH3-128, 16 bytes each) in the order they
//!   were first seen, at most [`MAX_HASHES_PER_CHUNK`] (512 KiB).
//!
//! ## Chunks: an update costs O(new outputs)
//!
//! Chunks of [`DEFAULT_CHUNK_HASHES`] hashes (16 KiB); full chunks are written once, and a
//! checkpoint writes only the last, partial chunk again plus new ones: `k` new outputs cost
//! at most `k + 1,023` hashes written, however many the watch has seen before. The exact
//! rule, its costs, and what a restore accepts are in [`chunks`]
//! ([`SeenJournal`]).
//!
//! ## Order of writes (for the writer)
//!
//! Kafka keeps the order of records in a partition, and compaction keeps the latest value
//! per key, so the restore sees each key's last write. The writer keeps these orders:
//!
//! 1. A watch's first watch record is written when it starts, before any of its chunks:
//!    its own, or, for watches one checkpoint started with nothing seen, in a [`Starts`]
//!    record with theirs. Per watch, whichever of its own record (or tombstone) and the
//!    starts records listing it is later on the partition is its latest. A starts record
//!    is deleted once every member has a later record of its own, and a watch's own record
//!    is deleted only after every starts record that may list it (see `kafka/durable/starts.rs`).
//! 2. A checkpoint writes a watch's chunks first, in index order, then its watch record
//!    listing them; and it writes a hash only once the output it stands for is
//!    acknowledged by the output topic. A crash in between leaves chunks the record does
//!    not list yet; the restore keeps them (their outputs were delivered), so it needs the
//!    chunks to run `0..m` without a gap with `m` at least the listed count.
//! 3. When a watch ends, its watch record is rewritten as finished (listing no chunks), then
//!    its chunks are deleted (tombstones: a key with no value). A finished watch's record
//!    stays until the finished retention passes, so a re-delivered input does not start it
//!    again; then it is deleted too. A restore deletes chunks it finds without a live watch
//!    record (left by a crash during step 3). A watch that ended `failed` is the exception:
//!    its chunks are written first, then its record, finished as `failed` and listing them;
//!    both stay for the retention (a re-delivered input starts it again knowing them), and
//!    are deleted after. Started again, it writes its chunks from 0 again, then its record,
//!    then deletes chunks of the earlier run past the new count.
//!
//! 4. A checkpoint's output-offsets record goes last, and is produced only once every other
//!    record of its checkpoint is acknowledged (in the exactly-once mode: in the same
//!    transaction), so it never vouches for a chunk that is not on the topic. Its offsets
//!    pass an output only once that output and every output sent before it are handled,
//!    and rise to the output topic's end offsets once nothing below them is unhandled.
//! 5. A partition that is no longer the instance's (its assignment lost, or its task
//!    outliving the revocation) writes nothing more; a failed output is never written again
//!    as a new record (`kafka/partition/delivery.rs`).
//!
//! Tombstones read back as [`Entry::Tombstone`].
//!
//! ## What is not saved
//!
//! The states of user termination conditions, the jitter random source, the poller's
//! resolved input, and the rules themselves; see [`snapshot`].
//!
//! ## Known cost
//!
//! The watch record carries the input record's value, so a watch whose progress changes on
//! every poll rewrites its input value every poll, and the bridge must keep that value in
//! memory for as long as the watch runs. If inputs are large, splitting the registration
//! (written once) from the progress (small, rewritten) would be a new record type and key
//! part, and a format version step.

pub mod chunks;
pub mod codec;
pub mod snapshot;
pub mod versions;

pub use chunks::{RestoreError, SeenJournal, DEFAULT_CHUNK_HASHES};
pub use codec::{
    decode_entry, parse_state_key, starts_key, state_key, DecodeError, Entry, Finished, ModeRecord,
    OutputOffsets, Part, Record, SeenChunk, Starts, StateEntry, TooLarge, TooManyHashes,
    WatchRecord, FORMAT_VERSION, MAX_HASHES_PER_CHUNK, MAX_RECORD_BYTES, MODE_KEY,
    OUTPUT_OFFSETS_KEY,
};
pub use snapshot::{Registration, FINISHED_REASON_ROOM};
pub use versions::{NewerRecord, NewerState};

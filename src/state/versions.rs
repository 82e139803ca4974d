//! Which state format versions a build reads and writes, and what a partition does with a
//! record that a newer build wrote.
//!
//! - A build writes [`FORMAT_VERSION`] and reads it and every older version (version 1 is
//!   the first: this build reads 1 and writes 1).
//! - A record of a **newer** version is not damage: it is state this build cannot read. Its
//!   partition's recovery stops the partition rather than skip the record (which would lose
//!   that watch: its input is committed, and the watch's next record would overwrite the
//!   newer one). The partition starts nothing, reads and commits no input and writes
//!   nothing to the state topic, so compaction keeps the newer record; it is tried again
//!   after a backoff (`kafka/delayed_restart.rs`), so the partition recovers by itself once
//!   an instance that reads it owns it (a roll forward, or the rest of a rolling upgrade).
//!   The other partitions go on.
//! - A **damaged** record of a known version (cut short, an unknown type, bytes left over)
//!   is skipped and counted, as before: stopping would not mend it.
//!
//! A future format change (version 2) rolls out in two steps, as Kafka Streams'
//! `upgrade.from` does: the release that brings it reads versions 1 and 2 but still writes
//! 1 until told otherwise (a setting of the version to write, defaulting to the old one); once
//! every instance runs it, a second rolling restart sets that setting, and only then are
//! version-2 records written. A rollback to the previous release stays possible until that
//! second step. No such setting exists yet: with one version there is nothing to choose.

use super::codec::{parse_state_key, FORMAT_VERSION};

/// A state record written by a newer format version, as a partition's recovery found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerRecord {
    /// Its key on the state topic.
    pub key: Vec<u8>,
    /// Its offset in its state partition.
    pub offset: i64,
    /// The format version it was written by.
    pub version: u8,
}

/// The records of newer format versions in one state partition: why the partition stays
/// stopped. Says which record (the first on the partition), which versions, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerState {
    pub state_topic: String,
    pub partition: i32,
    /// The first such record on the partition.
    pub first: NewerRecord,
    /// How many there are in all.
    pub count: usize,
}

impl NewerState {
    /// `None` if `found` is empty: the partition can be restored.
    pub fn of(state_topic: &str, partition: i32, found: &[NewerRecord]) -> Option<Self> {
        let first = found.iter().min_by_key(|r| r.offset)?.clone();
        Some(Self {
            state_topic: state_topic.to_string(),
            partition,
            first,
            count: found.len(),
        })
    }

    /// The record, its watch key if it is a watch's, and where it is.
    fn record(&self) -> String {
        let key = String::from_utf8_lossy(&self.first.key);
        let watch = match parse_state_key(&self.first.key) {
            Ok((watch_key, _)) => {
                format!(" (watch key `{}`)", String::from_utf8_lossy(watch_key))
            }
            Err(_) => String::new(),
        };
        format!(
            "`{key}`{watch} at offset {} of {}/{}",
            self.first.offset, self.state_topic, self.partition
        )
    }

    /// The others, if any.
    fn more(&self) -> String {
        match self.count {
            0 | 1 => String::new(),
            n => format!(" (and {} more record(s) of a newer version)", n - 1),
        }
    }

    /// What `/readyz` says the partition waits for (after "waiting to read").
    pub fn waiting_for(&self) -> String {
        format!(
            "its state, which holds a record written by state format version {} ({}){}; this \
             build reads version {FORMAT_VERSION}: upgrade watchbridge \
             (docs/operations.md#upgrading); tried again after a backoff",
            self.first.version,
            self.record(),
            self.more()
        )
    }
}

impl std::fmt::Display for NewerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state record {} was written by state format version {}; this build reads \
             version {FORMAT_VERSION}: upgrade watchbridge (docs/operations.md#upgrading){}. \
             Input partition {} stays stopped — its watches do not run, its inputs are not \
             read or committed, nothing is written to its state — and is tried again after a \
             backoff; the other partitions go on",
            self.record(),
            self.first.version,
            self.more(),
            self.partition,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_record_the_watch_the_partition_and_both_versions() {
        let found = [
            NewerRecord {
                key: b"~mode".to_vec(),
                offset: 9,
                version: 2,
            },
            NewerRecord {
                key: b"6:user-5/w".to_vec(),
                offset: 4,
                version: 2,
            },
        ];
        assert_eq!(NewerState::of("g.state", 1, &[]), None);
        let newer = NewerState::of("g.state", 1, &found).unwrap();
        assert_eq!(
            newer.to_string(),
            "state record `6:user-5/w` (watch key `user-5`) at offset 4 of g.state/1 was \
             written by state format version 2; this build reads version 1: upgrade \
             watchbridge (docs/operations.md#upgrading) (and 1 more record(s) of a newer \
             version). Input partition 1 stays stopped — its watches do not run, its inputs \
             are not read or committed, nothing is written to its state — and is tried again \
             after a backoff; the other partitions go on"
        );
        let alone = NewerState::of("g.state", 1, &found[..1]).unwrap();
        assert_eq!(
            alone.waiting_for(),
            "its state, which holds a record written by state format version 2 (`~mode` at \
             offset 9 of g.state/1); this build reads version 1: upgrade watchbridge \
             (docs/operations.md#upgrading); tried again after a backoff"
        );
    }
}

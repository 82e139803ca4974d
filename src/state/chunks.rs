//! Which of a watch's seen hashes are durable, and the chunk records that make the rest so.
//!
//! # The chunk rule
//!
//! A watch's hashes are laid out, in the order they were first seen, in chunks of
//! `capacity` hashes: chunk 0 holds the first `capacity`, chunk 1 the next, and so on; only
//! the last chunk may hold fewer. A chunk that is full is **sealed**: it is written once and
//! never again. The last chunk, while not full, is the **tail**: the journal keeps its hashes
//! in memory (at most `capacity - 1` once checkpointed) together with the hashes added since
//! the last checkpoint.
//!
//! A checkpoint writes, in increasing index order, every chunk that holds a hash added since
//! the previous checkpoint: the tail again (its durable hashes plus new ones) and then new
//! chunks. So a checkpoint with `k` new hashes writes at most `k + capacity - 1` hashes, in at
//! most one chunk that is not full (the last one written), and nothing at all when `k = 0`.
//!
//! A watch that has found nothing new for a while lets its durable tail go
//! ([`SeenJournal::release_tail`]): the tail counts as sealed from then on, short as it is,
//! and the next new hash starts a new chunk. So only watches that keep finding outputs hold
//! a tail in memory.
//!
//! Costs, with `capacity` = [`DEFAULT_CHUNK_HASHES`] (1,024 hashes, 16 KiB a record):
//! - memory: the tail's hashes are held twice (here and in the seen set), at most 16 KiB per
//!   watch — for a watch with fewer than 1,024 outputs that doubles its seen-set memory —
//!   until it is released;
//! - writes: a watch that finds one new output per checkpoint rewrites its tail each time,
//!   about 8 KiB per output on average. A larger capacity means fewer records per watch
//!   but more of both (32,768 would make those 512 KiB and 256 KiB); 1,024 keeps a watch
//!   with a million outputs at about 1,000 records, which a restore reads in one pass.
//!
//! # Restoring
//!
//! [`SeenJournal::restore`] takes a watch's chunk records in any order (the latest value per
//! key, as compaction leaves them) and rebuilds its seen set and journal. The chunks must be
//! numbered `0..m` without a gap, and `m` must be at least the count the watch record lists;
//! `m` may be larger (a checkpoint that wrote its chunks but not the watch record after
//! them), and such chunks are kept: their hashes are of outputs already delivered. The last
//! chunk, if it is not full, becomes the tail; every other chunk counts as sealed even if it is
//! short (it would be if the capacity grew between runs; it costs only space).

use super::codec::{SeenChunk, MAX_HASHES_PER_CHUNK};
use crate::seen::{OutputHash, SeenSet};

/// Hashes per seen chunk unless configured otherwise: 16 KiB records (see the module doc).
pub const DEFAULT_CHUNK_HASHES: u32 = 1_024;

/// What a watch's seen chunks on the state topic hold, and what they are still missing.
///
/// Feed it every hash the watch's [`SeenSet`] newly inserts ([`SeenJournal::add`]); a
/// [`SeenJournal::checkpoint`] returns the chunk records to write. Those count as durable
/// from then on: if writing them fails, the caller must not go on with this journal but
/// restore the watch from the topic (or rewrite them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenJournal {
    /// Hashes per chunk.
    capacity: u32,
    /// Chunks `0..sealed` are full and durable; the journal holds none of their hashes.
    sealed: u32,
    /// The hashes of chunk `sealed` onwards, if any. Boxed: most watches have none (an
    /// idle watch's tail is released), and every live watch holds a journal, so this is 8
    /// bytes in each instead of 28.
    tail: Option<Box<Unsealed>>,
}

/// A journal's hashes from its first chunk not sealed: the first `durable` are durable,
/// the rest new.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Unsealed {
    hashes: Vec<OutputHash>,
    durable: u32,
}

/// A watch's seen chunks do not add up to a seen set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("seen chunk {0} appears twice")]
    Duplicate(u32),
    #[error(
        "seen chunk {missing} is missing ({found} chunk(s) found, the watch record lists {listed})"
    )]
    Missing {
        missing: u32,
        found: usize,
        listed: u32,
    },
}

impl Default for SeenJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl SeenJournal {
    /// A journal for a new watch, with [`DEFAULT_CHUNK_HASHES`] per chunk.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CHUNK_HASHES)
    }

    /// A journal for a new watch with `capacity` hashes per chunk.
    ///
    /// # Panics
    /// If `capacity` is 0 or above [`MAX_HASHES_PER_CHUNK`].
    pub fn with_capacity(capacity: u32) -> Self {
        assert!(
            (1..=MAX_HASHES_PER_CHUNK as u32).contains(&capacity),
            "seen chunk capacity {capacity} outside 1..={MAX_HASHES_PER_CHUNK}"
        );
        Self {
            capacity,
            sealed: 0,
            tail: None,
        }
    }

    /// Durable hashes in the tail.
    fn durable(&self) -> u32 {
        self.tail.as_ref().map_or(0, |t| t.durable)
    }

    /// Hashes per chunk.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Note a hash the seen set has just inserted (one it did not hold before: the journal
    /// does not check, and would write a repeat twice).
    pub fn add(&mut self, hash: OutputHash) {
        self.tail.get_or_insert_default().hashes.push(hash);
    }

    /// Hashes added since the last checkpoint.
    pub fn pending(&self) -> usize {
        self.tail
            .as_ref()
            .map_or(0, |t| t.hashes.len() - t.durable as usize)
    }

    /// Chunks on the topic as of the last checkpoint (or restore): what the watch record
    /// written with that checkpoint lists as `seen_chunks`.
    pub fn chunks(&self) -> u32 {
        self.sealed + u32::from(self.durable() > 0)
    }

    /// The chunk records that make every added hash durable, in index order: the tail again
    /// if it held durable hashes, then new chunks, all full but the last. Empty if nothing
    /// was added since the last checkpoint.
    pub fn checkpoint(&mut self) -> Vec<SeenChunk> {
        let Some(tail) = self
            .tail
            .as_mut()
            .filter(|t| t.hashes.len() > t.durable as usize)
        else {
            return Vec::new();
        };
        let capacity = self.capacity as usize;
        let written: Vec<SeenChunk> = tail
            .hashes
            .chunks(capacity)
            .zip(self.sealed..)
            .map(|(hashes, index)| {
                SeenChunk::new(index, hashes.to_vec())
                    .expect("a piece holds at most `capacity` <= MAX_HASHES_PER_CHUNK hashes")
            })
            .collect();
        let full = tail.hashes.len() / capacity;
        tail.hashes.drain(..full * capacity);
        tail.hashes.shrink_to_fit();
        tail.durable = tail.hashes.len() as u32;
        self.sealed += full as u32;
        if tail.hashes.is_empty() {
            self.tail = None;
        }
        written
    }

    /// Rebuild a watch's seen set and journal from its chunk records (any order) and the
    /// chunk count its watch record lists. See the module doc for what is accepted.
    pub fn restore(
        chunks: impl IntoIterator<Item = SeenChunk>,
        listed: u32,
        capacity: u32,
    ) -> Result<(SeenSet, SeenJournal), RestoreError> {
        Self::restore_or_return(chunks.into_iter().collect(), listed, capacity).map_err(|(e, _)| e)
    }

    /// [`SeenJournal::restore`], giving the chunks back with the error: a recovery that
    /// finds them inconsistent still keeps every hash they hold, and need not copy them all
    /// beforehand in case (a restore reads back up to a hundred million hashes).
    pub fn restore_or_return(
        mut chunks: Vec<SeenChunk>,
        listed: u32,
        capacity: u32,
    ) -> Result<(SeenSet, SeenJournal), (RestoreError, Vec<SeenChunk>)> {
        let mut journal = Self::with_capacity(capacity);
        chunks.sort_unstable_by_key(SeenChunk::index);
        if let Some(pair) = chunks.windows(2).find(|p| p[0].index() == p[1].index()) {
            let duplicate = pair[0].index();
            return Err((RestoreError::Duplicate(duplicate), chunks));
        }
        let found = chunks.len();
        // Sorted and distinct, so chunk i is at position i unless one below it is missing.
        let gap = chunks
            .iter()
            .zip(0u32..)
            .find(|(c, i)| c.index() != *i)
            .map(|(_, i)| i);
        if let Some(missing) = gap.or((found < listed as usize).then_some(found as u32)) {
            let error = RestoreError::Missing {
                missing,
                found,
                listed,
            };
            return Err((error, chunks));
        }
        if let Some(last) = chunks.last() {
            if last.hashes().len() < capacity as usize {
                journal.tail = Some(Box::new(Unsealed {
                    hashes: last.hashes().to_vec(),
                    durable: last.hashes().len() as u32,
                }));
            }
        }
        // Every chunk but a tail is sealed. (`found` fits: the indexes are distinct u32s.)
        journal.sealed = found as u32 - u32::from(journal.durable() > 0);
        // One allocation of the exact size, which the set keeps (a single chunk's own).
        let hashes = match <[SeenChunk; 1]>::try_from(chunks) {
            Ok([only]) => only.into_hashes(),
            Err(chunks) => {
                let mut all = Vec::with_capacity(chunks.iter().map(|c| c.hashes().len()).sum());
                for chunk in &chunks {
                    all.extend_from_slice(chunk.hashes());
                }
                all
            }
        };
        Ok((SeenSet::from_hashes(hashes), journal))
    }

    /// Stop holding the tail, which must be durable (nothing pending): it counts as sealed,
    /// and the next hash added starts a new chunk. For a watch with nothing new for a
    /// while, whose tail would otherwise stay in memory twice (here and in its seen set) for
    /// as long as it lives. Returns whether there was a tail to release.
    pub fn release_tail(&mut self) -> bool {
        if self.durable() == 0 || self.pending() > 0 {
            return false;
        }
        self.sealed += 1;
        self.tail = None;
        true
    }

    /// Heap bytes held (the tail's box and capacity).
    pub fn heap_bytes(&self) -> usize {
        self.tail.as_ref().map_or(0, |t| {
            std::mem::size_of::<Unsealed>()
                + t.hashes.capacity() * std::mem::size_of::<OutputHash>()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    /// The latest chunk of each index, as a compacted topic would hold them.
    type Topic = BTreeMap<u32, Vec<OutputHash>>;

    fn write(topic: &mut Topic, chunks: &[SeenChunk]) {
        for c in chunks {
            topic.insert(c.index(), c.hashes().to_vec());
        }
    }

    fn restore_from(topic: &Topic, listed: u32, capacity: u32) -> (SeenSet, SeenJournal) {
        // Reversed, so "any order" is exercised.
        let chunks = topic
            .iter()
            .rev()
            .map(|(&i, h)| SeenChunk::new(i, h.clone()).unwrap());
        SeenJournal::restore(chunks, listed, capacity).unwrap()
    }

    fn sorted(s: &SeenSet) -> Vec<OutputHash> {
        let mut v: Vec<OutputHash> = s.iter().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn checkpoints_rewrite_the_tail_and_seal_full_chunks() {
        let mut j = SeenJournal::with_capacity(3);
        assert!(j.checkpoint().is_empty(), "nothing added, nothing written");
        j.add(1);
        j.add(2);
        assert_eq!(j.pending(), 2);
        assert_eq!(j.checkpoint(), vec![SeenChunk::new(0, vec![1, 2]).unwrap()]);
        assert_eq!((j.chunks(), j.pending()), (1, 0));
        for h in 3..=8 {
            j.add(h);
        }
        // The tail is written again with its new hash, then one full and one partial chunk.
        assert_eq!(
            j.checkpoint(),
            vec![
                SeenChunk::new(0, vec![1, 2, 3]).unwrap(),
                SeenChunk::new(1, vec![4, 5, 6]).unwrap(),
                SeenChunk::new(2, vec![7, 8]).unwrap(),
            ]
        );
        assert!(j.checkpoint().is_empty());
        j.add(9);
        j.add(10);
        // Sealed chunks 0 and 1 are never written again.
        assert_eq!(
            j.checkpoint(),
            vec![
                SeenChunk::new(2, vec![7, 8, 9]).unwrap(),
                SeenChunk::new(3, vec![10]).unwrap(),
            ]
        );
        assert_eq!(j.chunks(), 4);
        assert_eq!(
            j.heap_bytes(),
            16 + std::mem::size_of::<Unsealed>(),
            "only the tail's one hash is held"
        );
    }

    #[test]
    fn restore_refuses_gaps_repeats_and_fewer_chunks_than_listed() {
        let c = |i: u32, h: &[u128]| SeenChunk::new(i, h.to_vec()).unwrap();
        let err =
            |chunks: Vec<SeenChunk>, listed| SeenJournal::restore(chunks, listed, 2).unwrap_err();
        assert_eq!(
            err(vec![c(0, &[1, 2]), c(2, &[5])], 3),
            RestoreError::Missing {
                missing: 1,
                found: 2,
                listed: 3
            }
        );
        assert_eq!(
            err(vec![c(1, &[3])], 2).to_string(),
            "seen chunk 0 is missing (1 chunk(s) found, the watch record lists 2)"
        );
        assert_eq!(
            err(vec![c(0, &[1, 2])], 2).to_string(),
            "seen chunk 1 is missing (1 chunk(s) found, the watch record lists 2)"
        );
        assert_eq!(
            err(vec![c(0, &[1, 2]), c(0, &[1, 2])], 1),
            RestoreError::Duplicate(0)
        );
        // More chunks than listed: a checkpoint wrote chunks but not its watch record.
        let (seen, j) = SeenJournal::restore(vec![c(1, &[3]), c(0, &[1, 2])], 1, 2).unwrap();
        assert_eq!(sorted(&seen), vec![1, 2, 3]);
        assert_eq!((j.chunks(), j.pending()), (2, 0));
        // Nothing at all is a watch that has seen nothing.
        let (seen, j) = SeenJournal::restore(vec![], 0, 2).unwrap();
        assert!(seen.is_empty());
        assert_eq!(j, SeenJournal::with_capacity(2));
    }

    #[test]
    fn a_refused_restore_gives_every_chunk_back() {
        // The recovery keeps the hashes of chunks it cannot restore (and rewrites them).
        let chunks = vec![
            SeenChunk::new(2, vec![5]).unwrap(),
            SeenChunk::new(0, vec![1, 2]).unwrap(),
        ];
        let (error, back) = SeenJournal::restore_or_return(chunks, 3, 2).unwrap_err();
        assert!(matches!(error, RestoreError::Missing { missing: 1, .. }));
        let mut hashes: Vec<u128> = back.into_iter().flat_map(SeenChunk::into_hashes).collect();
        hashes.sort_unstable();
        assert_eq!(hashes, vec![1, 2, 5]);
    }

    #[test]
    fn restore_under_another_capacity_only_appends_to_a_short_last_chunk() {
        let chunks = || {
            vec![
                SeenChunk::new(0, vec![1, 2]).unwrap(),
                SeenChunk::new(1, vec![3]).unwrap(),
            ]
        };
        // Capacity grew to 4: chunk 0 stays sealed though short; chunk 1 takes new hashes.
        let (_, mut j) = SeenJournal::restore(chunks(), 2, 4).unwrap();
        (4..=7).for_each(|h| j.add(h));
        assert_eq!(
            j.checkpoint(),
            vec![
                SeenChunk::new(1, vec![3, 4, 5, 6]).unwrap(),
                SeenChunk::new(2, vec![7]).unwrap(),
            ]
        );
        // Capacity shrank to 1: both chunks count as full.
        let (_, mut j) = SeenJournal::restore(chunks(), 2, 1).unwrap();
        j.add(4);
        assert_eq!(j.checkpoint(), vec![SeenChunk::new(2, vec![4]).unwrap()]);
    }

    #[test]
    #[should_panic(expected = "capacity 0")]
    fn a_zero_capacity_is_refused() {
        SeenJournal::with_capacity(0);
    }

    proptest! {
        /// After every checkpoint the chunks on the topic, in index order, are exactly the
        /// hashes added so far in the order added; a checkpoint writes nothing without new
        /// hashes, else consecutive chunks from the old tail on, all full but the last, and at
        /// most `new + capacity - 1` hashes; and a restore from the topic is the same journal.
        #[test]
        fn checkpoints_write_only_new_hashes_and_one_partial_chunk(
            capacity in 1u32..6,
            batches in prop::collection::vec(prop::collection::vec(0u128..500, 0..14), 1..20),
        ) {
            let mut j = SeenJournal::with_capacity(capacity);
            let mut seen = SeenSet::new();
            let mut topic = Topic::new();
            let mut order: Vec<OutputHash> = Vec::new();
            let cap = capacity as usize;
            for batch in batches {
                let before = j.chunks();
                let old_tail_partial = topic.values().last().is_some_and(|h| h.len() < cap);
                let mut new = 0;
                for h in batch {
                    if seen.insert(h) {
                        j.add(h);
                        order.push(h);
                        new += 1;
                    }
                }
                prop_assert_eq!(j.pending(), new);
                let written = j.checkpoint();
                prop_assert_eq!(j.pending(), 0);
                if new == 0 {
                    prop_assert!(written.is_empty());
                    continue;
                }
                let first = before - u32::from(old_tail_partial);
                let indexes: Vec<u32> = written.iter().map(SeenChunk::index).collect();
                let expected: Vec<u32> = (first..first + written.len() as u32).collect();
                prop_assert_eq!(indexes, expected, "consecutive from the old tail");
                let (last, rest) = written.split_last().unwrap();
                prop_assert!(rest.iter().all(|c| c.hashes().len() == cap), "only the last is partial");
                prop_assert!(!last.hashes().is_empty() && last.hashes().len() <= cap);
                let hashes: usize = written.iter().map(|c| c.hashes().len()).sum();
                prop_assert!(hashes < new + cap, "{} hashes written for {} new", hashes, new);

                write(&mut topic, &written);
                let all: Vec<OutputHash> = topic.values().flatten().copied().collect();
                prop_assert_eq!(&all, &order);
                prop_assert_eq!(j.chunks() as usize, topic.len());
                prop_assert!(
                    j.heap_bytes() < 16 * cap + std::mem::size_of::<Unsealed>(),
                    "only a partial tail is held"
                );

                let (restored_seen, restored) = restore_from(&topic, j.chunks(), capacity);
                prop_assert_eq!(sorted(&restored_seen), sorted(&seen));
                prop_assert_eq!(&restored, &j);
            }
            let distinct: HashSet<OutputHash> = order.iter().copied().collect();
            prop_assert_eq!(distinct.len(), order.len(), "no hash written twice");
        }

        /// A journal restored mid-way writes exactly what the original goes on to write.
        #[test]
        fn a_restored_journal_continues_like_the_original(
            capacity in 1u32..6,
            before in prop::collection::vec(0u128..1_000, 0..40),
            after in prop::collection::vec(prop::collection::vec(1_000u128..2_000, 0..9), 0..6),
        ) {
            let mut j = SeenJournal::with_capacity(capacity);
            let mut topic = Topic::new();
            let mut seen = SeenSet::new();
            for h in before {
                if seen.insert(h) {
                    j.add(h);
                }
            }
            write(&mut topic, &j.checkpoint());
            let (_, mut restored) = restore_from(&topic, j.chunks(), capacity);
            for batch in after {
                let mut fresh = HashSet::new();
                for h in batch.into_iter().filter(|h| fresh.insert(*h)) {
                    j.add(h);
                    restored.add(h);
                }
                prop_assert_eq!(restored.checkpoint(), j.checkpoint());
            }
        }
    }

    #[test]
    fn a_released_tail_counts_as_sealed_and_the_next_hash_starts_a_new_chunk() {
        let h = |n: u8| OutputHash::from_le_bytes([n; 16]);
        let mut j = SeenJournal::with_capacity(4);
        j.add(h(1));
        j.add(h(2));
        assert!(!j.release_tail(), "nothing durable yet");
        let first = j.checkpoint();
        assert_eq!(first.len(), 1);
        assert_eq!(j.chunks(), 1);
        assert!(j.release_tail());
        assert_eq!(j.heap_bytes(), 0, "the tail's hashes are gone");
        assert_eq!(
            j.chunks(),
            1,
            "the watch record still lists the same chunks"
        );
        assert!(!j.release_tail(), "nothing left to release");
        j.add(h(3));
        let second = j.checkpoint();
        assert_eq!(second.len(), 1);
        assert_eq!(
            second[0].index(),
            1,
            "a new chunk, not a rewrite of chunk 0"
        );
        assert_eq!(second[0].hashes(), &[h(3)]);
        // Restoring takes the short chunk 0 as sealed and chunk 1 as the tail.
        let (seen, restored) = SeenJournal::restore(first.into_iter().chain(second), 2, 4).unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(restored.chunks(), 2);
    }
}

//! The set of outputs a watch has already emitted, remembered as key hashes.
//!
//! Beam's `Watch` keeps a murmur3-128 hash of each encoded output key. We use XXH3-128
//! (`xxhash_rust::xxh3::xxh3_128`):
//! - fast (tens of GB/s) and pure Rust, with no further dependencies;
//! - its output is fixed by the XXH3 specification and identical on every platform and crate
//!   version, which matters because these hashes will be persisted to a Kafka state topic and
//!   read back by a later (possibly upgraded) process;
//! - 128 bits, so an accidental collision among `n` keys has probability about `n² / 2^129`,
//!   negligible at any realistic size.
//!
//! It is not collision-resistant against an adversary who controls the keys (neither is Beam's
//! murmur3): such an adversary could make a new output look already seen and so suppress it.
//!
//! Memory is the constraint: a long-lived watch can see millions of outputs, and a
//! `HashSet<u128>` costs about 19–39 bytes per entry (a control byte per slot, at most 7/8
//! load, and half empty just after it doubles). A [`SeenSet`] is a sorted, exactly sized base
//! plus a small sorted buffer of recent inserts, so it costs 16 bytes per entry plus a buffer
//! of about `sqrt(2n)` entries.

use crate::poll::Output;

pub use crate::identity::{hash_identity, hash_key, OutputHash};

/// A set of output hashes, at about 16 bytes per entry.
///
/// `base` is sorted and exactly sized (a boxed slice has no spare capacity). `recent` is sorted,
/// disjoint from `base` and holds at most `recent_limit(base.len())` entries, with capacity
/// bounded by the same limit. When an insert would exceed the limit, `recent` (and the new
/// hashes) are merged into `base` in place. The limit is about `sqrt(2 * base.len())`, which
/// balances the two insert costs (shifting within `recent` vs. rewriting `base` on a merge): an
/// insert costs amortised `O(sqrt n)` element moves (about 1,400 at a million entries), not a
/// copy of the whole set.
///
/// A watch that has seen nothing yet pays one pointer for its set (a million idle watches
/// are common); the two lists live behind it once there is something to remember.
#[derive(Debug, Default, Clone)]
pub struct SeenSet {
    lists: Option<Box<Lists>>,
}

#[derive(Debug, Default, Clone)]
struct Lists {
    base: Box<[OutputHash]>,
    recent: Vec<OutputHash>,
}

/// Two sets are equal when they hold the same hashes (however they are laid out).
impl PartialEq for SeenSet {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|h| other.contains(h))
    }
}

impl Eq for SeenSet {}

/// Most entries `recent` may hold (and its most capacity) for a base of `base_len` entries.
fn recent_limit(base_len: usize) -> usize {
    // f64 is exact enough here: the limit only needs to be deterministic and about sqrt(2n).
    (((base_len as f64) * 2.0).sqrt() as usize).max(8)
}

impl SeenSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.lists.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, h: OutputHash) -> bool {
        self.lists.as_ref().is_some_and(|l| l.contains(h))
    }

    /// true if h was not in the set (and is now)
    pub fn insert(&mut self, h: OutputHash) -> bool {
        self.lists.get_or_insert_with(Box::default).insert(h)
    }

    /// heap bytes currently allocated by this set (capacity, not length)
    pub fn heap_bytes(&self) -> usize {
        self.lists
            .as_ref()
            .map_or(0, |l| std::mem::size_of::<Lists>() + l.heap_bytes())
    }

    /// every hash, in any order (a later state checkpoint serialises them)
    pub fn iter(&self) -> impl Iterator<Item = OutputHash> + '_ {
        self.lists.iter().flat_map(|l| l.iter())
    }

    /// A set of `hashes` (repeats count once), built with one sort rather than an insert
    /// each: restoring a watch from the state topic hands over all its hashes at once, and
    /// inserting a million of them one by one would cost about a million element moves each
    /// (`insert` is amortised `O(sqrt n)`). The result is exactly sized, like a merged base.
    pub fn from_hashes(hashes: impl IntoIterator<Item = OutputHash>) -> Self {
        let mut all: Vec<OutputHash> = hashes.into_iter().collect();
        if all.is_empty() {
            return Self::default();
        }
        all.sort_unstable();
        all.dedup();
        Self {
            lists: Some(Box::new(Lists {
                base: all.into_boxed_slice(),
                recent: Vec::new(),
            })),
        }
    }

    /// Dedup one poll: keep the outputs whose key hash is not in the set, count a key repeated
    /// inside `outputs` once (the first occurrence wins), insert the new hashes, and return the
    /// new outputs sorted by event time (stable sort: ties keep poll order).
    pub fn take_new(&mut self, outputs: Vec<Output>) -> Vec<Output> {
        self.take_new_up_to(outputs, usize::MAX).0
    }

    /// [`SeenSet::take_new`], keeping at most `max` new outputs (the earliest by event
    /// time, ties in poll order): those are returned first and marked seen; the rest are
    /// returned second, in the same order, and not marked (so a later poll finds them new).
    pub fn take_new_up_to(
        &mut self,
        outputs: Vec<Output>,
        max: usize,
    ) -> (Vec<Output>, Vec<Output>) {
        if outputs.is_empty() {
            return (outputs, Vec::new());
        }
        self.lists
            .get_or_insert_with(Box::default)
            .take_new(outputs, max)
    }
}

#[cfg(test)]
impl SeenSet {
    /// Tests insert pre-sorted batches directly, as `take_new` does.
    fn add_new_sorted(&mut self, new: &[OutputHash]) {
        self.lists
            .get_or_insert_with(Box::default)
            .add_new_sorted(new)
    }
}

impl Lists {
    fn len(&self) -> usize {
        self.base.len() + self.recent.len()
    }

    fn contains(&self, h: OutputHash) -> bool {
        self.recent.binary_search(&h).is_ok() || self.base.binary_search(&h).is_ok()
    }

    /// true if h was not in the set (and is now)
    fn insert(&mut self, h: OutputHash) -> bool {
        if self.contains(h) {
            return false;
        }
        self.add_new_sorted(&[h]);
        true
    }

    /// heap bytes currently allocated by this set (capacity, not length)
    fn heap_bytes(&self) -> usize {
        std::mem::size_of::<OutputHash>() * (self.base.len() + self.recent.capacity())
    }

    /// every hash, in any order (a later state checkpoint serialises them)
    fn iter(&self) -> impl Iterator<Item = OutputHash> + '_ {
        self.base.iter().chain(self.recent.iter()).copied()
    }

    /// Dedup one poll: keep the outputs whose key hash is not in the set, count a key repeated
    /// inside `outputs` once (the first occurrence wins), insert the new hashes, and return the
    /// new outputs sorted by event time (stable sort: ties keep poll order).
    fn take_new(&mut self, outputs: Vec<Output>, max: usize) -> (Vec<Output>, Vec<Output>) {
        // (hash, poll index) of every output not seen by earlier polls.
        let mut fresh: Vec<(OutputHash, usize)> = outputs
            .iter()
            .enumerate()
            .map(|(i, o)| (o.identity(), i))
            .filter(|&(h, _)| !self.contains(h))
            .collect();
        // Sorting by (hash, index) puts a repeated key's first occurrence first; dedup keeps it.
        fresh.sort_unstable();
        fresh.dedup_by_key(|&mut (h, _)| h);

        let mut keep = vec![false; outputs.len()];
        for &(_, i) in &fresh {
            keep[i] = true;
        }
        let mut new: Vec<Output> = outputs
            .into_iter()
            .zip(keep)
            .filter_map(|(o, k)| k.then_some(o))
            .collect();
        new.sort_by_key(|o| o.event_time);
        let held = new.split_off(max.min(new.len()));
        if held.is_empty() {
            // All of them kept: `fresh` holds their hashes, sorted already.
            let hashes: Vec<OutputHash> = fresh.into_iter().map(|(h, _)| h).collect();
            self.add_new_sorted(&hashes);
        } else {
            // Capped: only the kept ones are marked (their hashes again, at most `max`).
            let mut hashes: Vec<OutputHash> = new.iter().map(Output::identity).collect();
            hashes.sort_unstable();
            self.add_new_sorted(&hashes);
        }
        (new, held)
    }

    /// Add `new`: sorted, without duplicates, and none already in the set.
    fn add_new_sorted(&mut self, new: &[OutputHash]) {
        if new.is_empty() {
            return;
        }
        let limit = recent_limit(self.base.len());
        let wanted = self.recent.len() + new.len();
        if wanted > limit {
            self.merge_into_base(new);
            return;
        }
        if wanted > self.recent.capacity() {
            // Grow geometrically, but never past the limit, so spare capacity stays small.
            let cap = (self.recent.capacity() * 2).max(4).max(wanted).min(limit);
            self.recent.reserve_exact(cap - self.recent.len());
        }
        let old = self.recent.len();
        self.recent.resize(wanted, 0);
        merge_backward(&mut self.recent, old, new, &[]);
    }

    /// Merge `recent` and `new` into `base`, keeping `base` exactly sized. `recent` is emptied
    /// but keeps its capacity, which is within the (now larger) limit.
    fn merge_into_base(&mut self, new: &[OutputHash]) {
        let mut base = Vec::from(std::mem::take(&mut self.base));
        let old = base.len();
        let total = old + self.recent.len() + new.len();
        // Exact growth; for large sets the allocator can often extend in place (mremap).
        base.reserve_exact(total - old);
        base.resize(total, 0);
        merge_backward(&mut base, old, &self.recent, new);
        self.recent.clear();
        // A no-op when capacity == len, which `reserve_exact` gives with the global allocator.
        self.base = base.into_boxed_slice();
    }
}

/// Merge sorted `a` and `b` into `dst`, whose first `filled` entries are sorted and whose
/// length is `filled + a.len() + b.len()`. Works from the back, so it needs no scratch space.
/// `a` and `b` are small next to `dst` in the common case, so each of their elements finds its
/// place by binary search and the `dst` run above it moves with one `memmove`, rather than
/// comparing element by element. All inputs are disjoint, so ties never happen.
fn merge_backward(dst: &mut [OutputHash], filled: usize, a: &[OutputHash], b: &[OutputHash]) {
    debug_assert_eq!(dst.len(), filled + a.len() + b.len());
    let (mut i, mut j, mut l) = (filled, a.len(), b.len());
    let mut k = dst.len();
    while j > 0 || l > 0 {
        let x = if l == 0 || (j > 0 && a[j - 1] > b[l - 1]) {
            j -= 1;
            a[j]
        } else {
            l -= 1;
            b[l]
        };
        let p = dst[..i].partition_point(|&v| v < x);
        let run = i - p;
        dst.copy_within(p..i, k - run);
        k -= run + 1;
        dst[k] = x;
        i = p;
    }
    // Once `a` and `b` are used up, dst[..k] is dst's own prefix, already in place.
    debug_assert_eq!(i, k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Millis;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn out(key: &str, value: &str, t: Millis) -> Output {
        Output::new(key.as_bytes().to_vec(), value.as_bytes().to_vec(), t)
    }

    fn values(outs: &[Output]) -> Vec<&[u8]> {
        outs.iter().map(|o| &o.value[..]).collect()
    }

    #[test]
    fn take_new_emits_only_unseen_outputs_across_polls() {
        let mut s = SeenSet::new();
        let first = s.take_new(vec![out("a", "a1", 1), out("b", "b1", 2)]);
        assert_eq!(values(&first), vec![&b"a1"[..], b"b1"]);
        let second = s.take_new(vec![
            out("b", "b2", 2),
            out("c", "c2", 3),
            out("a", "a2", 1),
        ]);
        assert_eq!(values(&second), vec![&b"c2"[..]]);
        assert_eq!(s.len(), 3);
        assert!(s.contains(hash_key(b"a")) && s.contains(hash_key(b"c")));
        assert!(!s.contains(hash_key(b"d")));
    }

    #[test]
    fn take_new_counts_a_repeated_key_once_keeping_the_first() {
        let mut s = SeenSet::new();
        let got = s.take_new(vec![out("k", "first", 5), out("k", "second", 1)]);
        assert_eq!(got, vec![out("k", "first", 5)]);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn take_new_sorts_by_event_time_keeping_poll_order_on_ties() {
        let mut s = SeenSet::new();
        let got = s.take_new(vec![
            out("x", "x", 30),
            out("y", "y", 10),
            out("z", "z", 20),
            out("w", "w", 10),
            out("v", "v", 30),
        ]);
        assert_eq!(values(&got), vec![&b"y"[..], b"w", b"z", b"x", b"v"]);
    }

    #[test]
    fn take_new_handles_an_empty_poll_and_an_all_seen_poll() {
        let mut s = SeenSet::new();
        assert!(s.take_new(Vec::new()).is_empty());
        assert!(s.is_empty());
        s.take_new(vec![out("a", "", 1), out("b", "", 2)]);
        assert!(s
            .take_new(vec![out("b", "", 9), out("a", "", 9)])
            .is_empty());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn insert_reports_whether_the_hash_was_new() {
        let mut s = SeenSet::new();
        assert!(s.insert(7));
        assert!(!s.insert(7));
        assert!(s.contains(7) && !s.contains(8));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn from_hashes_counts_repeats_once_and_is_exactly_sized() {
        let s = SeenSet::from_hashes([5, 3, 5, 9, 3]);
        let mut all: Vec<OutputHash> = s.iter().collect();
        all.sort_unstable();
        assert_eq!(all, vec![3, 5, 9]);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.heap_bytes(),
            std::mem::size_of::<Lists>() + 3 * std::mem::size_of::<OutputHash>()
        );
        assert_eq!(SeenSet::from_hashes([]).heap_bytes(), 0);
    }

    #[test]
    fn an_empty_set_allocates_nothing() {
        assert_eq!(SeenSet::new().heap_bytes(), 0);
        assert_eq!(SeenSet::default().heap_bytes(), 0);
    }

    /// Deterministic pseudo-random hashes (splitmix64), so the test needs no RNG.
    fn hashes(seed: u64) -> impl Iterator<Item = OutputHash> {
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        std::iter::from_fn(move || Some(((next() as u128) << 64) | next() as u128))
    }

    /// Grow a set in batches of `batch` fresh hashes, checking bytes per entry on the way.
    fn check_bytes_per_entry(batch: usize, sizes: &[usize]) {
        let mut s = SeenSet::new();
        let mut src = hashes(batch as u64);
        for &target in sizes {
            while s.len() < target {
                let mut poll: Vec<OutputHash> =
                    src.by_ref().take(batch.min(target - s.len())).collect();
                poll.sort_unstable();
                if batch == 1 {
                    assert!(s.insert(poll[0]));
                } else {
                    s.add_new_sorted(&poll);
                }
                if s.len() >= 1_000 {
                    let per = s.heap_bytes() as f64 / s.len() as f64;
                    assert!(per <= 20.0, "{per} B/entry at {} (batch {batch})", s.len());
                }
            }
            assert_eq!(s.len(), target);
        }
    }

    #[test]
    fn heap_bytes_per_entry_stay_within_20_inserting_one_at_a_time() {
        check_bytes_per_entry(1, &[1_000, 10_000, 100_000, 1_000_000]);
    }

    #[test]
    fn heap_bytes_per_entry_stay_within_20_inserting_in_batches_of_7() {
        check_bytes_per_entry(7, &[1_000, 10_000, 100_000, 1_000_000]);
    }

    #[test]
    fn heap_bytes_per_entry_stay_within_20_inserting_in_batches_of_100() {
        check_bytes_per_entry(100, &[1_000, 10_000, 100_000, 1_000_000]);
    }

    #[test]
    fn heap_bytes_per_entry_stay_within_20_through_take_new() {
        let mut s = SeenSet::new();
        for poll in 0..200u32 {
            let outs = (0..50u32)
                .map(|i| Output::new(format!("{poll}/{i}"), "", 0))
                .collect();
            s.take_new(outs);
            if s.len() >= 1_000 {
                assert!(s.heap_bytes() <= 20 * s.len());
            }
        }
        assert_eq!(s.len(), 10_000);
    }

    #[test]
    fn an_item_is_new_again_once_per_version() {
        let mut s = SeenSet::new();
        let v =
            |version: &'static str, value: &'static str| out("c1", value, 1).with_version(version);
        assert_eq!(s.take_new(vec![v("1", "first")]).len(), 1);
        assert!(s.take_new(vec![v("1", "first again")]).is_empty());
        let updated = s.take_new(vec![v("1", "first"), v("2", "edited")]);
        assert_eq!(values(&updated), vec![&b"edited"[..]]);
        assert_eq!(s.len(), 2);
    }

    /// One poll: (key index into a small alphabet, event time).
    fn polls() -> impl Strategy<Value = Vec<Vec<(u8, Millis)>>> {
        prop::collection::vec(prop::collection::vec((0u8..12, 0i64..5), 0..10), 0..12)
    }

    proptest! {
        #[test]
        fn take_new_matches_a_hashset_model(polls in polls()) {
            let mut s = SeenSet::new();
            let mut model: HashSet<Vec<u8>> = HashSet::new();
            for (p, poll) in polls.iter().enumerate() {
                // The value records where an output came from, so "first occurrence wins" shows.
                let outputs: Vec<Output> = poll
                    .iter()
                    .enumerate()
                    .map(|(i, &(k, t))| Output::new(vec![b'k', k], format!("{p}/{i}"), t))
                    .collect();
                let mut expected: Vec<Output> = outputs
                    .iter()
                    .filter(|o| model.insert(o.key.to_vec()))
                    .cloned()
                    .collect();
                expected.sort_by_key(|o| o.event_time);
                prop_assert_eq!(s.take_new(outputs), expected);
                prop_assert_eq!(s.len(), model.len());
                for k in 0u8..12 {
                    let key = [b'k', k];
                    prop_assert_eq!(s.contains(hash_key(&key)), model.contains(&key[..]));
                }
            }
            let mut all: Vec<OutputHash> = s.iter().collect();
            all.sort_unstable();
            let mut want: Vec<OutputHash> = model.iter().map(|k| hash_key(k)).collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }

        /// Big batches and a big alphabet, so merges of `recent` plus a batch into `base` happen.
        #[test]
        fn batches_match_a_hashset_model(
            batches in prop::collection::vec(prop::collection::vec(0u16..3_000, 0..300), 0..20)
        ) {
            let mut s = SeenSet::new();
            let mut model = HashSet::new();
            for batch in batches {
                let outputs: Vec<Output> =
                    batch.iter().map(|k| Output::new(k.to_le_bytes().to_vec(), "", 0)).collect();
                let expected: Vec<u16> =
                    batch.iter().copied().filter(|&k| model.insert(k)).collect();
                let got: Vec<u16> = s
                    .take_new(outputs)
                    .iter()
                    .map(|o| u16::from_le_bytes([o.key[0], o.key[1]]))
                    .collect();
                // All event times are equal, so the order is poll order.
                prop_assert_eq!(got, expected);
                prop_assert_eq!(s.len(), model.len());
            }
            for k in 0u16..3_000 {
                prop_assert_eq!(s.contains(hash_key(&k.to_le_bytes())), model.contains(&k));
            }
        }

        /// A set restored in bulk behaves like one built by inserts, also for later inserts.
        #[test]
        fn from_hashes_then_insert_matches_a_hashset_model(
            restored in prop::collection::vec(0u128..400, 0..1_000),
            later in prop::collection::vec(0u128..400, 0..400),
        ) {
            let mut s = SeenSet::from_hashes(restored.iter().copied());
            let mut model: HashSet<u128> = restored.into_iter().collect();
            prop_assert_eq!(s.len(), model.len());
            for x in later {
                prop_assert_eq!(s.insert(x), model.insert(x));
            }
            prop_assert_eq!(s.len(), model.len());
            for x in 0u128..400 {
                prop_assert_eq!(s.contains(x), model.contains(&x));
            }
        }

        #[test]
        fn insert_matches_a_hashset_model(xs in prop::collection::vec(0u128..300, 0..2_000)) {
            let mut s = SeenSet::new();
            let mut model = HashSet::new();
            for x in xs {
                prop_assert_eq!(s.insert(x), model.insert(x));
            }
            prop_assert_eq!(s.len(), model.len());
            for x in 0u128..300 {
                prop_assert_eq!(s.contains(x), model.contains(&x));
            }
        }
    }
}

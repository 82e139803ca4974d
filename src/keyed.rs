//! A map from byte keys to values that carry their own key: the values live in a slab of
//! fixed pages ([`Pages`]), found through an index of slot numbers only (a hashbrown
//! `HashTable<u32>`, keys compared against the value's own). Made for the partition task's
//! live watches: a million of them in a `HashMap<Bytes, Box<_>>` held the key twice (the
//! map's `Bytes` and the value's input) and a 40-byte bucket each, up to half of the
//! buckets empty after the table doubled; here a watch costs its slot and 4 bytes a bucket.
//!
//! A slot number stays its value's until the value is removed, so callers may keep slot
//! numbers between calls (a list of values to visit) as long as they drop them on removal.

use crate::pages::Pages;
use hashbrown::HashTable;

/// A value that holds the key it is found by.
pub trait Keyed {
    fn key(&self) -> &[u8];
}

/// Byte-keyed values in a slab (see the module's doc).
pub struct KeyedSlab<T> {
    slots: Pages<Option<T>>,
    free: Vec<u32>,
    index: HashTable<u32>,
}

impl<T> std::fmt::Debug for KeyedSlab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedSlab")
            .field("len", &self.index.len())
            .finish_non_exhaustive()
    }
}

impl<T> Default for KeyedSlab<T> {
    fn default() -> Self {
        Self {
            slots: Pages::default(),
            free: Vec::new(),
            index: HashTable::new(),
        }
    }
}

/// The hash an index of slot numbers finds a key by (here, and the engine's `table.rs`).
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// Whether an index entry's slot holds the value with `key`.
fn holds<'a, T: Keyed>(slots: &'a Pages<Option<T>>, key: &'a [u8]) -> impl Fn(&u32) -> bool + 'a {
    move |&s| slots.at(s).as_ref().is_some_and(|v| v.key() == key)
}

impl<T: Keyed> KeyedSlab<T> {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `key`'s value.
    pub fn slot_of(&self, key: &[u8]) -> Option<u32> {
        self.find(key_hash(key), key)
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.index.find(hash, holds(&self.slots, key)).copied()
    }

    pub fn get(&self, key: &[u8]) -> Option<&T> {
        self.slot_of(key).and_then(|s| self.slots.at(s).as_ref())
    }

    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut T> {
        let slot = self.slot_of(key)?;
        self.slots.at_mut(slot).as_mut()
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.slot_of(key).is_some()
    }

    /// The value in `slot`, if the slot holds one.
    pub fn at_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.slots.get_mut(slot)?.as_mut()
    }

    /// Place `value` under its key, returning its slot and the value it replaced (which had
    /// the same slot).
    pub fn insert(&mut self, value: T) -> (u32, Option<T>) {
        let hash = key_hash(value.key());
        if let Some(slot) = self.find(hash, value.key()) {
            return (slot, self.slots.at_mut(slot).replace(value));
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                *self.slots.at_mut(slot) = Some(value);
                slot
            }
            None => self.slots.push(Some(value)),
        };
        let slots = &self.slots;
        self.index.insert_unique(hash, slot, |&s| {
            key_hash(slots.at(s).as_ref().map_or(&[][..], |v| v.key()))
        });
        (slot, None)
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<T> {
        let entry = self
            .index
            .find_entry(key_hash(key), holds(&self.slots, key))
            .ok()?;
        let (slot, _) = entry.remove();
        self.free.push(slot);
        self.slots.at_mut(slot).take()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// Every value with its slot.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        (0..)
            .zip(self.slots.iter_mut())
            .filter_map(|(slot, v)| Some((slot, v.as_mut()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct V(Vec<u8>, u32);

    impl Keyed for V {
        fn key(&self) -> &[u8] {
            &self.0
        }
    }

    fn v(key: &str, n: u32) -> V {
        V(key.as_bytes().to_vec(), n)
    }

    #[test]
    fn values_are_found_by_their_own_key_and_slots_are_reused() {
        let mut m = KeyedSlab::default();
        let (a, none) = m.insert(v("a", 1));
        assert!(none.is_none());
        let (b, _) = m.insert(v("b", 2));
        assert_ne!(a, b);
        assert_eq!(m.get(b"a"), Some(&v("a", 1)));
        let (a2, old) = m.insert(v("a", 3));
        assert_eq!((a2, old), (a, Some(v("a", 1))), "replaced in place");
        assert_eq!(m.len(), 2);
        assert_eq!(m.remove(b"a"), Some(v("a", 3)));
        assert_eq!(m.remove(b"a"), None);
        assert!(m.get(b"a").is_none() && m.at_mut(a).is_none());
        let (c, _) = m.insert(v("c", 4));
        assert_eq!(c, a, "the freed slot is reused");
        assert_eq!(m.at_mut(c).map(|v| v.1), Some(4));
        let mut seen: Vec<_> = m.iter_mut().map(|(s, v)| (s, v.1)).collect();
        seen.sort();
        assert_eq!(seen, vec![(a, 4), (b, 2)]);
        assert_eq!(m.values().count(), 2);
    }

    #[test]
    fn many_keys_stay_findable_as_the_index_grows() {
        let mut m = KeyedSlab::default();
        for n in 0..10_000u32 {
            m.insert(V(n.to_le_bytes().to_vec(), n));
        }
        for n in (0..10_000u32).step_by(2) {
            assert_eq!(m.remove(&n.to_le_bytes()).map(|v| v.1), Some(n));
        }
        for n in 0..10_000u32 {
            assert_eq!(m.get(&n.to_le_bytes()).is_some(), n % 2 == 1, "{n}");
        }
        assert_eq!(m.len(), 5_000);
    }
}

//! All the watches one engine owns, and the timer queue that says which is due next.
//!
//! Sized for a million watches: watches live in a slab (fixed-size pages of slots, so
//! growing it never leaves up to half of it allocated but unused as a doubling `Vec` would;
//! slots are reused through a free list) and are found by key through an index of slot numbers only (a hashbrown
//! `HashTable<u32>`: 4 bytes a bucket, keys compared against the watch's own copy, so no
//! second copy of the key and no collision to worry about); each waiting watch has one
//! 16-byte entry in a 4-ary heap ordered by due time (half the levels of a binary heap, and
//! a node's four children in one cache line: with a million timers the heap outgrows the
//! nearer caches, and its pops' memory reads lead the engine's no-op profile). A slot's
//! generation makes a heap entry left behind by a removed watch harmless. The holds of all
//! live watches are kept in a counted multiset, so the minimum hold — what the partition's
//! watermark is held at — is known at once.

use crate::clock::Millis;
use crate::keyed::key_hash;
use crate::pages::Pages;
use crate::poll::{PollError, PollResult};
use crate::reason::TerminatedReason;
use crate::seen::SeenSet;
use crate::watch::{Backlog, Failed, Next, Polled, Progress, Watch, WatchRules};
use bytes::Bytes;
use dary_heap::QuaternaryHeap;
use hashbrown::HashTable;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A handle on a live watch, valid until the watch is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchId {
    slot: u32,
    generation: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timer {
    due: Millis,
    slot: u32,
    generation: u32,
}

/// Earliest due first; among timers due at the same millisecond, an order that changes
/// with the millisecond (the slot mixed with it), not the lowest slot. Watches deferred by a
/// host's rate limit all wait for its next token, so they come due together again and
/// again: ordered by slot, the lowest took every token and the others never polled
/// (`under_a_host_rate_every_watch_gets_its_turn` in tests/engine.rs). A FIFO sequence
/// number would be fairer still, at 8 more bytes per timer.
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due
            .cmp(&other.due)
            .then_with(|| self.turn().cmp(&other.turn()))
            .then_with(|| (self.slot, self.generation).cmp(&(other.slot, other.generation)))
    }
}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Timer {
    /// The slot scrambled by the due time (a multiply-xorshift hash): a different order of
    /// the same slots at every millisecond.
    fn turn(&self) -> u64 {
        let mut x = (u64::from(self.slot) << 32 | u64::from(self.generation)) ^ self.due as u64;
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^ (x >> 32)
    }
}

#[derive(Debug)]
struct Slot<I> {
    generation: u32,
    /// When its watch last completed a poll, in whole seconds after its input arrived, plus
    /// one (0: not since this table has it). For the operations API; it fills what was
    /// padding, so a slot stays 88 bytes.
    last_poll: u32,
    watch: Option<Watch<I>>,
}

/// A watch with this key is already live: the re-delivered input starts nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a watch with this key is already running")]
pub struct AlreadyWatching;

/// What a completed poll did, for the engine to publish.
#[derive(Debug)]
pub enum Completion {
    Polled {
        key: Bytes,
        polled: Polled,
        hold: Millis,
    },
    Failed {
        key: Bytes,
        failed: Failed,
        error: PollError,
        /// The watch's seen set when this failure ended it as `failed` (empty otherwise).
        seen: SeenSet,
    },
}

pub struct WatchTable<I> {
    rules: WatchRules,
    slots: Pages<Slot<I>>,
    free: Vec<u32>,
    by_key: HashTable<u32>,
    timers: QuaternaryHeap<Reverse<Timer>>,
    holds: BTreeMap<Millis, u32>,
    rng: fastrand::Rng,
    /// Watches an operator asked to poll now ([`WatchTable::poll_now`]), until the timers
    /// that request made stale have left the queue. Empty but for those requests, so the
    /// queue pays nothing for it otherwise.
    moved: std::collections::HashMap<WatchId, Moved>,
    /// What watches hold back for their next polls (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`):
    /// empty but for them, so that a watch's slot stays as small without a cap.
    backlogs: std::collections::HashMap<WatchId, Box<Backlog>>,
    /// How many outputs those backlogs hold (`watchbridge_outputs_held_back`).
    held_back: usize,
}

/// A watch whose timer an operator replaced.
#[derive(Debug, Clone, Copy)]
struct Moved {
    /// The due time of the one timer that counts (`None` while its poll runs: none does).
    due: Option<Millis>,
    /// Its timers still in the queue that do not count.
    stale: u32,
}

impl<I> WatchTable<I> {
    /// `seed` fixes the jitter sequence (tests); `None` seeds from the OS.
    pub fn new(rules: WatchRules, seed: Option<u64>) -> Self {
        Self {
            rules,
            slots: Pages::default(),
            free: Vec::new(),
            by_key: HashTable::new(),
            timers: QuaternaryHeap::new(),
            holds: BTreeMap::new(),
            rng: seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed),
            moved: std::collections::HashMap::new(),
            backlogs: std::collections::HashMap::new(),
            held_back: 0,
        }
    }

    pub fn rules(&self) -> &WatchRules {
        &self.rules
    }

    /// Live watches.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.find(key, key_hash(key)).is_some()
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.by_key
            .find(hash, |&slot| slot_key(slots, slot) == Some(key))
            .copied()
    }

    /// Start a watch whose first poll is due at once.
    pub fn insert(
        &mut self,
        key: Bytes,
        input: Arc<I>,
        input_time: Millis,
        now: Millis,
    ) -> Result<WatchId, AlreadyWatching>
    where
        I: Send + Sync + 'static,
    {
        let hash = key_hash(&key);
        if self.find(&key, hash).is_some() {
            return Err(AlreadyWatching);
        }
        let watch = Watch::new(key, input, input_time, now, &self.rules);
        Ok(self.add(watch, hash, now))
    }

    /// Bring back a watch saved before a restart (see [`Watch::restore`]), judged by this
    /// table's rules from its saved `progress`, deduplicating against `seen`, with its next
    /// poll due at `next_poll` (a time already past is due at once, oldest first), or at its
    /// termination deadline if that comes first ([`Watch::wake_at`]: a poll saved far away,
    /// e.g. under a long `Retry-After`, does not outlast `total` or `stable`).
    pub fn insert_restored(
        &mut self,
        key: Bytes,
        input: Arc<I>,
        seen: SeenSet,
        progress: Progress,
        conditions: Option<&[u8]>,
        next_poll: Millis,
    ) -> Result<WatchId, AlreadyWatching>
    where
        I: Send + Sync + 'static,
    {
        let hash = key_hash(&key);
        if self.find(&key, hash).is_some() {
            return Err(AlreadyWatching);
        }
        let watch = Watch::restore(key, input, seen, progress, conditions, &self.rules);
        let due = watch.wake_at(next_poll, &self.rules);
        Ok(self.add(watch, hash, due))
    }

    /// Place a watch whose key is not live yet (`hash` is its key's) and schedule it at `due`.
    fn add(&mut self, watch: Watch<I>, hash: u64, due: Millis) -> WatchId {
        self.add_hold(watch.hold());
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.slots.push(Slot {
                generation: 0,
                last_poll: 0,
                watch: None,
            }),
        };
        let entry = self.slots.at_mut(slot);
        entry.watch = Some(watch);
        entry.last_poll = 0;
        let id = WatchId {
            slot,
            generation: entry.generation,
        };
        let slots = &self.slots;
        self.by_key.insert_unique(hash, slot, |&s| {
            key_hash(slot_key(slots, s).unwrap_or_default())
        });
        self.schedule(id, due);
        id
    }

    /// When the earliest waiting watch is due, if any watch is waiting.
    pub fn next_due(&mut self) -> Option<Millis> {
        self.drop_stale_timers();
        self.timers.peek().map(|Reverse(t)| t.due)
    }

    /// Take the earliest watch due at or before `now`, with the time it was due. It is then
    /// in flight: it has no timer until [`complete`](Self::complete) or
    /// [`defer`](Self::defer) gives it one.
    pub fn pop_due(&mut self, now: Millis) -> Option<(WatchId, Millis)> {
        self.drop_stale_timers();
        match self.timers.peek() {
            Some(Reverse(t)) if t.due <= now => {
                let t = *t;
                self.timers.pop();
                let id = WatchId {
                    slot: t.slot,
                    generation: t.generation,
                };
                if let Some(moved) = self.moved.get_mut(&id) {
                    moved.due = None;
                }
                Some((
                    WatchId {
                        slot: t.slot,
                        generation: t.generation,
                    },
                    t.due,
                ))
            }
            _ => None,
        }
    }

    pub fn watch(&self, id: WatchId) -> Option<&Watch<I>> {
        let slot = self.slots.get(id.slot)?;
        (slot.generation == id.generation)
            .then_some(slot.watch.as_ref())
            .flatten()
    }

    /// Put an in-flight watch back in the queue without polling it (e.g. its host's rate
    /// limit has no token until `at`).
    pub fn defer(&mut self, id: WatchId, at: Millis) {
        // No later than its termination deadline: a host's long wait must not keep a
        // watch past `total(…)` ([`Watch::wake_at`]).
        if let Some(due) = self.watch(id).map(|w| w.wake_at(at, &self.rules)) {
            self.schedule(id, due);
        }
    }

    /// Whether a due watch should end without polling (a time-based condition fired while
    /// it waited). If so it is removed, and the reason returned.
    pub fn stop_if_done(&mut self, id: WatchId, now: Millis) -> Option<(Bytes, TerminatedReason)> {
        // Outputs held back are owed: the watch polls once more and emits them then.
        if self.backlogs.contains_key(&id) {
            return None;
        }
        let reason = self.watch(id)?.stop_before_poll(now, &self.rules)?;
        let watch = self.remove(id)?;
        Some((Bytes::copy_from_slice(watch.key()), reason))
    }

    /// Apply the outcome of an in-flight watch's poll. Returns `None` if the watch was
    /// removed meanwhile. A watch that stops is removed here (its hold released) and the
    /// returned `Next::Stop` says why.
    pub fn complete(
        &mut self,
        id: WatchId,
        outcome: Result<PollResult, PollError>,
        now: Millis,
    ) -> Option<Completion> {
        let slot = self.slots.get_mut(id.slot)?;
        if slot.generation != id.generation {
            return None;
        }
        let watch = slot.watch.as_mut()?;
        let arrived = watch.termination().arrived();
        slot.last_poll =
            u32::try_from(now.saturating_sub(arrived).max(0) / 1000 + 1).unwrap_or(u32::MAX);
        let old_hold = watch.hold();
        let (completion, next) = match outcome {
            Ok(result) => {
                let mut backlog = match self.backlogs.is_empty() {
                    true => None,
                    false => self.backlogs.remove(&id),
                };
                self.held_back -= backlog.as_ref().map_or(0, |b| b.len());
                let (rules, rng) = (&self.rules, &mut self.rng);
                let polled = watch.on_success_holding(result, now, rules, rng, &mut backlog);
                if let Some(backlog) = backlog {
                    self.held_back += backlog.len();
                    self.backlogs.insert(id, backlog);
                }
                let next = polled.next.clone();
                let hold = watch.hold();
                let key = Bytes::copy_from_slice(watch.key());
                (Completion::Polled { key, polled, hold }, next)
            }
            Err(error) => {
                let failed = watch.on_failure(&error, now, &self.rules, &mut self.rng);
                let next = failed.next.clone();
                let key = Bytes::copy_from_slice(watch.key());
                let seen = SeenSet::new();
                (
                    Completion::Failed {
                        key,
                        failed,
                        error,
                        seen,
                    },
                    next,
                )
            }
        };
        let new_hold = watch.hold();
        if new_hold != old_hold {
            self.remove_hold(old_hold);
            self.add_hold(new_hold);
        }
        let mut completion = completion;
        match next {
            Next::PollAt(at) => self.schedule(id, at),
            Next::Stop(reason) => {
                let removed = self.remove(id);
                if let (Completion::Failed { seen, .. }, TerminatedReason::Failed, Some(watch)) =
                    (&mut completion, reason, removed)
                {
                    *seen = watch.into_seen();
                }
            }
        }
        Some(completion)
    }

    /// How many new outputs the watches hold back for their next polls.
    pub fn held_back(&self) -> usize {
        self.held_back
    }

    /// Remove a watch (finished, or stopped from outside), releasing its hold.
    pub fn remove(&mut self, id: WatchId) -> Option<Watch<I>> {
        let slot = self.slots.get_mut(id.slot)?;
        if slot.generation != id.generation {
            return None;
        }
        let watch = slot.watch.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        if !self.moved.is_empty() {
            self.moved.remove(&id);
        }
        if let Some(backlog) = self.backlogs.remove(&id) {
            self.held_back -= backlog.len();
        }
        self.free.push(id.slot);
        // The index entry is found by slot number, so the slot no longer needs the key.
        if let Ok(entry) = self
            .by_key
            .find_entry(key_hash(watch.key()), |&s| s == id.slot)
        {
            entry.remove();
        }
        self.remove_hold(watch.hold());
        Some(watch)
    }

    /// When `id`'s watch last completed a poll, to the second (`None`: not since this
    /// table has it).
    pub fn last_poll(&self, id: WatchId) -> Option<Millis> {
        let slot = self.slots.get(id.slot)?;
        let watch = slot
            .watch
            .as_ref()
            .filter(|_| slot.generation == id.generation)?;
        let seconds = slot.last_poll.checked_sub(1)?;
        Some(watch.termination().arrived() + Millis::from(seconds) * 1000)
    }

    /// The live watch with this key.
    pub fn id_of(&self, key: &[u8]) -> Option<WatchId> {
        let slot = self.find(key, key_hash(key))?;
        let generation = self.slots.at(slot).generation;
        Some(WatchId { slot, generation })
    }

    /// Every live watch, in slot order (for the operations API: a walk of the slab).
    pub fn live(&self) -> impl Iterator<Item = (WatchId, &Watch<I>)> {
        (0..self.slots.len() as u32).filter_map(|slot| {
            let s = self.slots.at(slot);
            let id = WatchId {
                slot,
                generation: s.generation,
            };
            s.watch.as_ref().map(|w| (id, w))
        })
    }

    /// When each waiting watch is due (`None` for a watch in flight, whose poll runs): one
    /// walk of the timer queue, for the operations API.
    pub fn due_times(&self) -> std::collections::HashMap<WatchId, Millis> {
        let mut due = std::collections::HashMap::new();
        for Reverse(t) in self.timers.iter() {
            let id = WatchId {
                slot: t.slot,
                generation: t.generation,
            };
            if self.is_current(t) {
                let at = due.entry(id).or_insert(t.due);
                *at = (*at).min(t.due);
            }
        }
        due
    }

    /// When `id`'s watch is due (`None` while its poll runs): [`WatchTable::due_times`] for
    /// one watch, without a map of every watch's.
    pub fn due_of(&self, id: WatchId) -> Option<Millis> {
        self.timers
            .iter()
            .map(|Reverse(t)| t)
            .filter(|t| t.slot == id.slot && t.generation == id.generation && self.is_current(t))
            .map(|t| t.due)
            .min()
    }

    /// The earliest hold among live watches: the partition's watermark may not pass it.
    pub fn min_hold(&self) -> Option<Millis> {
        self.holds.keys().next().copied()
    }

    fn schedule(&mut self, id: WatchId, due: Millis) {
        if let Some(moved) = self.moved.get_mut(&id) {
            moved.due = Some(due);
        }
        self.timers.push(Reverse(Timer {
            due,
            slot: id.slot,
            generation: id.generation,
        }));
    }

    /// Timers of removed watches, and those a [`WatchTable::poll_now`] replaced, are
    /// skipped lazily, when they reach the front.
    fn drop_stale_timers(&mut self) {
        while let Some(Reverse(t)) = self.timers.peek() {
            if self.is_current(t) {
                return;
            }
            let id = WatchId {
                slot: t.slot,
                generation: t.generation,
            };
            self.timers.pop();
            if let Some(moved) = self.moved.get_mut(&id) {
                moved.stale = moved.stale.saturating_sub(1);
                if moved.stale == 0 {
                    self.moved.remove(&id);
                }
            }
        }
    }

    /// Whether `t` is its watch's timer (not a removed watch's, not a replaced one).
    fn is_current(&self, t: &Timer) -> bool {
        let slot = self.slots.at(t.slot);
        let id = WatchId {
            slot: t.slot,
            generation: t.generation,
        };
        slot.generation == t.generation
            && slot.watch.is_some()
            && self.moved.get(&id).is_none_or(|m| m.due == Some(t.due))
    }

    /// Poll a waiting watch at `now` instead of when it was due (an operator's `POST
    /// /watches/{key}/poll`). `false` when its poll runs already (or it is not live): the
    /// polls of a watch never overlap.
    pub fn poll_now(&mut self, id: WatchId, now: Millis) -> bool {
        let Some(due) = self.due_of(id) else {
            return false;
        };
        if due > now {
            let moved = self.moved.entry(id).or_insert(Moved {
                due: None,
                stale: 0,
            });
            moved.stale += 1;
            moved.due = Some(now);
            self.timers.push(Reverse(Timer {
                due: now,
                slot: id.slot,
                generation: id.generation,
            }));
        }
        true
    }

    fn add_hold(&mut self, hold: Millis) {
        *self.holds.entry(hold).or_insert(0) += 1;
    }

    fn remove_hold(&mut self, hold: Millis) {
        if let Some(count) = self.holds.get_mut(&hold) {
            *count -= 1;
            if *count == 0 {
                self.holds.remove(&hold);
            }
        }
    }
}

fn slot_key<I>(slots: &Pages<Slot<I>>, slot: u32) -> Option<&[u8]> {
    slots.at(slot).watch.as_ref().map(|w| w.key())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::PAGE;
    use crate::poll::Output;
    use crate::schedule::Schedule;
    use std::time::Duration;

    fn table(termination: &str) -> WatchTable<()> {
        let rules = WatchRules {
            catch_up: Default::default(),
            termination: termination.parse().unwrap(),
            schedule: Schedule {
                interval: Duration::from_millis(100),
                jitter: 0.0,
                ..Schedule::default()
            },
        };
        WatchTable::new(rules, Some(1))
    }

    fn key(s: &str) -> Bytes {
        Bytes::from(s.to_string())
    }

    /// A capped watch's backlog lives beside it, and is owed: a time-based end waits for
    /// the poll that emits it, which emits it whole; the watch removed, it goes.
    #[test]
    fn a_backlog_is_kept_beside_its_watch_and_emitted_before_a_timed_end() {
        let mut t = table("total(1s)");
        t.rules.catch_up.max_outputs_per_poll = std::num::NonZeroUsize::new(1);
        let id = t.insert(key("w"), Arc::new(()), 0, 0).unwrap();
        let two = vec![Output::new("a", "v", 1), Output::new("b", "v", 2)];
        let Some(Completion::Polled { polled, .. }) =
            t.complete(id, Ok(PollResult::incomplete(two)), 10)
        else {
            panic!("polled");
        };
        assert_eq!(polled.new_outputs.len(), 1);
        assert!(t.backlogs.contains_key(&id));
        assert_eq!(t.stop_if_done(id, 5_000), None, "owed: polls once more");
        let Some(Completion::Polled { polled, .. }) =
            t.complete(id, Ok(PollResult::incomplete(vec![])), 5_010)
        else {
            panic!("polled");
        };
        assert_eq!(&polled.new_outputs[0].key[..], b"b");
        assert_eq!(polled.next, Next::Stop(TerminatedReason::Total));
        assert!(t.backlogs.is_empty() && t.watch(id).is_none());
    }

    /// An operator's poll-now makes a waiting watch due at once, once: the timer it
    /// replaces is stale; a watch whose poll runs is left alone (polls never overlap).
    #[test]
    fn poll_now_moves_a_waiting_watch_up_once_and_leaves_a_polling_one() {
        let mut t = table("never");
        let a = t.insert(key("a"), Arc::new(()), 0, 0).unwrap();
        assert_eq!(t.pop_due(0), Some((a, 0)));
        t.complete(a, Ok(PollResult::default()), 0).unwrap();
        assert_eq!(t.next_due(), Some(100));
        assert!(t.poll_now(a, 10));
        assert_eq!(t.due_times().get(&a), Some(&10));
        assert_eq!(t.pop_due(10), Some((a, 10)));
        // In flight now: no second poll, and the replaced timer (100) never fires.
        assert!(!t.poll_now(a, 20));
        assert_eq!(t.pop_due(1_000), None, "the replaced timer fired");
        t.complete(a, Ok(PollResult::default()), 30).unwrap();
        assert_eq!(t.due_times().get(&a), Some(&130));
        assert_eq!(t.pop_due(1_000), Some((a, 130)));
        assert!(t.moved.is_empty());
    }

    #[test]
    fn a_slot_stays_small() {
        // A million idle watches are one slot each; docs/architecture.md accounts for this.
        assert!(std::mem::size_of::<Slot<()>>() <= 88);
    }

    #[test]
    fn a_small_table_holds_a_small_slab_and_a_large_one_whole_pages() {
        // An instance owns many partitions, each with a table: one with a few watches must
        // not hold a whole page (352 KiB); one past the first page grows a page at a time.
        let mut t = table("never");
        for n in 0..10 {
            t.insert(key(&format!("w{n}")), Arc::new(()), 0, 0).unwrap();
        }
        let slot = std::mem::size_of::<Slot<()>>();
        assert!(
            t.slots.heap_bytes() <= 16 * slot,
            "{} bytes of slots for 10 watches",
            t.slots.heap_bytes()
        );
        for n in 10..PAGE + 1 {
            t.insert(key(&format!("w{n}")), Arc::new(()), 0, 0).unwrap();
        }
        assert_eq!(t.slots.heap_bytes(), 2 * PAGE * slot, "two whole pages");
        for n in [0, 9, PAGE - 1, PAGE] {
            assert!(t.contains_key(format!("w{n}").as_bytes()), "w{n}");
        }
    }

    #[test]
    fn keys_are_unique_while_live_and_reusable_after() {
        let mut t = table("polls(1)");
        let a = t.insert(key("a"), Arc::new(()), 5, 0).unwrap();
        assert_eq!(t.insert(key("a"), Arc::new(()), 5, 0), Err(AlreadyWatching));
        assert!(t.contains_key(b"a") && !t.contains_key(b"b"));
        t.insert(key("b"), Arc::new(()), 5, 0).unwrap();
        assert!(t.remove(a).is_some());
        assert!(t.remove(a).is_none(), "a stale id removes nothing");
        assert!(!t.contains_key(b"a") && t.contains_key(b"b"));
        let a2 = t.insert(key("a"), Arc::new(()), 5, 0).unwrap();
        assert_ne!(a, a2, "a reused slot gets a new generation");
        assert!(t.watch(a).is_none() && t.watch(a2).is_some());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn due_watches_come_out_in_time_order_and_removed_ones_never() {
        let mut t = table("never");
        let a = t.insert(key("a"), Arc::new(()), 0, 30).unwrap();
        let b = t.insert(key("b"), Arc::new(()), 0, 10).unwrap();
        let c = t.insert(key("c"), Arc::new(()), 0, 20).unwrap();
        t.remove(c);
        assert_eq!(t.next_due(), Some(10));
        assert_eq!(t.pop_due(5), None, "nothing is due before its time");
        assert_eq!(t.pop_due(100), Some((b, 10)));
        assert_eq!(t.pop_due(100), Some((a, 30)));
        assert_eq!(t.pop_due(100), None);
        t.defer(b, 150);
        assert_eq!(t.next_due(), Some(150));
    }

    /// Seen failing first (CI: tests/bridge.rs `a_bounded_run_ends_on_time_whatever_retry_after_asks`
    /// on Kafka, when a host's `Retry-After` held a watch that had not polled yet): a watch
    /// the host's wait deferred past its `total` deadline ended only when the wait was over.
    #[test]
    fn a_watch_deferred_past_its_deadline_wakes_at_the_deadline_and_stops() {
        let mut t = table("total(5s)");
        let a = t.insert(key("a"), Arc::new(()), 0, 0).unwrap();
        assert_eq!(t.pop_due(0), Some((a, 0)));
        t.defer(a, 60_000);
        assert_eq!(t.next_due(), Some(5_000));
        assert_eq!(t.pop_due(5_000), Some((a, 5_000)));
        assert!(t.stop_if_done(a, 5_000).is_some());
    }

    #[test]
    fn completing_a_poll_reschedules_or_removes_and_tracks_the_minimum_hold() {
        let mut t = table("polls(2)");
        let a = t.insert(key("a"), Arc::new(()), 1_000, 0).unwrap();
        let b = t.insert(key("b"), Arc::new(()), 2_000, 0).unwrap();
        assert_eq!(t.min_hold(), Some(1_000));
        t.pop_due(0);
        t.pop_due(0);
        let result = PollResult::incomplete(vec![Output::new("x", "v", 3_000)]);
        t.complete(a, Ok(result), 0).unwrap();
        assert_eq!(
            t.min_hold(),
            Some(2_000),
            "a's hold moved up to its new output"
        );
        assert_eq!(t.next_due(), Some(100));
        t.complete(b, Ok(PollResult::complete(vec![])), 0).unwrap();
        assert_eq!(
            t.min_hold(),
            Some(3_000),
            "b finished and released its hold"
        );
        t.pop_due(100);
        match t.complete(a, Ok(PollResult::default()), 100) {
            Some(Completion::Polled { polled, .. }) => {
                assert_eq!(polled.next, Next::Stop(TerminatedReason::Polls))
            }
            other => panic!("{other:?}"),
        }
        assert!(t.is_empty());
        assert_eq!(t.min_hold(), None);
        assert!(t.complete(a, Ok(PollResult::default()), 200).is_none());
    }

    #[test]
    fn a_restored_watch_keeps_its_time_hold_and_seen_set_and_a_live_key_refuses_it() {
        let mut t = table("polls(3)");
        let live = t.insert(key("a"), Arc::new(()), 1_000, 0).unwrap();
        let progress = Progress {
            arrived: 0,
            last_new: 0,
            polls: 1,
            hold: 500,
            empty_streak: 0,
            failures: 0,
        };
        let refused = t.insert_restored(key("a"), Arc::new(()), SeenSet::new(), progress, None, 70);
        assert_eq!(refused, Err(AlreadyWatching));
        assert_eq!(t.min_hold(), Some(1_000), "a refused restore adds no hold");
        t.remove(live);

        let seen = SeenSet::from_hashes([crate::seen::hash_key(b"x")]);
        let b = t
            .insert_restored(key("b"), Arc::new(()), seen, progress, None, 70)
            .unwrap();
        assert_eq!(t.min_hold(), Some(500));
        assert_eq!(t.next_due(), Some(70));
        assert_eq!(t.pop_due(69), None);
        assert_eq!(t.pop_due(70), Some((b, 70)));
        assert_eq!(t.watch(b).unwrap().progress(), progress);
        let result =
            PollResult::incomplete(vec![Output::new("x", "v", 900), Output::new("y", "v", 800)]);
        match t.complete(b, Ok(result), 70) {
            Some(Completion::Polled { polled, hold, .. }) => {
                let keys: Vec<&[u8]> = polled.new_outputs.iter().map(|o| &o.key[..]).collect();
                assert_eq!(keys, vec![&b"y"[..]], "x was seen before the restart");
                assert_eq!(hold, 800);
            }
            other => panic!("{other:?}"),
        }
    }
}

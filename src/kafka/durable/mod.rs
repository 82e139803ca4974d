//! What one input partition's watches have on the state topic, what they do not have yet,
//! and the records a checkpoint writes to close the gap. Pure bookkeeping: the partition
//! task feeds it engine events and delivery reports, and produces the records it returns
//! (the format is [`crate::state`]'s).
//!
//! # The rules it keeps
//!
//! - **A hash is written only once its output is acknowledged** by the output topic; an
//!   output that never got there is not in the seen set a restore rebuilds, so the restored
//!   watch emits it again on its next poll.
//! - **Outputs acknowledged since the last checkpoint are found by reading back.** Each
//!   checkpoint ends with an [`OutputOffsets`] record: per output partition, the offset
//!   after the last output of this partition's watches that the checkpoint's seen chunks
//!   already cover. A recovery reads the output topic from there to its end and takes this
//!   partition's outputs (by `wb-id`, or by place and value: `recovery::output_of`). Offsets are
//!   assigned in send order per partition (idempotent producer), so an output acknowledged
//!   later, or never acknowledged but written, lies above them. The offsets advance only
//!   over outputs whose acknowledgement is handled *and* every output sent before them too
//!   (delivery reports are handled in any order; see `Sends`).
//! - **An input is committed once its watch is durable**: the watch's first record carries
//!   the input's offset, and the task commits past it when the record is acknowledged. The
//!   first records of a checkpoint's new watches share one starts record, which carries
//!   all their offsets ([`DurableState::checkpoint_records`]).
//! - **A finished watch is written as finished only once its last outputs are
//!   acknowledged**, so that a crash before then restores it as live (it polls again and
//!   emits what did not arrive), then its seen chunks are deleted; the finished record
//!   stays for [`WATCHBRIDGE_FINISHED_RETENTION`](crate::config) so a re-delivered input does
//!   not start the watch again, and is deleted after.
//! - **A failed watch keeps its seen chunks** (its record, written as failed, lists them)
//!   for the same retention, and its seen set stays in memory: a failure may be an outage
//!   of the resource, so its input, delivered again, starts it again knowing every output it
//!   had found ([`DurableState::take_failed`]), and it emits only what is new. Its new
//!   journal writes those hashes as chunks from 0 again; chunks of the earlier run past the
//!   new count are deleted after the new record. Past the retention, its record and chunks
//!   are deleted.
//! - **Progress alone is written lazily.** Every poll changes a watch's progress (its poll
//!   count and next poll time, at least), and most polls find nothing new: rewriting every
//!   polled watch at every checkpoint would cost a record per poll. A watch whose only
//!   change is progress is rewritten at most every [`PROGRESS_WRITE_INTERVAL_MS`], and at
//!   the last checkpoint before a partition is given up. What a crash loses of it is
//!   harmless for exactly-once (that rests on the seen hashes, written at every checkpoint)
//!   and makes the restored watch a little behind: a few more polls before `polls(n)`, a
//!   shorter backoff, a retry more, an immediate poll.
//! - **A watch's progress is held only until it is written.** An idle watch keeps its key,
//!   input, journal and bookkeeping, not its progress, next poll or input offset: those
//!   come with each poll and stay only until a record holds them and no output of the
//!   watch is in flight (`Pending`). Outputs acknowledged before their poll's progress
//!   arrives wait for it, and the output offsets wait with them.
//! - **One checkpoint in flight at a time** (the task waits for a checkpoint's records to be
//!   acknowledged before the next), so an [`OutputOffsets`] record never overtakes the
//!   chunks it vouches for through a retried delivery.
//!
//! One file a concept: a live watch (`live.rs`) and its packed input (`stored_input.rs`),
//! outputs in flight in send order (`sends.rs`), starts records (`starts.rs`), and the
//! records a checkpoint writes (`checkpoint.rs`). Here: [`DurableState`] and what it keeps of
//! the watches, live and ended.
//!
//! [`OutputOffsets`]: crate::state::OutputOffsets

mod checkpoint;
mod live;
mod sends;
mod starts;
mod stored_input;
#[cfg(test)]
mod tests;

pub use checkpoint::StateWrite;
pub use sends::{SendTicket, WatchSlot};

use crate::clock::Millis;
use crate::keyed::{Keyed, KeyedSlab};
use crate::reason::TerminatedReason;
use crate::seen::{OutputHash, SeenSet};
use crate::state::{Finished, Registration, SeenJournal, WatchRecord};
use crate::watch::Progress;
use bytes::Bytes;
use live::{LiveWatch, Pending};
use sends::Sends;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use stored_input::{StoredInput, Tail};

/// How often a watch whose only change is progress is rewritten.
pub const PROGRESS_WRITE_INTERVAL_MS: Millis = 30_000;

/// How often a checkpoint visits every live watch (the others visit only those that
/// changed): progress and unsealed chunks due after [`PROGRESS_WRITE_INTERVAL_MS`] are
/// handled at most this much later.
const VISIT_ALL_INTERVAL_MS: Millis = 2_000;

/// The durable state of one input partition's watches.
#[derive(Debug)]
pub struct DurableState {
    topic: Arc<str>,
    partition: i32,
    retention_ms: Millis,
    /// Each found by the key in its own input (no second copy of it), in a slab: a slot
    /// each and a 4-byte index bucket (`benches/scale.rs`; see [`KeyedSlab`]).
    live: KeyedSlab<LiveWatch>,
    /// Finished watches whose record is on the topic.
    finished: HashMap<Bytes, Ended>,
    /// Per output partition: the offset the last written
    /// [`OutputOffsets`](crate::state::OutputOffsets) says.
    written: Vec<i64>,
    /// Per output partition: the offset after the last output of this partition's watches
    /// whose acknowledgement is handled, as is every one sent before it (or found by the
    /// recovery's read-back).
    covered: Vec<i64>,
    /// Outputs handed to the producer, in send order, until they and every one before them
    /// are handled ([`Sends`]).
    sends: Sends,
    /// Outputs the read-back found for watches with no live record (their first record was
    /// never written; their input comes again, uncommitted), until that input arrives.
    preseen: HashMap<Bytes, Vec<OutputHash>>,
    /// Failed watches whose record (with their chunks) is on the topic, until their input
    /// starts them again or the retention passes.
    failed: HashMap<Bytes, FailedWatch>,
    /// The seen sets of live watches that failed, until they are written as failed.
    failing: HashMap<Bytes, SeenSet>,
    /// Watches started again whose earlier run left more chunks than their journal will
    /// write → that count: the rest are deleted after their next record.
    stale_chunks: HashMap<Bytes, u32>,
    /// Starts records on the topic → how many live watches still rely on them (see
    /// [`DurableState::checkpoint_records`]).
    starts: BTreeMap<u32, u32>,
    /// Starts records no watch relies on since the last checkpoint: deleted at the next one,
    /// once the records that took their members' places are acknowledged.
    starts_emptied: Vec<u32>,
    /// Starts records whose deletion the last checkpoint wrote: gone (from `starts`) at the
    /// next one, once that is acknowledged.
    starts_deleting: Vec<u32>,
    /// The number of the next starts record.
    next_starts: u32,
    /// The reasons ended watches ended for, each once ([`Ended::reason`] indexes them).
    reasons: Vec<Arc<str>>,
    /// Watches whose record the next checkpoint may have to write (new, new hashes, ended,
    /// an output given up): a checkpoint visits these, not every live watch. Watches
    /// whose only change is progress, and quiet ones whose unsealed chunk can go (both
    /// due 30 s after their last write), wait for the visit of every watch, at most every
    /// [`VISIT_ALL_INTERVAL_MS`]: with a million idle watches, visiting every one at every
    /// checkpoint (twice a second by default) was two million visits a second.
    touched: Vec<u32>,
    /// When a checkpoint last visited every live watch.
    visited_all_at: Millis,
    /// Tails (poller and condition states, [`Tail`]) that came while some of their watch's
    /// outputs were in flight: they go into its record only once those are delivered. A
    /// poller state past outputs not delivered (an HTTP `since=` newer than they are) would,
    /// after a crash, ask the resource only for what came after them, and they would be
    /// lost; a condition that counts outputs would count them twice when they are found
    /// again.
    tail_waiting: HashMap<Bytes, Box<[u8]>>,
}

/// When a watch that ended was written so, and which starts records may still hold it.
#[derive(Debug, Clone, Copy)]
struct Ended {
    at: Millis,
    /// Starts records numbered below this may list it as live: its record is deleted only
    /// once none of them is left (deleted first, it would leave the starts record's copy
    /// as its latest record, and start it again on a restore).
    starts_below: u32,
    /// Why it ended: an index into `DurableState::reasons` (in what was padding, so an
    /// ended watch costs no more for it).
    reason: u16,
}

/// A failed watch as kept for the retention.
#[derive(Debug)]
struct FailedWatch {
    /// When it was written as failed, and which starts records may still hold it.
    ended: Ended,
    /// Its seen chunks on the topic.
    chunks: u32,
    seen: SeenSet,
}

/// What a failed watch's input starts it again with.
#[derive(Debug)]
pub struct Restart {
    /// Every output the watch had found.
    pub seen: SeenSet,
    /// Its seen chunks on the topic (see [`DurableState::started`]).
    pub chunks: u32,
}

impl DurableState {
    /// The state recovered for `partition`: `written` is the
    /// [`OutputOffsets`](crate::state::OutputOffsets) on the topic (one per output partition),
    /// `covered` where the read-back stopped.
    pub fn new(
        topic: Arc<str>,
        partition: i32,
        retention_ms: Millis,
        written: Vec<i64>,
        covered: Vec<i64>,
    ) -> Self {
        Self {
            topic,
            partition,
            retention_ms,
            live: KeyedSlab::default(),
            finished: HashMap::new(),
            written,
            covered,
            sends: Sends::default(),
            preseen: HashMap::new(),
            failed: HashMap::new(),
            failing: HashMap::new(),
            stale_chunks: HashMap::new(),
            starts: BTreeMap::new(),
            starts_emptied: Vec::new(),
            starts_deleting: Vec::new(),
            next_starts: 1,
            reasons: Vec::new(),
            touched: Vec::new(),
            visited_all_at: 0,
            tail_waiting: HashMap::new(),
        }
    }

    /// `key`'s live watch may need writing at the next checkpoint.
    fn touch(&mut self, key: &[u8]) {
        if let Some(slot) = self.live.slot_of(key) {
            self.touch_slot(slot);
        }
    }

    fn touch_slot(&mut self, slot: u32) {
        if let Some(w) = self.live.at_mut(slot) {
            if !std::mem::replace(&mut w.touched, true) {
                self.touched.push(slot);
            }
        }
    }

    fn ended(&mut self, at: Millis, reason: &str) -> Ended {
        let reason = match self.reasons.iter().position(|r| **r == *reason) {
            Some(i) => i,
            None => {
                self.reasons.push(reason.into());
                self.reasons.len() - 1
            }
        };
        Ended {
            at,
            starts_below: self.next_starts,
            // Reasons are the built-in names and the user conditions' names: a handful.
            reason: u16::try_from(reason).unwrap_or(u16::MAX),
        }
    }

    /// When and why `key`'s watch ended, while it is remembered (its end not written yet,
    /// or within the finished retention), for the operations API.
    pub fn ended_status(&self, key: &[u8]) -> Option<(Millis, &str)> {
        if let Some(f) = self.live.get(key).and_then(|w| w.ending()) {
            return Some((f.at, &f.reason));
        }
        if let Some(e) = self.finished.get(key) {
            return Some((e.at, self.reason(e)));
        }
        self.failed
            .get(key)
            .map(|f| (f.ended.at, TerminatedReason::Failed.as_str()))
    }

    /// Every ended watch remembered, with when and why it ended.
    pub fn ended_watches(&self) -> Vec<(&[u8], Millis, &str)> {
        let ending = self
            .live
            .values()
            .filter_map(|w| w.ending().map(|f| (w.key(), f.at, f.reason.as_str())));
        let finished = self
            .finished
            .iter()
            .map(|(k, e)| (&k[..], e.at, self.reason(e)));
        let failed = self
            .failed
            .iter()
            .map(|(k, f)| (&k[..], f.ended.at, TerminatedReason::Failed.as_str()));
        ending.chain(finished).chain(failed).collect()
    }

    fn reason(&self, e: &Ended) -> &str {
        self.reasons
            .get(usize::from(e.reason))
            .map_or("unknown", |r| r)
    }

    /// A watch the recovery restored (on the topic already). `dirty` if the read-back found
    /// outputs its chunks do not list (added to `journal` by the caller). `relies_on`: the
    /// starts record that holds its record (0: a record of its own); the caller counts it
    /// with [`DurableState::relies_on`]. Its input, progress, next poll and resume state are
    /// `record`'s.
    pub fn restored(
        &mut self,
        key: Bytes,
        record: &WatchRecord,
        journal: SeenJournal,
        relies_on: u32,
    ) {
        let dirty = journal.pending() > 0;
        // Only a watch the read-back found outputs for writes its record again at once.
        let pending =
            dirty.then(|| Pending::new(record.progress(), record.next_poll, Pending::NO_ORIGIN));
        let mut input = StoredInput::new(&key, &record.registration());
        let tail = Tail {
            resume: record.resume.as_deref().filter(|r| !r.is_empty()),
            conditions: record.conditions.as_deref().filter(|c| !c.is_empty()),
        };
        if let Some(framed) = tail.frame() {
            input.set_tail(&framed);
        }
        let (slot, _) = self.live.insert(LiveWatch {
            input,
            journal,
            pending,
            in_flight: 0,
            dirty,
            progressed: false,
            touched: dirty,
            written_at: record.next_poll,
            relies_on,
        });
        if dirty {
            self.touched.push(slot);
        }
    }

    /// A finished watch's record found by the recovery (after [`starts_on_topic`]: any
    /// starts record found may hold it).
    ///
    /// [`starts_on_topic`]: DurableState::starts_on_topic
    pub fn finished_on_topic(&mut self, key: Bytes, at: Millis, reason: &str) {
        let ended = self.ended(at, reason);
        self.finished.insert(key, ended);
    }

    /// A failed watch's record found by the recovery, with its `chunks` on the topic and the
    /// outputs they (and the read-back) hold.
    pub fn failed_on_topic(&mut self, key: Bytes, at: Millis, chunks: u32, seen: SeenSet) {
        let ended = self.ended(at, TerminatedReason::Failed.as_str());
        self.failed.insert(
            key,
            FailedWatch {
                ended,
                chunks,
                seen,
            },
        );
    }

    /// `key`'s watch failed and its input came again: what it starts with, once. (Also for
    /// a watch that failed but waits for outputs in flight before it is written failed: its
    /// new run takes its place, and the outputs' acknowledgements go to the new journal.)
    pub fn take_failed(&mut self, key: &[u8]) -> Option<Restart> {
        if let Some(f) = self.failed.remove(key) {
            return Some(Restart {
                seen: f.seen,
                chunks: f.chunks,
            });
        }
        let live = self.live.get(key)?;
        let failing = live
            .ending()
            .is_some_and(|f| f.reason == TerminatedReason::Failed.as_str());
        if !failing {
            return None;
        }
        Some(Restart {
            seen: self.failing.remove(key).unwrap_or_default(),
            chunks: live.journal.chunks(),
        })
    }

    /// Forget that `key`'s watch finished (an operator resets it: its input starts it
    /// again). Returns whether it had. A watch that ended but is not written finished yet
    /// is not forgotten: its input then meets it as finished, and the reset can be asked
    /// again.
    pub fn forget_finished(&mut self, key: &[u8]) -> bool {
        self.finished.remove(key).is_some()
    }

    /// Outputs the read-back found for a watch with no live record.
    pub fn preseen(&mut self, key: Bytes, hashes: Vec<OutputHash>) {
        self.preseen.insert(key, hashes);
    }

    /// The outputs found for `key`'s earlier run, if any: its input came again.
    pub fn take_preseen(&mut self, key: &[u8]) -> Option<Vec<OutputHash>> {
        self.preseen.remove(key)
    }

    /// Forget the outputs found for watches whose input did not come again (every
    /// uncommitted input has been read). Returns how many were forgotten.
    pub fn forget_preseen(&mut self) -> usize {
        let n = self.preseen.len();
        self.preseen.clear();
        n
    }

    /// Whether `key` finished within the retention (or has ended and waits for its last
    /// outputs before it is written finished): its input must not start it again. A failed
    /// watch is not finished: see [`DurableState::take_failed`].
    pub fn is_finished(&self, key: &[u8]) -> bool {
        self.finished.contains_key(key)
            || self.live.get(key).is_some_and(|w| {
                w.ending()
                    .is_some_and(|f| f.reason != TerminatedReason::Failed.as_str())
            })
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Live watches that have not ended (an ended one stays live until its finished record
    /// is written): what a stop interrupts.
    pub fn running(&self) -> usize {
        self.live.values().filter(|w| w.ending().is_none()).count()
    }

    /// A watch started from the input at `origin`; `seen` are outputs it already had on the
    /// output topic (from the read-back, or an earlier run that failed), acknowledged and so
    /// to be written. `stale_chunks`: the chunks an earlier run of it left on the topic;
    /// those past what this one writes are deleted after its first record.
    ///
    /// It may take the place of a run that failed before it was written failed (see
    /// [`DurableState::take_failed`]), maybe even before its first record: then the input of
    /// that run still waits for a record, and this record serves both. Returns the later
    /// of the two inputs' offsets, whose commit need not wait (the earlier one holds the
    /// commit position below both until the record is written).
    ///
    /// Never replaces a live or ending watch other than a failed run's (that would lose
    /// its origin, holding the commit position forever, or its end): `Err` and nothing
    /// changes then.
    #[allow(clippy::too_many_arguments)]
    pub fn started(
        &mut self,
        key: Bytes,
        registration: Registration,
        progress: Progress,
        next_poll: Millis,
        origin: i64,
        seen: &[OutputHash],
        stale_chunks: u32,
    ) -> Result<Option<i64>, AlreadyLive> {
        let replaces_failed_run = self.live.get(&key).is_some_and(|w| {
            w.ending()
                .is_some_and(|f| f.reason == TerminatedReason::Failed.as_str())
        });
        if self.live.contains_key(&key) && !replaces_failed_run {
            return Err(AlreadyLive);
        }
        self.failing.remove(&key);
        // From the failed run this one replaces, if any: its origin; whether it relies on a
        // starts record (this run then writes a record of its own, and so releases it,
        // never joins a new one); its outputs still in flight, which keep the slot (see
        // `WatchSlot`).
        let (displaced, relies_on, in_flight) = self
            .live
            .get(&key)
            .map_or((None, 0, 0), |w| (w.origin(), w.relies_on, w.in_flight));
        if stale_chunks > 0 {
            self.stale_chunks.insert(key.clone(), stale_chunks);
        }
        let mut journal = SeenJournal::new();
        for &hash in seen {
            journal.add(hash);
        }
        let (slot, _) = self.live.insert(LiveWatch {
            input: StoredInput::new(&key, &registration),
            journal,
            pending: Some(Pending::new(
                progress,
                next_poll,
                displaced.map_or(origin, |d| d.min(origin)),
            )),
            in_flight,
            dirty: true,
            progressed: false,
            touched: true,
            written_at: next_poll,
            relies_on,
        });
        self.touched.push(slot);
        Ok(displaced.map(|d| d.max(origin)))
    }

    /// The input record `key`'s live watch was started from, for the operations API: its
    /// `key` and `value` (JSON when it is JSON, else text) and `time_ms`.
    pub fn input_json(&self, key: &[u8]) -> Option<serde_json::Value> {
        let r = self.live.get(key)?.input.registration();
        let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        let value = serde_json::from_slice::<serde_json::Value>(&r.value)
            .unwrap_or_else(|_| serde_json::Value::String(text(&r.value)));
        Some(serde_json::json!({
            "key": r.key.as_ref().map(text),
            "value": value,
            "time_ms": r.time,
        }))
    }

    /// `hashes` of outputs `key`'s watch marked seen without emitting them (its first
    /// poll with `WATCHBRIDGE_START_FROM=now`): journaled at once, as an acknowledged
    /// output's hash is (nothing of them is to be delivered), so that a restored watch does
    /// not find them new.
    pub fn seen_without_output(&mut self, key: &[u8], hashes: &[OutputHash]) {
        if hashes.is_empty() {
            return;
        }
        if let Some(w) = self.live.get_mut(key) {
            for &h in hashes {
                w.journal.add(h);
            }
            w.dirty = true;
        }
        self.touch(key);
    }

    /// Where a live watch stands after a poll, and its poller state then (`resume`) and its
    /// user termination conditions' (`conditions`). With `held_back` (the stop left some of
    /// its outputs unsent, to be found again after the recovery; or the watch holds new
    /// outputs back for later polls, `WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`) those states are not
    /// kept: they are past outputs that are nowhere.
    pub fn checkpoint(
        &mut self,
        key: &[u8],
        progress: Progress,
        next_poll: Millis,
        resume: Option<Vec<u8>>,
        conditions: Option<Vec<u8>>,
        held_back: bool,
    ) {
        if let Some(w) = self.live.get_mut(key) {
            match w.pending.as_mut() {
                Some(p) => (p.progress, p.next_poll) = (progress, next_poll),
                None => w.pending = Some(Pending::new(progress, next_poll, Pending::NO_ORIGIN)),
            }
            w.progressed = true;
            let tail = Tail {
                resume: resume.as_deref(),
                conditions: conditions.as_deref(),
            };
            match (tail.frame(), held_back) {
                (None, _) | (_, true) => {}
                // Every output found before it is delivered: into the record now (most
                // polls; no map entry made and removed again).
                (Some(framed), false) if w.in_flight == 0 => {
                    w.input.set_tail(&framed);
                    if !self.tail_waiting.is_empty() {
                        self.tail_waiting.remove(key);
                    }
                }
                (Some(framed), false) => {
                    self.tail_waiting
                        .insert(Bytes::copy_from_slice(key), framed);
                }
            }
        }
    }

    /// `key`'s watch ended at `at`; `seen` is its seen set, kept if it failed.
    pub fn terminated(&mut self, key: &[u8], at: Millis, reason: &TerminatedReason, seen: SeenSet) {
        if let Some(w) = self.live.get_mut(key) {
            w.set_ending(Finished::new(at, reason));
            if *reason == TerminatedReason::Failed {
                self.failing.insert(Bytes::copy_from_slice(key), seen);
            }
        }
        self.touch(key);
    }
}

/// [`DurableState::started`] for a key with a live or ending watch (not a failed run's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyLive;

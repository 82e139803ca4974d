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

use super::offsets::Origins;
use super::records::OutRecord;
use crate::clock::Millis;
use crate::keyed::{Keyed, KeyedSlab};
use crate::reason::TerminatedReason;
use crate::seen::{OutputHash, SeenSet};
use crate::state::{
    starts_key, state_key, Finished, OutputOffsets, Part, Registration, SeenJournal, Starts,
    StateEntry, WatchRecord, MAX_RECORD_BYTES,
};
use crate::watch::Progress;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How often a watch whose only change is progress is rewritten.
pub const PROGRESS_WRITE_INTERVAL_MS: Millis = 30_000;

/// How often a checkpoint visits every live watch (the others visit only those that
/// changed): progress and unsealed chunks due after [`PROGRESS_WRITE_INTERVAL_MS`] are
/// handled at most this much later.
const VISIT_ALL_INTERVAL_MS: Millis = 2_000;

/// Most bytes of members one starts record takes (the rest go into another): the state
/// format's limit, less room for the key and the record's own fields.
const STARTS_RECORD_BYTES: usize = MAX_RECORD_BYTES - 1024;

/// A live watch's key and input record, kept to find the watch and rewrite its state
/// record: in one allocation, with no `Bytes` headers (a million idle watches keep a
/// million of these; the `Registration` a record needs is copied out at the rare
/// checkpoint that writes it). The watch key is stored only where it differs from the
/// input's key (`WATCHBRIDGE_WATCH_KEY`). What the record carries after the input travels
/// in the same allocation: the poller's resume state and the user termination conditions'
/// states ([`Tail`]).
#[derive(Debug)]
struct StoredInput {
    /// With [`StoredInput::OWN_WATCH_KEY`], the watch key's length as a little-endian `u32`
    /// and its bytes (without, the watch key is the input's key); then the input key's
    /// bytes, the value's, and the tail's. (The length is here, not in a field: the struct
    /// has no padding left, and a field would cost every live watch 8 bytes.)
    bytes: Box<[u8]>,
    /// The input key's length, or [`StoredInput::NO_KEY`]; and the
    /// [`StoredInput::OWN_WATCH_KEY`] flag.
    key_len: u32,
    /// The tail's length (0: none), at the end of `bytes` (here, not in a field of its own:
    /// this `u32` fills what was padding, so a live watch stays as small).
    tail_len: u32,
    time: Millis,
}

/// What a watch's record carries besides its input and progress, as of a poll whose
/// outputs are all delivered: the poller's resume state ([`WatchRecord::resume`]) and the
/// states of the user termination conditions ([`WatchRecord::conditions`]). Framed in one
/// byte string, `[resume length: u32][resume][conditions]`, so it costs a live watch one
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tail<'a> {
    resume: Option<&'a [u8]>,
    conditions: Option<&'a [u8]>,
}

impl<'a> Tail<'a> {
    /// The framed bytes; `None` when there is nothing to carry.
    fn frame(&self) -> Option<Box<[u8]>> {
        if self.resume.is_none() && self.conditions.is_none() {
            return None;
        }
        let (resume, conditions) = (
            self.resume.unwrap_or_default(),
            self.conditions.unwrap_or_default(),
        );
        let mut out = Vec::with_capacity(4 + resume.len() + conditions.len());
        out.extend_from_slice(&(resume.len() as u32).to_le_bytes());
        out.extend_from_slice(resume);
        out.extend_from_slice(conditions);
        Some(out.into_boxed_slice())
    }

    /// [`Tail::frame`]'s bytes back (an empty part is none).
    fn read(framed: &'a [u8]) -> Self {
        let len = framed.get(..4).map_or(0, |b| {
            u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
        });
        let resume = framed.get(4..4 + len).unwrap_or_default();
        let conditions = framed.get(4 + len..).unwrap_or_default();
        Self {
            resume: (!resume.is_empty()).then_some(resume),
            conditions: (!conditions.is_empty()).then_some(conditions),
        }
    }
}

impl StoredInput {
    /// A record without a key (Kafka keys are far shorter than this).
    const NO_KEY: u32 = u32::MAX >> 1;
    /// The watch key is not the input's key, and is stored first (`WATCHBRIDGE_WATCH_KEY`).
    const OWN_WATCH_KEY: u32 = 1 << 31;

    fn new(watch_key: &[u8], r: &Registration) -> Self {
        let key = r.key.as_deref();
        let own_key = (key != Some(watch_key)).then_some(watch_key);
        let mut bytes = Vec::with_capacity(
            own_key.map_or(0, |k| 4 + k.len()) + key.map_or(0, <[u8]>::len) + r.value.len(),
        );
        if let Some(own) = own_key {
            bytes.extend_from_slice(&(own.len() as u32).to_le_bytes());
            bytes.extend_from_slice(own);
        }
        bytes.extend_from_slice(key.unwrap_or_default());
        bytes.extend_from_slice(&r.value);
        let flag = if own_key.is_some() {
            Self::OWN_WATCH_KEY
        } else {
            0
        };
        Self {
            bytes: bytes.into_boxed_slice(),
            key_len: key.map_or(Self::NO_KEY, |k| k.len() as u32) | flag,
            tail_len: 0,
            time: r.time,
        }
    }

    /// The input key's length, if it has a key.
    fn input_key_len(&self) -> Option<usize> {
        let len = self.key_len & !Self::OWN_WATCH_KEY;
        (len != Self::NO_KEY).then_some(len as usize)
    }

    /// The watch key's length when it is stored apart from the input's.
    fn own_watch_key_len(&self) -> Option<usize> {
        (self.key_len & Self::OWN_WATCH_KEY != 0)
            .then(|| u32::from_le_bytes(self.bytes[..4].try_into().expect("4 bytes")) as usize)
    }

    /// Where the input record starts.
    fn input_start(&self) -> usize {
        self.own_watch_key_len().map_or(0, |len| 4 + len)
    }

    /// The key its watch is found by.
    fn watch_key(&self) -> &[u8] {
        match self.own_watch_key_len() {
            Some(len) => &self.bytes[4..4 + len],
            // Not stored apart: the input's key, which then exists.
            None => &self.bytes[..self.input_key_len().unwrap_or(0)],
        }
    }

    /// What its record carries after the input.
    fn tail(&self) -> Tail<'_> {
        Tail::read(&self.bytes[self.bytes.len() - self.tail_len as usize..])
    }

    /// Carry `framed` ([`Tail::frame`]'s bytes) in the watch's record from now on (one
    /// allocation again).
    fn set_tail(&mut self, framed: &[u8]) {
        let input_len = self.bytes.len() - self.tail_len as usize;
        if self.bytes[input_len..] == *framed {
            return;
        }
        let mut bytes = Vec::with_capacity(input_len + framed.len());
        bytes.extend_from_slice(&self.bytes[..input_len]);
        bytes.extend_from_slice(framed);
        self.bytes = bytes.into_boxed_slice();
        self.tail_len = framed.len() as u32;
    }

    fn registration(&self) -> Registration {
        let key_len = self.input_key_len();
        let input = &self.bytes[self.input_start()..self.bytes.len() - self.tail_len as usize];
        let (key, value) = input.split_at(key_len.unwrap_or(0));
        Registration {
            key: key_len.map(|_| Bytes::copy_from_slice(key)),
            value: Bytes::copy_from_slice(value),
            time: self.time,
        }
    }
}

/// A live watch as the state topic knows it, and what it does not know yet.
#[derive(Debug)]
struct LiveWatch {
    input: StoredInput,
    journal: SeenJournal,
    /// What only its next record needs (see [`Pending`]); `None` on an idle watch.
    pending: Option<Box<Pending>>,
    /// Outputs handed to the producer, neither acknowledged nor given up yet.
    in_flight: u32,
    /// Changed in a way the next checkpoint must write (new, or new seen hashes).
    dirty: bool,
    /// Its progress changed since its record was last written.
    progressed: bool,
    /// In [`DurableState::touched`] since the last checkpoint.
    touched: bool,
    /// When its record was last written.
    written_at: Millis,
    /// The starts record that holds its only record on the topic (0: it has a record of
    /// its own, or none yet).
    relies_on: u32,
}

impl Keyed for LiveWatch {
    fn key(&self) -> &[u8] {
        self.input.watch_key()
    }
}

/// What a live watch's next record needs and, once that is written, nothing does: its
/// progress and next poll as of its last poll (or its start, or its restore), the input
/// offset whose commit waits for its first record, and its end while it waits to be written
/// finished. Held from the event that changes them until a record with them is written
/// *and* none of the watch's outputs is in flight (an acknowledgement still to come makes it
/// write its record again, with the same progress). So an idle watch holds none of it: 56
/// bytes less on each of a million idle watches than when every live watch kept these, at
/// the cost of 8 more on a watch polled more often than its progress is written (every
/// [`PROGRESS_WRITE_INTERVAL_MS`]).
///
/// Its progress comes with the engine's checkpoint of a poll, which the engine sends after
/// that poll's outputs: an output may be acknowledged before it arrives. Such a watch has
/// new hashes and nothing to write them with; a checkpoint leaves it for the next one and
/// holds the output offsets back meanwhile (they would vouch for hashes in no chunk).
#[derive(Debug)]
struct Pending {
    progress: Progress,
    next_poll: Millis,
    /// The input offset whose commit waits for this watch's first record (taken when that
    /// record is written), or [`Pending::NO_ORIGIN`].
    origin: i64,
    /// Ended, waiting for its outputs in flight before it is written as finished (boxed:
    /// rare).
    ending: Option<Box<Finished>>,
}

impl Pending {
    /// No input waits for its record (input offsets are never negative).
    const NO_ORIGIN: i64 = -1;

    fn new(progress: Progress, next_poll: Millis, origin: i64) -> Box<Self> {
        Box::new(Self {
            progress,
            next_poll,
            origin,
            ending: None,
        })
    }
}

impl LiveWatch {
    fn origin(&self) -> Option<i64> {
        self.pending
            .as_ref()
            .map(|p| p.origin)
            .filter(|&o| o != Pending::NO_ORIGIN)
    }

    fn take_origin(&mut self) -> Option<i64> {
        let origin = self.origin();
        if let Some(p) = self.pending.as_mut() {
            p.origin = Pending::NO_ORIGIN;
        }
        origin
    }

    /// Its progress and next poll are written, and no acknowledgement to come needs them
    /// again: let them go.
    fn settle_pending(&mut self) {
        if !self.progressed
            && !self.dirty
            && self.in_flight == 0
            && self.origin().is_none()
            && self.ending().is_none()
        {
            self.pending = None;
        }
    }

    /// How it ended, while it waits for its outputs in flight before it is written so.
    fn ending(&self) -> Option<&Finished> {
        self.pending.as_ref()?.ending.as_deref()
    }

    fn take_ending(&mut self) -> Option<Finished> {
        self.pending.as_mut()?.ending.take().map(|f| *f)
    }

    /// It ended. The poll that ended it sent no progress: one it no longer holds is taken
    /// as of its input's arrival. A finished record keeps no progress that anything reads
    /// back (a restore takes only when and why it ended; [`crate::engine`]).
    fn set_ending(&mut self, finished: Finished) {
        let (time, written_at) = (self.input.time, self.written_at);
        self.pending
            .get_or_insert_with(|| {
                Pending::new(Progress::at_start(time, written_at), 0, Pending::NO_ORIGIN)
            })
            .ending = Some(Box::new(finished));
    }

    /// Its watch record as it stands (`key`: its key, which the caller has already copied),
    /// listing `chunks` seen chunks (not finished); `None` while its progress has not come
    /// (see [`Pending`]).
    fn record(&self, key: &Bytes, chunks: u32) -> Option<WatchRecord> {
        let pending = self.pending.as_ref()?;
        let mut record = WatchRecord::from_progress(
            key.clone(),
            &self.input.registration(),
            pending.progress,
            pending.next_poll,
            chunks,
        );
        let tail = self.input.tail();
        record.resume = tail.resume.map(Bytes::copy_from_slice);
        record.conditions = tail.conditions.map(Bytes::copy_from_slice);
        Some(record)
    }
}

/// A state record to produce, and the input offset its acknowledgement lets commit.
/// `record` is `None` for a watch too large to save (see `DurableState::write`): its
/// origin is released at once.
#[derive(Debug)]
pub struct StateWrite {
    pub record: Option<OutRecord>,
    pub origin: Origins,
    /// An [`OutputOffsets`] record: it vouches for the chunks before it, so it is produced
    /// only once they are acknowledged (a chunk retried after a failed delivery would
    /// otherwise land after it, and a crash before then leave it vouching for hashes that
    /// are on no record).
    pub offsets: bool,
}

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
    /// Per output partition: the offset the last written [`OutputOffsets`] says.
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
    /// The state recovered for `partition`: `written` is the [`OutputOffsets`] on the topic
    /// (one per output partition), `covered` where the read-back stopped.
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

    /// Starts records the recovery found: `alive` on the topic, and the highest number
    /// any record (deleted or not) had. Call before [`DurableState::restored`].
    pub fn starts_on_topic(&mut self, alive: &[u32], highest: u32) {
        self.starts.extend(alive.iter().map(|&seq| (seq, 0)));
        self.next_starts = self.next_starts.max(highest.saturating_add(1));
    }

    /// Starts records on the topic that no restored watch relies on: deleted now (their
    /// members' own records are on the topic already).
    pub fn unrelied_starts(&mut self) -> Vec<Vec<u8>> {
        let empty: Vec<u32> = self
            .starts
            .iter()
            .filter(|(_, &n)| n == 0)
            .map(|(&seq, _)| seq)
            .collect();
        for seq in &empty {
            self.starts.remove(seq);
        }
        empty.into_iter().map(starts_key).collect()
    }

    /// Whether a starts record numbered below `below` is still on the topic.
    fn starts_alive_below(&self, below: u32) -> bool {
        self.starts
            .first_key_value()
            .is_some_and(|(&seq, _)| seq < below)
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

    /// A watch found on the topic (restored or not) holds its only record in starts record
    /// `seq`: that record stays until the watch has a record of its own.
    pub fn relies_on(&mut self, seq: u32) {
        *self.starts.entry(seq).or_insert(0) += 1;
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

    /// Where the outputs of `key`'s watch find it again when their reports come back,
    /// without a lookup by key per output (see [`WatchSlot`]).
    pub fn watch_slot(&self, key: &[u8]) -> WatchSlot {
        WatchSlot(self.live.slot_of(key).unwrap_or(WatchSlot::NONE))
    }

    /// An output of `watch` was handed to the producer: its ticket, for its report.
    pub fn output_sent(&mut self, watch: WatchSlot) -> SendTicket {
        if let Some(w) = self.live.at_mut(watch.0) {
            w.in_flight += 1;
        }
        SendTicket {
            order: self.sends.sent(),
            watch,
        }
    }

    /// The output topic acknowledged the output of `ticket`, whose key hashes to `hash`, at
    /// `offset` of `partition`.
    pub fn output_acknowledged(
        &mut self,
        ticket: SendTicket,
        hash: OutputHash,
        partition: i32,
        offset: i64,
    ) {
        if let Some(w) = self.live.at_mut(ticket.watch.0) {
            w.in_flight = w.in_flight.saturating_sub(1);
            w.journal.add(hash);
            w.dirty = true;
        }
        self.output_handled(ticket, Some((partition, offset)));
    }

    /// The end offsets of every output partition, read (by the bridge, for every partition
    /// task) no later than now. Once every output sent before now is handled, nothing of
    /// this partition's below them lacks its hash in a chunk: the offsets may rise to them,
    /// so that a recovery does not read what other partitions wrote meanwhile (without
    /// this, the offsets of an output partition this partition never writes to never
    /// move, and each recovery re-read everything written there since its last one).
    pub fn output_ends(&mut self, ends: &[i64]) {
        self.sends.floor(ends, &mut self.covered);
    }

    /// The output of `ticket` will not reach the output topic (it was dead-lettered or
    /// lost): not in its watch's seen chunks, so a restored watch would emit it again.
    pub fn output_given_up(&mut self, ticket: SendTicket) {
        if let Some(w) = self.live.at_mut(ticket.watch.0) {
            w.in_flight = w.in_flight.saturating_sub(1);
        }
        self.output_handled(ticket, None);
    }

    /// The report of `ticket`'s output was handled (it landed `at`, or was given up).
    fn output_handled(&mut self, ticket: SendTicket, at: Option<(i32, i64)>) {
        self.settle_tail(ticket.watch);
        self.touch_slot(ticket.watch.0);
        self.sends.handled(ticket.order, at, &mut self.covered);
    }

    /// Where a live watch stands after a poll, and its poller state then (`resume`) and its
    /// user termination conditions' (`conditions`). With `held_back` (the stop left some of
    /// its outputs unsent, to be found again after the recovery) those states are not kept:
    /// they are past outputs that are nowhere.
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

    /// Once no output of `watch` is in flight, its waiting tail goes into its record (see
    /// `tail_waiting`).
    fn settle_tail(&mut self, watch: WatchSlot) {
        if self.tail_waiting.is_empty() {
            return;
        }
        let Some(w) = self.live.at_mut(watch.0).filter(|w| w.in_flight == 0) else {
            return;
        };
        if let Some(framed) = self.tail_waiting.remove(w.key()) {
            w.input.set_tail(&framed);
            w.progressed = true;
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

    /// The records of one checkpoint at `now`, in the order they must be written: per
    /// changed watch its new chunks then its record (or, once ended and delivered, its
    /// finished record then tombstones for its chunks); the new watches' records together
    /// in starts records; tombstones for finished records past the retention and for
    /// starts records no watch relies on; and last the output offsets the written chunks
    /// vouch for. Empty when nothing changed. `last`: the partition is being given up, so
    /// progress is written however recent its last write.
    ///
    /// # Starts records
    ///
    /// A watch's first record is what lets its input commit, so every new watch costs a
    /// state record; a broker that writes records one at a time (Tansu on SQLite) then
    /// starts watches at a third of the rate it reads inputs. The new watches of one
    /// checkpoint (those with no seen hashes yet) are written together instead, in starts
    /// records of up to ~1 MB, each carrying the offsets of all their inputs. A member's
    /// next write (progress, outputs, its end) is a record of its own, later on the
    /// partition, which a recovery prefers. Once no live watch relies on a starts record
    /// it is deleted, at the checkpoint after (its members' records are acknowledged by
    /// then). A watch's record is deleted (past the finished retention) only once every
    /// starts record that may hold it is deleted and that deletion acknowledged, or
    /// compaction could leave the starts record's copy as its latest, and a restore would
    /// start it again.
    pub fn checkpoint_records(&mut self, now: Millis, last: bool) -> Vec<StateWrite> {
        let to = self.target();
        let mut writes = Vec::new();
        self.sends.release_idle_capacity();
        for seq in std::mem::take(&mut self.starts_deleting) {
            self.starts.remove(&seq);
        }
        for seq in std::mem::take(&mut self.starts_emptied) {
            writes.push(to.tombstone(starts_key(seq)));
            self.starts_deleting.push(seq);
        }
        // Watches with new hashes and no progress to write them with yet (see [`Pending`]):
        // visited again next time, and until then no output offsets are written.
        let mut waiting = Vec::new();
        let mut visit = Visit {
            to: &to,
            now,
            last,
            writes: &mut writes,
            ended: Vec::new(),
            new_watches: Vec::new(),
            stale_chunks: &mut self.stale_chunks,
            starts: &mut self.starts,
            starts_emptied: &mut self.starts_emptied,
            failing: &mut self.failing,
        };
        if last || now.saturating_sub(self.visited_all_at) >= VISIT_ALL_INTERVAL_MS {
            self.visited_all_at = now;
            self.touched = Vec::new();
            for (slot, w) in self.live.iter_mut() {
                if !visit.watch(w) {
                    waiting.push(slot);
                }
            }
        } else {
            // A slot is listed once per touch, while its watch is live (a watch leaves the
            // slab only below, after this visit): the flag skips a second listing.
            for slot in std::mem::take(&mut self.touched) {
                if let Some(w) = self.live.at_mut(slot).filter(|w| w.touched) {
                    if !visit.watch(w) {
                        waiting.push(slot);
                    }
                }
            }
        }
        let Visit {
            ended, new_watches, ..
        } = visit;
        self.write_starts(new_watches, &mut writes);
        let offsets_held = !waiting.is_empty();
        self.touched.extend(waiting);
        for WrittenEnded {
            key,
            reason,
            failed,
        } in ended
        {
            self.live.remove(&key);
            self.tail_waiting.remove(&key);
            let ending = self.ended(now, &reason);
            match failed {
                Some((chunks, seen)) => {
                    let failed = FailedWatch {
                        ended: ending,
                        chunks,
                        seen,
                    };
                    self.failed.insert(key, failed);
                }
                None => {
                    self.finished.insert(key, ending);
                }
            }
        }
        let retention = self.retention_ms;
        let due = |e: &Ended| {
            now.saturating_sub(e.at) >= retention && !self.starts_alive_below(e.starts_below)
        };
        let expired: Vec<Bytes> = self
            .finished
            .iter()
            .filter(|(_, e)| due(e))
            .map(|(k, _)| k.clone())
            .collect();
        let expired_failed: Vec<Bytes> = self
            .failed
            .iter()
            .filter(|(_, f)| due(&f.ended))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.finished.remove(&key);
            let key = state_key(&key, Part::Watch);
            writes.push(to.tombstone(key));
        }
        for key in expired_failed {
            if let Some(f) = self.failed.remove(&key) {
                writes.push(to.tombstone(state_key(&key, Part::Watch)));
                for n in 0..f.chunks {
                    writes.push(to.tombstone(state_key(&key, Part::Seen(n))));
                }
            }
        }
        // Outputs found by the read-back for watches not started again yet are in no chunk:
        // until they are, the offsets may not pass them.
        if self.preseen.is_empty() && !offsets_held && self.covered != self.written {
            self.written.clone_from(&self.covered);
            let offsets = OutputOffsets {
                offsets: (0..).zip(self.written.iter().copied()).collect(),
            };
            writes.push(to.offsets(offsets));
        }
        writes
    }

    /// The first records of this checkpoint's new watches: one alone as its own record,
    /// more in starts records of at most [`STARTS_RECORD_BYTES`], each carrying its
    /// members' input offsets.
    fn write_starts(
        &mut self,
        new_watches: Vec<(Bytes, WatchRecord, Option<i64>)>,
        writes: &mut Vec<StateWrite>,
    ) {
        let to = self.target();
        if new_watches.len() == 1 {
            let (_, record, origin) = new_watches.into_iter().next().expect("one");
            writes.push(to.write(record.to_entry(), origin.into()));
            return;
        }
        let mut members = new_watches.into_iter().peekable();
        while members.peek().is_some() {
            let seq = self.next_starts;
            self.next_starts += 1;
            let mut starts = Starts {
                seq,
                watches: Vec::new(),
            };
            let mut origins = Vec::new();
            let mut bytes = 0;
            while let Some((key, record, origin)) = members.next_if(|(_, r, _)| {
                bytes == 0 || bytes + Starts::member_len(r) <= STARTS_RECORD_BYTES
            }) {
                bytes += Starts::member_len(&record);
                if let Some(w) = self.live.get_mut(&key) {
                    w.relies_on = seq;
                }
                starts.watches.push(record);
                origins.extend(origin);
            }
            self.starts.insert(seq, starts.watches.len() as u32);
            writes.push(to.write(starts.to_entry(), Origins::Many(origins.into())));
        }
    }

    /// The [`OutputOffsets`] record as it stands (written first by a partition that has
    /// none, before any output).
    pub fn offsets_record(&self) -> StateWrite {
        let offsets = OutputOffsets {
            offsets: (0..).zip(self.written.iter().copied()).collect(),
        };
        self.target().offsets(offsets)
    }

    /// The partition's `~mode` record: `mode` is the instance's guarantee.
    pub fn mode_record(&self, mode: &str) -> StateWrite {
        let record = crate::state::ModeRecord { mode: mode.into() };
        self.target().write(record.to_entry(), Origins::None)
    }

    /// Deletes of these state keys.
    pub fn tombstones(&self, keys: Vec<Vec<u8>>) -> Vec<StateWrite> {
        let to = self.target();
        keys.into_iter().map(|k| to.tombstone(k)).collect()
    }

    fn target(&self) -> Target {
        Target {
            topic: self.topic.clone(),
            partition: self.partition,
        }
    }
}

/// One checkpoint's visit of the watches: what it writes and what ends.
/// A watch a checkpoint wrote as ended: its key, why, and for a failed one its chunks and
/// seen set.
struct WrittenEnded {
    key: Bytes,
    reason: String,
    failed: Option<(u32, SeenSet)>,
}

struct Visit<'a> {
    to: &'a Target,
    now: Millis,
    last: bool,
    writes: &'a mut Vec<StateWrite>,
    /// Watches written as ended.
    ended: Vec<WrittenEnded>,
    /// New watches for this checkpoint's starts records: key, first record, origin.
    new_watches: Vec<(Bytes, WatchRecord, Option<i64>)>,
    stale_chunks: &'a mut HashMap<Bytes, u32>,
    starts: &'a mut BTreeMap<u32, u32>,
    starts_emptied: &'a mut Vec<u32>,
    failing: &'a mut HashMap<Bytes, SeenSet>,
}

impl Visit<'_> {
    /// What `key`'s watch needs written, if anything.
    /// Returns `false` for a watch with new hashes whose progress has not come yet (see
    /// [`Pending`]): nothing of it is written, it stays touched, and the caller lists it for
    /// the next visit. Any other watch is visited and no longer touched.
    fn watch(&mut self, w: &mut LiveWatch) -> bool {
        w.touched = false;
        let done = w.ending().is_some() && w.in_flight == 0;
        let progress_due = w.progressed
            && (self.last || self.now.saturating_sub(w.written_at) >= PROGRESS_WRITE_INTERVAL_MS);
        if !(w.dirty || done || progress_due) {
            // Nothing new for a while: stop holding its unsealed chunk's hashes (they
            // are in its seen set too); its next new output starts a new chunk.
            if self.now.saturating_sub(w.written_at) >= PROGRESS_WRITE_INTERVAL_MS {
                w.journal.release_tail();
            }
            w.settle_pending();
            return true;
        }
        if !done && w.pending.is_none() {
            w.touched = true;
            return false;
        }
        // A copy: the key lives in the watch, which this changes (only watches with
        // something to write get here).
        let key = &Bytes::copy_from_slice(w.key());
        let origin = w.take_origin();
        let stale = self.stale_chunks.remove(key).unwrap_or(0);
        let failed = done
            && w.ending()
                .is_some_and(|f| f.reason == TerminatedReason::Failed.as_str());
        let first = origin.is_some() && w.relies_on == 0;
        if first && !done && stale == 0 && w.journal.pending() == 0 && w.journal.chunks() == 0 {
            // New, with nothing seen: its record goes into this checkpoint's starts.
            let record = w.record(key, 0).expect("checked: it has its progress");
            self.new_watches.push((key.clone(), record, origin));
            w.dirty = false;
            w.progressed = false;
            w.written_at = self.now;
            w.settle_pending();
            return true;
        }
        // A record of its own from here: the starts record that held it may go.
        if w.relies_on != 0 {
            let seq = std::mem::take(&mut w.relies_on);
            if let Some(n) = self.starts.get_mut(&seq) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.starts_emptied.push(seq);
                }
            }
        }
        if done && !failed {
            let chunks = w.journal.chunks().max(stale);
            let mut record = w
                .record(key, 0)
                .expect("an ending watch holds its pending part");
            record.finished = w.take_ending();
            let reason = record.finished.as_ref().map(|f| f.reason.clone());
            self.writes
                .push(self.to.write(record.to_entry(), origin.into()));
            for n in 0..chunks {
                let key = state_key(key, Part::Seen(n));
                self.writes.push(self.to.tombstone(key));
            }
            self.ended.push(WrittenEnded {
                key: key.clone(),
                reason: reason.unwrap_or_default(),
                failed: None,
            });
            return true;
        }
        // Live, or failed: its chunks first, then its record listing them.
        for chunk in w.journal.checkpoint() {
            self.writes
                .push(self.to.write(chunk.to_entry(key), Origins::None));
        }
        let mut record = w
            .record(key, w.journal.chunks())
            .expect("checked: it has its progress");
        if failed {
            record.finished = w.take_ending();
        }
        self.writes
            .push(self.to.write(record.to_entry(), origin.into()));
        for n in w.journal.chunks()..stale {
            self.writes
                .push(self.to.tombstone(state_key(key, Part::Seen(n))));
        }
        if failed {
            let seen = self.failing.remove(key).unwrap_or_default();
            self.ended.push(WrittenEnded {
                key: key.clone(),
                reason: TerminatedReason::Failed.as_str().to_string(),
                failed: Some((w.journal.chunks(), seen)),
            });
            return true;
        }
        w.dirty = false;
        w.progressed = false;
        w.written_at = self.now;
        w.settle_pending();
        true
    }
}

/// [`DurableState::started`] for a key with a live or ending watch (not a failed run's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlreadyLive;

/// An output in flight: its place in its partition task's send order, and its watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTicket {
    order: u64,
    watch: WatchSlot,
}

#[cfg(test)]
impl SendTicket {
    /// A ticket of no watch, for tests of what happens to an output.
    pub(crate) fn of_no_watch() -> Self {
        SendTicket {
            order: 0,
            watch: WatchSlot(WatchSlot::NONE),
        }
    }
}

/// A live watch's slot in the partition task's slab, which its outputs in flight carry to
/// find it again when their reports come back (an output costs no lookup by key). No other
/// watch takes the slot while one of them is in flight: a watch leaves the slab only once
/// written finished, which waits for its last output's report, and a new run that takes
/// the place of a failed one takes over its count of outputs in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchSlot(u32);

impl WatchSlot {
    /// No live watch (its outputs are sent and counted, and change no watch).
    const NONE: u32 = u32::MAX;
}

/// The outputs in flight, in send order, so that the covered offsets advance only over
/// outputs every one of whose predecessors is handled too. Delivery reports are handled in
/// any order (the task polls them as a set); an output partition assigns offsets in send
/// order, so once every output sent before a ticket is handled, every output of this
/// partition's watches below that ticket's offset has its hash in the journal (or was given
/// up). Advancing on each acknowledgement alone let a checkpoint's offsets pass an output
/// acknowledged but not handled yet, which a read-back from there would miss.
#[derive(Debug, Default)]
struct Sends {
    /// The ticket of `slots[0]`.
    first: u64,
    /// Per ticket from `first`: `None` while in flight, then where it landed (`Some(None)`:
    /// given up, on no partition).
    slots: std::collections::VecDeque<Option<Option<(i32, i64)>>>,
    /// End offsets waiting until every ticket below theirs is handled (at most two: the
    /// oldest, which the front of the queue will reach, and the latest).
    floors: std::collections::VecDeque<(u64, Vec<i64>)>,
}

impl Sends {
    fn sent(&mut self) -> u64 {
        self.slots.push_back(None);
        self.first + self.slots.len() as u64 - 1
    }

    /// `ticket` is handled (landed at `at`, or given up): advance `covered` over every
    /// handled ticket at the front.
    fn handled(&mut self, ticket: u64, at: Option<(i32, i64)>, covered: &mut [i64]) {
        let Some(slot) = ticket
            .checked_sub(self.first)
            .and_then(|i| self.slots.get_mut(usize::try_from(i).ok()?))
        else {
            return;
        };
        *slot = Some(at);
        self.advance(covered);
    }

    /// End offsets read no later than now: applied once every output sent so far is.
    fn floor(&mut self, ends: &[i64], covered: &mut [i64]) {
        let ticket = self.first + self.slots.len() as u64;
        if self.floors.len() >= 2 {
            self.floors.pop_back();
        }
        self.floors.push_back((ticket, ends.to_vec()));
        self.advance(covered);
    }

    /// Give back what a burst of outputs in flight at once (24 bytes each) made the queue
    /// grow to, once none is in flight (at each checkpoint).
    fn release_idle_capacity(&mut self) {
        if self.slots.is_empty() {
            self.slots = std::collections::VecDeque::new();
        }
    }

    fn advance(&mut self, covered: &mut [i64]) {
        while let Some(Some(landed)) = self.slots.front().copied() {
            self.slots.pop_front();
            self.first += 1;
            if let Some((partition, offset)) = landed {
                if let Some(c) = usize::try_from(partition)
                    .ok()
                    .and_then(|p| covered.get_mut(p))
                {
                    *c = (*c).max(offset + 1);
                }
            }
        }
        while self
            .floors
            .front()
            .is_some_and(|(ticket, _)| *ticket <= self.first)
        {
            let (_, ends) = self.floors.pop_front().expect("checked");
            for (c, end) in covered.iter_mut().zip(ends) {
                *c = (*c).max(end);
            }
        }
    }
}

/// The state partition records are written to.
struct Target {
    topic: Arc<str>,
    partition: i32,
}

impl Target {
    fn tombstone(&self, key: Vec<u8>) -> StateWrite {
        StateWrite {
            record: Some(OutRecord::state(&self.topic, self.partition, key, None)),
            origin: Origins::None,
            offsets: false,
        }
    }

    fn offsets(&self, offsets: OutputOffsets) -> StateWrite {
        StateWrite {
            offsets: true,
            ..self.write(offsets.to_entry(), Origins::None)
        }
    }

    /// A record as a state write. The state format refuses records above 1 MB; only a watch
    /// record whose input value is itself near 1 MB could be, and such an input starts no
    /// watch (the partition task dead-letters it, kind `too_large`: see
    /// [`Registration::check_size`]). Should one get here all the same, it is logged and
    /// its input commits as if it were saved, since nothing can be done about it on a
    /// later try.
    fn write(
        &self,
        entry: Result<StateEntry, crate::state::TooLarge>,
        origin: Origins,
    ) -> StateWrite {
        match entry {
            Ok(StateEntry { key, value }) => StateWrite {
                record: Some(OutRecord::state(
                    &self.topic,
                    self.partition,
                    key,
                    Some(value),
                )),
                origin,
                offsets: false,
            },
            Err(e) => {
                tracing::error!(partition = self.partition, error = %e, "a watch cannot be saved to the state topic");
                StateWrite {
                    record: None,
                    origin,
                    offsets: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seen::hash_key;
    use crate::state::{decode_entry, Entry};

    const T0: Millis = 1_700_000_000_000;

    fn state() -> DurableState {
        DurableState::new("st".into(), 2, 60_000, vec![0, 0], vec![5, 7])
    }

    #[test]
    fn a_stored_input_gives_back_its_watch_key_and_registration_with_or_without_a_key() {
        for key in [
            Some(Bytes::from_static(b"user-7")),
            Some(Bytes::new()),
            None,
        ] {
            let r = Registration {
                key: key.clone(),
                value: Bytes::from_static(br#"{"id": 7}"#),
                time: T0,
            };
            // The watch key as the input's key (stored once), and one of its own
            // (`WATCHBRIDGE_WATCH_KEY`), empty too.
            for watch_key in [key.as_deref().unwrap_or(b"k"), b"tenant-9", b""] {
                let mut stored = StoredInput::new(watch_key, &r);
                assert_eq!(stored.watch_key(), watch_key);
                assert_eq!(stored.registration(), r);
                stored.set_tail(&[1, 0, 0, 0, 9, 8]);
                assert_eq!(
                    (stored.watch_key(), stored.registration()),
                    (watch_key, r.clone())
                );
                assert_eq!(stored.tail().resume, Some(&[9][..]));
            }
        }
        let shared = StoredInput::new(b"user-7", &registration_keyed(b"user-7"));
        let own = StoredInput::new(b"tenant-9", &registration_keyed(b"user-7"));
        assert_eq!(
            shared.bytes.len(),
            6 + 2,
            "the key kept once, and nothing else"
        );
        assert_eq!(
            own.bytes.len(),
            4 + 8 + 6 + 2,
            "its own key, with its length"
        );
    }

    fn registration_keyed(key: &'static [u8]) -> Registration {
        Registration {
            key: Some(Bytes::from_static(key)),
            value: Bytes::from_static(b"{}"),
            time: T0,
        }
    }

    #[test]
    fn the_send_order_gives_back_what_a_burst_made_it_grow_to() {
        let mut s = state();
        let key = Bytes::from_static(b"w");
        start(&mut s, &key, 9, &[]);
        let burst = 1_000;
        let tickets: Vec<SendTicket> = (0..burst)
            .map(|_| s.output_sent(s.watch_slot(&key)))
            .collect();
        assert!(s.sends.slots.capacity() >= burst);
        s.checkpoint_records(1, false);
        assert!(s.sends.slots.capacity() >= burst, "kept while in flight");
        for (i, ticket) in tickets.into_iter().enumerate() {
            s.output_acknowledged(ticket, hash_key(&i.to_le_bytes()), 0, i as i64);
        }
        assert!(s.sends.slots.is_empty());
        s.checkpoint_records(2, false);
        assert_eq!(
            s.sends.slots.capacity(),
            0,
            "slots kept after the burst, at the next checkpoint"
        );
        assert_eq!(
            s.covered[0], burst as i64,
            "every acknowledged output covered"
        );
    }

    #[test]
    fn a_live_watch_stays_small() {
        // A million idle watches hold a million of these (issue 19's budget: 300 B per
        // idle watch for the whole bridge); it was 224 bytes before its input was packed, 160
        // after, 136 with the journal's unsealed hashes boxed, 80 with what only its next
        // record needs (progress, next poll, input offset, end) held apart until written.
        let size = std::mem::size_of::<LiveWatch>();
        assert!(size <= 80, "LiveWatch is {size} bytes");
    }

    fn registration() -> Registration {
        Registration {
            key: Some(Bytes::from_static(b"u1")),
            value: Bytes::from_static(br#"{"id":1}"#),
            time: T0,
        }
    }

    /// The engine's checkpoint of the poll whose outputs were just sent (it follows them).
    fn polled(s: &mut DurableState, key: &Bytes) {
        s.checkpoint(
            key,
            Progress::at_start(T0, T0),
            T0 + 1000,
            None,
            None,
            false,
        );
    }

    /// A watch started at T0 from the input at `origin`, knowing `seen`.
    fn start(s: &mut DurableState, key: &Bytes, origin: i64, seen: &[OutputHash]) {
        let at_start = Progress::at_start(T0, T0);
        assert_eq!(
            s.started(key.clone(), registration(), at_start, T0, origin, seen, 0),
            Ok(None)
        );
    }

    /// The writes as (decoded entry, origin; `None` for a starts record's many).
    fn decoded(writes: &[StateWrite]) -> Vec<(Entry, Option<i64>)> {
        writes
            .iter()
            .map(|w| {
                let r = w.record.as_ref().unwrap();
                assert_eq!(r.partition, Some(2), "state partition = input partition");
                let entry = decode_entry(r.key.as_deref().unwrap(), r.value.as_deref()).unwrap();
                let origin = match w.origin {
                    Origins::One(o) => Some(o),
                    Origins::None | Origins::Many(_) => None,
                };
                (entry, origin)
            })
            .collect()
    }

    #[test]
    fn a_new_watch_is_written_once_with_its_origin_then_only_when_it_changes() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 41, &[]);
        let first = decoded(&s.checkpoint_records(T0, false));
        // Its record (listing no chunk), carrying the input offset, then the offsets the
        // read-back had reached.
        assert!(
            matches!(&first[0], (Entry::Watch(w), Some(41)) if w.seen_chunks == 0 && w.finished.is_none())
        );
        assert!(
            matches!(&first[1], (Entry::OutputOffsets(o), None) if o.offsets == vec![(0, 5), (1, 7)])
        );
        assert_eq!(first.len(), 2);
        assert!(
            s.checkpoint_records(T0, false).is_empty(),
            "nothing changed"
        );
    }

    /// The starts records among `writes` → (number, member keys), and the starts keys
    /// deleted.
    fn starts_of(writes: &[StateWrite]) -> (Vec<(u32, Vec<Bytes>)>, Vec<u32>) {
        let (mut written, mut deleted) = (Vec::new(), Vec::new());
        for (entry, _) in decoded(writes) {
            match entry {
                Entry::Starts(b) => {
                    written.push((b.seq, b.watches.into_iter().map(|w| w.watch_key).collect()))
                }
                Entry::StartsDeleted { seq } => deleted.push(seq),
                _ => {}
            }
        }
        (written, deleted)
    }

    #[test]
    fn the_new_watches_of_a_checkpoint_share_one_starts_record_carrying_every_input() {
        let mut s = state();
        let keys: Vec<Bytes> = (0..3).map(|i| Bytes::from(format!("u{i}"))).collect();
        for (key, origin) in keys.iter().zip(40..) {
            start(&mut s, key, origin, &[]);
        }
        let writes = s.checkpoint_records(T0, false);
        let (written, deleted) = starts_of(&writes);
        assert_eq!(written.len(), 1, "{writes:?}");
        let (seq, mut members) = written[0].clone();
        members.sort();
        assert_eq!((seq, members), (1, keys.clone()));
        assert!(deleted.is_empty());
        let mut origins: Vec<i64> = writes.iter().flat_map(|w| w.origin.iter()).collect();
        origins.sort();
        assert_eq!(
            origins,
            vec![40, 41, 42],
            "every input commits once it is acknowledged"
        );
        // One record per watch would be three records then the offsets.
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(
            s.checkpoint_records(T0, false).is_empty(),
            "nothing changed"
        );
    }

    #[test]
    fn a_starts_record_is_deleted_the_checkpoint_after_its_last_member_has_its_own() {
        let mut s = state();
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        start(&mut s, &a, 1, &[]);
        start(&mut s, &b, 2, &[]);
        assert_eq!(starts_of(&s.checkpoint_records(T0, false)).0.len(), 1);
        // a finds an output: its own record (and chunk); b still relies on the starts.
        let sent = s.output_sent(s.watch_slot(&a));
        polled(&mut s, &a);
        s.output_acknowledged(sent, hash_key(b"e1"), 0, 5);
        let w = s.checkpoint_records(T0 + 1, false);
        assert!(decoded(&w)
            .iter()
            .any(|(e, _)| matches!(e, Entry::Watch(r) if r.watch_key == a)));
        assert_eq!(starts_of(&w).1, Vec::<u32>::new());
        assert!(starts_of(&s.checkpoint_records(T0 + 2, false)).1.is_empty());
        // b's progress comes due: its own record; the starts record goes one checkpoint
        // later, once that record is acknowledged.
        s.checkpoint(&b, Progress::at_start(T0, T0), T0 + 1000, None, None, false);
        let w = s.checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS, false);
        assert!(decoded(&w)
            .iter()
            .any(|(e, _)| matches!(e, Entry::Watch(r) if r.watch_key == b)));
        assert!(
            starts_of(&w).1.is_empty(),
            "not with the record that replaces it"
        );
        let w = s.checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS + 1, false);
        assert_eq!(starts_of(&w).1, vec![1]);
        assert!(s
            .checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS + 2, false)
            .is_empty());
    }

    /// The watch's records (not starts records) among `writes`, with their resume state.
    fn resumes(writes: &[StateWrite]) -> Vec<Option<Bytes>> {
        decoded(writes)
            .into_iter()
            .filter_map(|(e, _)| match e {
                Entry::Watch(r) => Some(r.resume),
                _ => None,
            })
            .collect()
    }

    /// The watch's records among `writes`, with their conditions' states.
    fn conditions(writes: &[StateWrite]) -> Vec<Option<Bytes>> {
        decoded(writes)
            .into_iter()
            .filter_map(|(e, _)| match e {
                Entry::Watch(r) => Some(r.conditions),
                _ => None,
            })
            .collect()
    }

    /// A poller state that moved past outputs still in flight (an HTTP `since=` newer than
    /// they are) reaches the watch's record only once they are delivered: written before,
    /// a crash would make the restored watch ask only for what came after them.
    #[test]
    fn a_resume_state_waits_for_the_outputs_before_it() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 1, &[]);
        s.checkpoint_records(T0, false);
        let sent = s.output_sent(s.watch_slot(&key));
        s.checkpoint(
            &key,
            Progress::at_start(T0, T0),
            T0 + 1000,
            Some(b"R1".to_vec()),
            Some(b"C1".to_vec()),
            false,
        );
        let at = T0 + PROGRESS_WRITE_INTERVAL_MS;
        assert_eq!(resumes(&s.checkpoint_records(at, true)), [None]);
        s.output_acknowledged(sent, hash_key(b"e1"), 0, 5);
        let writes = s.checkpoint_records(at + 1, true);
        assert_eq!(resumes(&writes), [Some(Bytes::from_static(b"R1"))]);
        // The conditions' states (a count of outputs, say) wait the same way.
        assert_eq!(conditions(&writes), [Some(Bytes::from_static(b"C1"))]);
        // With nothing in flight it goes in at once, and later records keep it.
        s.checkpoint(
            &key,
            Progress::at_start(T0, T0),
            T0 + 2000,
            Some(b"R2".to_vec()),
            None,
            false,
        );
        assert_eq!(
            resumes(&s.checkpoint_records(at + 2, true)),
            [Some(Bytes::from_static(b"R2"))]
        );
        // Held back by a stop (outputs left unsent): not kept at all.
        s.checkpoint(
            &key,
            Progress::at_start(T0, T0),
            T0 + 3000,
            Some(b"R3".to_vec()),
            Some(b"C3".to_vec()),
            true,
        );
        let writes = s.checkpoint_records(at + 3, true);
        assert_eq!(resumes(&writes), [Some(Bytes::from_static(b"R2"))]);
        // The input is still whole beside it.
        let w = decoded(&writes);
        let Entry::Watch(r) = &w[0].0 else {
            panic!("{w:?}")
        };
        assert_eq!(r.registration(), registration());
    }

    #[test]
    fn a_finished_record_outlives_every_starts_record_that_may_hold_its_watch() {
        let mut s = state();
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        start(&mut s, &a, 1, &[]);
        start(&mut s, &b, 2, &[]);
        s.checkpoint_records(T0, false);
        s.terminated(&a, T0 + 10, &TerminatedReason::Final, SeenSet::new());
        let w = decoded(&s.checkpoint_records(T0 + 10, false));
        assert!(matches!(&w[0].0, Entry::Watch(r) if r.watch_key == a && r.finished.is_some()));
        // Past the retention, b still relies on starts record 1, which lists a as live: a's
        // finished record stays (deleted, compaction would leave the starts record's copy).
        let past = T0 + 10 + 60_000;
        let w = decoded(&s.checkpoint_records(past, false));
        assert!(
            !w.iter().any(|(e, _)| matches!(
                e,
                Entry::Tombstone {
                    part: Part::Watch,
                    ..
                }
            )),
            "{w:?}"
        );
        assert!(s.is_finished(&a));
        s.checkpoint(&b, Progress::at_start(T0, T0), past, None, None, false);
        s.checkpoint_records(past + PROGRESS_WRITE_INTERVAL_MS, false);
        let w = decoded(&s.checkpoint_records(past + PROGRESS_WRITE_INTERVAL_MS + 1, false));
        let deleted = |w: &[(Entry, Option<i64>)]| -> Vec<String> {
            w.iter()
                .filter_map(|(e, _)| match e {
                    Entry::StartsDeleted { seq } => Some(format!("starts {seq}")),
                    Entry::Tombstone {
                        watch_key,
                        part: Part::Watch,
                    } => Some(String::from_utf8_lossy(watch_key).into_owned()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(deleted(&w), vec!["starts 1"]);
        let w = decoded(&s.checkpoint_records(past + PROGRESS_WRITE_INTERVAL_MS + 2, false));
        assert_eq!(deleted(&w), vec!["a"], "once the starts record is gone");
        assert!(!s.is_finished(&a));
    }

    #[test]
    fn hashes_are_written_only_once_acknowledged_and_chunks_precede_their_record_and_offsets() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        let sent = s.output_sent(s.watch_slot(&key));
        let _second = s.output_sent(s.watch_slot(&key));
        s.checkpoint(
            &key,
            Progress::at_start(T0, T0),
            T0 + 1000,
            None,
            None,
            false,
        );
        // Progress alone: written once it is PROGRESS_WRITE_INTERVAL_MS old, or when the
        // partition is given up; the record only, no chunk, offsets unchanged.
        assert!(s.checkpoint_records(T0 + 1, false).is_empty());
        let w = decoded(&s.checkpoint_records(T0 + 1, true));
        assert_eq!(w.len(), 1);
        assert!(
            matches!(&w[0], (Entry::Watch(r), None) if r.seen_chunks == 0 && r.next_poll == T0 + 1000)
        );
        s.checkpoint(
            &key,
            Progress::at_start(T0, T0),
            T0 + 2000,
            None,
            None,
            false,
        );
        assert!(s
            .checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS, false)
            .is_empty());
        // Progress is found by the visit of every watch, at most VISIT_ALL_INTERVAL_MS after
        // it is due (that visit came at T0 + PROGRESS_WRITE_INTERVAL_MS).
        assert!(s
            .checkpoint_records(T0 + 1 + PROGRESS_WRITE_INTERVAL_MS, false)
            .is_empty());
        let due = T0 + PROGRESS_WRITE_INTERVAL_MS + VISIT_ALL_INTERVAL_MS;
        assert_eq!(s.checkpoint_records(due, false).len(), 1);

        s.output_acknowledged(sent, hash_key(b"e1"), 1, 30);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert_eq!(w.len(), 3, "{w:?}");
        match &w[0].0 {
            Entry::Seen { chunk, .. } => assert_eq!(chunk.hashes(), &[hash_key(b"e1")]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(&w[1].0, Entry::Watch(r) if r.seen_chunks == 1));
        assert!(matches!(&w[2].0, Entry::OutputOffsets(o) if o.offsets == vec![(0, 5), (1, 31)]));
    }

    #[test]
    fn a_finished_watch_waits_for_its_outputs_then_is_kept_for_the_retention_and_deleted() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        let sent = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent, hash_key(b"e1"), 0, 5);
        s.checkpoint_records(T0, false);
        let sent = s.output_sent(s.watch_slot(&key));
        s.terminated(&key, T0 + 10, &TerminatedReason::Final, SeenSet::new());
        // Its last output is in flight: still live, nothing to say yet; but it has ended,
        // so its input does not start it again.
        assert!(s.checkpoint_records(T0 + 11, false).is_empty());
        assert!(s.is_finished(&key));
        assert_eq!(s.ended_status(&key), Some((T0 + 10, "final")));
        s.output_acknowledged(sent, hash_key(b"e2"), 0, 6);
        let w = decoded(&s.checkpoint_records(T0 + 12, false));
        assert!(
            matches!(&w[0].0, Entry::Watch(r) if r.finished.as_ref().is_some_and(|f| f.reason == "final") && r.seen_chunks == 0),
            "{w:?}"
        );
        assert!(matches!(
            &w[1].0,
            Entry::Tombstone {
                part: Part::Seen(0),
                ..
            }
        ));
        assert!(matches!(&w[2].0, Entry::OutputOffsets(o) if o.offsets[0] == (0, 7)));
        assert!(s.is_finished(&key));
        assert_eq!(s.live(), 0);
        // When and why, for the operations API: before the end is written and after.
        assert_eq!(s.ended_status(&key), Some((T0 + 12, "final")));
        assert_eq!(s.ended_watches(), [(&key[..], T0 + 12, "final")]);
        // Within the retention it stays; after, its record is deleted.
        assert!(s.checkpoint_records(T0 + 12 + 59_999, false).is_empty());
        let w = decoded(&s.checkpoint_records(T0 + 12 + 60_000, false));
        assert!(matches!(
            &w[0].0,
            Entry::Tombstone {
                part: Part::Watch,
                ..
            }
        ));
        assert!(!s.is_finished(&key));
    }

    #[test]
    fn outputs_found_for_a_watch_not_started_again_pin_the_offsets_until_it_is() {
        let mut s = state();
        let key = Bytes::from_static(b"u9");
        s.preseen(key.clone(), vec![hash_key(b"e1")]);
        let other = Bytes::from_static(b"u1");
        start(&mut s, &other, 3, &[]);
        let w = decoded(&s.checkpoint_records(T0, false));
        assert_eq!(w.len(), 1, "no offsets past outputs in no chunk: {w:?}");
        // Its input comes again: it starts knowing the output, which is written.
        let seen = s.take_preseen(&key).unwrap();
        start(&mut s, &key, 4, &seen);
        let w = decoded(&s.checkpoint_records(T0, false));
        assert!(
            matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.hashes() == [hash_key(b"e1")])
        );
        assert!(matches!(&w[1], (Entry::Watch(_), Some(4))));
        assert!(matches!(&w[2].0, Entry::OutputOffsets(_)));
    }

    #[test]
    fn the_offsets_pass_an_output_only_once_every_output_sent_before_it_is_handled() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        // Two outputs to output partition 0 (offsets 10 and 11, in send order); the second's
        // acknowledgement is handled first (delivery reports complete in any order).
        let a = s.output_sent(s.watch_slot(&key));
        let b = s.output_sent(s.watch_slot(&key));
        polled(&mut s, &key);
        s.output_acknowledged(b, hash_key(b"b"), 0, 11);
        let w = decoded(&s.checkpoint_records(T0 + 1, false));
        // The first is on the topic but in no chunk: a read-back from past it would miss it.
        assert!(
            w.iter().all(|(e, _)| !matches!(e, Entry::OutputOffsets(_))),
            "the offsets passed an output whose hash is in no chunk: {w:?}"
        );
        s.output_acknowledged(a, hash_key(b"a"), 0, 10);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(
            matches!(&w.last().unwrap().0, Entry::OutputOffsets(o) if o.offsets == vec![(0, 12), (1, 7)]),
            "{w:?}"
        );
    }

    #[test]
    fn outputs_acknowledged_before_their_polls_progress_wait_for_it_and_hold_the_offsets() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        assert!(s.live.get(&key).unwrap().pending.is_none(), "idle: let go");
        // The engine sends a poll's outputs, then its checkpoint; an acknowledgement may be
        // handled in between. The watch has a new hash and no progress to write it with.
        let sent = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent, hash_key(b"e1"), 0, 5);
        let w = decoded(&s.checkpoint_records(T0 + 1, false));
        assert!(
            w.iter().all(|(e, _)| !matches!(e, Entry::OutputOffsets(_))),
            "the offsets vouch for an output whose hash is in no chunk: {w:?}"
        );
        assert!(w.is_empty(), "{w:?}");
        // Its progress comes: the next checkpoint writes the chunk, the record, the offsets.
        let progress = Progress {
            polls: 1,
            ..Progress::at_start(T0, T0)
        };
        s.checkpoint(&key, progress, T0 + 5_000, None, None, false);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(
            matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.hashes() == [hash_key(b"e1")])
        );
        assert!(
            matches!(&w[1].0, Entry::Watch(r) if r.polls == 1 && r.next_poll == T0 + 5_000),
            "{w:?}"
        );
        assert!(
            matches!(&w[2].0, Entry::OutputOffsets(o) if o.offsets[0] == (0, 6)),
            "{w:?}"
        );
        assert!(
            s.live.get(&key).unwrap().pending.is_none(),
            "written: let go"
        );
    }

    #[test]
    fn a_watch_keeps_its_progress_while_an_output_is_in_flight_and_writes_it_again() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        let (a, b) = (
            s.output_sent(s.watch_slot(&key)),
            s.output_sent(s.watch_slot(&key)),
        );
        let progress = Progress {
            polls: 3,
            ..Progress::at_start(T0, T0)
        };
        s.checkpoint(&key, progress, T0 + 7_000, None, None, false);
        s.output_acknowledged(a, hash_key(b"a"), 0, 1);
        s.checkpoint_records(T0 + 1, false);
        // Written, but an acknowledgement is still to come: its progress is kept for it.
        assert!(s.live.get(&key).unwrap().pending.is_some());
        s.output_acknowledged(b, hash_key(b"b"), 0, 2);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(
            w.iter().any(
                |(e, _)| matches!(e, Entry::Watch(r) if r.polls == 3 && r.next_poll == T0 + 7_000)
            ),
            "{w:?}"
        );
        assert!(s.live.get(&key).unwrap().pending.is_none());
    }

    #[test]
    fn end_offsets_seen_while_outputs_were_in_flight_raise_the_offsets_once_those_are_handled() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        // Nothing of ours in flight: the ends of every output partition (neighbours wrote
        // there) are the offsets at once; a recovery needs nothing below them.
        s.output_ends(&[100, 200]);
        let w = decoded(&s.checkpoint_records(T0 + 1, false));
        assert!(
            matches!(&w.last().unwrap().0, Entry::OutputOffsets(o) if o.offsets == vec![(0, 100), (1, 200)]),
            "{w:?}"
        );
        // An output sent before the ends were read may lie below them, and its hash is in
        // no chunk until its acknowledgement is handled: the ends wait for it.
        let t = s.output_sent(s.watch_slot(&key));
        polled(&mut s, &key);
        s.output_ends(&[300, 400]);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(
            w.iter().all(|(e, _)| !matches!(e, Entry::OutputOffsets(_))),
            "{w:?}"
        );
        s.output_acknowledged(t, hash_key(b"x"), 0, 150);
        let w = decoded(&s.checkpoint_records(T0 + 3, false));
        assert!(
            matches!(&w.last().unwrap().0, Entry::OutputOffsets(o) if o.offsets == vec![(0, 300), (1, 400)]),
            "{w:?}"
        );
    }

    #[test]
    fn an_output_given_up_is_not_recorded_and_does_not_hold_the_ending() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        s.checkpoint_records(T0, false);
        let sent = s.output_sent(s.watch_slot(&key));
        s.terminated(&key, T0 + 1, &TerminatedReason::Final, SeenSet::new());
        s.output_given_up(sent);
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(matches!(&w[0].0, Entry::Watch(r) if r.finished.is_some()));
        assert_eq!(w.len(), 1, "no chunk was written, none to delete: {w:?}");
    }

    #[test]
    fn a_watch_with_nothing_new_for_the_progress_interval_lets_its_tail_go() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        let sent = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent, hash_key(b"a"), 0, 5);
        let first = decoded(&s.checkpoint_records(T0, false));
        assert!(matches!(&first[0], (Entry::Seen { chunk: c, .. }, None) if c.index() == 0));
        assert!(
            s.live.get(&key).unwrap().journal.heap_bytes() > 0,
            "the tail is held"
        );
        assert!(s.checkpoint_records(T0 + 1, false).is_empty());
        assert!(
            s.live.get(&key).unwrap().journal.heap_bytes() > 0,
            "still recent"
        );
        assert!(s
            .checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS, false)
            .is_empty());
        assert_eq!(
            s.live.get(&key).unwrap().journal.heap_bytes(),
            0,
            "released"
        );
        // A later output goes to a new chunk; the record lists both.
        let sent = s.output_sent(s.watch_slot(&key));
        polled(&mut s, &key);
        s.output_acknowledged(sent, hash_key(b"b"), 0, 6);
        let later = decoded(&s.checkpoint_records(T0 + PROGRESS_WRITE_INTERVAL_MS + 1, false));
        assert!(
            matches!(&later[0], (Entry::Seen { chunk: c, .. }, None) if c.index() == 1 && c.hashes().len() == 1)
        );
        assert!(matches!(&later[1], (Entry::Watch(r), None) if r.seen_chunks == 2));
    }

    #[test]
    fn a_start_never_replaces_a_live_or_ending_watch() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 3, &[]);
        let at_start = Progress::at_start(T0, T0);
        assert_eq!(
            s.started(key.clone(), registration(), at_start, T0, 9, &[], 0),
            Err(AlreadyLive)
        );
        // Ended before its first record was written: the ending keeps its origin.
        s.terminated(&key, T0 + 1, &TerminatedReason::Final, SeenSet::new());
        assert_eq!(
            s.started(key.clone(), registration(), at_start, T0, 9, &[], 0),
            Err(AlreadyLive)
        );
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(
            matches!(&w[0], (Entry::Watch(r), Some(3)) if r.finished.is_some()),
            "{w:?}"
        );
        assert_eq!(s.live(), 0);
    }

    #[test]
    fn a_failed_watch_keeps_its_seen_chunks_for_the_retention_and_its_input_starts_it_again() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        let sent1 = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent1, hash_key(b"e1"), 0, 5);
        s.checkpoint_records(T0, false);
        let sent2 = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent2, hash_key(b"e2"), 0, 6);
        let seen = SeenSet::from_hashes([hash_key(b"e1"), hash_key(b"e2")]);
        s.terminated(&key, T0 + 10, &TerminatedReason::Failed, seen);
        assert!(!s.is_finished(&key), "its input may start it again");
        // Its last chunk, then its record, failed, listing it: no chunk is deleted.
        let w = decoded(&s.checkpoint_records(T0 + 11, false));
        assert!(
            matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.index() == 0 && chunk.hashes().len() == 2),
            "{w:?}"
        );
        assert!(
            matches!(&w[1].0, Entry::Watch(r) if r.finished.as_ref().is_some_and(|f| f.reason == "failed") && r.seen_chunks == 1),
            "{w:?}"
        );
        assert!(matches!(&w[2].0, Entry::OutputOffsets(_)), "{w:?}");
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(s.live(), 0);
        assert!(!s.is_finished(&key));

        // Its input again: it starts knowing both outputs, from new chunks.
        let restart = s.take_failed(&key).expect("kept");
        assert_eq!((restart.seen.len(), restart.chunks), (2, 1));
        let hashes: Vec<OutputHash> = restart.seen.iter().collect();
        let released = s.started(
            key.clone(),
            registration(),
            Progress::at_start(T0, T0 + 20),
            T0 + 20,
            7,
            &hashes,
            restart.chunks,
        );
        assert_eq!(released, Ok(None));
        let w = decoded(&s.checkpoint_records(T0 + 21, false));
        assert!(
            matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.index() == 0 && chunk.hashes().len() == 2)
        );
        assert!(
            matches!(&w[1], (Entry::Watch(r), Some(7)) if r.finished.is_none() && r.seen_chunks == 1)
        );
        assert!(s.take_failed(&key).is_none());

        // A failed watch whose input does not come again: its record and chunks are deleted
        // once the retention has passed.
        let other = Bytes::from_static(b"u2");
        start(&mut s, &other, 8, &[]);
        for (n, e) in [b"a", b"b", b"c"].iter().enumerate() {
            let sent3 = s.output_sent(s.watch_slot(&other));
            polled(&mut s, &other);
            s.output_acknowledged(sent3, hash_key(*e), 0, 10 + n as i64);
            // A chunk each: nothing new for the progress interval releases the tail.
            s.checkpoint_records(T0 + 30 + n as Millis * PROGRESS_WRITE_INTERVAL_MS, false);
            s.checkpoint_records(
                T0 + 30 + (n as Millis + 1) * PROGRESS_WRITE_INTERVAL_MS,
                false,
            );
        }
        let at = T0 + 10 * PROGRESS_WRITE_INTERVAL_MS;
        s.terminated(&other, at, &TerminatedReason::Failed, SeenSet::new());
        s.checkpoint_records(at, false);
        assert!(s.checkpoint_records(at + 59_999, false).is_empty());
        let w = decoded(&s.checkpoint_records(at + 60_000, false));
        let mut deleted: Vec<Part> = w
            .iter()
            .filter_map(|(e, _)| match e {
                Entry::Tombstone { watch_key, part } if watch_key == &other => Some(*part),
                _ => None,
            })
            .collect();
        deleted.sort_by_key(|p| format!("{p:?}"));
        assert_eq!(
            deleted,
            [Part::Seen(0), Part::Seen(1), Part::Seen(2), Part::Watch],
            "{w:?}"
        );
        assert!(s.take_failed(&other).is_none());
    }

    #[test]
    fn a_watch_started_again_with_fewer_chunks_than_before_deletes_the_rest() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        // Its earlier run left 3 chunks; the hashes fit in one now.
        let _ = s.started(
            key.clone(),
            registration(),
            Progress::at_start(T0, T0),
            T0,
            0,
            &[hash_key(b"a"), hash_key(b"b")],
            3,
        );
        let w = decoded(&s.checkpoint_records(T0, false));
        assert!(matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.index() == 0));
        assert!(matches!(&w[1].0, Entry::Watch(r) if r.seen_chunks == 1));
        assert!(
            matches!(
                &w[2].0,
                Entry::Tombstone {
                    part: Part::Seen(1),
                    ..
                }
            ),
            "{w:?}"
        );
        assert!(
            matches!(
                &w[3].0,
                Entry::Tombstone {
                    part: Part::Seen(2),
                    ..
                }
            ),
            "{w:?}"
        );
        assert!(matches!(&w[4].0, Entry::OutputOffsets(_)), "{w:?}");
    }

    #[test]
    fn a_finished_watch_still_deletes_its_chunks_and_is_not_started_again() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 0, &[]);
        let sent4 = s.output_sent(s.watch_slot(&key));
        s.output_acknowledged(sent4, hash_key(b"e1"), 0, 5);
        s.checkpoint_records(T0, false);
        s.terminated(
            &key,
            T0 + 1,
            &TerminatedReason::Total,
            SeenSet::from_hashes([hash_key(b"e1")]),
        );
        assert!(s.is_finished(&key));
        let w = decoded(&s.checkpoint_records(T0 + 2, false));
        assert!(matches!(&w[0].0, Entry::Watch(r) if r.seen_chunks == 0 && r.finished.is_some()));
        assert!(matches!(
            &w[1].0,
            Entry::Tombstone {
                part: Part::Seen(0),
                ..
            }
        ));
        assert!(s.take_failed(&key).is_none());
    }

    #[test]
    fn a_run_that_failed_before_its_first_record_is_replaced_and_both_inputs_wait_for_one() {
        let mut s = state();
        let key = Bytes::from_static(b"u1");
        start(&mut s, &key, 4, &[]);
        s.terminated(&key, T0 + 1, &TerminatedReason::Failed, SeenSet::new());
        // Its input again, before the failed run was written at all.
        let restart = s.take_failed(&key).expect("a failing run");
        assert_eq!(restart.chunks, 0);
        let released = s.started(
            key.clone(),
            registration(),
            Progress::at_start(T0, T0 + 2),
            T0 + 2,
            9,
            &[],
            restart.chunks,
        );
        assert_eq!(released, Ok(Some(9)), "the later input need not wait");
        let w = decoded(&s.checkpoint_records(T0 + 3, false));
        assert!(
            matches!(&w[0], (Entry::Watch(r), Some(4)) if r.finished.is_none()),
            "one live record, carrying the earlier input: {w:?}"
        );
    }
}

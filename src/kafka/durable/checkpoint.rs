//! The records a checkpoint writes, in the order they must be written, and the state
//! partition they go to.

use super::live::LiveWatch;
use super::{DurableState, Ended, FailedWatch, PROGRESS_WRITE_INTERVAL_MS, VISIT_ALL_INTERVAL_MS};
use crate::clock::Millis;
use crate::kafka::offsets::Origins;
use crate::kafka::records::OutRecord;
use crate::keyed::Keyed;
use crate::reason::TerminatedReason;
use crate::seen::SeenSet;
use crate::state::{starts_key, state_key, OutputOffsets, Part, StateEntry, WatchRecord};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

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

impl DurableState {
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

    pub(super) fn target(&self) -> Target {
        Target {
            topic: self.topic.clone(),
            partition: self.partition,
        }
    }
}

/// A watch a checkpoint wrote as ended: its key, why, and for a failed one its chunks and
/// seen set.
struct WrittenEnded {
    key: Bytes,
    reason: String,
    failed: Option<(u32, SeenSet)>,
}

/// One checkpoint's visit of the watches: what it writes and what ends.
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

/// The state partition records are written to.
pub(super) struct Target {
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
    pub(super) fn write(
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

//! A live watch as the state topic knows it, and what only its next record needs
//! ([`Pending`]), held apart so that an idle watch stays small.

use super::stored_input::StoredInput;
use crate::clock::Millis;
use crate::keyed::Keyed;
use crate::state::{Finished, SeenJournal, WatchRecord};
use crate::watch::Progress;
use bytes::Bytes;

/// A live watch as the state topic knows it, and what it does not know yet.
#[derive(Debug)]
pub(super) struct LiveWatch {
    pub(super) input: StoredInput,
    pub(super) journal: SeenJournal,
    /// What only its next record needs (see [`Pending`]); `None` on an idle watch.
    pub(super) pending: Option<Box<Pending>>,
    /// Outputs handed to the producer, neither acknowledged nor given up yet.
    pub(super) in_flight: u32,
    /// Changed in a way the next checkpoint must write (new, or new seen hashes).
    pub(super) dirty: bool,
    /// Its progress changed since its record was last written.
    pub(super) progressed: bool,
    /// In [`DurableState::touched`] since the last checkpoint.
    pub(super) touched: bool,
    /// When its record was last written.
    pub(super) written_at: Millis,
    /// The starts record that holds its only record on the topic (0: it has a record of
    /// its own, or none yet).
    pub(super) relies_on: u32,
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
/// [`PROGRESS_WRITE_INTERVAL_MS`](super::PROGRESS_WRITE_INTERVAL_MS)).
///
/// Its progress comes with the engine's checkpoint of a poll, which the engine sends after
/// that poll's outputs: an output may be acknowledged before it arrives. Such a watch has
/// new hashes and nothing to write them with; a checkpoint leaves it for the next one and
/// holds the output offsets back meanwhile (they would vouch for hashes in no chunk).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) progress: Progress,
    pub(super) next_poll: Millis,
    /// The input offset whose commit waits for this watch's first record (taken when that
    /// record is written), or [`Pending::NO_ORIGIN`].
    pub(super) origin: i64,
    /// Ended, waiting for its outputs in flight before it is written as finished (boxed:
    /// rare).
    pub(super) ending: Option<Box<Finished>>,
}

impl Pending {
    /// No input waits for its record (input offsets are never negative).
    pub(super) const NO_ORIGIN: i64 = -1;

    pub(super) fn new(progress: Progress, next_poll: Millis, origin: i64) -> Box<Self> {
        Box::new(Self {
            progress,
            next_poll,
            origin,
            ending: None,
        })
    }
}

impl LiveWatch {
    pub(super) fn origin(&self) -> Option<i64> {
        self.pending
            .as_ref()
            .map(|p| p.origin)
            .filter(|&o| o != Pending::NO_ORIGIN)
    }

    pub(super) fn take_origin(&mut self) -> Option<i64> {
        let origin = self.origin();
        if let Some(p) = self.pending.as_mut() {
            p.origin = Pending::NO_ORIGIN;
        }
        origin
    }

    /// Its progress and next poll are written, and no acknowledgement to come needs them
    /// again: let them go.
    pub(super) fn settle_pending(&mut self) {
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
    pub(super) fn ending(&self) -> Option<&Finished> {
        self.pending.as_ref()?.ending.as_deref()
    }

    pub(super) fn take_ending(&mut self) -> Option<Finished> {
        self.pending.as_mut()?.ending.take().map(|f| *f)
    }

    /// It ended. The poll that ended it sent no progress: one it no longer holds is taken
    /// as of its input's arrival. A finished record keeps no progress that anything reads
    /// back (a restore takes only when and why it ended; [`crate::engine`]).
    pub(super) fn set_ending(&mut self, finished: Finished) {
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
    pub(super) fn record(&self, key: &Bytes, chunks: u32) -> Option<WatchRecord> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_watch_stays_small() {
        // A million idle watches hold a million of these (issue 19's budget: 300 B per
        // idle watch for the whole bridge); it was 224 bytes before its input was packed, 160
        // after, 136 with the journal's unsealed hashes boxed, 80 with what only its next
        // record needs (progress, next poll, input offset, end) held apart until written.
        let size = std::mem::size_of::<LiveWatch>();
        assert!(size <= 80, "LiveWatch is {size} bytes");
    }
}

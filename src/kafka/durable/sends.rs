//! Outputs in flight: their tickets, the slot of the watch their reports find again, and
//! the send order the covered output offsets advance in.

use super::DurableState;
use crate::keyed::Keyed;
use crate::seen::OutputHash;

impl DurableState {
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
}

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
pub(super) struct Sends {
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
    pub(super) fn sent(&mut self) -> u64 {
        self.slots.push_back(None);
        self.first + self.slots.len() as u64 - 1
    }

    /// `ticket` is handled (landed at `at`, or given up): advance `covered` over every
    /// handled ticket at the front.
    pub(super) fn handled(&mut self, ticket: u64, at: Option<(i32, i64)>, covered: &mut [i64]) {
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
    pub(super) fn floor(&mut self, ends: &[i64], covered: &mut [i64]) {
        let ticket = self.first + self.slots.len() as u64;
        if self.floors.len() >= 2 {
            self.floors.pop_back();
        }
        self.floors.push_back((ticket, ends.to_vec()));
        self.advance(covered);
    }

    /// Give back what a burst of outputs in flight at once (24 bytes each) made the queue
    /// grow to, once none is in flight (at each checkpoint).
    pub(super) fn release_idle_capacity(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::durable::tests::{decoded, polled, start, state, T0};
    use crate::seen::hash_key;
    use crate::state::Entry;
    use bytes::Bytes;

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
}

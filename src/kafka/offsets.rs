//! Commit discipline for one input partition: an input offset is committed only after what
//! it needs is acknowledged by the broker — its dead-letter record, or its watch's first
//! record on the state topic (so the watch survives a crash without its input), or nothing
//! when its watch was already running or finished. Outputs hold no input's commit: the
//! state topic and the recovery's read-back of the output topic account for them
//! (`kafka/durable/`).
//!
//! The position to commit is the lowest offset that still has something outstanding, or,
//! when nothing is, the offset after the last input handed to the engine.

use std::collections::BTreeMap;

/// The inputs whose commit waits for one record: none (an output, a watermark), one (a
/// dead letter, a watch's own first record), or many (a starts record, which holds the
/// first records of every watch one checkpoint started).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Origins {
    #[default]
    None,
    One(i64),
    Many(Box<[i64]>),
}

impl Origins {
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        let (one, many): (Option<i64>, &[i64]) = match self {
            Origins::None => (None, &[]),
            Origins::One(o) => (Some(*o), &[]),
            Origins::Many(m) => (None, m),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

impl From<Option<i64>> for Origins {
    fn from(origin: Option<i64>) -> Self {
        origin.map_or(Origins::None, Origins::One)
    }
}

#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Offset of an input → records it caused that the broker has not acknowledged yet.
    outstanding: BTreeMap<i64, u32>,
    /// The offset after the last input fully handed over (`None` before the first one).
    next: Option<i64>,
    /// The last position returned by [`OffsetTracker::to_commit`].
    committed: Option<i64>,
}

impl OffsetTracker {
    /// The input at `offset` has been handed over: its watch command sent, or its
    /// dead-letter record enqueued (which [`caused`](Self::caused) counted first).
    pub fn consumed(&mut self, offset: i64) {
        self.next = Some(self.next.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// A record caused by the input at `offset` was enqueued on the producer.
    pub fn caused(&mut self, offset: i64) {
        *self.outstanding.entry(offset).or_insert(0) += 1;
    }

    /// The broker acknowledged one record caused by the input at `offset`.
    pub fn acknowledged(&mut self, offset: i64) {
        if let Some(n) = self.outstanding.get_mut(&offset) {
            *n -= 1;
            if *n == 0 {
                self.outstanding.remove(&offset);
            }
        }
    }

    /// The broker acknowledged a record every one of `origins` waited for.
    pub fn acknowledged_all(&mut self, origins: &Origins) {
        for offset in origins.iter() {
            self.acknowledged(offset);
        }
    }

    /// The offset after the last input handed over, if any.
    pub fn next(&self) -> Option<i64> {
        self.next
    }

    /// The last position handed out by [`to_commit`](Self::to_commit).
    pub fn committed(&self) -> Option<i64> {
        self.committed
    }

    /// Records enqueued and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.outstanding.values().map(|&n| n as u64).sum()
    }

    /// The position that may be committed now (the next offset to consume), if it moved
    /// since the last call.
    pub fn to_commit(&mut self) -> Option<i64> {
        let next = self.next?;
        let position = match self.outstanding.first_key_value() {
            Some((&lowest, _)) => lowest.min(next),
            None => next,
        };
        if self.committed.is_some_and(|c| c >= position) {
            return None;
        }
        self.committed = Some(position);
        Some(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_past_inputs_whose_records_are_all_acknowledged() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.to_commit(), None, "nothing consumed yet");
        t.consumed(10);
        assert_eq!(t.to_commit(), Some(11));
        assert_eq!(t.to_commit(), None, "unchanged");
        t.caused(11);
        t.consumed(11);
        t.consumed(12);
        assert_eq!(t.to_commit(), None, "11 has an output in flight");
        t.acknowledged(11);
        assert_eq!(t.to_commit(), Some(13));
    }

    #[test]
    fn a_long_running_watch_holds_the_commit_only_while_its_outputs_are_in_flight() {
        let mut t = OffsetTracker::default();
        t.consumed(0);
        t.consumed(1);
        t.consumed(2);
        assert_eq!(t.to_commit(), Some(3));
        // The watch of input 0 emits later: the position stays (never moves back) and moves
        // on once the broker has it.
        t.caused(0);
        t.caused(0);
        t.consumed(3);
        assert_eq!(t.to_commit(), None);
        assert_eq!(t.in_flight(), 2);
        t.acknowledged(0);
        assert_eq!(t.to_commit(), None);
        t.acknowledged(0);
        assert_eq!(t.to_commit(), Some(4));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn the_lowest_outstanding_offset_bounds_the_commit() {
        let mut t = OffsetTracker::default();
        for o in 0..10 {
            t.caused(o);
            t.consumed(o);
        }
        for o in (0..10).rev().filter(|o| *o != 4) {
            t.acknowledged(o);
        }
        assert_eq!(t.to_commit(), Some(4));
        t.acknowledged(4);
        assert_eq!(t.to_commit(), Some(10));
    }
}

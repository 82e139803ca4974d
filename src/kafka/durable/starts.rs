//! Starts records: the first records of a checkpoint's new watches written together, and
//! which of them live watches still rely on (see [`DurableState::checkpoint_records`]).

use super::checkpoint::StateWrite;
use super::DurableState;
use crate::kafka::offsets::Origins;
use crate::state::{starts_key, Starts, WatchRecord, MAX_RECORD_BYTES};
use bytes::Bytes;

/// Most bytes of members one starts record takes (the rest go into another): the state
/// format's limit, less room for the key and the record's own fields.
const STARTS_RECORD_BYTES: usize = MAX_RECORD_BYTES - 1024;

impl DurableState {
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
    pub(super) fn starts_alive_below(&self, below: u32) -> bool {
        self.starts
            .first_key_value()
            .is_some_and(|(&seq, _)| seq < below)
    }

    /// A watch found on the topic (restored or not) holds its only record in starts record
    /// `seq`: that record stays until the watch has a record of its own.
    pub fn relies_on(&mut self, seq: u32) {
        *self.starts.entry(seq).or_insert(0) += 1;
    }

    /// The first records of this checkpoint's new watches: one alone as its own record,
    /// more in starts records of at most [`STARTS_RECORD_BYTES`], each carrying its
    /// members' input offsets.
    pub(super) fn write_starts(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::durable::tests::{decoded, polled, start, state, T0};
    use crate::kafka::durable::PROGRESS_WRITE_INTERVAL_MS;
    use crate::reason::TerminatedReason;
    use crate::seen::{hash_key, SeenSet};
    use crate::state::{Entry, Part};
    use crate::watch::Progress;

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
}

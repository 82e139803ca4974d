//! [`DurableState`]'s rules as a partition task meets them: what each checkpoint writes,
//! when, and what a watch keeps meanwhile; and the helpers the tests beside the code use.

use super::*;
use crate::kafka::offsets::Origins;
use crate::seen::hash_key;
use crate::state::{decode_entry, Entry, Part};

pub(super) const T0: Millis = 1_700_000_000_000;

pub(super) fn state() -> DurableState {
    DurableState::new("st".into(), 2, 60_000, vec![0, 0], vec![5, 7])
}

fn registration() -> Registration {
    Registration {
        key: Some(Bytes::from_static(b"u1")),
        value: Bytes::from_static(br#"{"id":1}"#),
        time: T0,
    }
}

/// The engine's checkpoint of the poll whose outputs were just sent (it follows them).
pub(super) fn polled(s: &mut DurableState, key: &Bytes) {
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
pub(super) fn start(s: &mut DurableState, key: &Bytes, origin: i64, seen: &[OutputHash]) {
    let at_start = Progress::at_start(T0, T0);
    assert_eq!(
        s.started(key.clone(), registration(), at_start, T0, origin, seen, 0),
        Ok(None)
    );
}

/// The writes as (decoded entry, origin; `None` for a starts record's many).
pub(super) fn decoded(writes: &[StateWrite]) -> Vec<(Entry, Option<i64>)> {
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
    assert!(matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.hashes() == [hash_key(b"e1")]));
    assert!(matches!(&w[1], (Entry::Watch(_), Some(4))));
    assert!(matches!(&w[2].0, Entry::OutputOffsets(_)));
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
    assert!(matches!(&w[0].0, Entry::Seen { chunk, .. } if chunk.hashes() == [hash_key(b"e1")]));
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

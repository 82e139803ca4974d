//! A [`Watch`] to a [`WatchRecord`] and back.
//!
//! Captured: the termination facts (arrival, last new output, polls), the states of user
//! termination conditions (each encoded by its [`Condition::encode_state`]; see
//! [`Termination::restore_state`]), the hold, the backoff
//! and retry steps, the next poll time (which the table, not the watch, holds: the caller
//! passes it in and schedules the restored watch at it) and, through the seen chunks, the
//! seen set. So a restored watch answers its next poll exactly as the original would have,
//! given the same jitter draws.
//!
//! Not captured:
//! - the jitter random source: it is shared by all the watches of a table, and later delays
//!   are random anyway. The next poll time, already drawn, is saved;
//! - the poller's input (`I`): the record keeps the input record's bytes instead, and the
//!   caller resolves them again, as it did when the input first arrived;
//! - the rules (termination tree, schedule): they are configuration, and a restarted bridge
//!   applies its own. A restored watch is judged by the new rules from its saved facts.
//!
//! [`Condition::encode_state`]: crate::termination::Condition::encode_state
//! [`Termination::restore_state`]: crate::termination::Termination::restore_state

use super::chunks::{RestoreError, SeenJournal};
use super::codec::{Finished, SeenChunk, WatchRecord};
use crate::clock::Millis;
use crate::reason::TerminatedReason;
use crate::seen::SeenSet;
use crate::watch::{Progress, Watch, WatchRules};
use bytes::Bytes;
use std::sync::Arc;

/// The input record a watch was started from, as the state topic keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The record's key, if it had one.
    pub key: Option<Bytes>,
    /// The record's value, undecoded.
    pub value: Bytes,
    /// The record's timestamp.
    pub time: Millis,
}

/// Room a watch record keeps for its finished reason: built-in reasons are at most 7 bytes,
/// a user condition's name is assumed to be at most this.
pub const FINISHED_REASON_ROOM: usize = 64;

impl Registration {
    /// Whether every watch record of the watch `watch_key` started from this input fits in
    /// a state record ([`MAX_RECORD_BYTES`](super::MAX_RECORD_BYTES)): live, and finished
    /// with a reason of up to [`FINISHED_REASON_ROOM`] bytes. (Its size does not depend on
    /// its progress: every other field has a fixed width.) An input that fails this must not
    /// start a watch, which could never be saved.
    pub fn check_size(&self, watch_key: &Bytes) -> Result<(), super::TooLarge> {
        let mut record =
            WatchRecord::from_progress(watch_key.clone(), self, Progress::at_start(0, 0), 0, 0);
        record.finished = Some(Finished {
            at: 0,
            reason: " ".repeat(FINISHED_REASON_ROOM),
        });
        record.check_size()
    }
}

impl WatchRecord {
    /// The record of a live watch whose next poll is due at `next_poll`, with `seen_chunks`
    /// chunks on the topic (its journal's [`SeenJournal::chunks`] after the checkpoint that
    /// writes this record).
    pub fn from_watch<I>(
        watch: &Watch<I>,
        input: &Registration,
        next_poll: Millis,
        seen_chunks: u32,
        rules: &WatchRules,
    ) -> Self {
        let mut record = Self::from_progress(
            Bytes::copy_from_slice(watch.key()),
            input,
            watch.progress(),
            next_poll,
            seen_chunks,
        );
        record.conditions = watch.saved_conditions(rules).map(Bytes::from);
        record
    }

    /// The record of the live watch `watch_key` with progress `p` (as the engine's
    /// checkpoints report it).
    pub fn from_progress(
        watch_key: Bytes,
        input: &Registration,
        p: Progress,
        next_poll: Millis,
        seen_chunks: u32,
    ) -> Self {
        Self {
            watch_key,
            input_key: input.key.clone(),
            input_value: input.value.clone(),
            input_time: input.time,
            arrived: p.arrived,
            last_new: p.last_new,
            polls: p.polls,
            hold: p.hold,
            next_poll,
            empty_streak: p.empty_streak,
            failures: p.failures,
            seen_chunks,
            finished: None,
            resume: None,
            conditions: None,
        }
    }

    /// Mark the watch ended at `at` for `reason`. A finished watch keeps no seen chunks
    /// (`seen_chunks` becomes 0): it is kept only so that its input does not start it again.
    /// (The bridge writes a `failed` one with its chunks: see `kafka/durable/`.)
    pub fn finish(&mut self, at: Millis, reason: &TerminatedReason) {
        self.finished = Some(Finished::new(at, reason));
        self.seen_chunks = 0;
    }

    /// The input record this watch was started from.
    pub fn registration(&self) -> Registration {
        Registration {
            key: self.input_key.clone(),
            value: self.input_value.clone(),
            time: self.input_time,
        }
    }

    /// The watch's saved progress.
    pub fn progress(&self) -> Progress {
        Progress {
            arrived: self.arrived,
            last_new: self.last_new,
            polls: self.polls,
            hold: self.hold,
            empty_streak: self.empty_streak,
            failures: self.failures,
        }
    }

    /// The watch again, with `input` resolved from [`WatchRecord::registration`] and its seen
    /// set restored from its chunks. Schedule it at [`WatchRecord::next_poll`]. (A finished
    /// record is not a watch to run; this does not look at `finished`.)
    pub fn restore<I: Send + Sync + 'static>(
        &self,
        input: Arc<I>,
        seen: SeenSet,
        rules: &WatchRules,
    ) -> Watch<I> {
        Watch::restore(
            self.watch_key.clone(),
            input,
            seen,
            self.progress(),
            self.conditions.as_deref(),
            rules,
        )
    }

    /// [`SeenJournal::restore`] from this record's chunks, then [`WatchRecord::restore`].
    pub fn restore_with_chunks<I: Send + Sync + 'static>(
        &self,
        chunks: impl IntoIterator<Item = SeenChunk>,
        chunk_capacity: u32,
        input: Arc<I>,
        rules: &WatchRules,
    ) -> Result<(Watch<I>, SeenJournal), RestoreError> {
        let (seen, journal) = SeenJournal::restore(chunks, self.seen_chunks, chunk_capacity)?;
        Ok((self.restore(input, seen, rules), journal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::{Output, PollError, PollResult};
    use crate::schedule::{Backoff, Retry, Schedule};
    use crate::seen::{hash_key, OutputHash};
    use crate::state::codec::{decode_entry, Entry};
    use crate::termination::{Condition, NewInput, Termination};
    use crate::watch::Next;
    use proptest::prelude::*;
    use std::time::Duration;

    const T0: Millis = 1_700_000_000_000;

    fn rules(termination: &str, backoff: bool, jitter: f64, retries: u32) -> WatchRules {
        WatchRules {
            catch_up: Default::default(),
            termination: Termination::parse(termination).unwrap(),
            schedule: Schedule {
                interval: Duration::from_secs(10),
                backoff: backoff.then_some(Backoff {
                    factor: 2.0,
                    max: Duration::from_secs(80),
                }),
                jitter,
                retry: Retry {
                    initial: Duration::from_secs(1),
                    max: Duration::from_secs(30),
                    after_max: None,
                    limit: retries,
                },
            },
        }
    }

    fn registration() -> Registration {
        Registration {
            key: Some(Bytes::from_static(b"in-key")),
            value: Bytes::from_static(br#"{"url":"http://example.test/feed"}"#),
            time: T0 - 5_000,
        }
    }

    /// Write a watch and its journal's chunks as entries, read them back, restore.
    fn round_trip(
        w: &Watch<()>,
        journal: &mut SeenJournal,
        topic: &mut Vec<(Vec<u8>, Vec<u8>)>,
        next_poll: Millis,
        rules: &WatchRules,
    ) -> (Watch<()>, SeenJournal, Millis) {
        for chunk in journal.checkpoint() {
            let e = chunk.to_entry(w.key()).unwrap();
            topic.push((e.key, e.value));
        }
        let record =
            WatchRecord::from_watch(w, &registration(), next_poll, journal.chunks(), rules);
        let e = record.to_entry().unwrap();
        topic.push((e.key, e.value));

        // Read back as a restore would: the latest value per key, then decode.
        let mut latest = std::collections::HashMap::new();
        for (k, v) in topic.iter() {
            latest.insert(k.clone(), v.clone());
        }
        let (mut back, mut chunks) = (None, Vec::new());
        for (k, v) in &latest {
            match decode_entry(k, Some(v)).unwrap() {
                Entry::Watch(r) => back = Some(r),
                Entry::Seen { chunk, .. } => chunks.push(chunk),
                _ => unreachable!(),
            }
        }
        let back = back.unwrap();
        assert_eq!(back, record);
        assert_eq!(back.registration(), registration());
        let (watch, journal) = back
            .restore_with_chunks(chunks, journal.capacity(), Arc::new(()), rules)
            .unwrap();
        (watch, journal, back.next_poll)
    }

    fn sorted(s: &SeenSet) -> Vec<OutputHash> {
        let mut v: Vec<OutputHash> = s.iter().collect();
        v.sort_unstable();
        v
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Output keys (a small alphabet, so repeats happen), a watermark offset, complete.
        Ok(Vec<u8>, Option<i64>, bool),
        /// Permanent, Retry-After in seconds.
        Fail(bool, Option<u64>),
    }

    fn steps() -> impl Strategy<Value = Vec<(Step, i64)>> {
        let step = prop_oneof![
            6 => (
                prop::collection::vec(0u8..12, 0..5),
                prop::option::of(-5_000i64..60_000),
                prop::bool::weighted(0.05),
            )
                .prop_map(|(k, wm, c)| Step::Ok(k, wm, c)),
            2 => (prop::bool::weighted(0.1), prop::option::of(0u64..90))
                .prop_map(|(p, ra)| Step::Fail(p, ra)),
        ];
        // Latency after the poll fell due.
        prop::collection::vec((step, 0i64..3_000), 0..24)
    }

    /// Apply one step at `now`: the termination decision, or the poll's outcome.
    fn apply(
        w: &mut Watch<()>,
        step: &Step,
        now: Millis,
        rules: &WatchRules,
        rng: &mut fastrand::Rng,
    ) -> (Option<TerminatedReason>, Option<Next>, Vec<Output>) {
        if let Some(reason) = w.stop_before_poll(now, rules) {
            return (Some(reason), None, Vec::new());
        }
        match step {
            Step::Ok(keys, wm, complete) => {
                let outputs = keys
                    .iter()
                    .map(|&k| Output::new(vec![b'k', k], vec![k], T0 + i64::from(k) * 100))
                    .collect();
                let result = PollResult {
                    outputs,
                    watermark: wm.map(|wm| T0 + wm),
                    complete: *complete,
                    host_wait: None,
                };
                let polled = w.on_success(result, now, rules, rng);
                (None, Some(polled.next), polled.new_outputs)
            }
            Step::Fail(permanent, retry_after) => {
                let mut e = if *permanent {
                    PollError::permanent("gone", "gone")
                } else {
                    PollError::transient("http_503", "unavailable")
                };
                if let Some(s) = retry_after {
                    e = e.with_retry_after(Duration::from_secs(*s));
                }
                (None, Some(w.on_failure(&e, now, rules, rng).next), vec![])
            }
        }
    }

    const TERMINATIONS: &[&str] = &[
        "never",
        "polls(4)",
        "polls(9)",
        "total(2m)",
        "stable(40s)",
        "any(polls(6), stable(30s))",
        "all(total(1m), polls(3))",
    ];

    proptest! {
        /// Run a watch, save it after `split` steps, restore it, then give the original and
        /// the restored watch the same further steps (and the same jitter draws): they make
        /// the same decisions, emit the same outputs and keep the same state throughout.
        #[test]
        fn a_restored_watch_goes_on_exactly_like_the_original(
            termination in prop::sample::select(TERMINATIONS),
            backoff in any::<bool>(),
            jitter in prop::sample::select(&[0.0, 0.2][..]),
            retries in 0u32..4,
            capacity in 1u32..5,
            steps in steps(),
            split in any::<prop::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let rules = rules(termination, backoff, jitter, retries);
            let mut rng = fastrand::Rng::with_seed(seed);
            let key = Bytes::from_static(b"watch/1");
            let mut w = Watch::new(key, Arc::new(()), registration().time, T0, &rules);
            let mut journal = SeenJournal::with_capacity(capacity);
            let mut topic = Vec::new();
            let mut due = T0;
            let split = split.index(steps.len() + 1);

            // Up to the split, checkpointing now and then as the bridge will.
            for (i, (step, latency)) in steps[..split].iter().enumerate() {
                let (stop, next, new) = apply(&mut w, step, due + latency, &rules, &mut rng);
                new.iter().for_each(|o| journal.add(hash_key(&o.key)));
                match (stop, next) {
                    (None, Some(Next::PollAt(at))) => due = at,
                    _ => return Ok(()), // ended: nothing left to restore
                }
                if i % 3 == 1 {
                    round_trip(&w, &mut journal, &mut topic, due, &rules);
                }
            }

            let (mut r, mut r_journal, r_due) =
                round_trip(&w, &mut journal, &mut topic, due, &rules);
            prop_assert_eq!(r_due, due, "the next poll time");
            prop_assert_eq!(r.progress(), w.progress());
            prop_assert_eq!(r.key(), w.key());
            prop_assert_eq!(sorted(r.seen()), sorted(w.seen()));
            prop_assert_eq!(&r_journal, &journal);

            let mut r_rng = rng.clone();
            for (step, latency) in &steps[split..] {
                let now = due + latency;
                let a = apply(&mut w, step, now, &rules, &mut rng);
                let b = apply(&mut r, step, now, &rules, &mut r_rng);
                prop_assert_eq!(&b, &a);
                prop_assert_eq!(r.progress(), w.progress());
                for o in &a.2 {
                    journal.add(hash_key(&o.key));
                    r_journal.add(hash_key(&o.key));
                }
                prop_assert_eq!(r_journal.checkpoint(), journal.checkpoint());
                match a {
                    (None, Some(Next::PollAt(at)), _) => due = at,
                    _ => break,
                }
            }
        }
    }

    #[test]
    fn a_restored_watch_keeps_its_backoff_retries_and_poll_count() {
        // Fixed steps, so the saved counters show in the very next decision.
        let rules = rules("polls(3)", true, 0.0, 3);
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = Watch::new(Bytes::from_static(b"w"), Arc::new(()), T0, T0, &rules);
        let quiet = |w: &mut Watch<()>, now, rng: &mut fastrand::Rng| {
            w.on_success(PollResult::default(), now, &rules, rng).next
        };
        assert_eq!(quiet(&mut w, T0, &mut rng), Next::PollAt(T0 + 20_000));
        let transient = PollError::transient("http_503", "unavailable");
        w.on_failure(&transient, T0 + 20_000, &rules, &mut rng);

        let mut journal = SeenJournal::new();
        let (mut r, _, due) = round_trip(&w, &mut journal, &mut Vec::new(), T0 + 21_000, &rules);
        assert_eq!(due, T0 + 21_000);
        // The second failure in a row: a 2 s retry, not a first 1 s one.
        let f = r.on_failure(&transient, T0 + 21_000, &rules, &mut rng);
        assert_eq!((f.failures, f.next), (2, Next::PollAt(T0 + 23_000)));
        // The second quiet poll: backoff 40 s, not 20 s.
        assert_eq!(
            quiet(&mut r, T0 + 23_000, &mut rng),
            Next::PollAt(T0 + 63_000)
        );
        // The third poll ends it.
        assert_eq!(
            quiet(&mut r, T0 + 63_000, &mut rng),
            Next::Stop(TerminatedReason::Polls)
        );
    }

    /// Counts polls that found something new (a user condition, with state of its own).
    #[derive(Debug)]
    struct Productive(u32);

    impl Condition for Productive {
        type State = u32;
        fn for_new_input(&self, _now: Millis, _input: &NewInput<'_>) -> u32 {
            0
        }
        fn on_seen_new_output(&self, _now: Millis, _new: usize, n: &mut u32) {
            *n += 1;
        }
        fn on_poll_complete(&self, _now: Millis, _n: &mut u32) {}
        fn can_stop_polling(&self, _now: Millis, n: &u32) -> Option<TerminatedReason> {
            (*n >= self.0).then(|| TerminatedReason::Custom("productive".into()))
        }
        fn encode_state(&self, n: &u32) -> Vec<u8> {
            n.to_le_bytes().to_vec()
        }
        fn decode_state(&self, bytes: &[u8]) -> Result<u32, String> {
            Ok(u32::from_le_bytes(
                bytes.try_into().map_err(|_| "not 4 bytes")?,
            ))
        }
    }

    #[test]
    fn user_condition_states_are_saved_and_go_on_after_a_restore() {
        let rules = WatchRules {
            catch_up: Default::default(),
            termination: Termination::Any(vec![
                Termination::custom("productive", Productive(2)),
                Termination::Polls(4),
            ]),
            schedule: Schedule {
                jitter: 0.0,
                ..Schedule::default()
            },
        };
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = Watch::new(Bytes::from_static(b"w"), Arc::new(()), T0, T0, &rules);
        let found = PollResult::incomplete(vec![Output::new("a", "a", T0)]);
        w.on_success(found, T0, &rules, &mut rng);
        let (mut r, _, _) = round_trip(&w, &mut SeenJournal::new(), &mut Vec::new(), T0, &rules);
        let found = || PollResult::incomplete(vec![Output::new("b", "b", T0)]);
        // The original and the restored watch have both found something twice now.
        assert_eq!(
            w.on_success(found(), T0 + 10_000, &rules, &mut rng).next,
            Next::Stop(TerminatedReason::Custom("productive".into()))
        );
        assert_eq!(
            r.on_success(found(), T0 + 10_000, &rules, &mut rng).next,
            Next::Stop(TerminatedReason::Custom("productive".into()))
        );

        // A record that saved no state for it (written before the condition was added)
        // starts it afresh: one more productive poll is not enough.
        let record = WatchRecord::from_watch(&w, &registration(), T0, 0, &rules);
        assert_eq!(
            record.conditions.as_deref(),
            Some(&b"\x0a\x00productive\x04\x00\x00\x00\x02\x00\x00\x00"[..])
        );
        let old = WatchRecord {
            conditions: None,
            ..record
        };
        let mut fresh = old.restore(Arc::new(()), SeenSet::new(), &rules);
        assert_eq!(
            fresh
                .on_success(found(), T0 + 20_000, &rules, &mut rng)
                .next,
            Next::PollAt(T0 + 30_000)
        );
    }

    #[test]
    fn finishing_drops_the_seen_chunks_and_keeps_the_reason() {
        let rules = rules("never", false, 0.0, 1);
        let w = Watch::new(Bytes::from_static(b"w"), Arc::new(()), T0, T0, &rules);
        let mut record = WatchRecord::from_watch(&w, &registration(), T0, 3, &rules);
        record.finish(T0 + 1, &TerminatedReason::Custom("mine".into()));
        assert_eq!(record.seen_chunks, 0);
        assert_eq!(
            record.finished,
            Some(Finished {
                at: T0 + 1,
                reason: "mine".into()
            })
        );
    }

    #[test]
    fn an_input_fits_only_if_its_finished_record_would_too() {
        let input = |len: usize| Registration {
            key: Some(Bytes::from_static(b"k")),
            value: Bytes::from(vec![b'x'; len]),
            time: 0,
        };
        let key = Bytes::from_static(b"k");
        let max = crate::state::MAX_RECORD_BYTES;
        assert!(input(max - 200).check_size(&key).is_ok());
        // Its live record fits, but not once it ends (with a reason of the room kept).
        let near = input(max - 100);
        let live = WatchRecord::from_progress(key.clone(), &near, Progress::at_start(0, 0), 0, 0);
        assert!(live.to_entry().is_ok());
        let e = near.check_size(&key).unwrap_err();
        assert!(e.bytes > max, "{e}");
        assert!(e.to_string().contains("1000000"), "{e}");
    }
}

//! One watch: the state kept for one input between polls, and what a poll does to it.
//!
//! A watch is a pure state machine: it is handed a poll's outcome and the time, and answers
//! with the outputs that are new, its watermark hold, and whether (and why) it is done or
//! when to poll next. The table (`table.rs`) keeps a million of these and the engine
//! (`engine.rs`) runs the polls; neither knows the rules below.

use crate::catch_up::StartFrom;
use crate::clock::{millis, Millis};
use crate::poll::{Output, PollError, PollResult};
use crate::reason::TerminatedReason;
use crate::schedule::{AfterFailure, Schedule};
use crate::seen::{OutputHash, SeenSet};
use crate::termination::{Condition, NewInput, TermState, Termination};
use bytes::Bytes;
use std::sync::Arc;

/// The rules every watch of one engine follows.
#[derive(Debug, Clone)]
pub struct WatchRules {
    pub termination: Termination,
    pub schedule: Schedule,
    /// Where a new watch starts and how much one poll may emit (`catch_up.rs`).
    pub catch_up: crate::catch_up::CatchUp,
}

/// What happens next to a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Poll again at this processing time.
    PollAt(Millis),
    /// The watch is over; its hold is released.
    Stop(TerminatedReason),
}

/// The result of applying a successful poll.
#[derive(Debug)]
pub struct Polled {
    /// Outputs not seen before, in event-time order: to emit.
    pub new_outputs: Vec<Output>,
    /// How many outputs of the poll had been seen before (or repeated within it).
    pub duplicates: usize,
    pub next: Next,
    /// Hashes of outputs marked seen and not emitted (a first poll starting from `now`).
    pub silent: Vec<OutputHash>,
    /// New outputs past `WATCHBRIDGE_MAX_OUTPUTS_PER_POLL` are held back for later polls.
    pub holding_back: bool,
}

/// New outputs a watch holds back for its next polls (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`),
/// earliest first, owned (not views of the response they came in, which the poll's place
/// under the in-flight limit accounts for). Kept beside the watch, not in it (the table's
/// `backlogs`): a watch that holds nothing back pays nothing.
#[derive(Debug)]
pub struct Backlog {
    outputs: Vec<Output>,
    /// A poll said the set is final: the watch ends once the backlog is emitted.
    final_seen: bool,
}

impl Backlog {
    /// How many outputs it holds.
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    /// Never, once kept: an empty backlog is none.
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }
}

/// The result of applying a failed poll.
#[derive(Debug)]
pub struct Failed {
    /// Consecutive failures so far, this one included.
    pub failures: u32,
    pub next: Next,
    /// The resource's `Retry-After` when it asked for more than the schedule's cap
    /// ([`Retry::retry_after_cap`](crate::schedule::Retry::retry_after_cap)), which was
    /// waited instead (logged and counted once, by the engine).
    pub retry_after_capped: Option<std::time::Duration>,
}

/// Everything a watch carries from poll to poll apart from its key, input and seen set: what
/// the state topic saves so that a restored watch decides exactly as the original would.
/// (User termination conditions' states are saved beside it: [`Watch::saved_conditions`].)
///
/// [`Termination::restore_state`]: crate::termination::Termination::restore_state
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Processing time the input arrived at (`total` counts from it).
    pub arrived: Millis,
    /// Processing time of the last poll with a new output, the arrival until one (`stable`).
    pub last_new: Millis,
    /// Successful polls completed (`polls`).
    pub polls: u64,
    /// The watermark hold (see [`Watch::hold`]).
    pub hold: Millis,
    /// Successful polls in a row without a new output (the backoff step).
    pub empty_streak: u32,
    /// Failed polls in a row (the retry step).
    pub failures: u32,
}

impl Progress {
    /// A new watch's progress: what [`Watch::new`] starts from.
    pub fn at_start(input_time: Millis, now: Millis) -> Self {
        Self {
            arrived: now,
            last_new: now,
            polls: 0,
            hold: input_time,
            empty_streak: 0,
            failures: 0,
        }
    }
}

#[derive(Debug)]
pub struct Watch<I> {
    /// Its own bytes, not a `Bytes`: a `Bytes` is 16 bytes more in every watch, and once
    /// cloned it holds a 24-byte shared header for as long as the watch lives (a key is
    /// copied once per poll for the events instead).
    key: Box<[u8]>,
    input: Arc<I>,
    seen: SeenSet,
    termination: TermState,
    /// Event time this watch holds its partition's watermark at (see [`Watch::hold`]).
    hold: Millis,
    /// Successful polls in a row without a new output (drives backoff).
    empty_streak: u32,
    /// Failed polls in a row (drives retries and the `failed` limit).
    failures: u32,
}

impl<I: Send + Sync + 'static> Watch<I> {
    /// A watch for an input with record timestamp `input_time`, arriving at processing time
    /// `now`. Its hold starts at the input's timestamp.
    pub fn new(
        key: Bytes,
        input: Arc<I>,
        input_time: Millis,
        now: Millis,
        rules: &WatchRules,
    ) -> Self {
        Self {
            termination: rules
                .termination
                .for_new_input(now, &NewInput::new(&key, &*input)),
            key: Vec::from(key).into_boxed_slice(),
            input,
            seen: SeenSet::new(),
            hold: input_time,
            empty_streak: 0,
            failures: 0,
        }
    }

    /// A watch as saved by [`Watch::progress`], with its seen set as saved alongside. The
    /// next poll time is not part of a watch (the table's timer queue holds it): the caller
    /// schedules the restored watch at the time it saved with it.
    pub fn restore(
        key: Bytes,
        input: Arc<I>,
        seen: SeenSet,
        progress: Progress,
        conditions: Option<&[u8]>,
        rules: &WatchRules,
    ) -> Self {
        Self {
            termination: rules.termination.restore_state(
                progress.arrived,
                progress.last_new,
                progress.polls,
                conditions,
                &NewInput::new(&key, &*input),
            ),
            key: Vec::from(key).into_boxed_slice(),
            input,
            seen,
            hold: progress.hold,
            empty_streak: progress.empty_streak,
            failures: progress.failures,
        }
    }
}

impl<I> Watch<I> {
    /// What [`Watch::restore`] needs, besides the key, input and seen set, to rebuild this
    /// watch.
    pub fn progress(&self) -> Progress {
        Progress {
            arrived: self.termination.arrived(),
            last_new: self.termination.last_new(),
            polls: self.termination.polls(),
            hold: self.hold,
            empty_streak: self.empty_streak,
            failures: self.failures,
        }
    }

    /// The states of its user termination conditions, for [`Watch::restore`] (`None`: the
    /// rules have none; [`Termination::save_custom`]).
    pub fn saved_conditions(&self, rules: &WatchRules) -> Option<Vec<u8>> {
        rules.termination.save_custom(&self.termination)
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn input(&self) -> &Arc<I> {
        &self.input
    }

    /// The watermark hold: no output this watch emits later is promised to be at or after
    /// it. It is the poller's watermark when the latest poll gave one, else the earliest event
    /// time among the outputs new in the latest poll, else the input's timestamp — and it
    /// never moves backwards.
    pub fn hold(&self) -> Millis {
        self.hold
    }

    /// Its termination state (what [`Termination::describe`] puts in words).
    pub fn termination(&self) -> &TermState {
        &self.termination
    }

    pub fn seen(&self) -> &SeenSet {
        &self.seen
    }

    /// Its seen set, the watch gone (a failed watch's is kept, to start it again).
    pub fn into_seen(self) -> SeenSet {
        self.seen
    }

    /// Checked when a poll falls due: a time-based condition may have fired while waiting,
    /// in which case the watch ends without polling again.
    pub fn stop_before_poll(&self, now: Millis, rules: &WatchRules) -> Option<TerminatedReason> {
        rules.termination.can_stop_polling(now, &self.termination)
    }

    /// When to wake this watch for a poll planned at `poll_at`: no later than its
    /// termination deadline ([`Termination::stops_at`]), so a time-based condition ends it
    /// when it comes due ([`Watch::stop_before_poll`] then answers), not at a poll that a
    /// long backoff or `Retry-After` put far beyond it.
    pub fn wake_at(&self, poll_at: Millis, rules: &WatchRules) -> Millis {
        match rules.termination.stops_at(&self.termination) {
            Some(deadline) => poll_at.min(deadline),
            None => poll_at,
        }
    }

    /// Apply a successful poll completed at `now`.
    ///
    /// The outputs held back by earlier polls come first (a key the poll shows again
    /// counts once). A first poll starting from `now` marks all it finds seen and emits
    /// none; otherwise at most `WATCHBRIDGE_MAX_OUTPUTS_PER_POLL` new outputs are emitted,
    /// the earliest by event time, and the rest held back: meanwhile the watch ignores the
    /// poller's watermark (its hold is the earliest output emitted) and a "final" (it ends
    /// once it has emitted them all), and an end by its termination conditions emits them
    /// all at once rather than lose them.
    /// `backlog` is what the watch held back (`None`: nothing), taken and given back.
    pub fn on_success_holding(
        &mut self,
        result: PollResult,
        now: Millis,
        rules: &WatchRules,
        rng: &mut fastrand::Rng,
        backlog: &mut Option<Box<Backlog>>,
    ) -> Polled {
        let first_poll = self.termination.polls() == 0;
        let (mut outputs, mut final_seen) = match backlog.take() {
            Some(backlog) => (backlog.outputs, backlog.final_seen),
            None => (Vec::new(), false),
        };
        final_seen |= result.complete;
        let offered = outputs.len() + result.outputs.len();
        outputs.extend(result.outputs);
        let catch_up = &rules.catch_up;
        let (mut new_outputs, mut held, silent) =
            if first_poll && catch_up.start_from == StartFrom::Now {
                let seen = self.seen.take_new(outputs);
                let silent: Vec<OutputHash> = seen.iter().map(Output::identity).collect();
                (Vec::new(), Vec::new(), silent)
            } else {
                let max = catch_up
                    .max_outputs_per_poll
                    .map_or(usize::MAX, |m| m.get());
                let (new, held) = self.seen.take_new_up_to(outputs, max);
                (new, held, Vec::new())
            };
        let duplicates = offered - new_outputs.len() - held.len() - silent.len();
        self.failures = 0;
        if new_outputs.is_empty() {
            self.empty_streak = self.empty_streak.saturating_add(1);
        } else {
            self.empty_streak = 0;
            rules
                .termination
                .on_seen_new_output(now, new_outputs.len(), &mut self.termination);
        }
        rules
            .termination
            .on_poll_complete(now, &mut self.termination);

        let stop = match final_seen {
            true => Some(TerminatedReason::Final),
            false => rules.termination.can_stop_polling(now, &self.termination),
        };
        let next = match stop {
            // Final, with outputs held back: emitted over the next polls first.
            Some(TerminatedReason::Final) if !held.is_empty() => None,
            Some(reason) => {
                // Ended otherwise: what was held back goes now (it comes after what this
                // poll emits, by event time).
                new_outputs.append(&mut held);
                Some(Next::Stop(reason))
            }
            None => None,
        };
        // new_outputs is sorted by event time, so its first is the earliest. While outputs
        // are held back, the poller's watermark may be past them: not taken.
        let watermark = result.watermark.filter(|_| held.is_empty());
        let candidate = watermark.or_else(|| new_outputs.first().map(|o| o.event_time));
        if let Some(c) = candidate {
            self.hold = self.hold.max(c);
        }
        let holding_back = !held.is_empty();
        if holding_back {
            let outputs = held.into_iter().map(owned).collect();
            *backlog = Some(Box::new(Backlog {
                outputs,
                final_seen,
            }));
        }
        let next = next.unwrap_or_else(|| {
            let delay = rules.schedule.after_success(self.empty_streak, rng);
            Next::PollAt(self.wake_at(now.saturating_add(millis(delay)), rules))
        });
        Polled {
            new_outputs,
            duplicates,
            next,
            silent,
            holding_back,
        }
    }

    /// [`Watch::on_success_holding`] for rules without `WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`
    /// (nothing is ever held back).
    pub fn on_success(
        &mut self,
        result: PollResult,
        now: Millis,
        rules: &WatchRules,
        rng: &mut fastrand::Rng,
    ) -> Polled {
        debug_assert!(rules.catch_up.max_outputs_per_poll.is_none());
        self.on_success_holding(result, now, rules, rng, &mut None)
    }

    /// Apply a failed poll noticed at `now`.
    pub fn on_failure(
        &mut self,
        error: &PollError,
        now: Millis,
        rules: &WatchRules,
        rng: &mut fastrand::Rng,
    ) -> Failed {
        self.failures = self.failures.saturating_add(1);
        let mut retry_after_capped = None;
        let next = if error.permanent {
            Next::Stop(TerminatedReason::Failed)
        } else if let Some(reason) = rules.termination.can_stop_polling(now, &self.termination) {
            Next::Stop(reason)
        } else {
            match rules
                .schedule
                .after_failure(self.failures, error.retry_after, rng)
            {
                AfterFailure::GiveUp => Next::Stop(TerminatedReason::Failed),
                AfterFailure::RetryIn(d) => {
                    retry_after_capped = error
                        .retry_after
                        .filter(|&ra| rules.schedule.retry.cap_retry_after(ra).1);
                    Next::PollAt(self.wake_at(now.saturating_add(millis(d)), rules))
                }
            }
        };
        Failed {
            failures: self.failures,
            next,
            retry_after_capped,
        }
    }
}

/// `output` with bytes of its own: held back, it must not keep its response alive.
fn owned(output: Output) -> Output {
    let copy = |b: &Bytes| Bytes::copy_from_slice(b);
    Output {
        key: copy(&output.key),
        value: copy(&output.value),
        event_time: output.event_time,
        version: output.version.as_ref().map(copy),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Backoff, Retry};
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::time::Duration;

    /// An arbitrary processing time for the input's arrival; every test offsets from it.
    const T0: Millis = 1_700_000_000_000;

    fn rules_for(termination: &str, schedule: Schedule) -> WatchRules {
        let termination =
            Termination::parse(termination).unwrap_or_else(|e| panic!("{termination}: {e}"));
        WatchRules {
            catch_up: Default::default(),
            termination,
            schedule,
        }
    }

    fn no_jitter() -> Schedule {
        Schedule {
            jitter: 0.0,
            ..Schedule::default()
        }
    }

    fn watch(input_time: Millis, now: Millis, rules: &WatchRules) -> Watch<()> {
        Watch::new(
            Bytes::from_static(b"input"),
            Arc::new(()),
            input_time,
            now,
            rules,
        )
    }

    fn out(key: &str, value: &str, t: Millis) -> Output {
        Output::new(key.as_bytes().to_vec(), value.as_bytes().to_vec(), t)
    }

    fn keys(outs: &[Output]) -> Vec<&[u8]> {
        outs.iter().map(|o| &o.key[..]).collect()
    }

    fn catching_up(termination: &str, start_from: StartFrom, max: usize) -> WatchRules {
        WatchRules {
            catch_up: crate::catch_up::CatchUp {
                start_from,
                max_outputs_per_poll: std::num::NonZeroUsize::new(max),
            },
            ..rules_for(termination, no_jitter())
        }
    }

    /// Starting from `now`: the first poll's items are seen, not emitted (their hashes
    /// handed on to be recorded); only what comes after is emitted.
    #[test]
    fn a_watch_from_now_emits_only_what_comes_after_its_first_poll() {
        let rules = catching_up("never", StartFrom::Now, 0);
        let mut w = watch(T0, T0, &rules);
        let mut rng = fastrand::Rng::with_seed(1);
        let history = vec![out("a", "a", T0 - 10), out("b", "b", T0 - 5)];
        let first = w.on_success(
            PollResult::incomplete(history.clone()),
            T0,
            &rules,
            &mut rng,
        );
        assert!(first.new_outputs.is_empty());
        assert_eq!(first.silent.len(), 2);
        assert_eq!(first.duplicates, 0);
        let mut next = history;
        next.push(out("c", "c", T0 + 1));
        let second = w.on_success(PollResult::incomplete(next), T0 + 10, &rules, &mut rng);
        assert_eq!(keys(&second.new_outputs), [b"c"]);
        assert!(second.silent.is_empty());
        assert_eq!(second.duplicates, 2);
        // Restored before its first poll completed: that poll is still the first.
        let restored = Watch::restore(
            Bytes::from_static(b"input"),
            Arc::new(()),
            SeenSet::new(),
            watch(T0, T0, &rules).progress(),
            None,
            &rules,
        );
        let mut restored = restored;
        let polled = restored.on_success(
            PollResult::incomplete(vec![out("a", "a", T0)]),
            T0,
            &rules,
            &mut rng,
        );
        assert!(polled.new_outputs.is_empty() && polled.silent.len() == 1);
    }

    /// Capped: each poll emits the earliest `max` new outputs, holding the rest back (not
    /// seen yet) even when the next poll no longer shows them; a "final" waits for the
    /// backlog; the hold is the earliest emitted, not the poller's watermark past the
    /// backlog.
    #[test]
    fn a_capped_watch_emits_everything_once_over_several_polls() {
        let rules = catching_up("never", StartFrom::Earliest, 2);
        let mut w = watch(T0, T0, &rules);
        let mut rng = fastrand::Rng::with_seed(1);
        let mut backlog = None;
        let mut poll = |w: &mut Watch<()>, result, now| {
            w.on_success_holding(result, now, &rules, &mut rng, &mut backlog)
        };
        let all: Vec<Output> = (0..5)
            .map(|i| out(&format!("k{i}"), "v", T0 + 10 - i))
            .collect();
        let result = PollResult::complete(all.clone()).with_watermark(T0 + 100);
        let p1 = poll(&mut w, result, T0);
        assert_eq!(keys(&p1.new_outputs), [b"k4", b"k3"], "the earliest first");
        assert!(
            p1.holding_back && matches!(p1.next, Next::PollAt(_)),
            "final waits"
        );
        assert_eq!(w.hold(), T0 + 6, "not the watermark past what is held back");
        // The next poll shows nothing (a cursor moved on): the backlog still comes.
        let p2 = poll(&mut w, PollResult::complete(vec![]), T0 + 10);
        assert_eq!(keys(&p2.new_outputs), [b"k2", b"k1"]);
        assert!(p2.holding_back);
        // Everything again: each once.
        let p3 = poll(&mut w, PollResult::complete(all), T0 + 20);
        assert_eq!(keys(&p3.new_outputs), [b"k0"]);
        assert!(!p3.holding_back);
        assert_eq!(p3.next, Next::Stop(TerminatedReason::Final));
        assert!(backlog.is_none());
    }

    /// Ended by its conditions while holding outputs back: they are emitted at the end,
    /// not lost.
    #[test]
    fn a_capped_watch_ended_by_its_conditions_emits_what_it_held_back() {
        let rules = catching_up("polls(2)", StartFrom::Earliest, 1);
        let mut w = watch(T0, T0, &rules);
        let mut rng = fastrand::Rng::with_seed(1);
        let mut backlog = None;
        let all: Vec<Output> = (0..4).map(|i| out(&format!("k{i}"), "v", T0 + i)).collect();
        let p1 = w.on_success_holding(
            PollResult::incomplete(all),
            T0,
            &rules,
            &mut rng,
            &mut backlog,
        );
        assert_eq!(keys(&p1.new_outputs), [b"k0"]);
        let empty = PollResult::incomplete(vec![]);
        let p2 = w.on_success_holding(empty, T0 + 1, &rules, &mut rng, &mut backlog);
        assert_eq!(keys(&p2.new_outputs), [b"k1", b"k2", b"k3"]);
        assert!(matches!(p2.next, Next::Stop(TerminatedReason::Polls)));
        assert!(backlog.is_none());
    }

    fn transient() -> PollError {
        PollError::transient("http_503", "unavailable")
    }

    /// One random poll: outputs as (key index, event time offset from T0), an optional
    /// watermark offset from T0, and how long after the previous poll it completes.
    type RandomPoll = (Vec<(u8, i64)>, Option<i64>, i64);

    fn random_polls() -> impl Strategy<Value = Vec<RandomPoll>> {
        // Six keys, so repeats happen within and across polls; times straddle the input's
        // timestamp (T0), so candidates below the current hold happen too.
        let outputs = prop::collection::vec((0u8..6, -50i64..50), 0..8);
        let watermark = prop::option::of(-80i64..80);
        prop::collection::vec((outputs, watermark, 1i64..60_000), 0..12)
    }

    proptest! {
        #[test]
        fn random_polls_emit_each_key_once_in_event_time_order_and_hold_only_rises(
            polls in random_polls(),
            seed in any::<u64>(),
        ) {
            let rules = rules_for("never", Schedule::default());
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut now = T0;
            let mut w = watch(T0, now, &rules);
            prop_assert_eq!(w.hold(), T0, "the hold starts at the input's timestamp");

            let mut returned_keys: HashSet<Vec<u8>> = HashSet::new();
            let mut emitted_keys: HashSet<Vec<u8>> = HashSet::new();
            for (p, (poll, watermark, dt)) in polls.iter().enumerate() {
                now += dt;
                // The value records where an output came from, so "first occurrence wins" shows.
                let outputs: Vec<Output> = poll
                    .iter()
                    .enumerate()
                    .map(|(i, &(k, t))| Output::new(vec![b'k', k], format!("{p}/{i}"), T0 + t))
                    .collect();
                let result = PollResult {
                    outputs: outputs.clone(),
                    watermark: watermark.map(|wm| T0 + wm),
                    complete: false,
                    host_wait: None,
                };
                // Model: the first occurrence of each key never returned by an earlier poll,
                // in event-time order (stable: ties keep poll order).
                let mut expected: Vec<Output> = outputs
                    .iter()
                    .filter(|o| returned_keys.insert(o.key.to_vec()))
                    .cloned()
                    .collect();
                expected.sort_by_key(|o| o.event_time);

                let before = w.hold();
                let polled = w.on_success(result, now, &rules, &mut rng);

                for o in &polled.new_outputs {
                    prop_assert!(
                        emitted_keys.insert(o.key.to_vec()),
                        "poll {}: key {:?} emitted a second time", p, o.key
                    );
                }
                prop_assert!(
                    polled.new_outputs.windows(2).all(|w| w[0].event_time <= w[1].event_time),
                    "poll {}: not in event-time order: {:?}", p, polled.new_outputs
                );
                prop_assert_eq!(&polled.new_outputs, &expected, "poll {}", p);
                prop_assert_eq!(
                    polled.duplicates,
                    outputs.len() - polled.new_outputs.len(),
                    "poll {}", p
                );

                let candidate = hold_candidate(*watermark, &expected);
                let want = candidate.map_or(before, |c| before.max(c));
                prop_assert!(w.hold() >= before, "poll {}: hold moved back", p);
                prop_assert_eq!(w.hold(), want, "poll {}: hold (was {})", p, before);

                match polled.next {
                    Next::PollAt(at) => prop_assert!(at > now, "poll {}: next poll at {}", p, at),
                    other => prop_assert!(false, "poll {}: `never` stopped: {:?}", p, other),
                }
            }
            prop_assert_eq!(&emitted_keys, &returned_keys);
            prop_assert_eq!(w.seen().len(), returned_keys.len());
        }
    }

    /// The hold candidate of a poll: its watermark if given, else the earliest event time
    /// among its new outputs.
    fn hold_candidate(watermark: Option<i64>, new: &[Output]) -> Option<Millis> {
        watermark
            .map(|wm| T0 + wm)
            .or_else(|| new.iter().map(|o| o.event_time).min())
    }

    #[test]
    fn a_complete_poll_stops_as_final_even_under_never_and_still_returns_its_new_outputs() {
        let rules = rules_for("never", no_jitter());
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = watch(T0, T0, &rules);
        let first = w.on_success(
            PollResult::incomplete(vec![out("a", "a", T0 + 1), out("b", "b", T0 + 2)]),
            T0 + 1_000,
            &rules,
            &mut rng,
        );
        assert_eq!(first.next, Next::PollAt(T0 + 11_000));
        let last = w.on_success(
            PollResult::complete(vec![out("b", "b", T0 + 2), out("c", "c", T0 + 3)]),
            T0 + 11_000,
            &rules,
            &mut rng,
        );
        assert_eq!(last.next, Next::Stop(TerminatedReason::Final));
        assert_eq!(last.new_outputs, vec![out("c", "c", T0 + 3)]);
        assert_eq!(last.duplicates, 1);

        // `final` also wins over a condition that fires on the same poll.
        let one_poll = rules_for("polls(1)", no_jitter());
        let mut w = watch(T0, T0, &one_poll);
        let only = w.on_success(
            PollResult::complete(vec![out("x", "x", T0)]),
            T0,
            &one_poll,
            &mut rng,
        );
        assert_eq!(only.next, Next::Stop(TerminatedReason::Final));
        assert_eq!(keys(&only.new_outputs), vec![&b"x"[..]]);
    }

    #[test]
    fn polls_n_stops_on_the_nth_successful_poll_and_failures_do_not_count() {
        let rules = rules_for("polls(3)", no_jitter());
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = watch(T0, T0, &rules);
        let ok = |w: &mut Watch<()>, now: Millis, rng: &mut fastrand::Rng| {
            w.on_success(PollResult::default(), now, &rules, rng).next
        };

        assert_eq!(ok(&mut w, T0, &mut rng), Next::PollAt(T0 + 10_000));
        let f = w.on_failure(&transient(), T0 + 10_000, &rules, &mut rng);
        assert_eq!((f.failures, f.next), (1, Next::PollAt(T0 + 11_000)));
        assert_eq!(ok(&mut w, T0 + 11_000, &mut rng), Next::PollAt(T0 + 21_000));
        let f = w.on_failure(&transient(), T0 + 21_000, &rules, &mut rng);
        assert_eq!((f.failures, f.next), (1, Next::PollAt(T0 + 22_000)));
        let f = w.on_failure(&transient(), T0 + 22_000, &rules, &mut rng);
        assert_eq!((f.failures, f.next), (2, Next::PollAt(T0 + 24_000)));
        // Two successes and three failures so far: the third success is the third poll.
        assert_eq!(
            ok(&mut w, T0 + 24_000, &mut rng),
            Next::Stop(TerminatedReason::Polls)
        );
    }

    #[test]
    fn a_permanent_error_fails_the_watch_at_once() {
        let rules = rules_for("never", no_jitter());
        let mut rng = fastrand::Rng::with_seed(1);
        let permanent = PollError::permanent("not_found", "no such resource");

        let mut w = watch(T0, T0, &rules);
        let f = w.on_failure(&permanent, T0, &rules, &mut rng);
        assert_eq!(
            (f.failures, f.next),
            (1, Next::Stop(TerminatedReason::Failed))
        );

        // Also after successful polls, and whatever the resource's Retry-After says.
        let mut w = watch(T0, T0, &rules);
        w.on_success(PollResult::default(), T0, &rules, &mut rng);
        let f = w.on_failure(
            &permanent.with_retry_after(Duration::from_secs(5)),
            T0 + 10_000,
            &rules,
            &mut rng,
        );
        assert_eq!(f.next, Next::Stop(TerminatedReason::Failed));
    }

    #[test]
    fn transient_errors_retry_with_doubling_delays_up_to_the_limit_and_a_success_resets_them() {
        let schedule = Schedule {
            retry: Retry {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
                after_max: None,
                limit: 2,
            },
            ..no_jitter()
        };
        let rules = rules_for("never", schedule);
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = watch(T0, T0, &rules);
        let mut fail = |w: &mut Watch<()>, now: Millis| {
            let f = w.on_failure(&transient(), now, &rules, &mut rng);
            (f.failures, f.next)
        };

        assert_eq!(fail(&mut w, T0), (1, Next::PollAt(T0 + 1_000)));
        assert_eq!(fail(&mut w, T0 + 1_000), (2, Next::PollAt(T0 + 3_000)));
        // A success in between: the count starts again.
        let ok = w.on_success(
            PollResult::default(),
            T0 + 3_000,
            &rules,
            &mut fastrand::Rng::with_seed(1),
        );
        assert!(matches!(ok.next, Next::PollAt(_)));
        assert_eq!(fail(&mut w, T0 + 13_000), (1, Next::PollAt(T0 + 14_000)));
        assert_eq!(fail(&mut w, T0 + 14_000), (2, Next::PollAt(T0 + 16_000)));
        // The third failure in a row is past the limit of two retries.
        assert_eq!(
            fail(&mut w, T0 + 16_000),
            (3, Next::Stop(TerminatedReason::Failed))
        );
    }

    #[test]
    fn total_stops_before_a_poll_once_its_time_since_arrival_has_passed() {
        let rules = rules_for("total(5m)", no_jitter());
        let mut rng = fastrand::Rng::with_seed(1);
        // The input's record timestamp is an hour old; `total` counts from its arrival.
        let mut w = watch(T0 - 3_600_000, T0, &rules);
        assert_eq!(w.stop_before_poll(T0, &rules), None);
        // Polls and new outputs do not move it.
        let p = w.on_success(
            PollResult::incomplete(vec![out("a", "a", T0)]),
            T0 + 100_000,
            &rules,
            &mut rng,
        );
        assert_eq!(p.next, Next::PollAt(T0 + 110_000));
        assert_eq!(w.stop_before_poll(T0 + 299_999, &rules), None);
        assert_eq!(
            w.stop_before_poll(T0 + 300_000, &rules),
            Some(TerminatedReason::Total)
        );
        assert_eq!(
            w.stop_before_poll(T0 + 3_600_000, &rules),
            Some(TerminatedReason::Total)
        );
    }

    #[test]
    fn a_far_retry_after_is_capped_and_the_wake_is_never_past_the_termination_deadline() {
        let mut rng = fastrand::Rng::with_seed(1);
        let millennia = transient().with_retry_after(Duration::from_secs(99_999_999_999));
        // `never`: the retry waits the cap (the retry max, 60 s), and says it was cut.
        let rules = rules_for("never", no_jitter());
        let mut w = watch(T0, T0, &rules);
        let f = w.on_failure(&millennia, T0, &rules, &mut rng);
        assert_eq!(f.next, Next::PollAt(T0 + 60_000));
        assert_eq!(
            f.retry_after_capped,
            Some(Duration::from_secs(99_999_999_999))
        );
        let f = w.on_failure(&transient(), T0 + 60_000, &rules, &mut rng);
        assert_eq!(f.retry_after_capped, None);
        // `total(15s)`: woken at 15 s, when the condition holds, not at the retry.
        let rules = rules_for("total(15s)", no_jitter());
        let mut w = watch(T0, T0, &rules);
        let f = w.on_failure(&millennia, T0 + 1_000, &rules, &mut rng);
        assert_eq!(f.next, Next::PollAt(T0 + 15_000));
        assert_eq!(
            w.stop_before_poll(T0 + 15_000, &rules),
            Some(TerminatedReason::Total)
        );
        // After a success too: `stable(5s)` comes before the 10 s interval.
        let rules = rules_for("stable(5s)", no_jitter());
        let mut w = watch(T0, T0, &rules);
        let p = w.on_success(PollResult::default(), T0 + 1_000, &rules, &mut rng);
        assert_eq!(p.next, Next::PollAt(T0 + 5_000));
        // A restored watch's far saved poll is brought in the same way.
        assert_eq!(w.wake_at(Millis::MAX, &rules), T0 + 5_000);
        assert_eq!(w.wake_at(T0 + 2_000, &rules), T0 + 2_000);
    }

    #[test]
    fn quiet_polls_back_off_up_to_the_max_and_a_new_output_resets_the_interval() {
        let schedule = Schedule {
            interval: Duration::from_secs(10),
            backoff: Some(Backoff {
                factor: 2.0,
                max: Duration::from_secs(40),
            }),
            ..no_jitter()
        };
        let rules = rules_for("never", schedule);
        let mut rng = fastrand::Rng::with_seed(1);
        let mut w = watch(T0, T0, &rules);
        let mut now = T0;
        let mut delays = Vec::new();
        let mut poll = |w: &mut Watch<()>, outputs: Vec<Output>| {
            let p = w.on_success(PollResult::incomplete(outputs), now, &rules, &mut rng);
            let Next::PollAt(at) = p.next else {
                panic!("`never` stopped: {:?}", p.next)
            };
            delays.push(at - now);
            now = at;
        };
        // Each poll without a new output doubles the delay, the first one included.
        for _ in 0..4 {
            poll(&mut w, vec![]);
        }
        poll(&mut w, vec![out("a", "a", T0)]);
        // A repeat of a seen output is not new: the backoff resumes.
        poll(&mut w, vec![out("a", "a", T0)]);
        poll(&mut w, vec![]);
        assert_eq!(
            delays,
            vec![20_000, 40_000, 40_000, 40_000, 10_000, 20_000, 40_000]
        );
    }
}

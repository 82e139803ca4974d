//! How a [`Termination`] tree runs as a [`Condition`]: when it stops and why, when time
//! alone will make it stop ([`Termination::stops_at`]), and how far a watch has got towards
//! it in words ([`Termination::describe`]).

use super::{
    Condition, CustomCondition, DynCondition, ErasedState, NewInput, StateMismatch, TermState,
    Termination,
};
use crate::clock::Millis;
use crate::reason::TerminatedReason;
use std::time::Duration;

/// Whole milliseconds, rounded up so that a condition never fires early.
fn ceil_millis(d: Duration) -> Millis {
    let ms = d.as_nanos().div_ceil(1_000_000);
    ms.min(Millis::MAX as u128) as Millis
}

/// `now - since >= d`, without overflow for any inputs.
fn elapsed_at_least(now: Millis, since: Millis, d: Duration) -> bool {
    now.saturating_sub(since) >= ceil_millis(d)
}

impl Termination {
    /// The reason this condition reports when its state is unusable (made by another
    /// condition): every leaf but `Never` counts as expired.
    fn expired_reason(&self) -> Option<TerminatedReason> {
        match self {
            Termination::Never => None,
            Termination::Total(_) => Some(TerminatedReason::Total),
            Termination::Stable(_) => Some(TerminatedReason::Stable),
            Termination::Polls(_) => Some(TerminatedReason::Polls),
            Termination::Any(cs) => cs.iter().find_map(Termination::expired_reason),
            Termination::All(cs) => cs
                .iter()
                .all(|c| c.expired_reason().is_some())
                .then_some(TerminatedReason::All),
            Termination::Custom(c) => Some(TerminatedReason::Custom(c.name.clone())),
        }
    }

    /// Visit the user conditions of the tree in order (the order of `TermState::custom`).
    pub(super) fn for_each_custom<'a>(&'a self, f: &mut impl FnMut(&'a CustomCondition)) {
        match self {
            Termination::Any(cs) | Termination::All(cs) => {
                cs.iter().for_each(|c| c.for_each_custom(f))
            }
            Termination::Custom(c) => f(c),
            _ => {}
        }
    }

    /// Evaluate with `next_custom` indexing the user conditions' states in tree order. Every
    /// child is evaluated (no short-circuit) so the index stays in step with the tree.
    fn stop_reason(
        &self,
        now: Millis,
        state: &TermState,
        next_custom: &mut usize,
    ) -> Option<TerminatedReason> {
        match self {
            Termination::Never => None,
            Termination::Total(d) => {
                elapsed_at_least(now, state.arrived, *d).then_some(TerminatedReason::Total)
            }
            Termination::Stable(d) => {
                elapsed_at_least(now, state.last_new, *d).then_some(TerminatedReason::Stable)
            }
            Termination::Polls(n) => (state.polls >= *n).then_some(TerminatedReason::Polls),
            Termination::Any(cs) => cs
                .iter()
                .map(|c| c.stop_reason(now, state, next_custom))
                .fold(None, |first, r| first.or(r)),
            Termination::All(cs) => cs
                .iter()
                .map(|c| c.stop_reason(now, state, next_custom).is_some())
                .filter(|stops| !stops)
                .count()
                .eq(&0)
                .then_some(TerminatedReason::All),
            Termination::Custom(c) => {
                let own = state.custom.as_ref().and_then(|v| v.get(*next_custom));
                *next_custom += 1;
                own.map_or(Err(StateMismatch), |s| {
                    c.condition.erased_can_stop_polling(now, s)
                })
                .unwrap_or_else(|StateMismatch| self.expired_reason())
            }
        }
    }

    fn update_custom(
        &self,
        state: &mut TermState,
        f: impl Fn(&dyn DynCondition, &mut ErasedState),
    ) {
        let Some(states) = state.custom.as_mut() else {
            return;
        };
        let mut states = states.iter_mut();
        self.for_each_custom(&mut |c| {
            if let Some(s) = states.next() {
                f(c.condition.as_ref(), s);
            }
        });
    }
}

impl Termination {
    /// The time from which [`Condition::can_stop_polling`] holds if no poll completes before
    /// it: the watch's termination deadline. The engine wakes a waiting watch then, rather
    /// than at its next poll, so a time-based condition ends it when it comes due even if
    /// that poll is far away (a long backoff or `Retry-After`).
    ///
    /// `None` when only a poll can make it hold: `never`, `polls(n)` not reached yet, and
    /// user conditions (which are asked only at polls and when a poll falls due). A condition
    /// that already holds whatever the time answers [`Millis::MIN`]. `any` is its earliest
    /// child, `all` its latest (each built-in time condition, once true, stays true until a
    /// poll), and `None` if any child of `all` has none.
    pub fn stops_at(&self, state: &TermState) -> Option<Millis> {
        let after = |since: Millis, d: &Duration| since.saturating_add(ceil_millis(*d));
        match self {
            Termination::Never | Termination::Custom(_) => None,
            Termination::Total(d) => Some(after(state.arrived, d)),
            Termination::Stable(d) => Some(after(state.last_new, d)),
            Termination::Polls(n) => (state.polls >= *n).then_some(Millis::MIN),
            Termination::Any(cs) => cs.iter().filter_map(|c| c.stops_at(state)).min(),
            Termination::All(cs) => cs
                .iter()
                .map(|c| c.stops_at(state))
                .try_fold(Millis::MIN, |latest, at| Some(latest.max(at?))),
        }
    }

    /// How far `state` has got towards each condition at `now`, in words (the operations
    /// API's status of a watch), e.g. `any(total(1h): 12m 3s of 1h, polls(5): 3 of 5)`.
    pub fn describe(&self, state: &TermState, now: Millis) -> String {
        let mut next_custom = 0;
        self.describe_at(state, now, &mut next_custom)
    }

    fn describe_at(&self, state: &TermState, now: Millis, next_custom: &mut usize) -> String {
        let since = |from: Millis| {
            let ms = now.saturating_sub(from).max(0) as u64;
            humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
        };
        let list = |cs: &[Termination], next_custom: &mut usize| {
            cs.iter()
                .map(|c| c.describe_at(state, now, next_custom))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Termination::Never => "never".into(),
            Termination::Total(d) => format!(
                "total({}): {} of it passed",
                humantime::format_duration(*d),
                since(state.arrived)
            ),
            Termination::Stable(d) => format!(
                "stable({}): {} since the last new output",
                humantime::format_duration(*d),
                since(state.last_new)
            ),
            Termination::Polls(n) => format!("polls({n}): {} done", state.polls),
            Termination::Any(cs) => format!("any({})", list(cs, next_custom)),
            Termination::All(cs) => format!("all({})", list(cs, next_custom)),
            Termination::Custom(c) => {
                let own = state.custom.as_ref().and_then(|v| v.get(*next_custom));
                *next_custom += 1;
                match own {
                    Some(s) => format!("{}: {s:?}", c.name),
                    None => format!("{}: no state", c.name),
                }
            }
        }
    }
}

impl Condition for Termination {
    type State = TermState;

    fn for_new_input(&self, now: Millis, input: &NewInput<'_>) -> TermState {
        let mut custom = Vec::new();
        self.for_each_custom(&mut |c| custom.push(c.condition.erased_for_new_input(now, input)));
        TermState {
            arrived: now,
            last_new: now,
            polls: 0,
            custom: (!custom.is_empty()).then(|| Box::new(custom)),
        }
    }

    fn on_seen_new_output(&self, now: Millis, new_outputs: usize, state: &mut TermState) {
        // `max`: a late-arriving event must not move the quiet period back in time.
        state.last_new = state.last_new.max(now);
        self.update_custom(state, |c, s| {
            c.erased_on_seen_new_output(now, new_outputs, s)
        });
    }

    fn on_poll_complete(&self, now: Millis, state: &mut TermState) {
        state.polls = state.polls.saturating_add(1);
        self.update_custom(state, |c, s| c.erased_on_poll_complete(now, s));
    }

    fn can_stop_polling(&self, now: Millis, state: &TermState) -> Option<TerminatedReason> {
        self.stop_reason(now, state, &mut 0)
    }

    /// The three facts, then [`Termination::save_custom`]'s bytes.
    fn encode_state(&self, state: &TermState) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(&state.arrived.to_le_bytes());
        out.extend_from_slice(&state.last_new.to_le_bytes());
        out.extend_from_slice(&state.polls.to_le_bytes());
        out.extend(self.save_custom(state).unwrap_or_default());
        out
    }

    /// A [`Termination::encode_state`]'s bytes back; the watch's input is not known here,
    /// so a user condition that cannot be restored starts from [`NewInput::none`].
    fn decode_state(&self, bytes: &[u8]) -> Result<TermState, String> {
        let fact = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| format!("{} bytes are too few for a termination state", bytes.len()))
        };
        let (arrived, last_new, polls) = (fact(0)?, fact(1)?, fact(2)? as u64);
        let custom = (bytes.len() > 24).then(|| &bytes[24..]);
        Ok(self.restore_state(arrived, last_new, polls, custom, &NewInput::none()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::termination::tests::{events, parse, poll, secs, tree, Event, ProductivePolls, T0};
    use proptest::prelude::*;
    use TerminatedReason as R;

    #[test]
    fn total_fires_exactly_at_the_boundary() {
        let c = Termination::Total(secs(5));
        let mut s = c.for_new_input(T0, &NewInput::none());
        assert_eq!(c.can_stop_polling(T0, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 4_999, &s), None);
        // Outputs and polls do not move it.
        poll(&c, T0 + 4_000, true, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 4_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 5_000, &s), Some(R::Total));
        assert_eq!(c.can_stop_polling(T0 + 60_000, &s), Some(R::Total));
    }

    #[test]
    fn stable_without_outputs_counts_from_arrival() {
        let c = Termination::Stable(secs(10));
        let mut s = c.for_new_input(T0, &NewInput::none());
        poll(&c, T0 + 3_000, false, &mut s);
        poll(&c, T0 + 6_000, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 9_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 10_000, &s), Some(R::Stable));
    }

    #[test]
    fn stable_is_reset_by_each_new_output() {
        let c = Termination::Stable(secs(10));
        let mut s = c.for_new_input(T0, &NewInput::none());
        poll(&c, T0 + 3_000, true, &mut s);
        // Would have fired at T0 + 10s without the output.
        assert_eq!(c.can_stop_polling(T0 + 10_000, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 12_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 13_000, &s), Some(R::Stable));
        // An output after it could have stopped starts the quiet period again.
        poll(&c, T0 + 14_000, true, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 23_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 24_000, &s), Some(R::Stable));
        // Polls without output do not reset it.
        poll(&c, T0 + 20_000, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 24_000, &s), Some(R::Stable));
    }

    #[test]
    fn stable_ignores_an_output_reported_out_of_order() {
        let c = Termination::Stable(secs(10));
        let mut s = c.for_new_input(T0, &NewInput::none());
        c.on_seen_new_output(T0 + 5_000, 1, &mut s);
        c.on_seen_new_output(T0 + 1_000, 1, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 14_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 15_000, &s), Some(R::Stable));
    }

    #[test]
    fn polls_fires_after_n_completed_polls() {
        let c = Termination::Polls(3);
        let mut s = c.for_new_input(T0, &NewInput::none());
        for i in 0..3 {
            assert_eq!(
                c.can_stop_polling(T0 + 1_000_000, &s),
                None,
                "after {i} polls"
            );
            // A new output alone is not a completed poll.
            c.on_seen_new_output(T0 + i, 1, &mut s);
            assert_eq!(c.can_stop_polling(T0 + i, &s), None);
            c.on_poll_complete(T0 + i, &mut s);
        }
        assert_eq!(c.can_stop_polling(T0 + 3, &s), Some(R::Polls));
    }

    #[test]
    fn never_never_fires() {
        let c = Termination::Never;
        let mut s = c.for_new_input(T0, &NewInput::none());
        for i in 0..1_000 {
            poll(&c, T0 + i * 1_000_000, i % 2 == 0, &mut s);
        }
        assert_eq!(c.can_stop_polling(Millis::MAX, &s), None);
    }

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        let c = Termination::Total(Duration::from_micros(1_500));
        let s = c.for_new_input(T0, &NewInput::none());
        assert_eq!(c.can_stop_polling(T0 + 1, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 2, &s), Some(R::Total));
        // Zero means "at once".
        let c = Termination::Stable(Duration::ZERO);
        assert_eq!(
            c.can_stop_polling(T0, &c.for_new_input(T0, &NewInput::none())),
            Some(R::Stable)
        );
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let c = Termination::Total(Duration::MAX);
        let s = c.for_new_input(Millis::MIN, &NewInput::none());
        assert_eq!(c.can_stop_polling(Millis::MAX, &s), Some(R::Total));
        let c = Termination::Total(secs(1));
        let s = c.for_new_input(Millis::MAX, &NewInput::none());
        assert_eq!(c.can_stop_polling(Millis::MIN, &s), None);
        let c = Termination::Polls(u64::MAX);
        let mut s = c.for_new_input(T0, &NewInput::none());
        s.polls = u64::MAX;
        c.on_poll_complete(T0, &mut s);
        assert_eq!(c.can_stop_polling(T0, &s), Some(R::Polls));
    }

    #[test]
    fn any_reports_the_first_child_in_order_that_stops() {
        let c = parse("any(polls(2), total(5s))");
        let mut s = c.for_new_input(T0, &NewInput::none());
        assert_eq!(c.can_stop_polling(T0 + 4_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 5_000, &s), Some(R::Total));
        poll(&c, T0 + 1, false, &mut s);
        poll(&c, T0 + 2, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 2, &s), Some(R::Polls));
        // Both hold: the first one listed wins.
        assert_eq!(c.can_stop_polling(T0 + 5_000, &s), Some(R::Polls));
    }

    #[test]
    fn all_waits_for_every_child_and_reports_all() {
        let c = parse("all(total(5s), polls(2))");
        let mut s = c.for_new_input(T0, &NewInput::none());
        poll(&c, T0 + 1, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 5_000, &s), None);
        poll(&c, T0 + 2, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 4_999, &s), None);
        assert_eq!(c.can_stop_polling(T0 + 5_000, &s), Some(R::All));
    }

    #[test]
    fn nested_conditions_compose() {
        // Stop after 10s of quiet, but only once at least 3 polls have been made; give up
        // after an hour regardless.
        let c = parse("any(all(stable(10s), polls(3)), total(1h))");
        let mut s = c.for_new_input(T0, &NewInput::none());
        poll(&c, T0 + 1_000, true, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 11_000, &s), None, "only 1 poll");
        poll(&c, T0 + 12_000, false, &mut s);
        poll(&c, T0 + 13_000, false, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 13_000, &s), Some(R::All));
        poll(&c, T0 + 14_000, true, &mut s);
        assert_eq!(c.can_stop_polling(T0 + 23_999, &s), None, "stable reset");
        assert_eq!(c.can_stop_polling(T0 + 3_600_000, &s), Some(R::All));
        let c = parse("any(all(stable(10s), polls(3)), total(1s))");
        let s = c.for_new_input(T0, &NewInput::none());
        assert_eq!(c.can_stop_polling(T0 + 1_000, &s), Some(R::Total));
    }

    #[test]
    fn stops_at_is_when_time_alone_makes_the_condition_hold() {
        let at = |c: &str, s: &TermState| parse(c).stops_at(s);
        let mut s = parse("never").for_new_input(T0, &NewInput::none());
        assert_eq!(at("total(15s)", &s), Some(T0 + 15_000));
        assert_eq!(at("stable(10s)", &s), Some(T0 + 10_000));
        assert_eq!(at("never", &s), None);
        assert_eq!(at("polls(1)", &s), None, "only a poll counts polls");
        assert_eq!(
            at("any(total(15s), stable(10s), never)", &s),
            Some(T0 + 10_000)
        );
        assert_eq!(at("all(total(15s), stable(10s))", &s), Some(T0 + 15_000));
        assert_eq!(
            at("all(total(15s), polls(2))", &s),
            None,
            "polls(2) needs polls"
        );
        // A new output moves `stable`, not `total`.
        poll(&parse("never"), T0 + 8_000, true, &mut s);
        poll(&parse("never"), T0 + 9_000, false, &mut s);
        assert_eq!(at("stable(10s)", &s), Some(T0 + 18_000));
        assert_eq!(at("any(total(15s), stable(10s))", &s), Some(T0 + 15_000));
        assert_eq!(at("all(total(15s), stable(10s))", &s), Some(T0 + 18_000));
        // polls(2) holds now: `all` waits only for its time condition.
        assert_eq!(at("polls(2)", &s), Some(Millis::MIN));
        assert_eq!(at("all(total(15s), polls(2))", &s), Some(T0 + 15_000));
        assert_eq!(
            at("any(all(stable(1h), never), total(1m))", &s),
            Some(T0 + 60_000)
        );
        // User conditions are asked at polls only.
        let user = Termination::All(vec![
            Termination::custom("p", ProductivePolls(0)),
            Termination::Total(secs(1)),
        ]);
        assert_eq!(
            user.stops_at(&user.for_new_input(T0, &NewInput::none())),
            None
        );
        // No overflow at the ends of time.
        let c = Termination::Total(Duration::MAX);
        assert_eq!(
            c.stops_at(&c.for_new_input(T0, &NewInput::none())),
            Some(Millis::MAX)
        );
    }

    proptest! {
        /// `stops_at` is exact: with no poll in between, the condition does not hold just
        /// before it and holds at it and after.
        #[test]
        fn stops_at_is_the_first_time_the_condition_holds(
            c in tree(),
            ev in events(),
            probes in prop::collection::vec(0..100_000 as Millis, 1..8),
        ) {
            let mut now = T0;
            let mut s = c.for_new_input(now, &NewInput::none());
            for e in &ev {
                match *e {
                    Event::Tick(dt) => now += dt,
                    Event::Poll(dt, new) => {
                        now += dt;
                        poll(&c, now, new, &mut s);
                    }
                }
            }
            match c.stops_at(&s) {
                None => for p in &probes {
                    prop_assert_eq!(c.can_stop_polling(now + p, &s), None, "at +{}", p);
                },
                Some(at) => {
                    if at > Millis::MIN {
                        prop_assert_eq!(c.can_stop_polling(at - 1, &s), None);
                    }
                    prop_assert!(c.can_stop_polling(at.max(now), &s).is_some());
                    for p in &probes {
                        let t = at.max(now) + p;
                        prop_assert!(c.can_stop_polling(t, &s).is_some(), "at {}", t);
                    }
                }
            }
        }
    }

    #[test]
    fn empty_any_never_stops_and_empty_all_stops_at_once() {
        let any = Termination::Any(vec![]);
        assert_eq!(
            any.can_stop_polling(Millis::MAX, &any.for_new_input(T0, &NewInput::none())),
            None
        );
        let all = Termination::All(vec![]);
        assert_eq!(
            all.can_stop_polling(T0, &all.for_new_input(T0, &NewInput::none())),
            Some(R::All)
        );
    }

    #[test]
    fn state_stays_small() {
        // One per watch, and nothing allocated for built-in conditions however nested.
        assert!(std::mem::size_of::<TermState>() <= 32);
        assert!(parse("any(total(1h), all(stable(5m), polls(3)))")
            .for_new_input(T0, &NewInput::none())
            .custom
            .is_none());
    }
}

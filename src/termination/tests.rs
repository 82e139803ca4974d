//! What the tests of the conditions share (a time to start from, a poll, a user condition
//! that counts), and the laws every tree obeys, over random trees and event sequences.

use super::*;
use proptest::prelude::*;
use TerminatedReason as R;

/// An arbitrary input arrival time; every test offsets from it.
pub(super) const T0: Millis = 1_700_000_000_000;

pub(super) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(super) fn parse(s: &str) -> Termination {
    match Termination::parse(s) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

/// A poll at `now`, optionally bringing something new, in the order the engine calls.
pub(super) fn poll(c: &Termination, now: Millis, new_output: bool, s: &mut TermState) {
    if new_output {
        c.on_seen_new_output(now, 1, s);
    }
    c.on_poll_complete(now, s);
}

/// Stops after `n` polls that each brought something new (the doc example's condition).
#[derive(Debug)]
pub(super) struct ProductivePolls(pub(super) u32);

impl Condition for ProductivePolls {
    type State = (u32, bool);
    fn for_new_input(&self, _now: Millis, _input: &NewInput<'_>) -> (u32, bool) {
        (0, false)
    }
    fn on_seen_new_output(&self, _now: Millis, _new: usize, state: &mut (u32, bool)) {
        state.1 = true;
    }
    fn on_poll_complete(&self, _now: Millis, state: &mut (u32, bool)) {
        if std::mem::take(&mut state.1) {
            state.0 += 1;
        }
    }
    fn can_stop_polling(&self, _now: Millis, state: &(u32, bool)) -> Option<R> {
        (state.0 >= self.0).then(|| R::Custom("productive".into()))
    }
    fn encode_state(&self, state: &(u32, bool)) -> Vec<u8> {
        let mut out = state.0.to_le_bytes().to_vec();
        out.push(state.1 as u8);
        out
    }
    fn decode_state(&self, bytes: &[u8]) -> Result<(u32, bool), String> {
        match bytes {
            [a, b, c, d, flag] => Ok((u32::from_le_bytes([*a, *b, *c, *d]), *flag == 1)),
            _ => Err(format!("{} bytes, not 5", bytes.len())),
        }
    }
}

// ---- laws, over random trees and random event sequences ----

#[derive(Debug, Clone)]
pub(super) enum Event {
    /// Time passes; the condition is asked again.
    Tick(Millis),
    /// Time passes and a poll completes, with or without a new output.
    Poll(Millis, bool),
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (0u64..20_000).prop_map(Duration::from_millis),
        1 => (0u64..90).prop_map(|m| Duration::from_secs(60 * m)),
        1 => (0u64..5_000_000_000).prop_map(Duration::from_nanos),
    ]
}

pub(super) fn tree() -> impl Strategy<Value = Termination> {
    let leaf = prop_oneof![
        Just(Termination::Never),
        duration().prop_map(Termination::Total),
        duration().prop_map(Termination::Stable),
        (1u64..8).prop_map(Termination::Polls),
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..4).prop_map(Termination::Any),
            prop::collection::vec(inner, 1..4).prop_map(Termination::All),
        ]
    })
}

pub(super) fn events() -> impl Strategy<Value = Vec<Event>> {
    let event = prop_oneof![
        (0..5_000 as Millis).prop_map(Event::Tick),
        (0..5_000 as Millis, any::<bool>()).prop_map(|(dt, new)| Event::Poll(dt, new)),
    ];
    prop::collection::vec(event, 0..30)
}

/// The answer of `can_stop_polling` at the arrival and after every event.
fn trace(c: &Termination, events: &[Event]) -> Vec<Option<R>> {
    let mut now = T0;
    let mut s = c.for_new_input(now, &NewInput::none());
    let mut out = vec![c.can_stop_polling(now, &s)];
    for e in events {
        match *e {
            Event::Tick(dt) => now += dt,
            Event::Poll(dt, new) => {
                now += dt;
                poll(c, now, new, &mut s);
            }
        }
        out.push(c.can_stop_polling(now, &s));
    }
    out
}

fn stops(c: &Termination, events: &[Event]) -> Vec<bool> {
    trace(c, events).iter().map(Option::is_some).collect()
}

fn either(cs: &[&Termination]) -> Termination {
    Termination::Any(cs.iter().map(|&c| c.clone()).collect())
}

fn every(cs: &[&Termination]) -> Termination {
    Termination::All(cs.iter().map(|&c| c.clone()).collect())
}

proptest! {
    #[test]
    fn single_child_any_and_all_behave_like_the_child(a in tree(), ev in events()) {
        prop_assert_eq!(trace(&either(&[&a]), &ev), trace(&a, &ev));
        prop_assert_eq!(stops(&every(&[&a]), &ev), stops(&a, &ev));
    }

    #[test]
    fn any_is_or_and_all_is_and(a in tree(), b in tree(), ev in events()) {
        let (ta, tb) = (trace(&a, &ev), trace(&b, &ev));
        let t_any = trace(&either(&[&a, &b]), &ev);
        let t_all = trace(&every(&[&a, &b]), &ev);
        for i in 0..ta.len() {
            prop_assert_eq!(&t_any[i], &ta[i].clone().or_else(|| tb[i].clone()));
            let both = ta[i].is_some() && tb[i].is_some();
            prop_assert_eq!(&t_all[i], &both.then_some(R::All));
        }
    }

    #[test]
    fn any_and_all_commute(a in tree(), b in tree(), ev in events()) {
        prop_assert_eq!(stops(&either(&[&a, &b]), &ev), stops(&either(&[&b, &a]), &ev));
        prop_assert_eq!(stops(&every(&[&a, &b]), &ev), stops(&every(&[&b, &a]), &ev));
    }

    #[test]
    fn never_is_the_identity_of_any_and_absorbs_all(a in tree(), ev in events()) {
        let never = Termination::Never;
        prop_assert_eq!(trace(&either(&[&a, &never]), &ev), trace(&a, &ev));
        prop_assert!(stops(&every(&[&a, &never]), &ev).iter().all(|s| !s));
    }

    #[test]
    fn any_and_all_associate(a in tree(), b in tree(), c in tree(), ev in events()) {
        let right = either(&[&a, &either(&[&b, &c])]);
        let left = either(&[&either(&[&a, &b]), &c]);
        // Same reasons too: the first child to stop is the same in both.
        prop_assert_eq!(trace(&right, &ev), trace(&left, &ev));
        let right = every(&[&a, &every(&[&b, &c])]);
        let left = every(&[&every(&[&a, &b]), &c]);
        prop_assert_eq!(stops(&right, &ev), stops(&left, &ev));
    }

    #[test]
    fn display_then_parse_round_trips(a in tree()) {
        let text = a.to_string();
        let back = Termination::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back.to_string(), text);
        prop_assert_eq!(back, a);
    }
}

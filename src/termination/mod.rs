//! When a watch stops polling: Beam's `Watch.growthOf` termination conditions.
//!
//! A condition is a small state machine ([`Condition`]): the engine makes a state when the
//! input arrives, feeds it "new output seen" and "poll complete" events, and asks
//! [`Condition::can_stop_polling`] after every poll. The states are pure functions of the
//! `now` values they are given, so they need no clock and tests drive them with plain
//! numbers.
//!
//! [`Termination`] is the set that configuration can name (`WATCHBRIDGE_TERMINATION`, see
//! [`Termination::parse`] for the text form); [`Termination::custom`] nests any user
//! [`Condition`] inside it by erasing its state type:
//!
//! ```
//! use std::time::Duration;
//! use watchbridge::reason::TerminatedReason;
//! use watchbridge::termination::{Condition, NewInput, Termination};
//!
//! /// Stops after three polls that each brought something new.
//! #[derive(Debug)]
//! struct ProductivePolls(u32);
//!
//! impl Condition for ProductivePolls {
//!     /// (productive polls so far, did the current poll bring something new)
//!     type State = (u32, bool);
//!     fn for_new_input(&self, _now: i64, _input: &NewInput<'_>) -> (u32, bool) {
//!         (0, false)
//!     }
//!     fn on_seen_new_output(&self, _now: i64, _new: usize, state: &mut (u32, bool)) {
//!         state.1 = true;
//!     }
//!     fn on_poll_complete(&self, _now: i64, state: &mut (u32, bool)) {
//!         if std::mem::take(&mut state.1) {
//!             state.0 += 1;
//!         }
//!     }
//!     fn can_stop_polling(&self, _now: i64, state: &(u32, bool)) -> Option<TerminatedReason> {
//!         (state.0 >= self.0).then(|| TerminatedReason::Custom("productive_polls".into()))
//!     }
//!     // Saved after each poll, so a restored watch goes on counting: the count (the flag
//!     // is always false between polls).
//!     fn encode_state(&self, state: &(u32, bool)) -> Vec<u8> {
//!         state.0.to_le_bytes().to_vec()
//!     }
//!     fn decode_state(&self, bytes: &[u8]) -> Result<(u32, bool), String> {
//!         let count = bytes.try_into().map_err(|_| format!("{} bytes, not 4", bytes.len()))?;
//!         Ok((u32::from_le_bytes(count), false))
//!     }
//! }
//!
//! // Stop after three productive polls, or after an hour whatever happens.
//! let cond = Termination::Any(vec![
//!     Termination::custom("productive_polls", ProductivePolls(3)),
//!     Termination::Total(Duration::from_secs(3600)),
//! ]);
//! assert_eq!(cond.to_string(), "any(productive_polls, total(1h))");
//!
//! let mut state = cond.for_new_input(0, &NewInput::none());
//! for now in [1_000, 2_000] {
//!     assert_eq!(cond.can_stop_polling(now, &state), None);
//!     cond.on_seen_new_output(now, 1, &mut state);
//!     cond.on_poll_complete(now, &mut state);
//! }
//! // The watch is saved and restored (a restart): its count goes on.
//! let saved = cond.save_custom(&state);
//! let mut state = cond.restore_state(0, 2_000, 2, saved.as_deref(), &NewInput::none());
//! cond.on_seen_new_output(3_000, 1, &mut state);
//! cond.on_poll_complete(3_000, &mut state);
//! assert_eq!(
//!     cond.can_stop_polling(3_000, &state),
//!     Some(TerminatedReason::Custom("productive_polls".into()))
//! );
//! ```

mod parse;

pub use parse::{ParseError, MAX_DEPTH};

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Millis;
use crate::reason::TerminatedReason;

/// A termination condition as a small state machine (Beam's `TerminationCondition`).
///
/// The condition itself is shared by every watch; everything per-watch lives in
/// [`Condition::State`], which is why the state is a separate, cheaply cloned value. The
/// state is saved with the watch on the state topic ([`Condition::encode_state`]) and read
/// back when the watch is restored, after a restart or on another instance (Beam's state
/// coder): a condition that counts something goes on counting where it was.
///
/// A condition decides when a watch stops *polling*: it is asked after each poll and when
/// a poll falls due, never in the middle of one, so it cannot cap what one poll emits (a
/// limit of 5 outputs lets a poll that finds 8 new ones emit all 8, then stops). The name
/// given to [`Termination::custom`] is how the tree displays it; the reason it reports
/// ([`TerminatedReason::Custom`]) is its own, and usually the same name.
pub trait Condition: Send + Sync + fmt::Debug + 'static {
    /// What the condition keeps per watch.
    type State: Clone + fmt::Debug + Send + Sync + 'static;
    /// State for a watch whose input arrived at `now`; `input` is what the watch polls for.
    fn for_new_input(&self, now: Millis, input: &NewInput<'_>) -> Self::State;
    /// A poll at `now` brought `new_outputs` (at least one) outputs not seen before.
    fn on_seen_new_output(&self, now: Millis, new_outputs: usize, state: &mut Self::State);
    /// A poll completed at `now` (successfully; called after on_seen_new_output if any).
    fn on_poll_complete(&self, now: Millis, state: &mut Self::State);
    /// `Some(reason)` when the watch should stop polling at `now`.
    fn can_stop_polling(&self, now: Millis, state: &Self::State) -> Option<TerminatedReason>;
    /// The state as bytes, saved with the watch after each poll. Keep it small: it is
    /// written with the watch's record, and kept in memory with it.
    fn encode_state(&self, state: &Self::State) -> Vec<u8>;
    /// The state back from [`Condition::encode_state`]'s bytes. An `Err` (bytes an older
    /// version wrote, say) is logged, and the watch's state starts afresh from its arrival.
    fn decode_state(&self, bytes: &[u8]) -> Result<Self::State, String>;
}

/// The input a new watch starts from, as a termination condition sees it: the watch key,
/// and the poller's input (its own type; [`NewInput::input`] gets it back).
#[derive(Clone, Copy)]
pub struct NewInput<'a> {
    key: &'a [u8],
    input: &'a (dyn Any + Send + Sync),
}

impl<'a> NewInput<'a> {
    /// The input of the watch `key`: `input` is the poller's input
    /// ([`Poller::Input`](crate::poll::Poller::Input)).
    pub fn new<I: Any + Send + Sync>(key: &'a [u8], input: &'a I) -> Self {
        Self { key, input }
    }

    /// No input (for trying a condition out): an empty key, and `()` as the input.
    pub fn none() -> NewInput<'static> {
        NewInput {
            key: b"",
            input: &(),
        }
    }

    /// The watch key.
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The poller's input, if it is a `T` (`None` for another poller's input).
    pub fn input<T: Any>(&self) -> Option<&'a T> {
        self.input.downcast_ref()
    }
}

impl fmt::Debug for NewInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewInput")
            .field("key", &String::from_utf8_lossy(self.key))
            .finish_non_exhaustive()
    }
}

/// The conditions that configuration can name, nestable.
///
/// Durations are compared in whole milliseconds (the unit of [`Millis`]); a duration with a
/// sub-millisecond part is rounded *up*, so a condition never fires before its time.
#[derive(Clone, Debug)]
pub enum Termination {
    /// Never stops on its own (the watch ends only when its poller says the output is final).
    Never,
    /// Stops once this much time has passed since the input arrived (Beam's `afterTotalOf`).
    Total(Duration),
    /// Stops once this much time has passed since the last poll that brought a new output.
    ///
    /// Unlike Beam's `afterTimeSinceNewOutput`, which never fires for a watch that has not
    /// produced anything yet, the clock starts at the input's arrival: a resource that stays
    /// empty is given up on after the same quiet period instead of being polled forever.
    Stable(Duration),
    /// Stops once this many polls have completed. Configuration rejects `polls(0)`.
    Polls(u64),
    /// Stops when any child stops, with the reason of the first child (in order) that does.
    /// An empty `Any` never stops (configuration rejects `any()`).
    Any(Vec<Termination>),
    /// Stops when every child stops at once, with [`TerminatedReason::All`]. An empty `All`
    /// is vacuously true and stops at once (configuration rejects `all()`).
    All(Vec<Termination>),
    /// A user condition, displayed by its name; see [`Termination::custom`].
    Custom(CustomCondition),
}

/// Per-watch state of a [`Termination`].
///
/// Every built-in condition reads one of three facts, the same for all of them: when the
/// input arrived (`total`), when the last new output was seen (`stable`; the arrival until
/// there is one) and how many polls completed (`polls`). So the state holds those once,
/// whatever the tree's shape, and a watch table holding a million of them allocates nothing
/// for them. Only user conditions carry state of their own, kept in tree order behind one
/// pointer. A state must only be given back to the condition that made it; if it is not (a
/// bug in the caller), user conditions whose state is missing or of another type count as
/// expired, so the watch stops rather than polling forever.
#[derive(Clone, Debug)]
pub struct TermState {
    arrived: Millis,
    last_new: Millis,
    polls: u64,
    /// A thin pointer, because most watches have no user conditions and every watch pays
    /// for this field (a `Vec` would cost 24 bytes each, a boxed slice 16).
    #[allow(clippy::box_collection)]
    custom: Option<Box<Vec<ErasedState>>>,
}

impl TermState {
    /// When the input arrived (what `total` counts from).
    pub fn arrived(&self) -> Millis {
        self.arrived
    }

    /// When the last poll that brought a new output completed; the arrival until one has
    /// (what `stable` counts from).
    pub fn last_new(&self) -> Millis {
        self.last_new
    }

    /// Polls completed (what `polls` counts).
    pub fn polls(&self) -> u64 {
        self.polls
    }
}

/// A user [`Condition`] with a name, as nested in [`Termination::Custom`].
#[derive(Clone)]
pub struct CustomCondition {
    name: Arc<str>,
    condition: Arc<dyn DynCondition>,
}

impl CustomCondition {
    /// The name it displays as (and typically reports as `TerminatedReason::Custom`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The erased condition.
    pub fn condition(&self) -> &dyn DynCondition {
        &*self.condition
    }
}

impl fmt::Debug for CustomCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomCondition")
            .field("name", &self.name)
            .field("condition", &self.condition)
            .finish()
    }
}

/// The state of an erased condition was handed a state made by a different condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMismatch;

/// Object-safe form of [`Condition`], implemented for every `Condition`, so that conditions
/// with different state types can sit side by side in one [`Termination`] tree.
///
/// Methods carry an `erased_` prefix so they never clash with [`Condition`]'s at call sites.
pub trait DynCondition: Send + Sync + fmt::Debug + 'static {
    /// [`Condition::for_new_input`].
    fn erased_for_new_input(&self, now: Millis, input: &NewInput<'_>) -> ErasedState;
    /// [`Condition::on_seen_new_output`]; does nothing if `state` was not made by this
    /// condition.
    fn erased_on_seen_new_output(&self, now: Millis, new_outputs: usize, state: &mut ErasedState);
    /// [`Condition::on_poll_complete`]; does nothing if `state` was not made by this
    /// condition.
    fn erased_on_poll_complete(&self, now: Millis, state: &mut ErasedState);
    /// [`Condition::can_stop_polling`].
    fn erased_can_stop_polling(
        &self,
        now: Millis,
        state: &ErasedState,
    ) -> Result<Option<TerminatedReason>, StateMismatch>;
    /// [`Condition::encode_state`].
    fn erased_encode_state(&self, state: &ErasedState) -> Result<Vec<u8>, StateMismatch>;
    /// [`Condition::decode_state`].
    fn erased_decode_state(&self, bytes: &[u8]) -> Result<ErasedState, String>;
}

impl<C: Condition> DynCondition for C {
    fn erased_for_new_input(&self, now: Millis, input: &NewInput<'_>) -> ErasedState {
        ErasedState(Box::new(self.for_new_input(now, input)))
    }

    fn erased_on_seen_new_output(&self, now: Millis, new_outputs: usize, state: &mut ErasedState) {
        if let Some(s) = state.downcast_mut::<C::State>() {
            self.on_seen_new_output(now, new_outputs, s);
        }
    }

    fn erased_on_poll_complete(&self, now: Millis, state: &mut ErasedState) {
        if let Some(s) = state.downcast_mut::<C::State>() {
            self.on_poll_complete(now, s);
        }
    }

    fn erased_can_stop_polling(
        &self,
        now: Millis,
        state: &ErasedState,
    ) -> Result<Option<TerminatedReason>, StateMismatch> {
        let s = state.downcast_ref::<C::State>().ok_or(StateMismatch)?;
        Ok(self.can_stop_polling(now, s))
    }

    fn erased_encode_state(&self, state: &ErasedState) -> Result<Vec<u8>, StateMismatch> {
        let s = state.downcast_ref::<C::State>().ok_or(StateMismatch)?;
        Ok(self.encode_state(s))
    }

    fn erased_decode_state(&self, bytes: &[u8]) -> Result<ErasedState, String> {
        self.decode_state(bytes).map(|s| ErasedState(Box::new(s)))
    }
}

/// A boxed, cloneable state of any [`Condition`].
pub struct ErasedState(Box<dyn StateBox>);

impl ErasedState {
    fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        (*self.0).as_any().downcast_ref()
    }

    fn downcast_mut<T: 'static>(&mut self) -> Option<&mut T> {
        (*self.0).as_any_mut().downcast_mut()
    }
}

impl Clone for ErasedState {
    fn clone(&self) -> Self {
        ErasedState((*self.0).clone_box())
    }
}

impl fmt::Debug for ErasedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (*self.0).fmt(f)
    }
}

/// What a state needs to be erased: `Any` for downcasting back, `clone_box` for `Clone`.
trait StateBox: Any + fmt::Debug + Send + Sync {
    fn clone_box(&self) -> Box<dyn StateBox>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Clone + fmt::Debug + Send + Sync + 'static> StateBox for T {
    fn clone_box(&self) -> Box<dyn StateBox> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Beam-style constructors, for code that builds conditions rather than parsing them.
impl Termination {
    /// Nests a user condition; `name` is what it displays as inside `any(...)`/`all(...)`.
    pub fn custom<C: Condition>(name: &str, c: C) -> Self {
        Termination::Custom(CustomCondition {
            name: name.into(),
            condition: Arc::new(c),
        })
    }

    /// Parses the text form (what `WATCHBRIDGE_TERMINATION` holds):
    ///
    /// ```text
    /// condition := "never"
    ///            | "total" "(" duration ")"     humantime: 500ms, 5m, 1h 30m, ...
    ///            | "stable" "(" duration ")"
    ///            | "polls" "(" integer ")"       integer >= 1
    ///            | "any" "(" condition ("," condition)* ")"
    ///            | "all" "(" condition ("," condition)* ")"
    /// ```
    ///
    /// Names are lowercase, whitespace may separate any two tokens, and nesting stops at
    /// [`MAX_DEPTH`] levels. A [`ParseError`] points at the offending token.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        parse::parse(text)
    }

    /// Beam's `never()`.
    pub fn never() -> Self {
        Termination::Never
    }

    /// Beam's `afterTotalOf(d)`.
    pub fn after_total_of(d: Duration) -> Self {
        Termination::Total(d)
    }

    /// Beam's `afterTimeSinceNewOutput(d)`, except that it also fires without any output.
    pub fn after_time_since_new_output(d: Duration) -> Self {
        Termination::Stable(d)
    }

    /// Stops after `n` completed polls.
    pub fn after_polls(n: u64) -> Self {
        Termination::Polls(n)
    }

    /// Beam's `eitherOf(a, b)`.
    pub fn either_of(a: Termination, b: Termination) -> Self {
        Termination::Any(vec![a, b])
    }

    /// Beam's `allOf(a, b)`.
    pub fn all_of(a: Termination, b: Termination) -> Self {
        Termination::All(vec![a, b])
    }

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
}

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
    /// Visit the user conditions of the tree in order (the order of `TermState::custom`).
    fn for_each_custom<'a>(&'a self, f: &mut impl FnMut(&'a CustomCondition)) {
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

    /// The states of the user conditions in `state`, as saved with the watch: for each, in
    /// tree order, its name and [`Condition::encode_state`]'s bytes. `None` when the tree
    /// has no user condition (most watches: nothing is saved for them).
    pub fn save_custom(&self, state: &TermState) -> Option<Vec<u8>> {
        let states = state.custom.as_ref()?;
        let mut out = Vec::new();
        let mut states = states.iter();
        self.for_each_custom(&mut |c| {
            if let Some(Ok(bytes)) = states.next().map(|s| c.condition.erased_encode_state(s)) {
                let name = c.name.as_bytes();
                let name = &name[..name.len().min(u16::MAX as usize)];
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(name);
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(&bytes);
            }
        });
        Some(out)
    }

    /// Reads [`Termination::save_custom`]'s bytes back into `(name, state bytes)` pairs, in
    /// the order they were saved, without a tree to match them against (what
    /// `watchbridge state inspect` shows). Each pair is the name's length (u16
    /// little-endian), the name, the state's length (u32 little-endian) and the state; a
    /// name that is not UTF-8 is shown with replacement characters. `Err` says where the
    /// bytes are cut short.
    pub fn saved_custom_states(mut saved: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
        let mut states = Vec::new();
        let mut at = 0;
        while !saved.is_empty() {
            let cut = |what: &str| {
                format!(
                    "condition {} cut short at byte {at}: no room for its {what}",
                    states.len()
                )
            };
            let name_len = u16::from_le_bytes(
                saved
                    .get(..2)
                    .ok_or_else(|| cut("name length"))?
                    .try_into()
                    .unwrap_or_default(),
            ) as usize;
            let name = saved.get(2..2 + name_len).ok_or_else(|| cut("name"))?;
            let len_at = 2 + name_len;
            let len = u32::from_le_bytes(
                saved
                    .get(len_at..len_at + 4)
                    .ok_or_else(|| cut("state length"))?
                    .try_into()
                    .unwrap_or_default(),
            ) as usize;
            let end = (len_at + 4).checked_add(len).ok_or_else(|| cut("state"))?;
            let state = saved.get(len_at + 4..end).ok_or_else(|| cut("state"))?;
            states.push((String::from_utf8_lossy(name).into_owned(), state));
            saved = &saved[end..];
            at += end;
        }
        Ok(states)
    }

    /// The state of a watch restored from the state topic: the three facts every built-in
    /// condition reads, as saved, and each user condition's state from `custom`
    /// ([`Termination::save_custom`]'s bytes), matched by name in tree order. A user
    /// condition with no saved state (the tree gained it since), or whose bytes it cannot
    /// decode, starts afresh as `for_new_input(arrived)` makes it, with a warning.
    pub fn restore_state(
        &self,
        arrived: Millis,
        last_new: Millis,
        polls: u64,
        custom: Option<&[u8]>,
        input: &NewInput<'_>,
    ) -> TermState {
        let mut state = TermState {
            last_new,
            polls,
            ..self.for_new_input(arrived, input)
        };
        let (Some(states), Some(mut saved)) = (state.custom.as_mut(), custom) else {
            return state;
        };
        let mut states = states.iter_mut();
        self.for_each_custom(&mut |c| {
            let Some(slot) = states.next() else { return };
            let bytes = take_saved_state(&mut saved, &c.name);
            let restored = match bytes {
                Some(bytes) => c.condition.erased_decode_state(bytes),
                None => Err("no state was saved for it".to_string()),
            };
            match restored {
                Ok(s) => *slot = s,
                Err(error) => tracing::warn!(
                    condition = %c.name,
                    key = %String::from_utf8_lossy(input.key()),
                    error,
                    "a restored watch's termination condition starts afresh: its saved state \
                     cannot be used"
                ),
            }
        });
        state
    }
}

/// The next saved state in `saved` if it is `name`'s (advancing past it), else `None`
/// (leaving `saved` as it was, for the conditions after this one).
fn take_saved_state<'a>(saved: &mut &'a [u8], name: &str) -> Option<&'a [u8]> {
    let rest = *saved;
    let name_len = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let saved_name = rest.get(2..2 + name_len)?;
    let at = 2 + name_len;
    let len = u32::from_le_bytes(rest.get(at..at + 4)?.try_into().ok()?) as usize;
    let bytes = rest.get(at + 4..at + 4 + len)?;
    if saved_name != name.as_bytes() {
        return None;
    }
    *saved = &rest[at + 4 + len..];
    Some(bytes)
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

/// Structural equality; two custom conditions are equal only if they are the same instance
/// (same `Arc`) under the same name.
impl PartialEq for Termination {
    fn eq(&self, other: &Self) -> bool {
        use Termination::*;
        match (self, other) {
            (Never, Never) => true,
            (Total(a), Total(b)) | (Stable(a), Stable(b)) => a == b,
            (Polls(a), Polls(b)) => a == b,
            (Any(a), Any(b)) | (All(a), All(b)) => a == b,
            (Custom(a), Custom(b)) => a.name == b.name && Arc::ptr_eq(&a.condition, &b.condition),
            _ => false,
        }
    }
}

impl Eq for Termination {}

/// The state handling `EitherOf` and `AllOf` share: each side keeps its own state and
/// sees every event; only how the two answers combine differs.
macro_rules! pair_state {
    () => {
        type State = (A::State, B::State);

        fn for_new_input(&self, now: Millis, input: &NewInput<'_>) -> Self::State {
            (
                self.0.for_new_input(now, input),
                self.1.for_new_input(now, input),
            )
        }
        fn on_seen_new_output(&self, now: Millis, new_outputs: usize, state: &mut Self::State) {
            self.0.on_seen_new_output(now, new_outputs, &mut state.0);
            self.1.on_seen_new_output(now, new_outputs, &mut state.1);
        }
        /// The first state's length (u32), its bytes, then the second's.
        fn encode_state(&self, state: &Self::State) -> Vec<u8> {
            let first = self.0.encode_state(&state.0);
            let mut out = (first.len() as u32).to_le_bytes().to_vec();
            out.extend(first);
            out.extend(self.1.encode_state(&state.1));
            out
        }
        fn decode_state(&self, bytes: &[u8]) -> Result<Self::State, String> {
            let len = bytes
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                .filter(|len| 4 + len <= bytes.len())
                .ok_or("a pair's state is cut short")?;
            Ok((
                self.0.decode_state(&bytes[4..4 + len])?,
                self.1.decode_state(&bytes[4 + len..])?,
            ))
        }
        fn on_poll_complete(&self, now: Millis, state: &mut Self::State) {
            self.0.on_poll_complete(now, &mut state.0);
            self.1.on_poll_complete(now, &mut state.1);
        }
    };
}

/// Beam's `eitherOf` for statically typed conditions: stops when either does, with the
/// first one's reason if both do.
#[derive(Debug, Clone)]
pub struct EitherOf<A, B>(pub A, pub B);

impl<A: Condition, B: Condition> Condition for EitherOf<A, B> {
    pair_state!();

    fn can_stop_polling(&self, now: Millis, state: &Self::State) -> Option<TerminatedReason> {
        self.0
            .can_stop_polling(now, &state.0)
            .or_else(|| self.1.can_stop_polling(now, &state.1))
    }
}

/// Beam's `allOf` for statically typed conditions: stops when both do, with
/// [`TerminatedReason::All`].
#[derive(Debug, Clone)]
pub struct AllOf<A, B>(pub A, pub B);

impl<A: Condition, B: Condition> Condition for AllOf<A, B> {
    pair_state!();

    fn can_stop_polling(&self, now: Millis, state: &Self::State) -> Option<TerminatedReason> {
        let both = self.0.can_stop_polling(now, &state.0).is_some()
            && self.1.can_stop_polling(now, &state.1).is_some();
        both.then_some(TerminatedReason::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use TerminatedReason as R;

    /// An arbitrary input arrival time; every test offsets from it.
    const T0: Millis = 1_700_000_000_000;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn parse(s: &str) -> Termination {
        match Termination::parse(s) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    /// A poll at `now`, optionally bringing something new, in the order the engine calls.
    fn poll(c: &Termination, now: Millis, new_output: bool, s: &mut TermState) {
        if new_output {
            c.on_seen_new_output(now, 1, s);
        }
        c.on_poll_complete(now, s);
    }

    /// Stops after `n` polls that each brought something new (the doc example's condition).
    #[derive(Debug)]
    struct ProductivePolls(u32);

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
    fn custom_condition_nests_inside_any_and_all() {
        let productive = Termination::custom("productive", ProductivePolls(3));
        let any = Termination::Any(vec![productive.clone(), Termination::Total(secs(60))]);
        let all = Termination::All(vec![productive.clone(), Termination::Polls(5)]);
        assert_eq!(any.to_string(), "any(productive, total(1m))");
        assert_eq!(all.to_string(), "all(productive, polls(5))");

        let (mut sa, mut sl) = (
            any.for_new_input(T0, &NewInput::none()),
            all.for_new_input(T0, &NewInput::none()),
        );
        for (i, new) in [true, false, true, false, true].into_iter().enumerate() {
            let now = T0 + 1_000 * (i as Millis + 1);
            assert_eq!(any.can_stop_polling(now, &sa), None);
            poll(&any, now, new, &mut sa);
            poll(&all, now, new, &mut sl);
            let expect = (i == 4).then(|| R::Custom("productive".into()));
            assert_eq!(any.can_stop_polling(now, &sa), expect, "poll {i}");
            // Five polls and three productive ones: both children of `all` hold at the 5th.
            let expect = (i == 4).then_some(R::All);
            assert_eq!(all.can_stop_polling(now, &sl), expect, "poll {i}");
        }
        // A cloned state evolves independently of the original.
        let c = Termination::custom("productive", ProductivePolls(1));
        let s0 = c.for_new_input(T0, &NewInput::none());
        let mut s1 = s0.clone();
        poll(&c, T0, true, &mut s1);
        assert_eq!(c.can_stop_polling(T0, &s0), None);
        assert_eq!(
            c.can_stop_polling(T0, &s1),
            Some(R::Custom("productive".into()))
        );
        assert!(format!("{s1:?}").contains("(1, false)"), "{s1:?}");
    }

    #[test]
    fn a_state_from_another_condition_counts_as_expired() {
        // A user condition given a state that has no user-condition part.
        let plain = Termination::Polls(5).for_new_input(T0, &NewInput::none());
        let a = Termination::custom("a", ProductivePolls(5));
        assert_eq!(a.can_stop_polling(T0, &plain), Some(R::Custom("a".into())));
        assert_eq!(
            parse("any(never, stable(1h))").can_stop_polling(T0, &plain),
            None,
            "built-in conditions read only the shared facts"
        );
        // A custom condition given another custom condition's state.
        let b = Termination::custom("b", Termination::Polls(5));
        let mut sb = b.for_new_input(T0, &NewInput::none());
        a.on_poll_complete(T0, &mut sb);
        assert_eq!(a.can_stop_polling(T0, &sb), Some(R::Custom("a".into())));
        assert_eq!(b.can_stop_polling(T0, &sb), None);
    }

    #[test]
    fn saved_custom_states_read_back_what_save_custom_wrote() {
        let c = Termination::Any(vec![
            Termination::custom("productive", ProductivePolls(5)),
            Termination::Total(secs(60)),
            Termination::custom("twice", ProductivePolls(2)),
        ]);
        let mut s = c.for_new_input(T0, &NewInput::none());
        poll(&c, T0, true, &mut s);
        let saved = c.save_custom(&s).unwrap();
        let states = Termination::saved_custom_states(&saved).unwrap();
        let names: Vec<&str> = states.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["productive", "twice"]);
        let restored = c.restore_state(T0, T0, 1, Some(&saved), &NewInput::none());
        assert_eq!(format!("{restored:?}"), format!("{s:?}"));
        assert_eq!(
            states[0].1,
            &ProductivePolls(5).encode_state(&(1, false))[..]
        );
        assert_eq!(Termination::saved_custom_states(&[]), Ok(vec![]));
        // Cut anywhere inside, it says so (never a panic, never a shorter list).
        for cut in 1..saved.len() {
            let e = Termination::saved_custom_states(&saved[..cut]);
            if cut == saved.len() - states[1].1.len() - 4 - 2 - "twice".len() {
                assert_eq!(e.unwrap().len(), 1, "cut at {cut}");
            } else {
                assert!(e.unwrap_err().contains("cut short"), "cut at {cut}");
            }
        }
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

    #[test]
    fn beam_style_constructors_and_typed_combinators() {
        assert_eq!(
            Termination::either_of(
                Termination::after_total_of(secs(300)),
                Termination::all_of(
                    Termination::after_time_since_new_output(secs(60)),
                    Termination::after_polls(3)
                )
            ),
            parse("any(total(5m), all(stable(1m), polls(3)))")
        );
        assert_eq!(Termination::never(), Termination::Never);

        let either = EitherOf(ProductivePolls(1), Termination::Polls(2));
        let mut s = either.for_new_input(T0, &NewInput::none());
        either.on_poll_complete(T0, &mut s);
        assert_eq!(either.can_stop_polling(T0, &s), None);
        either.on_poll_complete(T0, &mut s);
        assert_eq!(either.can_stop_polling(T0, &s), Some(R::Polls));
        either.on_seen_new_output(T0, 1, &mut s);
        either.on_poll_complete(T0, &mut s);
        assert_eq!(
            either.can_stop_polling(T0, &s),
            Some(R::Custom("productive".into()))
        );

        let all = AllOf(ProductivePolls(1), Termination::Total(secs(1)));
        let mut s = all.for_new_input(T0, &NewInput::none());
        all.on_seen_new_output(T0, 1, &mut s);
        all.on_poll_complete(T0, &mut s);
        assert_eq!(all.can_stop_polling(T0 + 999, &s), None);
        assert_eq!(all.can_stop_polling(T0 + 1_000, &s), Some(R::All));
    }

    #[test]
    fn custom_conditions_compare_by_identity() {
        let a = Termination::custom("x", ProductivePolls(1));
        assert_eq!(a, a.clone());
        assert_ne!(a, Termination::custom("x", ProductivePolls(1)));
    }

    // ---- laws, over random trees and random event sequences ----

    #[derive(Debug, Clone)]
    enum Event {
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

    fn tree() -> impl Strategy<Value = Termination> {
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

    fn events() -> impl Strategy<Value = Vec<Event>> {
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
}

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
//!
//! One file a concept: how a tree runs as a [`Condition`] (`evaluate.rs`), user conditions
//! and their erased states (`custom.rs`), the saved states of user conditions (`saved.rs`),
//! the statically typed combinators [`EitherOf`] and [`AllOf`] (`combinators.rs`), and the
//! text form (`parse.rs`). Here: the [`Condition`] trait, [`Termination`] and its state.

mod combinators;
mod custom;
mod evaluate;
mod parse;
mod saved;
#[cfg(test)]
mod tests;

pub use combinators::{AllOf, EitherOf};
pub use custom::{CustomCondition, DynCondition, ErasedState, StateMismatch};
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

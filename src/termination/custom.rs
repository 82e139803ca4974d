//! User conditions nested in a [`Termination`](super::Termination) tree: each with its name, behind the
//! object-safe [`DynCondition`], its per-watch state boxed as an [`ErasedState`], so that
//! conditions with different state types sit side by side in one tree.

use super::{Condition, NewInput};
use crate::clock::Millis;
use crate::reason::TerminatedReason;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A user [`Condition`] with a name, as nested in [`Termination::Custom`](super::Termination::Custom).
#[derive(Clone)]
pub struct CustomCondition {
    pub(super) name: Arc<str>,
    pub(super) condition: Arc<dyn DynCondition>,
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
/// with different state types can sit side by side in one [`Termination`](super::Termination) tree.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::termination::tests::{parse, poll, secs, ProductivePolls, T0};
    use crate::termination::Termination;
    use TerminatedReason as R;

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
    fn custom_conditions_compare_by_identity() {
        let a = Termination::custom("x", ProductivePolls(1));
        assert_eq!(a, a.clone());
        assert_ne!(a, Termination::custom("x", ProductivePolls(1)));
    }
}

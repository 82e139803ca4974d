//! Beam's `eitherOf` and `allOf` for statically typed conditions, which keep each side's
//! own state rather than erase it ([`Termination`](super::Termination) nests any condition
//! the dynamic way).

use super::{Condition, NewInput};
use crate::clock::Millis;
use crate::reason::TerminatedReason;

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
    use crate::termination::tests::{parse, secs, ProductivePolls, T0};
    use crate::termination::Termination;
    use TerminatedReason as R;

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
}

//! The saved states of a tree's user conditions: what is written with a watch on the state
//! topic, read back when it is restored, and shown by `watchbridge state inspect`.

use super::{Condition, NewInput, TermState, Termination};
use crate::clock::Millis;

impl Termination {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::termination::tests::{poll, secs, ProductivePolls, T0};

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
}

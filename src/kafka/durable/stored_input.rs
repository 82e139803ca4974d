//! A live watch's key and input record, packed in one allocation with what its record
//! carries after the input (the poller's and the conditions' states).

use crate::clock::Millis;
use crate::state::Registration;
use bytes::Bytes;

/// A live watch's key and input record, kept to find the watch and rewrite its state
/// record: in one allocation, with no `Bytes` headers (a million idle watches keep a
/// million of these; the `Registration` a record needs is copied out at the rare
/// checkpoint that writes it). The watch key is stored only where it differs from the
/// input's key (`WATCHBRIDGE_WATCH_KEY`). What the record carries after the input travels
/// in the same allocation: the poller's resume state and the user termination conditions'
/// states ([`Tail`]).
#[derive(Debug)]
pub(super) struct StoredInput {
    /// With [`StoredInput::OWN_WATCH_KEY`], the watch key's length as a little-endian `u32`
    /// and its bytes (without, the watch key is the input's key); then the input key's
    /// bytes, the value's, and the tail's. (The length is here, not in a field: the struct
    /// has no padding left, and a field would cost every live watch 8 bytes.)
    bytes: Box<[u8]>,
    /// The input key's length, or [`StoredInput::NO_KEY`]; and the
    /// [`StoredInput::OWN_WATCH_KEY`] flag.
    key_len: u32,
    /// The tail's length (0: none), at the end of `bytes` (here, not in a field of its own:
    /// this `u32` fills what was padding, so a live watch stays as small).
    tail_len: u32,
    pub(super) time: Millis,
}

/// What a watch's record carries besides its input and progress, as of a poll whose
/// outputs are all delivered: the poller's resume state ([`WatchRecord::resume`]) and the
/// states of the user termination conditions ([`WatchRecord::conditions`]). Framed in one
/// byte string, `[resume length: u32][resume][conditions]`, so it costs a live watch one
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tail<'a> {
    pub(super) resume: Option<&'a [u8]>,
    pub(super) conditions: Option<&'a [u8]>,
}

impl<'a> Tail<'a> {
    /// The framed bytes; `None` when there is nothing to carry.
    pub(super) fn frame(&self) -> Option<Box<[u8]>> {
        if self.resume.is_none() && self.conditions.is_none() {
            return None;
        }
        let (resume, conditions) = (
            self.resume.unwrap_or_default(),
            self.conditions.unwrap_or_default(),
        );
        let mut out = Vec::with_capacity(4 + resume.len() + conditions.len());
        out.extend_from_slice(&(resume.len() as u32).to_le_bytes());
        out.extend_from_slice(resume);
        out.extend_from_slice(conditions);
        Some(out.into_boxed_slice())
    }

    /// [`Tail::frame`]'s bytes back (an empty part is none).
    fn read(framed: &'a [u8]) -> Self {
        let len = framed.get(..4).map_or(0, |b| {
            u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
        });
        let resume = framed.get(4..4 + len).unwrap_or_default();
        let conditions = framed.get(4 + len..).unwrap_or_default();
        Self {
            resume: (!resume.is_empty()).then_some(resume),
            conditions: (!conditions.is_empty()).then_some(conditions),
        }
    }
}

impl StoredInput {
    /// A record without a key (Kafka keys are far shorter than this).
    const NO_KEY: u32 = u32::MAX >> 1;
    /// The watch key is not the input's key, and is stored first (`WATCHBRIDGE_WATCH_KEY`).
    const OWN_WATCH_KEY: u32 = 1 << 31;

    pub(super) fn new(watch_key: &[u8], r: &Registration) -> Self {
        let key = r.key.as_deref();
        let own_key = (key != Some(watch_key)).then_some(watch_key);
        let mut bytes = Vec::with_capacity(
            own_key.map_or(0, |k| 4 + k.len()) + key.map_or(0, <[u8]>::len) + r.value.len(),
        );
        if let Some(own) = own_key {
            bytes.extend_from_slice(&(own.len() as u32).to_le_bytes());
            bytes.extend_from_slice(own);
        }
        bytes.extend_from_slice(key.unwrap_or_default());
        bytes.extend_from_slice(&r.value);
        let flag = if own_key.is_some() {
            Self::OWN_WATCH_KEY
        } else {
            0
        };
        Self {
            bytes: bytes.into_boxed_slice(),
            key_len: key.map_or(Self::NO_KEY, |k| k.len() as u32) | flag,
            tail_len: 0,
            time: r.time,
        }
    }

    /// The input key's length, if it has a key.
    fn input_key_len(&self) -> Option<usize> {
        let len = self.key_len & !Self::OWN_WATCH_KEY;
        (len != Self::NO_KEY).then_some(len as usize)
    }

    /// The watch key's length when it is stored apart from the input's.
    fn own_watch_key_len(&self) -> Option<usize> {
        (self.key_len & Self::OWN_WATCH_KEY != 0)
            .then(|| u32::from_le_bytes(self.bytes[..4].try_into().expect("4 bytes")) as usize)
    }

    /// Where the input record starts.
    fn input_start(&self) -> usize {
        self.own_watch_key_len().map_or(0, |len| 4 + len)
    }

    /// The key its watch is found by.
    pub(super) fn watch_key(&self) -> &[u8] {
        match self.own_watch_key_len() {
            Some(len) => &self.bytes[4..4 + len],
            // Not stored apart: the input's key, which then exists.
            None => &self.bytes[..self.input_key_len().unwrap_or(0)],
        }
    }

    /// What its record carries after the input.
    pub(super) fn tail(&self) -> Tail<'_> {
        Tail::read(&self.bytes[self.bytes.len() - self.tail_len as usize..])
    }

    /// Carry `framed` ([`Tail::frame`]'s bytes) in the watch's record from now on (one
    /// allocation again).
    pub(super) fn set_tail(&mut self, framed: &[u8]) {
        let input_len = self.bytes.len() - self.tail_len as usize;
        if self.bytes[input_len..] == *framed {
            return;
        }
        let mut bytes = Vec::with_capacity(input_len + framed.len());
        bytes.extend_from_slice(&self.bytes[..input_len]);
        bytes.extend_from_slice(framed);
        self.bytes = bytes.into_boxed_slice();
        self.tail_len = framed.len() as u32;
    }

    pub(super) fn registration(&self) -> Registration {
        let key_len = self.input_key_len();
        let input = &self.bytes[self.input_start()..self.bytes.len() - self.tail_len as usize];
        let (key, value) = input.split_at(key_len.unwrap_or(0));
        Registration {
            key: key_len.map(|_| Bytes::copy_from_slice(key)),
            value: Bytes::copy_from_slice(value),
            time: self.time,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::durable::tests::T0;

    #[test]
    fn a_stored_input_gives_back_its_watch_key_and_registration_with_or_without_a_key() {
        for key in [
            Some(Bytes::from_static(b"user-7")),
            Some(Bytes::new()),
            None,
        ] {
            let r = Registration {
                key: key.clone(),
                value: Bytes::from_static(br#"{"id": 7}"#),
                time: T0,
            };
            // The watch key as the input's key (stored once), and one of its own
            // (`WATCHBRIDGE_WATCH_KEY`), empty too.
            for watch_key in [key.as_deref().unwrap_or(b"k"), b"tenant-9", b""] {
                let mut stored = StoredInput::new(watch_key, &r);
                assert_eq!(stored.watch_key(), watch_key);
                assert_eq!(stored.registration(), r);
                stored.set_tail(&[1, 0, 0, 0, 9, 8]);
                assert_eq!(
                    (stored.watch_key(), stored.registration()),
                    (watch_key, r.clone())
                );
                assert_eq!(stored.tail().resume, Some(&[9][..]));
            }
        }
        let shared = StoredInput::new(b"user-7", &registration_keyed(b"user-7"));
        let own = StoredInput::new(b"tenant-9", &registration_keyed(b"user-7"));
        assert_eq!(
            shared.bytes.len(),
            6 + 2,
            "the key kept once, and nothing else"
        );
        assert_eq!(
            own.bytes.len(),
            4 + 8 + 6 + 2,
            "its own key, with its length"
        );
    }

    fn registration_keyed(key: &'static [u8]) -> Registration {
        Registration {
            key: Some(Bytes::from_static(key)),
            value: Bytes::from_static(b"{}"),
            time: T0,
        }
    }
}

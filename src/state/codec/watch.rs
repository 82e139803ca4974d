//! The watch record: one watch's registration and progress, and how it ended.

use super::fields::{put_bytes, Reader};
use super::keys::{state_key, Part};
use super::{DecodeError, StateEntry, TooLarge, FORMAT_VERSION, MAX_RECORD_BYTES, TYPE_WATCH};
use crate::clock::Millis;
use crate::reason::TerminatedReason;
use bytes::Bytes;

/// One watch's registration and progress (key `<len>:<watch key>/w`), rewritten whenever
/// they change. All times are epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRecord {
    /// The watch key (also in the record's key; a reader checks that they agree).
    pub watch_key: Bytes,
    /// The input record's key (`None`: the record had none; the watch key then came from
    /// its value).
    pub input_key: Option<Bytes>,
    /// The input record's value as read from the input topic: a restore decodes it again to
    /// re-resolve the resource.
    pub input_value: Bytes,
    /// The input record's timestamp.
    pub input_time: Millis,
    /// Processing time the input arrived at (`total` counts from it).
    pub arrived: Millis,
    /// Processing time of the last poll with a new output; the arrival until one (`stable`).
    pub last_new: Millis,
    /// Successful polls completed (`polls`).
    pub polls: u64,
    /// The watch's watermark hold.
    pub hold: Millis,
    /// When the next poll is due (processing time). For a watch whose poll was in flight at
    /// the checkpoint, the time that poll was due: it is polled again at once on restore.
    pub next_poll: Millis,
    /// Successful polls in a row without a new output (the backoff step).
    pub empty_streak: u32,
    /// Failed polls in a row (the retry step).
    pub failures: u32,
    /// How many seen chunks (`/s/0` ..) the watch had when this record was written.
    pub seen_chunks: u32,
    /// Set once the watch has ended: it is kept (without its seen chunks) until the finished
    /// retention passes, so a re-delivered input does not start it again. A watch that
    /// ended `failed` keeps its seen chunks as long (`seen_chunks` lists them), so that a
    /// re-delivered input starts it again knowing them.
    pub finished: Option<Finished>,
    /// The poller's own state of the watch that must survive a restart (the HTTP poller's
    /// `{last.*}` values, as it encodes them), as of outputs all delivered. Written after
    /// the other fields only when set, so records from before it read as `None`.
    pub resume: Option<Bytes>,
    /// The states of the watch's user termination conditions
    /// ([`Termination::save_custom`](crate::termination::Termination::save_custom)'s bytes),
    /// as of the same poll as `resume`. Written after `resume` (an empty `resume` then stands
    /// for none) only when set, so records from before it read as `None`.
    pub conditions: Option<Bytes>,
}

/// When and why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub at: Millis,
    /// [`TerminatedReason::as_str`]: a fixed name, or a user condition's name.
    pub reason: String,
}

impl Finished {
    pub fn new(at: Millis, reason: &TerminatedReason) -> Self {
        Self {
            at,
            reason: reason.as_str().to_string(),
        }
    }
}

impl WatchRecord {
    /// The value bytes. Prefer [`WatchRecord::to_entry`], which also checks the size.
    ///
    /// # Panics
    /// If a byte field is 4 GiB or longer (a u32 length prefix cannot say so); `to_entry`
    /// refuses far smaller records first.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(FORMAT_VERSION);
        out.push(TYPE_WATCH);
        put_bytes(&mut out, &self.watch_key);
        match &self.input_key {
            None => out.push(0),
            Some(k) => {
                out.push(1);
                put_bytes(&mut out, k);
            }
        }
        put_bytes(&mut out, &self.input_value);
        for t in [self.input_time, self.arrived, self.last_new] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&self.polls.to_le_bytes());
        for t in [self.hold, self.next_poll] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for n in [self.empty_streak, self.failures, self.seen_chunks] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        match &self.finished {
            None => out.push(0),
            Some(f) => {
                out.push(1);
                out.extend_from_slice(&f.at.to_le_bytes());
                put_bytes(&mut out, f.reason.as_bytes());
            }
        }
        if self.resume.is_some() || self.conditions.is_some() {
            put_bytes(&mut out, self.resume.as_deref().unwrap_or_default());
        }
        if let Some(conditions) = &self.conditions {
            put_bytes(&mut out, conditions);
        }
        debug_assert_eq!(out.len(), self.encoded_len());
        out
    }

    /// Bytes of [`WatchRecord::encode`]'s output, computed without encoding.
    pub fn encoded_len(&self) -> usize {
        2 + (4 + self.watch_key.len())
            + 1
            + self.input_key.as_ref().map_or(0, |k| 4 + k.len())
            + (4 + self.input_value.len())
            + 6 * 8
            + 3 * 4
            + 1
            + self.finished.as_ref().map_or(0, |f| 8 + 4 + f.reason.len())
            + match (&self.resume, &self.conditions) {
                (None, None) => 0,
                (resume, _) => 4 + resume.as_ref().map_or(0, Bytes::len),
            }
            + self.conditions.as_ref().map_or(0, |c| 4 + c.len())
    }

    /// Key and value, unless together they exceed [`MAX_RECORD_BYTES`] (an input value near
    /// the input topic's own limit can do that).
    pub fn to_entry(&self) -> Result<StateEntry, TooLarge> {
        self.check_size()?;
        StateEntry::checked(state_key(&self.watch_key, Part::Watch), self.encode())
    }

    /// Whether [`WatchRecord::to_entry`] would succeed, computed without encoding.
    pub fn check_size(&self) -> Result<(), TooLarge> {
        let bytes = state_key(&self.watch_key, Part::Watch).len() + self.encoded_len();
        if bytes > MAX_RECORD_BYTES {
            return Err(TooLarge { bytes });
        }
        Ok(())
    }

    pub(super) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let watch_key = Bytes::copy_from_slice(r.bytes("watch key")?);
        let input_key = match r.flag("input key flag")? {
            false => None,
            true => Some(Bytes::copy_from_slice(r.bytes("input key")?)),
        };
        let input_value = Bytes::copy_from_slice(r.bytes("input value")?);
        let input_time = r.i64("input time")?;
        let arrived = r.i64("arrival time")?;
        let last_new = r.i64("last new output time")?;
        let polls = r.u64("poll count")?;
        let hold = r.i64("hold")?;
        let next_poll = r.i64("next poll time")?;
        let empty_streak = r.u32("empty streak")?;
        let failures = r.u32("failure count")?;
        let seen_chunks = r.u32("seen chunk count")?;
        let finished = match r.flag("finished flag")? {
            false => None,
            true => Some(Finished {
                at: r.i64("finish time")?,
                reason: r.string("finish reason")?,
            }),
        };
        // Optional, last: absent in records written before it existed.
        let resume = match r.pos < r.buf.len() {
            false => None,
            true => Some(Bytes::copy_from_slice(r.bytes("poller resume state")?)),
        };
        let conditions = match r.pos < r.buf.len() {
            false => None,
            true => Some(Bytes::copy_from_slice(
                r.bytes("termination condition states")?,
            )),
        };
        // An empty resume state written only to place the conditions after it is none.
        let resume = resume.filter(|r| !r.is_empty() || conditions.is_none());
        Ok(Self {
            watch_key,
            input_key,
            input_value,
            input_time,
            arrived,
            last_new,
            polls,
            hold,
            next_poll,
            empty_streak,
            failures,
            seen_chunks,
            finished,
            resume,
            conditions,
        })
    }
}

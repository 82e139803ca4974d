//! One watch: the state kept for one input between polls, and what a poll does to it.
//!
//! A watch is a pure state machine: it is handed a poll's outcome and the time, and answers
//! with the outputs that are new, its watermark hold, and whether (and why) it is done or
//! when to poll next. The table (`table.rs`) keeps a million of these and the engine
//! (`engine.rs`) runs the polls; neither knows the rules below.

use crate::clock::{millis, Millis};
use crate::poll::{Output, PollError, PollResult};
use crate::reason::TerminatedReason;
use crate::schedule::{AfterFailure, Schedule};
use crate::seen::SeenSet;
use crate::termination::{Condition, TermState, Termination};
use bytes::Bytes;
use std::sync::Arc;

/// The rules every watch of one engine follows.
#[derive(Debug, Clone)]
pub struct WatchRules {
    pub termination: Termination,
    pub schedule: Schedule,
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
    /// Outputs not seen before, in event-time order.
    pub new_outputs: Vec<Output>,
    /// How many outputs of the poll had been seen before (or repeated within it).
    pub duplicates: usize,
    pub next: Next,
}

/// The result of applying a failed poll.
#[derive(Debug)]
pub struct Failed {
    /// Consecutive failures so far, this one included.
    pub failures: u32,
    pub next: Next,
}

#[derive(Debug)]
pub struct Watch<I> {
    key: Bytes,
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

impl<I> Watch<I> {
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
            key,
            input,
            seen: SeenSet::new(),
            termination: rules.termination.for_new_input(now),
            hold: input_time,
            empty_streak: 0,
            failures: 0,
        }
    }

    pub fn key(&self) -> &Bytes {
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

    pub fn seen(&self) -> &SeenSet {
        &self.seen
    }

    /// Checked when a poll falls due: a time-based condition may have fired while waiting,
    /// in which case the watch ends without polling again.
    pub fn stop_before_poll(&self, now: Millis, rules: &WatchRules) -> Option<TerminatedReason> {
        rules.termination.can_stop_polling(now, &self.termination)
    }

    /// Apply a successful poll completed at `now`.
    pub fn on_success(
        &mut self,
        result: PollResult,
        now: Millis,
        rules: &WatchRules,
        rng: &mut fastrand::Rng,
    ) -> Polled {
        let total = result.outputs.len();
        let new_outputs = self.seen.take_new(result.outputs);
        let duplicates = total - new_outputs.len();
        self.failures = 0;
        if new_outputs.is_empty() {
            self.empty_streak = self.empty_streak.saturating_add(1);
        } else {
            self.empty_streak = 0;
            rules
                .termination
                .on_seen_new_output(now, &mut self.termination);
        }
        rules
            .termination
            .on_poll_complete(now, &mut self.termination);

        // new_outputs is sorted by event time, so its first is the earliest.
        let candidate = result
            .watermark
            .or_else(|| new_outputs.first().map(|o| o.event_time));
        if let Some(c) = candidate {
            self.hold = self.hold.max(c);
        }

        let next = if result.complete {
            Next::Stop(TerminatedReason::Final)
        } else if let Some(reason) = rules.termination.can_stop_polling(now, &self.termination) {
            Next::Stop(reason)
        } else {
            let delay = rules.schedule.after_success(self.empty_streak, rng);
            Next::PollAt(now.saturating_add(millis(delay)))
        };
        Polled {
            new_outputs,
            duplicates,
            next,
        }
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
                AfterFailure::RetryIn(d) => Next::PollAt(now.saturating_add(millis(d))),
            }
        };
        Failed {
            failures: self.failures,
            next,
        }
    }
}

//! The engine: runs the polls of one set of watches (in the bridge, those started from one
//! input partition) and reports what they find.
//!
//! It is one task that alone owns its [`WatchTable`] — no locks on watch state. Inputs come
//! in as [`Command`]s; new outputs, terminations and hold changes go out as [`Event`]s on a
//! bounded channel, in order (a change of the minimum hold is an [`Event::Hold`] in that
//! order too, so a watermark computed from the holds the runtime has taken in never passes
//! an output it has not taken in yet, as Beam holds the watermark at pending outputs). So a
//! slow consumer of events (a full producer queue) stops the engine from dispatching more
//! polls instead of buffering without bound. Polls run as their own
//! tokio tasks (so a slow or CPU-heavy poller uses the other cores and a panicking one
//! fails its poll, not the engine), each under the global in-flight limit, the per-host
//! rate limit and the poll timeout.
//!
//! # Durable state: restore and checkpoints
//!
//! The engine does no I/O for durability; it gives the runtime what the state topic needs
//! (see [`crate::state`]) and takes back what was read from it.
//!
//! - **Restore.** [`Command::Restore`] brings back a watch saved before a restart: its
//!   [`Progress`], its seen set and its saved next poll time. The engine rebuilds it under
//!   its own rules ([`Watch::restore`](crate::watch::Watch::restore)), schedules it at the
//!   saved time (a time already past is due at once; one further away than its schedule
//!   can wait, or than its termination deadline, is brought in to that), counts its hold
//!   in the minimum hold, and answers [`Event::Restored`]. If a watch with that key is
//!   live, nothing changes and it answers [`Event::RestoreRefused`]. The payload is boxed so
//!   that [`Command`], one per input, stays small (56 bytes; 48 before, as the tag no
//!   longer fits in a niche).
//! - **Checkpoints.** With [`EngineConfig::checkpoints`] on, every completed poll (success or
//!   failure) after which the watch goes on is followed by one [`Event::Checkpoint`]: the
//!   watch's [`Progress`], the next poll time the engine scheduled, and the hashes
//!   ([`Output::identity`]: of the output's key and version) of the outputs this poll
//!   found new, in the order of the [`Event::Outputs`] just before it. That is exactly what
//!   [`WatchRecord::from_watch`](crate::state::WatchRecord) and
//!   [`SeenJournal::add`](crate::state::SeenJournal::add) need; the runtime decides when to
//!   write (a hash only once its output is acknowledged). A poll that ends the watch sends
//!   [`Event::Terminated`] instead: a finished record keeps no progress or seen chunks, but
//!   a watch that ended `failed` hands over its seen set (kept to start it again).
//!   Every poll changes progress (at least the poll or failure count), so every poll that
//!   does not end the watch has a checkpoint. Deferrals by the host rate limit are not
//!   reported: the saved next poll time is then earlier than the real one, and a restored
//!   watch only meets the rate limit once more.
//!
//!   Off (the default), nothing of this is computed or sent: the cost is one branch on a
//!   `bool` per completed poll, and [`Event`] keeps its size (the checkpoint is boxed). On,
//!   it costs one event, one small allocation and one XXH3-128 hash per new output per poll.
//!
//! # A watch's end and a re-delivered input
//!
//! The runtime keeps its own record of finished watches (so that an input for one starts
//! nothing), but it learns of an end only when it takes in the [`Event::Terminated`]. Until
//! then it may send a [`Command::Watch`] (or a [`Command::Restore`]) for that key, which
//! the engine, whose watch is gone, would start afresh with an empty seen set: every output
//! again. With [`EngineConfig::remember_ended`] on, the engine keeps the key of every watch
//! it ended until the runtime sends [`Command::Forget`] for it (after taking in the
//! `Terminated`); meanwhile a `Watch` or `Restore` for that key starts nothing and is
//! answered [`Event::AlreadyEnded`]. The commands are handled in order, so every input the
//! runtime sent before its `Forget` is refused, and every one after meets its own record.
//! The set holds only ends the runtime has not acknowledged yet (those in the event channel
//! or being handled): it stays small, and empties as the runtime catches up.

use crate::clock::{millis, Clock, Millis};
use crate::control::{Control, Heartbeat, Pause, WatchState, WatchStatus};
use crate::internal_events::{
    HostHeld, InputAlreadyWatching, PollFailed, PollRateLimited, PollStarted, PollSucceeded,
    RetryAfterCapped, WatchPolledByOperator, WatchRestored, WatchStarted, WatchStoppedByOperator,
    WatchTerminated,
};
use crate::limits::{Limits, PollSlot};
use crate::metrics::Metrics;
use crate::poll::{Output, PollError, PollResult, Poller};
use crate::reason::TerminatedReason;
use crate::seen::{OutputHash, SeenSet};
use crate::table::{Completion, WatchId, WatchTable};
use crate::watch::{Next, Progress, WatchRules};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub rules: WatchRules,
    /// A poll that takes longer fails with kind `timeout` (and is retried like any failure).
    pub poll_timeout: Duration,
    /// Fixes the jitter sequence (tests); `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Send an [`Event::Checkpoint`] after every poll that does not end its watch (for the
    /// durable state topic). Off, the engine costs what it did without durability.
    pub checkpoints: bool,
    /// Remember the key of every watch that ends until a [`Command::Forget`] for it, and
    /// meanwhile answer a `Watch` or `Restore` for that key [`Event::AlreadyEnded`] (see the
    /// module doc). Only for a runtime that sends `Forget` for every [`Event::Terminated`]:
    /// otherwise the keys pile up, and an ended key can never be watched again.
    pub remember_ended: bool,
}

/// What the engine is asked to do.
#[derive(Debug)]
pub enum Command<I> {
    /// Start watching `input` under `key`, unless a watch with that key is running.
    Watch {
        key: Bytes,
        input: Arc<I>,
        /// The input record's timestamp: the watch's first watermark hold.
        input_time: Millis,
    },
    /// Bring back a watch saved before a restart, unless a watch with its key is running.
    Restore(Box<RestoreWatch<I>>),
    /// The runtime has taken in the [`Event::Terminated`] of `key`'s watch: a `Watch` or
    /// `Restore` for `key` may start it again (with [`EngineConfig::remember_ended`]).
    Forget { key: Bytes },
    /// No more watches will come: end once every watch has finished (as closing the command
    /// channel does, but a later [`Command::Shutdown`] can still interrupt them).
    Drain,
    /// Stop every watch at once and end the engine (the partition was revoked or the bridge
    /// is shutting down). Watches are not reported as terminated: they did not finish.
    Shutdown,
}

/// A saved watch to run again: what [`WatchRecord`](crate::state::WatchRecord) and
/// [`SeenJournal::restore`](crate::state::SeenJournal::restore) give back.
#[derive(Debug)]
pub struct RestoreWatch<I> {
    pub key: Bytes,
    /// The poller's input, resolved again from the saved input record.
    pub input: Arc<I>,
    /// The watch's saved progress ([`WatchRecord::progress`](crate::state::WatchRecord::progress)).
    pub progress: Progress,
    /// Its user termination conditions' saved states ([`WatchRecord::conditions`](crate::state::WatchRecord::conditions)).
    pub conditions: Option<Bytes>,
    /// Every output hash the watch had seen.
    pub seen: SeenSet,
    /// When the watch was due to poll next (processing time); a time already past is due at
    /// once.
    pub next_poll: Millis,
}

/// Where a live watch stands after a poll: what its durable record needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub key: Bytes,
    pub progress: Progress,
    /// When its next poll is scheduled (processing time).
    pub next_poll: Millis,
    /// [`Output::identity`] of each output this poll found new, in the order they were emitted.
    pub new_hashes: Vec<OutputHash>,
    /// Hashes of what this poll marked seen without emitting it (a first poll with
    /// `WATCHBRIDGE_START_FROM=now`, `catch_up.rs`): the runtime records them as seen.
    pub silent_hashes: Vec<OutputHash>,
    /// The watch holds new outputs back (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`): its poller
    /// state after this poll is past outputs not emitted yet, so the runtime keeps the
    /// state it saved before (a restart polls them again rather than skip them).
    pub holding_back: bool,
    /// The poller's state of the watch after this poll ([`Poller::resume_state`]).
    pub resume: Option<Vec<u8>>,
    /// Its user termination conditions' states after this poll
    /// ([`Watch::saved_conditions`](crate::watch::Watch::saved_conditions); `None`: the
    /// rules have none).
    pub conditions: Option<Vec<u8>>,
}

/// What a poll found, for its [`Checkpoint`].
#[derive(Debug, Default)]
struct Found {
    new_hashes: Vec<OutputHash>,
    silent_hashes: Vec<OutputHash>,
    holding_back: bool,
}

/// What the engine reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Started {
        key: Bytes,
    },
    /// The input's key already had a running watch; nothing was started.
    AlreadyWatching {
        key: Bytes,
    },
    /// A [`Command::Restore`] was applied: the watch runs again.
    Restored {
        key: Bytes,
    },
    /// A [`Command::Restore`] for a key with a running watch: nothing changed.
    RestoreRefused {
        key: Bytes,
    },
    /// A [`Command::Watch`] or [`Command::Restore`] for a key whose watch has ended, its
    /// [`Event::Terminated`] not acknowledged by a [`Command::Forget`] yet: nothing was
    /// started (only with [`EngineConfig::remember_ended`]).
    AlreadyEnded {
        key: Bytes,
    },
    /// Sent only with [`EngineConfig::checkpoints`]: after a poll the watch survives (after
    /// its `Outputs`, if any).
    Checkpoint(Box<Checkpoint>),
    /// A poll found outputs not seen before (in event-time order), and the watch's hold after it.
    Outputs {
        key: Bytes,
        outputs: Vec<Output>,
        hold: Millis,
        /// The poll's place under the in-flight limit: drop it (with the event) once the
        /// outputs are handed on, and not before (they are views of its response).
        slot: PollSlot,
    },
    /// The earliest watermark hold among the running watches changed (`None`: no watch holds
    /// anything back). A hold released or moved up comes after the events of the same
    /// change (a poll's `Outputs` and `Terminated`), never before: a runtime that applies
    /// holds in event order has taken in every output the old hold covered. A new watch's
    /// hold comes before its `Started` or `Restored` (the runtime counts the hold of a
    /// command not answered yet itself).
    Hold {
        min: Option<Millis>,
    },
    Terminated {
        key: Bytes,
        reason: TerminatedReason,
        /// A watch that ended `failed`: its seen set, so that its input, delivered again,
        /// can start it again knowing what it found (empty for every other reason).
        seen: SeenSet,
    },
}

pub struct Engine<P: Poller> {
    poller: Arc<P>,
    table: WatchTable<P::Input>,
    limits: Limits,
    clock: Clock,
    metrics: Arc<Metrics>,
    poll_timeout: Duration,
    checkpoints: bool,
    in_flight: FuturesUnordered<InFlight>,
    /// The minimum hold last reported ([`Event::Hold`]).
    min_hold: Option<Millis>,
    /// With [`EngineConfig::remember_ended`]: keys of ended watches not forgotten yet.
    ended: Option<HashSet<Bytes>>,
    /// The operations API's messages and the instance's pause ([`Engine::with_controls`]).
    controls: Option<Controls>,
    /// Whether the operations API is connected (the last errors are kept only then).
    controls_connected: bool,
    /// The group's pauses (as in [`Controls`]), for dispatching and for statuses.
    controls_pause: Option<Arc<Pause>>,
    /// The error of the last poll of each watch whose polls fail (only those: see
    /// `control.rs`).
    last_errors: HashMap<Bytes, String>,
    /// This engine's share of `watchbridge_outputs_held_back` last added to it.
    held_back_reported: usize,
}

/// What [`Engine::with_controls`] connects.
struct Controls {
    messages: mpsc::Receiver<Control>,
    pause: Arc<Pause>,
    partition: i32,
    heartbeat: Arc<Heartbeat>,
}

/// Debug builds only, for the test of `/healthz`'s stall check (tests/ops.rs): with
/// `WATCHBRIDGE_TEST_STALL_ENGINE=<partition>`, that partition's engine stops turning once
/// it has a watch, as a deadlocked one would.
#[cfg(debug_assertions)]
fn test_stall(partition: Option<i32>) -> bool {
    let asked = std::env::var("WATCHBRIDGE_TEST_STALL_ENGINE").ok();
    partition.is_some_and(|p| asked.is_some_and(|a| a.trim() == p.to_string()))
}

/// How often a watch paused on its own is looked at again (its resume takes effect within
/// this).
const PAUSED_WATCH_RECHECK_MS: Millis = 1_000;

/// Polls done at once that one turn of the engine completes before it looks at its
/// commands, controls and running polls again (each may free a slot for the next: without a
/// bound, a million due watches of an in-process poller would hold the loop for seconds).
const COMPLETED_HERE_PER_TURN: usize = 64;

/// Commands one turn of the engine takes when they are queued (see the loop in `run`).
const COMMANDS_PER_TURN: usize = 16;

/// Why `run` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The command channel closed and every watch finished.
    Drained,
    /// `Command::Shutdown`.
    Shutdown,
    /// The event receiver was dropped: nobody is listening any more.
    EventsClosed,
}

impl<P: Poller> Engine<P> {
    pub fn new(
        poller: Arc<P>,
        config: EngineConfig,
        limits: Limits,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            poller,
            table: WatchTable::new(config.rules, config.seed),
            limits,
            clock,
            metrics,
            poll_timeout: config.poll_timeout,
            checkpoints: config.checkpoints,
            in_flight: FuturesUnordered::new(),
            min_hold: None,
            ended: config.remember_ended.then(HashSet::new),
            controls: None,
            controls_connected: false,
            controls_pause: None,
            last_errors: HashMap::new(),
            held_back_reported: 0,
        }
    }

    /// Answer the operations API's `messages` (as input partition `partition`'s engine), and
    /// dispatch no poll while `pause` says so.
    pub fn with_controls(
        mut self,
        messages: mpsc::Receiver<Control>,
        pause: Arc<Pause>,
        partition: i32,
        heartbeat: Arc<Heartbeat>,
    ) -> Self {
        self.controls_pause = Some(pause.clone());
        self.controls = Some(Controls {
            messages,
            pause,
            partition,
            heartbeat,
        });
        self.controls_connected = true;
        self
    }

    /// Run until shut down, until nobody listens, or — once `commands` is closed or asked to
    /// [`Command::Drain`] — until every watch has finished.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command<P::Input>>,
        events: mpsc::Sender<Event>,
    ) -> Ended {
        let mut commands_open = true;
        let mut draining = false;
        let mut spare_permit: Option<OwnedSemaphorePermit> = None;
        let mut controls = self.controls.take();
        let pause = controls.as_ref().map(|c| c.pause.clone());
        let heartbeat = controls.as_ref().map(|c| c.heartbeat.clone());
        if let Some(heartbeat) = &heartbeat {
            heartbeat.sends_to(&events);
        }
        #[cfg(debug_assertions)]
        let mut stall = test_stall(controls.as_ref().map(|c| c.partition));
        let ended = loop {
            if let Some(heartbeat) = &heartbeat {
                heartbeat.turned(!self.table.is_empty() || !self.in_flight.is_empty());
            }
            #[cfg(debug_assertions)]
            if stall && !self.table.is_empty() {
                // The stalled engine of `test_stall`: stuck for good, as a deadlock would be.
                stall = false;
                std::future::pending::<()>().await;
            }
            let now = self.clock.now_ms();
            let paused = pause.as_ref().is_some_and(|p| p.is_paused());
            let blocked = match paused {
                // Nothing is dispatched; every watch keeps its place in the queue.
                true => false,
                false => match self.dispatch_due(now, &mut spare_permit, &events).await {
                    Ok(blocked) => blocked,
                    Err(ended) => break ended,
                },
            };
            if (!commands_open || draining) && self.table.is_empty() && self.in_flight.is_empty() {
                break Ended::Drained;
            }
            let wake = match (blocked || paused, self.table.next_due()) {
                (false, Some(due)) => Some(self.clock.instant_at(due)),
                _ => None,
            };
            // Unbiased: under load both new inputs and finished polls are always ready, and
            // neither may starve the other.
            tokio::select! {
                command = commands.recv(), if commands_open => {
                    // Those queued behind it too, a few: polls done at once keep the engine
                    // busy, and one command a turn would starve the inputs.
                    let mut command = command;
                    let mut taken = 0;
                    let handled = loop {
                        let Some(next) = command else {
                            commands_open = false;
                            break Ok(());
                        };
                        if let Err(ended) = self.on_command(next, &mut draining, &events).await {
                            break Err(ended);
                        }
                        taken += 1;
                        if taken == COMMANDS_PER_TURN {
                            break Ok(());
                        }
                        match commands.try_recv() {
                            Ok(next) => command = Some(next),
                            Err(_) => break Ok(()),
                        }
                    };
                    if let Err(ended) = handled {
                        break ended;
                    }
                }
                Some(done) = self.in_flight.next() => {
                    if let Err(ended) = self.complete(done, &events).await {
                        break ended;
                    }
                }
                permit = self.limits.in_flight().clone().acquire_owned(), if blocked => {
                    spare_permit = permit.ok();
                }
                Some(message) = next_control(&mut controls), if controls.is_some() => {
                    let partition = controls.as_ref().map_or(0, |c| c.partition);
                    if let Err(ended) = self.on_control(message, partition, &events).await {
                        break ended;
                    }
                }
                () = resumed(&pause), if paused => {}
                () = sleep_until_opt(wake), if wake.is_some() => {}
            }
        };
        // Watches left running are not finished; they just stop being counted here.
        self.metrics.watches_active.sub(self.table.len() as i64);
        self.metrics
            .outputs_held_back
            .sub(self.held_back_reported as i64);
        ended
    }

    /// `watchbridge_outputs_held_back` moved by what this engine's watches hold back now
    /// (a gauge every partition's engine adds its share to).
    fn report_held_back(&mut self) {
        let now = self.table.held_back();
        if now != self.held_back_reported {
            let delta = now as i64 - self.held_back_reported as i64;
            self.metrics.outputs_held_back.add(delta);
            self.held_back_reported = now;
        }
    }

    /// One command from the partition task (`Shutdown` ends the engine: `Err`).
    async fn on_command(
        &mut self,
        command: Command<P::Input>,
        draining: &mut bool,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        match command {
            Command::Shutdown => return Err(Ended::Shutdown),
            Command::Drain => *draining = true,
            Command::Watch {
                key,
                input,
                input_time,
            } => self.start(key, input, input_time, events).await?,
            Command::Restore(restore) => self.restore(*restore, events).await?,
            Command::Forget { key } => {
                if let Some(ended) = self.ended.as_mut() {
                    ended.remove(&key);
                }
            }
        }
        Ok(())
    }

    async fn start(
        &mut self,
        key: Bytes,
        input: Arc<P::Input>,
        input_time: Millis,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        if self.has_ended(&key) {
            return send(events, Event::AlreadyEnded { key }).await;
        }
        let now = self.clock.now_ms();
        let event = match self.table.insert(key.clone(), input, input_time, now) {
            Ok(_) => {
                WatchStarted { key: &key }.emit(&self.metrics);
                Event::Started { key }
            }
            Err(_) => {
                InputAlreadyWatching { key: &key }.emit(&self.metrics);
                Event::AlreadyWatching { key }
            }
        };
        // A new hold is reported before the answer, so that a runtime that counts the
        // watch's hold itself until the answer never goes without it.
        self.report_min_hold(events).await?;
        send(events, event).await
    }

    async fn restore(
        &mut self,
        restore: RestoreWatch<P::Input>,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        let RestoreWatch {
            key,
            input,
            progress,
            conditions,
            seen,
            next_poll,
        } = restore;
        if self.has_ended(&key) {
            return send(events, Event::AlreadyEnded { key }).await;
        }
        // No later than this schedule could have put it (a poll saved under an uncapped
        // `Retry-After` by an older version); the table brings it in to the watch's
        // termination deadline too.
        let latest = self
            .clock
            .now_ms()
            .saturating_add(millis(self.table.rules().schedule.longest_delay()));
        let event = match self.table.insert_restored(
            key.clone(),
            input,
            seen,
            progress,
            conditions.as_deref(),
            next_poll.min(latest),
        ) {
            Ok(_) => {
                WatchRestored { key: &key }.emit(&self.metrics);
                Event::Restored { key }
            }
            Err(_) => {
                InputAlreadyWatching { key: &key }.emit(&self.metrics);
                Event::RestoreRefused { key }
            }
        };
        self.report_min_hold(events).await?;
        send(events, event).await
    }

    /// Start every poll that is due, as far as the in-flight limit allows. Returns whether
    /// a due watch is waiting for a permit.
    async fn dispatch_due(
        &mut self,
        now: Millis,
        spare_permit: &mut Option<OwnedSemaphorePermit>,
        events: &mpsc::Sender<Event>,
    ) -> Result<bool, Ended> {
        let mut completed_here = 0;
        while self.table.next_due().is_some_and(|due| due <= now) {
            let permit = match spare_permit.take() {
                Some(p) => p,
                None => match self.limits.in_flight().clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => return Ok(true),
                },
            };
            let Some((id, due)) = self.table.pop_due(now) else {
                *spare_permit = Some(permit);
                break;
            };
            if let Some((key, reason)) = self.table.stop_if_done(id, now) {
                *spare_permit = Some(permit);
                self.terminated(key, reason, SeenSet::new(), events).await?;
                self.report_min_hold(events).await?;
                continue;
            }
            let Some(input) = self.table.watch(id).map(|w| w.input().clone()) else {
                *spare_permit = Some(permit);
                continue;
            };
            if self.is_paused_alone(id) {
                // Paused on its own: looked at again in a second, keeping its place.
                self.table.defer(id, now + PAUSED_WATCH_RECHECK_MS);
                *spare_permit = Some(permit);
                continue;
            }
            if let Some(host) = self.poller.rate_key(&input) {
                if let Err(wait) = self.limits.check_host(&host) {
                    PollRateLimited { host: &host, wait }.emit(&self.metrics);
                    // Round up so a sub-millisecond wait cannot spin.
                    self.table.defer(id, now + millis(wait) + 1);
                    *spare_permit = Some(permit);
                    continue;
                }
            }
            PollStarted {
                lateness: Duration::from_millis((now - due).max(0) as u64),
            }
            .emit(&self.metrics);
            // Polled once here first: a poll that is done at once (an in-process poller, an
            // answer already at hand) is completed at once, without a task of its own, and
            // without waking another worker for it. The others go on in a task, so that
            // their work (a response to parse) can run on any worker.
            let started = Instant::now();
            let mut poll = Box::pin(self.poller.poll(input));
            let first = std::panic::AssertUnwindSafe(poll.as_mut()).catch_unwind();
            if let Poll::Ready(outcome) = futures::poll!(first) {
                // A poller that panicked failed this poll, as in its task; the engine goes on.
                let outcome = outcome.unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|m| m.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(PollError::transient(
                        "panic",
                        format!("poller task failed: the poller panicked: {message}"),
                    ))
                });
                let done = Done {
                    id,
                    started,
                    outcome,
                    slot: PollSlot::new(permit),
                };
                self.complete(done, events).await?;
                completed_here += 1;
                if completed_here >= COMPLETED_HERE_PER_TURN {
                    // Commands, controls and finished polls get their turn too.
                    return Ok(false);
                }
                continue;
            }
            let timeout = self.poll_timeout;
            let task = tokio::spawn(async move {
                match tokio::time::timeout(timeout, poll).await {
                    Ok(result) => result,
                    Err(_) => Err(PollError::transient(
                        "timeout",
                        format!(
                            "no result within the poll timeout ({})",
                            humantime::format_duration(timeout)
                        ),
                    )),
                }
            });
            self.in_flight.push(InFlight {
                id,
                started,
                task: AbortOnDrop(task),
                slot: PollSlot::new(permit),
            });
        }
        Ok(false)
    }

    /// Whether `id`'s watch was paused on its own (`POST /watches/{key}/pause`).
    fn is_paused_alone(&self, id: WatchId) -> bool {
        let Some(pause) = &self.controls_pause else {
            return false;
        };
        self.table
            .watch(id)
            .is_some_and(|w| pause.is_key_paused(w.key()))
    }

    async fn complete(&mut self, done: Done, events: &mpsc::Sender<Event>) -> Result<(), Ended> {
        let now = self.clock.now_ms();
        let duration = done.started.elapsed();
        self.hold_host_if_asked(&done);
        let Some(completion) = self.table.complete(done.id, done.outcome, now) else {
            return Ok(());
        };
        match completion {
            Completion::Polled { key, polled, hold } => {
                if !self.last_errors.is_empty() {
                    self.last_errors.remove(&key);
                }
                PollSucceeded {
                    new_outputs: polled.new_outputs.len(),
                    duplicates: polled.duplicates,
                    silent: polled.silent.len(),
                    duration,
                }
                .emit(&self.metrics);
                self.report_held_back();
                let found = match (&polled.next, self.checkpoints) {
                    (Next::PollAt(_), true) => Found {
                        new_hashes: polled.new_outputs.iter().map(|o| o.identity()).collect(),
                        silent_hashes: polled.silent,
                        holding_back: polled.holding_back,
                    },
                    _ => Found::default(),
                };
                if !polled.new_outputs.is_empty() {
                    let outputs = polled.new_outputs;
                    let key = key.clone();
                    let slot = done.slot;
                    send(
                        events,
                        Event::Outputs {
                            key,
                            outputs,
                            hold,
                            slot,
                        },
                    )
                    .await?;
                }
                match polled.next {
                    Next::Stop(reason) => {
                        self.terminated(key, reason, SeenSet::new(), events).await?
                    }
                    Next::PollAt(at) => self.checkpoint(done.id, key, at, found, events).await?,
                }
            }
            Completion::Failed {
                key,
                failed,
                error,
                seen,
            } => {
                let retry_in = match failed.next {
                    Next::PollAt(at) => Some(Duration::from_millis((at - now).max(0) as u64)),
                    Next::Stop(_) => None,
                };
                PollFailed {
                    key: &key,
                    error: &error,
                    failures: failed.failures,
                    duration,
                    retry_in,
                }
                .emit(&self.metrics);
                if self.controls_connected {
                    self.last_errors.insert(key.clone(), error.to_string());
                }
                if let Some(requested) = failed.retry_after_capped {
                    RetryAfterCapped {
                        key: &key,
                        requested,
                        cap: self.table.rules().schedule.retry.retry_after_cap(),
                    }
                    .emit(&self.metrics);
                }
                match failed.next {
                    Next::Stop(reason) => self.terminated(key, reason, seen, events).await?,
                    Next::PollAt(at) => {
                        self.checkpoint(done.id, key, at, Found::default(), events)
                            .await?
                    }
                }
            }
        }
        // The poll may have moved this watch's hold or ended it: either can move the
        // minimum, reported after its outputs.
        self.report_min_hold(events).await
    }

    /// A resource that said to wait (`Retry-After` on a failure, `RateLimit-*` with nothing
    /// remaining) said it for its host: every watch of this instance polling that host waits
    /// as long, up to the `Retry-After` cap.
    fn hold_host_if_asked(&self, done: &Done) {
        let asked = match &done.outcome {
            Ok(result) => result.host_wait,
            Err(error) => error.retry_after,
        };
        let Some(asked) = asked.filter(|w| !w.is_zero()) else {
            return;
        };
        let Some(host) = self
            .table
            .watch(done.id)
            .and_then(|w| self.poller.rate_key(w.input()))
        else {
            return;
        };
        let (wait, _) = self.table.rules().schedule.retry.cap_retry_after(asked);
        HostHeld { host: &host, wait }.emit();
        self.limits.hold_host(&host, wait);
    }

    /// With checkpoints on, report where a watch that goes on stands after a poll.
    async fn checkpoint(
        &self,
        id: WatchId,
        key: Bytes,
        next_poll: Millis,
        found: Found,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        if !self.checkpoints {
            return Ok(());
        }
        let Some(watch) = self.table.watch(id) else {
            return Ok(());
        };
        let checkpoint = Checkpoint {
            key,
            progress: watch.progress(),
            next_poll,
            new_hashes: found.new_hashes,
            silent_hashes: found.silent_hashes,
            holding_back: found.holding_back,
            resume: self.poller.resume_state(watch.input()),
            conditions: watch.saved_conditions(self.table.rules()),
        };
        send(events, Event::Checkpoint(Box::new(checkpoint))).await
    }

    /// A message of the operations API.
    async fn on_control(
        &mut self,
        message: Control,
        partition: i32,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        match message {
            Control::Status { key, reply } => {
                let status = self
                    .table
                    .id_of(&key)
                    .and_then(|id| self.status_of(id, partition, self.table.due_of(id)));
                let _ = reply.send(status);
            }
            Control::List { query, reply } => {
                let due = self.table.due_times();
                let min_hold = self.table.min_hold();
                let watches = self
                    .table
                    .live()
                    .filter(|(_, w)| !query.holds_watermark || Some(w.hold()) == min_hold)
                    .filter_map(|(id, _)| self.status_of(id, partition, due.get(&id).copied()))
                    .filter(|s| query.state.is_none_or(|want| s.state == want))
                    .collect();
                let _ = reply.send((self.table.len(), watches));
            }
            Control::PollNow { key, reply } => {
                let now = self.clock.now_ms();
                let moved = self
                    .table
                    .id_of(&key)
                    .map(|id| self.table.poll_now(id, now));
                if moved == Some(true) {
                    WatchPolledByOperator { key: &key }.emit(&self.metrics);
                }
                let _ = reply.send(moved);
            }
            Control::Stop { key, reply } => {
                let removed = self.table.id_of(&key).and_then(|id| self.table.remove(id));
                let stopped = removed.is_some();
                let _ = reply.send(stopped);
                if stopped {
                    WatchStoppedByOperator { key: &key }.emit(&self.metrics);
                    self.terminated(key, TerminatedReason::Stopped, SeenSet::new(), events)
                        .await?;
                    self.report_min_hold(events).await?;
                }
            }
        }
        Ok(())
    }

    /// A live watch as the operations API shows it, due at `next_poll` (`None`: its poll
    /// runs).
    fn status_of(
        &self,
        id: WatchId,
        partition: i32,
        next_poll: Option<Millis>,
    ) -> Option<WatchStatus> {
        let watch = self.table.watch(id)?;
        let progress = watch.progress();
        let last_poll = self.table.last_poll(id);
        let state = match (next_poll, progress.failures) {
            (None, _) => WatchState::Polling,
            (Some(_), 0) => WatchState::Waiting,
            (Some(_), _) => WatchState::Retrying,
        };
        let termination = &self.table.rules().termination;
        Some(WatchStatus {
            key: String::from_utf8_lossy(watch.key()).into_owned(),
            partition,
            state,
            input: None,
            started_ms: progress.arrived,
            last_poll_ms: last_poll,
            last_poll_result: last_poll.map(|_| match progress.failures {
                0 => "ok",
                _ => "failed",
            }),
            polls_ok: progress.polls,
            failures_in_a_row: progress.failures,
            empty_polls_in_a_row: progress.empty_streak,
            last_new_output_ms: progress.last_new,
            last_error: self.last_errors.get(watch.key()).cloned(),
            next_poll_ms: next_poll,
            seen_outputs: watch.seen().len(),
            hold_ms: progress.hold,
            termination: termination.describe(watch.termination(), self.clock.now_ms()),
            paused: self
                .controls_pause
                .as_ref()
                .is_some_and(|p| p.is_paused() || p.is_key_paused(watch.key())),
        })
    }

    async fn terminated(
        &mut self,
        key: Bytes,
        reason: TerminatedReason,
        seen: SeenSet,
        events: &mpsc::Sender<Event>,
    ) -> Result<(), Ended> {
        if !self.last_errors.is_empty() {
            self.last_errors.remove(&key);
        }
        WatchTerminated {
            key: &key,
            reason: &reason,
        }
        .emit(&self.metrics);
        if let Some(ended) = self.ended.as_mut() {
            ended.insert(key.clone());
        }
        send(events, Event::Terminated { key, reason, seen }).await
    }

    /// Whether `key`'s watch has ended and the runtime has not acknowledged it yet.
    fn has_ended(&self, key: &Bytes) -> bool {
        self.ended.as_ref().is_some_and(|e| e.contains(key))
    }

    /// Send [`Event::Hold`] if the minimum hold changed since the last one.
    async fn report_min_hold(&mut self, events: &mpsc::Sender<Event>) -> Result<(), Ended> {
        let min = self.table.min_hold();
        if min == self.min_hold {
            return Ok(());
        }
        self.min_hold = min;
        send(events, Event::Hold { min }).await
    }
}

/// The next message of the operations API (pending without one).
async fn next_control(controls: &mut Option<Controls>) -> Option<Control> {
    match controls {
        Some(c) => c.messages.recv().await,
        None => std::future::pending().await,
    }
}

/// Ready once polling resumes.
async fn resumed(pause: &Option<Arc<Pause>>) {
    match pause {
        Some(p) => p.resumed().await,
        None => std::future::pending().await,
    }
}

async fn send(events: &mpsc::Sender<Event>, event: Event) -> Result<(), Ended> {
    events.send(event).await.map_err(|_| Ended::EventsClosed)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A running poll task that is cancelled if the engine goes away (revoked partition).
struct AbortOnDrop(JoinHandle<Result<PollResult, PollError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct InFlight {
    id: WatchId,
    started: Instant,
    task: AbortOnDrop,
    /// Held from the poll's start until its outputs are handed on (or it found none).
    slot: PollSlot,
}

struct Done {
    id: WatchId,
    started: Instant,
    outcome: Result<PollResult, PollError>,
    slot: PollSlot,
}

impl Future for InFlight {
    type Output = Done;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        let joined = std::task::ready!(Pin::new(&mut self.task.0).poll(cx));
        let outcome = joined.unwrap_or_else(|e| {
            // A poller that panicked (or was cancelled) failed this poll; the engine goes on.
            Err(PollError::transient(
                "panic",
                format!("poller task failed: {e}"),
            ))
        });
        Poll::Ready(Done {
            id: self.id,
            started: self.started,
            outcome,
            slot: std::mem::take(&mut self.slot),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_leaves_commands_and_events_their_size() {
        // Restore and Checkpoint are boxed. An `Outputs` event, sent for every productive
        // poll, grew from 72 to 80 bytes with the poll's slot (`PollSlot`: 8 bytes per event
        // of a channel of 256); a command grew from 48 to 56 bytes (a second variant with
        // data takes the tag out of the key's niche), 8 bytes per queued input.
        assert!(
            std::mem::size_of::<Command<()>>() <= 56,
            "{}",
            std::mem::size_of::<Command<()>>()
        );
        assert!(
            std::mem::size_of::<Event>() <= 80,
            "{}",
            std::mem::size_of::<Event>()
        );
    }
}

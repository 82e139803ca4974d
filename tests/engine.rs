//! The engine end to end, on tokio's paused (virtual) clock: every time below is exact.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use watchbridge::clock::{Clock, Millis};
use watchbridge::engine::{Checkpoint, Command, Ended, Engine, EngineConfig, Event, RestoreWatch};
use watchbridge::limits::{HostRate, Limits};
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::reason::TerminatedReason;
use watchbridge::schedule::{Backoff, Retry, Schedule};
use watchbridge::seen::{hash_key, OutputHash, SeenSet};
use watchbridge::termination::Termination;
use watchbridge::watch::WatchRules;

const T0: Millis = 1_700_000_000_000;

type Step = Result<PollResult, PollError>;

/// A poller that plays back a script per input and records when each poll started.
#[derive(Default)]
struct Scripted {
    scripts: Mutex<HashMap<String, VecDeque<Step>>>,
    polls: Mutex<Vec<(String, Duration)>>,
    /// How long each poll takes.
    latency: Duration,
    running: AtomicUsize,
    max_running: AtomicUsize,
    start: Mutex<Option<Instant>>,
}

struct In {
    name: String,
    host: Option<Arc<str>>,
}

impl Scripted {
    fn with(scripts: Vec<(&str, Vec<Step>)>) -> Self {
        let s = Self::default();
        *s.scripts.lock().unwrap() = scripts
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        *s.start.lock().unwrap() = Some(Instant::now());
        s
    }

    fn poll_times(&self, name: &str) -> Vec<u64> {
        self.polls
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| t.as_millis() as u64)
            .collect()
    }
}

/// The engine owns its poller; tests keep a second handle to inspect what it saw.
struct Shared(Arc<Scripted>);

impl Poller for Shared {
    type Input = In;

    fn poll(&self, input: Arc<In>) -> impl std::future::Future<Output = Step> + Send + 'static {
        let me = self.0.clone();
        async move {
            let since = me.start.lock().unwrap().unwrap().elapsed();
            me.polls.lock().unwrap().push((input.name.clone(), since));
            let now = me.running.fetch_add(1, Ordering::SeqCst) + 1;
            me.max_running.fetch_max(now, Ordering::SeqCst);
            if !me.latency.is_zero() {
                tokio::time::sleep(me.latency).await;
            }
            me.running.fetch_sub(1, Ordering::SeqCst);
            let step = me
                .scripts
                .lock()
                .unwrap()
                .get_mut(&input.name)
                .and_then(|q| q.pop_front());
            match step {
                Some(Err(e)) if e.kind == "panic" => panic!("scripted panic"),
                Some(step) => step,
                None => Ok(PollResult::default()),
            }
        }
    }

    fn rate_key(&self, input: &In) -> Option<Arc<str>> {
        input.host.clone()
    }
}

fn out(key: &str, t: Millis) -> Output {
    Output::new(key.to_string(), format!("value of {key}"), t)
}

/// `n` polls that each bring one new output.
fn growing(n: i64) -> Vec<Step> {
    (0..n)
        .map(|i| Ok(PollResult::incomplete(vec![out(&format!("o{i}"), T0 + i)])))
        .collect()
}

fn rules(termination: &str) -> WatchRules {
    WatchRules {
        catch_up: Default::default(),
        termination: termination
            .parse::<Termination>()
            .expect("termination parses"),
        schedule: Schedule {
            interval: Duration::from_secs(10),
            backoff: None,
            jitter: 0.0,
            // A resource's Retry-After is honoured up to `max` (the default cap).
            retry: Retry {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(4),
                limit: 3,
                ..Schedule::default().retry
            },
        },
    }
}

struct Running {
    commands: mpsc::Sender<Command<In>>,
    events: mpsc::Receiver<Event>,
    task: tokio::task::JoinHandle<Ended>,
    metrics: Arc<Metrics>,
}

fn start(
    poller: Arc<Scripted>,
    rules: WatchRules,
    limits: Limits,
    event_capacity: usize,
) -> Running {
    start_at(poller, rules, limits, event_capacity, false, T0)
}

/// An engine whose clock reads `now` at this instant, with checkpoints on or off.
fn start_at(
    poller: Arc<Scripted>,
    rules: WatchRules,
    limits: Limits,
    event_capacity: usize,
    checkpoints: bool,
    now: Millis,
) -> Running {
    let config = EngineConfig {
        rules,
        poll_timeout: Duration::from_secs(30),
        seed: Some(42),
        checkpoints,
        remember_ended: false,
    };
    start_with(poller, config, limits, event_capacity, now)
}

/// An engine with this config whose clock reads `now` at this instant.
fn start_with(
    poller: Arc<Scripted>,
    config: EngineConfig,
    limits: Limits,
    event_capacity: usize,
    now: Millis,
) -> Running {
    let metrics = Arc::new(Metrics::new());
    let engine = Engine::new(
        Arc::new(Shared(poller)),
        config,
        limits,
        Clock::starting_at(now),
        metrics.clone(),
    );
    let (commands, rx) = mpsc::channel(1024);
    let (tx, events) = mpsc::channel(event_capacity);
    let task = tokio::spawn(engine.run(rx, tx));
    Running {
        commands,
        events,
        task,
        metrics,
    }
}

impl Running {
    async fn watch(&self, name: &str, input_time: Millis) {
        self.watch_host(name, input_time, None).await
    }

    async fn watch_host(&self, name: &str, input_time: Millis, host: Option<&str>) {
        let input = In {
            name: name.to_string(),
            host: host.map(Arc::from),
        };
        self.commands
            .send(Command::Watch {
                key: Bytes::from(name.to_string()),
                input: Arc::new(input),
                input_time,
            })
            .await
            .unwrap();
    }

    /// Close the command channel and collect every event until the engine drains. The
    /// output events kept hold their polls' slots: at most the in-flight limit of polls
    /// may find outputs (`a_poll_counts_against_the_in_flight_limit_…`).
    async fn drain(mut self) -> Vec<Event> {
        drop(self.commands);
        let mut all = Vec::new();
        while let Some(e) = self.events.recv().await {
            all.push(e);
        }
        assert_eq!(self.task.await.unwrap(), Ended::Drained);
        all
    }
}

fn outputs_of(events: &[Event], name: &str) -> Vec<(String, Millis)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Outputs { key, outputs, .. } if key == name.as_bytes() => Some(outputs),
            _ => None,
        })
        .flatten()
        .map(|o| (String::from_utf8(o.key.to_vec()).unwrap(), o.event_time))
        .collect()
}

fn reason_of(events: &[Event], name: &str) -> Option<TerminatedReason> {
    events.iter().find_map(|e| match e {
        Event::Terminated { key, reason, .. } if key == name.as_bytes() => Some(reason.clone()),
        _ => None,
    })
}

/// The minimum holds the engine reported, in order.
fn holds_reported(events: &[Event]) -> Vec<Option<Millis>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Hold { min } => Some(*min),
            _ => None,
        })
        .collect()
}

fn unlimited() -> Limits {
    Limits::new(1000, None)
}

#[tokio::test(start_paused = true)]
async fn new_outputs_are_emitted_once_in_event_time_order_until_polls_limit() {
    let poller = Arc::new(Scripted::with(vec![(
        "u1",
        vec![
            Ok(PollResult::incomplete(vec![
                out("b", T0 + 20),
                out("a", T0 + 10),
                out("b", T0 + 20),
            ])),
            Ok(PollResult::incomplete(vec![
                out("a", T0 + 10),
                out("c", T0 + 5),
            ])),
            Ok(PollResult::incomplete(vec![
                out("a", T0 + 10),
                out("b", T0 + 20),
                out("c", T0 + 5),
            ])),
        ],
    )]));
    let r = start(poller.clone(), rules("polls(3)"), unlimited(), 16);
    r.watch("u1", T0).await;
    let metrics = r.metrics.clone();
    let events = r.drain().await;
    assert_eq!(
        outputs_of(&events, "u1"),
        vec![
            ("a".into(), T0 + 10),
            ("b".into(), T0 + 20),
            ("c".into(), T0 + 5)
        ]
    );
    assert_eq!(reason_of(&events, "u1"), Some(TerminatedReason::Polls));
    assert_eq!(poller.poll_times("u1"), vec![0, 10_000, 20_000]);
    assert_eq!(metrics.outputs_emitted.get(), 3);
    assert_eq!(metrics.duplicates_suppressed.get(), 5);
    assert_eq!(metrics.watches_active.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn final_result_ends_the_watch_after_emitting_it() {
    let poller = Arc::new(Scripted::with(vec![(
        "u1",
        vec![
            Ok(PollResult::incomplete(vec![out("a", T0)])),
            Ok(PollResult::complete(vec![out("a", T0), out("b", T0 + 1)])),
        ],
    )]));
    let r = start(poller.clone(), rules("never"), unlimited(), 16);
    r.watch("u1", T0).await;
    let events = r.drain().await;
    assert_eq!(
        outputs_of(&events, "u1"),
        vec![("a".into(), T0), ("b".into(), T0 + 1)]
    );
    assert_eq!(reason_of(&events, "u1"), Some(TerminatedReason::Final));
    assert_eq!(poller.poll_times("u1"), vec![0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn stable_ends_an_empty_resource_and_total_ends_a_busy_one() {
    // "quiet" never has output: stable(25s) counts from the start and ends it at 25 s,
    // without the poll due at 30 s.
    // "busy" gets a new output every poll, so only total(45s) ends it.
    let poller = Arc::new(Scripted::with(vec![("busy", growing(10))]));
    let r = start(
        poller.clone(),
        rules("any(total(45s), stable(25s))"),
        unlimited(),
        64,
    );
    r.watch("quiet", T0).await;
    r.watch("busy", T0).await;
    let events = r.drain().await;
    assert_eq!(reason_of(&events, "quiet"), Some(TerminatedReason::Stable));
    assert_eq!(poller.poll_times("quiet"), vec![0, 10_000, 20_000]);
    assert_eq!(reason_of(&events, "busy"), Some(TerminatedReason::Total));
    assert_eq!(
        poller.poll_times("busy"),
        vec![0, 10_000, 20_000, 30_000, 40_000]
    );
    assert_eq!(outputs_of(&events, "busy").len(), 5);
}

#[tokio::test(start_paused = true)]
async fn poll_errors_retry_with_backoff_then_fail_the_watch() {
    let err = || Err(PollError::transient("http_5xx", "503 from upstream"));
    let poller = Arc::new(Scripted::with(vec![
        ("bad", vec![err(), err(), err(), err(), err()]),
        // Recovers after two failures; its next failure retries after 1 s again, because the
        // failure count resets on success.
        (
            "flaky",
            vec![
                err(),
                err(),
                Ok(PollResult::incomplete(vec![out("x", T0)])),
                err(),
            ],
        ),
    ]));
    let r = start(poller.clone(), rules("polls(3)"), unlimited(), 64);
    r.watch("bad", T0).await;
    r.watch("flaky", T0).await;
    let metrics = r.metrics.clone();
    let events = r.drain().await;
    // limit 3: the first failure and three retries (1 s, 2 s, 4 s apart), then failed.
    assert_eq!(poller.poll_times("bad"), vec![0, 1_000, 3_000, 7_000]);
    assert_eq!(reason_of(&events, "bad"), Some(TerminatedReason::Failed));
    assert_eq!(
        poller.poll_times("flaky"),
        vec![0, 1_000, 3_000, 13_000, 14_000, 24_000]
    );
    assert_eq!(reason_of(&events, "flaky"), Some(TerminatedReason::Polls));
    let failed = metrics
        .watches_terminated
        .with_label_values(&["failed"])
        .get();
    assert_eq!(failed, 1);
    let errors = metrics
        .polls_error
        .with_label_values(&["error", "http_5xx"])
        .get();
    assert_eq!(errors, 7);
}

/// A watch that fails hands its seen set over with its end (to be started again knowing
/// it); a watch that ends for any other reason hands over nothing.
#[tokio::test(start_paused = true)]
async fn a_failed_watch_hands_over_its_seen_set() {
    let err = || Err(PollError::transient("http_5xx", "503 from upstream"));
    let poller = Arc::new(Scripted::with(vec![
        (
            "outage",
            vec![
                Ok(PollResult::incomplete(vec![out("a", T0), out("b", T0)])),
                err(),
                err(),
                err(),
                err(),
            ],
        ),
        ("done", vec![Ok(PollResult::complete(vec![out("c", T0)]))]),
    ]));
    let r = start(poller, rules("never"), unlimited(), 64);
    r.watch("outage", T0).await;
    r.watch("done", T0).await;
    let events = r.drain().await;
    let seen_of = |name: &str| {
        events.iter().find_map(|e| match e {
            Event::Terminated { key, seen, .. } if key == name.as_bytes() => Some(seen.clone()),
            _ => None,
        })
    };
    let outage = seen_of("outage").expect("ended");
    assert_eq!(reason_of(&events, "outage"), Some(TerminatedReason::Failed));
    assert_eq!(
        outage,
        SeenSet::from_hashes([hash_key(b"a"), hash_key(b"b")])
    );
    assert_eq!(seen_of("done"), Some(SeenSet::new()));
}

#[tokio::test(start_paused = true)]
async fn retry_after_and_permanent_errors_are_honoured() {
    let poller = Arc::new(Scripted::with(vec![
        (
            "slow-down",
            vec![Err(PollError::transient("http_429", "too many")
                .with_retry_after(Duration::from_secs(30)))],
        ),
        (
            "gone",
            vec![Err(PollError::permanent("http_404", "no such user"))],
        ),
    ]));
    let r = start(
        poller.clone(),
        a_minute_of_retry("polls(1)"),
        unlimited(),
        64,
    );
    r.watch("slow-down", T0).await;
    r.watch("gone", T0).await;
    let events = r.drain().await;
    assert_eq!(poller.poll_times("slow-down"), vec![0, 30_000]);
    assert_eq!(poller.poll_times("gone"), vec![0]);
    assert_eq!(reason_of(&events, "gone"), Some(TerminatedReason::Failed));
}

/// [`rules`] with retries up to a minute apart, and so (by default) a resource's
/// `Retry-After` honoured up to a minute.
fn a_minute_of_retry(termination: &str) -> WatchRules {
    let mut rules = rules(termination);
    rules.schedule.retry.max = Duration::from_secs(60);
    rules
}

/// `Retry-After: 99999999999`: about 3,000 years.
fn millennia() -> Duration {
    Duration::from_secs(99_999_999_999)
}

fn slow_down(after: Duration) -> Step {
    Err(PollError::transient("http_429", "too many").with_retry_after(after))
}

/// The engine's timer for a watch is its termination deadline when that comes before its
/// next poll: `total(15s)` ends it at 15 s, not at a poll a Retry-After put far away.
#[tokio::test(start_paused = true)]
async fn a_retry_after_of_millennia_does_not_outlast_total() {
    let poller = Arc::new(Scripted::with(vec![("w", vec![slow_down(millennia())])]));
    let base = Instant::now();
    let r = start(
        poller.clone(),
        a_minute_of_retry("total(15s)"),
        unlimited(),
        64,
    );
    r.watch("w", T0).await;
    let events = drain_timed(r, base).await;
    let seen = observed(&events, &poller, "w");
    assert_eq!(seen.poll_times, vec![0], "no poll after the deadline");
    assert_eq!(seen.terminated, Some((15_000, TerminatedReason::Total)));
}

/// `stable` and `all`: a deadline ends the watch only when every other child of `all`
/// holds then too; otherwise the watch polls on (at the capped Retry-After, 60 s).
#[tokio::test(start_paused = true)]
async fn deadlines_of_stable_and_all_end_a_watch_when_they_come_due() {
    // stable(25s) from its only output at 0 s: due at 25 s, not at the retry (70 s).
    let seen = uninterrupted(
        a_minute_of_retry("stable(25s)"),
        vec![
            Ok(PollResult::incomplete(vec![out("a", T0)])),
            slow_down(millennia()),
        ],
    )
    .await;
    assert_eq!(seen.poll_times, vec![0, 10_000]);
    assert_eq!(seen.terminated, Some((25_000, TerminatedReason::Stable)));

    // polls(2) holds after the poll at 10 s; total(15s) then ends it at 15 s, before the
    // poll due at 20 s.
    let seen = uninterrupted(a_minute_of_retry("all(total(15s), polls(2))"), vec![]).await;
    assert_eq!(seen.poll_times, vec![0, 10_000]);
    assert_eq!(seen.terminated, Some((15_000, TerminatedReason::All)));

    // polls(3) needs a third successful poll: 15 s alone is not enough, the watch polls at
    // the capped Retry-After (70 s), once more, and ends on that third success.
    let seen = uninterrupted(
        a_minute_of_retry("all(total(15s), polls(3))"),
        vec![Ok(PollResult::default()), slow_down(millennia())],
    )
    .await;
    assert_eq!(seen.poll_times, vec![0, 10_000, 70_000, 80_000]);
    assert_eq!(seen.terminated, Some((80_000, TerminatedReason::All)));
}

/// A server-requested delay is capped (`Retry::after_max`, 60 s here), counted and logged
/// once per capped failure.
#[tokio::test(start_paused = true)]
async fn a_retry_after_of_millennia_is_capped() {
    let far_date = Duration::from_secs(75 * 365 * 24 * 3600); // an HTTP date in 2099
    let poller = Arc::new(Scripted::with(vec![(
        "w",
        vec![
            slow_down(millennia()),
            slow_down(far_date),
            slow_down(Duration::from_secs(30)),
            Ok(PollResult::complete(vec![out("a", T0)])),
        ],
    )]));
    let r = start(poller.clone(), a_minute_of_retry("never"), unlimited(), 64);
    r.watch("w", T0).await;
    let metrics = r.metrics.clone();
    let events = r.drain().await;
    // 60 s (capped), 60 s (capped), 30 s (honoured: below the cap).
    assert_eq!(poller.poll_times("w"), vec![0, 60_000, 120_000, 150_000]);
    assert_eq!(reason_of(&events, "w"), Some(TerminatedReason::Final));
    let text = metrics.render();
    assert!(
        text.contains("watchbridge_retry_after_capped_total 2"),
        "{text}"
    );
}

/// A watch saved with its next poll far away (an uncapped Retry-After of an older version)
/// still ends at its termination deadline once restored.
/// Restore watch `w`, whose input arrived 5 s ago and which failed its one poll, with the
/// next poll an older version saved under an uncapped `Retry-After`: 3,000 years away.
async fn restore_with_a_far_next_poll(r: &Running) {
    let progress = watchbridge::watch::Progress {
        arrived: T0 - 5_000,
        last_new: T0 - 5_000,
        polls: 1,
        hold: T0 - 5_000,
        empty_streak: 0,
        failures: 1,
    };
    r.commands
        .send(Command::Restore(Box::new(RestoreWatch {
            conditions: None,
            key: Bytes::from_static(b"w"),
            input: input("w"),
            progress,
            seen: SeenSet::new(),
            next_poll: T0 + 99_999_999_999_000,
        })))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_restored_watch_with_a_far_next_poll_ends_at_its_deadline() {
    let poller = Arc::new(Scripted::with(vec![]));
    let base = Instant::now();
    // Restored 5 s after its input arrived, under total(15s): due to end 10 s later.
    let r = start(
        poller.clone(),
        a_minute_of_retry("total(15s)"),
        unlimited(),
        64,
    );
    restore_with_a_far_next_poll(&r).await;
    let events = drain_timed(r, base).await;
    let seen = observed(&events, &poller, "w");
    assert_eq!(seen.poll_times, Vec::<u64>::new());
    assert_eq!(seen.terminated, Some((10_000, TerminatedReason::Total)));
}

/// Without a deadline, a far saved poll is brought in to the longest delay the schedule
/// can give (here the retry max, 60 s).
#[tokio::test(start_paused = true)]
async fn a_restored_watch_with_a_far_next_poll_polls_within_its_longest_delay() {
    let poller = Arc::new(Scripted::with(vec![]));
    let r = start(
        poller.clone(),
        a_minute_of_retry("polls(2)"),
        unlimited(),
        64,
    );
    restore_with_a_far_next_poll(&r).await;
    let events = r.drain().await;
    assert_eq!(poller.poll_times("w"), vec![60_000]);
    assert_eq!(reason_of(&events, "w"), Some(TerminatedReason::Polls));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_poller_fails_its_poll_not_the_engine() {
    let panic = || Err(PollError::transient("panic", "scripted"));
    let poller = Arc::new(Scripted::with(vec![
        ("boom", vec![panic(), panic(), panic(), panic()]),
        ("fine", vec![Ok(PollResult::complete(vec![out("x", T0)]))]),
    ]));
    let r = start(poller.clone(), rules("never"), unlimited(), 64);
    r.watch("boom", T0).await;
    r.watch("fine", T0).await;
    let events = r.drain().await;
    assert_eq!(reason_of(&events, "boom"), Some(TerminatedReason::Failed));
    assert_eq!(reason_of(&events, "fine"), Some(TerminatedReason::Final));
    assert_eq!(outputs_of(&events, "fine").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_hangs_times_out_and_is_retried() {
    let poller = Arc::new(Scripted {
        latency: Duration::from_secs(60),
        ..Scripted::with(vec![])
    });
    let r = start(poller.clone(), rules("never"), unlimited(), 64);
    r.watch("hang", T0).await;
    let metrics = r.metrics.clone();
    let events = r.drain().await;
    assert_eq!(reason_of(&events, "hang"), Some(TerminatedReason::Failed));
    // 30 s timeout each; retries 1 s, 2 s, 4 s after each timeout.
    assert_eq!(poller.poll_times("hang"), vec![0, 31_000, 63_000, 97_000]);
    assert_eq!(
        metrics
            .polls_error
            .with_label_values(&["error", "timeout"])
            .get(),
        4
    );
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_input_does_not_start_a_second_watch() {
    let poller = Arc::new(Scripted::with(vec![]));
    let r = start(poller.clone(), rules("polls(2)"), unlimited(), 64);
    r.watch("u1", T0).await;
    r.watch("u1", T0).await;
    let events = r.drain().await;
    let started = events
        .iter()
        .filter(|e| matches!(e, Event::Started { .. }))
        .count();
    let again = events
        .iter()
        .filter(|e| matches!(e, Event::AlreadyWatching { .. }))
        .count();
    assert_eq!((started, again), (1, 1));
    assert_eq!(poller.poll_times("u1"), vec![0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn global_in_flight_limit_caps_concurrent_polls() {
    let poller = Arc::new(Scripted {
        latency: Duration::from_secs(1),
        ..Scripted::with(vec![])
    });
    let r = start(poller.clone(), rules("polls(1)"), Limits::new(2, None), 64);
    for i in 0..6 {
        r.watch(&format!("w{i}"), T0).await;
    }
    r.drain().await;
    assert_eq!(poller.max_running.load(Ordering::SeqCst), 2);
    let mut starts: Vec<u64> = (0..6)
        .flat_map(|i| poller.poll_times(&format!("w{i}")))
        .collect();
    starts.sort();
    assert_eq!(starts, vec![0, 0, 1_000, 1_000, 2_000, 2_000]);
}

#[tokio::test(start_paused = true)]
async fn per_host_rate_limit_spaces_polls_of_one_host_only() {
    let poller = Arc::new(Scripted::with(vec![]));
    let rate = HostRate {
        per_second: NonZeroU32::new(2).unwrap(),
        burst: NonZeroU32::new(1).unwrap(),
    };
    let r = start(
        poller.clone(),
        rules("polls(1)"),
        Limits::new(100, Some(rate)),
        64,
    );
    for i in 0..4 {
        r.watch_host(&format!("a{i}"), T0, Some("a.example")).await;
    }
    r.watch_host("b0", T0, Some("b.example")).await;
    let metrics = r.metrics.clone();
    r.drain().await;
    let mut a: Vec<u64> = (0..4)
        .flat_map(|i| poller.poll_times(&format!("a{i}")))
        .collect();
    a.sort();
    for pair in a.windows(2) {
        assert!(pair[1] - pair[0] >= 500, "host a polled too often: {a:?}");
    }
    assert!(a[3] <= 1_600, "rate-limited polls wait far too long: {a:?}");
    assert_eq!(
        poller.poll_times("b0"),
        vec![0],
        "another host is not held back"
    );
    assert!(metrics.polls_deferred.get() >= 3);
}

/// Many watches wanting far more than a host's rate take turns: none is starved because
/// another always comes first (ties among watches due at once used to go to the lowest
/// slot, so the same few watches took every token).
#[tokio::test(start_paused = true)]
async fn under_a_host_rate_every_watch_gets_its_turn() {
    let poller = Arc::new(Scripted::with(vec![]));
    let rate = HostRate {
        per_second: NonZeroU32::new(4).unwrap(),
        burst: NonZeroU32::new(1).unwrap(),
    };
    let mut rules = rules("never");
    rules.schedule.interval = Duration::from_millis(100);
    let r = start(poller.clone(), rules, Limits::new(100, Some(rate)), 64);
    for i in 0..20 {
        r.watch_host(&format!("w{i}"), T0, Some("a.example")).await;
    }
    // 4 polls a second for 30 s: 120 turns for 20 watches.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let counts: Vec<usize> = (0..20)
        .map(|i| poller.poll_times(&format!("w{i}")).len())
        .collect();
    assert!(counts.iter().sum::<usize>() >= 115, "{counts:?}");
    assert!(
        counts.iter().all(|&n| n >= 2),
        "some watches starved: {counts:?}"
    );
}

/// A host that says to wait — a failure's `Retry-After`, or rate-limit headers saying no
/// request is left on a success — holds every watch polling it, not only the one told;
/// another host goes on.
#[tokio::test(start_paused = true)]
async fn a_host_that_says_wait_holds_every_watch_polling_it() {
    let told =
        PollError::transient("http_429", "slow down").with_retry_after(Duration::from_secs(3));
    let none_left = PollResult {
        host_wait: Some(Duration::from_secs(2)),
        ..PollResult::default()
    };
    let poller = Arc::new(Scripted::with(vec![
        ("a0", vec![Err(told)]),
        ("c0", vec![Ok(none_left)]),
    ]));
    let r = start(
        poller.clone(),
        rules("polls(1)"),
        Limits::new(100, None),
        64,
    );
    r.watch_host("a0", T0, Some("a.example")).await;
    r.watch_host("c0", T0, Some("c.example")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (name, host) in [
        ("a1", "a.example"),
        ("b0", "b.example"),
        ("c1", "c.example"),
    ] {
        r.watch_host(name, T0, Some(host)).await;
    }
    r.drain().await;
    assert_eq!(poller.poll_times("a0")[0], 0);
    let a1 = poller.poll_times("a1");
    assert!(
        (3_000..3_100).contains(&a1[0]),
        "a.example said 3 s: {a1:?}"
    );
    let c1 = poller.poll_times("c1");
    assert!(
        (2_000..2_100).contains(&c1[0]),
        "c.example said 2 s: {c1:?}"
    );
    assert_eq!(
        poller.poll_times("b0"),
        vec![1_000],
        "b.example said nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn backoff_stretches_quiet_polls_and_a_new_output_resets_it() {
    let poller = Arc::new(Scripted::with(vec![(
        "q",
        vec![
            Ok(PollResult::default()),
            Ok(PollResult::default()),
            Ok(PollResult::default()),
            Ok(PollResult::incomplete(vec![out("new", T0)])),
            Ok(PollResult::default()),
        ],
    )]));
    let mut rules = rules("polls(6)");
    rules.schedule.backoff = Some(Backoff {
        factor: 2.0,
        max: Duration::from_secs(30),
    });
    let r = start(poller.clone(), rules, unlimited(), 64);
    r.watch("q", T0).await;
    r.drain().await;
    // Delays: 20 (1 empty), 30 (2, capped), 30 (3, capped), 10 (new output), 20.
    assert_eq!(
        poller.poll_times("q"),
        vec![0, 20_000, 50_000, 80_000, 90_000, 110_000]
    );
}

#[tokio::test(start_paused = true)]
async fn holds_follow_the_rules_and_finished_watches_release_them() {
    let poller = Arc::new(Scripted::with(vec![
        (
            "wm",
            vec![
                Ok(PollResult::incomplete(vec![out("a", T0 + 500)]).with_watermark(T0 + 300)),
                // A lower watermark never moves the hold back.
                Ok(PollResult::incomplete(vec![]).with_watermark(T0 + 100)),
                Ok(PollResult::incomplete(vec![])),
            ],
        ),
        (
            "ev",
            vec![
                Ok(PollResult::incomplete(vec![
                    out("x", T0 + 900),
                    out("y", T0 + 700),
                ])),
                Ok(PollResult::complete(vec![])),
            ],
        ),
    ]));
    let r = start(poller.clone(), rules("polls(3)"), unlimited(), 64);
    r.watch("wm", T0 - 1_000).await;
    r.watch("ev", T0 - 2_000).await;
    let events = r.drain().await;
    let holds: Vec<(String, Millis)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Outputs { key, hold, .. } => {
                Some((String::from_utf8(key.to_vec()).unwrap(), *hold))
            }
            _ => None,
        })
        .collect();
    // wm: the poller's watermark wins over the output's event time; ev: earliest new output.
    assert!(holds.contains(&("wm".into(), T0 + 300)), "{holds:?}");
    assert!(holds.contains(&("ev".into(), T0 + 700)), "{holds:?}");
    // Both watches finished, so nothing holds the partition back any more.
    assert_eq!(holds_reported(&events).last(), Some(&None));
}

#[tokio::test(start_paused = true)]
async fn a_slow_event_reader_applies_backpressure_and_nothing_is_lost() {
    let poller = Arc::new(Scripted::with(vec![("u", growing(50))]));
    let mut rules = rules("polls(50)");
    rules.schedule.interval = Duration::from_millis(1);
    let mut r = start(poller.clone(), rules, unlimited(), 1);
    r.watch("u", T0).await;
    // Read nothing for a long (virtual) while: the engine must wait, not drop.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let polled_while_blocked = poller.poll_times("u").len();
    assert!(
        polled_while_blocked < 5,
        "engine kept polling with nobody reading: {polled_while_blocked}"
    );
    let first = r.events.recv().await.unwrap();
    assert!(matches!(first, Event::Hold { .. }));
    let events = r.drain().await;
    assert_eq!(outputs_of(&events, "u").len(), 50);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_watch_without_reporting_them_terminated() {
    let poller = Arc::new(Scripted::with(vec![]));
    let mut r = start(poller.clone(), rules("never"), unlimited(), 64);
    r.watch("a", T0).await;
    r.watch("b", T0).await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    r.commands.send(Command::Shutdown).await.unwrap();
    assert_eq!(r.task.await.unwrap(), Ended::Shutdown);
    while let Ok(e) = r.events.try_recv() {
        assert!(!matches!(e, Event::Terminated { .. }), "{e:?}");
    }
    assert_eq!(r.metrics.watches_active.get(), 0);
    assert_eq!(poller.poll_times("a"), vec![0, 10_000, 20_000]);
}

// --- Durable state: checkpoints and restore ---

/// A feed that grows by one output per poll for `grow` polls and then stays as it is; every
/// poll returns the whole feed, so every output comes back on every later poll.
fn cumulative(grow: i64, polls: i64) -> Vec<Step> {
    (0..polls)
        .map(|p| {
            let outputs = (0..=p.min(grow - 1))
                .map(|i| out(&format!("o{i}"), T0 + i))
                .collect();
            Ok(PollResult::incomplete(outputs))
        })
        .collect()
}

fn input(name: &str) -> Arc<In> {
    Arc::new(In {
        name: name.to_string(),
        host: None,
    })
}

/// Events with the virtual time (ms since `base`) they were received at.
type Timed = Vec<(u64, Event)>;

async fn drain_timed(mut r: Running, base: Instant) -> Timed {
    drop(r.commands);
    let mut all = Vec::new();
    while let Some(e) = r.events.recv().await {
        all.push((base.elapsed().as_millis() as u64, e));
    }
    assert_eq!(r.task.await.unwrap(), Ended::Drained);
    all
}

/// What an observer of the output topic and the watch's lifecycle sees.
#[derive(Debug, PartialEq)]
struct Observed {
    outputs: Vec<(String, Millis)>,
    poll_times: Vec<u64>,
    /// When and why the watch ended.
    terminated: Option<(u64, TerminatedReason)>,
}

fn observed(events: &Timed, poller: &Scripted, name: &str) -> Observed {
    let plain: Vec<Event> = events.iter().map(|(_, e)| e.clone()).collect();
    let terminated = events.iter().find_map(|(t, e)| match e {
        Event::Terminated { key, reason, .. } if key == name.as_bytes() => {
            Some((*t, reason.clone()))
        }
        _ => None,
    });
    Observed {
        outputs: outputs_of(&plain, name),
        poll_times: poller.poll_times(name),
        terminated,
    }
}

/// The whole run in one engine.
async fn uninterrupted(rules: WatchRules, script: Vec<Step>) -> Observed {
    let poller = Arc::new(Scripted::with(vec![("w", script)]));
    let base = Instant::now();
    let r = start_at(poller.clone(), rules, unlimited(), 64, true, T0);
    r.watch("w", T0 - 1_000).await;
    observed(&drain_timed(r, base).await, &poller, "w")
}

/// The same run, but the first engine stops right after the checkpoint of its `cut`-th poll
/// (as a crash would, with nothing after the checkpoint written), and after `pause` a fresh
/// engine restores the watch from what the checkpoints said. Also returns the last
/// checkpoint and the minimum hold right after the restore.
async fn interrupted(
    rules: WatchRules,
    script: Vec<Step>,
    cut: u64,
    pause: Duration,
) -> (Observed, Checkpoint, Option<Millis>) {
    let poller = Arc::new(Scripted::with(vec![("w", script)]));
    let base = Instant::now();
    let mut a = start_at(poller.clone(), rules.clone(), unlimited(), 64, true, T0);
    a.watch("w", T0 - 1_000).await;
    let mut events: Timed = Vec::new();
    let mut hashes: Vec<OutputHash> = Vec::new();
    let last = loop {
        let e = a.events.recv().await.expect("the watch reaches the cut");
        events.push((base.elapsed().as_millis() as u64, e.clone()));
        if let Event::Checkpoint(c) = e {
            hashes.extend(&c.new_hashes);
            if c.progress.polls == cut {
                break *c;
            }
        }
    };
    a.commands.send(Command::Shutdown).await.unwrap();
    assert_eq!(a.task.await.unwrap(), Ended::Shutdown);
    while let Ok(e) = a.events.try_recv() {
        events.push((base.elapsed().as_millis() as u64, e));
    }
    // Down for a while.
    tokio::time::sleep(pause).await;

    let now = T0 + base.elapsed().as_millis() as Millis;
    let mut b = start_at(poller.clone(), rules, unlimited(), 64, true, now);
    b.commands
        .send(Command::Restore(Box::new(RestoreWatch {
            conditions: None,
            key: Bytes::from_static(b"w"),
            input: input("w"),
            progress: last.progress,
            seen: SeenSet::from_hashes(hashes),
            next_poll: last.next_poll,
        })))
        .await
        .unwrap();
    // The restored watch's hold comes first, then the answer.
    let hold_after_restore = match b.events.recv().await {
        Some(Event::Hold { min }) => min,
        other => panic!("the restored watch's hold before its Restored: {other:?}"),
    };
    assert_eq!(
        b.events.recv().await,
        Some(Event::Restored {
            key: Bytes::from_static(b"w")
        })
    );
    events.extend(drain_timed(b, base).await);
    (observed(&events, &poller, "w"), last, hold_after_restore)
}

fn with_backoff(mut rules: WatchRules) -> WatchRules {
    rules.schedule.backoff = Some(Backoff {
        factor: 2.0,
        max: Duration::from_secs(40),
    });
    rules
}

#[tokio::test(start_paused = true)]
async fn a_restored_watch_ends_on_its_polls_limit_as_if_never_interrupted() {
    let script = || cumulative(20, 20);
    let whole = uninterrupted(rules("polls(6)"), script()).await;
    assert_eq!(
        whole.poll_times,
        vec![0, 10_000, 20_000, 30_000, 40_000, 50_000]
    );
    assert_eq!(whole.terminated, Some((50_000, TerminatedReason::Polls)));
    assert_eq!(whole.outputs.len(), 6);
    let (cut, last, hold) =
        interrupted(rules("polls(6)"), script(), 3, Duration::from_secs(4)).await;
    assert_eq!(cut, whole);
    assert_eq!(last.next_poll, T0 + 30_000);
    assert_eq!(
        last.progress.hold,
        T0 + 2,
        "the earliest output new in poll 3"
    );
    assert_eq!(
        hold,
        Some(T0 + 2),
        "the restored watch holds the watermark again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restored_watch_ends_on_its_total_time_as_if_never_interrupted() {
    let script = || cumulative(20, 20);
    let whole = uninterrupted(rules("total(45s)"), script()).await;
    assert_eq!(
        whole.poll_times,
        vec![0, 10_000, 20_000, 30_000, 40_000],
        "total(45s) ends the watch at 45 s, before its poll due at 50 s"
    );
    assert_eq!(whole.terminated, Some((45_000, TerminatedReason::Total)));
    let (cut, ..) = interrupted(rules("total(45s)"), script(), 2, Duration::from_secs(9)).await;
    assert_eq!(cut, whole);
}

#[tokio::test(start_paused = true)]
async fn a_restored_watch_ends_when_stable_with_its_backoff_as_if_never_interrupted() {
    // New outputs in the first three polls (the last at 20 s), then the same feed: backoff
    // stretches the quiet polls, and stable(75s) counts from 20 s.
    let rules = || with_backoff(rules("stable(75s)"));
    let script = || cumulative(3, 20);
    let whole = uninterrupted(rules(), script()).await;
    assert_eq!(
        whole.poll_times,
        vec![0, 10_000, 20_000, 30_000, 50_000, 90_000],
        "quiet polls 20 s then 40 s apart"
    );
    // At 90 s only 70 s were quiet; it ends when 75 s are, at 95 s, before the poll due
    // at 130 s.
    assert_eq!(whole.terminated, Some((95_000, TerminatedReason::Stable)));
    assert_eq!(whole.outputs.len(), 3);
    // Cut after the first quiet poll (at 30 s): the restore needs the empty streak for the
    // next delay, the last new output's time for stable, and the seen set for the repeats.
    let (cut, last, _) = interrupted(rules(), script(), 4, Duration::from_secs(15)).await;
    assert_eq!(last.progress.empty_streak, 1);
    assert_eq!(last.progress.last_new, T0 + 20_000);
    assert_eq!(cut, whole);
}

#[tokio::test(start_paused = true)]
async fn a_restore_after_the_saved_poll_time_polls_at_once() {
    let script = cumulative(20, 20);
    let (cut, last, _) = interrupted(rules("polls(5)"), script, 2, Duration::from_secs(25)).await;
    assert_eq!(last.next_poll, T0 + 20_000);
    // Stopped at 10 s, restored at 35 s: the poll due at 20 s runs at 35 s, then 10 s apart.
    assert_eq!(cut.poll_times, vec![0, 10_000, 35_000, 45_000, 55_000]);
    assert_eq!(cut.terminated, Some((55_000, TerminatedReason::Polls)));
    let keys: Vec<String> = cut.outputs.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys, vec!["o0", "o1", "o2", "o3", "o4"], "each output once");
}

#[tokio::test(start_paused = true)]
async fn checkpoints_follow_every_poll_a_watch_survives_and_only_when_asked_for() {
    let err = || Err(PollError::transient("http_5xx", "503"));
    let script = || {
        vec![
            Ok(PollResult::incomplete(vec![
                out("b", T0 + 2),
                out("a", T0 + 1),
            ])),
            err(),
            Ok(PollResult::incomplete(vec![
                out("a", T0 + 1),
                out("c", T0 + 3),
            ])),
            Ok(PollResult::incomplete(vec![out("d", T0 + 4)])),
        ]
    };
    let checkpoints = |events: &[Event]| -> Vec<Checkpoint> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Checkpoint(c) => Some((**c).clone()),
                _ => None,
            })
            .collect()
    };

    let poller = Arc::new(Scripted::with(vec![("w", script())]));
    let r = start(poller.clone(), rules("polls(3)"), unlimited(), 64);
    r.watch("w", T0).await;
    assert!(checkpoints(&r.drain().await).is_empty(), "off by default");

    let poller = Arc::new(Scripted::with(vec![("w", script())]));
    let r = start_at(poller.clone(), rules("polls(3)"), unlimited(), 64, true, T0);
    r.watch("w", T0).await;
    let events = r.drain().await;
    let got = checkpoints(&events);
    let h = |k: &str| hash_key(k.as_bytes());
    let summary: Vec<(u64, u32, Millis, Vec<OutputHash>)> = got
        .iter()
        .map(|c| {
            (
                c.progress.polls,
                c.progress.failures,
                c.next_poll,
                c.new_hashes.clone(),
            )
        })
        .collect();
    // The third successful poll ends the watch (polls(3)): Terminated, no checkpoint.
    assert_eq!(
        summary,
        vec![
            (1, 0, T0 + 10_000, vec![h("a"), h("b")]),
            (1, 1, T0 + 11_000, vec![]),
            (2, 0, T0 + 21_000, vec![h("c")]),
        ]
    );
    // Each checkpoint comes after the outputs it lists.
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            Event::Started { .. } => "started",
            Event::Outputs { .. } => "outputs",
            Event::Checkpoint(_) => "checkpoint",
            Event::Terminated { .. } => "terminated",
            Event::Hold { .. } => "hold",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "hold",
            "started",
            "outputs",
            "checkpoint",
            "hold",
            "checkpoint",
            "outputs",
            "checkpoint",
            "hold",
            "outputs",
            "terminated",
            "hold"
        ],
        "a new watch's hold comes before its answer; a hold moved by a poll after that poll's \
         outputs (a failed poll moves none)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restore_for_a_live_key_is_refused_and_changes_nothing() {
    let poller = Arc::new(Scripted::with(vec![]));
    let mut r = start(poller.clone(), rules("polls(3)"), unlimited(), 64);
    r.watch("u1", T0 - 1_000).await;
    assert_eq!(
        r.events.recv().await,
        Some(Event::Hold {
            min: Some(T0 - 1_000)
        })
    );
    assert!(matches!(r.events.recv().await, Some(Event::Started { .. })));
    let progress = watchbridge::watch::Progress {
        arrived: T0 - 50_000,
        last_new: T0 - 50_000,
        polls: 2,
        hold: T0 - 9_000,
        empty_streak: 0,
        failures: 0,
    };
    r.commands
        .send(Command::Restore(Box::new(RestoreWatch {
            conditions: None,
            key: Bytes::from_static(b"u1"),
            input: input("u1"),
            progress,
            seen: SeenSet::new(),
            next_poll: T0 + 1_000,
        })))
        .await
        .unwrap();
    assert_eq!(
        r.events.recv().await,
        Some(Event::RestoreRefused {
            key: Bytes::from_static(b"u1")
        })
    );
    let metrics = r.metrics.clone();
    let events = r.drain().await;
    // The refused restore did not report a hold of its own: the live watch's only, until
    // it ended.
    assert!(
        holds_reported(&events)
            .iter()
            .all(|h| h.is_none() || *h >= Some(T0 - 1_000)),
        "{events:?}"
    );
    // Three polls of the live watch, on its own schedule (the restore would have made it
    // one more poll, due at 1 s).
    assert_eq!(poller.poll_times("u1"), vec![0, 10_000, 20_000]);
    assert_eq!(reason_of(&events, "u1"), Some(TerminatedReason::Polls));
    assert_eq!(metrics.watches_active.get(), 0);
}

// --- A watch's end and a re-delivered input for it ---

fn remembering(rules: WatchRules) -> EngineConfig {
    EngineConfig {
        rules,
        poll_timeout: Duration::from_secs(30),
        seed: Some(42),
        checkpoints: true,
        remember_ended: true,
    }
}

#[tokio::test(start_paused = true)]
async fn an_input_for_a_key_whose_end_the_runtime_has_not_taken_in_starts_nothing() {
    // Issue 15, path 2: the watch ends (its Terminated is on its way to the runtime, which
    // has not handled it yet), and the runtime, not knowing, sends a Watch (or a Restore)
    // for its key: the engine must not start it afresh with an empty seen set.
    let poller = Arc::new(Scripted::with(vec![(
        "u1",
        vec![
            Ok(PollResult::complete(vec![out("a", T0), out("b", T0 + 1)])),
            Ok(PollResult::complete(vec![out("a", T0), out("c", T0 + 2)])),
        ],
    )]));
    let mut r = start_with(
        poller.clone(),
        remembering(rules("never")),
        unlimited(),
        64,
        T0,
    );
    let u1 = Bytes::from_static(b"u1");
    r.watch("u1", T0).await;
    // Up to its end, and the release of its hold that follows.
    let mut first = Vec::new();
    while !matches!(first.last(), Some(Event::Hold { min: None })) {
        first.push(r.events.recv().await.unwrap());
    }
    assert_eq!(outputs_of(&first, "u1").len(), 2);
    r.watch("u1", T0).await;
    assert_eq!(
        r.events.recv().await,
        Some(Event::AlreadyEnded { key: u1.clone() }),
        "not a fresh watch with an empty seen set"
    );
    r.commands
        .send(Command::Restore(Box::new(RestoreWatch {
            conditions: None,
            key: u1.clone(),
            input: input("u1"),
            progress: watchbridge::watch::Progress::at_start(T0, T0),
            seen: SeenSet::new(),
            next_poll: T0,
        })))
        .await
        .unwrap();
    assert_eq!(
        r.events.recv().await,
        Some(Event::AlreadyEnded { key: u1.clone() })
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(poller.poll_times("u1"), vec![0], "nothing polled it again");
    assert_eq!(r.metrics.watches_active.get(), 0);
    // Once the runtime has taken the end in (its own record decides from then on), the key
    // is the engine's to start again, as any other.
    r.commands
        .send(Command::Forget { key: u1.clone() })
        .await
        .unwrap();
    r.watch("u1", T0).await;
    let events = r.drain().await;
    assert_eq!(events[1], Event::Started { key: u1 });
    assert_eq!(
        outputs_of(&events, "u1"),
        vec![("a".into(), T0), ("c".into(), T0 + 2)]
    );
}

#[tokio::test(start_paused = true)]
async fn without_remember_ended_an_ended_key_starts_again_and_nothing_is_kept() {
    let poller = Arc::new(Scripted::with(vec![(
        "u1",
        vec![Ok(PollResult::complete(vec![out("a", T0)]))],
    )]));
    // polls(1): the second run's poll (the script is spent) ends it too.
    let mut r = start(poller.clone(), rules("polls(1)"), unlimited(), 64);
    r.watch("u1", T0).await;
    // Up to its end, and the release of its hold that follows.
    let mut first = Vec::new();
    while !matches!(first.last(), Some(Event::Hold { min: None })) {
        first.push(r.events.recv().await.unwrap());
    }
    r.watch("u1", T0).await;
    assert!(matches!(r.events.recv().await, Some(Event::Hold { .. })));
    assert!(matches!(r.events.recv().await, Some(Event::Started { .. })));
    r.drain().await;
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_moves_the_hold_reports_it_after_its_outputs() {
    // Issue 16, case 2: the outputs of a poll are below the hold it moves to (the
    // resource's watermark passed them). A runtime that applies holds in event order must
    // still hold the watermark at the old hold when it takes the outputs in, or a tick in
    // between would publish past them and flag them late.
    let poller = Arc::new(Scripted::with(vec![(
        "u1",
        vec![Ok(PollResult::incomplete(vec![
            out("a", T0 + 100),
            out("b", T0 + 200),
        ])
        .with_watermark(T0 + 300))],
    )]));
    let r = start(poller.clone(), rules("polls(2)"), unlimited(), 64);
    r.watch("u1", T0 - 1_000).await;
    let events = r.drain().await;
    let mut applied = None;
    let mut checked = 0;
    for e in &events {
        match e {
            Event::Hold { min } => applied = *min,
            Event::Outputs { outputs, .. } => {
                for o in outputs {
                    assert!(
                        applied.is_none_or(|h| o.event_time >= h),
                        "output at {} taken in under a hold of {applied:?}: {events:?}",
                        o.event_time - T0
                    );
                    checked += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!(checked, 2);
    assert_eq!(
        holds_reported(&events),
        vec![Some(T0 - 1_000), Some(T0 + 300), None]
    );
}

/// `WATCHBRIDGE_MAX_IN_FLIGHT` bounds the memory of polls (docs/pollers/http.md, Memory):
/// a poll counts until its new outputs are handed on, since they hold its response
/// (an output's key and value are views of the body). While the runtime holds the outputs
/// of two polls (say, waiting for room in the producer's queue), no third poll starts;
/// once it lets them go, the others run.
#[tokio::test(start_paused = true)]
async fn a_poll_counts_against_the_in_flight_limit_until_its_outputs_are_handed_on() {
    let names = ["w0", "w1", "w2", "w3", "w4"];
    let poller = Arc::new(Scripted::with(
        names
            .iter()
            .map(|&n| {
                (
                    n,
                    vec![Ok(PollResult::complete(vec![out(&format!("{n}-x"), T0)]))],
                )
            })
            .collect(),
    ));
    let mut r = start(poller.clone(), rules("polls(1)"), Limits::new(2, None), 64);
    for name in names {
        r.watch(name, T0).await;
    }
    // Take events for a while, keeping every output event (not handed on yet).
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while let Ok(Some(event)) = tokio::time::timeout_at(until, r.events.recv()).await {
        if matches!(event, Event::Outputs { .. }) {
            held.push(event);
        }
    }
    assert_eq!(held.len(), 2, "outputs of two polls, the limit");
    let polled = || poller.polls.lock().unwrap().len();
    assert_eq!(
        polled(),
        2,
        "no poll starts while two polls' outputs are held"
    );
    // Handed on: the other three watches poll (each output event let go as it comes).
    held.clear();
    drop(r.commands);
    let mut outputs = 0;
    while let Some(event) = r.events.recv().await {
        outputs += usize::from(matches!(event, Event::Outputs { .. }));
    }
    assert_eq!(r.task.await.unwrap(), Ended::Drained);
    assert_eq!(outputs, 3);
    assert_eq!(polled(), 5);
}

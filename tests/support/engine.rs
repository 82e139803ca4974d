//! One watch run in a real [`Engine`] until it ends: how the pollers' tests drive a poller
//! through the engine (its schedule, retries, termination and poll timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use watchbridge::clock::Clock;
use watchbridge::engine::{Command, Engine, EngineConfig, Event};
use watchbridge::limits::Limits;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, Poller};
use watchbridge::reason::TerminatedReason;
use watchbridge::watch::WatchRules;

/// What the watch did: its outputs in order, why it ended, and how long that took from
/// the start of the watch.
pub struct WatchRun {
    pub outputs: Vec<Output>,
    pub reason: TerminatedReason,
    pub took: Duration,
}

/// Start an engine for `poller` under `rules` and `poll_timeout` (the real clock), watch
/// `input` under `key` (input time 0), and collect events until the watch ends; panics if
/// it has not ended 10 s after an event, naming `what`.
pub async fn run_one_watch<P: Poller>(
    poller: Arc<P>,
    input: Arc<P::Input>,
    key: &str,
    rules: WatchRules,
    poll_timeout: Duration,
    what: &str,
) -> WatchRun {
    let engine = Engine::new(
        poller,
        EngineConfig {
            rules,
            poll_timeout,
            seed: Some(1),
            checkpoints: false,
            remember_ended: false,
        },
        Limits::new(16, None),
        Clock::system(),
        Arc::new(Metrics::new()),
    );
    let (commands, rx) = mpsc::channel(8);
    let (tx, mut events) = mpsc::channel(64);
    let task = tokio::spawn(engine.run(rx, tx));
    let started = Instant::now();
    commands
        .send(Command::Watch {
            key: key.to_string().into(),
            input,
            input_time: 0,
        })
        .await
        .unwrap();
    let mut outputs = Vec::new();
    let reason = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: the watch had not ended after 10 s"))
            .expect("the engine ended");
        match event {
            Event::Outputs { outputs: o, .. } => outputs.extend(o),
            Event::Terminated { reason, .. } => break reason,
            _ => {}
        }
    };
    let took = started.elapsed();
    drop(commands);
    task.await.expect("the engine panicked");
    WatchRun {
        outputs,
        reason,
        took,
    }
}

//! `watchbridge demo`: the engine at work on simulated feeds, no Kafka needed.
//!
//! Each input is a "user" whose feed grows on its own clock: item `j` appears at a fixed,
//! per-user pace, and every poll returns everything that exists so far (so most of each poll
//! is old, and dedup has work to do). Some feeds close (the poll says final), some go quiet
//! (so `stable` ends them), one keeps failing (so retries and the `failed` limit show). The
//! Kafka runtime replaces the printer with a producer; the engine is the same.

use crate::clock::{Clock, Millis};
use crate::engine::{Command, Engine, EngineConfig, Event};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::poll::{Output, PollError, PollResult, Poller};
use crate::watch::WatchRules;
use bytes::Bytes;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One simulated user's feed.
#[derive(Debug)]
pub struct Feed {
    pub user: String,
    /// When the feed started (processing time), and how far apart its items appear.
    pub start: Millis,
    pub pace: Duration,
    /// Items the feed will ever have.
    pub items: u32,
    /// The feed says it is final once all items exist.
    pub closes: bool,
    /// Every poll fails (an upstream that is down).
    pub broken: bool,
}

/// Serves [`Feed`]s as they stand at the moment of each poll.
pub struct FeedPoller {
    pub clock: Clock,
}

impl Poller for FeedPoller {
    type Input = Feed;

    fn poll(
        &self,
        feed: Arc<Feed>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let now = self.clock.now_ms();
        async move {
            if feed.broken {
                return Err(PollError::transient(
                    "unavailable",
                    "simulated 503 from the feed",
                ));
            }
            let pace = feed.pace.as_millis().max(1) as Millis;
            let existing = (((now - feed.start) / pace + 1).max(0) as u32).min(feed.items);
            let outputs = (0..existing)
                .map(|j| {
                    let at = feed.start + j as Millis * pace;
                    Output::new(
                        format!("{}/item-{j}", feed.user),
                        format!("{{\"user\":\"{}\",\"item\":{j}}}", feed.user),
                        at,
                    )
                })
                .collect();
            let complete = feed.closes && existing == feed.items;
            Ok(PollResult {
                outputs,
                watermark: None,
                complete,
            })
        }
    }
}

/// Run the demo: start `inputs` watches, print every event, and return the metrics text.
pub async fn run(
    inputs: u32,
    rules: WatchRules,
    out: &mut (dyn Write + Send),
) -> std::io::Result<String> {
    let clock = Clock::system();
    let metrics = Arc::new(Metrics::new());
    let interval = rules.schedule.interval;
    let engine = Engine::new(
        Arc::new(FeedPoller { clock }),
        EngineConfig {
            rules: rules.clone(),
            poll_timeout: Duration::from_secs(5),
            seed: None,
        },
        Limits::new(64, None),
        clock,
        metrics.clone(),
    );
    let (commands, rx) = mpsc::channel(1024);
    let (tx, mut events) = mpsc::channel(1024);
    let task = tokio::spawn(engine.run(rx, tx));

    writeln!(
        out,
        "watching {inputs} simulated feeds, polling {}, terminating on `{}`",
        rules.schedule, rules.termination
    )?;
    let start = clock.now_ms();
    let mut ended: std::collections::BTreeMap<String, u32> = Default::default();
    for i in 0..inputs {
        let feed = Feed {
            user: format!("user-{i}"),
            start,
            // Feeds grow at different speeds relative to the poll interval.
            pace: interval.mul_f64(0.5 + (i % 4) as f64 * 0.5),
            items: 3 + i % 5,
            closes: i % 3 == 0,
            broken: i % 7 == 6,
        };
        let key = Bytes::from(feed.user.clone());
        let input = Arc::new(feed);
        if commands
            .send(Command::Watch {
                key,
                input,
                input_time: start,
            })
            .await
            .is_err()
        {
            break;
        }
    }
    drop(commands);
    while let Some(event) = events.recv().await {
        let at = |t: Millis| format!("+{:.1}s", (t - start) as f64 / 1000.0);
        match event {
            Event::Started { key } => writeln!(out, "  start  {}", String::from_utf8_lossy(&key))?,
            Event::AlreadyWatching { key } => writeln!(
                out,
                "  again  {} (already watching)",
                String::from_utf8_lossy(&key)
            )?,
            Event::Outputs { key, outputs, hold } => {
                for o in outputs {
                    writeln!(
                        out,
                        "  new    {} -> {} (event time {}, seen at {}, hold {})",
                        String::from_utf8_lossy(&key),
                        String::from_utf8_lossy(&o.key),
                        at(o.event_time),
                        at(clock.now_ms()),
                        at(hold)
                    )?;
                }
            }
            Event::Terminated { key, reason } => {
                *ended.entry(reason.to_string()).or_default() += 1;
                writeln!(
                    out,
                    "  end    {} ({reason}) at {}",
                    String::from_utf8_lossy(&key),
                    at(clock.now_ms())
                )?
            }
        }
    }
    let _ = task.await;
    let reasons: Vec<String> = ended.iter().map(|(r, n)| format!("{n} {r}")).collect();
    writeln!(
        out,
        "done: {} new outputs emitted, {} repeats suppressed; watches ended: {}",
        metrics.outputs_emitted.get(),
        metrics.duplicates_suppressed.get(),
        reasons.join(", ")
    )?;
    Ok(metrics.render())
}

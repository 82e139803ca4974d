//! `watchbridge run`: the bridge put together. Topics checked (and created), the producers
//! (each partition task's own, made by the task; one shared for what no partition owns: the
//! merged watermark, a bounded run's end of time), the consumer thread, and an orderly stop.
//!
//! Starting: the operations server first (`/healthz` answers, `/readyz` says what the start
//! waits for), then the brokers are waited for, with backoff, up to
//! `WATCHBRIDGE_START_TIMEOUT` ([`wait_for_brokers`](crate::kafka::client::wait_for_brokers)),
//! then the topics.
//!
//! Stopping (SIGTERM, Ctrl-C, or [`StopSignal::stop`]): the consumer thread stops reading,
//! every partition task stops its watches (polls in flight are cancelled), delivers what
//! they already emitted, and publishes its commit position; the positions are committed,
//! the producer flushed, and `run` returns. All of it shares one deadline,
//! `WATCHBRIDGE_SHUTDOWN_TIMEOUT` from the signal (the commit and the goodbye to the group
//! get at least 1.5 s more between them): what is not done by then is given up, and `run`
//! returns [`BridgeError::StopGaveUp`] after the log line
//! [`StopGaveUp`](crate::internal_events::StopGaveUp) said what was not
//! delivered or committed (nothing is lost: see there). `watchbridge run` also exits at
//! [`STOP_MARGIN`] past the timeout whatever still runs. From the stop signal on, `/readyz`
//! says "stopping"; the operations server (`OpsServer`) answers until the end.
//!
//! [`run_bridge`] reads as the steps of a run: the start's (`start.rs`: the brokers reached,
//! the topics checked; `operations.rs`: the operations servers, the control topic;
//! `guarantee.rs`: the guarantee chosen and the producers that keep it; `partitions.rs`:
//! the partition tasks, the input consumer, the watermark reader), then the run until its
//! end and the orderly stop (`running.rs`). Every Kafka client is made from one
//! [`KafkaSettings`](crate::kafka::clients::KafkaSettings) built at the start.

mod guarantee;
mod operations;
mod partitions;
mod repartition;
mod running;
mod start;

use crate::clock::Clock;
use crate::config::{Mode, RunConfig};
use crate::formats::KeyFormat;
use crate::kafka::client::KafkaSetupError;
use crate::kafka::embedded::EmbeddedBroker;
use crate::kafka::recovery::Lookups;
use crate::metrics::Metrics;
use crate::pollers::Resolve;
use operations::Operations;
use partitions::{Outputs, TaskParts, WatermarkReadBack};
use running::{ConsumerThread, Running};
use start::Start;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long past `WATCHBRIDGE_SHUTDOWN_TIMEOUT` a stop may take at most: `watchbridge run`
/// exits then whatever still runs (the orderly stop itself ends within about 1.5 s of the
/// timeout).
pub const STOP_MARGIN: Duration = Duration::from_secs(5);

/// The exit code of `watchbridge run` when its stop gave up (not everything delivered or
/// committed; nothing lost).
pub const STOP_GAVE_UP_EXIT_CODE: u8 = 3;

/// Why a bridge did not run, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The brokers or the topics are not usable (unreachable within
    /// `WATCHBRIDGE_START_TIMEOUT`, a topic missing or misconfigured).
    #[error(transparent)]
    Setup(#[from] KafkaSetupError),
    /// Something else the start needs failed (a setting, a client, the runtime).
    #[error("{0}")]
    Start(String),
    /// The stop ended at its deadline without delivering or committing everything (the
    /// log line `the stop gave up …` says what).
    #[error("stopped at WATCHBRIDGE_SHUTDOWN_TIMEOUT without delivering or committing everything")]
    StopGaveUp,
}

/// Asks a running bridge to stop; cheap to clone and share.
#[derive(Debug, Default)]
pub struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
}

impl StopSignal {
    /// Ask the bridge to stop (an orderly stop: see `WATCHBRIDGE_SHUTDOWN_TIMEOUT`).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Ready once a stop was asked for.
    pub async fn stopped(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

/// Stop on SIGTERM or SIGINT (Ctrl-C).
pub fn stop_on_signals(stop: Arc<StopSignal>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
            _ = terminate => tracing::info!("SIGTERM; stopping"),
        }
        stop.stop();
    });
}

/// Run the bridge with `poller` until `stop`. `brokers` are the bootstrap servers
/// (the embedded broker's, when `embedded` is given).
pub async fn run_bridge<P: Resolve>(
    brokers: &str,
    embedded: Option<&EmbeddedBroker>,
    config: &RunConfig,
    poller: Arc<P>,
    metrics: Arc<Metrics>,
    stop: Arc<StopSignal>,
) -> Result<(), BridgeError> {
    // With repartitioning the watch side reads the repartition topic (`repartition.rs`).
    let watch_side = repartition::watch_side(config);
    let upstream = watch_side.as_ref().map(|_| config);
    let config = watch_side.as_ref().unwrap_or(config);
    let start = Start::new(brokers, embedded, config, upstream, metrics, stop);
    match start_running(&start, poller).await? {
        Some(running) => running.until_stopped(&start).await,
        None => Ok(()),
    }
}

/// The start's steps, in order, up to the consumer thread reading (`None`: a stop came
/// while it waited for the brokers or for the guarantee).
async fn start_running<P: Resolve>(
    start: &Start<'_>,
    poller: Arc<P>,
) -> Result<Option<Running<P>>, BridgeError> {
    let config = start.config;
    let mut background = start.background_tasks();
    // Connecting from now on, beside the start's own requests (`recovery::Lookups`).
    let lookups = Lookups::start(&start.clients, &start.kafka, &config.input_topic);
    // `/healthz` answers from now on, and `/readyz` says what the start waits for.
    let operations = Operations::serve(start).await?;
    // A stop while the start waits ends it: nothing was read, nothing is owed.
    let reached = start.reach_the_brokers();
    let stopped = "stopped before the start reached the brokers";
    let Some(layout) = start.unless_stopped(reached, stopped).await? else {
        return Ok(None);
    };
    start::poller_ready(&poller).await?;
    // Outages from now on: reported once each way (`kafka/health.rs`).
    background.spawn(start.watch_broker_health());
    start.log_starting(&layout);
    // `auto` may wait for a transaction coordinator still loading: a stop ends that too.
    let chosen = start.choose_guarantee(layout.input_partitions);
    let stopped = "stopped before the guarantee was chosen";
    let Some(guarantee) = start.unless_stopped(chosen, stopped).await? else {
        return Ok(None);
    };
    let producers = start.producers(guarantee).await?;
    let stage_producers = producers.clone();
    // Checks the settings once, before any partition task makes its own.
    let producer = producers.shared()?;
    let mut formats = start.formats().await?;
    // With repartitioning, the stage reads the watch key where the settings say; the watch
    // side finds it as the record key the stage wrote, as it came.
    let upstream_decoder = start.upstream.map(|upstream| {
        let decoder = &formats.decoder;
        let stage = decoder.with_watch_key(upstream.watch_key.clone(), None);
        formats.decoder = Arc::new(decoder.with_watch_key(None, Some(KeyFormat::Raw)));
        Arc::new(stage)
    });
    let clock = Clock::system();
    let read_back = WatermarkReadBack::new(start, &layout, guarantee);
    let outputs = Outputs::choose(config, &layout, guarantee, &formats.encoder, &*poller);
    let limits = start.poll_limits(&layout);
    // The group's standing orders (pauses) apply before any watch polls.
    operations.follow(start, &layout).await?;
    // The input consumer's settings: its lease reads the session timeout from them.
    let consumer_settings = start.clients.input_consumer(guarantee);
    let parts = TaskParts {
        poller,
        layout,
        guarantee,
        producers,
        formats,
        outputs,
        limits,
        clock,
        lookups: lookups.clone(),
        controls: operations.controls.clone(),
    };
    let tasks = start.partition_tasks(parts, &read_back, &consumer_settings);
    let bounded = config.mode == Mode::Bounded;
    let consumer = start.input_consumer(&consumer_settings, &tasks, &layout, bounded)?;
    let merged = start.merged_watermark(&tasks, &producer, bounded, clock, read_back, lookups);
    let consumer = ConsumerThread::start(consumer, tasks.partitions.clone(), bounded)?;
    let repartition = match upstream_decoder {
        Some(decoder) => {
            start.repartition_stage(guarantee, &stage_producers, decoder, &layout, clock)?
        }
        None => None,
    };
    Ok(Some(Running {
        repartition,
        consumer,
        partitions: tasks.partitions,
        layout,
        producer,
        merged,
        operations,
        background,
    }))
}

/// The last resort of `watchbridge run`: once a stop began, the process ends at
/// `WATCHBRIDGE_SHUTDOWN_TIMEOUT` + [`STOP_MARGIN`] whatever still runs (the orderly stop
/// ends before; this is for a librdkafka call that no bound reaches).
pub(crate) fn exit_past_the_stop_deadline(stop: Arc<StopSignal>, timeout: Duration) {
    tokio::spawn(async move {
        stop.stopped().await;
        let _ = std::thread::Builder::new()
            .name("watchbridge-stop-deadline".into())
            .spawn(move || {
                std::thread::sleep(timeout + STOP_MARGIN);
                tracing::error!(
                    "the stop gave up: it did not end within WATCHBRIDGE_SHUTDOWN_TIMEOUT ({}) \
                     plus {}, and the process exits now; what was not delivered and what was \
                     not committed is not known here. Nothing is lost: a record not delivered \
                     was never checkpointed, and an input not committed is read again, when \
                     the partitions are next assigned",
                    humantime::format_duration(timeout),
                    humantime::format_duration(STOP_MARGIN)
                );
                std::process::exit(i32::from(STOP_GAVE_UP_EXIT_CODE));
            });
    });
}

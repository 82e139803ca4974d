//! `watchbridge run`: the bridge put together. Topics checked (and created), one idempotent
//! producer shared by every partition, the consumer thread, and an orderly stop.
//!
//! Stopping (SIGTERM, Ctrl-C, or [`StopSignal::stop`]): the consumer thread stops reading,
//! every partition task stops its watches (polls in flight are cancelled), delivers what
//! they already emitted, and publishes its commit position; the positions are committed,
//! the producer flushed, and `run` returns. Each step is bounded by
//! `WATCHBRIDGE_SHUTDOWN_TIMEOUT`.

use crate::clock::Clock;
use crate::config::RunConfig;
use crate::kafka::client::{base_config, ensure_topics, log_properties, KafkaSetupError};
use crate::kafka::consumer::{consume, BridgeContext, Partitions};
use crate::kafka::embedded::EmbeddedBroker;
use crate::kafka::partition::Shared;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::pollers::builtin::UsePoller;
use crate::pollers::Resolve;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::ClientConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error(transparent)]
    Setup(#[from] KafkaSetupError),
    #[error("{0}")]
    Start(String),
}

/// Asks a running bridge to stop; cheap to clone and share.
#[derive(Debug, Default)]
pub struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
}

impl StopSignal {
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

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
    log_properties(config);
    let partitions = ensure_topics(brokers, config, embedded).await?;
    tracing::info!(
        brokers,
        input = %config.input_topic,
        partitions,
        output = %config.output_topic,
        dlq = %config.dlq_topic,
        group = %config.group_id,
        "bridge starting"
    );
    let producer: FutureProducer = producer_config(brokers, config)
        .create()
        .map_err(|e| BridgeError::Start(format!("cannot create the producer: {e}")))?;
    let shared = Arc::new(Shared {
        poller,
        producer: producer.clone(),
        input_topic: config.input_topic.as_str().into(),
        output_topic: config.output_topic.as_str().into(),
        dlq_topic: config.dlq_topic.as_str().into(),
        watch_key: config.watch_key.clone(),
        rules: config.rules.clone(),
        poll_timeout: config.poll_timeout,
        limits: Limits::new(config.max_in_flight, config.host_rate),
        metrics,
        clock: Clock::system(),
        positions: Arc::new(Mutex::new(HashMap::new())),
        stop_timeout: config.shutdown_timeout,
    });
    let partitions = Arc::new(Partitions::new(shared, tokio::runtime::Handle::current()));
    let consumer: BaseConsumer<BridgeContext<P>> = consumer_config(brokers, config)
        .create_with_context(BridgeContext {
            partitions: partitions.clone(),
        })
        .map_err(|e| BridgeError::Start(format!("cannot create the consumer: {e}")))?;
    consumer.subscribe(&[&config.input_topic]).map_err(|e| {
        BridgeError::Start(format!("cannot subscribe to {}: {e}", config.input_topic))
    })?;

    let stop_consumer = Arc::new(AtomicBool::new(false));
    let consumer_thread = {
        let stop_consumer = stop_consumer.clone();
        std::thread::Builder::new()
            .name("watchbridge-consumer".into())
            .spawn(move || consume(consumer, partitions, stop_consumer))
            .map_err(|e| BridgeError::Start(format!("cannot start the consumer thread: {e}")))?
    };
    stop.stopped().await;
    tracing::info!("stopping: no more input; stopping watches, delivering, committing");
    stop_consumer.store(true, Ordering::SeqCst);
    let bound = config.shutdown_timeout + Duration::from_secs(5);
    let joined = tokio::task::spawn_blocking(move || consumer_thread.join());
    if tokio::time::timeout(bound, joined).await.is_err() {
        tracing::warn!("the consumer did not stop in time; exiting anyway");
    }
    let flush_for = config.shutdown_timeout;
    let flushed = tokio::task::spawn_blocking(move || producer.flush(flush_for)).await;
    if let Ok(Err(e)) = flushed {
        tracing::warn!(error = %e, "producer flush incomplete");
    }
    tracing::info!("stopped");
    Ok(())
}

fn producer_config(brokers: &str, config: &RunConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("linger.ms", "5");
    c.set("compression.type", "lz4");
    override_with(&mut c, base_config(brokers, config));
    // Required for "nothing lost, nothing twice" on the producer side.
    c.set("enable.idempotence", "true");
    c.set("acks", "all");
    c
}

fn consumer_config(brokers: &str, config: &RunConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("auto.offset.reset", "earliest");
    c.set("partition.assignment.strategy", "cooperative-sticky");
    c.set("auto.commit.interval.ms", "1000");
    override_with(&mut c, base_config(brokers, config));
    c.set("group.id", &config.group_id);
    // Offsets are stored by us, only once what an input caused is acknowledged.
    c.set("enable.auto.commit", "true");
    c.set("enable.auto.offset.store", "false");
    c
}

/// Apply `other`'s settings over `c` (the user's `KAFKA_*` over our defaults).
fn override_with(c: &mut ClientConfig, other: ClientConfig) {
    for (key, value) in other.config_map() {
        c.set(key, value);
    }
}

/// `watchbridge run` from the command line: the embedded broker when no brokers are
/// configured, signals, and the chosen poller.
pub struct RunFromCli {
    pub config: RunConfig,
}

impl UsePoller for RunFromCli {
    type Output = Result<(), BridgeError>;

    fn with<P: Resolve>(self, poller: Arc<P>) -> Self::Output {
        let runtime = tokio::runtime::Runtime::new()
            .map_err(|e| BridgeError::Start(format!("cannot start the async runtime: {e}")))?;
        let embedded = match &self.config.brokers {
            Some(_) => None,
            None => Some(EmbeddedBroker::start().map_err(BridgeError::Start)?),
        };
        let brokers = match (&self.config.brokers, &embedded) {
            (Some(b), _) => b.clone(),
            (None, Some(e)) => {
                let b = e.bootstrap();
                tracing::warn!(
                    bootstrap = %b,
                    "WATCHBRIDGE_BROKERS is unset: using an EMBEDDED in-memory broker that keeps nothing \
                     when this process ends; point WATCHBRIDGE_BROKERS at a Kafka cluster for real use"
                );
                b
            }
            (None, None) => unreachable!("an embedded broker was started above"),
        };
        let metrics = Arc::new(Metrics::new());
        let stop = Arc::new(StopSignal::default());
        runtime.block_on(async {
            stop_on_signals(stop.clone());
            run_bridge(
                &brokers,
                embedded.as_ref(),
                &self.config,
                poller,
                metrics,
                stop,
            )
            .await
        })
    }
}

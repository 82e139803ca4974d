//! What every step of a start shares ([`Start`]), and its first steps: the brokers waited
//! for and the topics checked, the poller's preparation, the watch over outages, the
//! formats, the poll limits.

use super::BridgeError;
use super::StopSignal;
use crate::config::RunConfig;
use crate::formats::Formats;
use crate::kafka::client::{
    ensure_topics, wait_for_brokers, KafkaSetupError, TopicLayout, TopicSettings,
};
use crate::kafka::clients::KafkaSettings;
use crate::kafka::embedded::EmbeddedBroker;
use crate::kafka::health::{BrokerHealth, KafkaContext};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::pollers::Resolve;
use crate::readiness::Readiness;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinSet;

/// What every step of a start shares.
pub(super) struct Start<'a> {
    /// The settings of the watch side: with repartitioning (`WATCHBRIDGE_REPARTITION`), its
    /// input topic is the repartition topic, keyed by the watch key (`repartition.rs`).
    pub config: &'a RunConfig,
    /// With repartitioning, the settings as given: what the repartition stage reads.
    pub upstream: Option<&'a RunConfig>,
    /// The embedded broker, when it is the one (`WATCHBRIDGE_BROKERS=embedded`).
    pub embedded: Option<&'a EmbeddedBroker>,
    /// What every Kafka client of the run is made from (`kafka/clients.rs`).
    pub clients: KafkaSettings,
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
    /// Whether the brokers can be reached.
    pub health: Arc<BrokerHealth>,
    /// Every client's context: its errors and log lines go to `health`.
    pub kafka: KafkaContext,
    pub stop: Arc<StopSignal>,
    pub started: Instant,
    /// `started` + `WATCHBRIDGE_START_TIMEOUT`: what the start's waits share.
    pub deadline: Instant,
}

impl<'a> Start<'a> {
    /// A start from now, on `brokers` (the embedded broker's, when `embedded` is given); the
    /// user's Kafka properties logged.
    pub(super) fn new(
        brokers: &str,
        embedded: Option<&'a EmbeddedBroker>,
        config: &'a RunConfig,
        upstream: Option<&'a RunConfig>,
        metrics: Arc<Metrics>,
        stop: Arc<StopSignal>,
    ) -> Self {
        let started = Instant::now();
        let clients = kafka_settings(brokers, config);
        clients.log_properties();
        let readiness = Arc::new(Readiness::new());
        if embedded.is_some() {
            readiness.on_embedded_broker();
        }
        let health = BrokerHealth::new(brokers, metrics.clone());
        let kafka = KafkaContext::new(health.clone());
        Self {
            config,
            upstream,
            embedded,
            clients,
            metrics,
            readiness,
            health,
            kafka,
            stop,
            started,
            deadline: started + config.start_timeout,
        }
    }

    /// Tasks that end with the run (the set aborts them when dropped); the first says
    /// "stopping" in `/readyz` as soon as a stop is asked for.
    pub(super) fn background_tasks(&self) -> JoinSet<()> {
        let mut background = JoinSet::new();
        let (metrics, readiness, stop) = (
            self.metrics.clone(),
            self.readiness.clone(),
            self.stop.clone(),
        );
        background.spawn(async move {
            stop.stopped().await;
            readiness.stopping(&metrics);
        });
        background
    }

    /// `step`, unless a stop is asked for first: then `None`, and the log says `stopped`.
    pub(super) async fn unless_stopped<T>(
        &self,
        step: impl Future<Output = Result<T, BridgeError>>,
        stopped: &'static str,
    ) -> Result<Option<T>, BridgeError> {
        tokio::select! {
            done = step => done.map(Some),
            () = self.stop.stopped() => {
                tracing::info!("{stopped}");
                Ok(None)
            }
        }
    }

    /// Wait for the brokers (a broker still starting or restarting), then check the topics;
    /// if the brokers go away meanwhile, wait again, all within WATCHBRIDGE_START_TIMEOUT.
    /// `/readyz` says what it waits for from the call on.
    pub(super) fn reach_the_brokers(
        &self,
    ) -> impl Future<Output = Result<TopicLayout, BridgeError>> + '_ {
        self.readiness
            .waiting_for_brokers(Some(&self.clients.brokers), &self.metrics);
        let topics = topic_settings(self.upstream.unwrap_or(self.config));
        async move {
            let layout = loop {
                let client =
                    wait_for_brokers(&self.clients, &self.kafka, self.started, self.deadline)
                        .await?;
                match ensure_topics(&self.clients, &topics, self.embedded, client).await {
                    Err(KafkaSetupError::Unreachable { error, .. })
                        if Instant::now() < self.deadline =>
                    {
                        tracing::warn!(
                            error,
                            "the brokers stopped answering during the start; waiting for them again"
                        );
                    }
                    result => break result,
                }
            }?;
            self.readiness.waiting_for_brokers(None, &self.metrics);
            Ok(layout)
        }
    }

    /// The watch over broker outages: a metadata request confirms one (`kafka/health.rs`).
    pub(super) fn watch_broker_health(&self) -> impl Future<Output = ()> + Send + 'static {
        let probe_config = self.clients.health_probe();
        let probe_context = self.kafka.clone();
        self.health.clone().watch(move |timeout| {
            let client: BaseConsumer<KafkaContext> = probe_config
                .create_with_context(probe_context.clone())
                .map_err(|e| e.to_string())?;
            client
                .fetch_metadata(None, timeout)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// The log line that says what the run reads and writes.
    pub(super) fn log_starting(&self, layout: &TopicLayout) {
        let config = self.config;
        if let Some(upstream) = self.upstream {
            tracing::info!(
                input = %upstream.input_topic,
                repartition = %config.input_topic,
                watch_key = upstream.watch_key.as_deref().unwrap_or("the record key"),
                "inputs go through the repartition topic, keyed by their watch key: one watch \
                 per watch key whichever input partition its inputs arrive on \
                 (WATCHBRIDGE_REPARTITION)"
            );
        }
        tracing::info!(
            brokers = self.clients.brokers.as_str(),
            input = %config.input_topic,
            partitions = layout.input_partitions,
            output = %config.output_topic,
            dlq = %config.dlq_topic,
            state = %config.state_topic,
            group = %config.group_id,
            "bridge starting"
        );
    }

    /// The input decoder and the output encoder (the output schema registered, within the
    /// start's deadline).
    pub(super) async fn formats(&self) -> Result<Formats, BridgeError> {
        let config = self.config;
        config
            .formats
            .start(
                config.watch_key.clone(),
                &config.output_topic,
                &self.metrics,
                self.deadline.into(),
            )
            .await
            .map_err(BridgeError::Start)
    }

    /// The polls' limits (`limits.rs`). WATCHBRIDGE_HOST_RATE is the group's: each instance
    /// polls at the share of the input partitions it owns.
    pub(super) fn poll_limits(&self, layout: &TopicLayout) -> Limits {
        let limits = Limits::new(self.config.max_in_flight, self.config.host_rate);
        limits.share_among(layout.input_partitions.max(0) as u32);
        limits
    }
}

/// What the poller prepared meanwhile (the HTTP client, `pollers/http/client.rs`).
pub(super) async fn poller_ready<P: Resolve>(poller: &Arc<P>) -> Result<(), BridgeError> {
    let prepared = {
        let poller = poller.clone();
        tokio::task::spawn_blocking(move || poller.ready()).await
    };
    prepared
        .map_err(|e| BridgeError::Start(format!("the poller's preparation failed: {e}")))?
        .map_err(BridgeError::Start)
}

/// What every Kafka client of this run is made from (`kafka/clients.rs`).
fn kafka_settings(brokers: &str, config: &RunConfig) -> KafkaSettings {
    KafkaSettings {
        brokers: brokers.to_string(),
        properties: config.kafka.clone(),
        group_id: config.group_id.clone(),
    }
}

/// The topics of this run, and how the start makes the ones missing (`kafka/client.rs`).
fn topic_settings(config: &RunConfig) -> TopicSettings {
    TopicSettings {
        input_topic: config.input_topic.clone(),
        repartition_topic: config.repartition_topic.clone(),
        output_topic: config.output_topic.clone(),
        dlq_topic: config.dlq_topic.clone(),
        watermark_topic: config.watermark_topic.clone(),
        state_topic: config.state_topic.clone(),
        control_topic: config.operations.control_topic.clone(),
        create_topics: config.create_topics,
        partitions: config.partitions,
        replication_factor: config.replication_factor,
        topic_config: config.topic_config.clone(),
    }
}

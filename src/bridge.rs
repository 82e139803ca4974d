//! `watchbridge run`: the bridge put together. Topics checked (and created), the producers
//! (each partition task's own, made by the task; one shared for what no partition owns: the
//! merged watermark, a bounded run's end of time), the consumer thread, and an orderly stop.
//!
//! Starting: the operations server first (`/healthz` answers, `/readyz` says what the start
//! waits for), then the brokers are waited for, with backoff, up to
//! `WATCHBRIDGE_START_TIMEOUT` ([`wait_for_brokers`]), then the topics.
//!
//! Stopping (SIGTERM, Ctrl-C, or [`StopSignal::stop`]): the consumer thread stops reading,
//! every partition task stops its watches (polls in flight are cancelled), delivers what
//! they already emitted, and publishes its commit position; the positions are committed,
//! the producer flushed, and `run` returns. All of it shares one deadline,
//! `WATCHBRIDGE_SHUTDOWN_TIMEOUT` from the signal (the commit and the goodbye to the group
//! get at least 1.5 s more between them): what is not done by then is given up, and `run`
//! returns [`BridgeError::StopGaveUp`] after the log line [`StopGaveUp`] said what was not
//! delivered or committed (nothing is lost: see there). `watchbridge run` also exits at
//! [`STOP_MARGIN`] past the timeout whatever still runs. From the stop signal on, `/readyz`
//! says "stopping"; the operations server (`OpsServer`) answers until the end.

use crate::clock::Clock;
use crate::config::{Mode, RunConfig};
use crate::control::Controls;
use crate::formats::output::OutputEncoder;
use crate::internal_events::StopGaveUp;
use crate::kafka::client::{
    broker_settings, ensure_topics, wait_for_brokers, BrokerSettings, KafkaSetupError,
    TopicSettings,
};
use crate::kafka::clients::{uses_the_consumer_protocol, Isolation, KafkaSettings};
use crate::kafka::consumer::{consume, BridgeContext, ConsumerStopped, NoCommitStart, Partitions};
use crate::kafka::control_topic::ControlTopic;
use crate::kafka::delayed_restart::DeliveryWindow;
use crate::kafka::embedded::EmbeddedBroker;
use crate::kafka::group_mode;
use crate::kafka::guarantee::{self, Guarantee, GuaranteeSetting};
use crate::kafka::health::{BrokerHealth, KafkaContext};
use crate::kafka::lease::Lease;
use crate::kafka::merged::{self, publish_end_of_time, EndOfTimeTopics, MergedPublisher};
use crate::kafka::output_ends;
use crate::kafka::partition::Ending;
use crate::kafka::partition::{
    Bounds, Shared, StateSettings, TransactionSettings, WatermarkSettings,
};
use crate::kafka::records::OutputLayout;
use crate::kafka::recovery::{Lookups, RecoverySource};
use crate::kafka::state_lookup::StateLookup;
use crate::kafka::stats::{BridgeProducer, ProducerSettings};
use crate::kafka::transaction_timeout::TransactionTimeouts;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::ops_server::{OpsApi, OpsServer, Serves};
use crate::pollers::Resolve;
use crate::readiness::Readiness;
use crate::watermark::WatermarkTopic;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, TopicPartitionList};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
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
    let started = Instant::now();
    let clients = kafka_settings(brokers, config);
    let topics = topic_settings(config);
    clients.log_properties();
    let readiness = Arc::new(Readiness::new());
    if embedded.is_some() {
        readiness.on_embedded_broker();
    }
    let health = BrokerHealth::new(brokers, metrics.clone());
    let kafka = KafkaContext::new(health.clone());
    // Tasks that end with this function (the set aborts them when dropped).
    let mut background = tokio::task::JoinSet::new();
    {
        let (metrics, readiness, stop) = (metrics.clone(), readiness.clone(), stop.clone());
        background.spawn(async move {
            stop.stopped().await;
            readiness.stopping(&metrics);
        });
    }
    // Connecting from now on, beside the start's own requests (`recovery::Lookups`).
    let lookups = Lookups::start(&clients, &kafka, &config.input_topic);
    let controls = Arc::new(Controls::default());
    // (Its input partition count is set once the start has read it, below.)
    let (orders, state_lookup) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let ops_servers = start_ops_servers(
        config,
        &metrics,
        &readiness,
        &controls,
        &orders,
        &state_lookup,
    )
    .await?;
    // Wait for the brokers (a broker still starting or restarting), then check the topics;
    // if the brokers go away meanwhile, wait again, all within WATCHBRIDGE_START_TIMEOUT.
    let start_deadline = started + config.start_timeout;
    readiness.waiting_for_brokers(Some(brokers), &metrics);
    let start = async {
        loop {
            let client = wait_for_brokers(&clients, &kafka, started, start_deadline).await?;
            match ensure_topics(&clients, &topics, embedded, client).await {
                Err(KafkaSetupError::Unreachable { error, .. })
                    if Instant::now() < start_deadline =>
                {
                    tracing::warn!(
                        error,
                        "the brokers stopped answering during the start; waiting for them again"
                    );
                }
                result => break result,
            }
        }
    };
    // A stop while the start waits ends it: nothing was read, nothing is owed.
    let layout = tokio::select! {
        layout = start => layout?,
        () = stop.stopped() => {
            tracing::info!("stopped before the start reached the brokers");
            return Ok(());
        }
    };
    readiness.waiting_for_brokers(None, &metrics);
    // What the poller prepared meanwhile (the HTTP client, `pollers/http/client.rs`).
    let prepared = {
        let poller = poller.clone();
        tokio::task::spawn_blocking(move || poller.ready()).await
    };
    prepared
        .map_err(|e| BridgeError::Start(format!("the poller's preparation failed: {e}")))?
        .map_err(BridgeError::Start)?;
    {
        // Outages from now on: reported once each way (`kafka/health.rs`).
        let probe_config = clients.health_probe();
        let probe_context = kafka.clone();
        background.spawn(health.clone().watch(move |timeout| {
            let client: BaseConsumer<KafkaContext> = probe_config
                .create_with_context(probe_context.clone())
                .map_err(|e| e.to_string())?;
            client
                .fetch_metadata(None, timeout)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }));
    }
    tracing::info!(
        brokers,
        input = %config.input_topic,
        partitions = layout.input_partitions,
        output = %config.output_topic,
        dlq = %config.dlq_topic,
        state = %config.state_topic,
        group = %config.group_id,
        "bridge starting"
    );
    // `auto` may wait for a transaction coordinator still loading: a stop ends that too.
    let (guarantee, fallback) = tokio::select! {
        chosen = choose_guarantee(
            &clients,
            embedded.is_some(),
            config,
            &kafka,
            layout.input_partitions,
            start_deadline,
        ) => chosen?,
        () = stop.stopped() => {
            tracing::info!("stopped before the guarantee was chosen");
            return Ok(());
        }
    };
    if let Some(why) = &fallback {
        readiness.guarantee_fell_back(why);
    }
    let setting = match config.guarantee {
        GuaranteeSetting::Auto => "auto".to_string(),
        GuaranteeSetting::Fixed(g) => g.to_string(),
    };
    metrics
        .guarantee_info
        .with_label_values(&[
            &guarantee.to_string(),
            &setting,
            fallback.as_deref().unwrap_or(""),
        ])
        .set(1);
    let producer_settings = ProducerSettings {
        config: clients.output_producer(guarantee),
        metrics: metrics.clone(),
        kafka: kafka.clone(),
    };
    let transactions = match guarantee {
        Guarantee::ExactlyOnce => {
            Some(transaction_settings(&clients, config, &producer_settings).await?)
        }
        _ => None,
    };
    // Without transactions, a partition whose delivery failed waits out how long the record
    // may still commit before it reads its outputs back (`kafka/delayed_restart.rs`).
    let delivery_window = match guarantee {
        Guarantee::ExactlyOnce => Duration::ZERO,
        _ => delivery_window(&clients, &kafka).await,
    };
    // Checks the settings once, before any partition task makes its own.
    let producer: BridgeProducer = producer_settings
        .create(None)
        .map_err(|e| BridgeError::Start(format!("cannot create the producer: {e}")))?;
    let formats = config
        .formats
        .start(
            config.watch_key.clone(),
            &config.output_topic,
            &metrics,
            start_deadline.into(),
        )
        .await
        .map_err(BridgeError::Start)?;
    let clock = Clock::system();
    let watermark_read_back = WatermarkTopic::shared(&config.input_topic, layout.input_partitions);
    let watermarks_read = Arc::new(AtomicI64::new(0));
    // What may hide a previous owner's last watermark from the reader is a transaction the
    // instances' producers left open: it ends within their timeout.
    let read_back_limit = merged::read_back_limit(
        clients
            .output_producer(guarantee)
            .get("transaction.timeout.ms"),
    );
    // Outputs' identities read back from their values: where the poller can, and the values
    // are its items as it gave them (not Avro, whose datums a recovery would decode).
    let output_keys = match formats.encoder.as_ref() {
        OutputEncoder::Json => poller.output_key_reader(),
        OutputEncoder::Avro { .. } => None,
    };
    // `wb-id` only where a recovery reads outputs back and could not tell them apart
    // without it: not with at_least_once (which reads none), nor in the exactly-once mode,
    // whose every commit holds the hashes of the outputs it commits (a checkpoint settles
    // every record first).
    let output_layout = OutputLayout::choose(
        config.output_headers,
        layout.input_partitions,
        layout.output_partitions,
        guarantee == Guarantee::Recovery,
        output_keys.is_some(),
    );
    controls.set_input_partitions(layout.input_partitions);
    let limits = Limits::new(config.max_in_flight, config.host_rate);
    // WATCHBRIDGE_HOST_RATE is the group's: each instance polls at the share of the input
    // partitions it owns.
    limits.share_among(layout.input_partitions.max(0) as u32);
    // The group's standing orders (pauses) apply before any watch polls.
    let control_topic = ControlTopic::start(
        &config.operations.control_topic,
        clients.control_topic_reader(),
        clients.control_topic_writer(),
        &kafka,
        controls.pause.clone(),
        metrics.clone(),
        start_deadline,
    )
    .await
    .map_err(BridgeError::Start)?;
    let _ = orders.set(control_topic);
    let _ = state_lookup.set(
        StateLookup::new(
            clients.state_lookup_reader(),
            clients.state_lookup_writer(),
            &kafka,
            brokers,
            &config.state_topic,
            &config.input_topic,
            layout.input_partitions,
            config.watch_key.is_none(),
        )
        .map_err(BridgeError::Start)?,
    );
    // The input consumer's settings: its lease reads the session timeout from them.
    let consumer_settings = clients.input_consumer(guarantee);
    let shared = Arc::new(Shared {
        group_id: config.group_id.as_str().into(),
        poller,
        producer: producer_settings,
        producer_restarts: Default::default(),
        input_topic: config.input_topic.as_str().into(),
        output_topic: config.output_topic.as_str().into(),
        dlq_topic: config.dlq_topic.as_str().into(),
        decoder: formats.decoder,
        encoder: formats.encoder,
        output_layout,
        rules: config.rules.clone(),
        poll_timeout: config.poll_timeout,
        limits,
        metrics: metrics.clone(),
        clock,
        positions: Arc::new(Mutex::new(HashMap::new())),
        transaction_positions: Arc::new(Mutex::new(HashMap::new())),
        lease: group_lease(&consumer_settings, &metrics),
        output_ends: output_ends::start(
            clients.output_ends_reader(),
            config.output_topic.as_str().into(),
            layout.output_partitions,
        ),
        stop_timeout: config.shutdown_timeout,
        input_hold_bytes: config.input_hold_bytes,
        skip_input: config.skip_input.clone(),
        watermarks: WatermarkSettings {
            generators: config
                .watermark_generators
                .clone()
                .unwrap_or_else(|| config.watermark_strategy.into()),
            interval: config.watermark_interval,
            idle_timeout: config.idle_timeout,
            topic: config.watermark_topic.as_str().into(),
            output_partitions: layout.output_partitions,
            read_back: watermark_read_back.clone(),
            read_upto: watermarks_read.clone(),
            read_back_limit,
        },
        state: StateSettings {
            recovery: RecoverySource {
                consumer_config: clients.recovery_reader(Isolation::ReadCommitted),
                kafka: kafka.clone(),
                input_topic: config.input_topic.as_str().into(),
                group_id: config.group_id.clone(),
                watermark_topic: config.watermark_topic.as_str().into(),
                state_topic: config.state_topic.as_str().into(),
                output_topic: config.output_topic.as_str().into(),
                output_partitions: layout.output_partitions,
                outputs_by_input_partition: output_layout.by_input_partition,
                read_outputs: guarantee != Guarantee::AtLeastOnce,
                // On one broker a record is committed once appended: nothing to settle.
                settle_outputs: transactions.is_none() && !delivery_window.is_zero(),
                output_keys,
                lookups: lookups.clone(),
            },
            guarantee,
            finished_retention: config.finished_retention,
            checkpoint_interval: config.checkpoint_interval,
        },
        readiness: readiness.clone(),
        transactions,
        kafka: kafka.clone(),
        controls,
        merged_writer: Default::default(),
    });
    let (merged_writer, lease) = (shared.merged_writer.clone(), shared.lease.clone());
    let no_commit = NoCommitStart::from_reset(consumer_settings.get("auto.offset.reset"));
    let partitions = Arc::new(Partitions::new(
        shared,
        tokio::runtime::Handle::current(),
        no_commit,
        delivery_window,
        takeover_wait(&consumer_settings, delivery_window),
    ));
    let bounded_incomplete = partitions.clone();
    let consumer: BaseConsumer<BridgeContext<P>> = consumer_settings
        .create_with_context(BridgeContext {
            partitions: partitions.clone(),
        })
        .map_err(|e| BridgeError::Start(format!("cannot create the consumer: {e}")))?;
    let bounded = config.mode == Mode::Bounded;
    if bounded {
        assign_bounded(&consumer, &partitions, config, layout.input_partitions)?;
        readiness.assignment_received(&metrics);
    } else {
        consumer.subscribe(&[&config.input_topic]).map_err(|e| {
            BridgeError::Start(format!("cannot subscribe to {}: {e}", config.input_topic))
        })?;
    }

    // The watermark topic read back, and the merged watermark over every input partition
    // published (streaming runs; a bounded run only reads, for its partitions' floors, and
    // publishes its final value below).
    let stop_merged = Arc::new(StopSignal::default());
    let merged = {
        let publisher = MergedPublisher {
            consumer_config: clients.watermark_reader(),
            kafka: kafka.clone(),
            producer: producer.clone(),
            input_topic: config.input_topic.as_str().into(),
            watermark_topic: config.watermark_topic.as_str().into(),
            interval: config.watermark_interval,
            claim: merged_writer,
            lease,
            publishes: !bounded,
            metrics: metrics.clone(),
            clock,
            read_back: watermark_read_back,
            read_upto: watermarks_read,
            lookups,
            readiness: readiness.clone(),
            read_back_limit,
        };
        let stop_merged = stop_merged.clone();
        tokio::spawn(async move {
            publisher
                .run(async move { stop_merged.stopped().await })
                .await
        })
    };

    let stop_consumer = Arc::new(AtomicBool::new(false));
    let stop_deadline = Arc::new(OnceLock::new());
    let consumer_thread = {
        let (stop_consumer, stop_deadline) = (stop_consumer.clone(), stop_deadline.clone());
        std::thread::Builder::new()
            .name("watchbridge-consumer".into())
            .spawn(move || consume(consumer, partitions, stop_consumer, stop_deadline, bounded))
            .map_err(|e| BridgeError::Start(format!("cannot start the consumer thread: {e}")))?
    };
    let mut joined = tokio::task::spawn_blocking(move || consumer_thread.join());
    let finished = tokio::select! {
        () = stop.stopped() => None,
        joined = &mut joined => Some(joined),
    };
    readiness.stopping(&metrics);
    // One deadline for the whole stop (a bounded run that finished has its own).
    let deadline = Instant::now() + config.shutdown_timeout;
    let consumer_stopped = match finished {
        Some(joined) => {
            let incomplete = bounded_incomplete.incomplete();
            if incomplete.is_empty() {
                tracing::info!("bounded run complete: every input read, every watch ended");
                let topics = EndOfTimeTopics {
                    input_topic: config.input_topic.as_str().into(),
                    input_partitions: layout.input_partitions,
                    watermark_topic: config.watermark_topic.as_str().into(),
                    output_topic: config.output_topic.as_str().into(),
                    output_partitions: layout.output_partitions,
                };
                publish_end_of_time(&producer, &topics).await;
            } else {
                // No end of time for the merged value: not every partition got there.
                tracing::warn!(
                    partitions = ?incomplete,
                    "bounded run over, but these partitions did not finish (left to another \
                     instance, or could not be read again); their watermark and the merged \
                     one are not at the end of time"
                );
            }
            joined.ok().and_then(Result::ok)
        }
        None => {
            tracing::info!("stopping: no more input; stopping watches, delivering, committing");
            let _ = stop_deadline.set(deadline);
            stop_consumer.store(true, Ordering::SeqCst);
            // The consumer thread ends by the deadline plus 1.5 s at most, unless
            // librdkafka blocks where no bound reaches it.
            let bound = deadline + Duration::from_secs(2);
            match tokio::time::timeout_at(bound.into(), joined).await {
                Ok(Ok(Ok(stopped))) => Some(stopped),
                _ => None,
            }
        }
    };
    stop_merged.stop();
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left.max(Duration::from_millis(200)), merged).await;
    }
    let flush_for = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(500));
    let flushing = producer.clone();
    let flushed = tokio::task::spawn_blocking(move || flushing.flush(flush_for)).await;
    // A flush that succeeded saw no record left undelivered. The producer's queue length
    // afterwards is no count of records: it also counts librdkafka's pending callbacks and
    // log lines (with `KAFKA_DEBUG` set, a stop that had delivered everything reported "1
    // record(s) not delivered" one time in three).
    if let Ok(Err(e)) = &flushed {
        tracing::debug!(error = %e, "producer flush incomplete");
    }
    let undelivered = match flushed {
        Ok(Ok(())) => 0,
        _ => producer.in_flight_count().max(0) as u64,
    };
    let gave_up = stop_report(
        consumer_stopped.as_ref(),
        undelivered,
        config,
        &health,
        started_stop(deadline, config),
    );
    if gave_up {
        // Destroying a producer with records it cannot deliver waits for them: not here.
        let _ = std::thread::Builder::new()
            .name("watchbridge-producer-close".into())
            .spawn(move || drop(producer));
    }
    drop(ops_servers);
    drop(background);
    if gave_up {
        return Err(BridgeError::StopGaveUp);
    }
    tracing::info!("stopped");
    Ok(())
}

/// When the stop whose deadline is `deadline` began.
fn started_stop(deadline: Instant, config: &RunConfig) -> Instant {
    deadline
        .checked_sub(config.shutdown_timeout)
        .unwrap_or(deadline)
}

/// Whether the stop left anything undelivered or uncommitted; if so, say what (once, in
/// [`StopGaveUp`]). `undelivered`: records the shared producer still holds.
fn stop_report(
    consumer: Option<&ConsumerStopped>,
    undelivered: u64,
    config: &RunConfig,
    health: &BrokerHealth,
    began: Instant,
) -> bool {
    let mut not_delivered = undelivered;
    let mut not_committed: Vec<(i32, Option<i64>)> = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    match consumer {
        None => causes.push(
            "the consumer did not stop in time: inputs since its last commit are not committed"
                .into(),
        ),
        Some(stopped) => {
            for (partition, report) in &stopped.partitions {
                match report {
                    None => not_committed.push((*partition, None)),
                    Some(r) => {
                        // Its last checkpoint (or transaction) did not land: inputs from its
                        // committed position on are read again.
                        if r.ending != Ending::Done || r.undelivered > 0 {
                            not_committed.push((*partition, r.position));
                        }
                    }
                }
            }
            if let Err(e) = &stopped.commit {
                causes.push(format!("the final commit failed: {e}"));
                for (partition, report) in &stopped.partitions {
                    if let Some(position) = report.as_ref().and_then(|r| r.position) {
                        if !not_committed.iter().any(|(p, _)| p == partition) {
                            not_committed.push((*partition, Some(position)));
                        }
                    }
                }
            }
            // Each partition's own producer held these (the shared producer's, the merged
            // watermark's, are counted above).
            let own: usize = stopped
                .partitions
                .iter()
                .filter_map(|(_, r)| r.as_ref())
                .map(|r| r.undelivered)
                .sum();
            not_delivered += own as u64;
            if !stopped.closed && stopped.commit.is_ok() && not_committed.is_empty() {
                tracing::warn!(
                    "left the consumer group without saying goodbye (the group coordinator did \
                     not answer in time): the group gives this instance's partitions to \
                     others once its session times out"
                );
            }
        }
    }
    if not_delivered == 0 && not_committed.is_empty() && causes.is_empty() {
        return false;
    }
    not_committed.sort_unstable();
    if health.is_unreachable() {
        causes.insert(0, "every broker is unreachable".into());
    }
    if causes.is_empty() {
        causes.push("the brokers did not acknowledge everything in time".into());
    }
    let uncounted = match consumer {
        Some(stopped) => stopped
            .partitions
            .iter()
            .filter(|(_, r)| r.is_none())
            .count(),
        _ => 0,
    };
    StopGaveUp {
        took: began.elapsed(),
        timeout: config.shutdown_timeout,
        not_delivered,
        uncounted,
        not_committed: consumer.map(|_| not_committed.as_slice()),
        cause: &causes.join("; "),
    }
    .emit(health.metrics());
    true
}

/// The operations server, unless `WATCHBRIDGE_METRICS_ADDR=off`.
/// The operations servers: metrics and probes on `WATCHBRIDGE_METRICS_ADDR`, the control
/// API on `WATCHBRIDGE_CONTROL_ADDR` (one server for both when they are the same address;
/// none for the control API without `WATCHBRIDGE_ADMIN_TOKEN`, which it needs).
async fn start_ops_servers(
    config: &RunConfig,
    metrics: &Arc<Metrics>,
    readiness: &Arc<Readiness>,
    controls: &Arc<Controls>,
    orders: &Arc<OnceLock<ControlTopic>>,
    state: &Arc<OnceLock<StateLookup>>,
) -> Result<Vec<OpsServer>, BridgeError> {
    let api = Arc::new(OpsApi {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        controls: controls.clone(),
        admin_token: config.admin_token.as_ref().map(|t| t.0.clone()),
        orders: orders.clone(),
        state: state.clone(),
        show_inputs: config.operations.show_inputs,
        stall_timeout: config.operations.stall_timeout,
    });
    let control_addr = match (config.operations.control_addr, &config.admin_token) {
        (Some(addr), Some(_)) => Some(addr),
        (Some(addr), None) => {
            tracing::info!(
                %addr,
                "no WATCHBRIDGE_ADMIN_TOKEN: the control and watch API is off (it needs one)"
            );
            None
        }
        (None, _) => None,
    };
    let mut servers = Vec::new();
    let shared = control_addr.is_some() && control_addr == config.metrics_addr;
    if let Some(addr) = config.metrics_addr {
        let serves = Serves {
            probes: true,
            control: shared,
        };
        let server = OpsServer::start(addr, api.clone(), serves)
            .await
            .map_err(BridgeError::Start)?;
        tracing::info!(
            address = %server.addr(),
            control = shared,
            "serving /metrics, /healthz, /readyz and /version (WATCHBRIDGE_METRICS_ADDR)"
        );
        servers.push(server);
    }
    if let Some(addr) = control_addr.filter(|_| !shared) {
        let serves = Serves {
            probes: false,
            control: true,
        };
        let server = OpsServer::start(addr, api, serves)
            .await
            .map_err(BridgeError::Start)?;
        tracing::info!(
            address = %server.addr(),
            "serving the control and watch API: /watches, /partitions, /orders, /pause, /resume (WATCHBRIDGE_CONTROL_ADDR)"
        );
        servers.push(server);
    }
    Ok(servers)
}

/// A bounded run reads every partition itself (no group rebalancing) from the group's
/// committed offset (else the beginning) up to the end offset present now.
fn assign_bounded<P: Resolve>(
    consumer: &BaseConsumer<BridgeContext<P>>,
    partitions: &Partitions<P>,
    config: &RunConfig,
    count: i32,
) -> Result<(), BridgeError> {
    let timeout = Duration::from_secs(15);
    let topic = &config.input_topic;
    let mut tpl = TopicPartitionList::new();
    for p in 0..count {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl.clone(), timeout)
        .map_err(|e| {
            BridgeError::Start(format!("cannot read committed offsets of {topic}: {e}"))
        })?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..count {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout).map_err(|e| {
            BridgeError::Start(format!("cannot read the end offsets of {topic}: {e}"))
        })?;
        let start = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(rdkafka::Offset::Offset(o)) => o.max(low),
            _ => low,
        };
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Offset(start))
            .map_err(|e| BridgeError::Start(e.to_string()))?;
        tracing::info!(
            partition = p,
            start,
            end = high,
            "bounded run: reading up to the end offset present at start"
        );
        partitions.assign(p, Some(Bounds { start, end: high }));
    }
    consumer
        .assign(&assignment)
        .map_err(|e| BridgeError::Start(format!("cannot read {topic}: {e}")))
}

/// `WATCHBRIDGE_GUARANTEE`, with `auto` resolved against the broker (the embedded broker,
/// librdkafka's mock cluster, accepts transactions but cannot keep their promise: `auto`
/// picks `recovery` there without asking), and checked against the mode the group runs
/// (`kafka/group_mode.rs`): an instance of the other mode refuses to start. `auto`'s
/// questions are asked again until `deadline` while they fail for a transient reason.
async fn choose_guarantee(
    clients: &KafkaSettings,
    embedded: bool,
    config: &RunConfig,
    kafka: &KafkaContext,
    state_partitions: i32,
    deadline: Instant,
) -> Result<(Guarantee, Option<String>), BridgeError> {
    let fallback = Arc::new(Mutex::new(None));
    let chosen = match config.guarantee {
        GuaranteeSetting::Auto if embedded => Guarantee::Recovery,
        GuaranteeSetting::Fixed(g) if embedded => g,
        setting => {
            let plaintext = clients.is_plaintext();
            let brokers = clients.brokers.clone();
            let id = format!(
                "watchbridge-{}-probe-{}-{}",
                config.group_id,
                std::process::id(),
                Clock::system().now_ms()
            );
            let producer = clients.guarantee_probe_producer(&id);
            let (modes, consumer) = (
                clients.recovery_reader(Isolation::ReadCommitted),
                clients.guarantee_probe_reader(),
            );
            let (group, state_topic) = (config.group_id.clone(), config.state_topic.clone());
            let kafka = kafka.clone();
            let why = fallback.clone();
            let settled = tokio::task::spawn_blocking(move || {
                let runs = group_mode::read(&modes, &kafka, &group, &state_topic, state_partitions);
                group_mode::settle(setting, &runs, &group, &state_topic, || {
                    let (chosen, fell_back) =
                        guarantee::choose_auto(&brokers, plaintext, deadline, || {
                            guarantee::probe_transaction(
                                &producer,
                                &consumer,
                                kafka.clone(),
                                &state_topic,
                            )
                        })?;
                    *why.lock().unwrap_or_else(|p| p.into_inner()) = fell_back;
                    Ok(chosen)
                })
            })
            .await
            .map_err(|e| BridgeError::Start(format!("choosing the guarantee failed: {e}")))?
            .map_err(BridgeError::Start)?;
            if settled.adopted {
                tracing::info!(
                    guarantee = %settled.guarantee,
                    "WATCHBRIDGE_GUARANTEE=auto: the group runs this mode (recorded on its state topic); taking it"
                );
            }
            if !settled.switched_from.is_empty() {
                tracing::warn!(
                    from = ?settled.switched_from.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    to = %settled.guarantee,
                    "WATCHBRIDGE_GUARANTEE: the group ran another mode and has no member now; switching it"
                );
            }
            settled.guarantee
        }
    };
    tracing::info!(
        guarantee = %chosen,
        setting = ?config.guarantee,
        "WATCHBRIDGE_GUARANTEE"
    );
    let fallback = fallback.lock().unwrap_or_else(|p| p.into_inner()).take();
    Ok((chosen, fallback))
}

/// The exactly-once mode's producer settings (the bridge's `producer`'s, with the
/// transaction timeouts), transactional id prefix and group metadata.
async fn transaction_settings(
    clients: &KafkaSettings,
    config: &RunConfig,
    producer: &ProducerSettings,
) -> Result<TransactionSettings, BridgeError> {
    // Group metadata without a generation: fencing rests on the transactional id of the
    // input partition (see `kafka/partition/transaction.rs`).
    let group: BaseConsumer = clients
        .group_metadata_client()
        .create()
        .map_err(|e| BridgeError::Start(format!("cannot create a client: {e}")))?;
    let group = group.group_metadata().ok_or_else(|| {
        BridgeError::Start("librdkafka returned no consumer group metadata".into())
    })?;
    // A transaction must commit before the coordinator's timeout aborts it (and fences its
    // producer): the timeouts are fitted to the checkpoint interval, or the start fails
    // naming the settings (`kafka/transaction_timeout.rs`).
    let timeouts = fit_transaction_timeouts(clients, config, &producer.kafka).await?;
    let producer_config = clients.transactional_producer(&timeouts);
    tracing::info!(
        transaction_timeout_ms = timeouts.transaction.as_millis() as u64,
        message_timeout_ms = timeouts.message.as_millis() as u64,
        checkpoint_interval = %humantime::format_duration(config.checkpoint_interval),
        "transaction timeouts"
    );
    // A setting librdkafka refuses for a transactional producer fails the start here, not
    // every partition later.
    producer_config
        .clone()
        .set("transactional.id", "watchbridge-settings-check")
        .create::<rdkafka::producer::BaseProducer>()
        .map_err(|e| {
            BridgeError::Start(format!(
                "WATCHBRIDGE_GUARANTEE=exactly_once: the transactional producer's settings are \
                 refused: {e}"
            ))
        })?;
    Ok(TransactionSettings {
        producer: ProducerSettings {
            config: producer_config,
            ..producer.clone()
        },
        id_prefix: format!("watchbridge-{}-{}", config.group_id, config.input_topic),
        group: Arc::new(group),
    })
}

/// `transaction.timeout.ms` and `message.timeout.ms` for the checkpoint interval, from what
/// the user set (`KAFKA_*`) and the brokers' `transaction.max.timeout.ms` (when they say).
async fn fit_transaction_timeouts(
    clients: &KafkaSettings,
    config: &RunConfig,
    kafka: &KafkaContext,
) -> Result<TransactionTimeouts, BridgeError> {
    let set = |name: &str| -> Result<Option<Duration>, BridgeError> {
        clients
            .user_property(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|e| {
                        BridgeError::Start(format!(
                            "KAFKA_{}={v:?}: not a number of milliseconds ({e})",
                            name.to_ascii_uppercase().replace('.', "_")
                        ))
                    })
            })
            .transpose()
    };
    const MAX: &str = "transaction.max.timeout.ms";
    let described = broker_settings(clients, kafka, &[MAX])
        .await
        .and_then(|s| s.unknown.clone().map_or(Ok(s), Err));
    let broker_max = match described {
        Ok(settings) => settings.millis(MAX),
        Err(error) => {
            tracing::warn!(error, "cannot read the brokers' transaction.max.timeout.ms (DescribeConfigs); the transaction timeout is not checked against it");
            None
        }
    };
    TransactionTimeouts::fit(
        config.checkpoint_interval,
        set("transaction.timeout.ms")?,
        set("message.timeout.ms")?,
        broker_max,
    )
    .map_err(BridgeError::Start)
}

/// How long after a failed delivery its record may still commit on these brokers
/// ([`DeliveryWindow`]); logged, with where the figures came from.
async fn delivery_window(clients: &KafkaSettings, kafka: &KafkaContext) -> Duration {
    let names = [DeliveryWindow::BROKER_SESSION, DeliveryWindow::REPLICA_LAG];
    // Unknown brokers are taken for several (the longer wait).
    let settings = broker_settings(clients, kafka, &names)
        .await
        .unwrap_or_else(|error| BrokerSettings::unknown(2, error));
    if let Some(error) = &settings.unknown {
        tracing::warn!(error, "cannot read the brokers' replica.lag.time.max.ms and broker.session.timeout.ms (DescribeConfigs); a failed delivery waits out Kafka's defaults before its partition starts again");
    }
    let window = DeliveryWindow::of(&settings);
    tracing::info!(
        brokers = settings.brokers,
        window_ms = window.as_millis() as u64,
        "a partition whose delivery failed waits this long before it reads its outputs back"
    );
    window
}

/// The consumer's group timeouts: `session.timeout.ms` and `heartbeat.interval.ms`
/// (librdkafka's defaults unless `KAFKA_*` set them).
struct GroupTimeouts {
    session: Duration,
    heartbeat: Duration,
}

impl GroupTimeouts {
    fn of(consumer: &ClientConfig) -> Self {
        let millis = |key: &str, default: u64| {
            Duration::from_millis(
                consumer
                    .get(key)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default),
            )
        };
        Self {
            session: millis("session.timeout.ms", 45_000),
            // KIP-848's broker default (`group.consumer.heartbeat.interval.ms`).
            heartbeat: millis(
                "heartbeat.interval.ms",
                if uses_the_consumer_protocol(consumer) {
                    5_000
                } else {
                    3_000
                },
            ),
        }
    }
}

/// The lease that keeps a stalled instance from writing (`kafka::lease`), sized by the
/// consumer's group timeouts.
fn group_lease(consumer: &ClientConfig, metrics: &Arc<Metrics>) -> Arc<Lease> {
    let group = GroupTimeouts::of(consumer);
    Lease::start(group.session, group.heartbeat, metrics.clone())
}

/// How long a partition the group assigns waits for its previous owner's records, logged
/// when it waits at all (`DeliveryWindow::takeover`).
fn takeover_wait(consumer: &ClientConfig, delivery_window: Duration) -> Duration {
    let group = GroupTimeouts::of(consumer);
    let wait = DeliveryWindow::takeover(delivery_window, group.session, group.heartbeat);
    if !wait.is_zero() {
        tracing::info!(
            wait_ms = wait.as_millis() as u64,
            session_timeout_ms = group.session.as_millis() as u64,
            "a partition the group assigns waits this long before it reads its outputs back: \
             a previous owner that died may have records still settling on the brokers (a \
             session timeout of the delivery window plus a heartbeat or more, \
             KAFKA_SESSION_TIMEOUT_MS, makes it none)"
        );
    }
    wait
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

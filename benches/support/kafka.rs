//! Kafka pieces the end-to-end benchmarks share: topics, a producer with the bridge's
//! settings that waits for room instead of spinning, and the bridge's run settings.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use watchbridge::config::{Mode, RunArgs};
use watchbridge::pollers::builtin::{PollerArgs, PollerKind};
use watchbridge::pollers::http::HttpArgs;

use super::tansu_process::Storage;

/// Creates `name` with `partitions` partitions and waits until metadata shows them all
/// (Tansu never creates topics on its own).
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    create_topic_with(bootstrap, name, partitions, &[]).await
}

/// [`create_topic`] with topic settings (e.g. `cleanup.policy=compact` for a state topic,
/// which the bridge refuses without it).
pub async fn create_topic_with(
    bootstrap: &str,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("create a Kafka admin client");
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (key, value) in configs {
        topic = topic.set(key, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics([&topic], &options)
        .await
        .unwrap_or_else(|e| panic!("CreateTopics {name}: {e}"))
    {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => panic!("CreateTopics {topic}: {code}"),
        }
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("create a Kafka client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = consumer
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .ok()
            .and_then(|m| {
                m.topics()
                    .iter()
                    .find(|t| t.name() == name && t.error().is_none())
                    .map(|t| t.partitions().len() as i32)
            });
        if seen == Some(partitions) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {name}: metadata shows {seen:?} partitions after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bridge's producer settings (`KafkaSettings::output_producer`, src/kafka/clients.rs).
pub fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("create the producer")
}

/// Records handed to a producer whose deliveries are still to be checked, oldest first.
pub struct InFlight {
    what: &'static str,
    deliveries: VecDeque<DeliveryFuture>,
}

impl InFlight {
    pub fn new(what: &'static str) -> Self {
        InFlight {
            what,
            deliveries: VecDeque::new(),
        }
    }

    /// Hand one record to the producer. While its queue is full, wait for the oldest
    /// delivery (as the bridge waits for deliveries to make room), never spin.
    pub async fn send<'a>(
        &mut self,
        producer: &FutureProducer,
        mut record: FutureRecord<'a, str, [u8]>,
    ) {
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    self.deliveries.push_back(delivery);
                    return;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    match self.deliveries.pop_front() {
                        Some(oldest) => self.check(oldest.await),
                        None => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                Err((e, r)) => panic!("{}: produce to {}: {e}", self.what, r.topic),
            }
        }
    }

    pub fn check(
        &self,
        delivery: Result<OwnedDeliveryResult, futures::channel::oneshot::Canceled>,
    ) {
        match delivery {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => panic!("{}: a record was not delivered: {e}", self.what),
            Err(_) => panic!("{}: the producer went away", self.what),
        }
    }

    /// Wait until every record is acknowledged.
    pub async fn delivered(mut self) {
        while let Some(delivery) = self.deliveries.pop_front() {
            self.check(delivery.await);
        }
    }
}

/// The bridge's run settings for a bench run named `name` (its group and topics), with
/// `partitions` input partitions; change fields, then `check()` them as `watchbridge run`
/// does.
pub fn bridge_args(bootstrap: &str, name: &str, partitions: i32) -> RunArgs {
    RunArgs {
        brokers: Some(bootstrap.into()),
        group_id: name.to_string(),
        input_topic: format!("{name}.in"),
        output_topic: format!("{name}.out"),
        dlq_topic: None,
        watch_key: None,
        repartition: "never".into(),
        repartition_topic: None,
        formats: Default::default(),
        poll_interval: Duration::from_secs(10),
        retry_limit: "5".into(),
        retry_initial_backoff: Duration::from_secs(1),
        retry_max_backoff: Duration::from_secs(60),
        retry_after_max: None,
        poll_jitter: 0.1,
        backoff: "none".into(),
        termination: "never".into(),
        start_from: "earliest".into(),
        max_outputs_per_poll: None,
        max_in_flight: 256,
        input_hold_bytes: 16 << 20,
        host_rate: None,
        create_topics: true,
        partitions,
        replication_factor: 1,
        topic_config: None,
        shutdown_timeout: Duration::from_secs(10),
        start_timeout: Duration::from_secs(60),
        watermark_strategy: "bounded(5s)".into(),
        watermark_interval: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(30),
        watermark_topic: None,
        state_topic: None,
        finished_retention: Duration::from_secs(24 * 3600),
        checkpoint_interval: Duration::from_millis(500),
        // What the broker supports (Tansu: `recovery`, Apache Kafka: `exactly_once`); a bench
        // can set it, and `BENCH_GUARANTEE` overrides it (to compare the modes by hand).
        guarantee: std::env::var("BENCH_GUARANTEE").unwrap_or_else(|_| "auto".into()),
        output_headers: "none".into(),
        mode: Mode::Streaming,
        metrics_addr: "off".into(),
        admin_token: None,
        operations: watchbridge::config::OperationsArgs::off(),
        poller: PollerArgs {
            poller: PollerKind::Http,
            poll_timeout: Duration::from_secs(10),
            http: HttpArgs::defaults(),
            glob: Default::default(),
            sharded: Default::default(),
            object: Default::default(),
        },
    }
}

/// Writes the inputs `(key, value)` (a value as text or bytes) to `topic` and waits until all are acknowledged. Not
/// timed by any bench. On Tansu's memory storage each record is a batch of its own
/// (`batch.num.messages=1`): the bridge pauses a partition whose task is behind, librdkafka
/// resumes it from the next offset to hand out, and that storage returns nothing for a
/// fetch that starts inside a batch (the bridge would stall there;
/// ../shared/notes/tansu-0.6.md). On SQLite storage, which reads single-record batches
/// slowly, records are batched as usual.
pub async fn produce_inputs<V: AsRef<[u8]>>(
    bootstrap: &str,
    topic: &str,
    storage: Storage,
    inputs: impl Iterator<Item = (String, V)>,
) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all");
    if storage == Storage::Memory {
        config.set("batch.num.messages", "1").set("linger.ms", "0");
    } else {
        config.set("linger.ms", "5");
    }
    let producer: FutureProducer = config.create().expect("create the input producer");
    let mut in_flight = InFlight::new("inputs");
    for (key, value) in inputs {
        let record = FutureRecord::to(topic)
            .key(key.as_str())
            .payload(value.as_ref());
        in_flight.send(&producer, record).await;
    }
    in_flight.delivered().await;
}

/// The watch number of a bench input `{"id": n}`: what the benches' prepared pollers
/// resolve an input to.
pub fn input_id(value: &serde_json::Value) -> Result<usize, watchbridge::pollers::RenderError> {
    value
        .get("id")
        .and_then(serde_json::Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| watchbridge::pollers::RenderError::Missing("/id".into()))
}

/// The versus benches' topics for a job named `id`: `{id}.in` and `{id}.out` with
/// `partitions` partitions each, and on `{id}.in` one input `{"id": n}` (key `n`) per watch,
/// all acknowledged. Not timed.
pub async fn watch_inputs(
    bootstrap: &str,
    id: &str,
    partitions: i32,
    watches: usize,
    storage: Storage,
) {
    let input = format!("{id}.in");
    create_topic(bootstrap, &input, partitions).await;
    create_topic(bootstrap, &format!("{id}.out"), partitions).await;
    produce_inputs(
        bootstrap,
        &input,
        storage,
        (0..watches).map(|n| (n.to_string(), format!(r#"{{"id": {n}}}"#))),
    )
    .await;
}

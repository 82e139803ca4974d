//! `watchbridge demo`: the real bridge end to end, with nothing to set up.
//!
//! All in this process, each part the real thing: the embedded Kafka broker with topics
//! `demo.users` (4 partitions), `demo.events` and `demo.users.dlq`; a local HTTP API with one
//! growing event feed per user (`feeds.rs`); a producer writing "new user" records — and two
//! bad ones — to `demo.users`; the bridge ([`run_bridge`] with the HTTP poller, as
//! `watchbridge run` runs it); and a consumer reading `demo.events` and the dead-letter topic
//! back (`tally.rs`) for the live view and the closing checks (`view.rs`). With
//! `WATCHBRIDGE_OUTPUT_FORMAT=avro` and no `WATCHBRIDGE_SCHEMA_REGISTRY_URL`, an embedded
//! schema registry too (`crate::avro::registry_server`), and the view decodes the Avro
//! outputs (`outputs.rs`). It ends once every input's watch has ended and everything
//! produced has been read back, or on Ctrl-C.

mod endings;
mod feeds;
mod outputs;
mod tally;
mod view;

pub use endings::Endings;

use crate::avro::registry_server::RegistryServer;
use crate::bridge::{run_bridge, stop_on_signals, StopSignal};
pub use crate::config::DemoArgs;
use crate::config::{Mode, RunArgs, RunConfig};
use crate::config_error::ConfigError;
use crate::formats::{FormatArgs, OutputFormat};
use crate::kafka::embedded::EmbeddedBroker;
use crate::metrics::Metrics;
use crate::pollers::builtin::{PollerArgs, PollerKind};
use crate::pollers::http::{HttpArgs, HttpConfig, HttpPoller};
use feeds::{Feed, FeedServer, Feeds};
use outputs::OutputValues;
use prometheus::core::Collector;
use prometheus::IntCounterVec;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally::{Reader, Tally};
use view::{Status, UserRow, View};

pub const USERS_TOPIC: &str = "demo.users";
pub const EVENTS_TOPIC: &str = "demo.events";
pub const DLQ_TOPIC: &str = "demo.users.dlq";
const PARTITIONS: i32 = 4;

/// Inputs that cannot become watches, to show the dead-letter topic: one is not JSON, the
/// other has no `id` for the URL template (key, value).
const BAD_INPUTS: [(&str, &str); 2] = [
    ("bad-1", "{not json"),
    ("bad-2", r#"{"name": "Nobody", "note": "no id field"}"#),
];

/// The inputs are spread over this long, so watches start at different times.
const PRODUCE_OVER: Duration = Duration::from_secs(2);

/// How often the view is refreshed and the end condition checked.
const TICK: Duration = Duration::from_millis(500);

/// How long the inputs wait for the bridge to be assigned its partitions.
const WAIT_FOR_BRIDGE: Duration = Duration::from_secs(20);

/// After the bridge stops, how long to wait for the last records to be read back.
const DRAIN_FOR: Duration = Duration::from_secs(3);

const NAMES: [&str; 8] = [
    "Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Radia",
];

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A setting is wrong (exit code 2); the message names its variable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Failed(String),
}

fn failed(what: &str, error: impl std::fmt::Display) -> DemoError {
    DemoError::Failed(format!("{what}: {error}"))
}

/// Run the demo. `Ok(false)`: it ran, but a check on what was read back failed (the
/// summary says which).
pub fn run(args: &DemoArgs, endings: Endings) -> Result<bool, DemoError> {
    // Settings first, so a bad one is reported before anything starts (but the embedded
    // registry, whose address is one of them).
    let mut formats = FormatArgs::from_env()
        .map_err(|e| ConfigError::new("WATCHBRIDGE_OUTPUT_FORMAT", e.to_string()))?;
    let runtime =
        tokio::runtime::Runtime::new().map_err(|e| failed("cannot start the async runtime", e))?;
    // Avro outputs are registered in a schema registry: the user's, or, as the broker is,
    // an embedded one on this runtime. Declared after the runtime, so dropped before it.
    let registry = match (formats.output_format, &formats.schema_registry_url) {
        (OutputFormat::Avro, None) => {
            let _entered = runtime.enter();
            let server = RegistryServer::start(([127, 0, 0, 1], 0).into())
                .map_err(|e| failed("cannot start the embedded schema registry", e))?;
            formats.schema_registry_url = Some(server.url());
            Some(server)
        }
        _ => None,
    };
    let config = bridge_config(args, formats)?;
    runtime.block_on(run_async(args, config, registry.is_some(), endings))
}

/// The bridge's settings, as `watchbridge run` would check them. Of the formats, only the
/// output format matters here (the inputs are the demo's own JSON).
fn bridge_config(args: &DemoArgs, formats: FormatArgs) -> Result<RunConfig, ConfigError> {
    let run = RunArgs {
        // The demo's own embedded broker (started by the demo, whose address it is given).
        brokers: Some(crate::config::EMBEDDED.into()),
        group_id: "watchbridge-demo".into(),
        input_topic: USERS_TOPIC.into(),
        output_topic: EVENTS_TOPIC.into(),
        dlq_topic: Some(DLQ_TOPIC.into()),
        watch_key: None,
        repartition: "never".into(),
        repartition_topic: None,
        formats,
        poll_interval: args.poll_interval,
        // Retries at the pace of polling (production waits seconds to minutes), so the user
        // whose feed does not exist ends `failed` within the run instead of as `stable`.
        retry_limit: "3".into(),
        retry_initial_backoff: (args.poll_interval / 2).max(Duration::from_millis(1)),
        retry_max_backoff: args.poll_interval.saturating_mul(2),
        retry_after_max: None,
        poll_jitter: 0.1,
        // Quiet feeds are polled at the interval: the demo shows what each poll finds.
        backoff: "none".into(),
        termination: args.termination.clone(),
        start_from: "earliest".into(),
        max_outputs_per_poll: None,
        max_in_flight: args.max_in_flight,
        input_hold_bytes: 16 << 20,
        host_rate: args.host_rate,
        create_topics: true,
        partitions: PARTITIONS,
        replication_factor: 1,
        topic_config: None,
        shutdown_timeout: Duration::from_secs(10),
        // The embedded broker is up at once; what may not be is a schema registry (the
        // output schema is registered before the bridge starts): fail within the run.
        start_timeout: Duration::from_secs(20),
        watermark_strategy: "bounded(2s)".into(),
        watermark_interval: Duration::from_millis(200),
        // Short, so the view shows partitions going idle within the run.
        idle_timeout: Duration::from_secs(5),
        watermark_topic: None,
        state_topic: None,
        finished_retention: Duration::from_secs(24 * 3600),
        checkpoint_interval: Duration::from_millis(500),
        // The embedded broker cannot keep a transaction's promise.
        guarantee: "recovery".into(),
        // The readable headers too: the view counts outputs by their key and shows their
        // latency from their first-seen time.
        output_headers: "output_key,first_seen".into(),
        mode: Mode::Streaming,
        // The demo prints its metrics itself (`--metrics`); no port to collide with a bridge.
        metrics_addr: "off".into(),
        admin_token: None,
        operations: crate::config::OperationsArgs::off(),
        poller: PollerArgs {
            poller: PollerKind::Http,
            poll_timeout: args.poll_timeout,
            http: HttpArgs::defaults(),
            glob: Default::default(),
            sharded: Default::default(),
            object: Default::default(),
        },
    };
    // No `KAFKA_*` from the environment: they are for a real cluster, not the embedded one.
    run.check(std::iter::empty())
}

/// The HTTP poller pointed at the demo's feeds (fixed: the feeds' shape is the demo's).
fn http_config(url: &str, timeout: Duration) -> Result<HttpConfig, ConfigError> {
    let mut c = HttpConfig::new(url)?;
    c.items = "/events".into();
    c.item_key = "/id".into();
    c.item_time = Some("/at".into());
    c.complete = Some("/done".into());
    c.timeout = timeout;
    Ok(c)
}

/// What the outputs are written as, for the startup lines and the summary: `JSON`, or
/// `Avro (the envelope), subject …, embedded schema registry <url>`.
fn describe_outputs(config: &RunConfig, embedded_registry: bool) -> String {
    let formats = &config.formats;
    let Some(registry) = formats
        .registry
        .as_ref()
        .filter(|_| formats.output_format == OutputFormat::Avro)
    else {
        return "JSON".into();
    };
    let schema = formats.avro_output_schema().ok();
    let subject = schema
        .as_ref()
        .and_then(|(s, _)| {
            formats
                .output_subject_strategy
                .subject(EVENTS_TOPIC, s)
                .ok()
        })
        .unwrap_or_default();
    format!(
        "Avro ({}), subject {subject}, {} schema registry {}",
        match schema {
            Some((_, true)) => "WATCHBRIDGE_OUTPUT_SCHEMA",
            _ => "the envelope",
        },
        if embedded_registry { "embedded" } else { "the" },
        crate::logging::url(registry.url.as_str())
    )
}

async fn run_async(
    args: &DemoArgs,
    config: RunConfig,
    embedded_registry: bool,
    endings: Endings,
) -> Result<bool, DemoError> {
    let began = Instant::now();
    // Declared first so it is dropped last, after every client of it.
    let broker = EmbeddedBroker::start().map_err(DemoError::Failed)?;
    // The embedded broker takes no CreateTopics from the admin API: create them here.
    for topic in [USERS_TOPIC, EVENTS_TOPIC, DLQ_TOPIC] {
        broker
            .create_topic(topic, PARTITIONS)
            .map_err(|e| failed(&format!("cannot create topic {topic}"), e))?;
    }
    let brokers = broker.bootstrap();
    let plan = feeds::plan(args.users, args.seed);
    let server = FeedServer::start(plan.clone())
        .await
        .map_err(|e| failed("cannot start the feeds' HTTP server", e))?;
    let url = format!("{}/users/{{/id}}/events", server.base_url());
    let poller = Arc::new(HttpPoller::new(http_config(&url, config.poll_timeout)?)?);
    let values = OutputValues::new(&config.formats).map_err(DemoError::Failed)?;
    let reader = Reader::assign(&brokers, EVENTS_TOPIC, DLQ_TOPIC, PARTITIONS, values)
        .map_err(DemoError::Failed)?;
    let outputs = describe_outputs(&config, embedded_registry);
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(StopSignal::default());
    stop_on_signals(stop.clone());

    println!("watchbridge demo: the real bridge, end to end, in this process (Ctrl-C stops it)");
    println!(
        "  kafka   embedded broker {brokers}: {USERS_TOPIC} ({PARTITIONS} partitions) → {EVENTS_TOPIC}, {DLQ_TOPIC}"
    );
    println!(
        "  inputs  {} \"new user\" records and {} bad ones, over {}s once the bridge has joined",
        args.users,
        BAD_INPUTS.len(),
        PRODUCE_OVER.as_secs()
    );
    println!(
        "  bridge  polls {url} every {}; a watch ends when its feed says done, or on {}",
        humantime::format_duration(config.rules.schedule.interval),
        config.rules.termination
    );
    println!("  outputs {outputs}");
    println!("  view    reads {EVENTS_TOPIC} and {DLQ_TOPIC} back from Kafka as they fill\n");

    let bridge = run_bridge(
        &brokers,
        Some(&broker),
        &config,
        poller,
        metrics.clone(),
        stop.clone(),
    );
    tokio::pin!(bridge);
    let users: Vec<String> = plan.iter().map(|f| f.user.clone()).collect();
    let feeds = server.feeds();
    let mut producer = Some(tokio::spawn(produce_inputs(
        brokers.clone(),
        users,
        feeds.clone(),
        metrics.clone(),
    )));
    let expected = u64::from(args.users) + BAD_INPUTS.len() as u64;
    let snapshot = |tally: &Tally| status(began, &metrics, tally, &endings, &feeds, &plan);
    let mut tally = Tally::default();
    let mut view = View::new();
    let mut tick = tokio::time::interval(TICK);
    let mut bridge_result = None;
    let mut failure = None;
    loop {
        tokio::select! {
            // Returns early only if it could not start (it runs until `stop` otherwise).
            result = &mut bridge => {
                bridge_result = Some(result);
                break;
            }
            message = reader.recv() => match message {
                Ok(m) => tally.record(&reader, &m).await,
                Err(e) => tracing::warn!(error = %e, "reading the demo topics"),
            },
            _ = tick.tick() => {
                let now = snapshot(&tally);
                view.update(&now);
                if let Some(p) = producer.take_if(|p| p.is_finished()) {
                    match p.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => failure = Some(e),
                        Err(e) => failure = Some(format!("the input producer failed: {e}")),
                    }
                }
                if failure.is_some() || stop.is_stopped() || finished(&now, expected) {
                    break;
                }
            }
        }
    }
    let interrupted = stop.is_stopped();
    stop.stop();
    let bridge_result = match bridge_result {
        Some(r) => r,
        None => bridge.await,
    };
    if let Err(e) = bridge_result {
        return Err(DemoError::Failed(format!("the bridge failed: {e}")));
    }
    if let Some(e) = failure {
        return Err(DemoError::Failed(e));
    }
    // The bridge flushed its producer on stopping; read back what is still on its way.
    let deadline = tokio::time::Instant::now() + DRAIN_FOR;
    while tally.outputs < metrics.outputs_produced.get()
        || (tally.dead_letters.len() as u64) < inputs_dead_lettered(&metrics)
    {
        match tokio::time::timeout_at(deadline, reader.recv()).await {
            Ok(Ok(m)) => tally.record(&reader, &m).await,
            Ok(Err(e)) => tracing::warn!(error = %e, "reading the demo topics"),
            Err(_) => break,
        }
    }
    let mut last = snapshot(&tally);
    // A stopping bridge stops its watches without reporting them as ended (they did not
    // finish); say so rather than leave them `polling`.
    for user in &mut last.users {
        if user.state == "polling" {
            user.state = "stopped".into();
        }
    }
    view.finish(&last);
    let (summary, ok) = view::summary(&last, &tally, &outputs, interrupted);
    print!("{summary}");
    if args.metrics {
        println!("\n{}", metrics.render());
    }
    Ok(ok)
}

/// Every input became a watch or a dead letter, every watch ended, and everything the
/// bridge produced has been read back.
fn finished(s: &Status, inputs: u64) -> bool {
    s.inputs >= inputs
        && s.started + s.dead_lettered_total() >= inputs
        && s.active == 0
        && s.ended_total() >= s.started
        && s.emitted == s.produced
        && s.read >= s.produced
        && s.dlq_read >= s.dead_lettered_total()
}

/// Write one "new user" record per user to `demo.users`, keyed by the user (so a user's
/// records stay on one partition), spread over [`PRODUCE_OVER`] with the bad ones among
/// them — as a sign-up service would; each user's feed starts as their record is written.
/// It waits until the bridge owns its partitions (joining the consumer group takes a few
/// seconds), so the feeds grow while they are watched rather than before.
async fn produce_inputs(
    brokers: String,
    users: Vec<String>,
    feeds: Feeds,
    metrics: Arc<Metrics>,
) -> Result<(), String> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "0")
        .create()
        .map_err(|e| format!("cannot create the input producer: {e}"))?;
    let mut records: Vec<(String, String)> = users
        .iter()
        .enumerate()
        .map(|(i, user)| {
            let value = serde_json::json!({
                "id": user,
                "name": NAMES[i % NAMES.len()],
                "plan": if i % 3 == 0 { "pro" } else { "free" },
            });
            (user.clone(), value.to_string())
        })
        .collect();
    let n = records.len();
    for (at, (key, value)) in [2 * n / 3, n / 3].into_iter().zip(BAD_INPUTS) {
        records.insert(at, (key.into(), value.into()));
    }
    let waiting_since = Instant::now();
    while metrics.partitions_assigned.get() == 0 && waiting_since.elapsed() < WAIT_FOR_BRIDGE {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gap = PRODUCE_OVER / records.len() as u32;
    for (key, value) in &records {
        feeds.sign_up(key);
        let record = FutureRecord::to(USERS_TOPIC).key(key).payload(value);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| format!("cannot produce to {USERS_TOPIC}: {e}"))?;
        tokio::time::sleep(gap).await;
    }
    Ok(())
}

fn status(
    began: Instant,
    m: &Metrics,
    tally: &Tally,
    endings: &Endings,
    feeds: &Feeds,
    plan: &[Feed],
) -> Status {
    let users = plan
        .iter()
        .map(|feed| {
            let served = feeds.served(&feed.user);
            let state = endings.get(&feed.user).unwrap_or_else(|| {
                if served.requests > 0 {
                    "polling"
                } else {
                    "waiting"
                }
                .into()
            });
            UserRow {
                user: feed.user.clone(),
                outputs: tally.per_user.get(&feed.user).copied().unwrap_or(0),
                state,
                served,
                feed: feed.describe(),
            }
        })
        .collect();
    Status {
        elapsed: began.elapsed(),
        // Inputs read: it had joined, even once stopping has released its partitions.
        joined: m.partitions_assigned.get() > 0 || m.inputs_consumed.get() > 0,
        inputs: m.inputs_consumed.get(),
        started: m.watches_started.get(),
        dead_lettered: by_label(&m.inputs_dead_lettered, "reason"),
        active: m.watches_active.get(),
        ended: by_label(&m.watches_terminated, "reason"),
        emitted: m.outputs_emitted.get(),
        produced: m.outputs_produced.get(),
        read: tally.outputs,
        dlq_read: tally.dead_letters.len() as u64,
        duplicates: m.duplicates_suppressed.get(),
        polls_ok: m.polls_ok.get(),
        // The `ok` series has an empty `error` label, so only failures are listed.
        polls_failed: by_label(&m.polls_error, "error"),
        watermark: m.watermark.get().map(seconds_to_ms),
        partition_watermarks: partition_watermarks(m),
        users,
    }
}

fn inputs_dead_lettered(m: &Metrics) -> u64 {
    by_label(&m.inputs_dead_lettered, "reason").values().sum()
}

/// A counter's non-zero series, summed by one label (empty label values left out).
/// Each input partition's published watermark, by partition number.
fn partition_watermarks(m: &Metrics) -> BTreeMap<i32, i64> {
    let mut out = BTreeMap::new();
    for family in m.partition_watermark.collect() {
        for metric in family.get_metric() {
            let partition = metric
                .get_label()
                .iter()
                .find(|l| l.name() == "partition")
                .and_then(|l| l.value().parse().ok());
            if let Some(p) = partition {
                out.insert(p, seconds_to_ms(metric.get_gauge().get_value()));
            }
        }
    }
    out
}

/// A watermark gauge (Unix seconds; `+Inf` at the end of input) back in epoch ms.
fn seconds_to_ms(seconds: f64) -> i64 {
    (seconds * 1000.0).round() as i64
}

fn by_label(counter: &IntCounterVec, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in counter.collect() {
        for metric in family.get_metric() {
            let value = metric.get_counter().get_value() as u64;
            let name = metric
                .get_label()
                .iter()
                .find(|l| l.name() == label)
                .map(|l| l.value())
                .unwrap_or_default();
            if value > 0 && !name.is_empty() {
                *out.entry(name.to_string()).or_default() += value;
            }
        }
    }
    out
}

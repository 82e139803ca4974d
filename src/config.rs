//! `watchbridge run`'s settings: every one an environment variable and a flag, listed with
//! its default by `--help`. Each flag's value name is its variable, so clap's own errors
//! (a missing or unparsable value) name the variable too; the checks clap cannot do are in
//! [`RunArgs::check`], whose errors do the same.

pub mod check;
mod demo_args;
pub mod effective;
pub mod help;
pub mod known;
pub use demo_args::DemoArgs;
mod operations;

use crate::catch_up::{CatchUp, StartFrom};
pub use crate::kafka::env::{kafka_properties, KafkaProperties};
pub use operations::{OperationsArgs, OperationsConfig};

use crate::config_error::ConfigError;
use crate::kafka::guarantee::GuaranteeSetting;
use crate::kafka::records::OutputHeaders;
use crate::limits::HostRate;
use crate::pollers::builtin::PollerArgs;
use crate::schedule::{Backoff, Retry, Schedule};
use crate::termination::Termination;
use crate::watch::WatchRules;
use crate::watermark::WatermarkStrategy;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Kafka bootstrap servers (host:port,…), or `embedded`: an in-process broker that keeps
    /// nothing, for trying watchbridge out. Required: unset fails the start, so a
    /// deployment that lost the variable cannot run on a broker that forgets everything.
    #[arg(long, env = "WATCHBRIDGE_BROKERS", value_name = "WATCHBRIDGE_BROKERS")]
    pub brokers: Option<String>,
    /// Consumer group of the input topic; instances in one group share its partitions.
    #[arg(
        long,
        env = "WATCHBRIDGE_GROUP_ID",
        value_name = "WATCHBRIDGE_GROUP_ID",
        default_value = "watchbridge"
    )]
    pub group_id: String,
    /// Topic whose records start watches.
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_TOPIC",
        value_name = "WATCHBRIDGE_INPUT_TOPIC"
    )]
    pub input_topic: String,
    /// Topic that receives one record per new output.
    #[arg(
        long,
        env = "WATCHBRIDGE_OUTPUT_TOPIC",
        value_name = "WATCHBRIDGE_OUTPUT_TOPIC"
    )]
    pub output_topic: String,
    /// Topic for inputs that cannot be watched and records that cannot be delivered
    /// (default: `<input topic>.dlq`).
    #[arg(
        long,
        env = "WATCHBRIDGE_DLQ_TOPIC",
        value_name = "WATCHBRIDGE_DLQ_TOPIC"
    )]
    pub dlq_topic: Option<String>,
    /// JSON pointer to the watch key in the input value (default: the record key). With it,
    /// the inputs go through the repartition topic first (WATCHBRIDGE_REPARTITION), so that
    /// one watch key is one watch whichever input partition its inputs arrive on.
    #[arg(
        long,
        env = "WATCHBRIDGE_WATCH_KEY",
        value_name = "WATCHBRIDGE_WATCH_KEY"
    )]
    pub watch_key: Option<String>,
    /// Whether inputs go through the repartition topic, keyed by their watch key, before
    /// their watches start: `auto` (when WATCHBRIDGE_WATCH_KEY is set), `always`, or `never`
    /// (the input records are keyed by the watch key already: the same watch key on two
    /// input partitions would start two watches, warned and counted).
    #[arg(
        long,
        env = "WATCHBRIDGE_REPARTITION",
        value_name = "WATCHBRIDGE_REPARTITION",
        default_value = "auto"
    )]
    pub repartition: String,
    /// The repartition topic (default: `<group>.repartition`), created with the input
    /// topic's partition count.
    #[arg(
        long,
        env = "WATCHBRIDGE_REPARTITION_TOPIC",
        value_name = "WATCHBRIDGE_REPARTITION_TOPIC"
    )]
    pub repartition_topic: Option<String>,
    /// Time between polls of one watch (humantime: 500ms, 10s, 1m).
    #[arg(long, env = "WATCHBRIDGE_POLL_INTERVAL", value_name = "WATCHBRIDGE_POLL_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// Failed polls in a row that are retried before a watch ends `failed`: a number (`0`:
    /// fail on the first error), a duration (as many retries as the backoff takes to span
    /// it, e.g. `10m`), or `unlimited`. The default, an hour, outlasts an ordinary outage
    /// of the resource.
    #[arg(
        long,
        env = "WATCHBRIDGE_RETRY_LIMIT",
        value_name = "WATCHBRIDGE_RETRY_LIMIT",
        default_value = "1h"
    )]
    pub retry_limit: String,
    /// Delay before the first retry of a failed poll; it doubles with each further failure
    /// in a row.
    #[arg(long, env = "WATCHBRIDGE_RETRY_INITIAL_BACKOFF", value_name = "WATCHBRIDGE_RETRY_INITIAL_BACKOFF", default_value = "1s", value_parser = humantime::parse_duration)]
    pub retry_initial_backoff: Duration,
    /// Longest delay between two retries (a resource's `Retry-After` may ask for longer).
    #[arg(long, env = "WATCHBRIDGE_RETRY_MAX_BACKOFF", value_name = "WATCHBRIDGE_RETRY_MAX_BACKOFF", default_value = "60s", value_parser = humantime::parse_duration)]
    pub retry_max_backoff: Duration,
    /// Longest wait a resource's `Retry-After` (seconds or HTTP date) can impose before the
    /// next poll; a longer one is cut to this, so a resource cannot park a watch for years
    /// (`0s`: ignore `Retry-After`). Default: WATCHBRIDGE_RETRY_MAX_BACKOFF.
    #[arg(long, env = "WATCHBRIDGE_RETRY_AFTER_MAX", value_name = "WATCHBRIDGE_RETRY_AFTER_MAX", value_parser = humantime::parse_duration)]
    pub retry_after_max: Option<Duration>,
    /// Fraction by which every delay before a poll, retries included, is randomly moved
    /// both ways (`0.1`: 10 s becomes 9 to 11 s), so that watches started together do not
    /// poll together; from 0 (none) to below 1.
    #[arg(
        long,
        env = "WATCHBRIDGE_POLL_JITTER",
        value_name = "WATCHBRIDGE_POLL_JITTER",
        default_value_t = 0.1
    )]
    pub poll_jitter: f64,
    /// How quiet polls are spaced: `none` (every WATCHBRIDGE_POLL_INTERVAL), or a factor
    /// and a max, `<factor>x,<max>`: `2x,10m` doubles the delay after each poll in a row
    /// that brings nothing new, up to 10 minutes, and the first new output brings it back
    /// to the interval. A resource that rarely changes is then asked less often, without
    /// slowing the reaction to one that is busy.
    #[arg(
        long,
        env = "WATCHBRIDGE_BACKOFF",
        value_name = "WATCHBRIDGE_BACKOFF",
        default_value = "none"
    )]
    pub backoff: String,
    /// When a watch ends besides the poller saying "final", e.g. `any(total(1h), stable(10m))`.
    #[arg(
        long,
        env = "WATCHBRIDGE_TERMINATION",
        value_name = "WATCHBRIDGE_TERMINATION",
        default_value = "never"
    )]
    pub termination: String,
    /// Where a new watch starts: `earliest` (everything its resource shows is new) or `now`
    /// (its first successful poll's items are recorded as seen, not emitted).
    #[arg(
        long,
        env = "WATCHBRIDGE_START_FROM",
        value_name = "WATCHBRIDGE_START_FROM",
        default_value = "earliest"
    )]
    pub start_from: String,
    /// Most new outputs one poll of a watch emits (the earliest by event time); the rest
    /// wait for its next polls. Unset: all of them.
    #[arg(
        long,
        env = "WATCHBRIDGE_MAX_OUTPUTS_PER_POLL",
        value_name = "WATCHBRIDGE_MAX_OUTPUTS_PER_POLL"
    )]
    pub max_outputs_per_poll: Option<std::num::NonZeroUsize>,
    /// Most polls in flight at once, over all partitions; a poll counts until its new
    /// outputs are handed to the producer.
    #[arg(
        long,
        env = "WATCHBRIDGE_MAX_IN_FLIGHT",
        value_name = "WATCHBRIDGE_MAX_IN_FLIGHT",
        default_value_t = 256
    )]
    pub max_in_flight: usize,
    /// How many bytes of a partition's inputs the consumer holds for a partition task that
    /// is behind before it pauses the partition (a pause makes librdkafka fetch again what
    /// it had read ahead). More holds more memory; less re-reads more.
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_HOLD_BYTES",
        value_name = "WATCHBRIDGE_INPUT_HOLD_BYTES",
        default_value_t = 16 << 20
    )]
    pub input_hold_bytes: usize,
    /// Most polls per second to one host from the whole group (each instance takes the share
    /// of the input partitions it owns; unset: no limit); bursts up to the same number.
    #[arg(
        long,
        env = "WATCHBRIDGE_HOST_RATE",
        value_name = "WATCHBRIDGE_HOST_RATE"
    )]
    pub host_rate: Option<NonZeroU32>,
    /// Create the input, output and dead-letter topics when they do not exist.
    #[arg(long, env = "WATCHBRIDGE_CREATE_TOPICS", value_name = "WATCHBRIDGE_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub create_topics: bool,
    /// Partitions of an input topic the bridge creates (output and dead-letter topics it
    /// creates get as many as the input topic has).
    #[arg(
        long,
        env = "WATCHBRIDGE_PARTITIONS",
        value_name = "WATCHBRIDGE_PARTITIONS",
        default_value_t = 4
    )]
    pub partitions: i32,
    /// Replication factor of topics the bridge creates: `-1` (the broker's
    /// `default.replication.factor`; where a broker refuses `-1`, 1, said in the log) or a
    /// number.
    #[arg(
        long,
        env = "WATCHBRIDGE_REPLICATION_FACTOR",
        value_name = "WATCHBRIDGE_REPLICATION_FACTOR",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub replication_factor: i32,
    /// Topic configs for every topic the bridge creates, as comma-separated `key=value`
    /// (e.g. `min.insync.replicas=2,retention.ms=604800000`); the bridge's own configs of a
    /// topic (`cleanup.policy=compact` for the state and watermark topics) win over them.
    #[arg(
        long,
        env = "WATCHBRIDGE_TOPIC_CONFIG",
        value_name = "WATCHBRIDGE_TOPIC_CONFIG"
    )]
    pub topic_config: Option<String>,
    /// How long shutdown (SIGTERM, Ctrl-C) may take to finish polls, deliver and commit;
    /// the process ends within it plus 5 s whatever the brokers do.
    #[arg(long, env = "WATCHBRIDGE_SHUTDOWN_TIMEOUT", value_name = "WATCHBRIDGE_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
    /// How long the start waits for the brokers to answer (trying again with backoff)
    /// before it gives up.
    #[arg(long, env = "WATCHBRIDGE_START_TIMEOUT", value_name = "WATCHBRIDGE_START_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub start_timeout: Duration,
    /// How input records drive each partition's watermark: `bounded(5s)` (the largest
    /// record timestamp seen minus 5 s), `monotonic`, or `none`.
    #[arg(
        long,
        env = "WATCHBRIDGE_WATERMARK_STRATEGY",
        value_name = "WATCHBRIDGE_WATERMARK_STRATEGY",
        default_value = "bounded(5s)"
    )]
    pub watermark_strategy: String,
    /// How often watermarks are published (only when a value changed).
    #[arg(long, env = "WATCHBRIDGE_WATERMARK_INTERVAL", value_name = "WATCHBRIDGE_WATERMARK_INTERVAL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub watermark_interval: Duration,
    /// A partition without input records for this long stops holding its watermark back
    /// (and, once its watches have ended, the merged watermark).
    #[arg(long, env = "WATCHBRIDGE_IDLE_TIMEOUT", value_name = "WATCHBRIDGE_IDLE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Topic of the watermark records (default: `<output topic>.watermarks`).
    #[arg(
        long,
        env = "WATCHBRIDGE_WATERMARK_TOPIC",
        value_name = "WATCHBRIDGE_WATERMARK_TOPIC"
    )]
    pub watermark_topic: Option<String>,
    /// Topic of the durable watch state (default: `<group id>.state`): compacted, with as
    /// many partitions as the input topic.
    #[arg(
        long,
        env = "WATCHBRIDGE_STATE_TOPIC",
        value_name = "WATCHBRIDGE_STATE_TOPIC"
    )]
    pub state_topic: Option<String>,
    /// How long a finished watch is remembered, so that its input, delivered again, does not
    /// start it again (a week, Kafka's default topic retention: an input replayed from the input topic does
    /// not start its finished watch again).
    #[arg(long, env = "WATCHBRIDGE_FINISHED_RETENTION", value_name = "WATCHBRIDGE_FINISHED_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub finished_retention: Duration,
    /// How often each partition writes what changed to the state topic. Shorter: inputs are
    /// committed sooner, and a recovery reads back fewer outputs; longer: fewer, larger
    /// state writes.
    #[arg(long, env = "WATCHBRIDGE_CHECKPOINT_INTERVAL", value_name = "WATCHBRIDGE_CHECKPOINT_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub checkpoint_interval: Duration,
    /// What a crash, a rebalance or a stalled instance may do to the outputs: `exactly_once`
    /// (transactions: outputs, state and input offsets commit together, a stalled instance
    /// is fenced; consumers read `read_committed`), `recovery` (exactly once by recovery
    /// from the state and output topics, on any broker), `at_least_once` (a crash may emit
    /// again what followed the last checkpoint), or `auto`: the mode the group runs, else
    /// `exactly_once` where the broker supports transactions, else `recovery`. An instance
    /// of the other mode than its running group's refuses to start.
    #[arg(
        long,
        env = "WATCHBRIDGE_GUARANTEE",
        value_name = "WATCHBRIDGE_GUARANTEE",
        default_value = "auto"
    )]
    pub guarantee: String,
    /// Readable headers on every output (by default none; `wb-id` where a recovery cannot
    /// tell outputs apart by their partition and value):
    /// `none`, `all`, or a comma-separated list of `output_key` (the output's identity),
    /// `input_partition`, `first_seen` (processing time, ms). Each costs throughput.
    #[arg(
        long,
        env = "WATCHBRIDGE_OUTPUT_HEADERS",
        value_name = "WATCHBRIDGE_OUTPUT_HEADERS",
        default_value = "none"
    )]
    pub output_headers: String,
    /// `streaming` (run until stopped) or `bounded` (read the input up to its end at start,
    /// run every watch to its end, publish a final watermark, exit).
    #[arg(long, env = "WATCHBRIDGE_MODE", value_name = "WATCHBRIDGE_MODE", value_enum, default_value_t = Mode::Streaming)]
    pub mode: Mode,
    /// Where to serve `/metrics` (Prometheus), `/healthz` and `/readyz`, as host:port; `off`
    /// for no server.
    #[arg(
        long,
        env = "WATCHBRIDGE_METRICS_ADDR",
        value_name = "WATCHBRIDGE_METRICS_ADDR",
        default_value = "0.0.0.0:9898"
    )]
    pub metrics_addr: String,
    /// The token the operations server's control requests (`POST /watches/{key}/stop`,
    /// `POST /pause`, `POST /resume`) must carry as `Authorization: Bearer <token>`. Unset:
    /// no control request is taken (the read-only `GET` requests are, without a token).
    #[arg(
        long,
        env = "WATCHBRIDGE_ADMIN_TOKEN",
        value_name = "WATCHBRIDGE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<crate::pollers::http::config::Redacted>,
    #[command(flatten)]
    pub operations: OperationsArgs,
    #[command(flatten)]
    pub formats: crate::formats::FormatArgs,
    #[command(flatten)]
    pub poller: PollerArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Run until stopped.
    #[default]
    Streaming,
    /// Read the input topic up to the end offsets present at start, run every watch to
    /// termination, publish a final watermark, exit 0.
    Bounded,
}

/// `RunArgs`, checked.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The bootstrap servers, or [`EMBEDDED`] for the embedded broker; `None`: unset, which
    /// `watchbridge run` and a [`crate::builder::Bridge`] refuse ([`require_brokers`]).
    pub brokers: Option<String>,
    pub group_id: String,
    pub input_topic: String,
    pub output_topic: String,
    pub dlq_topic: String,
    pub watch_key: Option<String>,
    /// The repartition topic the inputs go through, keyed by their watch key
    /// (`WATCHBRIDGE_REPARTITION`; `None`: they do not).
    pub repartition_topic: Option<String>,
    /// How input records are read and output values written.
    pub formats: crate::formats::FormatConfig,
    pub rules: WatchRules,
    pub max_in_flight: usize,
    pub input_hold_bytes: usize,
    pub host_rate: Option<HostRate>,
    pub create_topics: bool,
    pub partitions: i32,
    /// `-1`: the broker's default.
    pub replication_factor: i32,
    /// `WATCHBRIDGE_TOPIC_CONFIG`: configs for every topic the bridge creates.
    pub topic_config: Vec<(String, String)>,
    pub shutdown_timeout: Duration,
    /// How long the start waits for the brokers (`WATCHBRIDGE_START_TIMEOUT`).
    pub start_timeout: Duration,
    pub poll_timeout: Duration,
    /// librdkafka properties from `KAFKA_*` variables, by the clients they are for (each
    /// client takes those of its kind: `kafka::properties`).
    pub kafka: KafkaProperties,
    pub watermark_strategy: WatermarkStrategy,
    /// A library user's watermark generators, used instead of `watermark_strategy`'s.
    pub watermark_generators: Option<crate::watermark::Generators>,
    /// A library user's input filter: inputs it matches start no watch.
    pub skip_input: Option<crate::kafka::partition::InputFilter>,
    pub watermark_interval: Duration,
    pub idle_timeout: Duration,
    pub watermark_topic: String,
    pub state_topic: String,
    pub finished_retention: Duration,
    pub checkpoint_interval: Duration,
    pub guarantee: GuaranteeSetting,
    /// The readable output headers asked for (`recovery_id` is set by the bridge).
    pub output_headers: OutputHeaders,
    pub mode: Mode,
    /// Where the operations server listens (`None`: `off`).
    pub metrics_addr: Option<SocketAddr>,
    /// `WATCHBRIDGE_ADMIN_TOKEN` (`None`: no control request is taken).
    pub admin_token: Option<crate::pollers::http::config::Redacted>,
    /// The control API, the control topic, the stall check.
    pub operations: OperationsConfig,
}

impl RunArgs {
    /// Check what clap cannot. `env` lists the process environment (for `KAFKA_*`).
    pub fn check(
        &self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<RunConfig, ConfigError> {
        let topic = |var: &'static str, name: &str| -> Result<String, ConfigError> {
            let ok = !name.is_empty()
                && name.len() <= 249
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                && name != "."
                && name != "..";
            if ok {
                Ok(name.to_string())
            } else {
                Err(ConfigError::new(
                    var,
                    format!("`{name}` is not a Kafka topic name (letters, digits, `.`, `_`, `-`; at most 249)"),
                ))
            }
        };
        let input_topic = topic("WATCHBRIDGE_INPUT_TOPIC", &self.input_topic)?;
        let output_topic = topic("WATCHBRIDGE_OUTPUT_TOPIC", &self.output_topic)?;
        let dlq_topic = match &self.dlq_topic {
            Some(t) => topic("WATCHBRIDGE_DLQ_TOPIC", t)?,
            None => format!("{input_topic}.dlq"),
        };
        let watermark_topic = match &self.watermark_topic {
            Some(t) => topic("WATCHBRIDGE_WATERMARK_TOPIC", t)?,
            None => format!("{output_topic}.watermarks"),
        };
        if [&input_topic, &output_topic, &dlq_topic].contains(&&watermark_topic) {
            return Err(ConfigError::new(
                "WATCHBRIDGE_WATERMARK_TOPIC",
                "must differ from the input, output and dead-letter topics",
            ));
        }
        let state_topic = match &self.state_topic {
            Some(t) => topic("WATCHBRIDGE_STATE_TOPIC", t)?,
            None => format!("{}.state", self.group_id),
        };
        if [&input_topic, &output_topic, &dlq_topic, &watermark_topic].contains(&&state_topic) {
            return Err(ConfigError::new(
                "WATCHBRIDGE_STATE_TOPIC",
                "must differ from the input, output, dead-letter and watermark topics",
            ));
        }
        if self.checkpoint_interval.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_CHECKPOINT_INTERVAL",
                "must be more than zero",
            ));
        }
        let watermark_strategy: WatermarkStrategy = self
            .watermark_strategy
            .parse()
            .map_err(|e| ConfigError::new("WATCHBRIDGE_WATERMARK_STRATEGY", format!("{e}")))?;
        if self.watermark_interval.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_WATERMARK_INTERVAL",
                "must be more than zero",
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_IDLE_TIMEOUT",
                "must be more than zero",
            ));
        }
        if output_topic == input_topic {
            return Err(ConfigError::new(
                "WATCHBRIDGE_OUTPUT_TOPIC",
                "must differ from WATCHBRIDGE_INPUT_TOPIC",
            ));
        }
        if dlq_topic == input_topic || dlq_topic == output_topic {
            return Err(ConfigError::new(
                "WATCHBRIDGE_DLQ_TOPIC",
                "must differ from the input and output topics",
            ));
        }
        if self.group_id.is_empty() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_GROUP_ID",
                "must not be empty",
            ));
        }
        if let Some(p) = &self.watch_key {
            if !p.starts_with('/') {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_WATCH_KEY",
                    format!("`{p}` is not a JSON pointer: write `/{p}`"),
                ));
            }
        }
        let repartition_topic = match self.repartition.as_str() {
            "never" => None,
            "auto" if self.watch_key.is_none() => None,
            "auto" | "always" => Some(match &self.repartition_topic {
                Some(t) => topic("WATCHBRIDGE_REPARTITION_TOPIC", t)?,
                None => topic(
                    "WATCHBRIDGE_REPARTITION_TOPIC",
                    &format!("{}.repartition", self.group_id),
                )?,
            }),
            other => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_REPARTITION",
                    format!("`{other}` is not one of `auto`, `always`, `never`"),
                ))
            }
        };
        // The topics a control or repartition topic must differ from.
        let taken = [
            &input_topic,
            &output_topic,
            &dlq_topic,
            &watermark_topic,
            &state_topic,
        ];
        if let Some(t) = &repartition_topic {
            if taken.contains(&t) {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_REPARTITION_TOPIC",
                    "must differ from the input, output, dead-letter, watermark and state topics",
                ));
            }
            if self.mode == Mode::Bounded {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_REPARTITION",
                    "a bounded run (WATCHBRIDGE_MODE=bounded) cannot go through the repartition \
                     topic yet: key the input records by the watch key and set \
                     WATCHBRIDGE_REPARTITION=never",
                ));
            }
        }
        let termination: Termination = self
            .termination
            .parse()
            .map_err(|e| ConfigError::new("WATCHBRIDGE_TERMINATION", format!("{e}")))?;
        let schedule = self.schedule()?;
        if self.max_in_flight == 0 {
            return Err(ConfigError::new(
                "WATCHBRIDGE_MAX_IN_FLIGHT",
                "must be at least 1",
            ));
        }
        if self.partitions < 1 {
            return Err(ConfigError::new(
                "WATCHBRIDGE_PARTITIONS",
                "must be at least 1",
            ));
        }
        if self.replication_factor < 1 && self.replication_factor != -1 {
            return Err(ConfigError::new(
                "WATCHBRIDGE_REPLICATION_FACTOR",
                "must be -1 (the broker's default.replication.factor) or at least 1",
            ));
        }
        let topic_config = topic_config(self.topic_config.as_deref().unwrap_or_default())?;
        if self.start_timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_START_TIMEOUT",
                "must be more than zero",
            ));
        }
        if self.poller.poll_timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_POLL_TIMEOUT",
                "must be more than zero",
            ));
        }
        let metrics_addr = metrics_addr(&self.metrics_addr)?;
        let operations = self.operations.check(&self.group_id)?;
        if taken.contains(&&operations.control_topic) {
            return Err(ConfigError::new(
                "WATCHBRIDGE_CONTROL_TOPIC",
                "must differ from the input, output, dead-letter, watermark and state topics",
            ));
        }
        let kafka = kafka_properties(env)?;
        let guarantee = GuaranteeSetting::parse(&self.guarantee)
            .map_err(|e| ConfigError::new("WATCHBRIDGE_GUARANTEE", e))?;
        let output_headers = OutputHeaders::parse(&self.output_headers)
            .map_err(|e| ConfigError::new("WATCHBRIDGE_OUTPUT_HEADERS", e))?;
        let formats = self.formats.check()?;
        let brokers = brokers(self.brokers.as_deref());
        Ok(RunConfig {
            brokers,
            group_id: self.group_id.clone(),
            input_topic,
            output_topic,
            dlq_topic,
            watch_key: self.watch_key.clone(),
            repartition_topic,
            formats,
            rules: WatchRules {
                catch_up: CatchUp {
                    start_from: StartFrom::parse(&self.start_from)
                        .map_err(|e| ConfigError::new("WATCHBRIDGE_START_FROM", e))?,
                    max_outputs_per_poll: self.max_outputs_per_poll,
                },
                termination,
                schedule,
            },
            max_in_flight: self.max_in_flight,
            input_hold_bytes: self.input_hold_bytes,
            host_rate: self.host_rate.map(|r| HostRate {
                per_second: r,
                burst: r,
            }),
            create_topics: self.create_topics,
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            topic_config,
            shutdown_timeout: self.shutdown_timeout,
            start_timeout: self.start_timeout,
            poll_timeout: self.poller.poll_timeout,
            kafka,
            watermark_strategy,
            watermark_generators: None,
            skip_input: None,
            watermark_interval: self.watermark_interval,
            idle_timeout: self.idle_timeout,
            watermark_topic,
            state_topic,
            finished_retention: self.finished_retention,
            checkpoint_interval: self.checkpoint_interval,
            guarantee,
            output_headers,
            mode: self.mode,
            metrics_addr,
            admin_token: self.admin_token.clone().filter(|t| !t.0.is_empty()),
            operations,
        })
    }
}

impl RunArgs {
    /// The poll schedule: `WATCHBRIDGE_POLL_INTERVAL`, `WATCHBRIDGE_POLL_JITTER`,
    /// `WATCHBRIDGE_BACKOFF` and the retry policy (`WATCHBRIDGE_RETRY_*`), each checked
    /// under its own name.
    /// The schedule the settings describe; [`Schedule::validate`] says which one is wrong.
    fn schedule(&self) -> Result<Schedule, ConfigError> {
        let (initial, max) = (self.retry_initial_backoff, self.retry_max_backoff);
        let mut schedule = Schedule {
            interval: self.poll_interval,
            backoff: backoff(&self.backoff)?,
            jitter: self.poll_jitter,
            retry: Retry {
                initial,
                max,
                after_max: self.retry_after_max,
                limit: 0,
            },
        };
        schedule
            .validate()
            .map_err(|e| ConfigError::new(e.setting.variable(), e.message))?;
        // Only now: a limit given as a duration is counted in delays checked above.
        schedule.retry.limit = retry_limit(&self.retry_limit, initial, max)?;
        Ok(schedule)
    }
}

/// `WATCHBRIDGE_BROKERS=embedded`: an in-process broker that keeps nothing, for trying
/// watchbridge out. Only ever when said: unset is an error ([`require_brokers`]).
pub const EMBEDDED: &str = "embedded";

/// `WATCHBRIDGE_BROKERS`, trimmed (`None`: unset or blank; [`EMBEDDED`] in any case as
/// [`EMBEDDED`]).
fn brokers(value: Option<&str>) -> Option<String> {
    let value = value.map(str::trim).filter(|b| !b.is_empty())?;
    Some(if value.eq_ignore_ascii_case(EMBEDDED) {
        EMBEDDED.to_string()
    } else {
        value.to_string()
    })
}

/// `WATCHBRIDGE_BROKERS` must be set: an embedded broker keeps nothing, and a deployment
/// whose variable went missing must not run on one. Checked by `watchbridge run` (and
/// `config --check`) with the other settings, and again when a bridge starts, for a
/// library user's settings.
pub fn require_brokers(brokers: Option<&str>) -> Result<(), ConfigError> {
    match brokers.map(str::trim) {
        Some(b) if !b.is_empty() => Ok(()),
        _ => Err(ConfigError::new(
            "WATCHBRIDGE_BROKERS",
            "is required: the Kafka bootstrap servers (host:port,…), or `embedded` to try \
             watchbridge out on an in-process broker that keeps nothing",
        )),
    }
}

/// `WATCHBRIDGE_BACKOFF`: `none`, or `<factor>x,<max>` (`2x,10m`). [`Schedule::validate`]
/// checks that the factor is at least 1 (below 1 quiet polls would come ever faster) and the
/// max at least the poll interval (the backoff only ever stretches the interval; a max
/// below it would shorten it instead).
fn backoff(value: &str) -> Result<Option<Backoff>, ConfigError> {
    const VAR: &str = "WATCHBRIDGE_BACKOFF";
    let value = value.trim();
    if value.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let syntax = || {
        ConfigError::new(
            VAR,
            format!(
                "`{value}` is not `none` or `<factor>x,<max>` such as `2x,10m` (each poll in a \
                 row without anything new waits twice as long as the one before, up to 10 \
                 minutes)"
            ),
        )
    };
    let (factor, max) = value.split_once(',').ok_or_else(syntax)?;
    let factor: f64 = factor
        .trim()
        .strip_suffix(['x', 'X'])
        .and_then(|f| f.trim().parse().ok())
        .ok_or_else(syntax)?;
    let max = humantime::parse_duration(max.trim()).map_err(|_| syntax())?;
    Ok(Some(Backoff { factor, max }))
}

/// `WATCHBRIDGE_RETRY_LIMIT`: a number of retries, a duration they must span (see
/// [`Retry::limit_for`]), or `unlimited`.
fn retry_limit(value: &str, initial: Duration, max: Duration) -> Result<u32, ConfigError> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("unlimited") {
        return Ok(u32::MAX);
    }
    if let Ok(n) = value.parse::<u32>() {
        return Ok(n);
    }
    match humantime::parse_duration(value) {
        Ok(d) => Ok(Retry::limit_for(d, initial, max)),
        Err(_) => Err(ConfigError::new(
            "WATCHBRIDGE_RETRY_LIMIT",
            format!(
                "`{value}` is not a number of retries (e.g. 5), a duration for them to span \
                 (e.g. 10m) or `unlimited`"
            ),
        )),
    }
}

/// `WATCHBRIDGE_TOPIC_CONFIG`: `key=value` entries separated by commas (blanks around each
/// trimmed; an empty list is none). A malformed entry is refused here, naming it, rather
/// than by the broker once a topic is missing.
fn topic_config(value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    const VAR: &str = "WATCHBRIDGE_TOPIC_CONFIG";
    let mut configs: Vec<(String, String)> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, v)| {
                !k.is_empty()
                    && !v.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            });
        let Some((key, value)) = parsed else {
            return Err(ConfigError::new(
                VAR,
                format!(
                    "`{entry}` is not a topic config `key=value` (comma-separated, e.g. \
                     `min.insync.replicas=2,retention.ms=604800000`)"
                ),
            ));
        };
        if configs.iter().any(|(k, _)| k == key) {
            return Err(ConfigError::new(VAR, format!("`{key}` is given twice")));
        }
        configs.push((key.to_string(), value.to_string()));
    }
    Ok(configs)
}

/// `WATCHBRIDGE_METRICS_ADDR`: an IP address and port (port 0: any free one), or `off`.
fn metrics_addr(value: &str) -> Result<Option<SocketAddr>, ConfigError> {
    operations::address("WATCHBRIDGE_METRICS_ADDR", value, "0.0.0.0:9898, [::]:9898")
}

/// The secrets of `watchbridge run` besides `KAFKA_*` that may come from a file
/// (`WATCHBRIDGE_ADMIN_TOKEN_FILE=/run/secrets/admin-token`), as Kubernetes and Docker mount
/// them. (`WATCHBRIDGE_HTTP_TOKEN_FILE` is the HTTP poller's own: read again as it changes.)
pub const SECRETS_FROM_FILES: &[&str] = &[
    "WATCHBRIDGE_ADMIN_TOKEN",
    "WATCHBRIDGE_HTTP_PASSWORD",
    "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD",
    "WATCHBRIDGE_SCHEMA_REGISTRY_TOKEN",
];

/// `NAME_FILE=path` for each of [`SECRETS_FROM_FILES`] → (`NAME`, the file's contents), read
/// once at start; both forms at once, or a file that cannot be read, is an error naming the
/// variable.
pub fn secrets_from_files(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let env: std::collections::HashMap<String, String> = env.into_iter().collect();
    let mut read = Vec::new();
    for name in SECRETS_FROM_FILES {
        let file_var = format!("{name}_FILE");
        let Some(path) = env.get(&file_var) else {
            continue;
        };
        if env.contains_key(*name) {
            return Err(ConfigError::new(
                file_var,
                format!("both {name} and {name}_FILE are set: keep one"),
            ));
        }
        let secret = crate::secrets::read_secret_file(path)
            .map_err(|e| ConfigError::new(file_var.clone(), e))?;
        read.push((name.to_string(), secret));
    }
    Ok(read)
}

/// The settings of `watchbridge run` from command-line arguments (the environment fills in
/// the rest, as for the binary).
pub(crate) fn parse_run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }
    let mut all = vec!["watchbridge"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all).map(|c| c.run)
}

#[cfg(test)]
mod tests {
    use super::parse_run_args as parse;
    use super::*;

    fn base() -> Vec<&'static str> {
        vec![
            "--input-topic",
            "users",
            "--output-topic",
            "events",
            "--brokers",
            "kafka:9092",
        ]
    }

    #[test]
    fn defaults_fill_everything_but_the_topics() {
        let c = parse(&base()).unwrap().check([]).unwrap();
        assert_eq!(c.dlq_topic, "users.dlq");
        assert_eq!(c.group_id, "watchbridge");
        assert_eq!(c.rules.schedule.interval, Duration::from_secs(10));
        assert_eq!(c.rules.termination, Termination::Never);
        assert_eq!(c.brokers.as_deref(), Some("kafka:9092"));
        assert_eq!(c.watermark_topic, "events.watermarks");
        assert_eq!(
            c.watermark_strategy,
            WatermarkStrategy::Bounded(Duration::from_secs(5))
        );
        assert_eq!(c.idle_timeout, Duration::from_secs(30));
        assert_eq!(c.mode, Mode::Streaming);
        assert_eq!(c.metrics_addr, Some("0.0.0.0:9898".parse().unwrap()));
        let e = parse(&["--output-topic", "x"]).unwrap_err().to_string();
        assert!(e.contains("WATCHBRIDGE_INPUT_TOPIC"), "{e}");
    }

    /// The brokers must be said: unset (or blank) is refused, naming the variable and both
    /// ways to set it; `embedded` (any case) is the in-process broker.
    #[test]
    fn the_brokers_are_required_and_embedded_only_when_asked() {
        let check = |brokers: Option<&str>| {
            let mut a = vec!["--input-topic", "users", "--output-topic", "events"];
            if let Some(b) = brokers {
                a.extend_from_slice(&["--brokers", b]);
            }
            parse(&a).unwrap().check([]).unwrap().brokers
        };
        for unset in [None, Some(""), Some("  ")] {
            let brokers = check(unset);
            assert_eq!(brokers, None, "{unset:?}");
            let e = require_brokers(brokers.as_deref()).unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_BROKERS", "{unset:?}");
            assert!(
                e.message.contains("`embedded`") && e.message.contains("host:port"),
                "{e}"
            );
        }
        assert_eq!(check(Some("embedded")).as_deref(), Some(EMBEDDED));
        assert_eq!(check(Some(" Embedded ")).as_deref(), Some(EMBEDDED));
        assert_eq!(
            check(Some("a:9092,b:9092")).as_deref(),
            Some("a:9092,b:9092")
        );
        assert!(require_brokers(Some(EMBEDDED)).is_ok());
    }

    #[test]
    fn bad_values_name_their_variable() {
        let check = |extra: &[&str]| {
            let mut a = base();
            a.extend_from_slice(extra);
            parse(&a).unwrap().check([]).unwrap_err()
        };
        assert_eq!(
            check(&["--termination", "stabel(1m)"]).var,
            "WATCHBRIDGE_TERMINATION"
        );
        assert_eq!(check(&["--watch-key", "id"]).var, "WATCHBRIDGE_WATCH_KEY");
        assert_eq!(
            check(&["--dlq-topic", "users"]).var,
            "WATCHBRIDGE_DLQ_TOPIC"
        );
        assert_eq!(
            check(&["--poll-interval", "0s"]).var,
            "WATCHBRIDGE_POLL_INTERVAL"
        );
        assert_eq!(
            check(&["--start-timeout", "0s"]).var,
            "WATCHBRIDGE_START_TIMEOUT"
        );
        for bad in ["9898", "localhost:9898", "0.0.0.0", "of"] {
            assert_eq!(
                check(&["--metrics-addr", bad]).var,
                "WATCHBRIDGE_METRICS_ADDR",
                "{bad}"
            );
        }
        let e = parse(&["--input-topic", "a b", "--output-topic", "x"])
            .unwrap()
            .check([])
            .unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_INPUT_TOPIC");
        let mut a = base();
        a.extend_from_slice(&["--poll-interval", "soon"]);
        let e = parse(&a).unwrap_err().to_string();
        assert!(e.contains("WATCHBRIDGE_POLL_INTERVAL"), "{e}");
    }

    /// Topics the bridge creates get the broker's replication factor unless told, and the
    /// topic configs of `WATCHBRIDGE_TOPIC_CONFIG`; a malformed entry names the variable.
    #[test]
    fn created_topics_default_to_the_brokers_replication_and_take_topic_configs() {
        let run = |extra: &[&str]| {
            let mut a = base();
            a.extend_from_slice(extra);
            parse(&a).unwrap().check([])
        };
        let c = run(&[]).unwrap();
        assert_eq!((c.replication_factor, c.topic_config.len()), (-1, 0));
        assert_eq!(
            run(&["--replication-factor", "3"])
                .unwrap()
                .replication_factor,
            3
        );
        assert_eq!(
            run(&["--replication-factor", "-1"])
                .unwrap()
                .replication_factor,
            -1
        );
        for bad in ["0", "-2"] {
            let e = run(&["--replication-factor", bad]).unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_REPLICATION_FACTOR", "{bad}");
        }
        let c = run(&[
            "--topic-config",
            " min.insync.replicas=2, retention.ms = 604800000,",
        ])
        .unwrap();
        assert_eq!(
            c.topic_config,
            [
                ("min.insync.replicas".to_string(), "2".to_string()),
                ("retention.ms".into(), "604800000".into())
            ]
        );
        for bad in [
            "min.insync.replicas",
            "=2",
            "retention.ms=",
            "a b=1",
            "x=1,x=2",
        ] {
            let e = run(&["--topic-config", bad]).unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_TOPIC_CONFIG", "{bad}: {e}");
        }
        let e = run(&["--topic-config", "retention.ms=1,min.insync.replicas"]).unwrap_err();
        assert!(e.message.contains("`min.insync.replicas`"), "{e}");
    }

    #[test]
    fn the_metrics_server_can_be_moved_or_turned_off() {
        let addr = |value: &str| {
            let mut a = base();
            a.extend_from_slice(&["--metrics-addr", value]);
            parse(&a).unwrap().check([]).unwrap().metrics_addr
        };
        assert_eq!(addr("off"), None);
        assert_eq!(addr("OFF"), None);
        assert_eq!(addr("127.0.0.1:0"), Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(addr("[::1]:9898"), Some("[::1]:9898".parse().unwrap()));
    }

    #[test]
    fn watchbridge_secrets_come_from_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t0ken\n").unwrap();
        let path = file.to_str().unwrap().to_string();
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            secrets_from_files(env(&[("WATCHBRIDGE_ADMIN_TOKEN_FILE", &path)])).unwrap(),
            [("WATCHBRIDGE_ADMIN_TOKEN".to_string(), "t0ken".to_string())]
        );
        let e = secrets_from_files(env(&[
            ("WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD_FILE", &path),
            ("WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD", "inline"),
        ]))
        .unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD_FILE");
        let e = secrets_from_files(env(&[("WATCHBRIDGE_HTTP_PASSWORD_FILE", "/nonexistent")]))
            .unwrap_err();
        assert!(e.message.contains("/nonexistent"), "{e}");
        assert!(
            secrets_from_files(env(&[("WATCHBRIDGE_HTTP_TOKEN_FILE", &path)]))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn unknown_kafka_properties_are_refused_naming_the_variable() {
        let bad = [("KAFKA_NO_SUCH_THING".to_string(), "1".to_string())];
        let e = parse(&base()).unwrap().check(bad).unwrap_err();
        assert_eq!(e.var, "KAFKA_NO_SUCH_THING");
        assert!(e.message.contains("no.such.thing"), "{e}");
        let bad = [("KAFKA_ACKS".to_string(), "sometimes".to_string())];
        assert_eq!(
            parse(&base()).unwrap().check(bad).unwrap_err().var,
            "KAFKA_ACKS"
        );
    }

    #[test]
    fn the_retry_policy_is_set_from_the_environment_and_checked() {
        let retry = |extra: &[&str]| {
            let mut a = base();
            a.extend_from_slice(extra);
            parse(&a).unwrap().check([]).map(|c| c.rules.schedule)
        };
        let d = retry(&[]).unwrap();
        assert_eq!(
            (d.retry.limit, d.retry.initial, d.retry.max, d.jitter),
            (65, Duration::from_secs(1), Duration::from_secs(60), 0.1),
            "the defaults: an hour of retries (1 + 2 + … + 32 s, then 59 of 60 s)"
        );
        assert_eq!(
            d.retry.retry_after_cap(),
            d.retry.max,
            "Retry-After capped at the retry max"
        );
        let capped = |extra: &[&str]| retry(extra).map(|s| s.retry.retry_after_cap());
        assert_eq!(
            capped(&["--retry-max-backoff", "2m"]).unwrap(),
            Duration::from_secs(120)
        );
        assert_eq!(
            capped(&["--retry-after-max", "1h"]).unwrap(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            capped(&["--retry-after-max", "0s"]).unwrap(),
            Duration::ZERO
        );
        let mut a = base();
        a.extend_from_slice(&["--retry-after-max=-5s"]);
        let e = parse(&a).unwrap_err().to_string();
        assert!(e.contains("WATCHBRIDGE_RETRY_AFTER_MAX"), "{e}");
        let s = retry(&[
            "--retry-limit",
            "12",
            "--retry-initial-backoff",
            "250ms",
            "--retry-max-backoff",
            "2m",
            "--poll-jitter",
            "0",
        ])
        .unwrap();
        assert_eq!(
            (s.retry.limit, s.retry.initial, s.retry.max, s.jitter),
            (
                12,
                Duration::from_millis(250),
                Duration::from_secs(120),
                0.0
            )
        );
        // A duration: as many retries as the backoff takes to span it (1+2+4+8+16+32 s,
        // then 60 s each: 15 retries reach 10 minutes).
        assert_eq!(retry(&["--retry-limit", "10m"]).unwrap().retry.limit, 15);
        assert_eq!(retry(&["--retry-limit", "0s"]).unwrap().retry.limit, 0);
        assert_eq!(
            retry(&["--retry-limit", "Unlimited"]).unwrap().retry.limit,
            u32::MAX
        );
        for (args, var) in [
            (&["--retry-limit", "soon"][..], "WATCHBRIDGE_RETRY_LIMIT"),
            (&["--retry-limit=-1"], "WATCHBRIDGE_RETRY_LIMIT"),
            (
                &["--retry-initial-backoff", "0s"],
                "WATCHBRIDGE_RETRY_INITIAL_BACKOFF",
            ),
            (
                &["--retry-initial-backoff", "2m"],
                "WATCHBRIDGE_RETRY_MAX_BACKOFF",
            ),
            (
                &["--retry-max-backoff", "10ms"],
                "WATCHBRIDGE_RETRY_MAX_BACKOFF",
            ),
            (&["--poll-jitter", "1"], "WATCHBRIDGE_POLL_JITTER"),
            (&["--poll-jitter=-0.1"], "WATCHBRIDGE_POLL_JITTER"),
            (&["--poll-jitter", "NaN"], "WATCHBRIDGE_POLL_JITTER"),
        ] {
            let e = retry(args).unwrap_err();
            assert_eq!(e.var, var, "{args:?}: {e}");
        }
        let e = retry(&["--retry-limit", "soon"]).unwrap_err().to_string();
        assert!(e.contains("unlimited") && e.contains("10m"), "{e}");
        let e = retry(&["--retry-max-backoff", "10ms"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("WATCHBRIDGE_RETRY_INITIAL_BACKOFF"), "{e}");
        let mut a = base();
        a.extend_from_slice(&["--poll-jitter", "lots"]);
        let e = parse(&a).unwrap_err().to_string();
        assert!(e.contains("WATCHBRIDGE_POLL_JITTER"), "{e}");
    }
    /// `WATCHBRIDGE_BACKOFF` (`--backoff`): `none` by default (a fixed interval), or
    /// `<factor>x,<max>`; each bad value named by the variable.
    #[test]
    fn the_quiet_poll_backoff_is_set_from_the_environment_and_checked() {
        let schedule = |extra: &[&str]| {
            let mut a = base();
            a.extend_from_slice(extra);
            parse(&a).unwrap().check([]).map(|c| c.rules.schedule)
        };
        assert_eq!(schedule(&[]).unwrap().backoff, None, "a fixed interval");
        assert_eq!(schedule(&["--backoff", "none"]).unwrap().backoff, None);
        assert_eq!(schedule(&["--backoff", "None"]).unwrap().backoff, None);
        let backoff = |value: &str| schedule(&["--backoff", value]).unwrap().backoff;
        assert_eq!(
            backoff("2x,10m"),
            Some(Backoff {
                factor: 2.0,
                max: Duration::from_secs(600)
            })
        );
        assert_eq!(
            backoff(" 1.5x , 1h 30m "),
            Some(Backoff {
                factor: 1.5,
                max: Duration::from_secs(5400)
            })
        );
        assert_eq!(
            backoff("1x,10s"),
            Some(Backoff {
                factor: 1.0,
                max: Duration::from_secs(10)
            }),
            "a factor of 1 and a max of the interval itself are allowed (a fixed interval)"
        );
        for bad in [
            "2x",
            "2,10m",
            "x2,10m",
            "2x,",
            ",10m",
            "2x,soon",
            "twox,10m",
            "0.5x,10m",
            "0x,10m",
            "-2x,10m",
            "NaNx,10m",
            "infx,10m",
            "2x,10m,1h",
            "2x,5s",
            "fast",
            "",
        ] {
            let e = schedule(&[&format!("--backoff={bad}")]).unwrap_err();
            assert_eq!(e.var, "WATCHBRIDGE_BACKOFF", "{bad:?}: {e}");
        }
        let e = schedule(&["--backoff", "0.5x,10m"]).unwrap_err();
        assert!(e.message.contains("at least 1"), "{e}");
        let e = schedule(&["--backoff", "2x,5s"]).unwrap_err();
        assert!(e.message.contains("WATCHBRIDGE_POLL_INTERVAL"), "{e}");
        let e = schedule(&["--backoff", "fast"]).unwrap_err();
        assert!(
            e.message.contains("2x,10m") && e.message.contains("none"),
            "{e}"
        );
        // The max is checked against the interval actually set.
        assert!(schedule(&["--backoff", "2x,5s", "--poll-interval", "5s"]).is_ok());
    }

    /// The schedule a run gets from `WATCHBRIDGE_BACKOFF` stretches the polls of a watch
    /// while they bring nothing new, up to the max, and the first new output brings the
    /// interval back.
    #[test]
    fn the_backoff_a_run_is_given_stretches_quiet_polls() {
        use crate::poll::{Output, PollResult};
        use crate::watch::{Next, Watch};
        use std::sync::Arc;
        let mut a = base();
        a.extend_from_slice(&["--backoff", "2x,1m", "--poll-jitter", "0"]);
        let rules = parse(&a).unwrap().check([]).unwrap().rules;
        let mut rng = fastrand::Rng::with_seed(1);
        let mut now = 1_700_000_000_000;
        let mut w = Watch::new(
            bytes::Bytes::from_static(b"k"),
            Arc::new(()),
            now,
            now,
            &rules,
        );
        let mut poll = |outputs: Vec<Output>, now: &mut i64| {
            let result = PollResult {
                outputs,
                ..PollResult::default()
            };
            let Next::PollAt(at) = w.on_success(result, *now, &rules, &mut rng).next else {
                panic!("the watch goes on")
            };
            let waited = at - *now;
            *now = at;
            waited / 1000
        };
        let new = |k: &str| vec![Output::new(k.as_bytes().to_vec(), b"v".to_vec(), 0)];
        assert_eq!(poll(new("a"), &mut now), 10, "something new: the interval");
        let quiet: Vec<i64> = (0..5).map(|_| poll(vec![], &mut now)).collect();
        assert_eq!(
            quiet,
            [20, 40, 60, 60, 60],
            "quiet polls stretch up to the max"
        );
        assert_eq!(
            poll(new("b"), &mut now),
            10,
            "something new again: back to it"
        );
        // Without WATCHBRIDGE_BACKOFF, quiet polls keep the interval.
        let fixed = parse(&base()).unwrap().check([]).unwrap().rules.schedule;
        assert_eq!(fixed.base_delay(5), Duration::from_secs(10));
    }
}

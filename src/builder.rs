//! Assembling a bridge in Rust: the bridge `watchbridge run` is, with parts of your own.
//!
//! [`BridgeBuilder`] starts from the settings `watchbridge run` reads (every `WATCHBRIDGE_*`
//! and `KAFKA_*` variable of the environment, each default where one is unset; see
//! `docs/configuration.md`), and its methods put code where a setting would go: a
//! termination condition tree with conditions of your own, a watermark generator per input
//! partition, a timestamp assigner for inputs, an input filter. [`BridgeBuilder::poller`]
//! takes the poller and gives the [`Bridge`] to run. The `watchbridge` binary is a user of
//! this builder: `run` is `BridgeBuilder::from_config(checked settings)` with the built-in
//! poller `WATCHBRIDGE_POLLER` names, run by [`Bridge::run_until_signal`].

use crate::bridge::{
    exit_past_the_stop_deadline, run_bridge, stop_on_signals, BridgeError, StopSignal,
};
use crate::config::{parse_run_args, RunConfig, EMBEDDED};
use crate::config_error::ConfigError;
use crate::formats::time::TimestampAssigner;
use crate::formats::watch_input::Input;
use crate::kafka::embedded::EmbeddedBroker;
use crate::kafka::partition::InputFilter;
use crate::metrics::Metrics;
use crate::pollers::builtin::{PollerArgs, UsePoller};
use crate::pollers::Resolve;
use crate::schedule::Schedule;
use crate::termination::Termination;
use crate::watermark::Generators;
use std::sync::Arc;
use std::time::Duration;

/// A bridge being put together: settings, and the parts that are code. See the
/// [module](self) and the crate's guide.
#[derive(Debug, Clone)]
pub struct BridgeBuilder {
    config: RunConfig,
    /// The built-in pollers' settings as read from the environment (none when built
    /// [`from_config`](BridgeBuilder::from_config)).
    builtin_poller: Option<PollerArgs>,
}

impl BridgeBuilder {
    /// A bridge from `input_topic` to `output_topic`, every other setting as `watchbridge
    /// run` would read it from this process's environment (its default where unset).
    pub fn new(input_topic: &str, output_topic: &str) -> Result<Self, ConfigError> {
        Self::parse(&["--input-topic", input_topic, "--output-topic", output_topic])
    }

    /// Every setting from this process's environment, as `watchbridge run` reads them
    /// (`WATCHBRIDGE_INPUT_TOPIC` and `WATCHBRIDGE_OUTPUT_TOPIC` must be set).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::parse(&[])
    }

    /// Settings already read and checked (what the `watchbridge` binary does).
    pub fn from_config(config: RunConfig) -> Self {
        Self {
            config,
            builtin_poller: None,
        }
    }

    fn parse(args: &[&str]) -> Result<Self, ConfigError> {
        let args = parse_run_args(args).map_err(|e| {
            let message = e.render().to_string();
            let message = message.trim().trim_start_matches("error: ");
            ConfigError::new("WATCHBRIDGE_*", message.to_string())
        })?;
        let config = args.check(std::env::vars())?;
        Ok(Self {
            config,
            builtin_poller: Some(args.poller),
        })
    }

    /// The Kafka bootstrap servers (`WATCHBRIDGE_BROKERS`), or [`EMBEDDED`]: an embedded
    /// in-memory broker that keeps nothing. Required: a bridge without brokers refuses to
    /// start.
    pub fn brokers(mut self, brokers: &str) -> Self {
        self.config.brokers = Some(brokers.to_string());
        self
    }

    /// The consumer group (`WATCHBRIDGE_GROUP_ID`): instances in one group share the input
    /// topic's partitions and their watches.
    pub fn group_id(mut self, group_id: &str) -> Self {
        self.config.group_id = group_id.to_string();
        self
    }

    /// When a watch stops polling (`WATCHBRIDGE_TERMINATION`), with conditions of your
    /// own nested by [`Termination::custom`]; their states are saved with each watch.
    pub fn termination(mut self, termination: Termination) -> Self {
        self.config.rules.termination = termination;
        self
    }

    /// When watches poll: interval, jitter, backoff, retries (`WATCHBRIDGE_POLL_INTERVAL`
    /// and the settings beside it). Checked here, by the rules the settings are checked by:
    /// an error names the setting that is wrong.
    pub fn schedule(mut self, schedule: Schedule) -> Result<Self, ConfigError> {
        schedule
            .validate()
            .map_err(|e| ConfigError::new(e.setting.variable(), e.message))?;
        self.config.rules.schedule = schedule;
        Ok(self)
    }

    /// The deadline of one poll (`WATCHBRIDGE_POLL_TIMEOUT`).
    pub fn poll_timeout(mut self, timeout: Duration) -> Self {
        self.config.poll_timeout = timeout;
        self
    }

    /// Each input partition's watermark generator, instead of
    /// `WATCHBRIDGE_WATERMARK_STRATEGY`'s.
    pub fn watermarks(mut self, generators: Generators) -> Self {
        self.config.watermark_generators = Some(generators);
        self
    }

    /// How an input's event time is read, instead of `WATCHBRIDGE_INPUT_TIME` (or the
    /// record timestamp).
    pub fn timestamps(mut self, assigner: impl TimestampAssigner) -> Self {
        self.config.formats.input_time = Some(Arc::new(assigner));
        self
    }

    /// Inputs for which `skip` is true start no watch: they are read (the watermark
    /// generator sees them), counted (`watchbridge_inputs_skipped_total`) and committed.
    /// For control records on the input topic, such as a punctuated generator's markers.
    pub fn skip_inputs(mut self, skip: impl Fn(&Input) -> bool + Send + Sync + 'static) -> Self {
        self.config.skip_input = Some(InputFilter(Arc::new(skip)));
        self
    }

    /// The settings as they stand, for what has no method of its own.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// The settings, to change what has no method of its own.
    pub fn config_mut(&mut self) -> &mut RunConfig {
        &mut self.config
    }

    /// Run with the built-in poller `WATCHBRIDGE_POLLER` names (`http`, the default, `glob`
    /// or `sharded`, with their variables), as [`Bridge::run_until_signal`] does: for a
    /// bridge whose own parts are its termination, watermarks or timestamps.
    pub fn run_builtin_poller_until_signal(self) -> Result<(), BridgeError> {
        let settings = match &self.builtin_poller {
            Some(settings) => settings.clone(),
            None => {
                let args = parse_run_args(&[
                    "--input-topic",
                    &self.config.input_topic,
                    "--output-topic",
                    &self.config.output_topic,
                ])
                .map_err(|e| BridgeError::Start(e.to_string()))?;
                args.poller
            }
        };
        settings
            .build(self)
            .map_err(|e| BridgeError::Start(e.to_string()))?
    }

    /// The bridge, polling with `poller`.
    pub fn poller<P: Resolve>(self, poller: P) -> Bridge<P> {
        self.shared_poller(Arc::new(poller))
    }

    /// [`BridgeBuilder::poller`] with a poller shared with other code.
    pub fn shared_poller<P: Resolve>(self, poller: Arc<P>) -> Bridge<P> {
        Bridge {
            config: self.config,
            poller,
            metrics: Arc::new(Metrics::new()),
        }
    }
}

/// The `watchbridge` binary's use of the builder: whichever built-in poller the settings
/// name, run until a signal.
impl UsePoller for BridgeBuilder {
    type Output = Result<(), BridgeError>;

    fn with<P: Resolve>(self, poller: Arc<P>) -> Self::Output {
        self.shared_poller(poller).run_until_signal()
    }
}

/// A bridge ready to run: what [`BridgeBuilder::poller`] gives.
pub struct Bridge<P: Resolve> {
    config: RunConfig,
    poller: Arc<P>,
    metrics: Arc<Metrics>,
}

impl<P: Resolve> Bridge<P> {
    /// Its metrics (what the operations server exports at `/metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Run on the current tokio runtime until `stop` (or, with `WATCHBRIDGE_MODE=bounded`,
    /// until the inputs present at the start are done). With `WATCHBRIDGE_BROKERS=embedded`
    /// an embedded in-memory broker runs for as long; without brokers, it refuses to start.
    pub async fn run(self, stop: Arc<StopSignal>) -> Result<(), BridgeError> {
        crate::config::require_brokers(self.config.brokers.as_deref())
            .map_err(|e| BridgeError::Start(e.to_string()))?;
        let brokers = self.config.brokers.clone().unwrap_or_default();
        let embedded = match brokers.as_str() {
            EMBEDDED => Some(EmbeddedBroker::start().map_err(BridgeError::Start)?),
            _ => None,
        };
        let brokers = match &embedded {
            Some(e) => {
                let b = e.bootstrap();
                tracing::warn!(
                    bootstrap = %b,
                    "WATCHBRIDGE_BROKERS=embedded: using an EMBEDDED in-memory broker that keeps nothing \
                     when this process ends; point WATCHBRIDGE_BROKERS at a Kafka cluster for real use"
                );
                b
            }
            None => brokers,
        };
        run_bridge(
            &brokers,
            embedded.as_ref(),
            &self.config,
            self.poller,
            self.metrics,
            stop,
        )
        .await
    }

    /// Run as `watchbridge run` does: on a runtime of its own, until SIGTERM or Ctrl-C,
    /// and exiting the process if the stop outlasts `WATCHBRIDGE_SHUTDOWN_TIMEOUT` by
    /// [`STOP_MARGIN`](crate::bridge::STOP_MARGIN). It starts a tokio runtime, so it
    /// cannot be called from one (`#[tokio::main]`): there, use [`Bridge::run`] with a
    /// [`StopSignal`] of your own ([`crate::stop_on_signals`] stops it on signals).
    pub fn run_until_signal(self) -> Result<(), BridgeError> {
        let runtime = tokio::runtime::Runtime::new()
            .map_err(|e| BridgeError::Start(format!("cannot start the async runtime: {e}")))?;
        let stop = Arc::new(StopSignal::default());
        let shutdown_timeout = self.config.shutdown_timeout;
        let result = runtime.block_on(async {
            stop_on_signals(stop.clone());
            exit_past_the_stop_deadline(stop.clone(), shutdown_timeout);
            self.run(stop).await
        });
        // Tasks still blocked in librdkafka (a stop that gave up) are not waited for.
        runtime.shutdown_timeout(Duration::from_secs(1));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Backoff;

    /// Whatever a bad part is, the error names the setting that would set it.
    #[test]
    fn a_bad_part_is_refused_naming_its_setting() {
        let e = BridgeBuilder::new("users and more", "events").unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_INPUT_TOPIC", "{e}");
        let builder = BridgeBuilder::new("users", "events").unwrap();
        let e = builder
            .clone()
            .schedule(Schedule {
                backoff: Some(Backoff {
                    factor: 2.0,
                    max: Duration::from_secs(1),
                }),
                ..Schedule::default()
            })
            .unwrap_err();
        assert_eq!(e.var, "WATCHBRIDGE_BACKOFF", "{e}");
        let ok = builder
            .group_id("g")
            .termination(Termination::Polls(3))
            .schedule(Schedule::default())
            .unwrap();
        assert_eq!(ok.config().group_id, "g");
        assert_eq!(ok.config().rules.termination, Termination::Polls(3));
    }
}

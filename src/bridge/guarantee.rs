//! Which guarantee the run gives (`WATCHBRIDGE_GUARANTEE`: `auto` resolved, checked against
//! the mode the group runs), and how the producers that keep it are made: each partition's,
//! the exactly-once mode's transactional ones, and the shared one.

use super::start::Start;
use super::BridgeError;
use crate::clock::Clock;
use crate::config::RunConfig;
use crate::kafka::client::{broker_settings, BrokerSettings};
use crate::kafka::clients::{Isolation, KafkaSettings};
use crate::kafka::delayed_restart::DeliveryWindow;
use crate::kafka::group_mode;
use crate::kafka::guarantee::{self, Guarantee, GuaranteeSetting};
use crate::kafka::health::KafkaContext;
use crate::kafka::partition::TransactionSettings;
use crate::kafka::stats::{BridgeProducer, ProducerSettings};
use crate::kafka::transaction_timeout::TransactionTimeouts;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the bridge's producers are made, for the guarantee chosen.
#[derive(Clone)]
pub(super) struct Producers {
    /// Each partition task's own producer's settings, and the shared one's.
    pub settings: ProducerSettings,
    /// `Some` in the exactly-once mode: each partition writes through a transactional
    /// producer of its own.
    pub transactions: Option<TransactionSettings>,
    /// Without transactions, a partition whose delivery failed waits out how long the
    /// record may still commit before it reads its outputs back
    /// (`kafka/delayed_restart.rs`); zero with them.
    pub delivery_window: Duration,
}

impl Producers {
    /// The shared producer, for what no partition owns (the merged watermark, a bounded
    /// run's end of time). Made first, it checks the settings once, before any partition
    /// task makes its own.
    pub(super) fn shared(&self) -> Result<BridgeProducer, BridgeError> {
        self.settings
            .create(None)
            .map_err(|e| BridgeError::Start(format!("cannot create the producer: {e}")))
    }
}

impl Start<'_> {
    /// `WATCHBRIDGE_GUARANTEE`, with `auto` resolved against the broker (the embedded
    /// broker, librdkafka's mock cluster, accepts transactions but cannot keep their
    /// promise: `auto` picks `recovery` there without asking), and checked against the mode
    /// the group runs (`kafka/group_mode.rs`): an instance of the other mode refuses to
    /// start. `auto`'s questions are asked again until the start's deadline while they fail
    /// for a transient reason. Logged, and recorded: `watchbridge_guarantee_info`, and
    /// `/readyz` when `auto` fell back.
    pub(super) async fn choose_guarantee(
        &self,
        state_partitions: i32,
    ) -> Result<Guarantee, BridgeError> {
        let fallback = Arc::new(Mutex::new(None));
        let embedded = self.embedded.is_some();
        let chosen = match self.config.guarantee {
            GuaranteeSetting::Auto if embedded => Guarantee::Recovery,
            GuaranteeSetting::Fixed(g) if embedded => g,
            setting => {
                self.settle_with_the_group(setting, state_partitions, fallback.clone())
                    .await?
            }
        };
        tracing::info!(
            guarantee = %chosen,
            setting = ?self.config.guarantee,
            "WATCHBRIDGE_GUARANTEE"
        );
        let fallback = fallback.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.record_guarantee(chosen, fallback.as_deref());
        Ok(chosen)
    }

    /// `setting` settled with the mode the group runs (read from its state topic's
    /// `state_partitions`), `auto` resolved by a probe of the brokers where the group has
    /// none; why `auto` fell back, if it did, goes to `fallback`.
    async fn settle_with_the_group(
        &self,
        setting: GuaranteeSetting,
        state_partitions: i32,
        fallback: Arc<Mutex<Option<String>>>,
    ) -> Result<Guarantee, BridgeError> {
        let (config, clients) = (self.config, &self.clients);
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
        let (kafka, deadline) = (self.kafka.clone(), self.deadline);
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
                *fallback.lock().unwrap_or_else(|p| p.into_inner()) = fell_back;
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
        Ok(settled.guarantee)
    }

    /// The guarantee in `/readyz` (when `auto` fell back, and why) and in
    /// `watchbridge_guarantee_info`.
    fn record_guarantee(&self, guarantee: Guarantee, fallback: Option<&str>) {
        if let Some(why) = fallback {
            self.readiness.guarantee_fell_back(why);
        }
        let setting = match self.config.guarantee {
            GuaranteeSetting::Auto => "auto".to_string(),
            GuaranteeSetting::Fixed(g) => g.to_string(),
        };
        self.metrics
            .guarantee_info
            .with_label_values(&[&guarantee.to_string(), &setting, fallback.unwrap_or("")])
            .set(1);
    }

    /// How the producers are made for `guarantee`: in the exactly-once mode with the
    /// transaction timeouts fitted to the checkpoint interval; without it, with the
    /// brokers' delivery window.
    pub(super) async fn producers(&self, guarantee: Guarantee) -> Result<Producers, BridgeError> {
        let settings = ProducerSettings {
            config: self.clients.output_producer(guarantee),
            metrics: self.metrics.clone(),
            kafka: self.kafka.clone(),
        };
        let transactions = match guarantee {
            Guarantee::ExactlyOnce => {
                Some(transaction_settings(&self.clients, self.config, &settings).await?)
            }
            _ => None,
        };
        let delivery_window = match guarantee {
            Guarantee::ExactlyOnce => Duration::ZERO,
            _ => delivery_window(&self.clients, &self.kafka).await,
        };
        Ok(Producers {
            settings,
            transactions,
            delivery_window,
        })
    }
}

/// The metadata of `clients`' group, which transactions commit offsets with: without a
/// generation, so fencing rests on the transactional id of the input partition (see
/// `kafka/partition/transaction.rs`).
pub(super) fn group_metadata(
    clients: &KafkaSettings,
) -> Result<rdkafka::consumer::ConsumerGroupMetadata, BridgeError> {
    let group: BaseConsumer = clients
        .group_metadata_client()
        .create()
        .map_err(|e| BridgeError::Start(format!("cannot create a client: {e}")))?;
    group
        .group_metadata()
        .ok_or_else(|| BridgeError::Start("librdkafka returned no consumer group metadata".into()))
}

/// The exactly-once mode's producer settings (the bridge's `producer`'s, with the
/// transaction timeouts), transactional id prefix and group metadata.
async fn transaction_settings(
    clients: &KafkaSettings,
    config: &RunConfig,
    producer: &ProducerSettings,
) -> Result<TransactionSettings, BridgeError> {
    let group = group_metadata(clients)?;
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

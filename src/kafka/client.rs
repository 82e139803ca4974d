//! The start's questions to the cluster: the wait for the brokers, the topics the bridge
//! needs (checked, and created), and broker-wide settings. Its clients are made from the
//! bridge's [`KafkaSettings`] (`kafka/clients.rs`), its topics from [`TopicSettings`].

use super::clients::KafkaSettings;
use super::embedded::EmbeddedBroker;
use super::health::KafkaContext;
use crate::internal_events::{BrokersAnswered, WaitReport, WaitingForBrokers};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::Producer;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait for the brokers to answer at start.
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    #[error("cannot reach the brokers at {brokers} (WATCHBRIDGE_BROKERS): {error}")]
    Unreachable { brokers: String, error: String },
    #[error(
        "the brokers at {brokers} (WATCHBRIDGE_BROKERS) refused the login: {error}; check \
         KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, the credentials (KAFKA_SASL_USERNAME, \
         KAFKA_SASL_PASSWORD or its _FILE, the OAUTHBEARER client) and the certificates \
         (KAFKA_SSL_CA_LOCATION, KAFKA_SSL_CERTIFICATE_LOCATION, KAFKA_SSL_KEY_LOCATION)"
    )]
    LoginRefused { brokers: String, error: String },
    #[error(
        "cannot reach the brokers at {brokers} (WATCHBRIDGE_BROKERS) within {} \
         (WATCHBRIDGE_START_TIMEOUT): {error}",
        humantime::format_duration(*timeout)
    )]
    StartTimeout {
        brokers: String,
        timeout: Duration,
        error: String,
    },
    #[error(
        "{} (WATCHBRIDGE_CREATE_TOPICS=false; create {} or set WATCHBRIDGE_CREATE_TOPICS=true)",
        .missing
            .iter()
            .map(|(var, topic)| format!("{var}: topic `{topic}` does not exist"))
            .collect::<Vec<_>>()
            .join("; "),
        if .missing.len() == 1 { "it" } else { "them" }
    )]
    Missing {
        /// Every missing topic, with the variable that names it.
        missing: Vec<(&'static str, String)>,
    },
    #[error(
        "{}: the brokers' authorizer does not let this principal DESCRIBE {} (a topic it cannot \
         describe looks missing); grant DESCRIBE and the operations of docs/brokers.md, \
         \"Least privilege\"",
        .refused
            .iter()
            .map(|(var, topic)| format!("{var}: topic `{topic}`"))
            .collect::<Vec<_>>()
            .join("; "),
        if .refused.len() == 1 { "it" } else { "them" }
    )]
    DescribeRefused {
        /// Every topic the principal may not describe, with the variable that names it.
        refused: Vec<(&'static str, String)>,
    },
    #[error("cannot create topic `{topic}`: {error}")]
    Create { topic: String, error: String },
    #[error("invalid Kafka setting: {0}")]
    Config(String),
    #[error(
        "WATCHBRIDGE_STATE_TOPIC: topic `{topic}` has {found} partition(s), but the input topic has \
         {expected}; the state of input partition p lives in its partition p, so the counts must \
         match (use another state topic, or recreate it)"
    )]
    StatePartitions {
        topic: String,
        found: i32,
        expected: i32,
    },
    #[error(
        "WATCHBRIDGE_STATE_TOPIC: topic `{topic}` has {setting}, so the broker deletes its old \
         records: sealed seen chunks and the records of long-quiet watches would be lost when \
         its retention runs (outputs emitted again after a restart, watches forgotten). Make \
         it compacted only (cleanup.policy=compact, e.g. `kafka-configs.sh --bootstrap-server \
         <brokers> --alter --entity-type topics --entity-name {topic} --add-config \
         cleanup.policy=compact`), or name another state topic (a missing one is created \
         compacted)"
    )]
    StateNotCompacted { topic: String, setting: String },
}

/// The topics the bridge uses (`WATCHBRIDGE_*_TOPIC`), and how the start makes the ones
/// missing.
#[derive(Debug, Clone)]
pub struct TopicSettings {
    pub input_topic: String,
    /// The repartition topic the inputs go through (`WATCHBRIDGE_REPARTITION`), created with
    /// the input topic's partition count; the watch side's input then.
    pub repartition_topic: Option<String>,
    pub output_topic: String,
    pub dlq_topic: String,
    pub watermark_topic: String,
    pub state_topic: String,
    pub control_topic: String,
    /// `WATCHBRIDGE_CREATE_TOPICS`.
    pub create_topics: bool,
    /// `WATCHBRIDGE_PARTITIONS`: a missing input topic's partition count.
    pub partitions: i32,
    /// `WATCHBRIDGE_REPLICATION_FACTOR` (`-1`: the broker's default).
    pub replication_factor: i32,
    /// `WATCHBRIDGE_TOPIC_CONFIG`: configs for every topic the bridge creates.
    pub topic_config: Vec<(String, String)>,
}

/// The first try's timeout in the start's wait for the brokers, doubled each try up to the
/// second.
const TRY_TIMEOUT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(8));

/// The start's one client of the cluster, for its own questions: the wait for the brokers,
/// the topics and their partition counts, creating the missing ones, the state topic's
/// configuration. One client and one connection for all of them: a fresh client per
/// question cost its start, its connection and a first metadata round each (creating the
/// topics took ~0.1 s of that on Tansu, the wait for them to appear ~0.05 s): most of a
/// fresh start. Dropped once the topics are checked.
pub struct StartClient {
    /// Always `Some` but in [`Drop`].
    admin: Option<Arc<AdminClient<KafkaContext>>>,
    /// The topics on the cluster, as the answer that proved the brokers reachable listed
    /// them.
    pub topics: ClusterTopics,
}

/// What one metadata answer says of the topics: each one's partition count and replication
/// factor (its partitions' fewest replicas), and how many brokers the cluster has.
#[derive(Debug, Clone, Default)]
pub struct ClusterTopics {
    partitions: HashMap<String, i32>,
    replicas: HashMap<String, usize>,
    /// Topics with a partition that has no leader now (an election under way, e.g. right
    /// after the topic was created, or its replicas away).
    leaderless: HashSet<String>,
    brokers: usize,
}

impl ClusterTopics {
    fn new(metadata: &rdkafka::metadata::Metadata) -> Self {
        let listed = || metadata.topics().iter().filter(|t| t.error().is_none());
        Self {
            partitions: listed()
                .map(|t| (t.name().to_string(), t.partitions().len() as i32))
                .collect(),
            replicas: listed()
                .map(|t| {
                    let fewest = t.partitions().iter().map(|p| p.replicas().len()).min();
                    (t.name().to_string(), fewest.unwrap_or(0))
                })
                .collect(),
            leaderless: listed()
                .filter(|t| {
                    t.partitions()
                        .iter()
                        .any(|p| p.leader() < 0 || p.error().is_some())
                })
                .map(|t| t.name().to_string())
                .collect(),
            brokers: metadata.brokers().len(),
        }
    }

    /// `topic`'s partition count, if it exists.
    pub fn partitions(&self, topic: &str) -> Option<i32> {
        self.partitions.get(topic).copied()
    }
}

impl StartClient {
    /// Every topic on the cluster with its partition count (listing all topics, because
    /// asking for one by name can auto-create it on some brokers).
    async fn topic_partitions(&self, timeout: Duration) -> Result<ClusterTopics, String> {
        let admin = self.admin().clone();
        tokio::task::spawn_blocking(move || {
            admin
                .inner()
                .fetch_metadata(None, timeout)
                .map(|metadata| ClusterTopics::new(&metadata))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Which of `topics` the brokers' authorizer does not let this principal describe.
    async fn refused_describe(&self, topics: Vec<String>) -> Vec<String> {
        let admin = self.admin().clone();
        tokio::task::spawn_blocking(move || {
            topics
                .into_iter()
                .filter(|topic| {
                    admin
                        .inner()
                        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
                        .is_ok_and(|m| {
                            m.topics().iter().any(|t| {
                                t.error().is_some_and(|e| {
                                    RDKafkaErrorCode::from(e)
                                        == RDKafkaErrorCode::TopicAuthorizationFailed
                                })
                            })
                        })
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    fn admin(&self) -> &Arc<AdminClient<KafkaContext>> {
        self.admin.as_ref().expect("taken only when dropped")
    }
}

impl Drop for StartClient {
    /// rdkafka's admin client, dropped, joins its thread, which wakes every 0.1 s: a start
    /// that waited for it lost up to that. Dropped on a thread of its own.
    fn drop(&mut self) {
        if let Some(admin) = self.admin.take() {
            let _ = std::thread::Builder::new()
                .name("watchbridge-admin-close".into())
                .spawn(move || drop(admin));
        }
    }
}

/// Whether the brokers refused the login (TLS, SASL) of a client with the bridge's settings:
/// librdkafka's reason. A failed login looks like a broker that does not answer to a
/// metadata request ("transport failure"); it says why only in its log, which an admin
/// client never serves (rdkafka polls its log queue only for consumers and producers). So
/// a consumer (of no group) asks again, and its log is read.
async fn login_refused(clients: &KafkaSettings, context: &KafkaContext) -> Option<String> {
    if let Some(refused) = context.health.login_refused() {
        return Some(refused);
    }
    let secured = clients
        .properties
        .all
        .iter()
        .any(|(k, v)| k == "security.protocol" && !v.eq_ignore_ascii_case("plaintext"));
    if !secured {
        return None;
    }
    let consumer: rdkafka::consumer::BaseConsumer<KafkaContext> =
        clients.admin().create_with_context(context.clone()).ok()?;
    let context = context.clone();
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::Consumer;
        if consumer
            .fetch_metadata(None, Duration::from_secs(2))
            .is_ok()
        {
            return None;
        }
        for _ in 0..10 {
            let _ = consumer.poll(Duration::from_millis(50));
            if let Some(refused) = context.health.login_refused() {
                return Some(refused);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// Wait until the brokers answer a metadata request, trying again with backoff (each try a
/// fresh client, with a longer timeout, up to 8 s) until `deadline` (`started` +
/// `WATCHBRIDGE_START_TIMEOUT`); then fail naming both settings. A broker still starting
/// or restarting is waited for: the first failed try is logged, then one every 30 s
/// ([`WaitingForBrokers`]), each at debug. Returns the client that got the answer, with
/// the topics it listed: what [`ensure_topics`] starts from.
pub async fn wait_for_brokers(
    clients: &KafkaSettings,
    context: &KafkaContext,
    started: std::time::Instant,
    deadline: std::time::Instant,
) -> Result<StartClient, KafkaSetupError> {
    let metrics = context.health.metrics().clone();
    let brokers = clients.brokers.as_str();
    // `WATCHBRIDGE_START_TIMEOUT`, as the errors name it.
    let start_timeout = deadline.saturating_duration_since(started);
    let mut tries = 0u32;
    let mut try_timeout = TRY_TIMEOUT.0;
    let mut reported: Option<std::time::Instant> = None;
    loop {
        tries += 1;
        let began = std::time::Instant::now();
        let slot = try_timeout
            .min(deadline.saturating_duration_since(began))
            .max(Duration::from_millis(100));
        let admin: AdminClient<KafkaContext> = clients
            .admin()
            .create_with_context(context.clone())
            .map_err(|e| KafkaSetupError::Config(e.to_string()))?;
        let mut client = StartClient {
            admin: Some(Arc::new(admin)),
            topics: ClusterTopics::default(),
        };
        let error = match client.topic_partitions(slot).await {
            Ok(topics) => {
                BrokersAnswered {
                    brokers,
                    waited: started.elapsed(),
                    tries,
                }
                .emit(&metrics);
                context.health.reached();
                client.topics = topics;
                return Ok(client);
            }
            Err(error) => error,
        };
        // Not a broker that does not answer: one that answered no. Waiting changes nothing.
        if let Some(error) = login_refused(clients, context).await {
            return Err(KafkaSetupError::LoginRefused {
                brokers: brokers.to_string(),
                error,
            });
        }
        if std::time::Instant::now() >= deadline {
            return Err(KafkaSetupError::StartTimeout {
                brokers: brokers.to_string(),
                timeout: start_timeout,
                error,
            });
        }
        let report = match reported {
            None => WaitReport::First,
            Some(at) if at.elapsed() >= WaitingForBrokers::REMIND_EVERY => WaitReport::Reminder,
            Some(_) => WaitReport::Quiet,
        };
        if report != WaitReport::Quiet {
            reported = Some(std::time::Instant::now());
        }
        WaitingForBrokers {
            brokers,
            error: &error,
            waited: started.elapsed(),
            timeout: start_timeout,
            tries,
            report,
        }
        .emit(&metrics);
        // A try that failed at once (refused, not resolved) waits out its slot.
        let slot_end = (began + slot).min(deadline);
        tokio::time::sleep(slot_end.saturating_duration_since(std::time::Instant::now())).await;
        try_timeout = (try_timeout * 2).min(TRY_TIMEOUT.1);
    }
}

/// A topic the bridge reads or writes, and who names it.
pub struct NeededTopic<'a> {
    pub var: &'static str,
    pub name: &'a str,
}

/// Partition counts of the topics the bridge uses.
#[derive(Debug, Clone, Copy)]
pub struct TopicLayout {
    /// The partitions the watches are spread over: the input topic's, or with
    /// repartitioning the repartition topic's.
    pub input_partitions: i32,
    /// With repartitioning, the input topic's partition count (how many upstream
    /// watermarks each watch-side partition takes the minimum of).
    pub upstream_partitions: Option<i32>,
    pub output_partitions: i32,
    /// How old (by its timestamp, the output's event time) an output on the output topic
    /// may be before the broker deletes it: its `retention.ms` where its `cleanup.policy`
    /// deletes; `None` where nothing is deleted by time or the broker does not say.
    pub output_retention: Option<Duration>,
}

/// Make sure the input, output, dead-letter, watermark, state and control topics exist.
/// Missing ones are created (when allowed): the input topic with `WATCHBRIDGE_PARTITIONS`;
/// output, dead-letter and state topics with the input topic's count; the watermark and
/// control topics with one partition. Watermark, state and control topics are compacted (only the latest value per key
/// matters). A state topic whose partition count differs from the input's is refused.
/// `client`: the start's client, with the topics [`wait_for_brokers`] found.
pub async fn ensure_topics(
    clients: &KafkaSettings,
    topics: &TopicSettings,
    embedded: Option<&EmbeddedBroker>,
    client: StartClient,
) -> Result<TopicLayout, KafkaSetupError> {
    let existing = &client.topics;
    let needed = [
        NeededTopic {
            var: "WATCHBRIDGE_INPUT_TOPIC",
            name: &topics.input_topic,
        },
        NeededTopic {
            var: "WATCHBRIDGE_OUTPUT_TOPIC",
            name: &topics.output_topic,
        },
        NeededTopic {
            var: "WATCHBRIDGE_DLQ_TOPIC",
            name: &topics.dlq_topic,
        },
        NeededTopic {
            var: "WATCHBRIDGE_WATERMARK_TOPIC",
            name: &topics.watermark_topic,
        },
        NeededTopic {
            var: "WATCHBRIDGE_STATE_TOPIC",
            name: &topics.state_topic,
        },
        NeededTopic {
            var: "WATCHBRIDGE_CONTROL_TOPIC",
            name: &topics.control_topic,
        },
    ]
    .into_iter()
    .chain(topics.repartition_topic.iter().map(|name| NeededTopic {
        var: "WATCHBRIDGE_REPARTITION_TOPIC",
        name,
    }))
    .collect::<Vec<_>>();
    // A topic the principal may not DESCRIBE is left out of the listing as if it were
    // missing: asked for by name, the broker says which it is.
    let unlisted: Vec<&NeededTopic> = needed
        .iter()
        .filter(|t| existing.partitions(t.name).is_none())
        .collect();
    if !unlisted.is_empty() && embedded.is_none() {
        let names: Vec<String> = unlisted.iter().map(|t| t.name.to_string()).collect();
        let refused = client.refused_describe(names).await;
        let refused: Vec<(&'static str, String)> = unlisted
            .iter()
            .filter(|t| refused.iter().any(|r| r == t.name))
            .map(|t| (t.var, t.name.to_string()))
            .collect();
        if !refused.is_empty() {
            return Err(KafkaSetupError::DescribeRefused { refused });
        }
    }
    if !topics.create_topics {
        // Every missing topic at once, so that one start names all an operator must create.
        let missing: Vec<(&'static str, String)> = needed
            .iter()
            .filter(|t| existing.partitions(t.name).is_none())
            .map(|t| (t.var, t.name.to_string()))
            .collect();
        if !missing.is_empty() {
            return Err(KafkaSetupError::Missing { missing });
        }
    }
    // Every missing topic in one request (one at a time, each took a round trip of its own
    // and an admin client's start: ~0.1 s apiece on Tansu, half of a fresh start).
    let mut input_partitions = existing.partitions(&topics.input_topic);
    let missing: Vec<NewTopicSpec> = needed
        .iter()
        .filter(|t| existing.partitions(t.name).is_none())
        .map(|t| NewTopicSpec {
            name: t.name,
            partitions: if t.name == topics.watermark_topic || t.name == topics.control_topic {
                1
            } else {
                *input_partitions.get_or_insert(topics.partitions)
            },
            compacted: t.name == topics.watermark_topic
                || t.name == topics.state_topic
                || t.name == topics.control_topic,
        })
        .collect();
    let results = match embedded {
        Some(broker) => missing
            .iter()
            .map(|t| broker.create_topic(t.name, t.partitions))
            .collect(),
        None => create_with_admin(client.admin(), topics, &missing).await,
    };
    for (topic, created) in missing.iter().zip(results) {
        let created = match created {
            // Some brokers (librdkafka's mock cluster) answer no CreateTopics but create a
            // topic when it is asked for by name.
            Err(admin_error) if embedded.is_none() => auto_create(clients, topic.name)
                .await
                .map_err(|_| admin_error),
            other => other,
        };
        created.map_err(|error| KafkaSetupError::Create {
            topic: topic.name.to_string(),
            error,
        })?;
        tracing::info!(
            topic = topic.name,
            partitions = topic.partitions,
            "created topic"
        );
    }
    let all: Vec<&str> = needed.iter().map(|t| t.name).collect();
    // Created topics reach every broker's metadata a moment later: wait for them. Where
    // nothing was created, the metadata already read is the answer.
    let layout = if missing.is_empty() {
        existing.clone()
    } else {
        let created: Vec<&str> = missing.iter().map(|t| t.name).collect();
        wait_for_topics(&clients.brokers, &client, &all, &created).await?
    };
    warn_unreplicated(&layout, &all);
    let partitions = |topic: &str| layout.partitions(topic).unwrap_or_default();
    // The watches' partitions: the input topic's, or the repartition topic's.
    let watch_side = topics
        .repartition_topic
        .as_ref()
        .unwrap_or(&topics.input_topic);
    let (expected, found) = (partitions(watch_side), partitions(&topics.state_topic));
    if found != expected {
        return Err(KafkaSetupError::StatePartitions {
            topic: topics.state_topic.clone(),
            found,
            expected,
        });
    }
    // A state topic this start created is compacted by construction; one found is checked.
    let created_state = missing.iter().any(|t| t.name == topics.state_topic);
    if embedded.is_none() && !created_state {
        check_state_cleanup(client.admin(), &topics.state_topic).await?;
    }
    let output_retention = match embedded {
        Some(_) => None,
        None => output_retention(client.admin(), &topics.output_topic).await,
    };
    Ok(TopicLayout {
        input_partitions: partitions(watch_side),
        upstream_partitions: topics
            .repartition_topic
            .as_ref()
            .map(|_| partitions(&topics.input_topic)),
        output_partitions: partitions(&topics.output_topic),
        output_retention,
    })
}

/// The output topic's retention by time (see [`TopicLayout::output_retention`]), said
/// once at start: the broker deletes a record once its timestamp is older than
/// `retention.ms`, and an output's timestamp is its event time, so an output whose event
/// time is older than that is deleted at the broker's next retention check (within
/// `log.retention.check.interval.ms`, 5 minutes by default) — a watch of history loses
/// its outputs unless the topic keeps them (`retention.ms=-1`, or longer than the oldest
/// event time). Such outputs are counted (`watchbridge_outputs_past_retention_total`).
async fn output_retention(admin: &AdminClient<KafkaContext>, topic: &str) -> Option<Duration> {
    let entries = describe_topic(admin, topic).await.ok()?;
    let get = |name: &str| entries.get(name).cloned().flatten();
    let policy = get("cleanup.policy")?;
    let retention = retention_by_time(&policy, get("retention.ms").as_deref())?;
    tracing::info!(
        topic,
        retention_ms = retention.as_millis() as u64,
        "the output topic deletes records by time: an output whose event time (its \
         timestamp) is older than its retention.ms is deleted by the broker within minutes \
         (counted in watchbridge_outputs_past_retention_total; docs/brokers.md, \
         \"Retention and event time\")"
    );
    Some(retention)
}

/// The age past which a topic with `cleanup.policy` `policy` and `retention.ms`
/// `retention_ms` deletes a record (`None`: never by time).
pub fn retention_by_time(policy: &str, retention_ms: Option<&str>) -> Option<Duration> {
    let ms: i64 = retention_ms?.trim().parse().ok()?;
    (has_policy(policy, "delete") && ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Whether the `cleanup.policy` value `policy` (comma-separated, any case) names `wanted`.
fn has_policy(policy: &str, wanted: &str) -> bool {
    policy
        .split(',')
        .any(|p| p.trim().eq_ignore_ascii_case(wanted))
}

/// One WARN line per topic of `topics` with replication factor 1 on a cluster of several
/// brokers: the loss of its one broker loses its records, or stops the bridge until that
/// broker is back (a topic made with an explicit `WATCHBRIDGE_REPLICATION_FACTOR=1`, or by
/// someone else, or before the broker's default applied).
fn warn_unreplicated(cluster: &ClusterTopics, topics: &[&str]) {
    if cluster.brokers < 2 {
        return;
    }
    for topic in topics {
        if cluster.replicas.get(*topic) == Some(&1) {
            tracing::warn!(
                topic = %topic,
                replication_factor = 1,
                brokers = cluster.brokers,
                "a topic the bridge uses has replication factor 1 on a cluster of several \
                 brokers: one broker's loss stops the bridge or loses the topic's records \
                 (recreate it replicated; topics the bridge creates get \
                 WATCHBRIDGE_REPLICATION_FACTOR, by default the broker's \
                 default.replication.factor)"
            );
        }
    }
}

/// Refuse a state topic whose records the broker deletes by time or size (see
/// [`KafkaSetupError::StateNotCompacted`]), where the broker can describe the topic's
/// configuration; where it cannot (Tansu 0.6 answers DescribeConfigs without the topic's
/// settings), say so once and go on.
async fn check_state_cleanup(
    admin: &AdminClient<KafkaContext>,
    topic: &str,
) -> Result<(), KafkaSetupError> {
    let described = describe_topic(admin, topic).await;
    let entries = match described.and_then(|entries| {
        if entries.contains_key("cleanup.policy") {
            Ok(entries)
        } else {
            Err("the broker's answer has no cleanup.policy".to_string())
        }
    }) {
        Ok(entries) => entries,
        Err(error) => {
            cleanup_unknown(topic, &error);
            return Ok(());
        }
    };
    let get = |name: &str| entries.get(name).and_then(|v| v.as_deref());
    match deleting_setting(
        get("cleanup.policy"),
        get("retention.ms"),
        get("retention.bytes"),
    ) {
        Some(setting) => Err(KafkaSetupError::StateNotCompacted {
            topic: topic.to_string(),
            setting,
        }),
        None => Ok(()),
    }
}

fn cleanup_unknown(topic: &str, why: &str) {
    tracing::warn!(
        topic,
        reason = why,
        "cannot read the state topic's cleanup.policy (WATCHBRIDGE_STATE_TOPIC); going on \
         unchecked: it must be compacted, or retention will delete watch state"
    );
}

/// What in a topic's settings makes the broker delete records other than by compaction
/// (`None`: nothing; only a superseded value or a tombstone goes). `cleanup.policy` without
/// `compact` deletes every record past its retention; `compact,delete` also does, unless
/// both retention limits are off (`-1`).
pub fn deleting_setting(
    policy: Option<&str>,
    retention_ms: Option<&str>,
    retention_bytes: Option<&str>,
) -> Option<String> {
    let policy = policy.unwrap_or("delete");
    if !has_policy(policy, "compact") {
        return Some(format!("cleanup.policy={policy}"));
    }
    if !has_policy(policy, "delete") {
        return None;
    }
    let limited = |value: Option<&str>| value.is_some_and(|v| v.trim() != "-1");
    match (limited(retention_ms), limited(retention_bytes)) {
        (true, _) => Some(format!(
            "cleanup.policy={policy} with retention.ms={}",
            retention_ms.unwrap_or_default()
        )),
        (false, true) => Some(format!(
            "cleanup.policy={policy} with retention.bytes={}",
            retention_bytes.unwrap_or_default()
        )),
        (false, false) => None,
    }
}

/// The configuration of `topic` as the broker describes it (name → value).
async fn describe_topic(
    admin: &AdminClient<KafkaContext>,
    topic: &str,
) -> Result<HashMap<String, Option<String>>, String> {
    let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
    let results = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(|e| e.to_string())?;
    match results.into_iter().next() {
        Some(Ok(resource)) => Ok(resource
            .entries
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect()),
        Some(Err(code)) => Err(code.to_string()),
        None => Err("no answer for the topic".into()),
    }
}

/// Topic creation goes to every broker's metadata a moment later, and a new partition's
/// leader is elected a moment after that: wait for both (for the topics this start
/// `created`; a topic found with a partition offline is the partition tasks' to report).
/// Without the leaders, the next reads of a new state or control topic failed with
/// `NotLeaderForPartition` and stopped the start (Apache Kafka, seen in `benches/guarantee.rs`).
async fn wait_for_topics(
    brokers: &str,
    client: &StartClient,
    topics: &[&str],
    created: &[&str],
) -> Result<ClusterTopics, KafkaSetupError> {
    let deadline = tokio::time::Instant::now() + METADATA_TIMEOUT;
    loop {
        let existing = client
            .topic_partitions(METADATA_TIMEOUT)
            .await
            .map_err(|error| KafkaSetupError::Unreachable {
                brokers: brokers.to_string(),
                error,
            })?;
        let electing: Vec<&&str> = created
            .iter()
            .filter(|t| existing.leaderless.contains(**t))
            .collect();
        if electing.is_empty()
            && topics
                .iter()
                .all(|t| existing.partitions(t).is_some_and(|p| p > 0))
        {
            return Ok(existing);
        }
        if tokio::time::Instant::now() > deadline {
            let missing: Vec<_> = topics
                .iter()
                .filter(|t| existing.partitions(t).is_none())
                .collect();
            let error = if missing.is_empty() {
                format!("topics {electing:?}, created by this start, have partitions with no leader after {METADATA_TIMEOUT:?}")
            } else {
                format!("topics {missing:?} did not appear in the metadata")
            };
            return Err(KafkaSetupError::Unreachable {
                brokers: brokers.to_string(),
                error,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A topic to create.
#[derive(Clone)]
struct NewTopicSpec<'a> {
    name: &'a str,
    partitions: i32,
    compacted: bool,
}

/// Create `topics` through the admin API (a real broker) with one request; a result per
/// topic, in order ("already exists" counts as created). Where the broker refuses the
/// replication factor `-1` (its own default; Apache Kafka before 2.4 does), the topics it
/// refused are asked for again with 1, and the log says so.
async fn create_with_admin(
    admin: &AdminClient<KafkaContext>,
    wanted: &TopicSettings,
    topics: &[NewTopicSpec<'_>],
) -> Vec<Result<(), String>> {
    let mut results = create_request(
        admin,
        &wanted.topic_config,
        topics,
        wanted.replication_factor,
    )
    .await;
    let refused: Vec<usize> = (0..topics.len())
        .filter(|&i| results[i] == Err(Refused::Code(RDKafkaErrorCode::InvalidReplicationFactor)))
        .collect();
    if wanted.replication_factor == -1 && !refused.is_empty() {
        tracing::warn!(
            topics = ?refused.iter().map(|&i| topics[i].name).collect::<Vec<_>>(),
            "the broker refused replication factor -1 (its default.replication.factor); \
             creating with replication factor 1 (set WATCHBRIDGE_REPLICATION_FACTOR)"
        );
        let again: Vec<NewTopicSpec<'_>> = refused.iter().map(|&i| topics[i].clone()).collect();
        let retried = create_request(admin, &wanted.topic_config, &again, 1).await;
        for (i, result) in refused.into_iter().zip(retried) {
            results[i] = result;
        }
    }
    results
        .into_iter()
        .map(|r| r.map_err(|refused| refused.to_string()))
        .collect()
}

/// Why the broker did not create a topic.
#[derive(Debug, Clone, PartialEq)]
enum Refused {
    /// Its answer for the topic.
    Code(RDKafkaErrorCode),
    /// The request failed, or the answer did not name the topic.
    Other(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Code(code) => code.fmt(f),
            Refused::Other(error) => f.write_str(error),
        }
    }
}

/// One CreateTopics request for `topics` with `replication` (`-1`: the broker's default):
/// the user's `WATCHBRIDGE_TOPIC_CONFIG`, then the bridge's own configs over it.
async fn create_request(
    admin: &AdminClient<KafkaContext>,
    topic_config: &[(String, String)],
    topics: &[NewTopicSpec<'_>],
    replication: i32,
) -> Vec<Result<(), Refused>> {
    if topics.is_empty() {
        return Vec::new();
    }
    let everyone = |error: String| {
        let refused = Refused::Other(error);
        topics.iter().map(|_| Err(refused.clone())).collect()
    };
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            let own: &[(&str, &str)] = if t.compacted {
                &[("cleanup.policy", "compact")]
            } else {
                &[]
            };
            let user = topic_config
                .iter()
                .filter(|(key, _)| !own.iter().any(|(k, _)| k == key))
                .map(|(k, v)| (k.as_str(), v.as_str()));
            user.chain(own.iter().copied()).fold(
                NewTopic::new(t.name, t.partitions, TopicReplication::Fixed(replication)),
                |new, (key, value)| new.set(key, value),
            )
        })
        .collect();
    let options = AdminOptions::new()
        .operation_timeout(Some(METADATA_TIMEOUT))
        .request_timeout(Some(METADATA_TIMEOUT));
    let results = match admin.create_topics(&new, &options).await {
        Ok(results) => results,
        Err(e) => return everyone(e.to_string()),
    };
    topics
        .iter()
        .map(|t| {
            let result = results.iter().find(|r| match r {
                Ok(name) | Err((name, _)) => name == t.name,
            });
            match result {
                Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(()),
                Some(Err((_, code))) => Err(Refused::Code(*code)),
                None => Err(Refused::Other("the broker's answer did not name it".into())),
            }
        })
        .collect()
}

/// Ask for `topic`'s metadata by name with a producer, which lets a broker with automatic
/// topic creation create it; succeed only if it then exists.
async fn auto_create(clients: &KafkaSettings, topic: &str) -> Result<(), String> {
    let client_config = clients.metadata_producer();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let producer: rdkafka::producer::BaseProducer =
            client_config.create().map_err(|e| e.to_string())?;
        let metadata = producer
            .client()
            .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
            .map_err(|e| e.to_string())?;
        match metadata.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
            _ => Err(format!("topic `{topic}` was not created automatically")),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

/// What the brokers say about themselves: how many the metadata lists, and broker-wide
/// settings as the first of them describes them.
#[derive(Debug, Default)]
pub struct BrokerSettings {
    pub brokers: usize,
    values: HashMap<String, String>,
    /// Why the settings are not known (the broker count is), if they are not.
    pub unknown: Option<String>,
}

impl BrokerSettings {
    /// `brokers` brokers whose settings are `values`.
    pub fn known<'a>(brokers: usize, values: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self {
            brokers,
            values: values
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            unknown: None,
        }
    }

    /// `brokers` brokers whose settings are not known, for the reason `why`.
    pub fn unknown(brokers: usize, why: String) -> Self {
        Self {
            brokers,
            values: HashMap::new(),
            unknown: Some(why),
        }
    }

    /// A setting in milliseconds (`None`: not described, or not a number).
    pub fn millis(&self, name: &str) -> Option<Duration> {
        self.values
            .get(name)
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
    }
}

/// The broker count and the broker-wide settings `names` (e.g. `transaction.max.timeout.ms`)
/// as the first broker the metadata lists describes them (a name it does not describe is
/// left out). A fresh admin client, dropped on a thread of its own; asked once, at start,
/// and only where the answer changes what the start does. The settings need
/// `DescribeConfigs` on the cluster, which a least-privilege principal may lack (and a
/// broker may not answer): then they are `unknown`, and callers go on without them; an
/// error is the metadata's.
pub async fn broker_settings(
    clients: &KafkaSettings,
    context: &KafkaContext,
    names: &[&str],
) -> Result<BrokerSettings, String> {
    let admin: AdminClient<KafkaContext> = clients
        .admin()
        .create_with_context(context.clone())
        .map_err(|e| e.to_string())?;
    let admin = Arc::new(admin);
    let lookup = admin.clone();
    let listed = tokio::task::spawn_blocking(move || {
        lookup
            .inner()
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                m.brokers()
                    .first()
                    .map(|b| (b.id(), m.brokers().len()))
                    .ok_or_else(|| "the metadata lists no broker".to_string())
            })
    })
    .await
    .map_err(|e| e.to_string())?;
    let result = match listed {
        Ok((id, count)) => {
            let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
            let described = match admin
                .describe_configs([&ResourceSpecifier::Broker(id)], &options)
                .await
            {
                Ok(results) => match results.into_iter().next() {
                    Some(Ok(resource)) => Ok(resource
                        .entries
                        .into_iter()
                        .filter(|e| names.contains(&e.name.as_str()))
                        .filter_map(|e| Some((e.name, e.value?)))
                        .collect()),
                    Some(Err(code)) => Err(code.to_string()),
                    None => Err("no answer for the broker".to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            Ok(match described {
                Ok(values) => BrokerSettings {
                    brokers: count,
                    values,
                    unknown: None,
                },
                Err(why) => BrokerSettings::unknown(count, why),
            })
        }
        Err(e) => Err(e),
    };
    crate::kafka::drop_later::drop_later(admin);
    result
}

#[cfg(test)]
mod tests {
    use super::{deleting_setting, retention_by_time};
    use std::time::Duration;

    #[test]
    fn an_output_topic_deletes_by_time_only_with_delete_and_a_retention() {
        let day = Some(Duration::from_millis(86_400_000));
        assert_eq!(retention_by_time("delete", Some("86400000")), day);
        assert_eq!(retention_by_time("compact, Delete", Some("86400000")), day);
        assert_eq!(retention_by_time("compact", Some("86400000")), None);
        assert_eq!(retention_by_time("delete", Some("-1")), None);
        assert_eq!(retention_by_time("delete", None), None);
    }

    #[test]
    fn only_a_topic_that_deletes_nothing_but_by_compaction_keeps_watch_state() {
        let verdict = |p, ms, bytes| deleting_setting(p, ms, bytes);
        assert_eq!(
            verdict(Some("compact"), Some("604800000"), Some("-1")),
            None
        );
        assert_eq!(verdict(Some("Compact"), None, None), None);
        assert_eq!(
            verdict(Some("delete"), Some("-1"), Some("-1")).as_deref(),
            Some("cleanup.policy=delete")
        );
        assert_eq!(
            verdict(None, None, None).as_deref(),
            Some("cleanup.policy=delete"),
            "Kafka's default"
        );
        assert_eq!(
            verdict(Some("compact,delete"), Some("604800000"), Some("-1")).as_deref(),
            Some("cleanup.policy=compact,delete with retention.ms=604800000")
        );
        assert_eq!(
            verdict(Some("delete, compact"), Some("-1"), Some("1000")).as_deref(),
            Some("cleanup.policy=delete, compact with retention.bytes=1000")
        );
        assert_eq!(
            verdict(Some("compact,delete"), Some("-1"), Some("-1")),
            None
        );
    }
}

//! A real Kafka-protocol broker for integration tests: one broker process per test binary,
//! Tansu (the default) or Apache Kafka, chosen by `WATCHBRIDGE_TEST_BROKER=tansu|kafka`
//! (docs/brokers.md); or a replicated cluster of Apache Kafka nodes,
//! `WATCHBRIDGE_TEST_BROKER=kafka3` (three nodes; `kafkaN` for N), whose topics get
//! replication factor 3 and `min.insync.replicas=2`. [`Broker::kind`] says which broker,
//! [`Broker::nodes`] how many nodes.
//!
//! Tansu 0.6 differs from Apache Kafka in ways the helpers here account for (see
//! `/work/shared/notes/tansu-0.6.md`): it never creates topics on its own, so producing to a
//! missing topic hangs until the producer's message timeout — tests create their topics with
//! [`Broker::create_topic`] (the Kafka broker is configured the same way:
//! `auto.create.topics.enable=false`); and it panics on a busy port, so the fixture retries
//! on another.
//!
//! Tansu is `$TANSU_BIN`, else whatever `scripts/tansu.sh path` prints (which builds it once
//! into a cache outside the clone); Kafka is the release `scripts/kafka.sh` installs (jars
//! fetched once into the same cache). The broker's dir (its data, `broker.log`) is removed
//! when the test binary exits, unless `WATCHBRIDGE_KEEP_TEST_DIRS` is set.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::broker_process::BrokerProcess;
use super::tansu_process::{tansu_bin, Storage};

/// How long a topic may take to show up in metadata after CreateTopics.
const TOPIC_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds every produce: a record for a missing topic fails after this instead of hanging.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(15);

/// Which broker the tests run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// Tansu 0.6 with SQLite storage: no transactions, no compaction.
    Tansu,
    /// Apache Kafka (the release `scripts/kafka.sh` pins), one KRaft node.
    Kafka,
}

impl BrokerKind {
    /// The variable that chooses the broker.
    pub const VARIABLE: &'static str = "WATCHBRIDGE_TEST_BROKER";

    /// `WATCHBRIDGE_TEST_BROKER`: `tansu` (also when unset or empty), `kafka`, or `kafkaN`
    /// (a cluster of N Kafka nodes).
    pub fn from_env() -> Result<BrokerKind, String> {
        Self::with_nodes_from_env().map(|(kind, _)| kind)
    }

    /// [`BrokerKind::from_env`] and how many nodes: 1 but for `kafkaN`.
    pub fn with_nodes_from_env() -> Result<(BrokerKind, usize), String> {
        let value = std::env::var(Self::VARIABLE).unwrap_or_default();
        let name = value.trim().to_ascii_lowercase();
        let nodes = name.strip_prefix("kafka").map(|n| match n {
            "" => Ok(1),
            n => n.parse::<usize>().ok().filter(|&n| n >= 1).ok_or(()),
        });
        match (name.as_str(), nodes) {
            ("" | "tansu", _) => Ok((BrokerKind::Tansu, 1)),
            (_, Some(Ok(nodes))) => Ok((BrokerKind::Kafka, nodes)),
            _ => Err(format!(
                "{}={value:?}: not a test broker; use `tansu` (the default), `kafka`, or \
                 `kafka3` (three replicated Kafka nodes)",
                Self::VARIABLE
            )),
        }
    }

    /// `tansu` or `kafka`, as the variable spells it.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Tansu => "tansu",
            BrokerKind::Kafka => "kafka",
        }
    }
}

/// The running broker. Obtain it with [`broker()`].
pub struct Broker {
    bootstrap: String,
    dir: PathBuf,
    /// The broker under its watchdog, or each node of a cluster (node id `i + 1` at `i`).
    /// Never dropped (statics aren't), so the watchdogs' pipes stay open exactly as long as
    /// this process lives. [`Broker::restart`] replaces the processes inside.
    nodes: Mutex<Vec<BrokerProcess>>,
    kind: BrokerKind,
    producer: OnceLock<FutureProducer>,
    admin: OnceLock<AdminClient<DefaultClientContext>>,
}

/// The broker shared by every test in this binary, started on first use. If it can't start,
/// every test panics with the same message (rather than each trying again).
pub fn broker() -> &'static Broker {
    match BROKER.get_or_init(Broker::start) {
        Ok(broker) => broker,
        Err(e) => panic!("{e}"),
    }
}

static BROKER: OnceLock<Result<Broker, String>> = OnceLock::new();

/// Make the Apache Kafka node `start` gives (its first listener the bootstrap) this
/// binary's [`broker()`], unless one is already: a binary whose broker is special (the
/// secured node of `support::secured`) calls this before anything else asks for it.
pub fn broker_from(start: impl FnOnce() -> Result<BrokerProcess, String>) -> &'static Broker {
    let made = BROKER.get_or_init(|| {
        let process = start()?;
        Ok(Broker {
            bootstrap: process.bootstrap.clone(),
            dir: process.dir.clone(),
            nodes: Mutex::new(vec![process]),
            kind: BrokerKind::Kafka,
            producer: OnceLock::new(),
            admin: OnceLock::new(),
        })
    });
    match made {
        Ok(broker) => broker,
        Err(e) => panic!("{e}"),
    }
}

impl Broker {
    /// The broker `WATCHBRIDGE_TEST_BROKER` names; Tansu with SQLite storage, so that
    /// [`Broker::restart`] keeps what it stored.
    fn start() -> Result<Broker, String> {
        let (kind, nodes) = BrokerKind::with_nodes_from_env()?;
        if nodes > 1 {
            return Self::cluster(nodes);
        }
        Self::launch(kind, None)
    }

    /// A cluster of `nodes` Apache Kafka nodes.
    fn cluster(nodes: usize) -> Result<Broker, String> {
        let cluster = BrokerProcess::kafka_cluster("watchbridge-kafka-", nodes)?;
        Ok(Broker {
            bootstrap: cluster
                .iter()
                .map(|n| n.bootstrap.as_str())
                .collect::<Vec<_>>()
                .join(","),
            dir: cluster[0].dir.clone(),
            nodes: Mutex::new(cluster),
            kind: BrokerKind::Kafka,
            producer: OnceLock::new(),
            admin: OnceLock::new(),
        })
    }

    /// A broker of its own for one test (of the kind `WATCHBRIDGE_TEST_BROKER` names), for
    /// tests that stop, pause or crash it: the shared [`broker()`] must stay up for the other
    /// tests of the binary. Stopped, and its dir removed, when dropped.
    pub fn own() -> Broker {
        Self::launch(
            BrokerKind::from_env().unwrap_or_else(|e| panic!("{e}")),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Broker::own`] listening on `ports` ([`Broker::ports_needed`] of them: Kafka's
    /// second one is its controller's), e.g. where a bridge already looks for it.
    pub fn own_on(ports: &[u16]) -> Broker {
        Self::launch(
            BrokerKind::from_env().unwrap_or_else(|e| panic!("{e}")),
            Some(ports),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// How many loopback ports a broker of `WATCHBRIDGE_TEST_BROKER`'s kind listens on (the
    /// first is the clients' one).
    pub fn ports_needed() -> usize {
        match BrokerKind::with_nodes_from_env().unwrap_or_else(|e| panic!("{e}")) {
            (BrokerKind::Kafka, nodes) if nodes > 1 => {
                panic!("a test that starts a broker of its own runs on one node, not {nodes}")
            }
            (BrokerKind::Tansu, _) => 1,
            (BrokerKind::Kafka, _) => 2,
        }
    }

    fn launch(kind: BrokerKind, on: Option<&[u16]>) -> Result<Broker, String> {
        let process = match kind {
            BrokerKind::Tansu => {
                BrokerProcess::tansu_on(&tansu_bin(), Storage::Sqlite, "watchbridge-tansu-", on)?
            }
            BrokerKind::Kafka => BrokerProcess::kafka_on("watchbridge-kafka-", on)?,
        };
        Ok(Broker {
            bootstrap: process.bootstrap.clone(),
            dir: process.dir.clone(),
            nodes: Mutex::new(vec![process]),
            kind,
            producer: OnceLock::new(),
            admin: OnceLock::new(),
        })
    }

    /// Which broker this is.
    pub fn kind(&self) -> BrokerKind {
        self.kind
    }

    /// Crashes the broker (SIGKILL) and starts it again on the same port(s) with the same
    /// dir, so its storage (topics, records, committed offsets, groups) carries over, as it
    /// does for a real broker restart. Clients reconnect on their own. For fault tests; a
    /// test binary whose tests share the broker must not call it while others run.
    /// On a cluster: every node in turn (a rolling restart: the others keep the quorum).
    pub fn restart(&self) {
        for node in self.nodes.lock().unwrap().iter_mut() {
            node.restart();
        }
    }

    /// Crashes the broker (SIGKILL), keeping its dir: it is gone until
    /// [`Broker::start_again`]. Only for a broker of a test's own ([`Broker::own`]).
    pub fn kill(&self) {
        self.single()[0].kill();
    }

    /// Starts the broker again after [`Broker::kill`], on the same port(s) and data.
    pub fn start_again(&self) {
        self.single()[0].start_again();
    }

    /// The broker's process id, for SIGSTOP and SIGCONT (of a one-node broker; a cluster's
    /// are [`Broker::node_pid`]).
    pub fn pid(&self) -> String {
        self.single()[0].pid()
    }

    /// The one node of a broker that is not a cluster.
    fn single(&self) -> std::sync::MutexGuard<'_, Vec<BrokerProcess>> {
        let nodes = self.nodes.lock().unwrap();
        assert_eq!(
            nodes.len(),
            1,
            "this test handles one broker process; a cluster's nodes are handled one by one \
             (node_pid, restart_node)"
        );
        nodes
    }

    /// How many nodes: 1, or a cluster's (`WATCHBRIDGE_TEST_BROKER=kafka3`).
    pub fn nodes(&self) -> usize {
        self.nodes.lock().unwrap().len()
    }

    /// The process id of node `id` (1-based, Kafka's `node.id`).
    pub fn node_pid(&self, id: i32) -> String {
        self.nodes.lock().unwrap()[id as usize - 1].pid()
    }

    /// SIGKILLs node `id` and starts it again on its ports and data; it rejoins the cluster.
    pub fn restart_node(&self, id: i32) {
        self.nodes.lock().unwrap()[id as usize - 1].restart();
    }

    /// SIGKILLs node `id`, keeping its data: it is down until [`Broker::start_node`]. The
    /// partitions whose only in-sync replica it was go offline (no unclean election).
    pub fn kill_node(&self, id: i32) {
        self.nodes.lock().unwrap()[id as usize - 1].kill();
    }

    /// Starts node `id` again after [`Broker::kill_node`], on its ports and data, and waits
    /// until it answers; it rejoins the cluster.
    pub fn start_node(&self, id: i32) {
        self.nodes.lock().unwrap()[id as usize - 1].start_again();
    }

    /// The last lines of the broker's log (every node's, on a cluster), for failure
    /// messages.
    pub fn log_tail(&self) -> String {
        let nodes = self.nodes.lock().unwrap();
        match nodes.as_slice() {
            [one] => one.log_tail(),
            all => all
                .iter()
                .enumerate()
                .map(|(i, n)| format!("node {}:\n{}", i + 1, n.log_tail()))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The node id of the leader of `topic`'s `partition` (from metadata), and its
    /// replicas: what a fault test pauses or restarts.
    pub fn leader_and_replicas(&self, topic: &str, partition: i32) -> Option<(i32, Vec<i32>)> {
        let consumer = self.base_consumer("watchbridge-test-metadata");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let t = metadata.topics().iter().find(|t| t.name() == topic)?;
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        Some((p.leader(), p.replicas().to_vec()))
    }

    /// The node that leads `__transaction_state`'s partition for `transactional_id`: its
    /// transaction coordinator (Kafka's rule: the id's Java `hashCode`, made positive, modulo
    /// the 4 partitions `scripts/kafka.sh` gives the topic).
    pub fn transaction_coordinator(&self, transactional_id: &str) -> Option<i32> {
        let partition = coordinator_partition(transactional_id, 4);
        self.leader_and_replicas("__transaction_state", partition)
            .map(|(leader, _)| leader)
    }

    /// The node that coordinates consumer group `group` (the leader of its
    /// `__consumer_offsets` partition, the same rule over 4 partitions).
    pub fn group_coordinator(&self, group: &str) -> Option<i32> {
        let partition = coordinator_partition(group, 4);
        self.leader_and_replicas("__consumer_offsets", partition)
            .map(|(leader, _)| leader)
    }

    /// The node that is the active KRaft controller, as the quorum tool says.
    pub fn active_controller(&self) -> Result<i32, String> {
        let out = self.kafka_tool(
            "org.apache.kafka.tools.MetadataQuorumCommand",
            &["describe", "--status"],
        )?;
        out.lines()
            .find_map(|l| l.strip_prefix("LeaderId:"))
            .and_then(|id| id.trim().parse().ok())
            .ok_or_else(|| format!("no LeaderId in the quorum tool's answer:\n{out}"))
    }

    /// Moves every partition's leadership back to its preferred replica by hand (Kafka's
    /// `kafka-leader-election --election-type PREFERRED --all-topic-partitions`): after a
    /// node's pause or restart, leaders move as an operator would move them.
    pub fn elect_preferred_leaders(&self) -> Result<String, String> {
        self.kafka_tool(
            "org.apache.kafka.tools.LeaderElectionCommand",
            &["--election-type", "PREFERRED", "--all-topic-partitions"],
        )
    }

    /// Moves the leadership of `topic`'s `partition` to another of its replicas by hand, as
    /// an operator would: a reassignment to the same replicas in an order that puts another
    /// one first (no data moves), then a preferred-leader election of that partition. Returns
    /// (old leader, new leader) once metadata shows the new one.
    pub fn move_leader(&self, topic: &str, partition: i32) -> Result<(i32, i32), String> {
        let (leader, replicas) = self
            .leader_and_replicas(topic, partition)
            .ok_or_else(|| format!("no metadata for {topic}/{partition}"))?;
        let Some(&to) = replicas.iter().find(|&&r| r != leader) else {
            return Err(format!(
                "{topic}/{partition} has no replica but its leader {leader}"
            ));
        };
        let mut order = vec![to];
        order.extend(replicas.iter().filter(|&&r| r != to));
        let plan = serde_json::json!({
            "version": 1,
            "partitions": [{"topic": topic, "partition": partition, "replicas": order}],
        });
        let file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        std::fs::write(file.path(), plan.to_string()).map_err(|e| e.to_string())?;
        let path = file.path().to_string_lossy().into_owned();
        self.kafka_tool(
            "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
            &["--reassignment-json-file", &path, "--execute"],
        )?;
        let partition_arg = partition.to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // The new order may take a moment to reach the controller's view; an election
            // before that elects the old leader again.
            let _ = self.kafka_tool(
                "org.apache.kafka.tools.LeaderElectionCommand",
                &[
                    "--election-type",
                    "PREFERRED",
                    "--topic",
                    topic,
                    "--partition",
                    &partition_arg,
                ],
            );
            if let Some((now, _)) = self.leader_and_replicas(topic, partition) {
                if now == to {
                    return Ok((leader, to));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{topic}/{partition}: leader still not {to} 20 s after the reassignment"
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Runs one of Kafka's command-line tools (its main class) against this broker; its
    /// standard output, or why it failed.
    pub fn kafka_tool(&self, class: &str, args: &[&str]) -> Result<String, String> {
        assert_eq!(self.kind, BrokerKind::Kafka, "Kafka's tools need Kafka");
        let libs = super::broker_process::installed_path("kafka.sh", "");
        let out = std::process::Command::new("java")
            .args(["-Xmx256m", "-XX:TieredStopAtLevel=1"])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(libs.join("*"))
            .arg(class)
            .args(["--bootstrap-server", &self.bootstrap])
            .args(args)
            .output()
            .map_err(|e| format!("run {class}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{class} {args:?} failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Replicas of the topics tests create: 3 on a cluster of three or more nodes (what the
    /// cluster's `default.replication.factor` says), else 1.
    fn replication(&self) -> i32 {
        self.nodes().min(3) as i32
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The broker's working dir (its data and `broker.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A client config with `bootstrap.servers` set, for clients a test builds itself.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }

    /// A topic name no other call in this test binary returns, so tests sharing the broker
    /// don't see each other's records.
    pub fn unique_topic(&self, prefix: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Creates the topic (replication 1, 3 on a cluster) and waits until metadata shows all
    /// its partitions.
    /// A topic that already exists is fine. Neither test broker creates topics on its own.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        self.create_topic_with(name, partitions, &[]).await
    }

    /// [`Broker::create_topic`] with topic configs, e.g. `("cleanup.policy", "compact")`.
    pub async fn create_topic_with(&self, name: &str, partitions: i32, configs: &[(&str, &str)]) {
        let admin = self
            .admin
            .get_or_init(|| self.config().create().expect("create a Kafka admin client"));
        let mut topic = NewTopic::new(
            name,
            partitions,
            TopicReplication::Fixed(self.replication()),
        );
        for (key, value) in configs {
            topic = topic.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .unwrap_or_else(|e| panic!("CreateTopics {name}: {e}"));
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => panic!("CreateTopics {topic}: {code}"),
            }
        }
        let deadline = Instant::now() + TOPIC_TIMEOUT;
        loop {
            // A metadata request that times out is asked again: a busy broker (Tansu, with
            // the other tests' bridges) was seen to miss the 5 s now and then.
            let seen = self.try_partitions(name);
            if seen == Ok(Some(partitions)) {
                return;
            }
            if Instant::now() > deadline {
                panic!("topic {name}: metadata shows {seen:?} partitions, not {partitions}, after {TOPIC_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many partitions metadata shows for the topic; `None` if it doesn't exist (yet).
    pub fn partitions(&self, topic: &str) -> Option<i32> {
        self.try_partitions(topic)
            .unwrap_or_else(|e| panic!("metadata for {topic}: {e}"))
    }

    /// [`Broker::partitions`], or why the metadata request failed.
    pub fn try_partitions(&self, topic: &str) -> Result<Option<i32>, String> {
        let consumer = self.base_consumer("watchbridge-test-metadata");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        if t.error().is_some() || t.partitions().is_empty() {
            return Ok(None);
        }
        Ok(Some(t.partitions().len() as i32))
    }

    /// Produces one record with the idempotent producer (acks=all) and waits for its
    /// delivery; returns its (partition, offset). `partition: None` lets the partitioner
    /// choose (by key). The topic must exist.
    pub async fn produce(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> (i32, i64) {
        self.send(topic, partition, key, value, headers, None).await
    }

    /// [`Broker::produce`] with an explicit record timestamp (CreateTime, ms since the epoch).
    pub async fn produce_at(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
        timestamp_ms: i64,
    ) -> (i32, i64) {
        self.send(topic, partition, key, value, headers, Some(timestamp_ms))
            .await
    }

    async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(&str, &[u8])],
        timestamp_ms: Option<i64>,
    ) -> (i32, i64) {
        // One producer for the whole binary: an idempotent producer's setup (InitProducerId)
        // costs a round trip or two, and it is safe to share across test runtimes.
        let producer = self.producer.get_or_init(|| {
            self.config()
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("linger.ms", "0")
                .set(
                    "message.timeout.ms",
                    PRODUCE_TIMEOUT.as_millis().to_string(),
                )
                .create()
                .expect("create the test producer")
        });
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (name, value) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(*value),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .headers(owned);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        if let Some(ts) = timestamp_ms {
            record = record.timestamp(ts);
        }
        match producer.send(record, Duration::from_secs(5)).await {
            Ok(delivery) => (delivery.partition, delivery.offset),
            Err((e, _)) => panic!(
                "produce to {topic} (partition {partition:?}): {e} \
                 (the test brokers don't create topics: did the test call create_topic?)"
            ),
        }
    }

    /// Produces `records` (key, value) to `partition` of `topic` in one committed transaction
    /// on Apache Kafka, so that the partition ends in a transaction marker (an offset no
    /// reader is handed); on Tansu, which has no transactions, one by one. Returns whether
    /// they went in a transaction.
    pub async fn produce_in_transaction(
        &self,
        topic: &str,
        partition: i32,
        records: &[(&[u8], &[u8])],
    ) -> bool {
        if self.kind == BrokerKind::Tansu {
            for (key, value) in records {
                self.produce(topic, Some(partition), Some(key), value, &[])
                    .await;
            }
            return false;
        }
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = format!(
            "watchbridge-test-txn-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let producer: BaseProducer = self
            .config()
            .set("transactional.id", &id)
            .create()
            .expect("create a transactional producer");
        let timeout = Duration::from_secs(30);
        let records: Vec<(Vec<u8>, Vec<u8>)> = records
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            producer
                .init_transactions(timeout)
                .expect("init_transactions");
            producer.begin_transaction().expect("begin_transaction");
            for (key, value) in &records {
                producer
                    .send(
                        BaseRecord::to(&topic)
                            .partition(partition)
                            .key(&key[..])
                            .payload(&value[..]),
                    )
                    .map_err(|(e, _)| e)
                    .expect("send in a transaction");
            }
            producer.flush(timeout).expect("flush");
            producer
                .commit_transaction(timeout)
                .expect("commit_transaction");
        })
        .await
        .unwrap();
        true
    }

    /// Reads every partition of `topic` from its beginning until `n` records have arrived,
    /// in arrival order (ordered within a partition only). Panics at `timeout` with what it
    /// read so far. Partitions are assigned directly (no group join, so no rebalance delay);
    /// the group id is fresh and nothing is committed. A wait for at least `n`: it says
    /// nothing about what comes later (for that, stop the writer and [`Broker::read_to_end`]).
    pub async fn consume(&self, topic: &str, n: usize, timeout: Duration) -> Vec<OwnedMessage> {
        let consumer = self.reader(topic);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut read = Vec::with_capacity(n);
        while read.len() < n {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(Ok(message)) => read.push(message.detach()),
                Ok(Err(e)) => panic!("consume {topic}: {e}"),
                Err(_) => panic!(
                    "consume {topic}: {} of {n} records within {timeout:?}; read: {:#?}",
                    read.len(),
                    summarize(&read)
                ),
            }
        }
        read
    }

    /// The offsets `group` has committed for partitions `0..partitions` of `topic`: the next
    /// offset to read, or -1 where it has committed none. Reads them without joining the
    /// group, so it doesn't disturb the members.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer = self.base_consumer(group);
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let tpl = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("committed offsets of {group} on {topic}: {e}"));
        (0..partitions)
            .map(|p| match tpl.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            })
            .collect()
    }

    /// The low and end (high watermark) offsets of `topic`/`partition`.
    pub fn offsets(&self, topic: &str, partition: i32) -> (i64, i64) {
        self.base_consumer("watchbridge-test-offsets")
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("offsets of {topic}/{partition}: {e}"))
    }

    /// A consumer that isn't a group member (nothing subscribed or committed).
    fn base_consumer(&self, group: &str) -> BaseConsumer {
        self.config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("create a Kafka consumer")
    }

    /// Every committed record of `topic` up to the end offsets it has now, all partitions, in
    /// partition then offset order (panics if they are not all read within 90 s). Read
    /// `read_committed`: what a transaction aborted is not there, and a partition whose last
    /// offsets are a transaction marker (never handed to a reader) ends at its end of
    /// partition, not at its last record.
    pub async fn read_to_end(&self, topic: &str) -> Vec<OwnedMessage> {
        let consumer = self.reader_until_eof(topic);
        let assignment = consumer
            .assignment()
            .unwrap_or_else(|e| panic!("assignment of {topic}: {e}"));
        let mut remaining: HashMap<i32, i64> = HashMap::new();
        for element in assignment.elements() {
            let p = element.partition();
            // Asked again while it fails: a topic just created may have no leader yet
            // (Apache Kafka answers `NotLeaderForPartition` for a moment).
            let asked = std::time::Instant::now();
            let (low, high) = loop {
                match consumer.fetch_watermarks(topic, p, Duration::from_secs(20)) {
                    Ok(offsets) => break offsets,
                    Err(e) if asked.elapsed() < Duration::from_secs(20) => {
                        eprintln!("offsets of {topic}/{p}: {e}; asking again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("offsets of {topic}/{p}: {e}"),
                }
            };
            if high > low {
                remaining.insert(p, high);
            }
        }
        let mut read = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        while !remaining.is_empty() {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(Ok(m)) => {
                    let m = m.detach();
                    if let Some(&high) = remaining.get(&m.partition()) {
                        if m.offset() + 1 >= high {
                            remaining.remove(&m.partition());
                        }
                    }
                    read.push(m);
                }
                Ok(Err(KafkaError::PartitionEOF(p))) => {
                    let position = consumer.position().ok().and_then(|tpl| {
                        match tpl.find_partition(topic, p)?.offset() {
                            Offset::Offset(o) => Some(o),
                            _ => None,
                        }
                    });
                    if remaining
                        .get(&p)
                        .is_some_and(|&high| position.is_some_and(|o| o >= high))
                    {
                        remaining.remove(&p);
                    }
                }
                Ok(Err(e)) => panic!("read {topic}: {e}"),
                Err(_) => panic!(
                    "read {topic}: {} records, partitions {remaining:?} not read to their end in 90 s",
                    read.len()
                ),
            }
        }
        read.sort_by_key(|m| (m.partition(), m.offset()));
        read
    }

    /// A `read_committed` consumer of every partition of `topic` from its beginning that
    /// reports each end of partition.
    fn reader_until_eof(&self, topic: &str) -> StreamConsumer {
        self.reader_with(topic, |c| {
            c.set("enable.partition.eof", "true")
                .set("isolation.level", "read_committed");
        })
    }

    /// A consumer assigned every partition of `topic` at its beginning.
    fn reader(&self, topic: &str) -> StreamConsumer {
        self.reader_with(topic, |_| {})
    }

    /// [`Broker::reader`] with `settings` applied to its config first.
    fn reader_with(&self, topic: &str, settings: impl FnOnce(&mut ClientConfig)) -> StreamConsumer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let group = format!("watchbridge-test-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut config = self.config();
        settings(&mut config);
        let consumer: StreamConsumer = config
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // Against Tansu, a multi-partition topic's records arrive in steps of up to this
            // (default 500 ms); a short wait keeps reads fast.
            .set("fetch.wait.max.ms", "20")
            .create()
            .expect("create a Kafka consumer");
        // Also warms the consumer: assigned before it has metadata, its first record
        // arrives ~500 ms later; after this, ~10 ms.
        // (A broker busy with a bridge's writes can take seconds to answer.)
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("metadata for {topic}: {e}"));
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len() as i32)
            .unwrap_or_else(|| panic!("consume {topic}: no such topic (create_topic it first)"));
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("offset for the assignment");
        }
        consumer
            .assign(&tpl)
            .unwrap_or_else(|e| panic!("assign {topic}: {e}"));
        consumer
    }
}

/// Whether `message` is a restoring partition's settle record (`watchbridge-control:
/// settle`, `partition/settle.rs`): no output, no watermark.
pub fn is_settle(message: &OwnedMessage) -> bool {
    header(message, "watchbridge-control") == Some(b"settle".as_slice())
}

/// The value of the first header called `name`; a header with a null value reads as empty.
pub fn header<'m>(message: &'m OwnedMessage, name: &str) -> Option<&'m [u8]> {
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.unwrap_or_default())
}

/// The identity of an output record: its `watchbridge-output-key` header or, without it (a
/// bridge with the default `WATCHBRIDGE_OUTPUT_HEADERS`), the `id` of its JSON value, which
/// is the key of every test feed's items ("" if it has neither).
pub fn output_key(m: &OwnedMessage) -> String {
    if let Some(v) = header(m, "watchbridge-output-key") {
        return String::from_utf8_lossy(v).into_owned();
    }
    m.payload()
        .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
        .and_then(|v| v.get("id")?.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The input partition whose watch wrote an output: its `watchbridge-input-partition`
/// header, or the last 4 bytes (big-endian) of its 20-byte `wb-id`.
pub fn input_partition(m: &OwnedMessage) -> Option<i32> {
    if let Some(v) = header(m, "watchbridge-input-partition") {
        return std::str::from_utf8(v).ok()?.parse().ok();
    }
    let id: &[u8; 20] = header(m, "wb-id")?.try_into().ok()?;
    Some(i32::from_be_bytes(id[16..].try_into().ok()?))
}

/// All headers as (name, value) pairs, in order; a null value reads as empty.
pub fn headers(message: &OwnedMessage) -> Vec<(String, Vec<u8>)> {
    message
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default()
}

/// Partition, offset, key and value of each record, readable in a panic message.
fn summarize(read: &[OwnedMessage]) -> Vec<String> {
    read.iter()
        .map(|m| {
            format!(
                "p{} @{} key={:?} value={:?}",
                m.partition(),
                m.offset(),
                m.key().map(String::from_utf8_lossy),
                m.payload().map(String::from_utf8_lossy)
            )
        })
        .collect()
}

/// The partition of an internal topic of `partitions` that holds the coordinator of `key` (a
/// transactional id, a group id): Kafka's `Utils.abs(key.hashCode()) % partitions`, with
/// Java's `String.hashCode` (UTF-16 units; ASCII keys here).
pub fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    let hash = key
        .encode_utf16()
        .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32));
    let positive = if hash == i32::MIN { 0 } else { hash.abs() };
    positive % partitions
}

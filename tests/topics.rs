//! The topics the bridge creates, on the test broker (`WATCHBRIDGE_TEST_BROKER`): their
//! replication factor is the broker's own (`default.replication.factor`: 3 on the three-node
//! cluster, `kafka3`; 1 on one node) unless `WATCHBRIDGE_REPLICATION_FACTOR` says otherwise,
//! they get the topic configs of `WATCHBRIDGE_TOPIC_CONFIG` under the bridge's own, and a
//! topic of replication factor 1 on a cluster of several brokers is warned about (issue 46,
//! case 7). `WATCHBRIDGE_TEST_BROKER=kafka3 cargo test --test topics` runs them on the
//! cluster.

mod support;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use std::collections::HashMap;
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::kafka::broker;
use support::ops_client::Ops;
use support::scenario::{finished_feeds, free_port, Setup};

/// The topics the bridge creates for `s` (all but the input topic, which `Setup` made).
fn created_topics(s: &Setup) -> [String; 4] {
    [
        s.output.clone(),
        s.dlq.clone(),
        format!("{}.watermarks", s.output),
        format!("{}.state", s.group),
    ]
}

/// `topic`'s configuration as the broker describes it.
async fn described(topic: &str) -> HashMap<String, Option<String>> {
    let admin: AdminClient<DefaultClientContext> = broker().config().create().unwrap();
    let answer = admin
        .describe_configs(
            [&ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(15))),
        )
        .await
        .expect("DescribeConfigs");
    let resource = answer.into_iter().next().unwrap().expect("the topic");
    resource
        .entries
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect()
}

/// The replicas of each partition of `topic`.
fn replication(topic: &str, partitions: i32) -> Vec<usize> {
    (0..partitions)
        .map(|p| {
            broker()
                .leader_and_replicas(topic, p)
                .unwrap_or_else(|| panic!("no metadata for {topic}/{p}"))
                .1
                .len()
        })
        .collect()
}

/// With default settings every topic the bridge creates has the broker's default
/// replication factor (3 on the cluster: today's fixed default of 1 left the state of a
/// replicated cluster on one broker), and `WATCHBRIDGE_TOPIC_CONFIG` is applied to each
/// under the configs the bridge sets itself: the state and watermark topics stay compacted.
#[tokio::test(flavor = "multi_thread")]
async fn created_topics_get_the_brokers_replication_and_the_users_topic_configs() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("replication", 2).await;
    let mut env = s.env(&server);
    env.push((
        "WATCHBRIDGE_TOPIC_CONFIG",
        "retention.ms=123456789, cleanup.policy=delete".into(),
    ));
    let mut bridge = Bridge::start(&env);
    let expected = broker().nodes().min(3);
    for topic in created_topics(&s) {
        let partitions = if topic.ends_with(".watermarks") { 1 } else { 2 };
        assert_eq!(
            replication(&topic, partitions),
            vec![expected; partitions as usize],
            "{topic}: replicas per partition\n{}",
            bridge.log()
        );
        let configs = described(&topic).await;
        let get = |name: &str| configs.get(name).cloned().flatten();
        assert_eq!(
            get("retention.ms").as_deref(),
            Some("123456789"),
            "{topic}: WATCHBRIDGE_TOPIC_CONFIG applied"
        );
        let compacted = topic.ends_with(".watermarks") || topic.ends_with(".state");
        let policy = if compacted { "compact" } else { "delete" };
        assert_eq!(
            get("cleanup.policy").as_deref(),
            Some(policy),
            "{topic}: the bridge's own configs win"
        );
    }
    assert!(
        !bridge.log().contains("replication factor 1"),
        "no topic has replication factor 1 on a cluster:\n{}",
        bridge.log()
    );
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
}

/// `WATCHBRIDGE_REPLICATION_FACTOR=1` on a cluster of several brokers: one WARN line per
/// topic of replication factor 1, naming it (the input topic, replicated by the test, is not
/// named). On one broker replication factor 1 is all there is: no warning.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_of_replication_factor_1_on_several_brokers_is_warned_about() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("rf1", 1).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_REPLICATION_FACTOR", "1".into()));
    let mut bridge = Bridge::start(&env);
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let log = bridge.log();
    let warned = |topic: &str| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains("replication factor 1")
                && l.contains(&format!("topic={topic} "))
        })
    };
    let cluster = broker().nodes() > 1;
    for topic in created_topics(&s) {
        assert_eq!(replication(&topic, 1), vec![1], "{topic}\n{log}");
        assert_eq!(warned(&topic), cluster, "{topic}: warned?\n{log}");
    }
    assert!(!warned(&s.input), "{}: replicated\n{log}", s.input);
}

/// A start whose topics are all new reads its new state and control topics as soon as they
/// are made: on Apache Kafka their partitions have no leader for a moment, and a start that
/// read them then stopped with `NotLeaderForPartition` (seen in `benches/guarantee.rs`, one
/// start in two there). Several starts, each on topics of its own, each becomes ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_on_topics_it_creates_becomes_ready_every_time() {
    let server = TestServer::start(finished_feeds).await;
    for start in 0..3 {
        let s = Setup::new(&format!("fresh-{start}"), 4).await;
        let port = free_port();
        let mut env = s.env(&server);
        env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
        let mut bridge = Bridge::start(&env);
        Ops::new(port)
            .wait_for(&bridge, "/readyz", 200, Duration::from_secs(60))
            .await;
        assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    }
}

/// The broker deletes a record whose timestamp is older than its topic's `retention.ms`,
/// and an output's timestamp is its event time: outputs of a watch of history older than
/// the output topic keeps are said (WARN, naming the retention) and counted
/// (`watchbridge_outputs_past_retention_total`), not lost in silence. (Found when the
/// tests' fixed event times, 30 Nov 2026, passed Kafka's default 7 days: outputs read
/// once vanished before the next read.) On a broker that does not describe the topic's
/// retention policy (Tansu 0.6), nothing can be said: the test checks that it says nothing.
#[tokio::test(flavor = "multi_thread")]
async fn outputs_older_than_the_output_topics_retention_are_said_and_counted() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("retained", 1).await;
    let port = free_port();
    let mut env = s.env(&server);
    // One day: the outputs' event times (scenario::T0, 30 Nov 2026 on) are older.
    env.push(("WATCHBRIDGE_TOPIC_CONFIG", "retention.ms=86400000".into()));
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let mut bridge = Bridge::start(&env);
    support::scenario::produce_user(&s.input, 1).await;
    support::scenario::wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    let ops = Ops::new(port);
    let counted = ops
        .metric("watchbridge_outputs_past_retention_total")
        .await
        .expect("the metric is served");
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let log = bridge.log();
    let warned = log
        .lines()
        .any(|l| l.contains("WARN") && l.contains("older than the output topic's retention.ms"));
    // Tansu 0.6 describes the retention.ms it was given but no cleanup.policy: whether it
    // deletes by time is not said, so the bridge says nothing.
    let configs = described(&s.output).await;
    let get = |name: &str| configs.get(name).cloned().flatten();
    let describes = get("retention.ms").as_deref() == Some("86400000")
        && get("cleanup.policy").as_deref() == Some("delete");
    if broker().kind() == support::kafka::BrokerKind::Kafka {
        assert!(describes, "Kafka describes the output topic's retention.ms");
    }
    let expected = if describes { 2.0 } else { 0.0 };
    assert_eq!(counted, expected, "outputs counted past retention\n{log}");
    assert_eq!(warned, describes, "warned once\n{log}");
    assert!(
        log.matches("older than the output topic's retention.ms")
            .count()
            <= 1,
        "one WARN per partition, not per output\n{log}"
    );
}

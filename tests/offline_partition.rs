//! A partition of the output topic that no node can serve (its only replica's node is down)
//! holds back only the recoveries that need it (issue 46, case 6): on the three-node cluster
//! (`WATCHBRIDGE_TEST_BROKER=kafka3`), with outputs placed by input partition, input
//! partition p's recovery reads output partition p and state partition p only, so the other
//! partitions restore their watches and go on while p waits, and `/readyz` names what p
//! waits for. Elsewhere (Tansu, one Kafka node) there is no second node to keep the rest of
//! the cluster up, and the test says so and passes.
//!
//! ~30 s on two cores after the cluster's start (two bridges, a node killed and started again):
//! `make test-kafka` runs it there.

mod support;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::kafka::{broker, header, output_key, BrokerKind};
use support::ops_client::Ops;
use support::scenario::{finished_feeds, free_port, produce_user_to, wait_for_outputs, Setup};

const PARTITIONS: i32 = 4;
/// The output partition (and input partition) whose only replica goes down.
const OFFLINE: i32 = 3;

/// The output topic made before the bridge, one replica per partition (Kafka wants as many
/// for each partition of an assignment; `min.insync.replicas=1`, or nothing could be
/// written): `OFFLINE`'s on node `alone`, the others' on the other two nodes.
async fn create_output_topic(topic: &str, alone: i32) {
    let admin: AdminClient<DefaultClientContext> = broker().config().create().unwrap();
    let others: Vec<i32> = (1..=3).filter(|&n| n != alone).collect();
    let spread: Vec<Vec<i32>> = (0..PARTITIONS)
        .map(|p| match p {
            OFFLINE => vec![alone],
            p => vec![others[p as usize % others.len()]],
        })
        .collect();
    let assignment: Vec<&[i32]> = spread.iter().map(Vec::as_slice).collect();
    let topic_spec = NewTopic::new(topic, PARTITIONS, TopicReplication::Variable(&assignment))
        .set("min.insync.replicas", "1");
    let created = admin
        .create_topics(
            [&topic_spec],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("CreateTopics");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while broker().leader_and_replicas(topic, OFFLINE).map(|(l, _)| l) != Some(alone) {
        assert!(Instant::now() < deadline, "{topic}/{OFFLINE} has no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The output keys found in `partitions` of `topic` (read from their beginning) once every
/// key of `wanted` is there, or panics at `within` with what it found.
fn wait_for_keys(
    topic: &str,
    partitions: &[i32],
    wanted: &BTreeSet<String>,
    within: Duration,
    log: impl Fn() -> String,
) -> BTreeSet<String> {
    let consumer: BaseConsumer = broker()
        .config()
        .set("group.id", "watchbridge-test-offline-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + within;
    let mut found = BTreeSet::new();
    while !wanted.is_subset(&found) {
        assert!(
            Instant::now() < deadline,
            "outputs in {topic} partitions {partitions:?}: {found:?}, not all of {wanted:?} \
             within {within:?}; bridge log:\n{}",
            log()
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let m = m.detach();
            if header(&m, "watchbridge-control").is_none() {
                found.insert(output_key(&m));
            }
        }
    }
    found
}

/// The keys user `u` of `finished_feeds` emits.
fn keys_of(users: impl IntoIterator<Item = i64>) -> BTreeSet<String> {
    users
        .into_iter()
        .flat_map(|u| [format!("u{u}-a"), format!("u{u}-b")])
        .collect()
}

/// Poll `/readyz` until `done` holds for its answer, or panic with the bridge's log.
async fn wait_for_readyz(
    ops: &Ops,
    bridge: &Bridge,
    within: Duration,
    done: impl Fn(&(u16, String)) -> bool,
) -> (u16, String) {
    ops.wait_until(bridge, "/readyz", within, |a| a.is_some_and(&done))
        .await
        .expect("an answer that `done` took")
}

/// One node down, the only replica of output partition 3 with it: input partitions 0–2
/// restore and emit their new watches' outputs, partition 3's recovery waits and `/readyz`
/// says for what (503 naming the input partition and the output partition); once the node is
/// back, partition 3 restores and emits too, and the instance is ready.
#[tokio::test(flavor = "multi_thread")]
async fn an_offline_output_partition_holds_back_only_the_recovery_that_reads_it() {
    let (kind, nodes) = BrokerKind::with_nodes_from_env().unwrap();
    if kind != BrokerKind::Kafka || nodes < 3 {
        eprintln!("skipped: needs a cluster of three nodes (WATCHBRIDGE_TEST_BROKER=kafka3)");
        return;
    }
    let started = Instant::now();
    let b = broker();
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("offline", PARTITIONS).await;
    // Not the active controller: the quorum keeps its leader while the node is down.
    let controller = b.active_controller().unwrap_or(1);
    let down = if controller == 3 { 2 } else { 3 };
    create_output_topic(&s.output, down).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_GUARANTEE", "recovery".into()));
    // In-band watermark copies to the offline partition fail within this, and are published
    // again (they do not hold the other partitions back).
    env.push(("KAFKA_MESSAGE_TIMEOUT_MS", "5000".into()));

    // Every node up: the bridge makes its topics (replication factor 3), emits the first
    // users' outputs and checkpoints them as it stops.
    for p in 0..PARTITIONS {
        produce_user_to(&s.input, Some(p), p as i64).await;
    }
    let mut first = Bridge::start(&env);
    wait_for_outputs(&s.output, 2 * PARTITIONS as usize, Duration::from_secs(60)).await;
    assert_eq!(first.terminate().0, Some(0), "{}", first.log());

    // The node goes down; output partition 3 has no leader once the controller fences it.
    b.kill_node(down);
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.leader_and_replicas(&s.output, OFFLINE).map(|(l, _)| l) != Some(-1) {
        assert!(
            Instant::now() < deadline,
            "{}/{OFFLINE} still led",
            s.output
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let later: Vec<i64> = (0..PARTITIONS).map(|p| 10 + p as i64).collect();
    for (p, &user) in later.iter().enumerate() {
        produce_user_to(&s.input, Some(p as i32), user).await;
    }
    eprintln!("node {down} down after {:.1?}", started.elapsed());

    let port = free_port();
    env.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let mut second = Bridge::start(&env);
    let ops = Ops::new(port);
    // Partitions 0-2 restore and emit their new users' outputs to output partitions 0-2.
    let readable: Vec<i32> = (0..PARTITIONS).filter(|&p| p != OFFLINE).collect();
    let wanted = keys_of(readable.iter().map(|&p| later[p as usize]));
    wait_for_keys(
        &s.output,
        &readable,
        &wanted,
        Duration::from_secs(45),
        || second.log(),
    );
    eprintln!(
        "partitions {readable:?} restored after {:.1?}",
        started.elapsed()
    );
    // Partition 3 waits, and says for what.
    let waiting_for = format!("{}/{OFFLINE}", s.output);
    let (status, reason) = wait_for_readyz(&ops, &second, Duration::from_secs(30), |(_, body)| {
        body.contains(&waiting_for)
    })
    .await;
    assert_eq!(status, 503, "{reason}");
    assert!(
        reason.contains(&format!("input partition {OFFLINE}")),
        "{reason}"
    );
    let failures = format!("watchbridge_recovery_read_failures_total{{partition=\"{OFFLINE}\"}}");
    assert!(
        ops.metric(&failures).await.is_some_and(|n| n >= 1.0),
        "{failures}:\n{}",
        ops.get("/metrics").await.unwrap_or_default().1
    );

    // The node comes back: partition 3 restores and emits, and the instance is ready.
    b.start_node(down);
    wait_for_keys(
        &s.output,
        &[OFFLINE],
        &keys_of([later[OFFLINE as usize]]),
        Duration::from_secs(60),
        || second.log(),
    );
    wait_for_readyz(&ops, &second, Duration::from_secs(30), |(status, _)| {
        *status == 200
    })
    .await;
    eprintln!(
        "partition {OFFLINE} restored after {:.1?}",
        started.elapsed()
    );
    assert_eq!(second.terminate().0, Some(0), "{}", second.log());
    // The wait is logged as it begins and when what it waits for changes (on a cluster
    // the partition first settles its output partition, then reads its offsets: both wait
    // for the node), then once a minute, and once as it ends; not at every attempt.
    let log = second.log();
    let begun: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the partition's recovery cannot read what it needs"))
        .filter_map(|l| l.split("waiting_for=").nth(1))
        .collect();
    let reasons: std::collections::BTreeSet<&str> = begun.iter().copied().collect();
    let ended = log
        .lines()
        .filter(|l| l.contains("the partition's recovery reads again"))
        .count();
    assert!(!begun.is_empty(), "the wait was never logged:\n{log}");
    assert_eq!((begun.len(), ended), (reasons.len(), 1), "{log}");
    assert!(
        !log.contains("ERROR watchbridge::kafka::partition"),
        "{log}"
    );
}

//! The transactional mode (`WATCHBRIDGE_GUARANTEE=exactly_once`) against a broker with
//! transactions (Apache Kafka: `WATCHBRIDGE_TEST_BROKER=kafka`; `make test` runs this file
//! there only, as `--ignored`, since on Tansu it fails at once saying why). A stalled instance (a zombie) is fenced: once the partition's new owner has
//! started its transactional producer, nothing the old one writes becomes visible — not
//! its outputs, and not the stale checkpoint its revocation writes, which a third
//! instance's recovery would otherwise take for the partition's state.

mod support;

use rdkafka::Message;
use serde_json::json;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::{broker, header, BrokerKind};
use support::scenario::{data_records, produce_user, Setup, T0};

/// What the resumed instance logs once the broker has rejected its writes.
const FENCED: &str = "fenced: another instance took this partition over";

/// What it logs when the group tells it the partition is lost (before it writes anything).
const LOST: &str = "partitions lost";

/// The session timeout of both instances: a paused one loses its partitions after this.
const SESSION_TIMEOUT_MS: u64 = 6000;

fn signal(bridge: &Bridge, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &bridge.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

/// Every (watch key, output key) on `topic`, read `read_committed` to the end offsets it has
/// now, with how often each was read (not deduplicated).
async fn committed_outputs(topic: &str) -> BTreeMap<(String, String), usize> {
    let mut counts = BTreeMap::new();
    for m in data_records(broker().read_to_end(topic).await) {
        let output =
            String::from_utf8_lossy(header(&m, "watchbridge-output-key").unwrap()).into_owned();
        let watch = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        *counts.entry((watch, output)).or_insert(0) += 1;
    }
    counts
}

/// Wait (at most 60 s) until `n` distinct outputs on `topic` are committed; else panic with
/// `why()`.
async fn wait_committed(topic: &str, n: usize, why: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while committed_outputs(topic).await.len() < n {
        assert!(std::time::Instant::now() < deadline, "{}", why());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka: make test-kafka runs it (WATCHBRIDGE_TEST_BROKER=kafka cargo test --test exactly_once -- --ignored)"]
async fn a_paused_instance_is_fenced_and_nothing_it_writes_after_resuming_is_visible() {
    assert_eq!(
        broker().kind(),
        BrokerKind::Kafka,
        "this test needs a broker with transactions: run it with WATCHBRIDGE_TEST_BROKER=kafka"
    );
    // Each user's feed shows the first `visible` items, growing when the test says so.
    let visible = Arc::new(AtomicI64::new(2));
    let feed = visible.clone();
    let server = TestServer::start(move |seen| {
        let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
        let n = feed.load(Ordering::SeqCst);
        let events: Vec<_> = (0..n)
            .map(|i| json!({"id": format!("u{user}-{i}"), "at": T0 + i * 1000}))
            .collect();
        Reply::json(json!({"events": events, "done": false}))
    })
    .await;
    let s = Setup::new("fenced", 1).await;
    let mut env = s.env(&server);
    env.push(("WATCHBRIDGE_GUARANTEE", "exactly_once".into()));
    env.push(("KAFKA_SESSION_TIMEOUT_MS", SESSION_TIMEOUT_MS.to_string()));
    env.push(("KAFKA_HEARTBEAT_INTERVAL_MS", "500".into()));
    let users = 1..=4;

    let mut a = Bridge::start(&env);
    for user in users.clone() {
        produce_user(&s.input, user).await;
    }
    let first = users.clone().count() * 2;
    wait_committed(&s.output, first, || {
        format!(
            "the first instance never committed its first outputs:\n{}",
            a.log()
        )
    })
    .await;

    // A stalls (a GC pause, a frozen VM) past its session timeout; B takes the partition.
    signal(&a, "-STOP");
    let mut b = Bridge::start(&env);
    b.wait_for_log("partition state restored", Duration::from_secs(60));
    // New items: both instances will poll them, B as the owner, A once it runs again.
    visible.store(4, Ordering::SeqCst);
    let expected = users.clone().count() * 4;
    wait_committed(&s.output, expected, || {
        format!(
            "the second instance never committed the new outputs:\n{}",
            b.log()
        )
    })
    .await;
    signal(&a, "-CONT");
    // A writes nothing more for the partition: its lease (`kafka::lease`) holds its writes
    // after the stall until the group says the partition is lost; and any write that gets
    // out is rejected: the broker fenced its transactional id when B started.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(a.log().contains(FENCED) || a.log().contains(LOST)) {
        assert!(
            std::time::Instant::now() < deadline,
            "A neither lost its partition nor was fenced:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both crash; C recovers the partition from what is on the state topic: whatever A
    // wrote there after B took over must not count.
    for bridge in [&mut a, &mut b] {
        let pid = bridge.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success());
        let _ = bridge.child.wait();
    }
    tokio::time::sleep(Duration::from_millis(SESSION_TIMEOUT_MS + 500)).await;
    let mut c = Bridge::start(&env);
    c.wait_for_log("partition state restored", Duration::from_secs(60));
    visible.store(6, Ordering::SeqCst);
    let expected = users.clone().count() * 6;
    wait_committed(&s.output, expected, || {
        format!(
            "the outputs after the resume never arrived:\nA:\n{}\nC:\n{}",
            a.log(),
            c.log()
        )
    })
    .await;
    // Polls keep going for a moment: a re-emitted output would land now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, _) = c.terminate();
    assert_eq!(code, Some(0), "the third instance stops cleanly");

    let counts = committed_outputs(&s.output).await;
    let mut wrong = Vec::new();
    for user in users {
        for i in 0..6 {
            let key = (format!("user-{user}"), format!("u{user}-{i}"));
            let n = counts.get(&key).copied().unwrap_or(0);
            if n != 1 {
                wrong.push(format!("{key:?} read {n} times"));
            }
        }
    }
    assert_eq!(counts.len(), expected, "no output that was not expected");
    assert!(
        wrong.is_empty(),
        "every output exactly once: {wrong:?}\nA:\n{}",
        a.log()
    );
}

/// One group never runs two modes (issue 46, case 8): while the group runs one mode
/// (recorded on its state topic), an instance set to the other refuses to start, exiting
/// non-zero and naming `WATCHBRIDGE_GUARANTEE`, the group's mode and its own; an `auto`
/// instance takes the group's mode. Once every instance has stopped, the group may switch.
/// Both ways: `exactly_once` running and `recovery` refused, then the reverse.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka: make test-kafka runs it (WATCHBRIDGE_TEST_BROKER=kafka cargo test --test exactly_once -- --ignored)"]
async fn an_instance_of_the_other_mode_is_refused_while_the_group_runs_one() {
    assert_eq!(
        broker().kind(),
        BrokerKind::Kafka,
        "this test needs a broker with transactions: run it with WATCHBRIDGE_TEST_BROKER=kafka"
    );
    let server = TestServer::start(support::scenario::finished_feeds).await;
    for (runs, other) in [("exactly_once", "recovery"), ("recovery", "exactly_once")] {
        let s = Setup::new(&format!("mode-{runs}"), 2).await;
        let with = |guarantee: &str| {
            let mut env = s.env(&server);
            env.push(("WATCHBRIDGE_GUARANTEE", guarantee.to_string()));
            env
        };
        let mut a = Bridge::start(&with(runs));
        for user in 1..=4 {
            produce_user(&s.input, user).await;
        }
        wait_committed(&s.output, 8, || format!("{runs}: no outputs:\n{}", a.log())).await;

        let mut refused = Bridge::spawn(&with(other));
        let code = refused.exit_code(Duration::from_secs(60));
        let log = refused.log();
        assert!(
            code.is_some_and(|c| c != 0),
            "{other} beside {runs}: {code:?}\n{log}"
        );
        assert!(
            log.contains("WATCHBRIDGE_GUARANTEE")
                && log.contains(&format!("runs `{runs}`"))
                && log.contains(&format!("chose `{other}`")),
            "the refusal names the setting and both modes:\n{log}"
        );
        assert!(
            !log.contains("partition assigned"),
            "it joined the group:\n{log}"
        );

        let mut adopting = Bridge::start(&with("auto"));
        adopting.wait_for_log(
            &format!("WATCHBRIDGE_GUARANTEE guarantee={runs}"),
            Duration::from_secs(60),
        );
        assert_eq!(adopting.terminate().0, Some(0), "{}", adopting.log());
        assert_eq!(a.terminate().0, Some(0), "{}", a.log());

        // Nobody runs now: the group may switch.
        let mut switched = Bridge::start(&with(other));
        switched.wait_for_log(
            &format!("WATCHBRIDGE_GUARANTEE guarantee={other}"),
            Duration::from_secs(60),
        );
        assert_eq!(switched.terminate().0, Some(0), "{}", switched.log());
    }
}

/// A transaction must commit before the coordinator's `transaction.timeout.ms` aborts it
/// (issue 46, case 2): a coordinator's abort bumps the producer's epoch, the next request is
/// fatal ("fenced"), and the partition was left assigned with no task. So settings that
/// cannot commit in time fail the start, naming them (a 15 s checkpoint interval under a
/// 10 s transaction timeout); and a long interval the user left the timeout unset for gets
/// a transaction timeout that fits (90 s checkpoints: above librdkafka's 60 s default).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka: make test-kafka runs it (WATCHBRIDGE_TEST_BROKER=kafka cargo test --test exactly_once -- --ignored)"]
async fn transaction_timeouts_that_cannot_fit_the_checkpoint_interval_fail_the_start() {
    assert_eq!(broker().kind(), BrokerKind::Kafka, "needs transactions");
    let server = TestServer::start(support::scenario::finished_feeds).await;
    let s = Setup::new("txn-timeout", 1).await;
    let mut env = s.env(&server);
    env.extend([
        ("WATCHBRIDGE_GUARANTEE", "exactly_once".to_string()),
        ("WATCHBRIDGE_CHECKPOINT_INTERVAL", "15s".to_string()),
        ("KAFKA_TRANSACTION_TIMEOUT_MS", "10000".to_string()),
    ]);
    let mut refused = Bridge::spawn(&env);
    let code = refused.exit_code(Duration::from_secs(60));
    let log = refused.log();
    assert!(code.is_some_and(|c| c != 0), "started: {code:?}\n{log}");
    assert!(
        log.contains("KAFKA_TRANSACTION_TIMEOUT_MS=10000")
            && log.contains("WATCHBRIDGE_CHECKPOINT_INTERVAL"),
        "the refusal names both settings:\n{log}"
    );

    let mut env = s.env(&server);
    env.extend([
        ("WATCHBRIDGE_GUARANTEE", "exactly_once".to_string()),
        ("WATCHBRIDGE_CHECKPOINT_INTERVAL", "90s".to_string()),
    ]);
    let mut fitted = Bridge::start(&env);
    fitted.wait_for_log("transaction_timeout_ms=130000", Duration::from_secs(60));
    assert_eq!(fitted.terminate().0, Some(0), "{}", fitted.log());
}

/// A transaction the broker aborts for its timeout is not a fencing (issue 46, case 2).
/// The instance stalls (SIGSTOP: a GC pause, a frozen VM) longer than
/// `transaction.timeout.ms` but within its group session: the coordinator aborts the open
/// transaction and bumps the producer's epoch, so the next request of that producer fails
/// as fenced — though no other instance exists and the group still assigns the partitions
/// here. Each partition starts again with a new producer from its last commit: every
/// output arrives, once, and the instance goes on polling.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Apache Kafka: make test-kafka runs it (WATCHBRIDGE_TEST_BROKER=kafka cargo test --test exactly_once -- --ignored)"]
async fn a_transaction_aborted_by_its_timeout_restarts_the_partition_and_loses_nothing() {
    assert_eq!(broker().kind(), BrokerKind::Kafka, "needs transactions");
    // Each user's feed grows by one item every 250 ms while `growing`, so a transaction is
    // open whenever the stall begins.
    let visible = Arc::new(AtomicI64::new(1));
    let feed = visible.clone();
    let server = TestServer::start(move |seen| {
        let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
        let events: Vec<_> = (0..feed.load(Ordering::SeqCst))
            .map(|i| json!({"id": format!("u{user}-{i}"), "at": T0 + i * 1000}))
            .collect();
        Reply::json(json!({"events": events, "done": false}))
    })
    .await;
    let growing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let grower = {
        let (visible, growing) = (visible.clone(), growing.clone());
        tokio::spawn(async move {
            while growing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                visible.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let s = Setup::new("txn-aborted", 2).await;
    let mut env = s.env(&server);
    env.extend([
        ("WATCHBRIDGE_GUARANTEE", "exactly_once".to_string()),
        ("WATCHBRIDGE_CHECKPOINT_INTERVAL", "1s".to_string()),
        ("KAFKA_MESSAGE_TIMEOUT_MS", "3000".to_string()),
        // The shortest that fits 1 s + 3 s + the 10 s commit margin.
        ("KAFKA_TRANSACTION_TIMEOUT_MS", "15000".to_string()),
        ("KAFKA_SESSION_TIMEOUT_MS", "60000".to_string()),
        ("KAFKA_HEARTBEAT_INTERVAL_MS", "1000".to_string()),
    ]);
    let users = 1..=4;
    let mut a = Bridge::start(&env);
    for user in users.clone() {
        produce_user(&s.input, user).await;
    }
    wait_committed(&s.output, users.clone().count() * 3, || {
        format!("no outputs before the stall:\n{}", a.log())
    })
    .await;
    // The transaction timeout, plus the coordinator's check for timed-out transactions
    // (every 10 s), plus a margin: the open transaction is aborted meanwhile. Within the
    // session timeout: the group keeps the partitions here.
    signal(&a, "-STOP");
    tokio::time::sleep(Duration::from_secs(29)).await;
    signal(&a, "-CONT");
    // Outputs flow again after the stall: new items (beyond what the feeds showed when it
    // ended) are committed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    growing.store(false, Ordering::SeqCst);
    grower.await.unwrap();
    let items = visible.load(Ordering::SeqCst);
    let expected = users.clone().count() * items as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while committed_outputs(&s.output).await.len() < expected {
        assert!(
            std::time::Instant::now() < deadline,
            "after the stall the outputs stopped ({} of {expected} committed):\n{}",
            committed_outputs(&s.output).await.len(),
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Polls keep going for a moment: a re-emitted output would land now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, _) = a.terminate();
    assert_eq!(code, Some(0), "{}", a.log());
    let counts = committed_outputs(&s.output).await;
    assert_eq!(counts.len(), expected, "no output that was not expected");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "every output exactly once: {twice:?}");
}

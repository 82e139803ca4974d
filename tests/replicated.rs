//! What only a replicated cluster can do to the bridge (issue 46), on three Kafka nodes:
//! `WATCHBRIDGE_TEST_BROKER=kafka3 cargo test --test replicated -- --ignored` (each test
//! says so and fails at once on another broker).

mod support;

use std::process::Command;
use std::time::Duration;
use support::bridge::Bridge;
use support::http_server::TestServer;
use support::kafka::broker;
use support::scenario::{
    assert_each_once, feeds, output_key_counts, outputs_to_end, produce_user, wait_for_outputs,
    Setup,
};

fn signal(pid: &str, signal: &str) {
    let status = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// A failed delivery is read back only once its record has settled (issue 46, case 4;
/// `recovery`). The output partition has two replicas and `min.insync.replicas=2`; its
/// follower is paused. What the leader appends meanwhile stays above the high watermark
/// until the follower drops out of the in-sync set (`replica.lag.time.max.ms`, 10 s on the
/// test cluster), then commits — long after the bridge's message timeout (3 s) reported
/// the deliveries failed. A partition that read its outputs back at once would not see
/// them, emit them again, and both copies would commit.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs three Kafka nodes: WATCHBRIDGE_TEST_BROKER=kafka3 cargo test --test replicated -- --ignored"]
async fn a_failed_delivery_is_read_back_only_once_its_record_has_settled() {
    let b = broker();
    assert!(
        b.nodes() >= 3,
        "needs a replicated cluster: WATCHBRIDGE_TEST_BROKER=kafka3"
    );
    let server = TestServer::start(|seen| feeds(seen, false)).await;
    let s = Setup::new("settle", 1).await;
    // The follower to pause: neither the input's leader nor the group's coordinator, so
    // that inputs are read and the group holds while it stands still.
    let (input_leader, _) = b.leader_and_replicas(&s.input, 0).expect("input metadata");
    let coordinator = b.group_coordinator(&s.group).expect("group coordinator");
    let follower = (1..=3)
        .find(|n| *n != input_leader && *n != coordinator)
        .unwrap_or_else(|| (1..=3).find(|n| *n != input_leader).unwrap());
    let leader = (1..=3).find(|n| *n != follower).unwrap();
    let assignment = format!("{leader}:{follower}");
    b.kafka_tool(
        "org.apache.kafka.tools.TopicCommand",
        &[
            "--create",
            "--topic",
            &s.output,
            "--replica-assignment",
            &assignment,
            "--config",
            "min.insync.replicas=2",
        ],
    )
    .expect("create the output topic");
    let mut env = s.env(&server);
    env.extend([
        ("WATCHBRIDGE_GUARANTEE", "recovery".to_string()),
        ("KAFKA_MESSAGE_TIMEOUT_MS", "3000".to_string()),
        ("KAFKA_SESSION_TIMEOUT_MS", "45000".to_string()),
    ]);
    let mut bridge = Bridge::start(&env);
    produce_user(&s.input, 1).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;

    let pid = b.node_pid(follower);
    signal(&pid, "-STOP");
    for user in 2..=5 {
        produce_user(&s.input, user).await;
    }
    // Past the message timeout and the follower's removal from the in-sync set (then the
    // leader refuses new writes: one in-sync replica, fewer than two).
    tokio::time::sleep(Duration::from_secs(20)).await;
    signal(&pid, "-CONT");
    let expected: Vec<String> = (1..=5)
        .flat_map(|u| [format!("u{u}-a"), format!("u{u}-b")])
        .collect();
    wait_for_outputs(&s.output, expected.len(), Duration::from_secs(120)).await;
    // A copy emitted again would be written by now (the partition restarted, read back).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    // The case this test is about happened: deliveries failed, their partition restarted.
    let log = bridge.log();
    assert!(
        log.contains("output not delivered (it may still be on the topic)"),
        "no delivery failed while the follower was paused:\n{log}"
    );
    let counts = output_key_counts(&outputs_to_end(&s.output).await);
    assert_each_once(&counts, &expected, &bridge.log());
}

//! The bridge end to end, as a user runs it: the `watchbridge` binary against a real
//! Kafka-protocol broker process (Tansu), a real HTTP resource on loopback, inputs produced
//! and outputs consumed with a real Kafka client.

mod support;

use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::http_server::{Reply, TestServer};
use support::kafka::broker;
use support::scenario::{finished_feeds, now_ms, produce_user, wait_for_outputs, Setup, T0};

fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn key(m: &OwnedMessage) -> String {
    String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_new_output_reaches_the_output_topic_with_its_event_time_and_headers() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("outputs", 2).await;
    let bridge = Bridge::start(&s.env(&server));
    for user in 1..=3 {
        produce_user(&s.input, user).await;
    }
    let outputs = wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    let before = chrono_now_ms();
    let mut by_output_key = BTreeMap::new();
    for m in &outputs {
        let output_key = header(m, "watchbridge-output-key").unwrap();
        let user: i64 = output_key[1..output_key.find('-').unwrap()]
            .parse()
            .unwrap();
        let offset = if output_key.ends_with("-b") { 500 } else { 0 };
        assert_eq!(key(m), format!("user-{user}"), "key = watch key");
        assert!(
            header(m, "watchbridge-input-key").is_none(),
            "the watch key is the record key, not repeated in a header"
        );
        assert_eq!(
            m.timestamp().to_millis(),
            Some(T0 + user * 1000 + offset),
            "timestamp = event time"
        );
        let value: Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        assert_eq!(value["id"], output_key.as_str(), "value = the item");
        let first_seen: i64 = header(m, "watchbridge-first-seen")
            .unwrap()
            .parse()
            .unwrap();
        assert!(first_seen > T0 && first_seen <= before, "{first_seen}");
        assert!(
            by_output_key.insert(output_key, m.partition()).is_none(),
            "emitted twice"
        );
    }
    assert_eq!(by_output_key.len(), 6);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let extra = wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    assert_eq!(
        extra.len(),
        6,
        "nothing more arrives: each watch ended as final"
    );
    drop(bridge);
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_inputs_go_to_the_dead_letter_topic_and_the_bridge_goes_on() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("dlq", 1).await;
    let bridge = Bridge::start(&s.env(&server));
    let b = broker();
    b.produce(
        &s.input,
        Some(0),
        Some(b"k1"),
        b"{not json",
        &[("trace", b"t-1")],
    )
    .await;
    b.produce(&s.input, Some(0), None, br#"{"id": 5}"#, &[])
        .await;
    b.produce(&s.input, Some(0), Some(b"k3"), br#"{"name": "no id"}"#, &[])
        .await;
    produce_user(&s.input, 7).await;
    let dead = b.consume(&s.dlq, 3, Duration::from_secs(60)).await;
    let kinds: Vec<_> = dead
        .iter()
        .map(|m| header(m, "watchbridge-error-kind").unwrap())
        .collect();
    assert_eq!(kinds, ["not_json", "no_key", "unresolvable"]);
    for (i, m) in dead.iter().enumerate() {
        assert_eq!(header(m, "watchbridge-source-topic").unwrap(), s.input);
        assert_eq!(header(m, "watchbridge-source-partition").unwrap(), "0");
        assert_eq!(
            header(m, "watchbridge-source-offset").unwrap(),
            i.to_string()
        );
        assert!(!header(m, "watchbridge-error").unwrap().is_empty());
    }
    assert_eq!(
        dead[0].payload().unwrap(),
        b"{not json",
        "the original value is kept"
    );
    assert_eq!(header(&dead[0], "trace").unwrap(), "t-1", "and its headers");
    assert!(header(&dead[2], "watchbridge-error")
        .unwrap()
        .contains("/id"));
    // The good input after them is watched.
    let outputs = wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    assert!(outputs.iter().all(|m| key(m) == "user-7"));
    bridge.wait_for_log(
        "input sent to the dead-letter topic",
        Duration::from_secs(5),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivered_input_for_a_live_watch_starts_no_second_watch_and_a_restart_restores_it() {
    // One event per poll up to `limit`, never final: a second watch (or a restart that
    // forgot what was seen) would emit every event again.
    let polls = Arc::new(AtomicUsize::new(0));
    let limit = Arc::new(AtomicUsize::new(5));
    let (counter, cap) = (polls.clone(), limit.clone());
    let server = TestServer::start(move |_| {
        let n = counter.fetch_add(1, Ordering::SeqCst) as i64;
        let max = cap.load(Ordering::SeqCst) as i64;
        let events: Vec<Value> = (0..=n.min(max))
            .map(|i| json!({"id": format!("e{i}"), "at": T0 + i}))
            .collect();
        Reply::json(json!({"events": events, "done": false}))
    })
    .await;
    let s = Setup::new("redelivery", 1).await;
    let mut bridge = Bridge::start(&s.env(&server));
    produce_user(&s.input, 1).await;
    produce_user(&s.input, 1).await;
    let outputs = wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    produce_user(&s.input, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    let mut keys: Vec<_> = all
        .iter()
        .map(|m| header(m, "watchbridge-output-key").unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["e0", "e1", "e2", "e3", "e4", "e5"],
        "each output once"
    );
    assert_eq!(outputs.len(), 6);
    // The watch is on the state topic, so every input is committed although it runs on.
    let (code, _) = bridge.terminate();
    assert_eq!(code, Some(0));
    let committed = broker().committed(&s.group, &s.input, 1)[0];
    assert_eq!(committed, 3, "every input committed\n{}", bridge.log());

    // Restarted, the bridge restores the watch (no input starts it: all are committed), and
    // it goes on from what it had seen: the new events once, the old ones not again.
    limit.store(8, Ordering::SeqCst);
    let bridge = Bridge::start(&s.env(&server));
    let all = wait_for_outputs(&s.output, 9, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = wait_for_outputs(&s.output, all.len(), Duration::from_secs(5)).await;
    let mut keys: Vec<_> = all
        .iter()
        .map(|m| header(m, "watchbridge-output-key").unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"],
        "each output once across the restart\n{}",
        bridge.log()
    );
    assert!(
        bridge.log().contains("partition state restored") && bridge.log().contains("watches=1"),
        "{}",
        bridge.log()
    );
    // The previous owner's last watermark is read back before the partition goes on; in
    // the exactly-once mode the watermark topic ends with a transaction marker, which no
    // reader is handed: the read must still see that it reached the end (not stall 30 s).
    assert!(
        !bridge.log().contains("was not read back"),
        "the restore waited for the watermark topic:\n{}",
        bridge.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_promptly_after_committing_what_was_delivered() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("shutdown", 2).await;
    let mut bridge = Bridge::start(&s.env(&server));
    for user in 1..=4 {
        produce_user(&s.input, user).await;
    }
    wait_for_outputs(&s.output, 8, Duration::from_secs(60)).await;
    // The commit of the last acknowledged position happens within a second or at the stop.
    let (code, took) = bridge.terminate();
    assert_eq!(code, Some(0), "{}", bridge.log());
    assert!(took < Duration::from_secs(15), "{took:?}");
    let committed: i64 = broker().committed(&s.group, &s.input, 2).iter().sum();
    assert_eq!(committed, 4, "every input committed:\n{}", bridge.log());
    assert!(
        bridge.log().contains("partition released"),
        "{}",
        bridge.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_bridges_share_the_partitions_and_one_takes_over_when_the_other_stops() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("rebalance", 4).await;
    let mut first = Bridge::start(&s.env(&server));
    first.wait_for_log("partition assigned", Duration::from_secs(60));
    for user in 0..8 {
        produce_user(&s.input, user).await;
    }
    wait_for_outputs(&s.output, 16, Duration::from_secs(60)).await;

    let second = Bridge::start(&s.env(&server));
    second.wait_for_log("partition assigned", Duration::from_secs(60));
    first.wait_for_log("partition released", Duration::from_secs(60));
    for user in 8..16 {
        produce_user(&s.input, user).await;
    }
    wait_for_outputs(&s.output, 32, Duration::from_secs(60)).await;

    let (code, _) = first.terminate();
    assert_eq!(code, Some(0));
    for user in 16..24 {
        produce_user(&s.input, user).await;
    }
    let all = wait_for_outputs(&s.output, 48, Duration::from_secs(90)).await;
    let mut per_user: HashMap<String, usize> = HashMap::new();
    for m in &all {
        *per_user.entry(key(m)).or_default() += 1;
    }
    assert_eq!(per_user.len(), 24, "every user watched");
    assert!(per_user.values().all(|&n| n == 2), "{per_user:?}");
    let assigned_to_second = second.log().matches("partition assigned").count();
    assert!(
        assigned_to_second >= 4,
        "the second took every partition:\n{}",
        second.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn live_watches_move_with_their_partitions_and_go_on_without_repeating_an_output() {
    // Feeds that grow one item every 200 ms, until the test freezes them (then final).
    const PACE_MS: i64 = 200;
    let start = now_ms();
    let frozen = Arc::new(AtomicI64::new(0));
    let items_at = move |at: i64| (at - start) / PACE_MS + 1;
    let server = {
        let frozen = frozen.clone();
        TestServer::start(move |seen| {
            let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
            let f = frozen.load(Ordering::SeqCst);
            let now = now_ms();
            let upto = if f == 0 { now } else { now.min(f) };
            let events: Vec<Value> = (0..items_at(upto))
                .map(|i| json!({"id": format!("u{user}-{i}"), "at": start + i * PACE_MS}))
                .collect();
            Reply::json(json!({"events": events, "done": f != 0 && now >= f}))
        })
        .await
    };
    let s = Setup::new("movelive", 4).await;
    let mut first = Bridge::start(&s.env(&server));
    first.wait_for_log("partition assigned", Duration::from_secs(60));
    for user in 0..8 {
        produce_user(&s.input, user).await;
    }
    wait_for_outputs(&s.output, 8, Duration::from_secs(60)).await;

    // A second instance joins: some partitions move, with their live watches.
    let mut second = Bridge::start(&s.env(&server));
    second.wait_for_log("partition state restored", Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first leaves: the second takes the rest, again with their live watches.
    assert_eq!(first.terminate().0, Some(0));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let freeze = now_ms() + 1000;
    frozen.store(freeze, Ordering::SeqCst);
    let expected = items_at(freeze) as usize;
    let all = wait_for_outputs(&s.output, 8 * expected, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = wait_for_outputs(&s.output, all.len(), Duration::from_secs(10)).await;
    let mut per_output: HashMap<String, usize> = HashMap::new();
    for m in &all {
        *per_output
            .entry(header(m, "watchbridge-output-key").unwrap())
            .or_default() += 1;
    }
    let repeated: Vec<_> = per_output.iter().filter(|(_, &n)| n > 1).collect();
    assert!(repeated.is_empty(), "emitted twice: {repeated:?}");
    assert_eq!(per_output.len(), 8 * expected, "every item of every feed");
    // The second restored live watches twice: when it joined and when the first left.
    let restored: Vec<usize> = second
        .log()
        .lines()
        .filter(|l| l.contains("partition state restored"))
        .filter_map(|l| l.split("watches=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(
        restored.iter().sum::<usize>(),
        8,
        "every live watch restored once on the second: {restored:?}\nsecond:\n{}\nfirst:\n{}",
        second.log(),
        first.log()
    );
    assert_eq!(second.terminate().0, Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_producer_queue_pauses_input_and_loses_nothing() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("backpressure", 1).await;
    let mut env = s.env(&server);
    // A producer queue of 5 records: nearly every output waits for room.
    env.push(("KAFKA_QUEUE_BUFFERING_MAX_MESSAGES", "5".into()));
    env.push((
        "WATCHBRIDGE_LOG",
        "info,watchbridge::kafka::consumer=debug".into(),
    ));
    // The inputs are all there before the bridge starts, so it reads them faster than it
    // can produce their outputs.
    const USERS: i64 = 1200;
    for user in 0..USERS {
        produce_user(&s.input, user).await;
    }
    let bridge = Bridge::start(&env);
    let outputs = wait_for_outputs(&s.output, 2 * USERS as usize, Duration::from_secs(120)).await;
    let mut keys: Vec<_> = outputs
        .iter()
        .map(|m| header(m, "watchbridge-output-key").unwrap())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 2 * USERS as usize, "every output, once");
    assert!(
        bridge.log().contains("partition paused"),
        "the consumer paused the partition while the producer caught up:\n{}",
        bridge.log()
    );
}

/// The README's walk-through: `watchbridge produce` feeds the input topic, the bridge
/// watches, `watchbridge consume` shows the outputs.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_walkthrough_feeds_and_reads_with_the_bundled_clients() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("readme", 1).await;
    let _bridge = Bridge::start(&s.env(&server));
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_watchbridge"))
            .args(args)
            .env_remove("WATCHBRIDGE_BROKERS")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let brokers = broker().bootstrap().to_string();
    run(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &s.input,
        "-K",
        ":",
        r#"user-4:{"id":4}"#,
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let printed = loop {
        let printed = run(&["consume", "--brokers", &brokers, "--topic", &s.output, "-e"]);
        let data = printed
            .lines()
            .filter(|l| !l.contains("watchbridge-control"))
            .count();
        if data >= 2 || Instant::now() > deadline {
            break printed;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let lines: Vec<&str> = printed
        .lines()
        .filter(|l| !l.contains("watchbridge-control=watermark"))
        .collect();
    assert_eq!(lines.len(), 2, "{printed}");
    // `partition:offset key timestamp headers value` (offsets after any watermark record).
    assert!(
        lines[0].starts_with("0:") && lines[0].contains(" user-4 2026-"),
        "{printed}"
    );
    assert!(
        lines[0].contains("watchbridge-output-key=u4-a"),
        "{printed}"
    );
    assert!(lines[1].contains(r#""id":"u4-b""#), "{printed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_watch_is_not_started_again_by_its_input_until_the_retention_passes() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("finished", 1).await;
    let mut bridge = Bridge::start(&s.env(&server));
    produce_user(&s.input, 1).await;
    wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    // The same input again, to this bridge and, after a restart, to the next one: the
    // finished watch is remembered (in memory, then from the state topic).
    produce_user(&s.input, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(bridge.terminate().0, Some(0));
    let mut env = s.env(&server);
    let mut bridge = Bridge::start(&env);
    bridge.wait_for_log("partition state restored", Duration::from_secs(30));
    produce_user(&s.input, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outputs = wait_for_outputs(&s.output, 2, Duration::from_secs(10)).await;
    assert_eq!(
        outputs.len(),
        2,
        "a finished watch ran again\n{}",
        bridge.log()
    );
    assert!(bridge.log().contains("finished=1"), "{}", bridge.log());
    // (A SIGKILLed member would stall Tansu's group until its session timed out.)
    assert_eq!(bridge.terminate().0, Some(0));

    // With a retention of 1 s, the finished record is deleted, and the input starts the
    // watch anew (its outputs come again: that is what the retention bounds).
    env.push(("WATCHBRIDGE_FINISHED_RETENTION", "1s".into()));
    let bridge = Bridge::start(&env);
    bridge.wait_for_log("partition state restored", Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    produce_user(&s.input, 1).await;
    let outputs = wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    assert_eq!(outputs.len(), 4, "{}", bridge.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_state_topic_with_another_partition_count_is_refused_naming_its_variable() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("statecount", 2).await;
    let state = format!("{}.state", s.group);
    broker().create_topic(&state, 1).await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .env("WATCHBRIDGE_BROKERS", broker().bootstrap())
        .env("WATCHBRIDGE_METRICS_ADDR", "off")
        .envs(s.env(&server).iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the bridge did not refuse to start"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("WATCHBRIDGE_STATE_TOPIC")
            && stderr.contains(&state)
            && stderr.contains("has 1 partition(s), but the input topic has 2"),
        "{stderr}"
    );
}

/// `WATCHBRIDGE_GUARANTEE=auto` picks what the broker can keep: transactions on Apache Kafka;
/// on Tansu, which lists `EndTxn` but hands aborted records to `read_committed` readers,
/// the recovery mode (docs/brokers.md).
#[tokio::test(flavor = "multi_thread")]
async fn auto_picks_transactions_only_where_the_broker_keeps_their_promise() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("guarantee", 1).await;
    let mut bridge = Bridge::start(&s.env(&server));
    bridge.wait_for_log("WATCHBRIDGE_GUARANTEE guarantee=", Duration::from_secs(30));
    let expected = match broker().kind() {
        support::kafka::BrokerKind::Kafka => "guarantee=exactly_once",
        support::kafka::BrokerKind::Tansu => "guarantee=recovery",
    };
    let log = bridge.log();
    assert!(log.contains(expected), "{expected}:\n{log}");
    assert_eq!(bridge.terminate().0, Some(0));
}

/// A state topic whose `cleanup.policy` does not compact (created by someone else, or by a
/// broker's automatic creation with its default `delete`) would lose sealed seen chunks and
/// the records of long-quiet watches when its retention runs: outputs emitted twice after a
/// restart, watches forgotten. The bridge reads the topic's settings (DescribeConfigs) and
/// refuses such a topic at start, naming it, the setting and the fix. Both test brokers
/// describe a policy set at creation; where the broker describes none (Tansu, for a topic
/// created without one: `tests/brokers.rs`), the bridge warns that it cannot check and goes
/// on.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_topic_that_is_not_compacted_is_refused_at_start() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("statepolicy", 1).await;
    let state = format!("{}.state", s.group);
    broker()
        .create_topic_with(&state, 1, &[("cleanup.policy", "delete")])
        .await;
    let mut bridge = Bridge::spawn(&s.env(&server));
    let code = bridge.exit_code(Duration::from_secs(60));
    let log = bridge.log();
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("WATCHBRIDGE_STATE_TOPIC")
            && log.contains(&format!("`{state}`"))
            && log.contains("cleanup.policy=delete")
            && log.contains("cleanup.policy=compact"),
        "{log}"
    );

    if broker().kind() == support::kafka::BrokerKind::Tansu {
        let s = Setup::new("statepolicy-unset", 1).await;
        broker()
            .create_topic(&format!("{}.state", s.group), 1)
            .await;
        let mut bridge = Bridge::start(&s.env(&server));
        bridge.wait_for_log("partition state restored", Duration::from_secs(60));
        assert!(
            bridge
                .log()
                .contains("cannot read the state topic's cleanup.policy"),
            "{}",
            bridge.log()
        );
        assert_eq!(bridge.terminate().0, Some(0));
    }
}

/// An input whose watch record would be larger than a state record may be (1,000,000 bytes:
/// the record keeps the input's value) cannot be saved: its watch would run unsaved and be
/// lost at the next restart while its input is committed. It goes to the dead-letter topic
/// instead, with kind `too_large`, and starts no watch; the inputs after it are watched.
#[tokio::test(flavor = "multi_thread")]
async fn an_input_too_large_to_save_goes_to_the_dead_letter_topic_and_starts_no_watch() {
    let polled = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let server = {
        let polled = polled.clone();
        TestServer::start(move |seen| {
            polled.lock().unwrap().push(seen.target.clone());
            finished_feeds(seen)
        })
        .await
    };
    let s = Setup::new("toolarge", 1).await;
    let mut env = s.env(&server);
    // Its dead letter (the value plus the reason and source headers) is larger than
    // librdkafka's default `message.max.bytes` (1,000,000); the broker's default limit is
    // 1,048,588.
    env.push(("KAFKA_MESSAGE_MAX_BYTES", "1048588".into()));
    let mut bridge = Bridge::start(&env);
    let pad = "x".repeat(999_900);
    let big = json!({"id": 1, "pad": pad}).to_string();
    broker()
        .produce(&s.input, Some(0), Some(b"user-1"), big.as_bytes(), &[])
        .await;
    support::scenario::produce_user_to(&s.input, Some(0), 2).await;
    let dead = broker().consume(&s.dlq, 1, Duration::from_secs(60)).await;
    assert_eq!(
        header(&dead[0], "watchbridge-error-kind").as_deref(),
        Some("too_large"),
        "{}",
        bridge.log()
    );
    assert_eq!(
        header(&dead[0], "watchbridge-source-offset").as_deref(),
        Some("0")
    );
    assert!(
        header(&dead[0], "watchbridge-error")
            .unwrap()
            .contains("1000000"),
        "the reason names the limit: {:?}",
        header(&dead[0], "watchbridge-error")
    );
    assert_eq!(
        dead[0].payload(),
        Some(big.as_bytes()),
        "the original value"
    );
    let outputs = wait_for_outputs(&s.output, 2, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let outputs = wait_for_outputs(&s.output, outputs.len(), Duration::from_secs(10)).await;
    assert!(
        outputs.iter().all(|m| key(m) == "user-2"),
        "only the second input was watched: {:?}",
        outputs.iter().map(key).collect::<Vec<_>>()
    );
    assert!(
        polled
            .lock()
            .unwrap()
            .iter()
            .all(|t| !t.contains("/users/1/")),
        "the too-large input's resource was never polled"
    );
    assert_eq!(bridge.terminate().0, Some(0));
    assert_eq!(
        broker().committed(&s.group, &s.input, 1)[0],
        2,
        "both inputs committed\n{}",
        bridge.log()
    );
}

/// The recovery tracks outputs it finds on the output topic for a watch of its partition
/// that has no state record (its input, uncommitted, is read again and the watch starts
/// knowing them) until every uncommitted input has been read again; outputs of a watch
/// whose input does not come again are then forgotten, and until then they pin the saved
/// output offsets (every later recovery reads the output topic back from there). "Read
/// again" is the end of the input partition, also when that end is a transaction marker
/// (Apache Kafka: inputs produced in a transaction), which no consumer is handed: the task
/// waited for a record at `end - 1` and kept them forever. (On Tansu the inputs are produced
/// one by one and the partition ends in a record.)
#[tokio::test(flavor = "multi_thread")]
async fn outputs_of_no_watch_are_forgotten_once_the_inputs_are_read_to_an_end_that_is_a_marker() {
    let server = TestServer::start(finished_feeds).await;
    let s = Setup::new("preseen", 1).await;
    let b = broker();
    b.create_topic(&s.output, 1).await;
    // An output of a watch with no record, as an instance that no longer owned the
    // partition could have left.
    b.produce(
        &s.output,
        Some(0),
        Some(b"ghost"),
        br#"{"id": "g1"}"#,
        &[
            ("watchbridge-output-key", b"g1"),
            ("watchbridge-input-partition", b"0"),
        ],
    )
    .await;
    b.produce_in_transaction(&s.input, 0, &[(b"user-1", br#"{"id": 1}"#)])
        .await;
    let mut bridge = Bridge::start(&s.env(&server));
    wait_for_outputs(&s.output, 3, Duration::from_secs(60)).await;
    bridge.wait_for_log("neither saved nor coming again", Duration::from_secs(30));
    assert_eq!(bridge.terminate().0, Some(0));
    // Ends of partition are events the bridge asks for, not errors to log.
    assert!(!bridge.log().contains("PartitionEOF"), "{}", bridge.log());
}

/// A short outage must not end watches for good. The retry limit and backoff are settings
/// (`WATCHBRIDGE_RETRY_*`); a watch that reaches the limit ends `failed`, but its seen set is
/// kept, like a finished watch's record, for `WATCHBRIDGE_FINISHED_RETENTION`: its input,
/// delivered again, starts it again, and it emits only what is new — whether the input comes
/// back to the same bridge (seen set in memory) or after a restart (from the state topic).
/// (Before: the seen set was deleted and the input, within the retention, started nothing;
/// after it, everything was emitted again.)
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_watch_started_again_by_its_input_emits_only_what_is_new() {
    // 0: two events per user; 1: every poll fails (HTTP 500); 2: three events, final.
    let phase = Arc::new(AtomicUsize::new(0));
    let server = {
        let phase = phase.clone();
        TestServer::start(move |seen| {
            let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
            let event = |i: i64| json!({"id": format!("u{user}-{i}"), "at": T0 + i});
            match phase.load(Ordering::SeqCst) {
                0 => Reply::json(json!({"events": [event(0), event(1)], "done": false})),
                1 => Reply::status(500, "down"),
                _ => Reply::json(json!({"events": [event(0), event(1), event(2)], "done": true})),
            }
        })
        .await
    };
    let s = Setup::new("failed", 1).await;
    let mut env = s.env(&server);
    // Fail after one retry, 100 ms after the first failure.
    env.push(("WATCHBRIDGE_RETRY_LIMIT", "1".into()));
    env.push(("WATCHBRIDGE_RETRY_INITIAL_BACKOFF", "100ms".into()));
    let mut bridge = Bridge::start(&env);
    produce_user(&s.input, 1).await;
    produce_user(&s.input, 2).await;
    wait_for_outputs(&s.output, 4, Duration::from_secs(60)).await;
    phase.store(1, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(20);
    while bridge.log().matches("watch failed").count() < 2 {
        assert!(Instant::now() < deadline, "{}", bridge.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    phase.store(2, Ordering::SeqCst);

    // User 1's input again, to the same bridge.
    produce_user(&s.input, 1).await;
    wait_for_outputs(&s.output, 5, Duration::from_secs(60)).await;
    bridge.wait_for_log("failed watch started again", Duration::from_secs(5));
    // User 2's after a restart: its seen set comes from the state topic.
    assert_eq!(bridge.terminate().0, Some(0));
    let bridge = Bridge::start(&env);
    bridge.wait_for_log("partition state restored", Duration::from_secs(60));
    produce_user(&s.input, 2).await;
    let all = wait_for_outputs(&s.output, 6, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = wait_for_outputs(&s.output, all.len(), Duration::from_secs(10)).await;
    assert!(
        bridge.log().contains("failed watch started again") && bridge.log().contains("seen=2"),
        "{}",
        bridge.log()
    );
    let mut keys: Vec<_> = all
        .iter()
        .map(|m| header(m, "watchbridge-output-key").unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["u1-0", "u1-1", "u1-2", "u2-0", "u2-1", "u2-2"],
        "each output once\n{}",
        bridge.log()
    );
}

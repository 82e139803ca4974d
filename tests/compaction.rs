//! The bridge's durable state after Kafka's log cleaner has compacted it (Apache Kafka only:
//! Tansu never compacts, docs/brokers.md). The real bridge runs with a state topic created
//! beforehand as compacted with settings that make the cleaner take it within seconds; watches
//! grow (each checkpoint supersedes a watch's last seen chunk) and some finish (their records
//! become a finished record and tombstones). Once the cleaner has demonstrably removed
//! records from every state partition, the bridge is stopped and a new one started: it must
//! restore from the compacted state, so that every expected output is on the output topic
//! exactly once (read to its end after the last bridge stopped, nothing deduplicated) with
//! its event time, and no finished watch is polled again, although their inputs come again.
//!
//! `#[ignore]`d, so that a plain `cargo test` (on Tansu) does not run it: `make test-kafka`
//! runs it with `WATCHBRIDGE_TEST_BROKER=kafka ... -- --ignored`. Run on Tansu it fails at
//! once, saying so: there it could prove nothing.

mod support;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use serde_json::json;
use std::time::{Duration, Instant};
use support::bridge::Bridge;
use support::feeds::{input_key, now_ms, Feeds, Tally};
use support::kafka::{broker, BrokerKind};

/// Input (and state) partitions.
const PARTITIONS: i32 = 2;
/// Every third user's feed is final after this many items; the others grow on.
const SHORT_ITEMS: i64 = 3;
/// A new feed item every this long.
const PACE_MS: i64 = 500;

/// Per state partition: (records written, that is the end offset, as nothing is ever
/// deleted from a compacted topic's start; records read from the beginning).
async fn state_counts(topic: &str) -> Vec<(i64, usize)> {
    let consumer: BaseConsumer = broker().config().create().expect("create a Kafka client");
    let records = broker().read_to_end(topic).await;
    (0..PARTITIONS)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("offsets of {topic}/{p}: {e}"));
            assert_eq!(low, 0, "{topic}/{p}: a compacted topic keeps its start");
            (high, records.iter().filter(|m| m.partition() == p).count())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "Apache Kafka only: make test-kafka runs it (WATCHBRIDGE_TEST_BROKER=kafka ... -- --ignored)"]
async fn a_bridge_restarted_on_a_compacted_state_topic_emits_every_output_exactly_once() {
    // Checked before any broker starts: on Tansu this test would wait for a compaction that
    // never comes.
    let kind = BrokerKind::from_env().unwrap_or_else(|e| panic!("{e}"));
    if kind != BrokerKind::Kafka {
        let setting = match std::env::var(BrokerKind::VARIABLE) {
            Ok(v) if !v.trim().is_empty() => format!("{}={v}", BrokerKind::VARIABLE),
            _ => format!("{} unset", BrokerKind::VARIABLE),
        };
        panic!(
            "tests/compaction.rs needs Apache Kafka's log cleaner, and {setting} means {}, \
             which never compacts: run it with {}=kafka (make test-kafka does)",
            kind.name(),
            BrokerKind::VARIABLE,
        );
    }
    // The broker first (it takes seconds to start): the feeds begin to grow after it.
    let b = broker();
    let input = b.unique_topic("compaction");
    b.create_topic(&input, PARTITIONS).await;
    let started = Instant::now();
    let users: i64 = 8;
    // Short feeds end within 1.5 s; the long ones grow for 40 s, through the compaction
    // and past the restart.
    let items: Vec<i64> = (0..users)
        .map(|u| if u % 3 == 0 { SHORT_ITEMS } else { 80 })
        .collect();
    let feeds = Feeds {
        t0: now_ms(),
        pace_ms: PACE_MS,
        stagger_ms: 100,
        lag_ms: 300,
        items,
    };
    let finished: Vec<i64> = (0..users).filter(|u| u % 3 == 0).collect();
    let served = feeds.serve().await;

    let group = format!("{input}-group");
    let output = format!("{input}-out");
    let state = format!("{group}.state");
    // The cleaner takes a segment once it is not the active one (segments roll on the
    // first append 100 ms after they began), any dirty share is enough, and tombstones go
    // 1 s after a cleaning has seen them.
    b.create_topic_with(
        &state,
        PARTITIONS,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "1000"),
            ("min.compaction.lag.ms", "0"),
        ],
    )
    .await;
    let mut env = served.bridge_env(&input, &output, &group, "100ms");
    env.push(("WATCHBRIDGE_CHECKPOINT_INTERVAL", "200ms".into()));
    // Not the transactional mode `auto` would pick here: its commit markers take offsets of
    // the state partitions too, so "fewer records than offsets" would not prove that the
    // cleaner ran (tests/exactly_once.rs and the fault test cover that mode).
    env.push(("WATCHBRIDGE_GUARANTEE", "recovery".into()));
    let topic = &input;
    let produce_inputs = move |users: Vec<i64>| async move {
        for user in users {
            broker()
                .produce(
                    topic,
                    Some((user % PARTITIONS as i64) as i32),
                    Some(input_key(user).as_bytes()),
                    json!({ "id": user }).to_string().as_bytes(),
                    &[],
                )
                .await;
        }
    };
    let mut first = Bridge::start(&env);
    produce_inputs((0..users).collect()).await;

    // Until the cleaner has removed more than half of the records of every state partition
    // (a few are gone within seconds; the long watches keep superseding theirs).
    let deadline = Instant::now() + Duration::from_secs(60);
    let counts = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counts = state_counts(&state).await;
        if counts
            .iter()
            .all(|&(written, read)| 2 * (read as i64) < written)
        {
            break counts;
        }
        assert!(
            Instant::now() < deadline,
            "the cleaner did not remove half the records of every partition of {state} in \
             60 s: (written, read) per partition {counts:?}\n{}",
            b.log_tail()
        );
    };
    eprintln!(
        "compaction: [{:.1?}] state (written, read) per partition: {counts:?}",
        started.elapsed()
    );
    let (code, _) = first.terminate();
    assert_eq!(
        code,
        Some(0),
        "the first bridge stops cleanly\n{}",
        first.log()
    );
    let finished_polls: Vec<i64> = finished.iter().map(|&u| served.polls_of(u)).collect();
    assert!(
        finished
            .iter()
            .all(|&u| now_ms() > feeds.final_at(u) && served.polls_of(u) > 0),
        "the short feeds were final and polled before the restart"
    );

    // A new bridge on the compacted state; the finished watches' inputs come again.
    let second = Bridge::start(&env);
    second.wait_for_log("partition state restored", Duration::from_secs(60));
    produce_inputs(finished.clone()).await;
    second.wait_for_log("partition assigned", Duration::from_secs(60));
    let quiet = served.wait_until_quiet(&feeds, now_ms()).await;
    let mut second = second;
    let (code, _) = second.terminate();
    assert_eq!(
        code,
        Some(0),
        "the second bridge stops cleanly\n{}",
        second.log()
    );
    if let Err(users) = quiet {
        panic!(
            "users {users:?} still polled 60 s after every feed was final\n{}",
            second.log()
        );
    }

    let expected = feeds.expected_at(now_ms());
    let records = b.read_to_end(&output).await;
    let tally = Tally::of(&records, &expected);
    eprintln!(
        "compaction: [{:.1?}] expected={} exactly_once={} lost={} duplicated={} \
         wrong_event_time={} unexpected={}",
        started.elapsed(),
        expected.len(),
        tally.exactly_once(),
        tally.lost.len(),
        tally.duplicated().len(),
        tally.wrong_time.len(),
        tally.unexpected.len()
    );
    assert!(
        tally.is_exact(),
        "not every output exactly once with its event time after a restart on compacted \
         state:\n{}\nthe second bridge's log:\n{}",
        tally.examples("compaction:"),
        second.log()
    );
    let polled_again: Vec<(i64, i64)> = finished
        .iter()
        .zip(&finished_polls)
        .map(|(&u, &before)| (u, served.polls_of(u) - before))
        .filter(|&(_, more)| more > 0)
        .collect();
    assert!(
        polled_again.is_empty(),
        "finished watches polled again after the restart (user, polls): {polled_again:?}\n{}",
        second.log()
    );
}

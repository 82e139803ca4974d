//! Watermarks on a real broker (Tansu): the watermark topic, the in-band markers in the
//! output partitions, idleness, and bounded runs.

mod support;

use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::bridge::Bridge;
use support::http_server::{Reply, Seen, TestServer};
use support::kafka::broker;
use watchbridge::watermark::WatermarkMessage;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

struct Topics {
    input: String,
    output: String,
    watermarks: String,
}

async fn topics(name: &str, partitions: i32) -> Topics {
    let input = broker().unique_topic(name);
    broker().create_topic(&input, partitions).await;
    Topics {
        output: format!("{input}-out"),
        watermarks: format!("{input}-out.watermarks"),
        input,
    }
}

fn env(t: &Topics, server: &TestServer) -> Vec<(&'static str, String)> {
    vec![
        ("WATCHBRIDGE_INPUT_TOPIC", t.input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", t.output.clone()),
        ("WATCHBRIDGE_GROUP_ID", format!("{}-group", t.input)),
        ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}")),
        ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
        ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
        ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
        ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
    ]
}

/// Each poll of a user adds one event stamped with the time of the poll; final after 6.
fn live_feeds() -> impl Fn(&Seen) -> Reply {
    let polls = std::sync::Mutex::new(HashMap::<String, Vec<i64>>::new());
    move |seen| {
        let mut polls = polls.lock().unwrap();
        let times = polls.entry(seen.target.clone()).or_default();
        if times.len() < 6 {
            times.push(now_ms());
        }
        let user = seen.target.rsplit('/').next().unwrap().to_string();
        let events: Vec<Value> = times
            .iter()
            .enumerate()
            .map(|(i, at)| json!({"id": format!("{user}-{i}"), "at": at}))
            .collect();
        Reply::json(json!({"events": events, "done": times.len() == 6}))
    }
}

async fn produce_user(topic: &str, partition: i32, user: i64) {
    broker()
        .produce(
            topic,
            Some(partition),
            Some(format!("user-{user}").as_bytes()),
            json!({ "id": user }).to_string().as_bytes(),
            &[],
        )
        .await;
}

fn parse(m: &OwnedMessage) -> WatermarkMessage {
    WatermarkMessage::parse(m.payload().unwrap()).unwrap()
}

/// Check that each partition's values, in topic order, never go back; return the last
/// value of each. `context` is shown if one does.
fn latest_never_going_back(messages: &[WatermarkMessage], context: &str) -> HashMap<i32, i64> {
    let mut last: HashMap<i32, i64> = HashMap::new();
    for m in messages {
        if let WatermarkMessage::Partition {
            partition,
            watermark_ms,
            ..
        } = m
        {
            let previous = last.insert(*partition, *watermark_ms).unwrap_or(i64::MIN);
            assert!(
                *watermark_ms >= previous,
                "partition {partition}: {previous} then {watermark_ms}\n{context}"
            );
        }
    }
    last
}

/// Output records on `topic` up to its end offsets, watermark records left out.
async fn output_count(topic: &str) -> usize {
    broker()
        .read_to_end(topic)
        .await
        .iter()
        .filter(|m| header(m, "watchbridge-control").is_none())
        .count()
}

/// Wait for a bridge that ends by itself (a bounded run); its exit code.
/// `env` as a bounded run (each watch `total(30s)` at most).
fn bounded(mut env: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    env.push(("WATCHBRIDGE_MODE", "bounded".into()));
    env.push(("WATCHBRIDGE_TERMINATION", "total(30s)".into()));
    env
}

/// Run the bridge with `env` until it exits, which must be with code 0 within `within`.
fn run_to_success(env: &[(&str, String)], within: Duration) -> Bridge {
    let mut bridge = Bridge::start(env);
    assert_eq!(exit_code(&mut bridge, within), Some(0), "{}", bridge.log());
    bridge
}

fn exit_code(bridge: &mut Bridge, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = bridge.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end:\n{}",
            bridge.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Everything on the watermark topic up to its end offsets, parsed, in topic order.
async fn watermark_messages(topic: &str) -> Vec<WatermarkMessage> {
    broker()
        .read_to_end(topic)
        .await
        .iter()
        .map(parse)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn markers_never_regress_and_no_on_time_output_falls_below_one() {
    let server = TestServer::start(live_feeds()).await;
    let t = topics("wm-order", 2).await;
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_WATERMARK_STRATEGY", "bounded(1s)".into()));
    let mut bridge = Bridge::start(&e);
    // Users 0..6 on input partition user % 2, a few at a time.
    let mut input_partition = HashMap::new();
    for user in 0..6 {
        produce_user(&t.input, (user % 2) as i32, user).await;
        input_partition.insert(format!("user-{user}"), (user % 2) as i32);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Wait for every watch's 6 outputs (each feed is final after them), then stop the
    // bridge: the topics hold everything it wrote.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let data = output_count(&t.output).await;
        if data >= 36 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{data} outputs:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let records = broker().read_to_end(&t.output).await;

    // On the watermark topic, each partition's value never decreases.
    let on_topic = watermark_messages(&t.watermarks).await;
    let last = latest_never_going_back(&on_topic, "");
    assert!(on_topic.iter().all(|m| match m {
        WatermarkMessage::Partition { topic, .. } | WatermarkMessage::Merged { topic, .. } =>
            *topic == t.input,
    }));
    let merged_seen = on_topic
        .iter()
        .filter(|m| matches!(m, WatermarkMessage::Merged { watermark_ms, .. } if *watermark_ms <= now_ms()))
        .count();
    assert!(last.len() == 2, "both partitions published: {last:?}");
    assert!(merged_seen > 0, "a merged watermark was published");

    // In each output partition: markers for every input partition, never decreasing, and
    // no output that is not marked late has an event time below a marker already seen
    // for its input partition.
    let mut by_partition: HashMap<i32, Vec<&OwnedMessage>> = HashMap::new();
    for m in &records {
        by_partition.entry(m.partition()).or_default().push(m);
    }
    let mut outputs_checked = 0;
    for (output_partition, mut messages) in by_partition {
        messages.sort_by_key(|m| m.offset());
        let mut marker: HashMap<i32, i64> = HashMap::new();
        for m in messages {
            if header(m, "watchbridge-control").as_deref() == Some("watermark") {
                let WatermarkMessage::Partition {
                    partition,
                    watermark_ms,
                    ..
                } = parse(m)
                else {
                    panic!("in-band markers are partition messages");
                };
                let previous = marker.insert(partition, watermark_ms).unwrap_or(i64::MIN);
                assert!(
                    watermark_ms >= previous,
                    "marker went back in output partition {output_partition}"
                );
                continue;
            }
            let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
            let input = input_partition[&key];
            let event_time = m.timestamp().to_millis().unwrap();
            let late = header(m, "watchbridge-late").as_deref() == Some("true");
            if let Some(&w) = marker.get(&input) {
                assert!(
                    late || event_time >= w,
                    "output {key} at {event_time} after a marker {w} of its input partition {input}, not marked late"
                );
            }
            outputs_checked += 1;
        }
        assert!(
            !marker.is_empty(),
            "output partition {output_partition} carries markers"
        );
    }
    assert_eq!(
        outputs_checked,
        36,
        "every watch's 6 outputs, nothing more:\n{}",
        bridge.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_partition_stops_holding_the_merged_watermark_back() {
    let server = TestServer::start(live_feeds()).await;
    let t = topics("wm-idle", 2).await;
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_IDLE_TIMEOUT", "2s".into()));
    e.push(("WATCHBRIDGE_WATERMARK_STRATEGY", "bounded(0s)".into()));
    let bridge = Bridge::start(&e);
    // Input only ever arrives on partition 0.
    for user in 0..3 {
        produce_user(&t.input, 0, user).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let messages: Vec<WatermarkMessage> = watermark_messages(&t.watermarks).await;
        let p1_idle = messages.iter().any(|m| {
            matches!(
                m,
                WatermarkMessage::Partition {
                    partition: 1,
                    idle: true,
                    ..
                }
            )
        });
        let p0_values: Vec<i64> = messages
            .iter()
            .filter_map(|m| match m {
                WatermarkMessage::Partition {
                    partition: 0,
                    watermark_ms,
                    ..
                } if *watermark_ms > 0 => Some(*watermark_ms),
                _ => None,
            })
            .collect();
        let merged: Vec<i64> = messages
            .iter()
            .filter_map(|m| match m {
                WatermarkMessage::Merged { watermark_ms, .. } => Some(*watermark_ms),
                _ => None,
            })
            .collect();
        // The merged value follows partition 0 although partition 1 never had a record.
        if p1_idle && merged.iter().any(|v| p0_values.contains(v)) {
            assert!(
                merged.windows(2).all(|w| w[0] <= w[1]),
                "merged never goes back: {merged:?}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "merged {merged:?}, partition 0 {p0_values:?}, partition 1 idle: {p1_idle}\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_run_reads_to_the_end_finishes_every_watch_and_exits_with_a_final_watermark() {
    let server = TestServer::start(live_feeds()).await;
    let t = topics("wm-bounded", 2).await;
    for user in 0..4 {
        produce_user(&t.input, (user % 2) as i32, user).await;
    }
    let e = bounded(env(&t, &server));
    run_to_success(&e, Duration::from_secs(90));
    let data = output_count(&t.output).await;
    assert_eq!(data, 24, "every watch ran to its end (6 outputs each)");
    let messages: Vec<WatermarkMessage> = watermark_messages(&t.watermarks).await;
    for p in 0..2 {
        assert!(
            messages.iter().any(|m| matches!(m, WatermarkMessage::Partition { partition, watermark_ms: i64::MAX, .. } if *partition == p)),
            "partition {p}'s final watermark: {messages:?}"
        );
    }
    assert!(messages.iter().any(|m| matches!(
        m,
        WatermarkMessage::Merged {
            watermark_ms: i64::MAX,
            ..
        }
    )));
    // A second bounded run has nothing left to read and ends at once.
    run_to_success(&e, Duration::from_secs(60));
    let data = output_count(&t.output).await;
    assert_eq!(data, 24, "committed inputs are not read again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_taken_over_by_another_instance_continues_from_its_last_watermark() {
    let server = TestServer::start(live_feeds()).await;
    let t = topics("wm-takeover", 2).await;
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_WATERMARK_STRATEGY", "bounded(0s)".into()));
    let mut first = Bridge::start(&e);
    first.wait_for_log("partition assigned", Duration::from_secs(60));
    for user in 0..4 {
        produce_user(&t.input, (user % 2) as i32, user).await;
    }
    // Wait until both partitions have a real watermark from the first instance.
    let has_values = |messages: &[WatermarkMessage]| {
        (0..2).all(|p| {
            messages.iter().any(|m| {
                matches!(m, WatermarkMessage::Partition { partition, watermark_ms, .. }
                    if *partition == p && *watermark_ms > 0)
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let messages: Vec<WatermarkMessage> = watermark_messages(&t.watermarks).await;
        if has_values(&messages) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", first.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut second = Bridge::start(&e);
    let (code, _) = first.terminate();
    assert_eq!(code, Some(0));
    second.wait_for_log("partition assigned", Duration::from_secs(60));
    // Records stamped a minute ago: a fresh generator alone would publish far below what
    // the first instance already did.
    for user in 4..8i64 {
        broker()
            .produce_at(
                &t.input,
                Some((user % 2) as i32),
                Some(format!("user-{user}").as_bytes()),
                json!({ "id": user }).to_string().as_bytes(),
                &[],
                now_ms() - 60_000,
            )
            .await;
    }
    // Let the second instance work on them (its watches poll, its partitions publish),
    // then stop it: the watermark topic holds everything either owner published.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(second.terminate().0, Some(0), "{}", second.log());
    // Across both owners, each partition's published value never went back.
    let messages = watermark_messages(&t.watermarks).await;
    let last = latest_never_going_back(&messages, &second.log());
    assert_eq!(last.len(), 2);
}

/// A partition taken over waits until the watermark reader has read the topic to the end
/// noted at its recovery (so its floor is the previous owner's last value). In the
/// exactly-once mode every watermark record is followed by a transaction marker, which no
/// consumer is handed: the reader must still see that it reached the end. (It counted only
/// the records it was handed, so a takeover waited up to 30 s for the next record, with
/// its partition revoked meanwhile: CI caught a live watch restarted from its input.)
#[tokio::test(flavor = "multi_thread")]
async fn the_watermark_reader_reaches_an_end_that_is_a_transaction_marker() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;
    use watchbridge::kafka::health::{BrokerHealth, KafkaContext};
    use watchbridge::kafka::merged::MergedPublisher;
    use watchbridge::kafka::stats::ProducerStats;

    let b = broker();
    let topic = b.unique_topic("wm-marker");
    b.create_topic(&topic, 1).await;
    let record = WatermarkMessage::Partition {
        topic: "in".into(),
        partition: 0,
        watermark_ms: 1_000,
        idle: false,
    };
    let transactional = b.kind() == support::kafka::BrokerKind::Kafka;
    let mut config = b.config();
    if transactional {
        config.set("transactional.id", format!("{topic}-writer"));
    }
    let producer: BaseProducer = config.create().unwrap();
    let timeout = Duration::from_secs(30);
    if transactional {
        producer.init_transactions(timeout).unwrap();
        producer.begin_transaction().unwrap();
    }
    producer
        .send(
            BaseRecord::to(&topic)
                .key(&record.key()[..])
                .payload(&record.to_json()[..]),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(timeout).unwrap();
    if transactional {
        producer.commit_transaction(timeout).unwrap();
    }
    // On Kafka the marker is the last offset (written by the coordinator just after the
    // commit returns); on Tansu (no transactions) the record is.
    let expected_end = if transactional { 2 } else { 1 };
    let deadline = Instant::now() + Duration::from_secs(15);
    let end = loop {
        let (_, end) = producer
            .client()
            .fetch_watermarks(&topic, 0, timeout)
            .unwrap();
        if end >= expected_end || Instant::now() > deadline {
            break end;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(end, expected_end);

    let metrics = Arc::new(watchbridge::metrics::Metrics::new());
    let read_upto = Arc::new(AtomicI64::new(0));
    let kafka = KafkaContext::new(BrokerHealth::new(b.bootstrap(), metrics.clone()));
    let publisher = MergedPublisher {
        consumer_config: b.config(),
        kafka: kafka.clone(),
        producer: b
            .config()
            .create_with_context(ProducerStats {
                metrics: metrics.clone(),
                kafka,
            })
            .unwrap(),
        input_topic: "in".into(),
        input_partitions: 1,
        watermark_topic: topic.as_str().into(),
        interval: Duration::from_millis(100),
        owns_first: Arc::new(AtomicBool::new(false)),
        publishes: true,
        metrics,
        clock: watchbridge::clock::Clock::system(),
        latest: Default::default(),
        read_upto: read_upto.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(publisher.run(async move {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(15);
    while read_upto.load(Ordering::SeqCst) < end && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    reader.await.unwrap();
    assert_eq!(
        read_upto.load(Ordering::SeqCst),
        end,
        "the reader saw the end of {topic}"
    );
}

/// A bounded run ends when it has read each input partition to its end, also when the
/// last offset before that end holds no record a consumer is handed: on Apache Kafka,
/// inputs produced in a transaction end in its commit marker. (The run waited for a record
/// at `end - 1`, which never came, and never ended.) On Tansu, which has no transactions,
/// the inputs are produced one by one and the partition ends in a record.
#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_run_ends_when_its_input_ends_in_a_transaction_marker() {
    let server = TestServer::start(live_feeds()).await;
    let t = topics("wm-bounded-txn", 1).await;
    let inputs: Vec<(Vec<u8>, Vec<u8>)> = (0..2)
        .map(|user| {
            (
                format!("user-{user}").into_bytes(),
                json!({ "id": user }).to_string().into_bytes(),
            )
        })
        .collect();
    let records: Vec<(&[u8], &[u8])> = inputs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let transactional = broker().produce_in_transaction(&t.input, 0, &records).await;
    let (_, end) = broker().offsets(&t.input, 0);
    assert_eq!(end, if transactional { 3 } else { 2 });
    let e = bounded(env(&t, &server));
    run_to_success(&e, Duration::from_secs(60));
    assert_eq!(
        output_count(&t.output).await,
        12,
        "every watch ran to its end"
    );
    // Its inputs are committed past the marker: a second run has nothing to read.
    let group = format!("{}-group", t.input);
    assert_eq!(broker().committed(&group, &t.input, 1), [end]);
    let mut again = Bridge::start(&e);
    assert_eq!(
        exit_code(&mut again, Duration::from_secs(60)),
        Some(0),
        "{}",
        again.log()
    );
    assert_eq!(output_count(&t.output).await, 12);
}

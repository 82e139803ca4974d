//! Watermarks on a real broker (Tansu): the watermark topic, the in-band markers in the
//! output partitions, idleness, and bounded runs.

mod support;

use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::bridge::Bridge;
use support::http_server::{Reply, Seen, TestServer};
use support::kafka::broker;
use support::ops_client::Ops;
use support::scenario::{free_port, wait_for_outputs};
use watchbridge::watermark::WatermarkMessage;

/// "End of time": the watermark a bounded run publishes once every watch of it ended.
const END_OF_TIME: i64 = i64::MAX;
/// An hour, in ms.
const HOUR: i64 = 3_600_000;

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
    produce_user_at(topic, partition, user, now_ms()).await;
}

/// [`produce_user`] with the record timestamp `timestamp_ms`.
async fn produce_user_at(topic: &str, partition: i32, user: i64, timestamp_ms: i64) {
    broker()
        .produce_at(
            topic,
            Some(partition),
            Some(format!("user-{user}").as_bytes()),
            json!({ "id": user }).to_string().as_bytes(),
            &[],
            timestamp_ms,
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
    watermark_records(topic)
        .await
        .into_iter()
        .map(|(_, m)| m)
        .collect()
}

/// Everything on the watermark topic up to its end offsets, parsed, with its offset, in
/// topic order (the topic has one partition).
async fn watermark_records(topic: &str) -> Vec<(i64, WatermarkMessage)> {
    broker()
        .read_to_end(topic)
        .await
        .iter()
        .map(|m| (m.offset(), parse(m)))
        .collect()
}

/// The records of input partition `partition` among `records`: (offset, value, idle), in
/// topic order.
fn partition_values(records: &[(i64, WatermarkMessage)], partition: i32) -> Vec<(i64, i64, bool)> {
    records
        .iter()
        .filter_map(|(offset, m)| match m {
            WatermarkMessage::Partition {
                partition: p,
                watermark_ms,
                idle,
                ..
            } if *p == partition => Some((*offset, *watermark_ms, *idle)),
            _ => None,
        })
        .collect()
}

/// The `merged` records among `records`: (offset, value), in topic order.
fn merged_values(records: &[(i64, WatermarkMessage)]) -> Vec<(i64, i64)> {
    records
        .iter()
        .filter_map(|(offset, m)| match m {
            WatermarkMessage::Merged { watermark_ms, .. } => Some((*offset, *watermark_ms)),
            _ => None,
        })
        .collect()
}

/// Writes `messages` to the watermark topic as a bridge would (key `partition-<p>` or
/// `merged`), creating it first as the bridge does (one partition, compacted); returns the
/// offset after the last.
async fn write_watermarks(topic: &str, messages: &[WatermarkMessage]) -> i64 {
    broker()
        .create_topic_with(topic, 1, &[("cleanup.policy", "compact")])
        .await;
    let mut end = 0;
    for m in messages {
        let (_, offset) = broker()
            .produce(
                topic,
                Some(0),
                Some(m.key().as_bytes()),
                m.to_json().as_bytes(),
                &[],
            )
            .await;
        end = offset + 1;
    }
    end
}

/// Polls `check` every 200 ms until it gives a value, for at most `within`; panics with
/// `what`, the last answer and the bridge's log if it never does.
async fn eventually<T, S: std::fmt::Debug>(
    bridge: &Bridge,
    within: Duration,
    what: &str,
    check: impl AsyncFnMut() -> Result<T, S>,
) -> T {
    match poll_until(within, check).await {
        Ok(value) => value,
        Err(state) => panic!(
            "{what}: not within {within:?}; last seen: {state:?}\nbridge log:\n{}",
            bridge.log()
        ),
    }
}

/// Polls `check` every 200 ms until it gives a value, for at most `within`; its last
/// answer. Only a wait: assert on what the topics hold once the bridge stopped.
async fn poll_until<T, S>(
    within: Duration,
    mut check: impl AsyncFnMut() -> Result<T, S>,
) -> Result<T, S> {
    let deadline = Instant::now() + within;
    loop {
        let answer = check().await;
        if answer.is_ok() || Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until input partition `partition` has a watermark of at least `at_least` (and
/// below the end of time) on the watermark topic; returns it.
async fn wait_for_partition_watermark(
    bridge: &Bridge,
    watermarks: &str,
    partition: i32,
    at_least: i64,
) -> i64 {
    eventually(
        bridge,
        Duration::from_secs(20),
        &format!("a watermark of partition {partition} at or above {at_least}"),
        async || {
            let values = partition_values(&watermark_records(watermarks).await, partition);
            values
                .iter()
                .map(|&(_, v, _)| v)
                .find(|&v| v >= at_least && v < END_OF_TIME)
                .ok_or(values)
        },
    )
    .await
}

/// A resource whose feeds the test sets, user by user: user `u`'s feed (at `/users/<u>`)
/// has the items `u<u>-<i>` at the event times given, final or not. A user without a feed
/// is 404.
#[derive(Clone, Default)]
struct Resource {
    feeds: Arc<Mutex<HashMap<i64, Feed>>>,
}

/// One user's feed in a [`Resource`]: its items' event times, and whether it is final.
struct Feed {
    times: Vec<i64>,
    done: bool,
}

impl Resource {
    /// Serves the feeds (with [`env`]'s URL template).
    async fn serve(&self) -> TestServer {
        let feeds = self.feeds.clone();
        TestServer::start(move |seen| {
            let user: Option<i64> = seen.target.rsplit('/').next().and_then(|u| u.parse().ok());
            let feeds = feeds.lock().unwrap();
            match user.and_then(|u| Some((u, feeds.get(&u)?))) {
                Some((user, Feed { times, done })) => {
                    let events: Vec<Value> = times
                        .iter()
                        .enumerate()
                        .map(|(i, at)| json!({"id": item_key(user, i), "at": at}))
                        .collect();
                    Reply::json(json!({"events": events, "done": done}))
                }
                None => Reply::status(404, "{}"),
            }
        })
        .await
    }

    /// User `user`'s feed from now on: items at `times`, `done` if final.
    fn set(&self, user: i64, times: &[i64], done: bool) {
        self.feeds.lock().unwrap().insert(
            user,
            Feed {
                times: times.to_vec(),
                done,
            },
        );
    }
}

/// The output key of item `i` of `user`'s feed in a [`Resource`].
fn item_key(user: i64, i: usize) -> String {
    format!("u{user}-{i}")
}

/// The output records of the watch of `user` (key `user-<n>`), in topic order.
fn outputs_of(records: &[OwnedMessage], user: i64) -> Vec<&OwnedMessage> {
    let key = format!("user-{user}");
    records
        .iter()
        .filter(|m| header(m, "watchbridge-control").is_none() && m.key() == Some(key.as_bytes()))
        .collect()
}

/// An output record readably: output key, event time, late header.
fn describe(m: &OwnedMessage) -> String {
    format!(
        "{} at {:?} late={:?}",
        header(m, "watchbridge-output-key").unwrap_or_default(),
        m.timestamp().to_millis(),
        header(m, "watchbridge-late")
    )
}

fn is_late(m: &OwnedMessage) -> bool {
    header(m, "watchbridge-late").as_deref() == Some("true")
}

/// The in-band watermark records of the output topic (`watchbridge-control: watermark`).
fn in_band(records: &[OwnedMessage]) -> Vec<WatermarkMessage> {
    records
        .iter()
        .filter(|m| header(m, "watchbridge-control").as_deref() == Some("watermark"))
        .map(parse)
        .collect()
}

fn value_of(m: &WatermarkMessage) -> i64 {
    match m {
        WatermarkMessage::Partition { watermark_ms, .. }
        | WatermarkMessage::Merged { watermark_ms, .. } => *watermark_ms,
    }
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
    let records_on_topic = watermark_records(&t.watermarks).await;
    let on_topic: Vec<WatermarkMessage> = records_on_topic.iter().map(|(_, m)| m.clone()).collect();
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
    // The watermark moved: markers that never change would pass every check below.
    for p in 0..2 {
        let values: Vec<i64> = partition_values(&records_on_topic, p)
            .iter()
            .map(|&(_, v, _)| v)
            .filter(|&v| v != i64::MIN)
            .collect();
        let distinct: BTreeSet<i64> = values.iter().copied().collect();
        assert!(
            distinct.len() > 1 && values.last() > values.first(),
            "partition {p}'s watermark advanced on the watermark topic: {values:?}"
        );
    }

    // In each output partition: markers for every input partition, never decreasing, and
    // no output that is not marked late has an event time below a marker already seen
    // for its input partition.
    let mut by_partition: HashMap<i32, Vec<&OwnedMessage>> = HashMap::new();
    for m in &records {
        by_partition.entry(m.partition()).or_default().push(m);
    }
    let mut outputs_checked = 0;
    // Outputs that came after a marker of their input partition: what the check is about.
    let mut outputs_against_a_marker = 0;
    let mut markers_read: HashMap<i32, Vec<i64>> = HashMap::new();
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
                markers_read
                    .entry(partition)
                    .or_default()
                    .push(watermark_ms);
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
                if !late && w != i64::MIN {
                    outputs_against_a_marker += 1;
                }
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
    assert!(
        outputs_against_a_marker > 0,
        "some on-time output came after a marker of its input partition (else nothing was \
         checked against one)"
    );
    // The in-band markers moved too, for each input partition.
    for p in 0..2 {
        let values: Vec<i64> = markers_read
            .get(&p)
            .map(|v| v.iter().copied().filter(|&v| v != i64::MIN).collect())
            .unwrap_or_default();
        let distinct: BTreeSet<i64> = values.iter().copied().collect();
        assert!(
            distinct.len() > 1 && values.iter().max() > values.iter().min(),
            "input partition {p}'s in-band markers advanced: {values:?}"
        );
    }
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
    let (code, _) = first.terminate();
    assert_eq!(code, Some(0));
    // Started once the first has left the group: on Tansu a member joining while another
    // leaves got no assignment for over 60 s under a loaded CI run (../shared/notes/
    // tansu-0.6.md, group membership); live rebalances are tests/bridge.rs's subject.
    let mut second = Bridge::start(&e);
    // Everything from here on is the second instance's: the first has stopped.
    let (_, first_stopped_at) = broker().offsets(&t.watermarks, 0);
    let before = watermark_messages(&t.watermarks).await;
    let floor = latest_never_going_back(&before, &first.log());
    assert_eq!(floor.len(), 2, "both partitions had a value: {floor:?}");
    second.wait_for_log("partition assigned", Duration::from_secs(60));
    // Records stamped a minute ago: a fresh generator alone would publish far below what
    // the first instance already did.
    for user in 4..8i64 {
        produce_user_at(&t.input, (user % 2) as i32, user, now_ms() - 60_000).await;
    }
    // Then, once the second instance had time to publish that, records stamped now, which
    // move the watermark past the first instance's: the second must publish then.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for user in 8..10i64 {
        produce_user(&t.input, (user % 2) as i32, user).await;
    }
    let published_by_second = async || {
        let after: Vec<(i64, WatermarkMessage)> = watermark_records(&t.watermarks)
            .await
            .into_iter()
            .filter(|(offset, _)| *offset >= first_stopped_at)
            .collect();
        (0..2)
            .map(|p| partition_values(&after, p))
            .collect::<Vec<_>>()
    };
    eventually(
        &second,
        Duration::from_secs(20),
        "the second instance published both partitions above the first's last values",
        async || {
            let by_second = published_by_second().await;
            let done = (0..2).all(|p| by_second[p].iter().any(|&(_, v, _)| v > floor[&(p as i32)]));
            if done {
                Ok(())
            } else {
                Err((&floor, by_second))
            }
        },
    )
    .await;
    assert_eq!(second.terminate().0, Some(0), "{}", second.log());
    // Across both owners, each partition's published value never went back; what the
    // second instance published for each partition starts at or above the first's last.
    let messages = watermark_messages(&t.watermarks).await;
    let last = latest_never_going_back(&messages, &second.log());
    assert_eq!(last.len(), 2);
    let by_second = published_by_second().await;
    for p in 0..2 {
        let floor = floor[&(p as i32)];
        assert!(
            !by_second[p].is_empty() && by_second[p].iter().all(|&(_, v, _)| v >= floor),
            "partition {p}: the second instance published {:?}, the first's last was {floor}\n{}",
            by_second[p],
            second.log()
        );
    }
}

/// A partition taken over waits until the watermark reader has read the topic to the end
/// noted at its recovery (so its floor is the previous owner's last value). In the
/// exactly-once mode every watermark record is followed by a transaction marker, which no
/// consumer is handed: the reader must still see that it reached the end. (It counted only
/// the records it was handed, so a takeover waited up to 30 s for the next record, with
/// its partition revoked meanwhile: CI caught a live watch restarted from its input.)
#[tokio::test(flavor = "multi_thread")]
async fn the_watermark_reader_reaches_an_end_that_is_a_transaction_marker() {
    use rdkafka::producer::{BaseProducer, Producer};

    let b = broker();
    let topic = b.unique_topic("wm-marker");
    b.create_topic(&topic, 1).await;
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
    send_one_watermark(&producer, &topic);
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

    let reader = WatermarkReader::start(b, &topic);
    let deadline = Instant::now() + Duration::from_secs(15);
    while reader.read_upto() < end && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read_upto = reader.stop().await;
    assert_eq!(read_upto, end, "the reader saw the end of {topic}");
}

/// Sends one watermark record (input partition 0 at 1,000 ms) to `topic`.
fn send_one_watermark(producer: &rdkafka::producer::BaseProducer, topic: &str) {
    let record = WatermarkMessage::Partition {
        topic: "in".into(),
        partition: 0,
        watermark_ms: 1_000,
        idle: false,
    };
    producer
        .send(
            rdkafka::producer::BaseRecord::to(topic)
                .key(&record.key()[..])
                .payload(&record.to_json()[..]),
        )
        .map_err(|(e, _)| e)
        .unwrap();
}

/// The bridge's watermark reader (`kafka::merged::MergedPublisher`), started on `topic`.
struct WatermarkReader {
    read_upto: Arc<std::sync::atomic::AtomicI64>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl WatermarkReader {
    fn start(b: &support::kafka::Broker, topic: &str) -> WatermarkReader {
        use std::sync::atomic::AtomicI64;
        use watchbridge::kafka::clients::KafkaSettings;
        use watchbridge::kafka::health::{BrokerHealth, KafkaContext};
        use watchbridge::kafka::merged::MergedPublisher;
        use watchbridge::kafka::recovery::Lookups;
        use watchbridge::kafka::stats::ProducerStats;

        let metrics = Arc::new(watchbridge::metrics::Metrics::new());
        let read_upto = Arc::new(AtomicI64::new(0));
        let kafka = KafkaContext::new(BrokerHealth::new(b.bootstrap(), metrics.clone()));
        // The bridge's readers' settings (`kafka/clients.rs`): they carry its group id;
        // nothing is committed with it.
        let clients = KafkaSettings {
            brokers: b.bootstrap().to_string(),
            properties: Default::default(),
            group_id: "watchbridge-test-watermark-reader".into(),
        };
        // Used by a writer of `merged` records only (nothing claims it here).
        let lookups = Lookups::start(
            &KafkaSettings {
                group_id: "watchbridge-test-lookups".into(),
                ..clients.clone()
            },
            &kafka,
            topic,
        );
        let publisher = MergedPublisher {
            consumer_config: clients.watermark_reader(),
            kafka: kafka.clone(),
            producer: b
                .config()
                .create_with_context(ProducerStats::new(metrics.clone(), kafka))
                .unwrap(),
            input_topic: "in".into(),
            watermark_topic: topic.into(),
            interval: Duration::from_millis(100),
            claim: Default::default(),
            lease: watchbridge::kafka::lease::Lease::start(
                Duration::from_secs(45),
                Duration::from_secs(3),
                metrics.clone(),
            ),
            publishes: true,
            metrics,
            clock: watchbridge::clock::Clock::system(),
            read_back: watchbridge::watermark::WatermarkTopic::shared("in", 1),
            read_upto: read_upto.clone(),
            lookups,
            readiness: Arc::new(watchbridge::readiness::Readiness::new()),
            read_back_limit: Duration::from_secs(60),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(publisher.run(async move {
            let _ = stopped.await;
        }));
        WatermarkReader {
            read_upto,
            stop,
            task,
        }
    }

    fn read_upto(&self) -> i64 {
        self.read_upto.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops it; how far it had read.
    async fn stop(self) -> i64 {
        let _ = self.stop.send(());
        self.task.await.unwrap();
        self.read_upto.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The watermark reader starts reading at once, not after librdkafka's half-second pause.
/// A partition taken over waits for it (above), and so, at a start, does a partition whose
/// sibling published a watermark before its recovery looked up the topic's end. The reader
/// asked for the topic from its beginning (a logical offset) on a consumer that did not
/// know the partition's leader yet, and librdkafka then puts the offset query off by a
/// fixed 500 ms ("no current leader for partition"): one partition in several starts on a
/// busy machine restored in ~0.6 s instead of ~20 ms (seen in the vs_python bench).
#[tokio::test(flavor = "multi_thread")]
async fn the_watermark_reader_reads_the_topic_back_without_librdkafkas_offset_query_pause() {
    use rdkafka::producer::{BaseProducer, Producer};

    let b = broker();
    let topic = b.unique_topic("wm-prompt");
    b.create_topic(&topic, 1).await;
    let producer: BaseProducer = b.config().create().unwrap();
    send_one_watermark(&producer, &topic);
    producer.flush(Duration::from_secs(30)).unwrap();

    // Several starts: the pause comes only when the assignment beats the metadata.
    let mut took = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let reader = WatermarkReader::start(b, &topic);
        while reader.read_upto() < 1 && started.elapsed() < Duration::from_secs(15) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        took.push(started.elapsed());
        assert_eq!(reader.stop().await, 1, "the reader read {topic}'s record");
    }
    // librdkafka's pause is 500 ms; a fresh consumer reads one record in tens of ms.
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(400)),
        "time to read the watermark topic's one record, per start: {took:?}"
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
    // Apache Kafka may answer the end offset of a just-committed transaction as it was
    // before it (seen once in CI: 0); asked again, it has moved.
    let want = if transactional { 3 } else { 2 };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut end = broker().offsets(&t.input, 0).1;
    while end != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        end = broker().offsets(&t.input, 0).1;
    }
    assert_eq!(end, want);
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

/// The merged value a reader starts from is the last `merged` record on the watermark
/// topic, not what the partition records alone give, and nothing (record or metric) is
/// published before the topic is replayed: once every partition was idle the merged value
/// was their maximum, F; a partition that resumed lower must not pull it back for a reader
/// that starts later. The topic is written as compaction leaves that history (`p0 idle
/// F-8s, p1 idle F, merged F, p0 active F-8s`: the last record of each key, in their
/// order), where the partition records alone give F-8s.
#[tokio::test(flavor = "multi_thread")]
async fn a_merged_watermark_never_starts_below_the_last_merged_record() {
    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-merged-floor", 2).await;
    let floor = now_ms() - 10 * 60_000;
    let history = [
        WatermarkMessage::Partition {
            topic: t.input.clone(),
            partition: 1,
            watermark_ms: floor,
            idle: true,
        },
        WatermarkMessage::Merged {
            topic: t.input.clone(),
            watermark_ms: floor,
        },
        WatermarkMessage::Partition {
            topic: t.input.clone(),
            partition: 0,
            watermark_ms: floor - 8_000,
            idle: false,
        },
    ];
    let history_end = write_watermarks(&t.watermarks, &history).await;
    let port = free_port();
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    e.push(("WATCHBRIDGE_IDLE_TIMEOUT", "2s".into()));
    let ops = Ops::new(port);
    // One instance: it owns partition 0, so it writes the `merged` records.
    let mut bridge = Bridge::start(&e);
    resource.set(0, &[now_ms()], true);
    let input_time = now_ms();
    produce_user_at(&t.input, 0, 0, input_time).await;
    // The metric (Unix seconds), sampled until the inputs moved the merged value past the
    // floor (partition 1 idle, partition 0 at its input's watermark). No series: nothing
    // published yet.
    let mut samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let value = ops.metric("watchbridge_watermark_timestamp_seconds").await;
        if let Some(v) = value {
            samples.push((v * 1000.0).round() as i64);
        }
        if samples.last().is_some_and(|&v| v >= input_time - 6_000) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the merged watermark never passed {}: metric samples {samples:?}\n{}",
            input_time - 6_000,
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let records = watermark_records(&t.watermarks).await;
    let merged = merged_values(&records);
    let by_bridge: Vec<(i64, i64)> = merged
        .iter()
        .copied()
        .filter(|&(offset, _)| offset >= history_end)
        .collect();
    assert!(
        !by_bridge.is_empty(),
        "the bridge published merged records: {records:?}\n{}",
        bridge.log()
    );
    assert!(
        by_bridge.iter().all(|&(_, v)| v >= floor),
        "merged records (offset, value) the bridge published: {by_bridge:?}; the last merged \
         record before it started was {floor}\n{}",
        bridge.log()
    );
    assert!(
        merged.windows(2).all(|w| w[0].1 <= w[1].1),
        "the merged values in topic order never go back: {merged:?}"
    );
    assert!(
        samples.iter().all(|&v| v >= floor),
        "watchbridge_watermark_timestamp_seconds went below the last merged record {floor} ms: \
         {samples:?}"
    );
}

/// A new owner's floors are its predecessors' last committed values even when a
/// transaction another partition left open on the watermark topic comes before them. A
/// `read_committed` reader stops at that transaction's first offset (the last stable
/// offset), and so did the ends the takeover and the merged writer waited for: both went on
/// without the records behind it, and published below them. Written as the topic stands
/// while another instance's transaction is open: `p0 L, p1 idle L`, then (open) `p1 idle L`,
/// then (committed) `p0 T, merged T`, with L < T. The bridge's own inputs are between the
/// two, so a floor of L publishes below T. On Tansu, which has no transactions, the
/// history is all committed (its floors alone are checked).
#[tokio::test(flavor = "multi_thread")]
async fn a_takeover_behind_an_open_transaction_starts_from_the_previous_owners_last_values() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-takeover-open-txn", 2).await;
    let now = now_ms();
    let (low, floor) = (now - 20 * 60_000, now - 10 * 60_000);
    let partition = |p: i32, watermark_ms: i64, idle: bool| WatermarkMessage::Partition {
        topic: t.input.clone(),
        partition: p,
        watermark_ms,
        idle,
    };
    write_watermarks(
        &t.watermarks,
        &[partition(0, low, false), partition(1, low, true)],
    )
    .await;
    // Another partition's owner, mid-transaction: it wrote and has not committed yet.
    let transactional = broker().kind() == support::kafka::BrokerKind::Kafka;
    let open = transactional.then(|| {
        let producer: BaseProducer = broker()
            .config()
            .set("transactional.id", format!("{}-other-owner", t.input))
            .create()
            .unwrap();
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout).unwrap();
        producer.begin_transaction().unwrap();
        let record = partition(1, low, true);
        producer
            .send(
                BaseRecord::to(&t.watermarks)
                    .partition(0)
                    .key(&record.key()[..])
                    .payload(&record.to_json()[..]),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        producer.flush(timeout).unwrap();
        producer
    });
    // The previous owner of partition 0 (and writer of `merged`), committed behind it.
    let history_end = write_watermarks(
        &t.watermarks,
        &[
            partition(0, floor, false),
            WatermarkMessage::Merged {
                topic: t.input.clone(),
                watermark_ms: floor,
            },
        ],
    )
    .await;
    let port = free_port();
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    e.push(("WATCHBRIDGE_IDLE_TIMEOUT", "2s".into()));
    let ops = Ops::new(port);
    // One instance: it takes both partitions over and writes the `merged` records.
    let mut bridge = Bridge::start(&e);
    // An input between the two: above L, below T.
    resource.set(0, &[now - 15 * 60_000], true);
    produce_user_at(&t.input, 0, 0, now - 15 * 60_000).await;
    if let Some(producer) = open {
        // Until the bridge has either published partition 0 and the merged value (from the
        // records before the transaction) or says it waits for the topic to be read.
        let waits_or_published = async || {
            let ready = ops.get("/readyz").await.map(|(_, body)| body);
            let says = |what: &str| ready.as_deref().is_some_and(|b| b.contains(what));
            let p0 = says("input partition 0")
                || ops
                    .metric("watchbridge_partition_watermark_timestamp_seconds{partition=\"0\"}")
                    .await
                    .is_some();
            let merged = says("merged")
                || ops
                    .metric("watchbridge_watermark_timestamp_seconds")
                    .await
                    .is_some();
            if p0 && merged {
                Ok(())
            } else {
                Err(ready)
            }
        };
        eventually(
            &bridge,
            Duration::from_secs(30),
            "the bridge published partition 0 and the merged value, or waits",
            waits_or_published,
        )
        .await;
        tokio::task::spawn_blocking(move || {
            producer.abort_transaction(Duration::from_secs(30)).unwrap()
        })
        .await
        .unwrap();
    }
    // Inputs stamped now: both values move past T, so the bridge publishes them.
    let input_time = now_ms();
    resource.set(1, &[input_time], true);
    produce_user_at(&t.input, 0, 1, input_time).await;
    eventually(
        &bridge,
        Duration::from_secs(30),
        "partition 0 and the merged value published at the new input's watermark",
        async || {
            let records = watermark_records(&t.watermarks).await;
            let passed = |values: Vec<i64>| values.iter().any(|&v| v >= input_time - 6_000);
            let p0 = partition_values(&records, 0)
                .iter()
                .map(|&(_, v, _)| v)
                .collect();
            let merged = merged_values(&records).iter().map(|&(_, v)| v).collect();
            if passed(p0) && passed(merged) {
                Ok(())
            } else {
                Err(records)
            }
        },
    )
    .await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let records = watermark_records(&t.watermarks).await;
    let by_bridge = |values: Vec<(i64, i64)>| -> Vec<(i64, i64)> {
        values
            .into_iter()
            .filter(|&(offset, _)| offset >= history_end)
            .collect()
    };
    let p0 = by_bridge(
        partition_values(&records, 0)
            .iter()
            .map(|&(o, v, _)| (o, v))
            .collect(),
    );
    let merged = by_bridge(merged_values(&records));
    assert!(
        p0.iter().chain(&merged).all(|&(_, v)| v >= floor),
        "what the bridge published (offset, value), with the previous owner's last values at \
         {floor}: partition 0 {p0:?}, merged {merged:?}\n{}",
        bridge.log()
    );
}

/// A partition's state on the watermark topic says idle, but its new owner restores a live
/// watch (which can still emit at its hold): the new owner publishes `idle: false`, even
/// though the value itself does not change.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_taken_over_with_live_watches_is_published_active_though_the_topic_says_idle() {
    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-takeover-idle", 1).await;
    let mut e = env(&t, &server);
    // The partition's watermark is its watch's hold alone (the input does not drive it), so
    // the new owner derives exactly the value the first published: only the idle flag can
    // differ.
    e.push(("WATCHBRIDGE_WATERMARK_STRATEGY", "none".into()));
    // A watch that stays live: its feed is never final.
    e.push(("WATCHBRIDGE_TERMINATION", "total(10m)".into()));
    let input_time = now_ms();
    resource.set(0, &[input_time + 1_000], false);
    let mut first = Bridge::start(&e);
    produce_user_at(&t.input, 0, 0, input_time).await;
    wait_for_outputs(&t.output, 1, Duration::from_secs(20)).await;
    wait_for_partition_watermark(&first, &t.watermarks, 0, input_time).await;
    assert_eq!(first.terminate().0, Some(0), "{}", first.log());
    let values = partition_values(&watermark_records(&t.watermarks).await, 0);
    let &(_, last, idle) = values.last().unwrap();
    assert!(
        !idle,
        "a partition with a live watch is not idle: {values:?}"
    );
    // The state as a stale or lagging writer could have left it: the same value, idle.
    let crafted_at = write_watermarks(
        &t.watermarks,
        &[WatermarkMessage::Partition {
            topic: t.input.clone(),
            partition: 0,
            watermark_ms: last,
            idle: true,
        }],
    )
    .await;
    let mut second = Bridge::start(&e);
    second.wait_for_log("partition state restored", Duration::from_secs(30));
    assert!(
        second.log().contains("watches=1"),
        "the second instance restored the live watch:\n{}",
        second.log()
    );
    let latest = eventually(
        &second,
        Duration::from_secs(10),
        "the partition's latest record on the watermark topic says idle: false",
        async || {
            let values = partition_values(&watermark_records(&t.watermarks).await, 0);
            match values.last() {
                Some(&(offset, v, false)) if offset >= crafted_at => Ok(v),
                _ => Err(values),
            }
        },
    )
    .await;
    assert_eq!(second.terminate().0, Some(0), "{}", second.log());
    assert!(latest >= last, "{latest} < {last}");
}

/// A bounded run stopped before its watches ended has not completed event time: nothing it
/// publishes says "end of time", neither on the watermark topic nor in-band — not for the
/// partition whose watch was stopped, nor for one that had nothing to read (the run as a
/// whole is not complete).
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_bounded_run_never_publishes_the_end_of_time() {
    let resource = Resource::default();
    let server = resource.serve().await;
    // Input on partition 0 only.
    let t = topics("wm-bounded-stopped", 2).await;
    let now = now_ms();
    resource.set(0, &[now, now + 500], false);
    produce_user(&t.input, 0, 0).await;
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_MODE", "bounded".into()));
    // The watch cannot end soon.
    e.push(("WATCHBRIDGE_TERMINATION", "total(10m)".into()));
    let mut bridge = Bridge::start(&e);
    wait_for_outputs(&t.output, 2, Duration::from_secs(30)).await;
    let (code, _) = bridge.terminate();
    let log = bridge.log();
    let outputs = broker().read_to_end(&t.output).await;
    let emitted = outputs_of(&outputs, 0);
    assert_eq!(
        emitted.len(),
        2,
        "the watch polled and emitted before the stop"
    );
    let end_of_time = |ms: &mut dyn Iterator<Item = &WatermarkMessage>| -> Vec<WatermarkMessage> {
        ms.filter(|m| value_of(m) == END_OF_TIME).cloned().collect()
    };
    let on_topic = end_of_time(&mut watermark_messages(&t.watermarks).await.iter());
    let in_band = end_of_time(&mut in_band(&outputs).iter());
    assert!(
        on_topic.is_empty() && in_band.is_empty(),
        "a bounded run stopped (exit {code:?}) before its watch ended published the end of \
         time: on the watermark topic {on_topic:?}, in-band {in_band:?}\n{log}"
    );
}

/// After a bounded run finished (and published the end of time), a streaming run of the
/// same group is a new run: its outputs are judged against its own watermarks, not the end
/// of time, and it publishes its own values after the end-of-time record.
#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_run_after_a_finished_bounded_run_is_not_pinned_at_the_end_of_time() {
    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-after-bounded", 1).await;
    let now = now_ms();
    resource.set(0, &[now - 2_000, now - 1_500], true);
    produce_user(&t.input, 0, 0).await;
    run_to_success(&bounded(env(&t, &server)), Duration::from_secs(60));
    let records = watermark_records(&t.watermarks).await;
    let ended_at = partition_values(&records, 0)
        .iter()
        .rev()
        .find(|&&(_, v, _)| v == END_OF_TIME)
        .map(|&(offset, _, _)| offset)
        .unwrap_or_else(|| panic!("the bounded run published the end of time: {records:?}"));
    assert!(
        merged_values(&records)
            .iter()
            .any(|&(_, v)| v == END_OF_TIME),
        "{records:?}"
    );

    // A streaming run of the same group, with a new input whose items are on time.
    let mut bridge = Bridge::start(&env(&t, &server));
    let now = now_ms();
    resource.set(1, &[now + 2_000, now + 2_500], true);
    produce_user(&t.input, 0, 1).await;
    wait_for_outputs(&t.output, 4, Duration::from_secs(30)).await;
    let after_the_end = async || {
        let values = partition_values(&watermark_records(&t.watermarks).await, 0);
        let after: Vec<(i64, i64, bool)> = values
            .into_iter()
            .filter(|&(offset, _, _)| offset > ended_at)
            .collect();
        if after.iter().any(|&(_, v, _)| v < END_OF_TIME) {
            Ok(after)
        } else {
            Err(after)
        }
    };
    let _ = poll_until(Duration::from_secs(10), after_the_end).await;
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = broker().read_to_end(&t.output).await;
    let new = outputs_of(&outputs, 1);
    assert_eq!(
        new.len(),
        2,
        "{:?}",
        new.iter().map(|m| describe(m)).collect::<Vec<_>>()
    );
    assert!(
        new.iter().all(|m| !is_late(m)),
        "outputs of the streaming run, on time, marked late: {:?}\n{}",
        new.iter().map(|m| describe(m)).collect::<Vec<_>>(),
        bridge.log()
    );
    let after = after_the_end().await;
    assert!(
        after.is_ok(),
        "the streaming run published a watermark of its own (below the end of time) after the \
         bounded run's end of time (offset {ended_at}); after it: {after:?}\n{}",
        bridge.log()
    );
}

/// A bounded run judges its outputs against the watermark already published for its
/// partition (here by a streaming run of the same group): outputs below it are late.
#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_run_marks_outputs_below_the_published_watermark_late() {
    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-bounded-late", 1).await;
    let now = now_ms();
    resource.set(0, &[now, now + 500], true);
    let mut streaming = Bridge::start(&env(&t, &server));
    produce_user(&t.input, 0, 0).await;
    wait_for_partition_watermark(&streaming, &t.watermarks, 0, now - 6_000).await;
    assert_eq!(streaming.terminate().0, Some(0), "{}", streaming.log());
    let values = partition_values(&watermark_records(&t.watermarks).await, 0);
    let &(_, published, _) = values.last().unwrap();
    assert!(
        published >= now - 6_000 && published < END_OF_TIME,
        "{values:?}"
    );

    // An input an hour old, whose items are an hour old: below what was published.
    resource.set(1, &[now - HOUR, now - HOUR + 500], true);
    produce_user_at(&t.input, 0, 1, now - HOUR).await;
    let bounded_run = run_to_success(&bounded(env(&t, &server)), Duration::from_secs(60));
    let outputs = broker().read_to_end(&t.output).await;
    let old = outputs_of(&outputs, 1);
    assert_eq!(old.len(), 2, "the bounded run emitted the old items");
    assert!(
        old.iter().all(|m| is_late(m)),
        "outputs below the published watermark {published}: {:?}\n{}",
        old.iter().map(|m| describe(m)).collect::<Vec<_>>(),
        bounded_run.log()
    );
}

/// In a streaming run, outputs below the watermark their partition already published (an
/// input that arrives an hour late, with items as old) are marked late and counted; its
/// on-time outputs, and earlier watches', are not marked.
#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_run_marks_outputs_below_its_published_watermark_late_and_counts_them() {
    let resource = Resource::default();
    let server = resource.serve().await;
    let t = topics("wm-late", 1).await;
    let port = free_port();
    let mut e = env(&t, &server);
    e.push(("WATCHBRIDGE_METRICS_ADDR", format!("127.0.0.1:{port}")));
    e.push(("WATCHBRIDGE_WATERMARK_STRATEGY", "bounded(5s)".into()));
    let ops = Ops::new(port);
    let now = now_ms();
    resource.set(0, &[now, now + 500], true);
    let mut bridge = Bridge::start(&e);
    produce_user(&t.input, 0, 0).await;
    let published = wait_for_partition_watermark(&bridge, &t.watermarks, 0, now - 6_000).await;
    // Two items an hour old (late) and one a minute ahead (on time).
    resource.set(1, &[now - HOUR, now - HOUR + 500, now + 60_000], true);
    produce_user_at(&t.input, 0, 1, now - HOUR).await;
    wait_for_outputs(&t.output, 5, Duration::from_secs(30)).await;
    let counted = ops
        .metric("watchbridge_late_outputs_total")
        .await
        .unwrap_or_else(|| panic!("no watchbridge_late_outputs_total\n{}", bridge.log()));
    assert_eq!(bridge.terminate().0, Some(0), "{}", bridge.log());
    let outputs = broker().read_to_end(&t.output).await;
    let show = |ms: &[&OwnedMessage]| ms.iter().map(|m| describe(m)).collect::<Vec<_>>();
    let (first, second) = (outputs_of(&outputs, 0), outputs_of(&outputs, 1));
    assert_eq!(
        (first.len(), second.len()),
        (2, 3),
        "{:?}",
        show(&outputs.iter().collect::<Vec<_>>())
    );
    assert!(
        first.iter().all(|m| !is_late(m)),
        "the first watch's outputs are on time: {:?}",
        show(&first)
    );
    for m in &second {
        let event_time = m.timestamp().to_millis().unwrap();
        assert_eq!(
            is_late(m),
            event_time < published,
            "{} (the partition's watermark was {published}): late exactly when below it\n{}",
            describe(m),
            bridge.log()
        );
    }
    let marked = outputs.iter().filter(|m| is_late(m)).count();
    assert_eq!(marked, 2, "{:?}", show(&second));
    assert_eq!(
        counted, marked as f64,
        "watchbridge_late_outputs_total counts the outputs marked late"
    );
}

//! One bridge test's world: unique topics, the bridge's settings for them against a
//! loopback HTTP resource of per-user feeds, inputs produced, outputs waited for. Shared by
//! the tests that run the real bridge (bridge.rs, ops.rs, prometheus.rs).

use super::http_server::{Reply, Seen, TestServer};
use super::kafka::{broker, header};
use rdkafka::message::OwnedMessage;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Input partition 0's watermark values on the watermark topic `topic`, in topic order, up
/// to its end offsets.
pub async fn partition_watermarks(topic: &str) -> Vec<i64> {
    use rdkafka::Message;
    use watchbridge::watermark::WatermarkMessage;
    broker()
        .read_to_end(topic)
        .await
        .iter()
        .filter_map(|m| match WatermarkMessage::parse(m.payload()?).ok()? {
            WatermarkMessage::Partition {
                partition: 0,
                watermark_ms,
                ..
            } => Some(watermark_ms),
            _ => None,
        })
        .collect()
}

/// The event time of the feeds' first item.
pub const T0: i64 = 1_796_000_000_000;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[allow(unused_imports)] // not every test binary picks ports
pub use super::broker_process::free_port;

/// Topics and settings of one test, unique so tests in one binary do not meet.
pub struct Setup {
    pub input: String,
    pub output: String,
    pub dlq: String,
    pub group: String,
}

impl Setup {
    /// Creates the input topic with `partitions`; the bridge creates the others.
    pub async fn new(name: &str, partitions: i32) -> Self {
        let b = broker();
        let input = b.unique_topic(&format!("{name}-in"));
        b.create_topic(&input, partitions).await;
        Self {
            output: format!("{input}-out"),
            dlq: format!("{input}.dlq"),
            group: format!("{input}-group"),
            input,
        }
    }

    /// The bridge's settings: these topics, the HTTP poller on `server`'s
    /// `/users/{id}/events` feeds.
    pub fn env(&self, server: &TestServer) -> Vec<(&'static str, String)> {
        vec![
            ("WATCHBRIDGE_INPUT_TOPIC", self.input.clone()),
            ("WATCHBRIDGE_OUTPUT_TOPIC", self.output.clone()),
            ("WATCHBRIDGE_GROUP_ID", self.group.clone()),
            ("WATCHBRIDGE_HTTP_URL", server.url("/users/{/id}/events")),
            ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
            ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
            ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
            ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
        ]
    }
}

/// Each user `u` has two events, at T0 + u s and T0 + u s + 500 ms; the feed is final.
pub fn finished_feeds(seen: &Seen) -> Reply {
    feeds(seen, true)
}

/// The same two events per user, final or not.
pub fn feeds(seen: &Seen, done: bool) -> Reply {
    let user: i64 = seen.target.split('/').nth(2).unwrap().parse().unwrap();
    Reply::json(json!({
        "events": [
            {"id": format!("u{user}-a"), "at": T0 + user * 1000},
            {"id": format!("u{user}-b"), "at": T0 + user * 1000 + 500},
        ],
        "done": done,
    }))
}

/// The input of user `user` (key `user-<n>`, value `{"id": n}`), to `partition` or by key.
pub async fn produce_user_to(topic: &str, partition: Option<i32>, user: i64) {
    broker()
        .produce(
            topic,
            partition,
            Some(format!("user-{user}").as_bytes()),
            json!({"id": user}).to_string().as_bytes(),
            &[],
        )
        .await;
}

/// The input of user `user`, partitioned by key.
pub async fn produce_user(topic: &str, user: i64) {
    produce_user_to(topic, None, user).await;
}

/// Output records only: in-band watermark records (`watchbridge-control`) left out.
pub fn data_records(messages: Vec<OwnedMessage>) -> Vec<OwnedMessage> {
    messages
        .into_iter()
        .filter(|m| header(m, "watchbridge-control").is_none())
        .collect()
}

/// Wait until at least `n` output records (not counting watermark records) are on `topic`;
/// returns what is there. Only a wait: it says nothing about what may come later. To assert
/// that nothing more arrives, stop the bridge and read the topic to its end
/// ([`outputs_to_end`]).
pub async fn wait_for_outputs(topic: &str, n: usize, within: Duration) -> Vec<OwnedMessage> {
    let deadline = Instant::now() + within;
    loop {
        let all = broker().read_to_end(topic).await;
        let total = all.len();
        let data = data_records(all);
        if data.len() >= n {
            return data;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} outputs on {topic} ({total} records with the watermark ones)",
            data.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every output record on `topic` up to its end offsets (watermark records left out), read
/// `read_committed`: once the bridge has stopped, everything it ever wrote there.
pub async fn outputs_to_end(topic: &str) -> Vec<OwnedMessage> {
    data_records(broker().read_to_end(topic).await)
}

pub use super::kafka::output_key;

/// How many times each output key occurs among `records`: nothing deduplicated.
pub fn output_key_counts(records: &[OwnedMessage]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in records {
        *counts.entry(output_key(m)).or_default() += 1;
    }
    counts
}

/// Panics unless every key of `expected` occurs exactly `times` in `counts` and no other key
/// occurs; the message names the keys found another number of times (with their counts),
/// the missing ones and the unexpected ones, then `context` (a bridge's log, say).
pub fn assert_each_n_times<S: AsRef<str>>(
    counts: &BTreeMap<String, usize>,
    expected: impl IntoIterator<Item = S>,
    times: usize,
    context: &str,
) {
    let expected: BTreeSet<String> = expected
        .into_iter()
        .map(|k| k.as_ref().to_string())
        .collect();
    let wrong: Vec<(&String, &usize)> = counts
        .iter()
        .filter(|(k, &n)| expected.contains(*k) && n != times)
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|k| !counts.contains_key(*k))
        .collect();
    let unexpected: Vec<(&String, &usize)> = counts
        .iter()
        .filter(|(k, _)| !expected.contains(*k))
        .collect();
    let show = |v: &dyn std::fmt::Debug, n: usize| {
        let text = format!("{v:?}");
        if text.len() > 2000 {
            format!("{}… ({n} in all)", &text[..2000])
        } else {
            text
        }
    };
    assert!(
        wrong.is_empty() && missing.is_empty() && unexpected.is_empty(),
        "each of {} outputs {times} time(s): found another number of times (key, count): {}; \
         missing: {}; unexpected (key, count): {}\n{context}",
        expected.len(),
        show(&wrong, wrong.len()),
        show(&missing, missing.len()),
        show(&unexpected, unexpected.len()),
    );
}

/// [`assert_each_n_times`] once: every expected output exactly once, nothing else.
pub fn assert_each_once<S: AsRef<str>>(
    counts: &BTreeMap<String, usize>,
    expected: impl IntoIterator<Item = S>,
    context: &str,
) {
    assert_each_n_times(counts, expected, 1, context)
}

/// The two output keys of each of `users` (the [`feeds`]' items).
pub fn user_output_keys(users: impl IntoIterator<Item = i64>) -> Vec<String> {
    users
        .into_iter()
        .flat_map(|u| [format!("u{u}-a"), format!("u{u}-b")])
        .collect()
}

/// Runs the bridge until it exits by itself (a refused start, say), at most `within`;
/// its exit status and its stderr.
pub fn run_to_exit(env: &[(&str, String)], within: Duration) -> (std::process::ExitStatus, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_watchbridge"));
    for (name, _) in std::env::vars() {
        if name.starts_with("WATCHBRIDGE_") || name.starts_with("KAFKA_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .env("WATCHBRIDGE_BROKERS", broker().bootstrap())
        .env("WATCHBRIDGE_METRICS_ADDR", "off")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start watchbridge");
    // Read stderr on the side, so a chatty child never blocks on a full pipe.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        stderr
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the bridge did not exit within {within:?}:\n{}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, reader.join().unwrap_or_default())
}

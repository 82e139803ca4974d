//! One bridge test's world: unique topics, the bridge's settings for them against a
//! loopback HTTP resource of per-user feeds, inputs produced, outputs waited for. Shared by
//! the tests that run the real bridge (bridge.rs, ops.rs, prometheus.rs).

use super::http_server::{Reply, Seen, TestServer};
use super::kafka::{broker, header};
use rdkafka::message::OwnedMessage;
use serde_json::json;
use std::time::{Duration, Instant};

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

/// Wait until `n` output records (not counting watermark records) are on `topic`.
pub async fn wait_for_outputs(topic: &str, n: usize, within: Duration) -> Vec<OwnedMessage> {
    let deadline = Instant::now() + within;
    // Each try reads the topic from its start for `window`; a long topic needs a longer one.
    let mut window = Duration::from_millis(1500);
    loop {
        let all = broker().consume_for(topic, window).await;
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
        window = (window * 2).min(Duration::from_secs(20));
    }
}

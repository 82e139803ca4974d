//! Per-user feeds that grow on the wall clock, served over HTTP, and the check of an output
//! topic against them: the ground truth of the tests that crash, restart or compact under a
//! running bridge (chaos.rs, compaction.rs).

use super::http_server::{Reply, TestServer};
use super::kafka::{header, is_settle};
use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The resource: user u's feed starts at `t0 + u·stagger_ms`; item j exists from
/// `start + j·pace_ms` on, with event time `start + j·pace_ms − lag_ms`; the feed is final
/// once all `items[u]` exist. Pure function of the clock: the ground truth.
#[derive(Clone, Debug)]
pub struct Feeds {
    pub t0: i64,
    pub pace_ms: i64,
    pub stagger_ms: i64,
    pub lag_ms: i64,
    /// Items of each user's feed, by user.
    pub items: Vec<i64>,
}

impl Feeds {
    pub fn users(&self) -> i64 {
        self.items.len() as i64
    }

    fn start(&self, user: i64) -> i64 {
        self.t0 + user * self.stagger_ms
    }

    /// How many items user's feed has at `now`.
    pub fn len_at(&self, user: i64, now: i64) -> i64 {
        let start = self.start(user);
        if now < start {
            0
        } else {
            ((now - start) / self.pace_ms + 1).min(self.items[user as usize])
        }
    }

    pub fn event_time(&self, user: i64, item: i64) -> i64 {
        self.start(user) + item * self.pace_ms - self.lag_ms
    }

    pub fn output_key(user: i64, item: i64) -> String {
        format!("{user}-{item}")
    }

    /// When user's feed is final.
    pub fn final_at(&self, user: i64) -> i64 {
        self.start(user) + (self.items[user as usize] - 1) * self.pace_ms
    }

    /// When every feed is final.
    pub fn all_final_at(&self) -> i64 {
        (0..self.users()).map(|u| self.final_at(u)).max().unwrap()
    }

    fn page(&self, user: i64, now: i64) -> Value {
        let len = self.len_at(user, now);
        let events: Vec<Value> = (0..len)
            .map(|j| json!({"id": Self::output_key(user, j), "at": self.event_time(user, j)}))
            .collect();
        json!({"events": events, "done": len == self.items[user as usize]})
    }

    /// Serves `/users/{u}` for every user (404 otherwise).
    pub async fn serve(&self) -> Served {
        let feeds = self.clone();
        let last_request = Arc::new(AtomicI64::new(0));
        let polls: Arc<Vec<AtomicI64>> = Arc::new((0..self.users()).map(|_| 0.into()).collect());
        let last_polls: Arc<Vec<AtomicI64>> =
            Arc::new((0..self.users()).map(|_| 0.into()).collect());
        let (last, counts, lasts) = (last_request.clone(), polls.clone(), last_polls.clone());
        let server = TestServer::start(move |seen| {
            let now = now_ms();
            last.store(now, Ordering::Relaxed);
            let user: Option<i64> = seen
                .target
                .strip_prefix("/users/")
                .and_then(|u| u.parse().ok());
            match user {
                Some(u) if (0..feeds.users()).contains(&u) => {
                    counts[u as usize].fetch_add(1, Ordering::Relaxed);
                    lasts[u as usize].store(now, Ordering::Relaxed);
                    Reply::json(feeds.page(u, now))
                }
                _ => Reply::status(404, "{}"),
            }
        })
        .await;
        Served {
            server,
            last_request,
            polls,
            last_polls,
        }
    }

    /// Every (input key, output key) that exists at `now`, with its event time.
    pub fn expected_at(&self, now: i64) -> BTreeMap<(String, String), i64> {
        let mut expected = BTreeMap::new();
        for user in 0..self.users() {
            for item in 0..self.len_at(user, now) {
                expected.insert(
                    (input_key(user), Self::output_key(user, item)),
                    self.event_time(user, item),
                );
            }
        }
        expected
    }
}

/// The feeds' HTTP server, and what it has been asked.
pub struct Served {
    pub server: TestServer,
    /// When the last request came (ms since the epoch; 0: none yet).
    pub last_request: Arc<AtomicI64>,
    /// Requests per user.
    pub polls: Arc<Vec<AtomicI64>>,
    /// When each user's feed was last requested (0: never).
    pub last_polls: Arc<Vec<AtomicI64>>,
}

impl Served {
    /// The bridge's settings for these feeds: its topics and group, the HTTP poller on
    /// `/users/{id}`, polls `poll_interval` apart.
    pub fn bridge_env(
        &self,
        input: &str,
        output: &str,
        group: &str,
        poll_interval: &str,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("WATCHBRIDGE_INPUT_TOPIC", input.into()),
            ("WATCHBRIDGE_OUTPUT_TOPIC", output.into()),
            ("WATCHBRIDGE_GROUP_ID", group.into()),
            ("WATCHBRIDGE_HTTP_URL", self.server.url("/users/{/id}")),
            ("WATCHBRIDGE_HTTP_ITEMS", "/events".into()),
            ("WATCHBRIDGE_HTTP_ITEM_KEY", "/id".into()),
            ("WATCHBRIDGE_HTTP_ITEM_TIME", "/at".into()),
            ("WATCHBRIDGE_HTTP_COMPLETE", "/done".into()),
            ("WATCHBRIDGE_POLL_INTERVAL", poll_interval.into()),
        ]
    }

    /// Requests for user's feed so far.
    pub fn polls_of(&self, user: i64) -> i64 {
        self.polls[user as usize].load(Ordering::Relaxed)
    }

    /// Waits until every feed is final and then until the resource has had no request for
    /// 3 s (a final watch is not polled again). `since` is when the last bridge owned its
    /// partitions: one still joining its group, or restoring them, polls nothing either, so
    /// the quiet spell counts only once it has polled since then, or, if it has not, from
    /// 10 s after `since` (it had nothing left to poll: every watch it restored was final).
    /// At most 60 s past the feeds' end; if it was still polled then, the users polled in the
    /// last 3 s.
    pub async fn wait_until_quiet(&self, feeds: &Feeds, since: i64) -> Result<(), Vec<i64>> {
        let final_at = feeds.all_final_at();
        let deadline = Instant::now()
            + Duration::from_millis((final_at - now_ms()).max(0) as u64)
            + Duration::from_secs(60);
        loop {
            let now = now_ms();
            let last = self.last_request.load(Ordering::Relaxed);
            let quiet_since = if last > since { last } else { since + 7000 };
            if now > final_at + 1000 && now - quiet_since > 3000 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err((0..feeds.users())
                    .filter(|&u| now - self.last_polls[u as usize].load(Ordering::Relaxed) < 3000)
                    .collect());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub fn input_key(user: i64) -> String {
    format!("user-{user}")
}

/// The output topic's data records compared with the expected outputs by (input key,
/// output key). Nothing is deduplicated: a record read twice counts twice.
pub struct Tally<'a> {
    /// Each expected output's copies found.
    pub copies: BTreeMap<(String, String), Vec<&'a OwnedMessage>>,
    /// Expected, never found.
    pub lost: Vec<(String, String)>,
    /// (key, expected event time, record timestamp) where they differ.
    pub wrong_time: Vec<((String, String), i64, Option<i64>)>,
    /// Found, not expected.
    pub unexpected: Vec<(String, String)>,
    /// Where the settle records of restoring partitions are (output partition, offset), in
    /// offset order: which restore a duplicate's copies came after.
    pub settles: Vec<(i32, i64)>,
}

impl<'a> Tally<'a> {
    pub fn of(records: &'a [OwnedMessage], expected: &BTreeMap<(String, String), i64>) -> Self {
        let mut tally = Tally {
            copies: BTreeMap::new(),
            lost: Vec::new(),
            wrong_time: Vec::new(),
            unexpected: Vec::new(),
            settles: Vec::new(),
        };
        for m in records {
            if is_settle(m) {
                tally.settles.push((m.partition(), m.offset()));
            }
            if header(m, "watchbridge-control").is_some() {
                continue;
            }
            let key = (
                m.key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default(),
                super::kafka::output_key(m),
            );
            match expected.get(&key) {
                None => tally.unexpected.push(key),
                Some(&event_time) => {
                    let ts = m.timestamp().to_millis();
                    if ts != Some(event_time) {
                        tally.wrong_time.push((key.clone(), event_time, ts));
                    }
                    tally.copies.entry(key).or_default().push(m);
                }
            }
        }
        tally.lost = expected
            .keys()
            .filter(|k| !tally.copies.contains_key(*k))
            .cloned()
            .collect();
        tally
    }

    /// Outputs found more than once, with their copies.
    pub fn duplicated(&self) -> Vec<(&(String, String), &Vec<&'a OwnedMessage>)> {
        self.copies.iter().filter(|(_, c)| c.len() > 1).collect()
    }

    pub fn exactly_once(&self) -> usize {
        self.copies.values().filter(|c| c.len() == 1).count()
    }

    /// Every expected output exactly once with its event time, nothing else.
    pub fn is_exact(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated().is_empty()
            && self.wrong_time.is_empty()
            && self.unexpected.is_empty()
    }

    /// Up to five examples of each kind of fault, one per line, each starting with `prefix`.
    pub fn examples(&self, prefix: &str) -> String {
        let mut lines = Vec::new();
        for (input_key, output_key) in self.lost.iter().take(5) {
            lines.push(format!("{prefix} lost {input_key} {output_key}"));
        }
        let mut lost_per_user: BTreeMap<&str, usize> = BTreeMap::new();
        for (input_key, _) in &self.lost {
            *lost_per_user.entry(input_key.as_str()).or_default() += 1;
        }
        if !lost_per_user.is_empty() {
            lines.push(format!("{prefix} lost per watch: {lost_per_user:?}"));
        }
        for ((input_key, output_key), c) in self.duplicated().iter().take(5) {
            let at: Vec<String> = c
                .iter()
                .map(|m| {
                    let (p, at) = (m.partition(), m.offset());
                    let settle = self
                        .settles
                        .iter()
                        .filter(|(sp, so)| *sp == p && *so < at)
                        .map(|(_, so)| *so)
                        .max();
                    let settle = settle.map_or(String::new(), |so| format!(" (after settle@{so})"));
                    format!("p{p}@{at}{settle}")
                })
                .collect();
            lines.push(format!(
                "{prefix} duplicated {input_key} {output_key} x{} at {}",
                c.len(),
                at.join(",")
            ));
        }
        for ((input_key, output_key), want, got) in self.wrong_time.iter().take(5) {
            lines.push(format!(
                "{prefix} wrong event time {input_key} {output_key}: want {want}, got {got:?}"
            ));
        }
        for key in self.unexpected.iter().take(5) {
            lines.push(format!("{prefix} unexpected output {key:?}"));
        }
        lines.join("\n")
    }
}

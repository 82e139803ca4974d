//! Operating individual watches: what the operations API (`ops_server.rs`) asks of this
//! instance's partitions, and the orders it gives them.
//!
//! Each partition task registers its engine here ([`Controls::register`]): the engine
//! answers [`Control`] messages between its other work (it alone owns its watches, so a
//! question is a message, not a lock), and the task keeps its partition's
//! [`PartitionStatus`] current. Pausing is instance-wide ([`Pause`]): engines dispatch no
//! poll while paused, and every watch keeps its state and its place in the queue.
//!
//! What a status shows costs the watches nothing: it is read from what a watch already
//! holds (its progress, its seen set, its hold, its termination state) and from the
//! engine's timer queue. The one addition is the error of a watch's last poll, kept only
//! while its polls fail (a failing watch is rare; every watch keeping its last result would
//! cost a million idle watches tens of megabytes).

use crate::clock::Millis;
use bytes::Bytes;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

/// What a watch is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchState {
    /// A poll of it runs now.
    Polling,
    /// It waits for its next poll.
    Waiting,
    /// Its last poll failed; it waits to retry.
    Retrying,
    /// It ended (remembered within `WATCHBRIDGE_FINISHED_RETENTION`).
    Finished,
}

impl std::str::FromStr for WatchState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "polling" => Ok(Self::Polling),
            "waiting" => Ok(Self::Waiting),
            "retrying" => Ok(Self::Retrying),
            "finished" => Ok(Self::Finished),
            other => Err(format!(
                "`{other}` is not a watch state: polling, waiting, retrying or finished"
            )),
        }
    }
}

/// One live watch as the operations API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchStatus {
    /// The watch key (lossy UTF-8).
    pub key: String,
    /// The input partition that owns it.
    pub partition: i32,
    /// What it is doing.
    pub state: WatchState,
    /// The input record it was started from (filled in by its partition: `key`, `value`
    /// as JSON when it is JSON, else as text, and `time_ms`; left out of lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    /// When its input arrived (processing time, epoch ms).
    pub started_ms: Millis,
    /// When its last poll completed, to the second (`None`: not since this instance has
    /// it), and how: `ok` or `failed`.
    pub last_poll_ms: Option<Millis>,
    /// `ok` or `failed` (`last_error` says why), for the poll at `last_poll_ms`.
    pub last_poll_result: Option<&'static str>,
    /// Polls that succeeded.
    pub polls_ok: u64,
    /// Polls that failed in a row (0 after a success).
    pub failures_in_a_row: u32,
    /// Polls in a row that found nothing new.
    pub empty_polls_in_a_row: u32,
    /// When a poll last found something new (its arrival until one did).
    pub last_new_output_ms: Millis,
    /// The error of its last poll, while its polls fail.
    pub last_error: Option<String>,
    /// When its next poll is due (`None` while one runs).
    pub next_poll_ms: Option<Millis>,
    /// Outputs it has seen (and emitted once each).
    pub seen_outputs: usize,
    /// Where it holds its partition's watermark: it may still emit at this event time.
    pub hold_ms: Millis,
    /// Its termination conditions, each with how far it has got.
    pub termination: String,
    /// Whether an operator paused it (on its own or with every watch).
    pub paused: bool,
}

/// A watch that ended, as the operations API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndedWatch {
    /// The watch key (lossy UTF-8).
    pub key: String,
    /// The input partition that owns it.
    pub partition: i32,
    /// Always [`WatchState::Finished`].
    pub state: WatchState,
    /// Why it ended: `final`, `total`, `stable`, `polls`, `all`, `failed`, `stopped`, or a
    /// user condition's name.
    pub reason: String,
    /// When it ended (epoch ms).
    pub ended_ms: Millis,
}

/// A watch, live or ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum WatchView {
    /// Live.
    Live(Box<WatchStatus>),
    /// Ended, and remembered.
    Ended(EndedWatch),
}

impl WatchView {
    /// Leave the input record's value out (`WATCHBRIDGE_CONTROL_SHOW_INPUTS` off): it is
    /// often personal data. Its key and time stay.
    pub fn hide_input_value(&mut self) {
        if let Self::Live(status) = self {
            if let Some(serde_json::Value::Object(input)) = status.input.as_mut() {
                if input.remove("value").is_some() {
                    input.insert(
                        "value_hidden".into(),
                        serde_json::Value::from(
                            "set WATCHBRIDGE_CONTROL_SHOW_INPUTS=true to show it",
                        ),
                    );
                }
            }
        }
    }
}

/// Which watches a list shows, and which page of them.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only watches in this state.
    pub state: Option<WatchState>,
    /// Only the watch(es) holding their partition's watermark back (the lowest hold).
    pub holds_watermark: bool,
    /// Watches to skip (per the order of keys).
    pub offset: usize,
    /// Most watches to show.
    pub limit: usize,
}

/// Messages an engine answers (`engine.rs`).
#[derive(Debug)]
pub enum Control {
    /// The status of `key`'s watch, if it is live here.
    Status {
        /// The watch key.
        key: Bytes,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<WatchStatus>>,
    },
    /// Every live watch matching the query (unpaged: the caller merges partitions), and
    /// how many watches are live in all.
    List {
        /// Which ones.
        query: ListQuery,
        /// Where the answer goes.
        reply: oneshot::Sender<(usize, Vec<WatchStatus>)>,
    },
    /// Poll `key`'s watch now rather than when it is due. Answers `None` when it is not
    /// live here, `Some(false)` when its poll runs already.
    PollNow {
        /// The watch key.
        key: Bytes,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<bool>>,
    },
    /// End `key`'s watch as `stopped` (durably: its partition saves it finished). Answers
    /// whether it was live here.
    Stop {
        /// The watch key.
        key: Bytes,
        /// Where the answer goes.
        reply: oneshot::Sender<bool>,
    },
}

/// One input partition as the operations API shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PartitionStatus {
    /// The input partition.
    pub partition: i32,
    /// Its published watermark (epoch ms).
    pub watermark_ms: Option<Millis>,
    /// Whether the merged watermark ignores it.
    pub idle: bool,
    /// Whether it is still restoring its watches (nothing is read meanwhile).
    pub recovering: bool,
    /// The input offset it has committed up to (the next to read after a restart).
    pub committed_offset: Option<i64>,
    /// Live watches (filled in when asked, from its engine).
    pub live_watches: usize,
    /// The watch with the lowest hold: what holds the watermark back (filled in when
    /// asked).
    pub lowest_hold: Option<WatchStatus>,
}

/// Whether watches poll: every watch of the group (`POST /pause`, `POST /resume`) or one
/// (`POST /watches/{key}/pause`, `…/resume`). Set from the control topic
/// ([`crate::kafka::control_topic`]), which every instance reads, so an order given to any
/// instance applies on all of them and survives their restarts.
#[derive(Debug, Default)]
pub struct Pause {
    paused: AtomicBool,
    resumed: Notify,
    /// Watch keys paused one by one (few: an operator names each).
    keys: Mutex<std::collections::HashSet<Bytes>>,
    /// Whether `keys` is not empty (read on every dispatch without the lock).
    any_keys: AtomicBool,
}

impl Pause {
    /// Stop or start polling.
    pub fn set(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        if !paused {
            self.resumed.notify_waiters();
        }
    }

    /// Whether polling is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Stop or start polling `key`'s watch.
    pub fn set_key(&self, key: Bytes, paused: bool) {
        let mut keys = lock(&self.keys);
        if paused {
            keys.insert(key);
        } else {
            keys.remove(&key);
        }
        self.any_keys.store(!keys.is_empty(), Ordering::SeqCst);
    }

    /// Whether `key`'s watch is paused on its own (not counting a pause of all).
    pub fn is_key_paused(&self, key: &[u8]) -> bool {
        self.any_keys.load(Ordering::SeqCst) && lock(&self.keys).contains(key)
    }

    /// The keys paused one by one, sorted.
    pub fn paused_keys(&self) -> Vec<Bytes> {
        let mut keys: Vec<Bytes> = lock(&self.keys).iter().cloned().collect();
        keys.sort();
        keys
    }

    /// Ready once polling resumes (at once when it is not paused).
    pub async fn resumed(&self) {
        loop {
            let notified = self.resumed.notified();
            if !self.is_paused() {
                return;
            }
            notified.await;
        }
    }
}

/// Whether a partition's engine still turns: the engine marks each turn of its loop, and
/// `/healthz` fails when one that has work has not turned for `WATCHBRIDGE_STALL_TIMEOUT`
/// ([`Controls::stalled`]). An engine waiting for its partition task to take its events
/// (full channel: the task waits on Kafka) is not stalled; the brokers' alerts cover that.
pub struct Heartbeat {
    /// When its loop last turned.
    turned: Mutex<std::time::Instant>,
    /// Whether it had work then (live watches or polls in flight).
    busy: AtomicBool,
    /// Whether its events' channel is full, to tell "blocked downstream" from "stuck" (the
    /// engine's answer: it holds the channel weakly, so as not to keep it open).
    blocked_downstream: Mutex<Option<BlockedDownstream>>,
}

/// Asks an engine whether its events' channel is full.
type BlockedDownstream = Box<dyn Fn() -> bool + Send + Sync>;

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            turned: Mutex::new(std::time::Instant::now()),
            busy: AtomicBool::new(false),
            blocked_downstream: Mutex::new(None),
        }
    }
}

impl Heartbeat {
    /// The engine's loop turned, with work or without.
    pub fn turned(&self, busy: bool) {
        *lock(&self.turned) = std::time::Instant::now();
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// The channel the engine sends its events to: full, its loop waits on its partition
    /// task, not stuck.
    pub fn sends_to<T: Send + 'static>(&self, events: &mpsc::Sender<T>) {
        let events = events.downgrade();
        *lock(&self.blocked_downstream) = Some(Box::new(move || {
            events
                .upgrade()
                .is_some_and(|events| events.capacity() == 0)
        }));
    }

    /// How long it has been stuck with work, if longer than `timeout`.
    fn stuck_for(&self, timeout: Duration) -> Option<Duration> {
        let since = lock(&self.turned).elapsed();
        if since <= timeout || !self.busy.load(Ordering::Relaxed) {
            return None;
        }
        let blocked_downstream = lock(&self.blocked_downstream)
            .as_ref()
            .is_some_and(|blocked| blocked());
        (!blocked_downstream).then_some(since)
    }
}

/// A question for a partition task rather than its engine, about what the task keeps to
/// save its watches.
#[derive(Debug)]
pub enum TaskQuery {
    /// The input record `key`'s live watch was started from (the engine has only what the
    /// poller made of it).
    Input {
        /// The watch key.
        key: Bytes,
        /// Where the answer goes (`None`: no live watch with that key).
        reply: oneshot::Sender<Option<serde_json::Value>>,
    },
    /// The ended watches it remembers: `key`'s, or every one.
    Ended {
        /// One watch key, or `None` for all.
        key: Option<Bytes>,
        /// Where the answer goes.
        reply: oneshot::Sender<Vec<EndedWatch>>,
    },
}

/// What a partition registers with: its engine's messages, its task's questions, and the
/// status the task keeps current.
pub struct PartitionControls {
    /// For the engine ([`crate::engine::Engine::with_controls`]).
    pub messages: mpsc::Receiver<Control>,
    /// For the partition task.
    pub input_queries: mpsc::Receiver<TaskQuery>,
    /// Kept current by the partition task.
    pub status: Arc<Mutex<PartitionStatus>>,
    /// Marked by the engine.
    pub heartbeat: Arc<Heartbeat>,
}

struct Registered {
    controls: mpsc::Sender<Control>,
    inputs: mpsc::Sender<TaskQuery>,
    status: Arc<Mutex<PartitionStatus>>,
    heartbeat: Arc<Heartbeat>,
}

/// This instance's partitions, for the operations API.
#[derive(Default)]
pub struct Controls {
    partitions: Mutex<BTreeMap<i32, Registered>>,
    /// Shared by every engine of this instance.
    pub pause: Arc<Pause>,
    /// The input topic's partition count, once the start has read it (0 before).
    input_partitions: std::sync::atomic::AtomicI32,
    /// Whether the inputs go through the repartition topic (`kafka/repartition/`): a
    /// watch's partition is then its key's CRC-32 in that topic.
    repartitioned: std::sync::atomic::AtomicBool,
}

/// The input partition a record keyed `key` goes to under each common partitioner, of
/// `partitions`: a watch lives in its input's partition, so on the instance that owns it.
/// Which one applies depends on how the inputs are produced, which the bridge cannot see.
pub fn partition_of_key(key: &[u8], partitions: i32) -> serde_json::Value {
    if partitions <= 0 {
        return serde_json::Value::Null;
    }
    let n = partitions as u32;
    serde_json::json!({
        // The Java client's default for keyed records (also Kafka Streams, Kafka Connect).
        "murmur2": (murmur2(key) & 0x7fff_ffff) % n,
        // librdkafka's default (`consistent_random`): C, Go, Python, .NET clients, and
        // `watchbridge produce`.
        "crc32": crc32_partition(key, partitions),
    })
}

/// The partition of `partitions` librdkafka's default partitioner (`consistent_random`)
/// puts a record keyed `key` in: CRC-32 of the key. The repartition stage puts each watch
/// key there (`kafka/repartition/`), so it is also where that key's watch lives then.
pub fn crc32_partition(key: &[u8], partitions: i32) -> i32 {
    (crc32fast::hash(key) % partitions.max(1) as u32) as i32
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as its default
/// partitioner hashes a key.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// How long the API waits for an engine to answer (one busy with a burst answers between
/// two of its events; a partition being revoked may not answer at all).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Where a watch asked for is.
#[derive(Debug)]
pub enum Lookup<T> {
    /// Live on this instance, in this partition.
    Here(i32, T),
    /// Not live on this instance, which owns these partitions.
    NotHere(Vec<i32>),
}

impl Controls {
    /// Partition `partition`'s engine and task take their messages from what is returned,
    /// and the task keeps its status current. A partition assigned again replaces its
    /// earlier registration.
    pub fn register(&self, partition: i32) -> PartitionControls {
        let (tx, rx) = mpsc::channel(16);
        let (inputs, input_queries) = mpsc::channel(16);
        let status = Arc::new(Mutex::new(PartitionStatus {
            partition,
            recovering: true,
            ..PartitionStatus::default()
        }));
        let heartbeat = Arc::new(Heartbeat::default());
        lock(&self.partitions).insert(
            partition,
            Registered {
                controls: tx,
                inputs,
                status: status.clone(),
                heartbeat: heartbeat.clone(),
            },
        );
        PartitionControls {
            messages: rx,
            input_queries,
            status,
            heartbeat,
        }
    }

    /// The partition is no longer this instance's (its task ended), unless it was
    /// registered again meanwhile (`status` is the registration's).
    pub fn unregister(&self, partition: i32, status: &Arc<Mutex<PartitionStatus>>) {
        let mut partitions = lock(&self.partitions);
        if partitions
            .get(&partition)
            .is_some_and(|r| Arc::ptr_eq(&r.status, status))
        {
            partitions.remove(&partition);
        }
    }

    /// The input topic has `n` partitions (the start has read its metadata).
    pub fn set_input_partitions(&self, n: i32) {
        self.input_partitions.store(n, Ordering::Relaxed);
    }

    /// The input topic's partition count (0 before the start has read it).
    pub fn input_partitions(&self) -> i32 {
        self.input_partitions.load(Ordering::Relaxed)
    }

    /// The inputs go through the repartition topic, whose partitions the watches are in.
    pub fn set_repartitioned(&self) {
        self.repartitioned.store(true, Ordering::Relaxed);
    }

    /// Whether the inputs go through the repartition topic.
    pub fn repartitioned(&self) -> bool {
        self.repartitioned.load(Ordering::Relaxed)
    }

    /// A partition whose engine has had work but not turned for longer than `timeout`,
    /// and for how long.
    pub fn stalled(&self, timeout: Duration) -> Option<(i32, Duration)> {
        lock(&self.partitions)
            .iter()
            .find_map(|(p, r)| r.heartbeat.stuck_for(timeout).map(|d| (*p, d)))
    }

    /// The partitions this instance owns.
    pub fn owned(&self) -> Vec<i32> {
        lock(&self.partitions).keys().copied().collect()
    }

    fn senders(&self) -> Vec<(i32, mpsc::Sender<Control>)> {
        lock(&self.partitions)
            .iter()
            .map(|(p, r)| (*p, r.controls.clone()))
            .collect()
    }

    /// Ask every partition; the first answer `found` accepts wins.
    async fn ask_each<T>(
        &self,
        ask: impl Fn(oneshot::Sender<T>) -> Control,
        found: impl Fn(&T) -> bool,
    ) -> Lookup<T> {
        for (partition, sender) in self.senders() {
            let (tx, rx) = oneshot::channel();
            if sender.send(ask(tx)).await.is_err() {
                continue;
            }
            if let Ok(Ok(answer)) = tokio::time::timeout(ANSWER_WITHIN, rx).await {
                if found(&answer) {
                    return Lookup::Here(partition, answer);
                }
            }
        }
        Lookup::NotHere(self.owned())
    }

    /// The status of `key`'s watch, live or ended.
    pub async fn status(&self, key: &[u8]) -> Lookup<WatchView> {
        let key = Bytes::copy_from_slice(key);
        match self
            .ask_each(
                |reply| Control::Status {
                    key: key.clone(),
                    reply,
                },
                Option::is_some,
            )
            .await
        {
            Lookup::Here(p, Some(mut status)) => {
                status.input = self.input_of(p, key).await;
                Lookup::Here(p, WatchView::Live(Box::new(status)))
            }
            _ => match self.ended(Some(key)).await.into_iter().next() {
                Some(ended) => Lookup::Here(ended.partition, WatchView::Ended(ended)),
                None => Lookup::NotHere(self.owned()),
            },
        }
    }

    /// The input record of `key`'s watch, from its partition's task.
    async fn input_of(&self, partition: i32, key: Bytes) -> Option<serde_json::Value> {
        let sender = lock(&self.partitions).get(&partition)?.inputs.clone();
        let (reply, answer) = oneshot::channel();
        sender.send(TaskQuery::Input { key, reply }).await.ok()?;
        tokio::time::timeout(ANSWER_WITHIN, answer)
            .await
            .ok()?
            .ok()?
    }

    /// The ended watches the partition tasks remember (`key`'s, or all), by partition.
    async fn ended(&self, key: Option<Bytes>) -> Vec<EndedWatch> {
        let senders: Vec<_> = lock(&self.partitions)
            .values()
            .map(|r| r.inputs.clone())
            .collect();
        let mut all = Vec::new();
        for sender in senders {
            let (reply, answer) = oneshot::channel();
            let ask = TaskQuery::Ended {
                key: key.clone(),
                reply,
            };
            if sender.send(ask).await.is_err() {
                continue;
            }
            if let Ok(Ok(mut ended)) = tokio::time::timeout(ANSWER_WITHIN, answer).await {
                ended.sort_by(|a, b| a.key.cmp(&b.key));
                all.extend(ended);
            }
        }
        all
    }

    /// Poll `key`'s watch now: the partition it is live in, and whether a poll was moved up
    /// (`false`: one runs already).
    pub async fn poll_now(&self, key: &[u8]) -> Lookup<bool> {
        let key = Bytes::copy_from_slice(key);
        match self
            .ask_each(
                |reply| Control::PollNow {
                    key: key.clone(),
                    reply,
                },
                Option::is_some,
            )
            .await
        {
            Lookup::Here(p, Some(moved)) => Lookup::Here(p, moved),
            Lookup::Here(_, None) => Lookup::NotHere(self.owned()),
            Lookup::NotHere(owned) => Lookup::NotHere(owned),
        }
    }

    /// End `key`'s watch as `stopped`: the partition it was live in.
    pub async fn stop(&self, key: &[u8]) -> Lookup<()> {
        let key = Bytes::copy_from_slice(key);
        match self
            .ask_each(
                |reply| Control::Stop {
                    key: key.clone(),
                    reply,
                },
                |stopped| *stopped,
            )
            .await
        {
            Lookup::Here(p, _) => Lookup::Here(p, ()),
            Lookup::NotHere(owned) => Lookup::NotHere(owned),
        }
    }

    /// The watches of `partition` (every partition: `None`) matching `query`, ordered by
    /// partition then key, paged; and how many match in all. Live ones, or with the state
    /// `finished` the ended ones remembered.
    pub async fn list(&self, partition: Option<i32>, query: &ListQuery) -> (usize, Vec<WatchView>) {
        let finished = query.state == Some(WatchState::Finished);
        let mut all = Vec::new();
        if finished {
            all.extend(
                self.ended(None)
                    .await
                    .into_iter()
                    .filter(|e| partition.is_none_or(|want| want == e.partition))
                    .map(WatchView::Ended),
            );
        }
        for (p, sender) in self.senders() {
            if finished || partition.is_some_and(|want| want != p) {
                continue;
            }
            let (_, live) = self.list_one(&sender, query).await;
            all.extend(live.into_iter().map(|w| WatchView::Live(Box::new(w))));
        }
        let total = all.len();
        let page = all
            .into_iter()
            .skip(query.offset)
            .take(query.limit)
            .collect();
        (total, page)
    }

    /// One partition's watches matching `query`, by key, and how many are live in all.
    async fn list_one(
        &self,
        sender: &mpsc::Sender<Control>,
        query: &ListQuery,
    ) -> (usize, Vec<WatchStatus>) {
        let (tx, rx) = oneshot::channel();
        let ask = Control::List {
            query: query.clone(),
            reply: tx,
        };
        if sender.send(ask).await.is_err() {
            return (0, Vec::new());
        }
        match tokio::time::timeout(ANSWER_WITHIN, rx).await {
            Ok(Ok((live, mut watches))) => {
                watches.sort_by(|a, b| a.key.cmp(&b.key));
                (live, watches)
            }
            _ => (0, Vec::new()),
        }
    }

    /// Every partition this instance owns, with its live watches and lowest hold.
    pub async fn partitions(&self) -> Vec<PartitionStatus> {
        let registered: Vec<_> = lock(&self.partitions)
            .values()
            .map(|r| (r.controls.clone(), r.status.clone()))
            .collect();
        let mut out = Vec::new();
        for (sender, status) in registered {
            let mut status = lock(&status).clone();
            // Only the watches at the lowest hold are described, not every live one.
            let holding = ListQuery {
                holds_watermark: true,
                limit: usize::MAX,
                ..ListQuery::default()
            };
            let (live, holding) = self.list_one(&sender, &holding).await;
            status.live_watches = live;
            status.lowest_hold = holding.into_iter().next();
            out.push(status);
        }
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors (`UtilsTest.testMurmur2`), as the Java client computes them.
    #[test]
    fn murmur2_is_kafkas() {
        let cases: [(&str, i32); 6] = [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            ("abc", 479470107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key.as_bytes()) as i32, want, "{key}");
        }
        let p = partition_of_key(b"user-1", 6);
        assert!(p["murmur2"].as_u64().unwrap() < 6 && p["crc32"].as_u64().unwrap() < 6);
        assert_eq!(partition_of_key(b"user-1", 0), serde_json::Value::Null);
    }
}

//! The observer of the versus benches: a consumer in the bench process that reads a job's
//! output topic (assigned, from the beginning, started before the job) and counts every
//! (watch, item) pair it reads, with no dedup before counting, checking that each carries its
//! item's time as its timestamp.

use super::end_offsets::HighWatermarks;
use memchr::memmem::Finder;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use watchbridge::kafka::records;

/// What the observer read of the output topic.
pub struct Observed {
    watches: usize,
    items: usize,
    /// `read[n * K + j]`: how often item `j` of watch `n` was read.
    pub read: Vec<u32>,
    pub distinct: usize,
    pub duplicates: usize,
    /// Outputs whose timestamp is not their item's time.
    pub wrong_time: usize,
    /// Records that are neither an expected output nor a watchbridge control record.
    pub unexpected: usize,
    pub first: Option<Instant>,
    /// When the last missing output was read.
    pub complete: Option<Instant>,
    /// Next offset to read, per partition.
    next_offset: Vec<i64>,
    /// Per partition, the offset of its first output read (none yet: `None`).
    pub first_offsets: Vec<Option<i64>>,
    /// Per partition, 1 + the offset of the last record there that was the first read of
    /// its output: the end offset at which every output read so far was on the topic.
    pub needed: Vec<i64>,
    /// Per output read for the first time, milliseconds from when watchbridge emitted it
    /// (its `watchbridge-first-seen` header) to when it was read here (empty for a job that
    /// writes no such header).
    pub latencies_ms: Vec<i64>,
}

impl Observed {
    pub fn new(watches: usize, items: usize, partitions: i32) -> Observed {
        Observed {
            watches,
            items,
            read: vec![0; watches * items],
            distinct: 0,
            duplicates: 0,
            wrong_time: 0,
            unexpected: 0,
            first: None,
            complete: None,
            next_offset: vec![0; partitions as usize],
            first_offsets: vec![None; partitions as usize],
            needed: vec![0; partitions as usize],
            latencies_ms: Vec::new(),
        }
    }

    /// Expected outputs never read.
    pub fn lost(&self) -> usize {
        self.read.len() - self.distinct
    }

    /// Counts one record of the output topic.
    pub fn record(&mut self, msg: &BorrowedMessage<'_>) {
        let p = msg.partition() as usize;
        self.next_offset[p] = self.next_offset[p].max(msg.offset() + 1);
        let control = msg
            .headers()
            .is_some_and(|h| h.iter().any(|h| h.key == records::CONTROL));
        if control {
            return; // watchbridge's in-band watermarks
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        // A partition is read in offset order: its first record read is its first.
        self.first_offsets[p].get_or_insert(msg.offset());
        let watch = msg
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| k.parse::<usize>().ok());
        let item: Option<(usize, i64)> = msg.payload().and_then(|v| {
            let j = field(v, &ID)?.strip_prefix("item-")?.parse().ok()?;
            Some((j, field(v, &TIME)?.parse().ok()?))
        });
        let (Some(n), Some((j, time))) = (watch, item) else {
            self.unexpected += 1;
            return;
        };
        if n >= self.watches || j >= self.items {
            self.unexpected += 1;
            return;
        }
        if msg.timestamp().to_millis() != Some(time) {
            self.wrong_time += 1;
        }
        let count = &mut self.read[n * self.items + j];
        *count += 1;
        if *count == 1 {
            self.distinct += 1;
            self.needed[p] = self.needed[p].max(msg.offset() + 1);
            let emitted = msg.headers().and_then(|h| {
                let v = h.iter().find(|h| h.key == records::FIRST_SEEN)?.value?;
                std::str::from_utf8(v).ok()?.parse::<i64>().ok()
            });
            if let Some(emitted) = emitted {
                self.latencies_ms.push(super::report::now_ms() - emitted);
            }
            if self.distinct == self.read.len() {
                self.complete = Some(now);
            }
        } else {
            self.duplicates += 1;
        }
    }

    /// Reads on to the high watermarks `topic` has now (at most `limit`): what a job wrote
    /// late counts too. (The high watermarks from a `Fetch`: Tansu's `ListOffsets` on memory
    /// storage stops short of the last batch, see [`super::end_offsets`].)
    pub fn read_to_end(
        &mut self,
        consumer: &BaseConsumer,
        bootstrap: &str,
        topic: &str,
        limit: Duration,
    ) {
        let partitions = self.next_offset.len() as i32;
        let ends = HighWatermarks::connect(bootstrap, topic, partitions).ask();
        let deadline = Instant::now() + limit;
        // Reached by the consumer's position, not by the records read: a `read_committed`
        // reader is never handed the markers that end a transaction's records (the last
        // offsets of an `exactly_once` topic), and counting records waited out `limit`
        // there; its position moves past them.
        let reached = || {
            let Ok(at) = consumer.position() else {
                return false;
            };
            (0..partitions).all(|p| {
                let end = ends[p as usize];
                end == 0
                    || at
                        .find_partition(topic, p)
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= end))
            })
        };
        while !reached() && Instant::now() < deadline {
            if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50)) {
                self.record(&msg);
            }
        }
    }
}

/// The text of the field whose quoted name `name` finds in a flat JSON object (a string's
/// without its quotes), found by scanning rather than parsing: at a few hundred thousand
/// outputs per second a full parse would make the observer the bottleneck, and on 2 cores
/// the observer shares the machine with the job it measures (a version that built its
/// search pattern per call took ~7% of the machine's samples during watchbridge's run).
/// Enough for the items served here, whose strings hold no quotes; a job may reorder the
/// fields or add spaces (Python's `json.dumps`).
fn field<'a>(value: &'a [u8], name: &Finder<'static>) -> Option<&'a str> {
    let at = name.find(value)? + name.needle().len();
    let after = value[at..]
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let text = match after.strip_prefix(b"\"") {
        Some(string) => &string[..memchr::memchr(b'"', string)?],
        None => &after[..memchr::memchr3(b',', b'}', b' ', after)?],
    };
    std::str::from_utf8(text).ok()
}

/// The fields the observer reads, quoted, their searches prepared once.
static ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"id\""));
static TIME: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"time\""));

/// A consumer assigned every partition of `topic` from the beginning, no group, connected
/// and fetching before it returns (for a topic a job has not written yet: what it reads
/// while it warms up is not counted).
pub fn observer(bootstrap: &str, topic: &str, partitions: i32) -> BaseConsumer {
    let consumer = reader(bootstrap, topic, partitions);
    // Connect and start fetching before the job starts.
    let warm = Instant::now() + Duration::from_millis(500);
    while Instant::now() < warm {
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(50)) {
            panic!("observer of {topic}: {e}");
        }
    }
    consumer
}

/// A consumer assigned every partition of `topic` from the beginning, no group.
pub fn reader(bootstrap: &str, topic: &str, partitions: i32) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-observer"))
        .set("enable.auto.commit", "false")
        // Read outputs as they come rather than in large, late batches.
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("create the observer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).expect("assign the observer");
    consumer
}

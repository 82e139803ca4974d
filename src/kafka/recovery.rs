//! Recovery of one input partition when it is assigned, before it polls or reads an input:
//!
//! 1. read its state partition to the end, keeping the latest value per key (what
//!    compaction would keep), and decode it: live watches with their seen chunks, finished
//!    watches, and the output offsets of the last checkpoint;
//! 2. read the output partitions this partition's task writes to from those offsets to their
//!    end (outputs placed by input partition: its namesake alone; placed by key: every one),
//!    and take the outputs whose `wb-id` header names this partition (or, written before that
//!    header, `watchbridge-input-partition`): outputs acknowledged (or written without an
//!    acknowledgement) after the last checkpoint;
//! 3. rebuild each live watch (seen set = its chunks plus what step 2 found; input resolved
//!    again from the saved input record) as a [`RestoreWatch`] for the engine, and the
//!    partition's [`DurableState`].
//!
//! Steps 1 and 2 are blocking: the offsets are looked up on the instance's [`Lookups`]
//! client, the records read on a consumer of the restore's own (assigned, never in the
//! group: nothing is committed); the partition task runs them on a blocking thread.
//! A partition none of whose replicas can serve it (offline, its leader away, a timeout)
//! fails the read with [`Unreadable`], which names it: the task tries again and reports the
//! wait (`partition/state.rs`). Only what the partition needs is asked, so one offline
//! partition holds back the recoveries that read it, not every recovery of the group.

use super::clients::{Isolation, KafkaSettings};
use super::durable::DurableState;
use super::health::KafkaContext;
use super::list_offsets::{list_offsets, Listed};
use super::records::{
    parse_recovery_id, CONTROL, INPUT_PARTITION, ITEM_VERSION, OUTPUT_KEY, RECOVERY_ID,
};
use crate::clock::Millis;
use crate::engine::RestoreWatch;
use crate::pollers::{OutputKeyReader, ReadOutputKey, Resolve};
use crate::reason::TerminatedReason;
use crate::seen::{hash_identity, OutputHash, SeenSet};
use crate::state::{
    decode_entry, DecodeError, Entry, NewerRecord, OutputOffsets, Part, SeenChunk, SeenJournal,
    WatchRecord, DEFAULT_CHUNK_HASHES,
};
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long reading one partition to its end may take before the recovery gives up (and
/// the task tries again).
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a lookup of offsets may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Where to read from.
#[derive(Clone)]
pub struct RecoverySource {
    /// Each restore's reader's settings ([`KafkaSettings::recovery_reader`], read
    /// committed).
    pub consumer_config: ClientConfig,
    /// The readers' context (their errors and log lines go to the bridge's broker health).
    pub kafka: KafkaContext,
    pub input_topic: Arc<str>,
    /// The bridge's consumer group: the recovery asks for its committed input offset (it
    /// never joins the group).
    pub group_id: String,
    pub watermark_topic: Arc<str>,
    pub state_topic: Arc<str>,
    pub output_topic: Arc<str>,
    pub output_partitions: i32,
    /// Outputs are placed by input partition (`records::OutputLayout`): input partition p's
    /// task writes to output partition p alone, so its recovery reads that one only.
    pub outputs_by_input_partition: bool,
    /// Whether to read the output topic back from the last checkpoint's offsets (not with
    /// `WATCHBRIDGE_GUARANTEE=at_least_once`: outputs written after it may come again).
    pub read_outputs: bool,
    /// Whether the partition settles the output partitions it reads back first
    /// (`partition/settle.rs`): without transactions, on a cluster of several brokers.
    pub settle_outputs: bool,
    /// Reads the identity of an output without `wb-id` from its value (the poller's, where
    /// it can and the values are its items as it gave them).
    pub output_keys: Option<OutputKeyReader>,
    /// The client the restores look their offsets up with (shared by every partition's).
    pub lookups: Lookups,
}

/// What the state and output topics say about one input partition.
#[derive(Debug, Default)]
pub struct Found {
    /// Live watch records and the seen chunks under their keys.
    pub live: Vec<(WatchRecord, Vec<SeenChunk>)>,
    /// Finished watch records (their retention has not been checked) and the seen chunks
    /// under their keys (a failed watch keeps its chunks; any other's are left by a crash
    /// before their deletion).
    pub finished: Vec<(WatchRecord, Vec<SeenChunk>)>,
    /// The last checkpoint's output offsets, if the partition ever had one.
    pub offsets: Option<OutputOffsets>,
    /// Outputs found by the read-back, by watch key.
    pub outputs: HashMap<Bytes, Vec<OutputHash>>,
    /// Per output partition: where the read-back stopped (its end offset then).
    pub read_to: Vec<i64>,
    pub state_records: u64,
    pub outputs_read: u64,
    /// Outputs without `wb-id` in this partition's namesake whose identity could not be
    /// read from their value (their watches may emit them again).
    pub unidentified: u64,
    /// State records that did not decode (logged; left in place).
    pub undecodable: u64,
    /// State records written by a newer format version (latest of their keys): the
    /// partition must not start (`state::versions`). The read stops after the state topic
    /// then, and nothing else in this is complete.
    pub newer: Vec<NewerRecord>,
    /// Keys of seen chunks with no live watch record (left by a crash while a watch was
    /// being deleted, or before its first record): to delete.
    pub orphans: Vec<Vec<u8>>,
    /// Live watches whose latest record is in a starts record → that record's number.
    pub members: HashMap<Bytes, u32>,
    /// Starts records on the topic, and the highest number of any starts key (deleted or
    /// not): the partition numbers its next ones above it.
    pub starts: Vec<u32>,
    pub last_starts: u32,
    /// The input partition's end offset when the recovery read it, if inputs after the
    /// group's committed offset were left to read again (`None`: every input was
    /// committed, so no input comes again).
    pub input_end: Option<i64>,
    /// The watermark topic's end offset then, its high watermark: the partition's last
    /// published watermark is below it (the task waits until the watermark reader has read
    /// that far; [`Lookups::watermark_end`]). `None` with `watermark_unread`: it could not
    /// be looked up (the task asks again).
    pub watermark_end: Option<i64>,
    pub watermark_unread: Option<Unreadable>,
    /// The guarantee of the partition's last writer (its `~mode` record), if it wrote one.
    pub mode: Option<String>,
}

/// A recovery read that failed: the partitions it could not read (`topic/partition`: those
/// the answer or the cluster's metadata name, else every one asked) and why. The partition
/// task reports them as what its recovery waits for (log, metric, `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub partitions: Vec<(String, i32)>,
    pub error: String,
}

impl Unreadable {
    fn new(partitions: Vec<(String, i32)>, error: impl Into<String>) -> Self {
        Self {
            partitions,
            error: error.into(),
        }
    }

    /// Not a partition's fault (no client could be made): nothing named.
    fn client(error: String) -> Self {
        Self::new(Vec::new(), error)
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (topic, partition)) in self.partitions.iter().enumerate() {
            write!(f, "{}{topic}/{partition}", if i == 0 { "" } else { ", " })?;
        }
        match self.partitions.is_empty() {
            true => write!(f, "{}", self.error),
            false => write!(f, " ({})", self.error),
        }
    }
}

/// A partition as [`Unreadable`] names it.
fn named(topic: &str, partition: i32) -> (String, i32) {
    (topic.to_string(), partition)
}

/// After a failed read: the metadata of the topics of the partitions it names asked again.
/// librdkafka answers a lookup of a partition it last saw without a leader from that
/// metadata (`LeaderNotAvailable`, at once) until its periodic refresh
/// (`topic.metadata.refresh.interval.ms`, 5 min by default): without this, a partition back
/// online stayed unreadable to the lookup client for minutes.
fn refresh_metadata(client: &BaseConsumer<KafkaContext>, failed: &Unreadable) {
    let mut topics: Vec<&str> = failed.partitions.iter().map(|(t, _)| t.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    for topic in topics {
        let _ = client.fetch_metadata(Some(topic), Duration::from_secs(5));
    }
}

/// The client every restore of the instance looks its offsets up with (end offsets, the
/// group's committed offset), made as the bridge starts, before it even reaches the
/// brokers: by the time a partition is assigned its connections are up, and a lookup takes
/// a round trip (~0.3 ms on Tansu). A fresh client per restore first connected, twice
/// (librdkafka drops the bootstrap connection once it knows the broker by id), and read the
/// metadata: ~15–20 ms of each restore of an empty partition, on the way to the bridge's
/// first poll. A consumer of the restore's own is made only for a partition with records
/// to read.
#[derive(Clone)]
pub struct Lookups {
    committed: Arc<LookupClient>,
    /// `read_uncommitted`, for [`Lookups::watermark_end`] alone.
    uncommitted: Arc<LookupClient>,
}

/// The client itself: made on a thread of its own (librdkafka takes ~1 ms to make a client,
/// not on the way to the start's first request), or by the first restore that needs it
/// first; closed on a thread of its own when the last restore source goes (closing a
/// consumer takes librdkafka some 0.1 s).
struct LookupClient {
    made: OnceLock<Result<BaseConsumer<KafkaContext>, String>>,
    /// Its `isolation.level` says which end offsets it looks up: the last stable ones with
    /// `read_committed`, the high watermarks with `read_uncommitted`.
    consumer_config: ClientConfig,
    kafka: KafkaContext,
}

impl LookupClient {
    fn get(&self) -> Result<&BaseConsumer<KafkaContext>, String> {
        self.made
            .get_or_init(|| reader(&self.consumer_config, &self.kafka, "lookup"))
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl Drop for LookupClient {
    fn drop(&mut self) {
        if let Some(Ok(client)) = self.made.take() {
            crate::kafka::drop_later::drop_later(client);
        }
    }
}

impl Lookups {
    /// Start making and connecting the client (a thread makes it and asks for the input
    /// topic's metadata; an error there is left to the restores, which retry).
    pub fn start(clients: &KafkaSettings, kafka: &KafkaContext, input_topic: &str) -> Self {
        let client = |isolation| {
            Arc::new(LookupClient {
                made: OnceLock::new(),
                consumer_config: clients.recovery_reader(isolation),
                kafka: kafka.clone(),
            })
        };
        let lookups = Self {
            committed: client(Isolation::ReadCommitted),
            uncommitted: client(Isolation::ReadUncommitted),
        };
        let (warming, topic) = (lookups.clone(), input_topic.to_string());
        std::thread::spawn(move || {
            for client in [&warming.committed, &warming.uncommitted] {
                if let Ok(client) = client.get() {
                    let _ = client.fetch_metadata(Some(&topic), Duration::from_secs(10));
                }
            }
        });
        lookups
    }

    /// The end of the watermark topic (its one partition) as its high watermark: the offset
    /// after its last record, committed or not. A `read_committed` lookup answers the last
    /// stable offset instead, which a transaction another partition's owner has open on
    /// the topic holds back, with a previous owner's last committed value behind it: a
    /// reader that waited only for that end went on without that value, and published
    /// lower. A `read_committed` reader passes the high watermark once every transaction
    /// open across it has ended (committed or aborted), having read everything committed
    /// below it.
    pub fn watermark_end(&self, topic: &str) -> Result<i64, Unreadable> {
        let client = self.uncommitted.get().map_err(Unreadable::client)?;
        let asked = [(topic, 0)];
        let end = list_offsets(client, &asked, Offset::End, LOOKUP_TIMEOUT)
            .map_err(|e| {
                let error = format!("cannot read the end of the watermark topic: {e}");
                unreadable(client, &asked, error)
            })
            .and_then(|listed| {
                listed
                    .offset(topic, 0)
                    .map_err(|e| Unreadable::new(vec![named(topic, 0)], e))
            });
        end.inspect_err(|e| refresh_metadata(client, e))
    }
}

/// A consumer for the recovery, from `consumer_config` ([`KafkaSettings::recovery_reader`]):
/// assigned, never subscribed (it does not join the group and commits nothing).
fn reader(
    consumer_config: &ClientConfig,
    kafka: &KafkaContext,
    what: &str,
) -> Result<BaseConsumer<KafkaContext>, String> {
    consumer_config
        .create_with_context(kafka.clone())
        .map_err(|e| format!("cannot create the recovery's {what} consumer: {e}"))
}

/// The output partitions input partition `partition`'s task can have written outputs to,
/// which its recovery reads back: its namesake alone where outputs are placed by input
/// partition, every one of the output topic's `output_partitions` where they are placed by
/// key, none where nothing is read back (`at_least_once`). A partition outside these is
/// never asked, so an offline one holds back only the recoveries that need it.
pub fn outputs_read_back(source: &RecoverySource, partition: i32) -> Vec<i32> {
    match (source.read_outputs, source.outputs_by_input_partition) {
        (false, _) => Vec::new(),
        (true, true) => vec![partition],
        (true, false) => (0..source.output_partitions).collect(),
    }
}

/// Steps 1 and 2, blocking.
pub fn read(source: &RecoverySource, partition: i32) -> Result<Found, Unreadable> {
    let lookups = source.lookups.committed.get().map_err(Unreadable::client)?;
    read_with(source, lookups, partition).inspect_err(|e| refresh_metadata(lookups, e))
}

/// [`read`], its offsets looked up on `lookups`.
fn read_with(
    source: &RecoverySource,
    lookups: &BaseConsumer<KafkaContext>,
    partition: i32,
) -> Result<Found, Unreadable> {
    // Every offset at once, in four requests (`list_offsets`): the latest offsets of the
    // input, state and output partitions in one `ListOffsets`, the first offsets of the
    // state and output partitions in another, the group's commit, and the watermark topic's
    // end (on a client of its own: `Lookups::watermark_end`). One lookup per offset (two
    // `ListOffsets` each), ~15 of them per restore on one connection that Tansu answers in
    // order, took 5–15 ms at a start.
    let outputs = outputs_read_back(source, partition);
    let (ends, firsts, committed, watermark_end) = std::thread::scope(|s| {
        let committed = s.spawn(|| committed_offset(lookups, &source.input_topic, partition));
        let firsts =
            s.spawn(|| ask_offsets(source, lookups, partition, &outputs, Offset::Beginning));
        let watermark_end = s.spawn(|| source.lookups.watermark_end(&source.watermark_topic));
        let ends = ask_offsets(source, lookups, partition, &outputs, Offset::End);
        (
            ends,
            joined(firsts),
            joined(committed),
            joined(watermark_end),
        )
    });
    let (ends, firsts) = (ends?, firsts?);
    let range = |topic: &str, p: i32| -> Result<(i64, i64), Unreadable> {
        let offset = |listed: &Listed| {
            listed
                .offset(topic, p)
                .map_err(|e| Unreadable::new(vec![named(topic, p)], e))
        };
        Ok((offset(&firsts)?, offset(&ends)?))
    };
    let state_range = range(&source.state_topic, partition)?;
    let output_ranges = outputs
        .iter()
        .map(|&q| Ok((q, range(&source.output_topic, q)?)))
        .collect::<Result<Vec<_>, Unreadable>>()?;
    // The input's end unless the group has committed up to it.
    let input_end = ends
        .offset(&source.input_topic, partition)
        .ok()
        .filter(|&end| committed.is_none_or(|c| c < end));
    let (watermark_end, watermark_unread) = match watermark_end {
        Ok(end) => (Some(end), None),
        Err(e) => (None, Some(e)),
    };
    let mut found = Found {
        input_end,
        watermark_end,
        watermark_unread,
        ..Found::default()
    };

    // 1. The state partition: the latest value per key, and where it is (a starts record
    // holds the first records of many watches; whichever of a watch's own record and the
    // starts records listing it is later on the partition is its latest).
    let mut latest: HashMap<Vec<u8>, (i64, Option<Vec<u8>>)> = HashMap::new();
    let mut reader = Reader::new(&source.consumer_config, &source.kafka);
    read_to_end(
        &mut reader,
        &source.state_topic,
        partition,
        state_range.0,
        state_range.1,
        |m| {
            found.state_records += 1;
            if let Some(key) = m.key().filter(|k| *k != super::guarantee::PROBE_KEY) {
                latest.insert(key.to_vec(), (m.offset(), m.payload().map(<[u8]>::to_vec)));
            }
        },
    )?;
    fold_state(latest, &mut found, partition);
    if !found.newer.is_empty() {
        // The partition stops (`state::versions`): nothing more to read.
        return Ok(found);
    }
    // 2. The output topic from the checkpoint's offsets (from the start without one).
    let offsets: HashMap<i32, i64> = found
        .offsets
        .as_ref()
        .map(|o| o.offsets.iter().copied().collect())
        .unwrap_or_default();
    found.read_to = read_to(source.output_partitions, &output_ranges, &offsets);
    if output_ranges.is_empty() {
        return Ok(found);
    }
    let wanted = partition.to_string();
    let ranges: Vec<(i32, i64, i64)> = output_ranges
        .iter()
        .map(|&(q, (low, end))| (q, offsets.get(&q).map_or(low, |&o| o.max(low)), end))
        .collect();
    // Every output partition at once: one after the other, each waited at least a
    // fetch of its own (Tansu holds every fetch for `fetch.wait.max.ms`), seconds for
    // a restore of 32 output partitions that sibling partitions had begun writing to.
    read_to_ends(&mut reader, &source.output_topic, &ranges, |m| {
        found.outputs_read += 1;
        let Some(watch) = m.key() else { return };
        // Outputs without `wb-id` are this partition's where they are in its namesake.
        let keys = source
            .output_keys
            .as_deref()
            .filter(|_| m.partition() == partition);
        let headers = m.headers();
        let header = |name: &str| {
            let h = headers?;
            h.iter().find(|h| h.key == name).and_then(|h| h.value)
        };
        match output_of(header, m.payload(), partition, &wanted, keys) {
            Identified::Mine(hash) => found
                .outputs
                .entry(Bytes::copy_from_slice(watch))
                .or_default()
                .push(hash),
            Identified::Unreadable => found.unidentified += 1,
            Identified::NotMine => {}
        }
    })?;
    Ok(found)
}

/// Per output partition, where the offsets record may say the read-back stopped: the end
/// read to for each partition in `read` (`(partition, (first, end))`), and for the others
/// (never written by this partition's task) what the last checkpoint said, or 0 without one.
/// The bridge's reads of the output topic's ends raise them later (`DurableState::output_ends`).
fn read_to(
    partitions: i32,
    read: &[(i32, (i64, i64))],
    checkpoint: &HashMap<i32, i64>,
) -> Vec<i64> {
    (0..partitions)
        .map(|q| match read.iter().find(|(p, _)| *p == q) {
            Some(&(_, (_, end))) => end,
            None => checkpoint.get(&q).copied().unwrap_or(0),
        })
        .collect()
}

/// The restore's own consumer for its reads, made once a read has records to read.
pub(super) struct Reader<'a> {
    consumer_config: &'a ClientConfig,
    kafka: &'a KafkaContext,
    consumer: Option<BaseConsumer<KafkaContext>>,
    /// How long one read may take ([`READ_TIMEOUT`] unless told).
    pub(super) timeout: Duration,
}

impl<'a> Reader<'a> {
    /// A reader with `consumer_config` ([`KafkaSettings::recovery_reader`], read committed),
    /// of the group's (it never joins it: [`reader`]).
    pub(super) fn new(consumer_config: &'a ClientConfig, kafka: &'a KafkaContext) -> Self {
        Self {
            consumer_config,
            kafka,
            consumer: None,
            timeout: READ_TIMEOUT,
        }
    }

    pub(super) fn consumer(&mut self) -> Result<&BaseConsumer<KafkaContext>, String> {
        if self.consumer.is_none() {
            self.consumer = Some(reader(self.consumer_config, self.kafka, "reading")?);
        }
        Ok(self.consumer.as_ref().expect("made above"))
    }
}

impl Drop for Reader<'_> {
    /// Closing a consumer takes librdkafka some 0.1 s: not on the way to the partition's
    /// first poll.
    fn drop(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            crate::kafka::drop_later::drop_later(consumer);
        }
    }
}

/// The state partition's latest record per key (with its offset) as watches: live ones with
/// their chunks (and the starts record each relies on), finished ones, the output offsets,
/// the starts records, and orphan chunks.
fn fold_state(latest: HashMap<Vec<u8>, (i64, Option<Vec<u8>>)>, found: &mut Found, partition: i32) {
    let mut chunks: HashMap<Bytes, Vec<SeenChunk>> = HashMap::new();
    // Watch key → its latest record (`None`: deleted), where, and the starts record it is in.
    let mut watches: HashMap<Bytes, (i64, Option<WatchRecord>, u32)> = HashMap::new();
    let mut later = |key: Bytes, offset: i64, record: Option<WatchRecord>, seq: u32| {
        let entry = watches.entry(key).or_insert((i64::MIN, None, 0));
        if offset > entry.0 {
            *entry = (offset, record, seq);
        }
    };
    for (key, (offset, value)) in latest {
        match decode_entry(&key, value.as_deref()) {
            Ok(Entry::Watch(w)) => later(w.watch_key.clone(), offset, Some(w), 0),
            Ok(Entry::Tombstone {
                watch_key,
                part: Part::Watch,
            }) => later(watch_key, offset, None, 0),
            Ok(Entry::Tombstone { .. }) => {}
            Ok(Entry::Seen { watch_key, chunk }) => {
                chunks.entry(watch_key).or_default().push(chunk)
            }
            Ok(Entry::OutputOffsets(o)) => found.offsets = Some(o),
            Ok(Entry::Starts(starts)) => {
                found.starts.push(starts.seq);
                found.last_starts = found.last_starts.max(starts.seq);
                for w in starts.watches {
                    later(w.watch_key.clone(), offset, Some(w), starts.seq);
                }
            }
            Ok(Entry::StartsDeleted { seq }) => found.last_starts = found.last_starts.max(seq),
            Ok(Entry::Mode(mode)) => found.mode = mode.map(|m| m.mode),
            // Logged by the partition, with what it does about it.
            Err(DecodeError::NewerVersion { found: version }) => found.newer.push(NewerRecord {
                key,
                offset,
                version,
            }),
            Err(e) => {
                found.undecodable += 1;
                tracing::error!(
                    partition,
                    key = %String::from_utf8_lossy(&key),
                    error = %e,
                    "a state record cannot be read; it is skipped"
                );
            }
        }
    }
    for (key, (_, record, seq)) in watches {
        match record {
            Some(w) if w.finished.is_some() => found.finished.push((w, Vec::new())),
            Some(w) => {
                if seq != 0 {
                    found.members.insert(key, seq);
                }
                found.live.push((w, Vec::new()));
            }
            None => {}
        }
    }
    for (record, mine) in found.live.iter_mut().chain(found.finished.iter_mut()) {
        *mine = chunks.remove(&record.watch_key).unwrap_or_default();
    }
    for (watch_key, orphans) in chunks {
        found.orphans.extend(
            orphans
                .iter()
                .map(|c| crate::state::state_key(&watch_key, Part::Seen(c.index()))),
        );
    }
}

/// What an output read back is to the recovery of one input partition.
#[derive(Debug, PartialEq, Eq)]
enum Identified {
    /// A watch of this partition wrote it; its identity hashes to this.
    Mine(OutputHash),
    /// Another partition's, or no output (a watermark record).
    NotMine,
    /// This partition's by where it is, but its identity could not be read from its value.
    Unreadable,
}

/// Whose an output read back is, and its identity: from its `wb-id` header; or (an output
/// written before that header existed, or with `WATCHBRIDGE_OUTPUT_HEADERS` asking for
/// them) from `watchbridge-input-partition`, which is `wanted`, and
/// `watchbridge-output-key`; or, with neither, read from its value by `keys`, given only
/// where the output sits in this partition's namesake (outputs go there without a header
/// where the topics have as many partitions: `records::OutputLayout`).
fn output_of<'a>(
    header: impl Fn(&str) -> Option<&'a [u8]>,
    value: Option<&[u8]>,
    partition: i32,
    wanted: &str,
    keys: Option<&ReadOutputKey>,
) -> Identified {
    let mine = |hash: Option<OutputHash>| hash.map_or(Identified::NotMine, Identified::Mine);
    if let Some(id) = header(RECOVERY_ID) {
        return mine(
            parse_recovery_id(id)
                .filter(|(_, p)| *p == partition)
                .map(|(hash, _)| hash),
        );
    }
    let version = header(ITEM_VERSION);
    if let Some(p) = header(INPUT_PARTITION) {
        return mine(
            header(OUTPUT_KEY)
                .filter(|_| p == wanted.as_bytes())
                .map(|key| hash_identity(key, version)),
        );
    }
    if header(CONTROL).is_some() {
        return Identified::NotMine;
    }
    match keys {
        None => Identified::NotMine,
        Some(read) => match value.and_then(read) {
            Some(key) => Identified::Mine(hash_identity(&key, version)),
            None => Identified::Unreadable,
        },
    }
}

/// What a lookup thread returned (its panic goes on in the caller).
fn joined<T>(lookup: std::thread::ScopedJoinHandle<'_, T>) -> T {
    lookup
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Every partition a restore reads or checks, asked at `at` in one request: the state
/// partition and the `outputs` partitions of the output topic, and with `Offset::End` the
/// input partition.
fn ask_offsets(
    source: &RecoverySource,
    client: &BaseConsumer<KafkaContext>,
    partition: i32,
    outputs: &[i32],
    at: Offset,
) -> Result<Listed, Unreadable> {
    let mut asked: Vec<(&str, i32)> = vec![(&source.state_topic, partition)];
    asked.extend(outputs.iter().map(|&q| (&*source.output_topic, q)));
    if at == Offset::End {
        asked.push((&source.input_topic, partition));
    }
    list_offsets(client, &asked, at, LOOKUP_TIMEOUT).map_err(|e| {
        let error = format!("cannot read the offsets of the state and output topics: {e}");
        unreadable(client, &asked, error)
    })
}

/// A lookup of `asked` that failed as a whole (a timeout: librdkafka waits for leaders that
/// do not come): the partitions among them that the cluster's metadata shows without a
/// leader, or with an error, are what it waits for; if metadata names none, all of them.
fn unreadable(
    client: &BaseConsumer<KafkaContext>,
    asked: &[(&str, i32)],
    error: String,
) -> Unreadable {
    let mut leaderless = Vec::new();
    let mut topics: Vec<&str> = asked.iter().map(|&(t, _)| t).collect();
    topics.dedup();
    for topic in topics {
        let Ok(metadata) = client.fetch_metadata(Some(topic), Duration::from_secs(5)) else {
            continue;
        };
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            continue;
        };
        leaderless.extend(
            t.partitions()
                .iter()
                .filter(|p| p.leader() < 0 || p.error().is_some())
                .filter(|p| asked.contains(&(topic, p.id())))
                .map(|p| named(topic, p.id())),
        );
    }
    if leaderless.is_empty() {
        leaderless = asked.iter().map(|&(t, p)| named(t, p)).collect();
    }
    Unreadable::new(leaderless, error)
}

/// The group's committed offset of the input partition (`None`: none, or not read).
fn committed_offset(
    client: &BaseConsumer<KafkaContext>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = client
        .committed_offsets(tpl, Duration::from_secs(15))
        .ok()?;
    match committed.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Records read between two reads of the clock while a recovery reads a topic.
const CLOCK_EVERY: u32 = 256;

/// Read `topic`/`partition` from `start` up to `end` (its end offset when the recovery
/// began).
fn read_to_end(
    reader: &mut Reader<'_>,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    each: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), Unreadable> {
    read_to_ends(reader, topic, &[(partition, start, end)], each)
}

/// Read every `(partition, start, end)` of `topic` from `start` up to `end` (its end offset
/// when the recovery began), all at once, within the reader's timeout; what a partition
/// gets past its `end` meanwhile is not read.
pub(super) fn read_to_ends(
    reader: &mut Reader<'_>,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    mut each: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), Unreadable> {
    // Partition → its end, while it has records left to read.
    let mut left: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for &(partition, start, end) in ranges.iter().filter(|(_, start, end)| start < end) {
        left.insert(partition, end);
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(|e| Unreadable::new(vec![named(topic, partition)], e.to_string()))?;
    }
    if left.is_empty() {
        return Ok(());
    }
    let all_left = |left: &HashMap<i32, i64>| {
        let mut parts: Vec<i32> = left.keys().copied().collect();
        parts.sort_unstable();
        parts
            .into_iter()
            .map(|p| named(topic, p))
            .collect::<Vec<_>>()
    };
    let timeout = reader.timeout;
    let consumer = reader.consumer().map_err(Unreadable::client)?;
    consumer
        .assign(&tpl)
        .map_err(|e| Unreadable::new(all_left(&left), format!("cannot read {topic}: {e}")))?;
    let deadline = Instant::now() + timeout;
    // The clock is read every so many records, not each one: a restore reads millions, and
    // a read of the clock cost as much as a tenth of the read.
    let mut polls = 0u32;
    while !left.is_empty() {
        let clock_read = polls.is_multiple_of(CLOCK_EVERY);
        polls = polls.wrapping_add(1);
        if clock_read && Instant::now() > deadline {
            let mut ends: Vec<(i32, i64)> = left.iter().map(|(&p, &end)| (p, end)).collect();
            ends.sort_unstable();
            let ends: Vec<String> = ends
                .iter()
                .map(|(p, end)| format!("{topic}/{p} to offset {end}"))
                .collect();
            return Err(Unreadable::new(
                all_left(&left),
                format!("reading {} took longer than {timeout:?}", ends.join(", ")),
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            // Nothing came: the clock is read before the next wait.
            None => polls = 0,
            // The end as it is now. (An end reported for a partition read before, of
            // another topic, may still be queued: the position tells.)
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                let Some(&end) = left.get(&partition) else {
                    continue;
                };
                let position = consumer.position().ok().and_then(|p| {
                    match p.find_partition(topic, partition)?.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    }
                });
                if position.is_some_and(|p| p >= end) {
                    left.remove(&partition);
                }
            }
            Some(Err(e)) => tracing::debug!(topic, error = %e, "recovery read"),
            Some(Ok(m)) => {
                let Some(&end) = left.get(&m.partition()) else {
                    continue;
                };
                if m.topic() != topic || m.offset() >= end {
                    continue;
                }
                each(&m);
                if m.offset() + 1 >= end {
                    left.remove(&m.partition());
                }
            }
        }
    }
    consumer
        .unassign()
        .map_err(|e| Unreadable::client(format!("cannot stop reading {topic}: {e}")))
}

/// What the task starts from: the engine's restores and the partition's durable state.
pub struct Plan<I> {
    pub restores: Vec<RestoreWatch<I>>,
    pub state: DurableState,
    /// Whether the partition has no output offsets on the topic yet (the task writes them
    /// before anything else).
    pub first_time: bool,
    /// State records to delete now: chunks of finished (not failed) or missing watches,
    /// finished and failed records past the retention, with a failed one's chunks.
    pub tombstones: Vec<Vec<u8>>,
}

/// Step 3: rebuild the watches of `partition` from what was found at `now`.
pub fn plan<P: Resolve>(
    found: Found,
    poller: &P,
    state_topic: Arc<str>,
    partition: i32,
    retention_ms: Millis,
    now: Millis,
) -> Plan<P::Input> {
    let Found {
        live,
        finished,
        offsets,
        mut outputs,
        read_to,
        orphans,
        members,
        starts,
        last_starts,
        ..
    } = found;
    let first_time = offsets.is_none();
    let written: Vec<i64> = match &offsets {
        Some(o) => {
            let by_partition: HashMap<i32, i64> = o.offsets.iter().copied().collect();
            (0..read_to.len() as i32)
                .map(|q| by_partition.get(&q).copied().unwrap_or(0))
                .collect()
        }
        // Never saved: the read-back's end, unless it found outputs of this partition
        // (a first run that was given up). Those are in no chunk until their inputs start
        // their watches again, so the offsets stay before them (the start) till then.
        None if outputs.is_empty() => read_to.clone(),
        None => vec![0; read_to.len()],
    };
    let mut state = DurableState::new(state_topic, partition, retention_ms, written, read_to);
    state.starts_on_topic(&starts, last_starts);
    // Counted whether or not the watch is restored below (one whose input no longer
    // resolves keeps its record, in the starts record).
    for &seq in members.values() {
        state.relies_on(seq);
    }
    let mut tombstones = orphans;
    tombstones.extend(state.unrelied_starts());
    for (record, chunks) in finished {
        let key = record.watch_key.clone();
        let at = record.finished.as_ref().map_or(now, |f| f.at);
        let failed = record
            .finished
            .as_ref()
            .is_some_and(|f| f.reason == TerminatedReason::Failed.as_str());
        let found_outputs = outputs.remove(&key).unwrap_or_default();
        // Chunks 0..count are on the topic: those listed and those found.
        let count = chunks
            .iter()
            .map(|c| c.index() + 1)
            .max()
            .unwrap_or(0)
            .max(record.seen_chunks);
        // While a starts record is on the topic (it may hold this watch's first record),
        // the record waits: the checkpoints delete it once none is left.
        let expired = now.saturating_sub(at) >= retention_ms && starts.is_empty();
        if expired {
            tombstones.push(crate::state::state_key(&key, Part::Watch));
        }
        if expired || !failed {
            // A finished watch keeps no chunks (these were left by a crash before their
            // deletion), a failed one only for the retention.
            tombstones.extend(
                chunks
                    .iter()
                    .map(|c| crate::state::state_key(&key, Part::Seen(c.index()))),
            );
            if !expired {
                let reason = record.finished.as_ref().map_or("", |f| f.reason.as_str());
                state.finished_on_topic(key, at, reason);
            }
            continue;
        }
        // A failed watch: its input, delivered again, starts it again knowing these.
        let seen = SeenSet::from_hashes(
            chunks
                .into_iter()
                .flat_map(SeenChunk::into_hashes)
                .chain(found_outputs),
        );
        state.failed_on_topic(key, at, count, seen);
    }
    let mut restores = Vec::new();
    for (record, chunks) in live {
        let key = record.watch_key.clone();
        let listed = record.seen_chunks;
        let (mut seen, mut journal) =
            match SeenJournal::restore_or_return(chunks, listed, DEFAULT_CHUNK_HASHES) {
                Ok(restored) => restored,
                Err((e, chunks)) => {
                    // Keep every hash found: the chunks are rewritten at the next checkpoint.
                    tracing::error!(partition, key = %String::from_utf8_lossy(&key), error = %e,
                        "a watch's seen chunks are inconsistent; restoring the hashes found");
                    let chunk_count = chunks.len() as u32;
                    let mut journal = SeenJournal::new();
                    let hashes: Vec<OutputHash> = chunks
                        .into_iter()
                        .flat_map(SeenChunk::into_hashes)
                        .collect();
                    for &h in &hashes {
                        journal.add(h);
                    }
                    for n in 0..chunk_count.max(listed) {
                        tombstones.push(crate::state::state_key(&key, Part::Seen(n)));
                    }
                    (SeenSet::from_hashes(hashes), journal)
                }
            };
        // (Most restores find no outputs past the checkpoint: no key hashed then.)
        if !outputs.is_empty() {
            for h in outputs.remove(&key).unwrap_or_default() {
                if seen.insert(h) {
                    journal.add(h);
                }
            }
        }
        let input = match serde_json::from_slice(&record.input_value)
            .map_err(|e| e.to_string())
            .and_then(|value| poller.resolve(&value, &key).map_err(|e| e.to_string()))
        {
            Ok(input) => input,
            Err(e) => {
                tracing::error!(partition, key = %String::from_utf8_lossy(&key), error = %e,
                    "a saved watch's input no longer resolves (was the poller changed?); it is not restored");
                continue;
            }
        };
        if let Some(resume) = &record.resume {
            poller.resume(&input, resume);
        }
        state.restored(
            key.clone(),
            &record,
            journal,
            members.get(&key).copied().unwrap_or(0),
        );
        restores.push(RestoreWatch {
            key,
            input: Arc::new(input),
            progress: record.progress(),
            conditions: record.conditions.clone(),
            seen,
            next_poll: record.next_poll,
        });
    }
    for (key, hashes) in outputs {
        state.preseen(key, hashes);
    }
    Plan {
        restores,
        state,
        first_time,
        tombstones,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::{PollError, PollResult, Poller};
    use crate::pollers::RenderError;
    use crate::seen::hash_key;
    use crate::state::{state_key, Finished, OutputOffsets, SeenChunk, WatchRecord};
    use crate::watch::Progress;

    const T0: Millis = 1_700_000_000_000;
    const DAY: Millis = 86_400_000;

    /// Resolves `{"id": n}` to `n`; anything else does not resolve.
    struct Ids;

    impl Poller for Ids {
        type Input = u64;
        #[allow(clippy::manual_async_fn)]
        fn poll(
            &self,
            _: Arc<u64>,
        ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static
        {
            async { Ok(PollResult::default()) }
        }
    }

    impl Resolve for Ids {
        fn resolve(&self, value: &serde_json::Value, _: &[u8]) -> Result<u64, RenderError> {
            value["id"]
                .as_u64()
                .ok_or_else(|| RenderError::Missing("/id".into()))
        }
    }

    fn record(key: &str, value: &str, chunks: u32, finished: Option<Millis>) -> WatchRecord {
        let p = Progress::at_start(T0, T0);
        WatchRecord {
            watch_key: Bytes::copy_from_slice(key.as_bytes()),
            input_key: Some(Bytes::copy_from_slice(key.as_bytes())),
            input_value: Bytes::copy_from_slice(value.as_bytes()),
            input_time: T0,
            arrived: p.arrived,
            last_new: p.last_new,
            polls: 3,
            hold: T0,
            next_poll: T0 + 10_000,
            empty_streak: 0,
            failures: 0,
            seen_chunks: chunks,
            finished: finished.map(|at| Finished {
                at,
                reason: "final".into(),
            }),
            resume: None,
            conditions: None,
        }
    }

    fn h(s: &str) -> OutputHash {
        hash_key(s.as_bytes())
    }

    /// Whose each output read back is: by `wb-id`, by the readable headers, or (neither)
    /// by where it is and what its value says, read by the poller.
    #[test]
    fn outputs_read_back_are_told_apart_by_header_or_by_place_and_value() {
        use super::super::records::{
            recovery_id, CONTROL, INPUT_PARTITION, ITEM_VERSION, OUTPUT_KEY,
        };
        let keys = |v: &[u8]| -> Option<Bytes> {
            let item: serde_json::Value = serde_json::from_slice(v).ok()?;
            Some(Bytes::from(item.get("id")?.as_str()?.to_string()))
        };
        let keys: &crate::pollers::ReadOutputKey = &keys;
        let of = |headers: &[(&str, &[u8])], value: &[u8], keys| {
            let headers: Vec<(String, Vec<u8>)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect();
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_slice())
            };
            output_of(header, Some(value), 2, "2", keys)
        };
        let v = br#"{"id":"ev-1"}"#;
        // No header, read from its value: this partition's where it sits in output
        // partition 2 (`keys` is given only there).
        assert_eq!(of(&[], v, Some(keys)), Identified::Mine(h("ev-1")));
        assert_eq!(of(&[], v, None), Identified::NotMine);
        assert_eq!(of(&[], b"{}", Some(keys)), Identified::Unreadable);
        assert_eq!(
            of(&[("watchbridge-late", b"true")], v, Some(keys)),
            Identified::Mine(h("ev-1")),
            "a late output is marked, and still an output"
        );
        assert_eq!(
            of(&[(CONTROL, b"watermark")], b"{}", Some(keys)),
            Identified::NotMine,
            "a watermark record is no output"
        );
        // `wb-id` decides, wherever the output is: its hash, not the value's.
        let id = recovery_id(h("other"), 2);
        assert_eq!(
            of(&[(RECOVERY_ID, &id)], v, Some(keys)),
            Identified::Mine(h("other"))
        );
        let id = recovery_id(h("ev-1"), 3);
        assert_eq!(
            of(&[(RECOVERY_ID, &id)], v, Some(keys)),
            Identified::NotMine
        );
        // The readable headers of outputs written before `wb-id`.
        let readable = [(INPUT_PARTITION, &b"2"[..]), (OUTPUT_KEY, b"ev-9")];
        assert_eq!(of(&readable, v, None), Identified::Mine(h("ev-9")));
        let theirs = [(INPUT_PARTITION, &b"1"[..]), (OUTPUT_KEY, b"ev-9")];
        assert_eq!(of(&theirs, v, Some(keys)), Identified::NotMine);
        // An item's version is part of its identity, by header or by value.
        let versioned = hash_identity(b"ev-9", Some(b"v2"));
        let headers = [
            (INPUT_PARTITION, &b"2"[..]),
            (OUTPUT_KEY, b"ev-9"),
            (ITEM_VERSION, b"v2"),
        ];
        assert_eq!(of(&headers, v, None), Identified::Mine(versioned));
        assert_eq!(
            of(&[(ITEM_VERSION, b"v2")], br#"{"id":"ev-9"}"#, Some(keys)),
            Identified::Mine(versioned)
        );
    }

    /// Placed by input partition, an output partition the read did not ask keeps the
    /// checkpoint's offset (0 without one): the task never writes there.
    #[test]
    fn the_read_back_stops_at_the_ends_it_read_and_keeps_the_checkpoints_elsewhere() {
        let checkpoint = HashMap::from([(0, 5), (1, 7), (2, 9)]);
        assert_eq!(read_to(4, &[(2, (3, 40))], &checkpoint), vec![5, 7, 40, 0]);
        let every: Vec<(i32, (i64, i64))> = (0..3).map(|q| (q, (0, 10 + q as i64))).collect();
        assert_eq!(read_to(3, &every, &HashMap::new()), vec![10, 11, 12]);
    }

    #[test]
    fn an_unreadable_read_names_its_partitions_then_why() {
        let e = Unreadable::new(
            vec![named("out", 3), named("st", 3)],
            "Broker: Leader not available",
        );
        assert_eq!(e.to_string(), "out/3, st/3 (Broker: Leader not available)");
        let e = Unreadable::client("cannot create the consumer".into());
        assert_eq!(e.to_string(), "cannot create the consumer");
    }

    #[test]
    fn a_plan_restores_live_watches_with_their_chunks_plus_the_outputs_read_back() {
        let found = Found {
            live: vec![
                (
                    record("a", r#"{"id":1}"#, 1, None),
                    vec![SeenChunk::new(0, vec![h("a1"), h("a2")]).unwrap()],
                ),
                // Chunk 1 listed but missing: restored from what is there, rewritten.
                (
                    record("b", r#"{"id":2}"#, 2, None),
                    vec![SeenChunk::new(1, vec![h("b9")]).unwrap()],
                ),
                // No longer resolves: not restored.
                (record("c", r#"{"name":"x"}"#, 0, None), vec![]),
            ],
            finished: vec![
                (
                    record("f-recent", r#"{"id":5}"#, 0, Some(T0 - 1000)),
                    vec![],
                ),
                (
                    record("f-old", r#"{"id":6}"#, 0, Some(T0 - 2 * DAY)),
                    vec![],
                ),
            ],
            offsets: Some(OutputOffsets {
                offsets: vec![(0, 10), (1, 20)],
            }),
            outputs: HashMap::from([
                // a2 was in a chunk already; a3 was acknowledged after the last checkpoint.
                (Bytes::from_static(b"a"), vec![h("a2"), h("a3")]),
                // A watch with no record: kept until its input comes again.
                (Bytes::from_static(b"n"), vec![h("n1")]),
                // A finished watch's outputs: nothing to do.
                (Bytes::from_static(b"f-recent"), vec![h("f1")]),
            ]),
            read_to: vec![15, 25],
            orphans: vec![b"1:z/s/0".to_vec()],
            ..Found::default()
        };
        let mut plan = plan(found, &Ids, "st".into(), 0, DAY, T0);
        assert!(!plan.first_time);
        plan.restores.sort_by(|x, y| x.key.cmp(&y.key));
        let keys: Vec<&[u8]> = plan.restores.iter().map(|r| &r.key[..]).collect();
        assert_eq!(keys, [&b"a"[..], b"b"]);
        let a = &plan.restores[0];
        assert_eq!(*a.input, 1);
        assert_eq!(a.next_poll, T0 + 10_000);
        assert_eq!(a.progress.polls, 3);
        assert_eq!(a.seen.len(), 3);
        assert!(a.seen.contains(h("a3")));
        assert!(plan.restores[1].seen.contains(h("b9")));
        // Tombstones: the orphan chunk, b's inconsistent chunks (0 and 1), the old
        // finished record.
        let mut tombstones: Vec<String> = plan
            .tombstones
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        tombstones.sort();
        assert_eq!(tombstones, ["1:b/s/0", "1:b/s/1", "1:z/s/0", "5:f-old/w"]);
        assert!(plan.state.is_finished(b"f-recent"));
        assert!(!plan.state.is_finished(b"f-old"));
        assert_eq!(plan.state.take_preseen(b"n"), Some(vec![h("n1")]));
        assert_eq!(plan.state.take_preseen(b"f-recent"), None);

        // The next checkpoint writes what the read-back added (a's a3 and b's rewrite), then
        // offsets up to where the read-back stopped.
        let writes = plan.state.checkpoint_records(T0, false);
        let offsets = writes.last().unwrap().record.as_ref().unwrap();
        let entry =
            crate::state::decode_entry(offsets.key.as_deref().unwrap(), offsets.value.as_deref())
                .unwrap();
        assert_eq!(
            entry,
            crate::state::Entry::OutputOffsets(OutputOffsets {
                offsets: vec![(0, 15), (1, 25)]
            })
        );
        assert_eq!(
            writes.len(),
            2 + 2 + 1,
            "a: chunk + record, b: chunk + record"
        );
    }

    #[test]
    fn a_partition_never_saved_writes_its_offsets_first() {
        let found = Found {
            read_to: vec![7],
            ..Found::default()
        };
        let plan = plan(found, &Ids, "st".into(), 3, DAY, T0);
        assert!(plan.first_time);
        let w = plan.state.offsets_record();
        let r = w.record.unwrap();
        assert_eq!(r.partition, Some(3));
        assert_eq!(
            crate::state::decode_entry(r.key.as_deref().unwrap(), r.value.as_deref()).unwrap(),
            crate::state::Entry::OutputOffsets(OutputOffsets {
                offsets: vec![(0, 7)]
            })
        );
    }

    /// Seen failing first (CI, tests/secured.rs with the watermark topic's WRITE refused):
    /// a partition never saved whose first run's outputs landed wrote offsets past them
    /// while they were in no chunk, and the restore after that emitted each again.
    #[test]
    fn a_partition_never_saved_with_outputs_found_does_not_write_offsets_past_them() {
        let mut outputs = HashMap::new();
        outputs.insert(Bytes::from_static(b"u1"), vec![hash_key(b"e1")]);
        let found = Found {
            read_to: vec![7],
            outputs,
            ..Found::default()
        };
        let plan = plan(found, &Ids, "st".into(), 3, DAY, T0);
        assert!(plan.first_time);
        let r = plan.state.offsets_record().record.unwrap();
        assert_eq!(
            crate::state::decode_entry(r.key.as_deref().unwrap(), r.value.as_deref()).unwrap(),
            crate::state::Entry::OutputOffsets(OutputOffsets {
                offsets: vec![(0, 0)]
            })
        );
    }

    #[test]
    fn a_failed_watch_keeps_its_chunks_for_the_retention_and_comes_back_knowing_them() {
        let failed = |key: &str, at: Millis, chunks: u32| {
            let mut r = record(key, r#"{"id":7}"#, chunks, Some(at));
            r.finished.as_mut().unwrap().reason = "failed".into();
            r
        };
        let found = Found {
            finished: vec![
                (
                    failed("x", T0 - 1000, 2),
                    vec![
                        SeenChunk::new(0, vec![h("x1"), h("x2")]).unwrap(),
                        SeenChunk::new(1, vec![h("x3")]).unwrap(),
                    ],
                ),
                (
                    failed("old", T0 - 2 * DAY, 1),
                    vec![SeenChunk::new(0, vec![h("o1")]).unwrap()],
                ),
                // A finished (not failed) watch's chunk left by a crash: deleted.
                (
                    record("f", r#"{"id":8}"#, 0, Some(T0 - 1000)),
                    vec![SeenChunk::new(0, vec![h("f1")]).unwrap()],
                ),
            ],
            offsets: Some(OutputOffsets {
                offsets: vec![(0, 0)],
            }),
            // An output of x's found past the checkpoint counts too.
            outputs: HashMap::from([(Bytes::from_static(b"x"), vec![h("x4")])]),
            read_to: vec![0],
            ..Found::default()
        };
        let mut plan = plan(found, &Ids, "st".into(), 0, DAY, T0);
        assert!(plan.restores.is_empty(), "a failed watch does not run");
        let mut tombstones: Vec<String> = plan
            .tombstones
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        tombstones.sort();
        assert_eq!(tombstones, ["1:f/s/0", "3:old/s/0", "3:old/w"]);
        assert!(
            !plan.state.is_finished(b"x"),
            "its input may start it again"
        );
        assert!(plan.state.is_finished(b"f"));
        let restart = plan.state.take_failed(b"x").expect("kept");
        assert_eq!(restart.chunks, 2);
        assert_eq!(restart.seen.len(), 4);
        for e in ["x1", "x2", "x3", "x4"] {
            assert!(restart.seen.contains(h(e)), "{e}");
        }
        assert!(plan.state.take_failed(b"old").is_none());
    }

    /// A state partition as compaction leaves it: the latest record per key, with its offset.
    #[derive(Default)]
    struct Compacted {
        next: i64,
        latest: HashMap<Vec<u8>, (i64, Option<Vec<u8>>)>,
    }

    impl Compacted {
        fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
            self.latest.insert(key, (self.next, value));
            self.next += 1;
        }

        fn append(&mut self, writes: Vec<crate::kafka::durable::StateWrite>) {
            for w in writes {
                let r = w.record.expect("a record");
                self.put(r.key.expect("a key").to_vec(), r.value.map(|v| v.to_vec()));
            }
        }

        fn recover(&self, now: Millis) -> Plan<u64> {
            let mut found = Found {
                read_to: vec![0, 0],
                ..Found::default()
            };
            fold_state(self.latest.clone(), &mut found, 0);
            plan(found, &Ids, "st".into(), 0, DAY, now)
        }
    }

    fn start(s: &mut DurableState, key: &str, n: i64) {
        let registration = crate::state::Registration {
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Bytes::from(format!(r#"{{"id":{n}}}"#)),
            time: T0,
        };
        let key = Bytes::copy_from_slice(key.as_bytes());
        let at_start = Progress::at_start(T0, T0);
        s.started(key, registration, at_start, T0, n, &[], 0)
            .expect("new");
    }

    fn sorted_keys(plan: &Plan<u64>) -> Vec<String> {
        let mut keys: Vec<String> = plan
            .restores
            .iter()
            .map(|r| String::from_utf8_lossy(&r.key).into_owned())
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn watches_in_a_starts_record_are_restored_until_their_own_records_replace_it() {
        let mut topic = Compacted::default();
        let mut s = DurableState::new("st".into(), 0, DAY, vec![0, 0], vec![0, 0]);
        for (key, n) in [("a", 1), ("b", 2), ("c", 3)] {
            start(&mut s, key, n);
        }
        topic.append(s.checkpoint_records(T0, false));
        assert_eq!(topic.latest.len(), 1, "one starts record");
        // a polls 7 times (its own record, once due); c ends (its own finished record).
        let mut polled = Progress::at_start(T0, T0);
        polled.polls = 7;
        s.checkpoint(b"a", polled, T0 + 5_000, None, None, false);
        s.terminated(b"c", T0 + 1, &TerminatedReason::Final, SeenSet::new());
        let later = T0 + crate::kafka::durable::PROGRESS_WRITE_INTERVAL_MS;
        topic.append(s.checkpoint_records(later, false));

        let plan = topic.recover(later + 1);
        assert_eq!(sorted_keys(&plan), ["a", "b"]);
        let a = plan.restores.iter().find(|r| &r.key[..] == b"a").unwrap();
        assert_eq!(
            a.progress.polls, 7,
            "its own record, later than the starts record"
        );
        assert_eq!(*a.input, 1);
        assert!(plan.state.is_finished(b"c"));
        assert!(
            plan.tombstones.is_empty(),
            "b still relies on the starts record"
        );

        // b's own record; the starts record is deleted at the checkpoint after.
        let mut state = plan.state;
        state.checkpoint(
            b"b",
            Progress::at_start(T0, T0),
            later + 10_000,
            None,
            None,
            false,
        );
        topic.append(state.checkpoint_records(later + 2 * 30_000, true));
        topic.append(state.checkpoint_records(later + 2 * 30_000 + 1, false));
        assert_eq!(
            topic
                .latest
                .get(&b"~starts/1"[..])
                .map(|(_, v)| v.is_none()),
            Some(true)
        );
        let plan = topic.recover(later + 2 * 30_000 + 2);
        assert_eq!(sorted_keys(&plan), ["a", "b"]);
        assert!(plan.state.is_finished(b"c"));
    }

    /// A record of a newer format version is listed for the partition to stop on (it is not
    /// taken for damage, nor tombstoned as an orphan's chunk); a damaged record of this
    /// version is skipped and counted as before; a newer record replaced by a later one of
    /// this version (its key's latest) stops nothing.
    #[test]
    fn a_newer_format_record_is_listed_and_a_damaged_one_is_skipped() {
        let mut topic = Compacted::default();
        let newer = |v: Vec<u8>| [&[crate::state::FORMAT_VERSION + 1][..], &v[1..]].concat();
        let live = record("x", r#"{"id":9}"#, 0, None);
        topic.put(state_key(b"x", Part::Watch), Some(newer(live.encode())));
        let chunk = SeenChunk::new(0, vec![h("y1")]).unwrap();
        topic.put(state_key(b"y", Part::Seen(0)), Some(newer(chunk.encode())));
        let mut damaged = record("z", r#"{"id":8}"#, 0, None).encode();
        damaged.truncate(10);
        topic.put(state_key(b"z", Part::Watch), Some(damaged));
        let mut found = Found::default();
        fold_state(topic.latest.clone(), &mut found, 0);
        found.newer.sort_by_key(|r| r.offset);
        assert_eq!(
            found.newer,
            vec![
                NewerRecord {
                    key: b"1:x/w".to_vec(),
                    offset: 0,
                    version: 2
                },
                NewerRecord {
                    key: b"1:y/s/0".to_vec(),
                    offset: 1,
                    version: 2
                },
            ]
        );
        assert_eq!(found.undecodable, 1, "the damaged one");
        assert!(found.live.is_empty() && found.orphans.is_empty());

        topic.put(state_key(b"x", Part::Watch), Some(live.encode()));
        topic.put(state_key(b"y", Part::Seen(0)), None);
        let mut found = Found::default();
        fold_state(topic.latest.clone(), &mut found, 0);
        assert!(found.newer.is_empty());
        assert_eq!(found.live.len(), 1);
    }

    #[test]
    fn whichever_is_later_of_a_watchs_own_record_and_a_starts_record_wins() {
        let mut topic = Compacted::default();
        let mut own = record("x", r#"{"id":9}"#, 0, None);
        own.polls = 5;
        topic.put(state_key(b"x", Part::Watch), Some(own.encode()));
        let fresh = record("x", r#"{"id":9}"#, 0, None);
        let starts = crate::state::Starts {
            seq: 3,
            watches: vec![fresh.clone(), record("y", r#"{"id":8}"#, 0, None)],
        };
        topic.put(crate::state::starts_key(3), Some(starts.encode()));
        let plan = topic.recover(T0);
        assert_eq!(sorted_keys(&plan), ["x", "y"]);
        assert!(
            plan.restores.iter().all(|r| r.progress.polls == 3),
            "the starts record's"
        );
        assert!(plan.tombstones.is_empty());
        // New watches are numbered after every starts record on the topic.
        let mut state = plan.state;
        start(&mut state, "p", 20);
        start(&mut state, "q", 21);
        let writes = state.checkpoint_records(T0, false);
        let keys: Vec<Bytes> = writes
            .iter()
            .filter_map(|w| w.record.as_ref()?.key.clone())
            .collect();
        assert!(keys.contains(&Bytes::from_static(b"~starts/4")), "{keys:?}");

        // Both deleted by later records of their own: the starts record goes at the restore.
        topic.put(state_key(b"x", Part::Watch), None);
        topic.put(
            state_key(b"y", Part::Watch),
            Some(record("y", r#"{"id":8}"#, 0, Some(T0)).encode()),
        );
        let plan = topic.recover(T0 + 1);
        assert!(plan.restores.is_empty());
        assert!(plan.state.is_finished(b"y"));
        assert_eq!(plan.tombstones, vec![b"~starts/3".to_vec()]);
    }
}

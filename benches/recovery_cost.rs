//! What a partition's recovery reads back after its neighbours wrote a million outputs
//! (issue 15 path 6): "Recovery of a partition whose neighbours wrote 1,000,000 outputs
//! since the last restart reads only its own outputs". Records read and seconds, now and
//! as before the fix (commit 9396b8b), measured in one run. Run with `make bench` (or
//! `cargo bench --bench recovery_cost`); `BENCH_SMOKE=1` only proves it runs (20,000
//! neighbour records, one reader run).
//!
//! One Apache Kafka broker for the whole bench (`scripts/kafka.sh`: one KRaft node,
//! `tests/support/kafka_process.rs`), and [`run_bridge`] in this process (the allocator of
//! the `watchbridge` binary), with 4 input and 4 output partitions,
//! `WATCHBRIDGE_GUARANTEE=recovery` (the mode of every broker; Kafka's `auto` would pick
//! `exactly_once`), polls every second, defaults otherwise (checkpoints every 500 ms,
//! watermarks `bounded(5s)`).
//!
//! Not Tansu, the other benches' broker: Tansu 0.6's memory storage answers a partition's
//! end offset (ListOffsets latest) with the base offset of its last record batch + 1, not
//! the offset after the batch's last record (a batch of 10 records on a new topic: end 1; a
//! single-record batch after it puts the end right). A recovery reads each partition up to
//! the end it was told, so there it stops before the rest of the last batch — of the
//! neighbours' records, and of the state partition (its last checkpoint is one batch) —
//! and the checkpoints' raised offsets lag one batch: neither figure would be what the
//! bridge does on Kafka. Its SQLite storage answers right but takes minutes to store and
//! read a million records with three headers each.
//!
//! 1. **Partition 0's watches.** 4 inputs `{"id": n}` on input partition 0 only, keyed so
//!    that librdkafka's default partitioner (`consistent_random`: CRC-32 of the key, mod
//!    the partitions) puts their outputs on output partition 0 (checked by reading the
//!    output topic back: the neighbours' partitions are those without an output of
//!    partition 0). Each watch's poll returns the same 5 outputs every time, never final:
//!    20 outputs in all, written in the first second, then live watches with nothing new.
//! 2. **The neighbours.** Once partition 0's outputs are acknowledged, a plain producer
//!    with the bridge's settings (idempotent, `acks=all`, lz4, `linger.ms=5`) writes N
//!    records (`RECOVERY_COST_RECORDS`, default 1,000,000), as fast as it goes, to the
//!    output partitions partition 0 never writes to: ~100-byte values and the bridge's three
//!    output headers, `watchbridge-input-partition` naming input partitions 1–3 — what the
//!    watches of the other partitions would have written. (Real neighbour watches would
//!    have the bridge poll and deduplicate a million outputs first: minutes here, for the
//!    same records on the output topic; the recovery of partition 0 reads only the topic.)
//! 3. **Checkpoints.** The bridge runs on for two reads of the output topic's end offsets
//!    ([`output_ends::INTERVAL`], 5 s) and 2 s more, then is stopped (its last
//!    checkpoint). Partition 0's saved output offsets are read from the state topic and
//!    compared with the ends right after the neighbours' last record.
//! 4. **Before the fix.** Before 9396b8b a checkpoint moved the offset of an output
//!    partition only with its own partition's outputs: for one it never writes to, it kept
//!    what the first checkpoint saved (the ends when the partition was first assigned, 0
//!    here). The baseline's state topic is a copy of the state topic (every record of every
//!    partition, in order) whose partition 0 ends with an offsets record of exactly that:
//!    the last checkpoint's offset for output partition 0, the first checkpoint's for the
//!    neighbours' partitions.
//! 5. **Restarts.** The bridge is started again, same group, once on the state topic (now)
//!    and once on the copy (before the fix); partition 0's recovery is taken from its log
//!    event `partition state restored partition=0 … outputs_read=N … took_ms=T`
//!    (`PartitionRecovered` in src/internal_events.rs, heard by a `tracing` layer here):
//!    output records read and the time from assignment to the watches handed to the
//!    engine. Both restarts start from the state the first run left.
//! 6. **The reader alone.** [`recovery::read`] of partition 0 on each state topic, from
//!    this process, `RECOVERY_COST_RUNS` times each (default 3), interleaved: median and
//!    spread of the read, which is most of a recovery's time.
//!
//! The section (`bench/results/recovery_cost.md`) goes to stdout; `RECOVERY_COST_LOG`
//! sets the log filter for stderr (default `warn`).

#[path = "support/mod.rs"]
mod support;

/// What the `watchbridge` binary allocates with, so the bridge here runs as it does there.
#[global_allocator]
static GLOBAL: watchbridge::Allocator = watchbridge::Allocator;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::broker_process::BrokerProcess;
use support::cpu::{cpu_seconds, machine_cpu_seconds};
use support::kafka::{bridge_args, create_topic, create_topic_with, input_id, producer, InFlight};
use support::report::{
    command_output, disturbed_note, env_or, machine, median, min_max, now_ms, rate, summary_line,
    utc_now,
};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use watchbridge::bridge::{run_bridge, StopSignal};
use watchbridge::clock::Millis;
use watchbridge::config::RunConfig;
use watchbridge::kafka::clients::{Isolation, KafkaSettings};
use watchbridge::kafka::output_ends;
use watchbridge::kafka::records;
use watchbridge::kafka::recovery::{self, Lookups, RecoverySource};
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::{RenderError, Resolve};
use watchbridge::state::{decode_entry, Entry, OutputOffsets};

/// Input partitions, and output partitions.
const PARTITIONS: i32 = 4;
/// Partition 0's watches.
const WATCHES: usize = 4;
/// Outputs per watch of partition 0.
const ITEMS: usize = 5;
/// Size of a neighbour record's value, in bytes.
const VALUE_BYTES: usize = 100;
/// The input partition whose recovery is measured.
const MEASURED: i32 = 0;

struct Sizes {
    /// Records the neighbours write.
    records: usize,
    /// Reader-alone runs per state topic.
    runs: usize,
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs (used by `make bench-smoke`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let s = Sizes {
        records: env_or(
            "RECOVERY_COST_RECORDS",
            if smoke { 20_000 } else { 1_000_000 },
        ),
        runs: env_or("RECOVERY_COST_RUNS", if smoke { 1 } else { 3 }),
    };
    assert!(s.runs >= 1, "RECOVERY_COST_RUNS must be at least 1");
    s
}

// ---------------------------------------------------------------------------------------
// Partition 0's watches.

/// CRC-32 (IEEE), what librdkafka's default partitioner (`consistent_random`) hashes a
/// key with.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Partition 0's watch keys: the first [`WATCHES`] of `own-{i}` that the default
/// partitioner puts on output partition 0 (each watch's outputs are keyed by its key).
fn watch_keys() -> Vec<String> {
    (0..)
        .map(|i| format!("own-{i}"))
        .filter(|k| crc32(k.as_bytes()) % PARTITIONS as u32 == MEASURED as u32)
        .take(WATCHES)
        .collect()
}

/// Input `{"id": n}`: the same [`ITEMS`] outputs at every poll, never final.
struct Fixed {
    base: Millis,
}

impl Poller for Fixed {
    type Input = usize;

    fn poll(
        &self,
        input: Arc<usize>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let n = *input;
        let outputs = (0..ITEMS)
            .map(|j| {
                Output::new(
                    format!("own-{n}-item-{j}"),
                    format!(r#"{{"watch":{n},"item":{j}}}"#),
                    self.base + j as Millis,
                )
            })
            .collect();
        std::future::ready(Ok(PollResult::incomplete(outputs)))
    }
}

impl Resolve for Fixed {
    fn resolve(&self, value: &Value, _key: &[u8]) -> Result<usize, RenderError> {
        input_id(value)
    }
}

// ---------------------------------------------------------------------------------------
// Hearing the bridge's recoveries.

/// One `partition state restored` event (`PartitionRecovered`).
#[derive(Debug, Clone, Default)]
struct Recovered {
    partition: i64,
    watches: u64,
    state_records: u64,
    outputs_read: u64,
    took_ms: u64,
}

/// Every `partition state restored` event of this process, in order. Clones share it.
#[derive(Clone, Default)]
struct Recoveries(Arc<Mutex<Vec<Recovered>>>);

impl Recoveries {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The first recovery of each partition among the events from the `from`th on, once
    /// every partition has one.
    fn each_partition_since(&self, from: usize) -> Option<Vec<Recovered>> {
        let events = self.0.lock().unwrap();
        (0..PARTITIONS as i64)
            .map(|p| events[from..].iter().find(|r| r.partition == p).cloned())
            .collect()
    }
}

impl<S: Subscriber> Layer<S> for Recoveries {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            r: Recovered,
        }
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                let text = format!("{value:?}");
                let n = || text.parse::<u64>().unwrap_or(0);
                match field.name() {
                    "message" => self.message = text.clone(),
                    "partition" => self.r.partition = text.parse().unwrap_or(-1),
                    "watches" => self.r.watches = n(),
                    "state_records" => self.r.state_records = n(),
                    "outputs_read" => self.r.outputs_read = n(),
                    "took_ms" => self.r.took_ms = n(),
                    _ => {}
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message == "partition state restored" {
            self.0.lock().unwrap().push(fields.r);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kafka helpers (blocking ones run outside the runtime or on its blocking threads).

fn client(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-recovery-cost-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("create a Kafka consumer")
}

/// Every record of `topic`/`partition` up to its end offset now, handed to `each`.
fn read_partition(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    mut each: impl FnMut(&BorrowedMessage<'_>),
) {
    let consumer = client(bootstrap);
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("end offsets of {topic}/{partition}: {e}"));
    if low >= high {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .expect("a partition to read");
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "{topic}/{partition} not read to offset {high} in 120 s"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                each(&m);
                if m.offset() + 1 >= high {
                    return;
                }
            }
            Some(Err(e)) => panic!("reading {topic}/{partition}: {e}"),
            None => {}
        }
    }
}

/// The end offset of every output partition now.
fn ends(bootstrap: &str, topic: &str) -> Vec<i64> {
    let consumer = client(bootstrap);
    (0..PARTITIONS)
        .map(|q| {
            consumer
                .fetch_watermarks(topic, q, Duration::from_secs(15))
                .unwrap_or_else(|e| panic!("end offsets of {topic}/{q}: {e}"))
                .1
        })
        .collect()
}

fn header<'m>(m: &'m BorrowedMessage<'_>, name: &str) -> Option<&'m [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

/// Output partitions holding an output of input partition [`MEASURED`].
fn partitions_written_by_measured(bootstrap: &str, topic: &str) -> Vec<i32> {
    let wanted = MEASURED.to_string();
    (0..PARTITIONS)
        .filter(|&q| {
            let mut found = false;
            read_partition(bootstrap, topic, q, |m| {
                found |= header(m, records::INPUT_PARTITION) == Some(wanted.as_bytes());
            });
            found
        })
        .collect()
}

/// A state partition's records in order, (key, value).
type StateRecords = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn state_records(bootstrap: &str, topic: &str, partition: i32) -> StateRecords {
    let mut out = Vec::new();
    read_partition(bootstrap, topic, partition, |m| {
        if let Some(key) = m.key() {
            out.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
        }
    });
    out
}

/// The output offsets records of a state partition, in the order they were written.
fn offsets_records(records: &StateRecords) -> Vec<OutputOffsets> {
    records
        .iter()
        .filter_map(|(k, v)| match decode_entry(k, v.as_deref()) {
            Ok(Entry::OutputOffsets(o)) => Some(o),
            _ => None,
        })
        .collect()
}

fn offset_of(o: &OutputOffsets, q: i32) -> i64 {
    o.offsets
        .iter()
        .find(|(p, _)| *p == q)
        .map_or(0, |&(_, off)| off)
}

// ---------------------------------------------------------------------------------------
// Writers.

/// Partition [`MEASURED`]'s inputs, all on that partition.
async fn produce_inputs(bootstrap: &str, topic: &str, keys: &[String]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .expect("create the input producer");
    let mut in_flight = InFlight::new("inputs");
    for (n, key) in keys.iter().enumerate() {
        let value = format!(r#"{{"id": {n}}}"#);
        let record = FutureRecord::to(topic)
            .partition(MEASURED)
            .key(key.as_str())
            .payload(value.as_bytes());
        in_flight.send(&producer, record).await;
    }
    in_flight.delivered().await;
}

/// The neighbours' records: `n` outputs as partitions 1–3's watches would write them,
/// round-robin over `partitions`, as fast as one producer goes. Returns the time from the
/// first send to the last acknowledgement.
async fn write_neighbours(
    producer: &FutureProducer,
    topic: &str,
    partitions: &[i32],
    n: usize,
) -> Duration {
    let began = Instant::now();
    let first_seen = now_ms();
    let first_seen_text = first_seen.to_string();
    let mut in_flight = InFlight::new("neighbours");
    for i in 0..n {
        let input_partition = (1 + i % (PARTITIONS as usize - 1)).to_string();
        let key = format!("neighbour-{:05}", i % 10_000);
        let output_key = format!("neighbour-item-{i}");
        let mut value = format!(r#"{{"neighbour":"{key}","item":{i},"pad":""#);
        let pad = VALUE_BYTES.saturating_sub(value.len() + 2);
        value.extend(std::iter::repeat_n('x', pad));
        value.push_str("\"}");
        fn h<'v>(key: &'static str, value: &'v [u8]) -> Header<'static, &'v [u8]> {
            Header {
                key,
                value: Some(value),
            }
        }
        let record = FutureRecord::to(topic)
            .partition(partitions[i % partitions.len()])
            .key(key.as_str())
            .payload(value.as_bytes())
            .timestamp(first_seen)
            .headers(
                OwnedHeaders::new_with_capacity(3)
                    .insert(h(records::OUTPUT_KEY, output_key.as_bytes()))
                    .insert(h(records::INPUT_PARTITION, input_partition.as_bytes()))
                    .insert(h(records::FIRST_SEEN, first_seen_text.as_bytes())),
            );
        in_flight.send(producer, record).await;
    }
    in_flight.delivered().await;
    began.elapsed()
}

/// `records` of every state partition to the same partition of `topic`, in order, then on
/// partition [`MEASURED`] `last`.
async fn write_state_copy(
    bootstrap: &str,
    topic: &str,
    partitions: &[StateRecords],
    last: &OutputOffsets,
) {
    let producer = producer(bootstrap);
    let last = last.to_entry().expect("a small record");
    let mut deliveries = Vec::new();
    let mut send = |partition: i32, key: &[u8], value: Option<&[u8]>| {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .partition(partition)
            .key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        match producer.send_result(record) {
            Ok(d) => deliveries.push(d),
            Err((e, _)) => panic!("copy of the state topic: {e}"),
        }
    };
    for (p, records) in (0..).zip(partitions) {
        for (key, value) in records {
            send(p, key, value.as_deref());
        }
    }
    send(MEASURED, &last.key, Some(&last.value));
    for d in deliveries {
        match d.await {
            Ok(Ok(_)) => {}
            other => panic!("copy of the state topic: a record not delivered: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Measuring.

/// CPU time of this process, the broker and the machine, to tell a disturbed figure.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    own: f64,
    broker: f64,
    machine: f64,
}

impl Sample {
    fn now(broker_pid: &str) -> Self {
        Sample {
            at: Instant::now(),
            own: cpu_seconds("self"),
            broker: cpu_seconds(broker_pid),
            machine: machine_cpu_seconds(),
        }
    }

    /// Cores busy from `self` to `later` besides this process and the broker.
    fn others_until(&self, later: &Sample) -> f64 {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        ((later.machine - self.machine) - (later.own - self.own) - (later.broker - self.broker))
            .max(0.0)
            / wall
    }
}

/// One bridge restart: partition [`MEASURED`]'s recovery and the others'.
struct Restart {
    measured: Recovered,
    others: Vec<Recovered>,
    /// Outputs the restarted bridge produced (the restored watches poll again and see
    /// nothing new: 0).
    outputs_produced: u64,
    /// Cores busy besides the bridge and the broker, from start to the last recovery.
    others_cores: f64,
}

/// Starts the bridge with `config`, waits until every partition has recovered, stops it.
fn restart(
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    broker_pid: &str,
    config: &RunConfig,
    poller: &Arc<Fixed>,
    recoveries: &Recoveries,
) -> Restart {
    let from = recoveries.len();
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(StopSignal::default());
    let start = Sample::now(broker_pid);
    let (result, (recovered, end)) = runtime.block_on(async {
        let run = run_bridge(
            bootstrap,
            None,
            config,
            poller.clone(),
            metrics.clone(),
            stop.clone(),
        );
        let watch = async {
            let limit = Duration::from_secs(180);
            let began = Instant::now();
            let recovered = loop {
                if let Some(all) = recoveries.each_partition_since(from) {
                    break all;
                }
                if began.elapsed() > limit || stop.is_stopped() {
                    stop.stop();
                    panic!(
                        "the restarted bridge (state topic {}): not every partition recovered \
                         after {limit:?}",
                        config.state_topic
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let end = Sample::now(broker_pid);
            // A poll of each restored watch (every second), to see nothing emitted again.
            tokio::time::sleep(Duration::from_secs(2)).await;
            stop.stop();
            (recovered, end)
        };
        tokio::join!(run, watch)
    });
    if let Err(e) = result {
        panic!("the restarted bridge failed: {e}");
    }
    let measured = recovered[MEASURED as usize].clone();
    let others = recovered
        .into_iter()
        .filter(|r| r.partition != MEASURED as i64)
        .collect();
    Restart {
        measured,
        others,
        outputs_produced: metrics.outputs_produced.get(),
        others_cores: start.others_until(&end),
    }
}

/// [`recovery::read`] of partition [`MEASURED`]: output records read, seconds, cores busy
/// besides this process and the broker.
fn read_alone(source: &RecoverySource, broker_pid: &str) -> (u64, f64, f64) {
    let start = Sample::now(broker_pid);
    let found = recovery::read(source, MEASURED).expect("partition 0 read back");
    let end = Sample::now(broker_pid);
    (
        found.outputs_read,
        end.at.duration_since(start.at).as_secs_f64(),
        start.others_until(&end),
    )
}

// ---------------------------------------------------------------------------------------

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let began = Instant::now();
    let recoveries = Recoveries::default();
    let filter = std::env::var("RECOVERY_COST_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::new(filter)),
        )
        .with(recoveries.clone().with_filter(
            Targets::new().with_target("watchbridge::internal_events", LevelFilter::INFO),
        ))
        .init();

    let broker = BrokerProcess::kafka("watchbridge-bench-kafka-").unwrap_or_else(|e| panic!("{e}"));
    let (bootstrap, broker_pid) = (broker.bootstrap.clone(), broker.pid());
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    let name = format!("bench-recovery-{}", std::process::id());
    let args = || {
        let mut args = bridge_args(&bootstrap, &name, PARTITIONS);
        args.poll_interval = Duration::from_secs(1);
        args.guarantee = "recovery".into();
        args
    };
    let config = args()
        .check(std::iter::empty())
        .unwrap_or_else(|e| panic!("bench bridge config: {e}"));
    let before_topic = format!("{}.before-fix", config.state_topic);
    let before_config = {
        let mut a = args();
        a.state_topic = Some(before_topic.clone());
        a.check(std::iter::empty())
            .unwrap_or_else(|e| panic!("bench bridge config: {e}"))
    };
    let output = config.output_topic.clone();
    let keys = watch_keys();
    runtime.block_on(async {
        create_topic(&bootstrap, &config.input_topic, PARTITIONS).await;
        create_topic(&bootstrap, &output, PARTITIONS).await;
        produce_inputs(&bootstrap, &config.input_topic, &keys).await;
    });
    let poller = Arc::new(Fixed { base: now_ms() });

    // 1-3: the first run, partition 0's outputs, the neighbours', two reads of the ends.
    eprintln!(
        "recovery_cost: first run, then {} neighbour records",
        s.records
    );
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(StopSignal::default());
    let neighbour_producer = producer(&bootstrap);
    let (result, first) = runtime.block_on(async {
        let run = run_bridge(
            &bootstrap,
            None,
            &config,
            poller.clone(),
            metrics.clone(),
            stop.clone(),
        );
        let drive = async {
            let limit = Duration::from_secs(120);
            let t0 = Instant::now();
            let own_outputs = (WATCHES * ITEMS) as u64;
            while metrics.outputs_produced.get() < own_outputs {
                if t0.elapsed() > limit {
                    stop.stop();
                    panic!(
                        "{} of partition 0's {own_outputs} outputs produced after {limit:?}",
                        metrics.outputs_produced.get()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (b, o) = (bootstrap.clone(), output.clone());
            let own = tokio::task::spawn_blocking(move || partitions_written_by_measured(&b, &o))
                .await
                .expect("read the output topic");
            let neighbours: Vec<i32> = (0..PARTITIONS).filter(|q| !own.contains(q)).collect();
            if neighbours.is_empty() {
                stop.stop();
                panic!("partition 0's outputs are on every output partition: {own:?}");
            }
            let wrote =
                write_neighbours(&neighbour_producer, &output, &neighbours, s.records).await;
            let (b, o) = (bootstrap.clone(), output.clone());
            let ends_after = tokio::task::spawn_blocking(move || ends(&b, &o))
                .await
                .expect("read the ends");
            eprintln!(
                "recovery_cost: {} neighbour records in {:.1} s; waiting for two reads of \
                 the output ends",
                s.records,
                wrote.as_secs_f64()
            );
            tokio::time::sleep(2 * output_ends::INTERVAL + Duration::from_secs(2)).await;
            stop.stop();
            (own, neighbours, wrote, ends_after)
        };
        tokio::join!(run, drive)
    });
    drop(neighbour_producer);
    if let Err(e) = result {
        panic!("the bridge failed: {e}");
    }
    let (own, neighbours, wrote, ends_after) = first;
    let own_outputs = metrics.outputs_produced.get();

    // What the first run left: partition 0's saved offsets, first and last.
    let state: Vec<StateRecords> = (0..PARTITIONS)
        .map(|p| state_records(&bootstrap, &config.state_topic, p))
        .collect();
    let saved = offsets_records(&state[MEASURED as usize]);
    let (first_saved, last_saved) = (
        saved
            .first()
            .expect("partition 0's first checkpoint")
            .clone(),
        saved.last().expect("partition 0's last checkpoint").clone(),
    );
    let ends_at_stop = ends(&bootstrap, &output);
    // 4: the offsets a checkpoint kept before the fix.
    let before = OutputOffsets {
        offsets: (0..PARTITIONS)
            .map(|q| {
                let from = if neighbours.contains(&q) {
                    &first_saved
                } else {
                    &last_saved
                };
                (q, offset_of(from, q))
            })
            .collect(),
    };
    runtime.block_on(async {
        // A state topic: compacted, or the bridge refuses it at start.
        create_topic_with(
            &bootstrap,
            &before_topic,
            PARTITIONS,
            &[("cleanup.policy", "compact")],
        )
        .await;
        write_state_copy(&bootstrap, &before_topic, &state, &before).await;
    });
    // 6: the reader alone, interleaved.
    let source = |state_topic: &str| {
        // The bridge's readers' settings (`kafka/clients.rs`), with no `KAFKA_*` property.
        let clients = KafkaSettings {
            brokers: bootstrap.clone(),
            properties: Default::default(),
            group_id: config.group_id.clone(),
        };
        let kafka = watchbridge::kafka::health::KafkaContext::new(
            watchbridge::kafka::health::BrokerHealth::new(
                &bootstrap,
                Arc::new(watchbridge::metrics::Metrics::new()),
            ),
        );
        let lookups = Lookups::start(&clients, &kafka, &config.input_topic);
        RecoverySource {
            consumer_config: clients.recovery_reader(Isolation::ReadCommitted),
            kafka,
            input_topic: config.input_topic.as_str().into(),
            group_id: config.group_id.clone(),
            watermark_topic: config.watermark_topic.as_str().into(),
            state_topic: state_topic.into(),
            output_topic: output.as_str().into(),
            output_partitions: PARTITIONS,
            // Every output partition read back, as with outputs placed by key: what the
            // bench measures is what the offsets spare that read. (With as many partitions
            // the bridge places outputs by input partition and reads partition 0 alone.)
            outputs_by_input_partition: false,
            read_outputs: true,
            settle_outputs: false,
            output_keys: None,
            lookups,
        }
    };
    let (now_source, before_source) = (source(&config.state_topic), source(&before_topic));
    let mut alone_now = Vec::new();
    let mut alone_before = Vec::new();
    for run in 0..s.runs {
        alone_now.push(read_alone(&now_source, &broker_pid));
        alone_before.push(read_alone(&before_source, &broker_pid));
        eprintln!(
            "recovery_cost: reader alone, run {}: now {} records in {:.3} s, before the fix {} \
             records in {:.3} s",
            run + 1,
            alone_now[run].0,
            alone_now[run].1,
            alone_before[run].0,
            alone_before[run].1
        );
    }

    // 5: the restarts.
    eprintln!("recovery_cost: restart on the state topic");
    let now = restart(
        &runtime,
        &bootstrap,
        &broker_pid,
        &config,
        &poller,
        &recoveries,
    );
    eprintln!("recovery_cost: restart on the state topic as before the fix");
    let was = restart(
        &runtime,
        &bootstrap,
        &broker_pid,
        &before_config,
        &poller,
        &recoveries,
    );
    drop(runtime);
    for (what, r) in [("now", &now), ("before the fix", &was)] {
        eprintln!(
            "recovery_cost: restart {what}: partition 0 read {} output records in {} ms \
             ({} watches); others {:?}",
            r.measured.outputs_read, r.measured.took_ms, r.measured.watches, r.others
        );
        assert_eq!(
            r.measured.watches, WATCHES as u64,
            "restart {what}: partition 0's watches restored"
        );
        assert_eq!(
            r.outputs_produced, 0,
            "restart {what}: a restored watch emitted an output again"
        );
    }
    drop(broker);

    let ctx = Report {
        s: &s,
        own: &own,
        neighbours: &neighbours,
        own_outputs,
        wrote,
        ends_after: &ends_after,
        ends_at_stop: &ends_at_stop,
        first_saved: &first_saved,
        last_saved: &last_saved,
        now: &now,
        was: &was,
        alone_now: &alone_now,
        alone_before: &alone_before,
        elapsed: began.elapsed(),
    };
    print!("{}", ctx.render());
}

struct Report<'a> {
    s: &'a Sizes,
    own: &'a [i32],
    neighbours: &'a [i32],
    own_outputs: u64,
    wrote: Duration,
    ends_after: &'a [i64],
    ends_at_stop: &'a [i64],
    first_saved: &'a OutputOffsets,
    last_saved: &'a OutputOffsets,
    now: &'a Restart,
    was: &'a Restart,
    alone_now: &'a [(u64, f64, f64)],
    alone_before: &'a [(u64, f64, f64)],
    elapsed: Duration,
}

/// The broker's version, from the name of its `kafka-clients` jar.
fn kafka_version() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh");
    let libs = command_output(script, &["path"]);
    std::fs::read_dir(libs)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(
                name.strip_prefix("kafka-clients-")?
                    .strip_suffix(".jar")?
                    .to_string(),
            )
        })
        .next()
        .unwrap_or_else(|| "(version unknown)".into())
}

fn list(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
}

fn offsets(o: &OutputOffsets) -> String {
    (0..PARTITIONS)
        .map(|q| offset_of(o, q).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a / b` as `Nx`, with `∞` where `b` is 0.
fn times(a: f64, b: f64) -> String {
    if b > 0.0 {
        let r = a / b;
        if r >= 100.0 {
            format!("{r:.0}x")
        } else {
            format!("{r:.1}x")
        }
    } else {
        "∞".into()
    }
}

impl Report<'_> {
    fn render(&self) -> String {
        let s = self.s;
        let n = rate(s.records as f64);
        // Met: partition 0's last checkpoint saved offsets at or past every neighbour
        // record, so its recovery reads none of them.
        let skipped_all = self
            .neighbours
            .iter()
            .all(|&q| offset_of(self.last_saved, q) >= self.ends_after[q as usize]);
        let (now, was) = (&self.now.measured, &self.was.measured);
        let (now_s, was_s) = (now.took_ms as f64 / 1e3, was.took_ms as f64 / 1e3);
        let time_ratio = times(was_s, now_s);
        let records_ratio = if now.outputs_read == 0 {
            "— (none now)".to_string()
        } else {
            times(was.outputs_read as f64, now.outputs_read as f64)
        };
        let ratios = if now.outputs_read == 0 {
            format!("{time_ratio} the time")
        } else {
            format!("{records_ratio} the records, {time_ratio} the time")
        };

        let column = |runs: &[(u64, f64, f64)], i: usize| -> Vec<f64> {
            runs.iter()
                .map(|r| match i {
                    0 => r.0 as f64,
                    _ => r.1,
                })
                .collect()
        };
        let (an, ab) = (column(self.alone_now, 1), column(self.alone_before, 1));
        let (anr, abr) = (column(self.alone_now, 0), column(self.alone_before, 0));
        let per_run: Vec<f64> = ab.iter().zip(&an).map(|(b, n)| b / n).collect();
        let (rlo, rhi) = min_max(&per_run);
        let (anlo, anhi) = min_max(&an);
        let (ablo, abhi) = min_max(&ab);
        let others: Vec<f64> = self
            .alone_now
            .iter()
            .chain(self.alone_before)
            .map(|r| r.2)
            .chain([self.now.others_cores, self.was.others_cores])
            .collect();

        let mut t = String::new();
        t.push_str(
            "## Recovery after the neighbours' outputs: what a partition reads back (issue 15 path 6)\n\n",
        );
        let _ = write!(
            t,
            "`cargo bench --bench recovery_cost`: `run_bridge` in one process on Apache Kafka \
             (`scripts/kafka.sh`, one KRaft node), {PARTITIONS} input and {PARTITIONS} output partitions, \
             `WATCHBRIDGE_GUARANTEE=recovery`, polls every second, checkpoints every 500 ms. \
             Input partition 0 has {WATCHES} live watches ({} outputs in all, written in the \
             first second, all on output partition{} {}); then a plain producer with the \
             bridge's settings wrote **{n} records** as fast as it went ({:.1} s, {} \
             records/s) to output partitions {} — ~{VALUE_BYTES}-byte values with the \
             bridge's three output headers naming input partitions 1–{}, standing in for the \
             outputs of the other partitions' watches (real watches would take minutes to \
             emit a million outputs; a recovery reads only the topic). The bridge ran on for \
             two reads of the output topic's end offsets (every {} s) and 2 s more, was \
             stopped (its last checkpoint) and started again with the same group, twice: on \
             its state topic (**now**), and on a copy of it whose partition 0 ends with the \
             output offsets a checkpoint kept **before the fix** (9396b8b: the last \
             checkpoint's for output partition 0, the first checkpoint's — the ends when the \
             partition was first assigned — for the partitions it never writes to). Both \
             restarts start from the state the first run left. Partition 0's recovery from \
             the bridge's log event (`partition state restored partition=0 … outputs_read=N \
             … took_ms=T`: output records read back, and the time from assignment to its \
             watches handed to the engine, reading its state partition included).\n\n",
            self.own_outputs,
            if self.own.len() == 1 { "" } else { "s" },
            list(self.own),
            self.wrote.as_secs_f64(),
            rate(s.records as f64 / self.wrote.as_secs_f64()),
            list(self.neighbours),
            PARTITIONS - 1,
            output_ends::INTERVAL.as_secs(),
        );
        t.push_str("| recovery of input partition 0 | output records read | seconds |\n");
        t.push_str("|---|---|---|\n");
        let _ = writeln!(
            t,
            "| now: offsets raised to the output topic's ends | {} | {now_s:.3} |",
            rate(now.outputs_read as f64)
        );
        let _ = writeln!(
            t,
            "| before the fix: the first checkpoint's offsets for output partitions {} | {} | {was_s:.3} |",
            list(self.neighbours),
            rate(was.outputs_read as f64)
        );
        let _ = writeln!(
            t,
            "| before / now | **{records_ratio}** | **{time_ratio}** |"
        );
        let _ = write!(
            t,
            "\nThe read alone ([`recovery::read`] of partition 0 from this process, the \
             partition task's blocking step; {} run(s) on each state topic, interleaved, \
             median and min–max): now {} records in {:.3} s ({anlo:.3}–{anhi:.3}), before \
             the fix {} records in {:.3} s ({ablo:.3}–{abhi:.3}); before / now {} (runs \
             {}–{}).\n\n",
            s.runs,
            rate(median(&anr)),
            median(&an),
            rate(median(&abr)),
            median(&ab),
            times(median(&ab), median(&an)),
            times(rlo, 1.0),
            times(rhi, 1.0),
        );
        let _ = write!(
            t,
            "Partition 0's saved output offsets (output partitions 0–{}): first checkpoint \
             {}; last checkpoint {}; the ends right after the neighbours' last record {}, at \
             the stop {}. {} What a recovery now reads is what was written after the last \
             read of the ends before its last checkpoint (watermark records; outputs of \
             partition 0's watches, if any). A recovery that reads no output record still \
             took ~{:.1} s here (now's, and the other partitions' below), of which the read \
             alone ~{:.2} s: the rest is spent outside [`recovery::read`] and not broken \
             down here.\n\n",
            PARTITIONS - 1,
            offsets(self.first_saved),
            offsets(self.last_saved),
            self.ends_after
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            self.ends_at_stop
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if skipped_all {
                "Every neighbour record lies below the last checkpoint's offsets: none is read \
                 again."
            } else {
                "**Some neighbour records lie at or above the last checkpoint's offsets: they \
                 are read again.**"
            },
            now_s,
            median(&an),
        );
        let others_line = |r: &Restart| {
            r.others
                .iter()
                .map(|o| {
                    format!(
                        "{}: {} records, {} ms",
                        o.partition,
                        rate(o.outputs_read as f64),
                        o.took_ms
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let _ = writeln!(
            t,
            "The other partitions' recoveries at the same restarts (no watches; their \
             offsets rose to the ends too): now {}; before the fix (their state as the first \
             run left it; what they read is what the restart before wrote since: watermark \
             records) {}. Each restored watch polled again and emitted nothing (0 outputs produced \
             after either restart).\n",
            others_line(self.now),
            others_line(self.was)
        );
        let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
        let _ = writeln!(
            t,
            "- machine: {}; cores busy besides this process and the broker during the \
             measured reads and recoveries: up to {:.2}",
            machine(),
            min_max(&others).1
        );
        let _ = writeln!(
            t,
            "- versions: {}, watchbridge {}, librdkafka {librdkafka}, broker Apache Kafka {} \
             (`scripts/kafka.sh`: one KRaft node, 512 MB heap)",
            command_output("rustc", &["-V"]),
            env!("CARGO_PKG_VERSION"),
            kafka_version()
        );
        let _ = writeln!(
            t,
            "- command: `{}` ({} s)",
            support::report::command_line(
                "recovery_cost",
                &["BENCH_SMOKE", "RECOVERY_COST_RECORDS", "RECOVERY_COST_RUNS"]
            ),
            self.elapsed.as_secs()
        );
        let _ = writeln!(t, "- date: {}", utc_now());
        t.push_str(&disturbed_note(&others));
        t.push_str(&summary_line(
            &format!(
                "recovery of a partition whose neighbours wrote {n} outputs since its last restart: records read, seconds"
            ),
            &format!(
                "{} records, {now_s:.2} s (before the fix: {} records, {was_s:.2} s; {ratios})",
                rate(now.outputs_read as f64),
                rate(was.outputs_read as f64),
            ),
            "reads only its own outputs",
            skipped_all,
        ));
        t
    }
}

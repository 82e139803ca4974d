//! End-to-end benchmark: the bridge's output rate and CPU per output against the strongest
//! plain producer of the same records on the same broker, as ratios with 95% intervals,
//! beside reference rows: the naive producer this bench compared with before, librdkafka's
//! own `rdkafka_performance`, and the broker's ingest rate (Apache Kafka's
//! `ProducerPerformance`). Run with `make bench` (or `cargo bench --bench e2e`);
//! `BENCH_SMOKE=1` only proves it runs (2,000 outputs, one run, Tansu only, no
//! `ProducerPerformance`).
//!
//! **Brokers** (`E2E_BROKER`: `tansu`, `kafka` or `both`, the default; a table each):
//! - Tansu, the test broker (`scripts/tansu.sh`), with memory storage (`E2E_STORAGE=sqlite`
//!   for SQLite), a fresh one per case and run (`tests/support/tansu_process.rs`): there the
//!   broker is far from its limit and the ratios compare the clients' CPU per record.
//! - Apache Kafka (`scripts/kafka.sh`: one KRaft node, 512 MB heap), one for the whole table
//!   (a JVM start per case would add ~7 s to each of 48), fresh topics for each case and run,
//!   deleted after it (no run reads another's).
//!
//! **Cases.** Each run runs every case once, in this order (the ratios pair each case with
//! the best producer of the same run), each in a process of its own (the bench runs itself
//! again for it), on fresh topics of P = 4 partitions (and a fresh consumer group):
//!
//! - **best producer** ([`support::producer::Fast`]): librdkafka at its best on the outputs
//!   the bridge writes (the same keys, values, event times as timestamps, partitions: each
//!   record to its key's partition by librdkafka's default partitioner, CRC-32, as the bridge
//!   writes each output to its input's partition): one producing thread per core
//!   (`E2E_PRODUCER_THREADS`), each with one client for its partitions
//!   (`E2E_PRODUCER_CLIENTS=partition`: one per partition, as the bridge has a producer per
//!   partition task: 15–25% slower here, 2026-12-07, with more librdkafka threads and
//!   smaller batches); the bridge's producer settings (`KafkaSettings::output_producer`,
//!   src/kafka/clients.rs: idempotent, `acks=all`, lz4, `linger.ms=5`, one request in
//!   flight per connection outside `exactly_once`; only its statistics every 5 s left out);
//!   `rd_kafka_produceva` by topic handle with an integer opaque and no copy of the value;
//!   deliveries counted in librdkafka's delivery callback; a full queue waited out in
//!   `rd_kafka_poll` (10 ms), never spun on. Warmed up first (a record per client, not
//!   counted: connection, metadata, producer id).
//! - **watchbridge**: [`run_bridge`] in this process (its topics created by it on Tansu,
//!   the `recovery` mode on both brokers — `BENCH_GUARANTEE` to change it; the transactions
//!   of `exactly_once` are priced by `benches/guarantee.rs` —, the default watermark strategy
//!   `bounded(5s)`) with a poller that serves prepared results: input `{"id": n}` → its
//!   first poll returns K outputs (distinct keys, event times, ~100-byte values), final. The
//!   N/K inputs are produced before the bridge starts (not timed).
//! - **watchbridge, through the repartition topic**: the same with
//!   `WATCHBRIDGE_WATCH_KEY=/id` (`WATCHBRIDGE_REPARTITION=auto`): each input goes through
//!   the repartition stage and `<group>.repartition` first (issue 51); its ratio to the
//!   `bounded(5s)` case is the cost of the two stages (target ≥ 0.8).
//! - **watchbridge, watermarks none**: the same with `WATCHBRIDGE_WATERMARK_STRATEGY=none`,
//!   to price the watermarks (records on the watermark topic and in every output partition).
//! - **naive producer** (the baseline before): one rdkafka `FutureProducer` (idempotent,
//!   `acks=all`, lz4, `linger.ms=5`) from one task, `send_result` per record (a oneshot and
//!   a boxed opaque each, the topic looked up by name), the oldest delivery awaited while
//!   the queue is full.
//! - **best producer with a `wb-id` header** on each record (what the Avro case writes;
//!   diagnostic).
//! - **watchbridge, Avro in and out** (`bounded(5s)`, `WATCHBRIDGE_INPUT_FORMAT=avro`,
//!   `WATCHBRIDGE_OUTPUT_FORMAT=avro`, the default envelope schema) through a
//!   [`RegistryServer`] of the run's own: the inputs are Confluent-framed datums of
//!   `{"type":"record","name":"User","fields":[{"name":"id","type":"long"}]}`, decoded by the
//!   bridge to the same `{"id": n}`; every output is an envelope datum (key, event time, the
//!   item as text) framed with the envelope's id, with a `wb-id` header.
//! - **rdkafka_performance** (`scripts/rdkafka-perf.sh`: librdkafka's own tool, built from the
//!   vendored sources against the bridge's static librdkafka): `-P -s 100 -c N` with
//!   `-X acks=all -X enable.idempotence=true -X compression.type=lz4 -X linger.ms=5` (one
//!   client, its default five requests in flight; its payload a repeated text, no key), by
//!   its own clock (first send, before its connection, → last delivery report).
//! - **physical limit**: `org.apache.kafka.tools.ProducerPerformance` (kafka-producer-perf-test,
//!   the kafka-tools jar of `scripts/kafka.sh`) with `--num-records N --record-size 100
//!   --throughput -1` and `acks=all enable.idempotence=true compression.type=lz4 linger.ms=5
//!   batch.size=1000000` (librdkafka's batch size: Java's 16 KB would make the client the
//!   limit), five requests in flight: what the broker ingests of such records, by the tool's
//!   own clock, where the Java client is not the limit itself. On Apache Kafka only, not in
//!   smoke runs (a JVM start). On 2 cores shared with the broker it is (3.6 µs of CPU per
//!   record with its JVM start, 2026-12-07), and the row is then the Java client's rate,
//!   below librdkafka's.
//!
//! **Timing.** Every case but the two tools is sampled the same way: its counters of records
//! handed to librdkafka and acknowledged (the bridge's `outputs_emitted` and
//! `outputs_produced`; the best producer's delivery callbacks; the naive producer's first
//! delivery future and its end), read every 2 ms, give two windows: **first ack → last
//! ack** (outputs acknowledged after the first / that time: the headline, free of start-up —
//! the bridge's group join, recovery and first poll) and **first send → last ack** (all N /
//! that time). The tools report their own rate (first send → last ack).
//!
//! **CPU per output**: user + system CPU of the case's process, from its own counters
//! (`getrusage(RUSAGE_SELF)`, every thread: for the bridge its consumers, producers and
//! tasks; for a producer its clients' threads) at the end of the window minus at its start,
//! over the outputs acknowledged in it. The tools': their whole process
//! (`getrusage(RUSAGE_CHILDREN)` around them), start-up included, over N.
//!
//! **Ratios** (bridge ÷ best producer, CPU ÷ CPU, `bounded(5s)` ÷ `none`) are taken run by
//! run and summarised by [`stats::paired_ratio`]: their geometric mean and its 95% interval
//! (Student's t over the runs). Targets are judged on the estimate; the interval shows how
//! sure it is.
//!
//! **Sizes**: `E2E_OUTPUTS` (N, default 2,000,000), `E2E_PER_WATCH` (K, default 100, so
//! 20,000 watches), `E2E_RUNS` (default 6). At the defaults the bench takes about 16 minutes
//! on 2 cores (one run of every case: ~80 s on Tansu, ~75 s on Kafka, measured with other
//! builds running, 2026-12-07); `BENCH_SMOKE=1` ~25 s. The tables (this bench's section of
//! `bench/RESULTS.md`, with the machine, the versions, the command and the date) go to
//! stdout. `E2E_LOG` sets the log filter (default `warn`); `E2E_ONLY=<case>` runs one case
//! in this process and prints its figures (for profiling).

use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use bytes::Bytes;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::ClientConfig;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use watchbridge::avro::registry_server::RegistryServer;
use watchbridge::avro::wire::frame;
use watchbridge::bridge::{run_bridge, StopSignal};
use watchbridge::clock::Millis;
use watchbridge::formats::{InputFormat, OutputFormat};
use watchbridge::kafka::records;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::{OutputKeyReader, RenderError, Resolve};
use watchbridge::seen::hash_key;

#[path = "support/mod.rs"]
mod support;

/// What the `watchbridge` binary allocates with, so the bridge here runs as it does there
/// (and librdkafka, which mimalloc's `override` serves too, for every case in this process).
#[global_allocator]
static GLOBAL: watchbridge::Allocator = watchbridge::Allocator;
use support::broker_process::{installed_path, BrokerProcess};
use support::cpu::{cpu_seconds, machine_cpu_seconds};
use support::kafka::{bridge_args, create_topic, input_id, produce_inputs, producer, InFlight};
use support::producer::{Clients, Fast, Record, ToolRun};
use support::report::{
    command_output, env_or, machine, median, min_max, now_ms, rate, summary_line, utc_now,
};
use support::stats::{self, paired_ratio, Interval};
use support::tansu_process::{tansu_bin, tansu_version, Storage};

/// A case: its id (`E2E_CASE`, `E2E_ONLY`), its name in the tables, whether a smoke run
/// runs it, and whether it runs on Apache Kafka only.
struct Case {
    id: &'static str,
    name: &'static str,
    smoke: bool,
    kafka_only: bool,
}

impl Case {
    /// Why this case is not run on `broker`, if it is not.
    fn skipped(&self, s: &Sizes, broker: Broker) -> Option<&'static str> {
        if self.kafka_only && broker != Broker::Kafka {
            Some("Apache Kafka only")
        } else if s.smoke && !self.smoke {
            Some("not in smoke runs")
        } else {
            None
        }
    }
}

/// The cases, in the order each run runs them.
const CASES: [Case; 9] = [
    Case {
        id: "producer",
        name: "best producer: librdkafka `produceva`, a thread per core",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "wm",
        name: "watchbridge, `bounded(5s)` (the default)",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "repartition",
        name: "watchbridge through the repartition topic (`WATCHBRIDGE_WATCH_KEY`)",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "nowm",
        name: "watchbridge, watermarks `none`",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "naive",
        name: "naive producer: rdkafka `FutureProducer`, one task",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "producer-headers",
        name: "best producer with a `wb-id` header (diagnostic)",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "avro",
        name: "watchbridge, Avro in and out, `bounded(5s)`",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "rdkafka-perf",
        name: "librdkafka's `rdkafka_performance` (one client)",
        smoke: true,
        kafka_only: false,
    },
    Case {
        id: "java-perf",
        name: "physical limit: Kafka's `ProducerPerformance`",
        smoke: false,
        kafka_only: true,
    },
];

/// Index of case `id` in [`CASES`].
fn case(id: &str) -> usize {
    CASES
        .iter()
        .position(|c| c.id == id)
        .unwrap_or_else(|| panic!("no case {id:?}"))
}

/// What a bridge case reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// JSON inputs, the items as they are out (the defaults).
    Json,
    /// Avro in (the Confluent wire format, [`INPUT_SCHEMA`]) and out (the envelope schema),
    /// through a registry of its own.
    Avro,
    /// JSON, with `WATCHBRIDGE_WATCH_KEY=/id`: through the repartition topic.
    Repartitioned,
}

/// The Avro case's input schema: its datums map to the JSON case's inputs, `{"id": n}`.
const INPUT_SCHEMA: &str =
    r#"{"type":"record","name":"User","fields":[{"name":"id","type":"long"}]}"#;

/// Partitions of every topic.
const PARTITIONS: i32 = 4;
/// Size of each output's value, in bytes.
const VALUE_BYTES: usize = 100;

/// The broker a table is measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broker {
    /// A fresh Tansu per case and run, with this storage.
    Tansu(Storage),
    /// One Apache Kafka node for the table.
    Kafka,
}

impl Broker {
    fn id(self) -> &'static str {
        match self {
            Broker::Tansu(_) => "tansu",
            Broker::Kafka => "kafka",
        }
    }

    fn describe(self) -> String {
        match self {
            Broker::Tansu(storage) => format!("Tansu, {}", storage.describe()),
            Broker::Kafka => "Apache Kafka, one KRaft node".into(),
        }
    }

    /// How [`produce_inputs`] should write inputs here: one record per batch only on Tansu's
    /// memory storage (which cannot fetch from inside a batch); batched elsewhere.
    fn input_storage(self) -> Storage {
        match self {
            Broker::Tansu(storage) => storage,
            Broker::Kafka => Storage::Sqlite,
        }
    }
}

struct Sizes {
    smoke: bool,
    storage: Storage,
    brokers: Vec<Broker>,
    outputs: usize,
    per_watch: usize,
    runs: usize,
    /// The best producer's threads and clients.
    threads: usize,
    clients: Clients,
}

impl Sizes {
    fn watches(&self) -> usize {
        self.outputs / self.per_watch
    }
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in seconds (used by `make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let (outputs, runs) = if smoke { (2_000, 1) } else { (2_000_000, 6) };
    let storage = match std::env::var("E2E_STORAGE").as_deref() {
        Err(_) | Ok("memory") => Storage::Memory,
        Ok("sqlite") => Storage::Sqlite,
        Ok(other) => panic!("E2E_STORAGE={other}: expected `memory` (the default) or `sqlite`"),
    };
    // Smoke runs stay on Tansu: the Kafka-broker cases are smoke-tested by vs_java and
    // guarantee, and a Kafka start is ~10 s.
    let default_brokers = if smoke { "tansu" } else { "both" };
    let brokers = match std::env::var("E2E_BROKER")
        .unwrap_or_else(|_| default_brokers.into())
        .as_str()
    {
        "tansu" => vec![Broker::Tansu(storage)],
        "kafka" => vec![Broker::Kafka],
        "both" => vec![Broker::Tansu(storage), Broker::Kafka],
        other => panic!("E2E_BROKER={other}: expected `tansu`, `kafka` or `both`"),
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let clients = match std::env::var("E2E_PRODUCER_CLIENTS").as_deref() {
        Err(_) | Ok("thread") => Clients::PerThread,
        Ok("partition") => Clients::PerPartition,
        Ok(other) => {
            panic!("E2E_PRODUCER_CLIENTS={other}: expected `thread` (the default) or `partition`")
        }
    };
    let s = Sizes {
        smoke,
        storage,
        brokers,
        outputs: env_or("E2E_OUTPUTS", outputs),
        per_watch: env_or("E2E_PER_WATCH", 100),
        runs: env_or("E2E_RUNS", runs),
        threads: env_or("E2E_PRODUCER_THREADS", cores),
        clients,
    };
    assert!(
        s.per_watch >= 1 && s.runs >= 1 && s.threads >= 1 && s.outputs >= s.per_watch,
        "E2E_PER_WATCH, E2E_RUNS and E2E_PRODUCER_THREADS must be at least 1, E2E_OUTPUTS at \
         least E2E_PER_WATCH"
    );
    assert!(
        s.outputs.is_multiple_of(s.per_watch),
        "E2E_OUTPUTS ({}) must be a multiple of E2E_PER_WATCH ({})",
        s.outputs,
        s.per_watch
    );
    s
}

/// The bridge's guarantee in this bench: `recovery` unless `BENCH_GUARANTEE` says otherwise.
fn guarantee() -> String {
    std::env::var("BENCH_GUARANTEE").unwrap_or_else(|_| "recovery".into())
}

/// The bridge's output producer settings (`KafkaSettings::output_producer`,
/// src/kafka/clients.rs) for `bootstrap` on `broker`, its statistics aside: idempotent,
/// `acks=all`, lz4, `linger.ms=5`, and one request in flight per connection unless the
/// guarantee is `exactly_once` (`auto` is that on Kafka).
fn bridge_producer_settings(bootstrap: &str, broker: Broker) -> Vec<(String, String)> {
    let mut settings: Vec<(String, String)> = [
        ("bootstrap.servers", bootstrap),
        ("linger.ms", "5"),
        ("compression.type", "lz4"),
        ("enable.idempotence", "true"),
        ("acks", "all"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let exactly_once = match guarantee().as_str() {
        "exactly_once" => true,
        "auto" => broker == Broker::Kafka,
        _ => false,
    };
    if !exactly_once {
        settings.push(("max.in.flight.requests.per.connection".into(), "1".into()));
    }
    settings
}

// ---------------------------------------------------------------------------------------
// The workload: N outputs, K per watch, the same for every case.

/// Every watch's outputs, prepared before anything is timed.
struct Workload {
    /// `results[n]`: what watch `n`'s first (and only) poll returns.
    results: Vec<PollResult>,
    /// `keys[n]`: watch `n`'s key (the input's record key, and so its outputs' key).
    keys: Vec<String>,
}

impl Workload {
    /// Output `j` of watch `n` happened at `base + j` ms.
    fn new(s: &Sizes, base: Millis) -> Self {
        let mut results = Vec::with_capacity(s.watches());
        let mut keys = Vec::with_capacity(s.watches());
        for n in 0..s.watches() {
            let outputs = (0..s.per_watch)
                .map(|j| {
                    let event_time = base + j as Millis;
                    // The item carries its key, as an API's items carry their ids (what
                    // a recovery reads an output's identity back from).
                    let mut value = format!(
                        r#"{{"id":"item-{n}-{j}","watch":{n},"item":{j},"at":{event_time},"pad":""#
                    );
                    let pad = VALUE_BYTES.saturating_sub(value.len() + 2);
                    value.extend(std::iter::repeat_n('x', pad));
                    value.push_str("\"}");
                    Output::new(format!("item-{n}-{j}"), value, event_time)
                })
                .collect();
            results.push(PollResult::complete(outputs));
            keys.push(format!("watch-{n:06}"));
        }
        Workload { results, keys }
    }
}

/// Serves the prepared results: input `{"id": n}` → watch `n`'s outputs, final.
struct Prepared {
    results: Arc<Vec<PollResult>>,
}

impl Poller for Prepared {
    type Input = usize;

    fn poll(
        &self,
        input: Arc<usize>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let result = self
            .results
            .get(*input)
            .cloned()
            .ok_or_else(|| PollError::permanent("unknown", format!("no watch {input}")));
        std::future::ready(result)
    }
}

impl Resolve for Prepared {
    fn resolve(&self, value: &Value, _key: &[u8]) -> Result<usize, RenderError> {
        input_id(value)
    }

    /// An output's key is its item's `id`, as with the HTTP poller's `/id`.
    fn output_key_reader(&self) -> Option<OutputKeyReader> {
        Some(Arc::new(|value: &[u8]| {
            let item: Value = serde_json::from_slice(value).ok()?;
            Some(item.get("id")?.as_str()?.to_owned().into())
        }))
    }
}

impl Workload {
    /// The outputs as the best producer's records: each to its key's partition by
    /// librdkafka's default partitioner (CRC-32 of the key), where its input went and so
    /// where the bridge writes it; with `headers`, the `wb-id` header the Avro case writes.
    fn records(&self, headers: bool) -> Vec<Record> {
        let mut records = Vec::with_capacity(self.results.iter().map(|r| r.outputs.len()).sum());
        for (result, key) in self.results.iter().zip(&self.keys) {
            let partition = (crc32fast::hash(key.as_bytes()) % PARTITIONS as u32) as i32;
            let key = Bytes::copy_from_slice(key.as_bytes());
            for output in &result.outputs {
                let header = headers.then(|| {
                    let id = records::recovery_id(hash_key(&output.key), partition);
                    (records::RECOVERY_ID, Bytes::copy_from_slice(&id))
                });
                records.push(Record {
                    partition,
                    key: key.clone(),
                    value: output.value.clone(),
                    timestamp: output.event_time,
                    header,
                });
            }
        }
        records
    }
}

// ---------------------------------------------------------------------------------------
// Measuring: CPU of this process and of the broker, and the windows.

/// User + system CPU of this process (every thread), seconds, from its own counters
/// (`getrusage(RUSAGE_SELF)`: microseconds, where /proc counts 10 ms ticks).
fn own_cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU time of this process and of the broker, to tell which one a case keeps busy.
#[derive(Clone)]
struct Cpu {
    broker_pid: String,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    own: f64,
    broker: f64,
    /// CPU time of the whole machine (every process, every core).
    machine: f64,
}

impl Cpu {
    fn sample(&self) -> Sample {
        Sample {
            at: Instant::now(),
            own: own_cpu_seconds(),
            broker: cpu_seconds(&self.broker_pid),
            machine: machine_cpu_seconds(),
        }
    }
}

impl Sample {
    /// Cores busy from `self` to `later`: this process (or `own` CPU seconds of a tool's),
    /// the broker, and everything else on the machine (another build or benchmark would
    /// disturb the figures).
    fn cores_until(&self, later: &Sample, own: Option<f64>) -> Cores {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let own = own.unwrap_or(later.own - self.own) / wall;
        let broker = (later.broker - self.broker) / wall;
        let machine = (later.machine - self.machine) / wall;
        Cores {
            own,
            broker,
            others: (machine - own - broker).max(0.0),
        }
    }
}

#[derive(Clone, Copy)]
struct Cores {
    own: f64,
    broker: f64,
    others: f64,
}

/// One case's figures from one run. NaN where a case does not have the figure (the tools
/// have one window, their own).
struct Measured {
    /// Outputs per second, first acknowledgement → last (the outputs after the first).
    rate_ack: f64,
    /// Outputs per second, first send → last acknowledgement (all N).
    rate_send: f64,
    /// CPU µs per output of the case's process over each window.
    cpu_ack: f64,
    cpu_send: f64,
    /// Cores busy over the first-ack window (the tools: their whole run).
    cores: Cores,
    /// State records the bridge wrote in all.
    state_records: Option<u64>,
}

impl Measured {
    /// The figures of `n` outputs from the samples at the first send, at the first
    /// acknowledgement (with `acked` outputs acknowledged by then) and at the last.
    fn of(n: u64, first_send: &Sample, first_ack: &Sample, acked: u64, end: &Sample) -> Self {
        let secs = |a: &Sample| end.at.duration_since(a.at).as_secs_f64().max(1e-9);
        let after = n.saturating_sub(acked);
        Measured {
            // No window where the first sample saw every output acknowledged (a tiny N).
            rate_ack: if after == 0 {
                f64::NAN
            } else {
                after as f64 / secs(first_ack)
            },
            rate_send: n as f64 / secs(first_send),
            cpu_ack: stats::cpu_us_per_record(end.own - first_ack.own, after),
            cpu_send: stats::cpu_us_per_record(end.own - first_send.own, n),
            cores: first_ack.cores_until(end, None),
            state_records: None,
        }
    }
}

/// The samples taken as a case's counters move, read every 2 ms (the same for every
/// case): at the first record sent, at the first acknowledged, at the N-th acknowledged.
#[derive(Default)]
struct Windows {
    first_send: Option<Sample>,
    first_ack: Option<(Sample, u64)>,
}

impl Windows {
    /// One reading of the counters; the figures once `acked` reaches `n`.
    fn tick(&mut self, cpu: &Cpu, sent: u64, acked: u64, n: u64) -> Option<Measured> {
        let moved = (self.first_send.is_none() && sent > 0)
            || (self.first_ack.is_none() && acked > 0)
            || acked >= n;
        if !moved {
            return None;
        }
        let now = cpu.sample();
        if self.first_send.is_none() && (sent > 0 || acked > 0) {
            self.first_send = Some(now);
        }
        if self.first_ack.is_none() && acked > 0 {
            self.first_ack = Some((now, acked));
        }
        if acked < n {
            return None;
        }
        let (first_ack, acked) = self.first_ack.expect("set once acked moved");
        let first_send = self.first_send.expect("set once sent moved");
        Some(Measured::of(n, &first_send, &first_ack, acked, &now))
    }
}

/// How often the windows' counters are read.
const TICK: Duration = Duration::from_millis(2);

/// How long a case may take for `n` outputs before the bench gives up on it (a stall fails
/// the bench instead of hanging it).
fn limit(n: u64) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(n / 2)
}

// ---------------------------------------------------------------------------------------
// The cases.

/// The best producer ([`Fast`]) writing the workload's outputs to `topic` (made already; with
/// the `wb-id` header if `headers`).
fn best_producer(
    s: &Sizes,
    broker: Broker,
    bootstrap: &str,
    cpu: &Cpu,
    work: &Workload,
    topic: &str,
    headers: bool,
) -> Measured {
    let records = work.records(headers);
    let n = records.len() as u64;
    let fast = Fast::start(
        bridge_producer_settings(bootstrap, broker),
        topic,
        PARTITIONS,
        s.threads,
        s.clients,
        records,
    );
    let mut windows = Windows::default();
    let began = Instant::now();
    fast.go();
    let measured = loop {
        let (sent, acked) = (fast.progress.sent(), fast.progress.acked());
        if let Some(m) = windows.tick(cpu, sent, acked, n) {
            break m;
        }
        if let Some(failure) = fast.progress.failure() {
            panic!("best producer: {failure}");
        }
        if fast.ended() && fast.progress.acked() < n {
            // A thread that panicked: its panic, from `join`.
            fast.join();
            panic!("best producer: its threads ended after {acked} of {n} acknowledged");
        }
        assert!(
            began.elapsed() < limit(n),
            "best producer: {acked} of {n} acknowledged after {:?} ({sent} sent)",
            limit(n)
        );
        std::thread::sleep(TICK);
    };
    fast.join();
    measured
}

/// The naive producer: one rdkafka `FutureProducer`, one task, `send_result` per record.
/// Its first delivery future is awaited by a task of its own (the first-ack sample), the
/// rest in order.
async fn naive_producer(bootstrap: &str, cpu: &Cpu, work: &Workload, topic: &str) -> Measured {
    create_topic(bootstrap, topic, PARTITIONS).await;
    let producer = producer(bootstrap);
    // The idempotent producer's setup (InitProducerId) and the topic's metadata, not timed.
    let warm = producer
        .send(
            FutureRecord::<str, [u8]>::to(topic)
                .key("warm-up")
                .payload(b"".as_slice()),
            Duration::from_secs(10),
        )
        .await;
    if let Err((e, _)) = warm {
        panic!("naive producer's warm-up record to {topic}: {e}");
    }
    let n: usize = work.results.iter().map(|r| r.outputs.len()).sum();
    let mut in_flight = InFlight::new("naive producer");
    let first_ack: Arc<Mutex<Option<Sample>>> = Arc::default();
    let mut first_ack_task = None;
    let first_send = cpu.sample();
    for (result, key) in work.results.iter().zip(&work.keys) {
        for output in &result.outputs {
            let record = FutureRecord::to(topic)
                .key(key.as_str())
                .payload(output.value.as_ref())
                .timestamp(output.event_time);
            if first_ack_task.is_none() {
                let delivery = producer
                    .send_result(record)
                    .unwrap_or_else(|(e, _)| panic!("naive producer: the first record: {e}"));
                let (cpu, first_ack) = (cpu.clone(), first_ack.clone());
                first_ack_task = Some(tokio::spawn(async move {
                    let outcome = delivery.await;
                    *first_ack.lock().unwrap() = Some(cpu.sample());
                    outcome
                }));
                continue;
            }
            in_flight.send(&producer, record).await;
        }
    }
    in_flight.delivered().await;
    let end = cpu.sample();
    let first = first_ack_task
        .expect("at least one record")
        .await
        .expect("the first delivery's task");
    InFlight::new("naive producer").check(first);
    let first_ack = first_ack
        .lock()
        .unwrap()
        .expect("sampled at the first delivery");
    Measured::of(n as u64, &first_send, &first_ack, 1, &end)
}
/// The inputs `{"id": n}` as Confluent-framed Avro datums of [`INPUT_SCHEMA`], registered
/// first in `registry` under `<topic>-value` (the subject a Confluent producer uses).
fn avro_inputs(registry: &RegistryServer, topic: &str, keys: &[String]) -> Vec<(String, Vec<u8>)> {
    let id = registry.register(&format!("{topic}-value"), INPUT_SCHEMA);
    let schema = Schema::parse_str(INPUT_SCHEMA).expect("the input schema parses");
    let writer = GenericDatumWriter::builder(&schema)
        .build()
        .expect("a datum writer for the input schema");
    keys.iter()
        .enumerate()
        .map(|(n, key)| {
            let value = Avro::Record(vec![("id".into(), Avro::Long(n as i64))]);
            let datum = writer
                .write_value_to_vec(value)
                .unwrap_or_else(|e| panic!("input {n} as Avro: {e}"));
            (key.clone(), frame(id, &datum))
        })
        .collect()
}

/// The bridge with `watermarks` as its strategy, reading and writing `format`: the N/K
/// inputs produced first (not timed), then its windows ([`Windows`]: `outputs_emitted` is
/// counted as a poll's new outputs are handed on to be produced, `outputs_produced` as they
/// are acknowledged), and the state records it wrote in all.
async fn bridge(
    bootstrap: &str,
    cpu: &Cpu,
    work: &Arc<Workload>,
    id: &str,
    watermarks: &str,
    format: Format,
    broker: Broker,
) -> Measured {
    let mut args = bridge_args(bootstrap, &format!("bench-e2e-{id}"), PARTITIONS);
    args.watermark_strategy = watermarks.into();
    args.guarantee = guarantee();
    // Avro: a registry of its own for this run, serving on the bench's runtime (the bridge
    // asks it for the input schema once and registers the envelope at start).
    if format == Format::Repartitioned {
        args.watch_key = Some("/id".into());
        args.repartition = "auto".into();
    }
    let registry = match format {
        Format::Json | Format::Repartitioned => None,
        Format::Avro => {
            let registry = RegistryServer::start(([127, 0, 0, 1], 0).into())
                .unwrap_or_else(|e| panic!("start the schema registry: {e}"));
            args.formats.input_format = InputFormat::Avro;
            args.formats.output_format = OutputFormat::Avro;
            args.formats.schema_registry_url = Some(registry.url());
            Some(registry)
        }
    };
    let config = args
        .check(std::iter::empty())
        .unwrap_or_else(|e| panic!("bench bridge config: {e}"));
    // The bridge makes the rest of its topics, as a user's would (its start waits for their
    // leaders: before it did, about half the starts on a fresh Kafka topic stopped with
    // `NotLeaderForPartition`).
    create_topic(bootstrap, &config.input_topic, PARTITIONS).await;
    let inputs: Vec<(String, Vec<u8>)> = match &registry {
        None => work
            .keys
            .iter()
            .enumerate()
            .map(|(n, key)| (key.clone(), format!(r#"{{"id": {n}}}"#).into_bytes()))
            .collect(),
        Some(registry) => avro_inputs(registry, &config.input_topic, &work.keys),
    };
    produce_inputs(
        bootstrap,
        &config.input_topic,
        broker.input_storage(),
        inputs.into_iter(),
    )
    .await;

    let n = work.results.iter().map(|r| r.outputs.len()).sum::<usize>() as u64;
    let poller = Arc::new(Prepared {
        results: Arc::new(work.results.clone()),
    });
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(StopSignal::default());
    let run = run_bridge(
        bootstrap,
        None,
        &config,
        poller,
        metrics.clone(),
        stop.clone(),
    );
    let measure = async {
        let began = Instant::now();
        let mut windows = Windows::default();
        let measured = loop {
            let sent = metrics.outputs_emitted.get();
            let produced = metrics.outputs_produced.get();
            if let Some(m) = windows.tick(cpu, sent, produced, n) {
                break m;
            }
            if began.elapsed() > limit(n) {
                stop.stop();
                panic!(
                    "bridge ({watermarks}, {format:?}): {produced} of {n} outputs produced after \
                     {:?}; inputs consumed {}, watches started {}, active {}, outputs \
                     emitted {sent}",
                    limit(n),
                    metrics.inputs_consumed.get(),
                    metrics.watches_started.get(),
                    metrics.watches_active.get(),
                );
            }
            tokio::time::sleep(TICK).await;
        };
        stop.stop();
        measured
    };
    // A bridge that ends before its outputs are all produced (a start that failed) fails the
    // bench at once, with its error.
    let (mut run, mut measure) = (std::pin::pin!(run), std::pin::pin!(measure));
    let (result, mut measured) = tokio::select! {
        measured = &mut measure => (run.await, measured),
        result = &mut run => panic!(
            "the bridge ({watermarks}, {format:?}) ended after {} of {n} outputs: {}",
            metrics.outputs_produced.get(),
            result.err().map_or("without an error".into(), |e| e.to_string())
        ),
    };
    if let Err(e) = result {
        panic!("the bridge ({watermarks}, {format:?}) failed: {e}");
    }
    drop(registry);
    let produced = metrics.outputs_produced.get();
    assert_eq!(
        produced, n,
        "bridge ({watermarks}, {format:?}): outputs produced in all"
    );
    // A late output carries a header the others do not: the cases would not compare.
    assert_eq!(
        metrics.late_outputs.get(),
        0,
        "bridge ({watermarks}, {format:?}): outputs marked late"
    );
    measured.state_records = Some(metrics.state_records_written.get());
    measured
}

/// A reference tool's run as a case's figures: its own rate (first send → last ack) and
/// its whole process's CPU over the N records; the cores over its run.
fn tool_measured(n: u64, run: ToolRun, before: &Sample, after: &Sample) -> Measured {
    Measured {
        rate_ack: f64::NAN,
        rate_send: run.rate,
        cpu_ack: f64::NAN,
        cpu_send: stats::cpu_us_per_record(run.cpu_seconds, n),
        cores: before.cores_until(after, Some(run.cpu_seconds)),
        state_records: None,
    }
}

/// librdkafka's `rdkafka_performance` producing N messages of [`VALUE_BYTES`] to `topic`.
fn rdkafka_perf(
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    cpu: &Cpu,
    n: u64,
    topic: &str,
) -> Measured {
    let bin = installed_path(
        "rdkafka-perf.sh",
        "it builds rdkafka_performance from the vendored librdkafka (needs gcc)",
    );
    runtime.block_on(create_topic(bootstrap, topic, PARTITIONS));
    let settings = [
        ("acks", "all"),
        ("enable.idempotence", "true"),
        ("compression.type", "lz4"),
        ("linger.ms", "5"),
    ];
    let before = cpu.sample();
    let run =
        support::producer::rdkafka_performance(&bin, bootstrap, topic, n, VALUE_BYTES, &settings);
    let after = cpu.sample();
    tool_measured(n, run, &before, &after)
}

/// Apache Kafka's `ProducerPerformance` producing N records of [`VALUE_BYTES`] to `topic`.
fn java_perf(
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    cpu: &Cpu,
    n: u64,
    topic: &str,
) -> Measured {
    let libs = installed_path("kafka.sh", "or set KAFKA_LIBS to a dir of Kafka's jars");
    let classpath = format!("{}/*", libs.display());
    runtime.block_on(create_topic(bootstrap, topic, PARTITIONS));
    let props: Vec<(String, String)> = [
        ("bootstrap.servers", bootstrap),
        ("acks", "all"),
        ("enable.idempotence", "true"),
        ("compression.type", "lz4"),
        ("linger.ms", "5"),
        ("batch.size", "1000000"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let before = cpu.sample();
    let run =
        support::producer::kafka_producer_performance(&classpath, topic, n, VALUE_BYTES, &props);
    let after = cpu.sample();
    tool_measured(n, run, &before, &after)
}

/// Deletes every topic whose name starts with `prefix` (a case's topics on the table's
/// Kafka, once measured: two million records a case would fill the disk over a bench).
async fn delete_topics(bootstrap: &str, prefix: &str) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("create a Kafka client");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("list the topics to delete: {e}"));
    let names: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|name| name.starts_with(prefix))
        .collect();
    if names.is_empty() {
        return;
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("create a Kafka admin client");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin
        .delete_topics(&names, &options)
        .await
        .unwrap_or_else(|e| panic!("DeleteTopics {names:?}: {e}"))
    {
        if let Err((topic, code)) = result {
            panic!("DeleteTopics {topic}: {code}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// One case in a process of its own.

fn command_line() -> String {
    support::report::command_line(
        "e2e",
        &[
            "BENCH_SMOKE",
            "BENCH_GUARANTEE",
            "E2E_BROKER",
            "E2E_STORAGE",
            "E2E_OUTPUTS",
            "E2E_PER_WATCH",
            "E2E_RUNS",
            "E2E_PRODUCER_THREADS",
            "E2E_PRODUCER_CLIENTS",
        ],
    )
}

/// The variable that makes this bench run one case once, as a child of the bench, and
/// print its figures on a line of stdout that starts with [`RESULT`]; [`BROKER`] says on
/// which broker (and for Kafka, [`KAFKA`] which one: `bootstrap pid`).
const CHILD: &str = "E2E_CASE";
const BROKER: &str = "E2E_CASE_BROKER";
const KAFKA: &str = "E2E_CASE_KAFKA";
const RESULT: &str = "e2e-result";

impl Measured {
    fn to_line(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {}",
            self.rate_ack,
            self.rate_send,
            self.cpu_ack,
            self.cpu_send,
            self.cores.own,
            self.cores.broker,
            self.cores.others,
            self.state_records.map_or(-1, |n| n as i64)
        )
    }

    fn from_line(line: &str) -> Option<Self> {
        let f: Vec<f64> = line
            .split_whitespace()
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        let [rate_ack, rate_send, cpu_ack, cpu_send, own, broker, others, state] = f[..] else {
            return None;
        };
        Some(Self {
            rate_ack,
            rate_send,
            cpu_ack,
            cpu_send,
            cores: Cores {
                own,
                broker,
                others,
            },
            state_records: (state >= 0.0).then_some(state as u64),
        })
    }
}

/// A running Kafka's address and pid, for the cases run on it.
struct KafkaAt {
    bootstrap: String,
    pid: String,
}

/// Run `case` once in a child process (this bench again, with [`CHILD`]), whose process id
/// keeps its topics and group apart from every other run's.
fn case_in_child(case: &str, broker: Broker, kafka: Option<&KafkaAt>) -> Measured {
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut command = std::process::Command::new(exe);
    command
        .arg("--bench")
        .env(CHILD, case)
        .env(BROKER, broker.id())
        .env("E2E_RUNS", "1")
        .stderr(std::process::Stdio::inherit());
    if let Some(k) = kafka {
        command.env(KAFKA, format!("{} {}", k.bootstrap, k.pid));
    }
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run the {case} case: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| Measured::from_line(l.strip_prefix(RESULT)?))
        .unwrap_or_else(|| {
            panic!(
                "the {case} case printed no result ({}):\n{stdout}",
                out.status
            )
        })
}

/// One case, once. On Tansu, on a broker of its own (Tansu's SQLite storage has no index on
/// its header table, so every record it fetches costs a scan of every header stored so
/// far, on any topic; one broker for the whole bench would slow each case by the ones
/// before it, and starve consumer-group heartbeats); on Kafka, on the table's, its topics
/// deleted after it.
fn run_case(
    s: &Sizes,
    broker: Broker,
    kafka: Option<&KafkaAt>,
    case: &str,
    run: usize,
) -> Measured {
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    // Event times after every input's time (an hour from now): late under neither
    // strategy. Under `none` the watermark is the watches' holds, which start at their
    // inputs' times; outputs from before those would be marked late (a header each), and
    // the `none` case would measure the marking instead of the watermark's cost.
    let work = Arc::new(Workload::new(s, now_ms() + 3_600_000));
    let n = s.outputs as u64;
    let tansu = match broker {
        Broker::Tansu(storage) => Some(
            BrokerProcess::tansu(&tansu_bin(), storage, "watchbridge-bench-tansu-")
                .unwrap_or_else(|e| panic!("{e}")),
        ),
        Broker::Kafka => None,
    };
    let (bootstrap, broker_pid) = match (&tansu, kafka) {
        (Some(t), _) => (t.bootstrap.clone(), t.pid()),
        (None, Some(k)) => (k.bootstrap.clone(), k.pid.clone()),
        (None, None) => panic!("a case on Kafka needs the table's Kafka ({KAFKA})"),
    };
    let cpu = Cpu { broker_pid };
    let id = format!("{}-{run}-{case}", std::process::id());
    let topic = format!("bench-e2e-{id}");
    let m = match case {
        "producer" | "producer-headers" => {
            runtime.block_on(create_topic(&bootstrap, &topic, PARTITIONS));
            let headers = case == "producer-headers";
            best_producer(s, broker, &bootstrap, &cpu, &work, &topic, headers)
        }
        "naive" => runtime.block_on(naive_producer(&bootstrap, &cpu, &work, &topic)),
        "rdkafka-perf" => rdkafka_perf(&runtime, &bootstrap, &cpu, n, &topic),
        "java-perf" => java_perf(&runtime, &bootstrap, &cpu, n, &topic),
        bridge_case => {
            let (wm, format) = match bridge_case {
                "wm" => ("bounded(5s)", Format::Json),
                "repartition" => ("bounded(5s)", Format::Repartitioned),
                "avro" => ("bounded(5s)", Format::Avro),
                "nowm" => ("none", Format::Json),
                other => panic!("no case {other:?}"),
            };
            runtime.block_on(bridge(&bootstrap, &cpu, &work, &id, wm, format, broker))
        }
    };
    if broker == Broker::Kafka {
        runtime.block_on(delete_topics(&bootstrap, &topic));
    }
    drop(tansu);
    m
}

// ---------------------------------------------------------------------------------------
// The report.

/// One table's runs: `results[i]`, case `i`'s figures, one per run (none for a case not run).
struct Table {
    broker: Broker,
    results: Vec<Vec<Measured>>,
}

impl Table {
    fn column(&self, id: &str, figure: impl Fn(&Measured) -> f64) -> Vec<f64> {
        self.results[case(id)].iter().map(figure).collect()
    }

    /// `id`'s figure ÷ `base`'s, run by run.
    fn ratio(&self, id: &str, base: &str, figure: impl Fn(&Measured) -> f64 + Copy) -> Interval {
        paired_ratio(&self.column(id, figure), &self.column(base, figure))
    }

    /// The median of `id`'s figure.
    fn median(&self, id: &str, figure: impl Fn(&Measured) -> f64) -> f64 {
        median(&self.column(id, figure))
    }

    /// `median (min–max)` of a rate, or `—` where the case has none.
    fn rate_cell(&self, id: &str, figure: impl Fn(&Measured) -> f64 + Copy) -> String {
        let v = self.column(id, figure);
        if v.iter().any(|x| x.is_nan()) {
            return "—".into();
        }
        let (lo, hi) = min_max(&v);
        format!("{} ({}–{})", rate(median(&v)), rate(lo), rate(hi))
    }

    fn cpu_cell(&self, id: &str, figure: impl Fn(&Measured) -> f64 + Copy) -> String {
        let v = self.column(id, figure);
        if v.iter().any(|x| x.is_nan()) {
            return "—".into();
        }
        let (lo, hi) = min_max(&v);
        format!("{:.2} ({lo:.2}–{hi:.2})", median(&v))
    }
}

fn rate_ack(m: &Measured) -> f64 {
    m.rate_ack
}
fn rate_send(m: &Measured) -> f64 {
    m.rate_send
}
fn cpu_ack(m: &Measured) -> f64 {
    m.cpu_ack
}
fn cpu_send(m: &Measured) -> f64 {
    m.cpu_send
}

/// The section of one broker's table, its summary lines included.
fn section(s: &Sizes, t: &Table) -> String {
    let broker = t.broker.describe();
    let mut out = String::new();
    out.push_str(&format!("### On {broker}\n\n"));
    out.push_str(&format!(
        "{} outputs ({} watches x {} outputs, ~{VALUE_BYTES}-byte values), {PARTITIONS} \
         partitions, {} run(s), every case once per run in the order below, each in a process \
         of its own; median (min–max) over the runs. The best producer: {} thread(s), {}.\n\n",
        s.outputs,
        s.watches(),
        s.per_watch,
        s.runs,
        s.threads,
        s.clients.name(),
    ));
    out.push_str(
        "| case | outputs/s, first ack → last ack | CPU µs/output | outputs/s, first send → \
         last ack | CPU µs/output | ÷ best producer (outputs/s; 95% interval) |\n|---|---|---|---|---|---|\n",
    );
    for c in &CASES {
        if let Some(why) = c.skipped(s, t.broker) {
            out.push_str(&format!("| {} | not run ({why}) | | | | |\n", c.name));
            continue;
        }
        // The tools have their own window only (first send → last ack).
        let tool = t.column(c.id, rate_ack).iter().any(|x| x.is_nan());
        let against = if c.id == "producer" {
            "1".into()
        } else if tool {
            format!(
                "{} (first send)",
                t.ratio(c.id, "producer", rate_send).show(2, "pairs")
            )
        } else {
            t.ratio(c.id, "producer", rate_ack).show(2, "pairs")
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {}{} | {against} |\n",
            c.name,
            t.rate_cell(c.id, rate_ack),
            t.cpu_cell(c.id, cpu_ack),
            t.rate_cell(c.id, rate_send),
            t.cpu_cell(c.id, cpu_send),
            if tool { " (whole process)" } else { "" },
        ));
    }

    // The ratios, with their intervals and targets.
    let e2e = t.ratio("wm", "producer", rate_ack);
    let e2e_send = t.ratio("wm", "producer", rate_send);
    let cpu = t.ratio("wm", "producer", cpu_ack);
    let none = t.ratio("nowm", "producer", rate_ack);
    let cost = t.ratio("wm", "nowm", rate_ack);
    let repartitioned = t.ratio("repartition", "wm", rate_ack);
    let repartitioned_cpu = t.ratio("repartition", "wm", cpu_ack);
    let naive = t.ratio("naive", "producer", rate_ack);
    let naive_cpu = t.ratio("naive", "producer", cpu_ack);
    let avro_json = t.ratio("avro", "wm", rate_ack);
    let avro_headers = t.ratio("avro", "producer-headers", rate_ack);
    let headers = t.ratio("producer-headers", "producer", rate_ack);
    // A tool's rate ÷ the best producer's (first send → last ack), or why it was not run.
    let tool = |id: &str| match CASES[case(id)].skipped(s, t.broker) {
        Some(why) => Err(why),
        None => Ok(t.ratio(id, "producer", rate_send)),
    };
    let (perf, physical) = (tool("rdkafka-perf"), tool("java-perf"));
    let (mw, mp) = (t.median("wm", rate_ack), t.median("producer", rate_ack));
    let (cw, cp) = (t.median("wm", cpu_ack), t.median("producer", cpu_ack));
    out.push_str(
        "\nRatios run by run, their geometric mean and its 95% interval (Student's t over the \
         runs); targets judged on the estimate.\n\n| figure | measured | target |\n|---|---|---|\n",
    );
    let or_not_run = |i: Result<Interval, &str>| match i {
        Ok(i) => format!("{} (first send → last ack)", i.show(2, "pairs")),
        Err(why) => format!("not run ({why})"),
    };
    let rows: [(&str, String, &str); 14] = [
        (
            "watchbridge `bounded(5s)` / best producer, outputs/s (first ack → last ack)",
            e2e.show(2, "pairs"),
            "≥ 0.9",
        ),
        (
            "the same, first send → last ack",
            e2e_send.show(2, "pairs"),
            "",
        ),
        (
            "watchbridge / best producer, CPU µs per output (first ack → last ack)",
            cpu.show(2, "pairs"),
            "≤ 1.3",
        ),
        (
            "watchbridge, watermarks `none` / best producer, outputs/s",
            none.show(2, "pairs"),
            "",
        ),
        (
            "watermark cost: 1 − `bounded(5s)` / `none`, outputs/s",
            cost.show_cost(),
            "≤ 3%",
        ),
        (
            "watchbridge through the repartition topic / without (both `bounded(5s)`), outputs/s",
            repartitioned.show(2, "pairs"),
            "≥ 0.8",
        ),
        (
            "the same, CPU µs per output",
            repartitioned_cpu.show(2, "pairs"),
            "",
        ),
        (
            "naive producer / best producer, outputs/s",
            naive.show(2, "pairs"),
            "(reference)",
        ),
        (
            "naive producer / best producer, CPU µs per output",
            naive_cpu.show(2, "pairs"),
            "(reference)",
        ),
        (
            "`rdkafka_performance` / best producer, outputs/s",
            or_not_run(perf),
            "(reference)",
        ),
        (
            "physical limit (`ProducerPerformance`) / best producer, outputs/s",
            or_not_run(physical),
            "(reference)",
        ),
        (
            "best producer with `wb-id` / without, outputs/s",
            headers.show(2, "pairs"),
            "(diagnostic)",
        ),
        (
            "watchbridge Avro in and out / JSON (both `bounded(5s)`), outputs/s",
            avro_json.show(2, "pairs"),
            "(diagnostic)",
        ),
        (
            "watchbridge Avro (with `wb-id`) / best producer with `wb-id`, outputs/s",
            avro_headers.show(2, "pairs"),
            "(diagnostic)",
        ),
    ];
    for (figure, measured, target) in rows {
        out.push_str(&format!("| {figure} | {measured} | {target} |\n"));
    }

    out.push_str(&format!(
        "\nCores busy over the first-ack window (the tools: over their whole run), CPU seconds \
         / wall seconds, median over the runs; 2 cores in all: the case's process (the \
         producer, the bridge with its consumers, or the tool), the broker ({broker}), and \
         others, everything else on the machine (near 0 for figures undisturbed by other \
         work).\n\n| case | case's process | broker | others (max over the runs) |\n|---|---|---|---|\n",
    ));
    for (c, measured) in CASES.iter().zip(&t.results) {
        if measured.is_empty() {
            continue;
        }
        let own: Vec<f64> = measured.iter().map(|m| m.cores.own).collect();
        let b: Vec<f64> = measured.iter().map(|m| m.cores.broker).collect();
        let others: Vec<f64> = measured.iter().map(|m| m.cores.others).collect();
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} |\n",
            c.name,
            median(&own),
            median(&b),
            min_max(&others).1
        ));
    }
    let state: Vec<u64> = t
        .results
        .iter()
        .flatten()
        .filter_map(|m| m.state_records)
        .collect();
    let (slo, shi) = (
        state.iter().min().copied().unwrap_or(0),
        state.iter().max().copied().unwrap_or(0),
    );
    out.push_str(&format!(
        "\nState records the bridge wrote per run: {slo}–{shi} (checkpoints every 500 ms per \
         partition).\n"
    ));

    let label = match t.broker {
        Broker::Tansu(storage) => format!("Tansu {}", storage.describe()),
        Broker::Kafka => "Apache Kafka".into(),
    };
    out.push_str(&summary_line(
        &format!("e2e on {label}: watchbridge / best producer, outputs/s (first ack → last ack)"),
        &format!(
            "{} ({} vs {} outputs/s, medians)",
            e2e.show(2, "pairs"),
            rate(mw),
            rate(mp)
        ),
        "≥ 0.9, the whole 95% interval",
        e2e.at_least(0.9),
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: watchbridge / best producer, CPU per output"),
        &format!("{} ({cw:.2} vs {cp:.2} µs, medians)", cpu.show(2, "pairs")),
        "≤ 1.3, the whole 95% interval",
        cpu.at_most(1.3),
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: watermark cost, 1 − `bounded(5s)` / `none`"),
        &cost.show_cost(),
        "≤ 3%, the whole 95% interval",
        cost.at_least(0.97),
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: through the repartition topic / without, outputs/s"),
        &format!(
            "{} ({} vs {} outputs/s, medians; CPU per output {})",
            repartitioned.show(2, "pairs"),
            rate(t.median("repartition", rate_ack)),
            rate(mw),
            repartitioned_cpu.show(2, "pairs")
        ),
        "≥ 0.8, the whole 95% interval",
        repartitioned.at_least(0.8),
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: naive producer (rdkafka `FutureProducer`) / best producer"),
        &format!(
            "{} ({} outputs/s, median)",
            naive.show(2, "pairs"),
            rate(t.median("naive", rate_ack))
        ),
        "(reference)",
        true,
    ));
    let tool_line = |id: &str, ratio: Result<Interval, &str>| match ratio {
        Ok(r) => format!(
            "{} ({} outputs/s, median; first send → last ack)",
            r.show(2, "pairs"),
            rate(t.median(id, rate_send))
        ),
        Err(why) => format!("not run ({why})"),
    };
    out.push_str(&summary_line(
        &format!("e2e on {label}: librdkafka's `rdkafka_performance` / best producer"),
        &tool_line("rdkafka-perf", perf),
        "(reference)",
        true,
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: physical limit (Kafka's `ProducerPerformance`) / best producer"),
        &tool_line("java-perf", physical),
        "(reference)",
        true,
    ));
    out.push_str(&summary_line(
        &format!("e2e on {label}: watchbridge with Avro in and out / with JSON"),
        &avro_json.show(2, "pairs"),
        "(diagnostic)",
        true,
    ));
    out.push_str(&summary_line(
        &format!(
            "e2e on {label}: watchbridge with Avro and `wb-id` / best producer writing `wb-id`"
        ),
        &avro_headers.show(2, "pairs"),
        "(diagnostic)",
        true,
    ));
    out.push('\n');
    out
}

/// The version of the Apache Kafka install (`scripts/kafka.sh path`: its `kafka_2.13-V.jar`).
fn kafka_version() -> String {
    let libs = installed_path("kafka.sh", "or set KAFKA_LIBS to a dir of Kafka's jars");
    std::fs::read_dir(&libs)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|name| {
            let v = name.strip_prefix("kafka_2.13-")?.strip_suffix(".jar")?;
            Some(v.to_string())
        })
        .unwrap_or_else(|| "(version unknown)".into())
}

/// Starts the table's Kafka (for the cases on it, which run in other processes).
fn start_kafka() -> (BrokerProcess, KafkaAt) {
    let kafka = BrokerProcess::kafka("watchbridge-bench-kafka-").unwrap_or_else(|e| panic!("{e}"));
    let at = KafkaAt {
        bootstrap: kafka.bootstrap.clone(),
        pid: kafka.pid(),
    };
    (kafka, at)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let filter = std::env::var("E2E_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    // A case run by the bench in a process of its own.
    if let Ok(id) = std::env::var(CHILD) {
        let broker = match std::env::var(BROKER).as_deref() {
            Ok("kafka") => Broker::Kafka,
            _ => Broker::Tansu(s.storage),
        };
        let kafka = std::env::var(KAFKA).ok().map(|v| {
            let (bootstrap, pid) = v.split_once(' ').expect("`bootstrap pid`");
            KafkaAt {
                bootstrap: bootstrap.into(),
                pid: pid.into(),
            }
        });
        let m = run_case(&s, broker, kafka.as_ref(), &id, 0);
        println!("{RESULT} {}", m.to_line());
        return;
    }
    // `E2E_ONLY=<case>` (an id of [`CASES`]) runs that case alone, `E2E_RUNS` times, in this
    // process (on the first broker of `E2E_BROKER`), and prints its figures, no report: for
    // profiling one case (`perf record -p`).
    if let Ok(id) = std::env::var("E2E_ONLY") {
        case(&id);
        let broker = s.brokers[0];
        let kafka = (broker == Broker::Kafka).then(start_kafka);
        for run in 0..s.runs {
            let m = run_case(&s, broker, kafka.as_ref().map(|k| &k.1), &id, run);
            eprintln!(
                "run {}: {id}: {} outputs/s first ack → last ack, {:.2} µs CPU per output; {} \
                 outputs/s first send → last ack, {:.2} µs; cores busy: this process {:.2}, \
                 broker {:.2}, others {:.2}",
                run + 1,
                rate(m.rate_ack),
                m.cpu_ack,
                rate(m.rate_send),
                m.cpu_send,
                m.cores.own,
                m.cores.broker,
                m.cores.others
            );
        }
        return;
    }
    let mut tables = Vec::new();
    let tansu_bin = tansu_bin();
    for &broker in &s.brokers {
        let kafka = (broker == Broker::Kafka).then(start_kafka);
        let mut results: Vec<Vec<Measured>> = CASES.iter().map(|_| Vec::new()).collect();
        // Each case of each run in a process of its own (this one again, `E2E_CASE`): a case
        // run after others in one process shared it with what they left behind (clients
        // still closing, a grown heap), and the later cases of a run measured up to a fifth
        // lower than the same code alone (2026-12-03). Interleaved: every case once, then
        // again.
        for run in 0..s.runs {
            let began = Instant::now();
            for (i, c) in CASES.iter().enumerate() {
                if c.skipped(&s, broker).is_some() {
                    continue;
                }
                results[i].push(case_in_child(c.id, broker, kafka.as_ref().map(|k| &k.1)));
            }
            eprintln!(
                "e2e on {}: run {} of {} took {:.0?}",
                broker.describe(),
                run + 1,
                s.runs,
                began.elapsed()
            );
        }
        drop(kafka);
        tables.push(Table { broker, results });
    }

    let mut t = String::new();
    t.push_str("## watchbridge end-to-end benchmark\n\n");
    t.push_str(
        "The bridge's output rate and CPU per output against the strongest plain producer of \
         the same records on the same broker (librdkafka's `rd_kafka_produceva`, a producing \
         thread per core, the bridge's producer settings: idempotent, `acks=all`, lz4, \
         `linger.ms=5`, one request in flight per connection), with reference rows: the naive \
         rdkafka `FutureProducer` this bench compared with before, librdkafka's own \
         `rdkafka_performance`, and the broker's ingest rate of such records (Kafka's \
         `ProducerPerformance`). `benches/e2e.rs` says how each is measured.\n\n\
         Windows: **first ack → last ack** (outputs acknowledged after the first, over that \
         time: free of start-up, the bridge's group join, recovery and first poll) and \
         **first send → last ack** (all N); every case but the tools is sampled the same \
         way, its counters read every 2 ms. CPU per output: user + system CPU of the case's \
         own process (`getrusage`) over the window; the tools' is their whole process, \
         start-up included. `ProducerPerformance` measures the broker's ingest rate only \
         where the Java client is not the limit itself: where its row is below librdkafka's, \
         it is (its CPU per record says so), and the best producer's rate is the nearer \
         bound of what the broker takes.\n\n",
    );
    for table in &tables {
        t.push_str(&section(&s, table));
    }
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let brokers: Vec<String> = s
        .brokers
        .iter()
        .map(|b| match b {
            Broker::Tansu(storage) => {
                format!("{} ({})", tansu_version(&tansu_bin), storage.describe())
            }
            Broker::Kafka => format!(
                "Apache Kafka {} (`scripts/kafka.sh`, one KRaft node)",
                kafka_version()
            ),
        })
        .collect();
    t.push_str(&format!(
        "- machine: {}\n- versions: {}, watchbridge {}, librdkafka {librdkafka}, {}\n- \
         command: `{}`\n- date: {}\n\n",
        machine(),
        command_output("rustc", &["-V"]),
        env!("CARGO_PKG_VERSION"),
        brokers.join(", "),
        command_line(),
        utc_now(),
    ));
    t.push_str(&format!(
        "What the bridge does per output that the producer does not: the poll's result \
         hashed and checked against the watch's seen set, its delivery tracked for the \
         checkpoint and the commit, its hash journaled, its value copied into librdkafka; and \
         per run its state records (checkpoints every 500 ms per partition), watermark \
         records (on the watermark topic and in every output partition, every 200 ms while a \
         watermark moves), the merged watermark's reader, and the input consumer. \
         What the Avro case does besides: every input unframed, decoded with its writer \
         schema (fetched once from the run's registry and cached by id) and mapped to JSON \
         (once per watch, {per_watch} outputs); every output written as an envelope datum and \
         framed with the envelope's registry id, with one header, `wb-id` (20 bytes), which \
         the diagnostic producer with the same header prices for librdkafka alone. No header \
         on the JSON cases' outputs: the topics have as many partitions, so each output goes \
         to its input partition's namesake, and the prepared items carry their keys \
         (`\"id\"`), which the bench's poller reads back as the HTTP poller does its \
         `WATCHBRIDGE_HTTP_ITEM_KEY`: a recovery needs nothing else.\n\n\
         On Tansu's memory storage the broker keeps each produced batch as it came and is \
         far from the limit (its column above): the client side is, so the ratios compare \
         CPU per record of the producer and of the whole bridge. On Apache Kafka the broker \
         takes a share of the two cores too.\n",
        per_watch = s.per_watch,
    ));
    // stdout: this bench's section of bench/RESULTS.md (`make bench` collects it).
    println!("{t}");
}

//! End-to-end benchmark: the bridge's output throughput against a plain producer's on the
//! same broker, in one run, as ratios. Run with `make bench` (or `cargo bench --bench e2e`);
//! `BENCH_SMOKE=1` only proves it runs (2,000 outputs, one run each).
//!
//! The broker is the real one the Kafka tests use, Tansu (`scripts/tansu.sh path`), a
//! fresh one per case and run (`tests/support/tansu_process.rs`, `broker_process.rs`), with memory storage
//! (`E2E_STORAGE=sqlite` for SQLite): there the broker is not the limit and the ratio
//! compares the clients' CPU per record. The bridge runs with the allocator of the
//! `watchbridge` binary ([`watchbridge::Allocator`]).
//!
//! Five cases (a baseline with the `wb-id` header too), each `E2E_RUNS` times (default 5),
//! interleaved (baseline, baseline with headers, bridge, bridge with Avro, bridge without
//! watermarks, then again), each case of each run in a process of its own (the bench runs
//! itself again for it), on fresh topics (and a fresh consumer group) each run:
//!
//! - **baseline**: one rdkafka `FutureProducer` with the bridge's producer settings
//!   (idempotent, `acks=all`, lz4, `linger.ms=5`) writes N records (~100-byte values, the
//!   outputs' event times as timestamps, keys spread as the bridge's: one key per watch,
//!   K records per key) to a fresh topic of P = 4 partitions; rate = N / (first send →
//!   every record acknowledged).
//! - **watchbridge**: [`run_bridge`] in this process (brokers = Tansu, topics created by
//!   it, default watermark strategy `bounded(5s)`) with a poller that serves prepared
//!   results: input `{"id": n}` → its first poll returns K outputs (distinct keys, event
//!   times, ~100-byte values), final. The N/K inputs are produced before the bridge starts
//!   (not timed). Rate = outputs acknowledged after the first one / (first output
//!   acknowledged → `outputs_produced` = N), the counter read every 2 ms: the group join,
//!   the partitions' recovery and the first poll are not in it.
//! - **watchbridge, Avro in and out**: the same (`bounded(5s)`) with
//!   `WATCHBRIDGE_INPUT_FORMAT=avro` and `WATCHBRIDGE_OUTPUT_FORMAT=avro` (the default
//!   envelope schema), through a [`RegistryServer`] started in this process for the run: the
//!   inputs are Confluent-framed datums of `{"type":"record","name":"User","fields":[{"name":
//!   "id","type":"long"}]}` (registered first under `<input topic>-value`), which the bridge
//!   decodes (the writer schema fetched once, cached by id) to the same JSON `{"id": n}` the
//!   poller sees in the JSON case; every output is written as an envelope datum (key, event
//!   time, the item as text) framed with the envelope's id. Only the formats differ from the
//!   JSON case: its rate / the JSON case's rate of the same run prices Avro (decoding once per
//!   watch, i.e. per K outputs; encoding once per output).
//! - **watchbridge, watermarks none**: the same as the JSON case with
//!   `WATCHBRIDGE_WATERMARK_STRATEGY=none`, to price the watermarks (records on the watermark
//!   topic and in every output partition).
//!
//! Sizes: `E2E_OUTPUTS` (N, default 2,000,000: the plain producer needs about 2 s for
//! them), `E2E_PER_WATCH` (K, default 100, so 20,000 watches), `E2E_RUNS`. The table (this bench's section of `bench/RESULTS.md`,
//! with the machine, the versions, the command and the date) goes to stdout.
//! `E2E_LOG` sets the log filter (default `warn`).

use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::Value;
use std::sync::Arc;
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

/// What the `watchbridge` binary allocates with, so the bridge here runs as it does there.
#[global_allocator]
static GLOBAL: watchbridge::Allocator = watchbridge::Allocator;
use support::broker_process::BrokerProcess;
use support::cpu::{cpu_seconds, machine_cpu_seconds};
use support::kafka::{bridge_args, create_topic, input_id, produce_inputs, producer, InFlight};
use support::report::{
    command_output, env_or, machine, median, min_max, now_ms, rate, summary_line, utc_now,
};
use support::tansu_process::{tansu_bin, tansu_version, Storage};

/// The cases, in the order each run runs them, with how the CPU table names them.
const CASES: [(&str, &str); 5] = [
    ("baseline", "baseline"),
    ("baseline-headers", "baseline with a `wb-id` header"),
    ("wm", "watchbridge, `bounded(5s)`"),
    ("avro", "watchbridge, Avro in and out, `bounded(5s)`"),
    ("nowm", "watchbridge, `none`"),
];

/// What a bridge case reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// JSON inputs, the items as they are out (the defaults).
    Json,
    /// Avro in (the Confluent wire format, [`INPUT_SCHEMA`]) and out (the envelope schema),
    /// through a registry of its own.
    Avro,
}

/// The Avro case's input schema: its datums map to the JSON case's inputs, `{"id": n}`.
const INPUT_SCHEMA: &str =
    r#"{"type":"record","name":"User","fields":[{"name":"id","type":"long"}]}"#;

/// Partitions of every topic.
const PARTITIONS: i32 = 4;
/// Size of each output's value, in bytes.
const VALUE_BYTES: usize = 100;

struct Sizes {
    storage: Storage,
    outputs: usize,
    per_watch: usize,
    runs: usize,
}

impl Sizes {
    fn watches(&self) -> usize {
        self.outputs / self.per_watch
    }
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in seconds (used by `make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let (outputs, runs) = if smoke { (2_000, 1) } else { (2_000_000, 5) };
    let storage = match std::env::var("E2E_STORAGE").as_deref() {
        Err(_) | Ok("memory") => Storage::Memory,
        Ok("sqlite") => Storage::Sqlite,
        Ok(other) => panic!("E2E_STORAGE={other}: expected `memory` (the default) or `sqlite`"),
    };
    let s = Sizes {
        storage,
        outputs: env_or("E2E_OUTPUTS", outputs),
        per_watch: env_or("E2E_PER_WATCH", 100),
        runs: env_or("E2E_RUNS", runs),
    };
    assert!(
        s.per_watch >= 1 && s.runs >= 1 && s.outputs >= s.per_watch,
        "E2E_PER_WATCH and E2E_RUNS must be at least 1, E2E_OUTPUTS at least E2E_PER_WATCH"
    );
    assert!(
        s.outputs.is_multiple_of(s.per_watch),
        "E2E_OUTPUTS ({}) must be a multiple of E2E_PER_WATCH ({})",
        s.outputs,
        s.per_watch
    );
    s
}

// ---------------------------------------------------------------------------------------
// The workload: N outputs, K per watch, the same for both cases.

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

// ---------------------------------------------------------------------------------------
/// CPU time (user + system) of this process and of the broker, to tell which one a case
/// keeps busy.
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
    fn of(broker: &BrokerProcess) -> Cpu {
        Cpu {
            broker_pid: broker.pid(),
        }
    }

    fn sample(&self) -> Sample {
        Sample {
            at: Instant::now(),
            own: cpu_seconds("self"),
            broker: cpu_seconds(&self.broker_pid),
            machine: machine_cpu_seconds(),
        }
    }
}

impl Sample {
    /// Cores busy from `self` to `later`: this process, the broker, and everything else on
    /// the machine (another build or benchmark would disturb the figures).
    fn cores_until(&self, later: &Sample) -> Cores {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let own = (later.own - self.own) / wall;
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

/// One case's figures from one run.
struct Measured {
    /// Records (outputs) per second.
    rate: f64,
    /// Cores busy over the measured time.
    cores: Cores,
    /// State records the bridge wrote in all.
    state_records: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// The cases.

/// The baseline: the workload's outputs, written by one producer; records per second. With
/// `headers`, each record carries the header the `recovery` mode puts on an output where it
/// cannot read outputs' identities back from their values (the 20-byte `wb-id`; the Avro
/// case writes it): Tansu's SQLite storage writes each header as a row of its own, so it
/// costs the broker about as much as the record.
async fn baseline(
    bootstrap: &str,
    cpu: &Cpu,
    work: &Workload,
    topic: &str,
    headers: bool,
) -> Measured {
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
        panic!("baseline warm-up record to {topic}: {e}");
    }
    let n: usize = work.results.iter().map(|r| r.outputs.len()).sum();
    let mut in_flight = InFlight::new("baseline");
    let start = cpu.sample();
    for (result, key) in work.results.iter().zip(&work.keys) {
        for output in &result.outputs {
            let mut record = FutureRecord::to(topic)
                .key(key.as_str())
                .payload(output.value.as_ref())
                .timestamp(output.event_time);
            if headers {
                let id = records::recovery_id(hash_key(&output.key), 0);
                record = record.headers(OwnedHeaders::new_with_capacity(1).insert(Header {
                    key: records::RECOVERY_ID,
                    value: Some(&id[..]),
                }));
            }
            in_flight.send(&producer, record).await;
        }
    }
    in_flight.delivered().await;
    let end = cpu.sample();
    Measured {
        rate: n as f64 / end.at.duration_since(start.at).as_secs_f64(),
        cores: start.cores_until(&end),
        state_records: None,
    }
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
/// inputs produced first (not timed), then outputs per second from the first acknowledged
/// output to the last, and the state records it wrote in all.
async fn bridge(
    bootstrap: &str,
    cpu: &Cpu,
    work: &Arc<Workload>,
    id: &str,
    watermarks: &str,
    format: Format,
    storage: Storage,
) -> Measured {
    let mut args = bridge_args(bootstrap, &format!("bench-e2e-{id}"), PARTITIONS);
    args.watermark_strategy = watermarks.into();
    // Avro: a registry of its own for this run, serving on the bench's runtime (the bridge
    // asks it for the input schema once and registers the envelope at start).
    let registry = match format {
        Format::Json => None,
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
    produce_inputs(bootstrap, &config.input_topic, storage, inputs.into_iter()).await;

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
        // Generous: a bridge that stalls fails the bench instead of hanging it.
        let limit = Duration::from_secs(120) + Duration::from_millis(n / 2);
        let began = Instant::now();
        let mut first: Option<(Sample, u64)> = None;
        let measured = loop {
            let produced = metrics.outputs_produced.get();
            if first.is_none() && produced > 0 {
                first = Some((cpu.sample(), produced));
            }
            if produced >= n {
                let end = cpu.sample();
                let (start, c0) = first.expect("set once the counter moved");
                let elapsed = end.at.duration_since(start.at).as_secs_f64();
                break (
                    if elapsed > 0.0 {
                        (produced - c0) as f64 / elapsed
                    } else {
                        f64::INFINITY
                    },
                    start.cores_until(&end),
                );
            }
            if began.elapsed() > limit {
                stop.stop();
                panic!(
                    "bridge ({watermarks}, {format:?}): {produced} of {n} outputs produced after \
                     {limit:?}; inputs consumed {}, watches started {}, active {}, outputs \
                     emitted {}",
                    metrics.inputs_consumed.get(),
                    metrics.watches_started.get(),
                    metrics.watches_active.get(),
                    metrics.outputs_emitted.get(),
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        stop.stop();
        measured
    };
    let (result, (rate, cores)) = tokio::join!(run, measure);
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
    Measured {
        rate,
        cores,
        state_records: Some(metrics.state_records_written.get()),
    }
}

// ---------------------------------------------------------------------------------------
// The report.

fn command_line() -> String {
    support::report::command_line(
        "e2e",
        &["BENCH_SMOKE", "E2E_OUTPUTS", "E2E_PER_WATCH", "E2E_RUNS"],
    )
}

/// The variable that makes this bench run one case once, as a child of the bench, and
/// print its figures on a line of stdout that starts with [`RESULT`].
const CHILD: &str = "E2E_CASE";
const RESULT: &str = "e2e-result";

impl Measured {
    fn to_line(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.rate,
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
        let [rate, own, broker, others, state] = f[..] else {
            return None;
        };
        Some(Self {
            rate,
            cores: Cores {
                own,
                broker,
                others,
            },
            state_records: (state >= 0.0).then_some(state as u64),
        })
    }
}

/// Run `case` once in a child process (this bench again, with [`CHILD`]), whose process id
/// keeps its topics and group apart from every other run's.
fn case_in_child(case: &str) -> Measured {
    let exe = std::env::current_exe().expect("the bench's own path");
    let out = std::process::Command::new(exe)
        .arg("--bench")
        .env(CHILD, case)
        .env("E2E_RUNS", "1")
        .stderr(std::process::Stdio::inherit())
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

/// One case, once, on a Tansu of its own: each case of each run has a broker of its own
/// (Tansu's SQLite storage has no index on its header table, so every record it fetches
/// costs a scan of every header stored so far, on any topic; one broker for the whole
/// bench would slow each case by the ones before it, and starve consumer-group
/// heartbeats).
fn run_case(s: &Sizes, bin: &std::path::Path, case: &str, run: usize) -> Measured {
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    // Event times after every input's time (an hour from now): late under neither
    // strategy. Under `none` the watermark is the watches' holds, which start at their
    // inputs' times; outputs from before those would be marked late (a header each), and
    // the `none` case would measure the marking instead of the watermark's cost.
    let work = Arc::new(Workload::new(s, now_ms() + 3_600_000));
    let broker = BrokerProcess::tansu(bin, s.storage, "watchbridge-bench-tansu-")
        .unwrap_or_else(|e| panic!("{e}"));
    let (bootstrap, cpu) = (broker.bootstrap.clone(), Cpu::of(&broker));
    let id = format!("{}-{run}-{case}", std::process::id());
    let topic = format!("bench-e2e-{id}");
    let m = runtime.block_on(async {
        match case {
            "baseline" => baseline(&bootstrap, &cpu, &work, &topic, false).await,
            "baseline-headers" => baseline(&bootstrap, &cpu, &work, &topic, true).await,
            bridge_case => {
                let (wm, format) = match bridge_case {
                    "wm" => ("bounded(5s)", Format::Json),
                    "avro" => ("bounded(5s)", Format::Avro),
                    "nowm" => ("none", Format::Json),
                    other => panic!("no case {other:?}"),
                };
                bridge(&bootstrap, &cpu, &work, &id, wm, format, s.storage).await
            }
        }
    });
    drop(broker);
    m
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let filter = std::env::var("E2E_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let bin = tansu_bin();
    // `E2E_ONLY=<case>` (`baseline`, `baseline-headers`, `wm`, `avro`, `nowm`) runs that
    // case alone, in this process, and prints its rates, no report: for profiling one case
    // (`perf record -p`).
    let only = std::env::var("E2E_ONLY").ok();
    if let Some(case) = std::env::var(CHILD).ok().or_else(|| only.clone()) {
        for run in 0..s.runs {
            let m = run_case(&s, &bin, &case, run);
            eprintln!(
                "run {}: {case}: {} records/s; cores busy: bench process {:.2}, tansu {:.2}, others {:.2}",
                run + 1,
                rate(m.rate),
                m.cores.own,
                m.cores.broker,
                m.cores.others
            );
            if only.is_none() {
                println!("{RESULT} {}", m.to_line());
            }
        }
        return;
    }
    // Each case of each run in a process of its own (this one again, `E2E_CASE`): a case
    // run after others in one process shared it with what they left behind (clients still
    // closing, a grown heap), and the later cases of a run measured up to a fifth lower
    // than the same code alone (2026-12-03). Interleaved: every case once, then again.
    let mut results: Vec<Vec<Measured>> = CASES.iter().map(|_| Vec::new()).collect();
    for _ in 0..s.runs {
        for (i, (case, _)) in CASES.iter().enumerate() {
            results[i].push(case_in_child(case));
        }
    }
    let tansu_version = tansu_version(&bin);

    let rates = |i: usize| -> Vec<f64> { results[i].iter().map(|m| m.rate).collect() };
    let (base, base_headers, with_wm, avro, without_wm) =
        (rates(0), rates(1), rates(2), rates(3), rates(4));
    let state_records: Vec<u64> = results
        .iter()
        .flatten()
        .filter_map(|m| m.state_records)
        .collect();
    let (mb, mh, mw, ma, mx) = (
        median(&base),
        median(&base_headers),
        median(&with_wm),
        median(&avro),
        median(&without_wm),
    );
    let ratios =
        |rates: &[f64]| -> Vec<f64> { rates.iter().zip(&base).map(|(r, b)| r / b).collect() };
    let (wlo, whi) = min_max(&ratios(&with_wm));
    let (xlo, xhi) = min_max(&ratios(&without_wm));
    let (vlo, vhi) = min_max(&ratios(&avro));
    // Avro in and out against JSON, per run: only the formats differ.
    let avro_to_json: Vec<f64> = avro.iter().zip(&with_wm).map(|(a, w)| a / w).collect();
    let (jlo, jhi) = min_max(&avro_to_json);
    let (hlo, hhi) = min_max(&ratios(&base_headers));
    let against_headers: Vec<f64> = avro.iter().zip(&base_headers).map(|(w, h)| w / h).collect();
    let (alo, ahi) = min_max(&against_headers);
    let costs: Vec<f64> = with_wm
        .iter()
        .zip(&without_wm)
        .map(|(w, x)| 1.0 - w / x)
        .collect();
    let (clo, chi) = min_max(&costs);
    let range = |v: &[f64]| {
        let (lo, hi) = min_max(v);
        format!("{}–{}", rate(lo), rate(hi))
    };

    let mut t = String::new();
    t.push_str("## watchbridge end-to-end benchmark\n\n");
    t.push_str(&format!(
        "{} outputs ({} watches x {} outputs, ~{VALUE_BYTES}-byte values), {PARTITIONS} partitions, \
         {} run(s) per case, interleaved, each case of each run in a process of its own; median and min–max over the runs. Ratios per run \
         against that run's baseline; the ratio column is median / median.\n\n",
        s.outputs,
        s.watches(),
        s.per_watch,
        s.runs
    ));
    t.push_str("| case | rate (median) | min–max | ratio to baseline | target |\n");
    t.push_str("|---|---|---|---|---|\n");
    t.push_str(&format!(
        "| baseline: rdkafka FutureProducer (idempotent, acks=all, lz4, linger.ms=5) | {} records/s | {} | 1.00 | |\n",
        rate(mb),
        range(&base)
    ));
    t.push_str(&format!(
        "| baseline with the `wb-id` header (what the Avro case writes; diagnostic) | {} records/s | {} | {:.2} (runs {hlo:.2}–{hhi:.2}) | |\n",
        rate(mh),
        range(&base_headers),
        mh / mb
    ));
    t.push_str(&format!(
        "| watchbridge (watermarks `bounded(5s)`, the default) | {} outputs/s | {} | {:.2} (runs {wlo:.2}–{whi:.2}) | ≥ 0.9 |\n",
        rate(mw),
        range(&with_wm),
        mw / mb
    ));
    t.push_str(&format!(
        "| watchbridge, Avro in and out (the wire format through the registry in, the envelope schema out; `bounded(5s)`) | {} outputs/s | {} | {:.2} (runs {vlo:.2}–{vhi:.2}) | |\n",
        rate(ma),
        range(&avro),
        ma / mb
    ));
    t.push_str(&format!(
        "| watchbridge, watermarks `none` | {} outputs/s | {} | {:.2} (runs {xlo:.2}–{xhi:.2}) | ≥ 0.9 |\n",
        rate(mx),
        range(&without_wm),
        mx / mb
    ));
    t.push_str(&format!(
        "| watermark cost: 1 − `bounded(5s)` / `none` | {:.1}% | {:.1}% – {:.1}% (per run) | | ≤ 5% |\n",
        (1.0 - mw / mx) * 100.0,
        clo * 100.0,
        chi * 100.0
    ));
    t.push_str(&format!(
        "| watchbridge with Avro (and `wb-id`) / baseline with `wb-id` (diagnostic) | {:.2} | {alo:.2}–{ahi:.2} (per run) | | |\n",
        ma / mh
    ));
    t.push_str(&format!(
        "| Avro / JSON: watchbridge with Avro in and out / with JSON (both `bounded(5s)`) | {:.2} | {jlo:.2}–{jhi:.2} (per run) | | |\n",
        ma / mw
    ));
    t.push_str(
        "\nCores busy over the measured time (CPU seconds / wall seconds, median over the runs; \
         2 cores in all): the bench process is the producer or the bridge (with its consumers), \
         Tansu the broker, others everything else on the machine (near 0 for figures undisturbed \
         by other work).\n\n| case | bench process | Tansu | others (max over the runs) |\n|---|---|---|---|\n",
    );
    for ((_, name), measured) in CASES.iter().zip(&results) {
        let own: Vec<f64> = measured.iter().map(|m| m.cores.own).collect();
        let broker: Vec<f64> = measured.iter().map(|m| m.cores.broker).collect();
        let others: Vec<f64> = measured.iter().map(|m| m.cores.others).collect();
        t.push_str(&format!(
            "| {name} | {:.2} | {:.2} | {:.2} |\n",
            median(&own),
            median(&broker),
            min_max(&others).1
        ));
    }
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let date = utc_now();
    t.push_str(&format!(
        "\n- machine: {}\n- versions: {}, watchbridge {}, librdkafka {librdkafka}, {tansu_version} ({})\n- command: `{}`\n- date: {date}\n",
        machine(),
        command_output("rustc", &["-V"]),
        env!("CARGO_PKG_VERSION"),
        s.storage.describe(),
        command_line(),
    ));
    let (slo, shi) = (
        state_records.iter().min().copied().unwrap_or(0),
        state_records.iter().max().copied().unwrap_or(0),
    );
    t.push_str(&format!(
        "\nBaseline rate: records / (first send → all acknowledged), the producer's setup \
         excluded. watchbridge rate: outputs / (first output acknowledged → `outputs_produced` \
         = N); start-up (group join, recovery of the empty state) excluded. Each case of each \
         run has a Tansu of its own ({storage}). With memory storage Tansu keeps each produced \
         batch as it came and is nowhere near the limit (its column above): the client side \
         is, the bench process using both cores, so the ratio compares CPU per record of the \
         plain producer and of the whole bridge. (`E2E_STORAGE=sqlite` measures on SQLite \
         storage instead, where Tansu writes every header as a row of its own and is the limit \
         at a fraction of its header-less rate with headers.)\n\n\
         What the bridge does per output that the plain producer does not: the poll's result \
         hashed and checked against the watch's seen set, \
         its delivery tracked for the checkpoint and the commit, its hash journaled; and per \
         run its state records ({slo}–{shi}, checkpoints every 500 ms per partition), \
         watermark records (on the watermark topic and in every output partition, every \
         200 ms while a watermark moves) and the merged watermark's reader.\n\n\
         What the Avro case does besides: every input unframed, decoded with its writer \
         schema (fetched once from the run's registry, an in-memory one in this process, and \
         cached by id) and mapped to JSON (once per watch, {per_watch} outputs); every output \
         written as an envelope datum (key, event time, the item as text) and framed with the \
         envelope's registry id, with one header, `wb-id` (20 bytes: a recovery does not \
         decode Avro to read an output's identity back; the diagnostic baseline with the same \
         header shows what it costs librdkafka alone).\n\n\
         No header on the JSON cases' outputs: the topics have as many partitions, so each \
         output goes to its input partition's namesake, and the prepared items carry their \
         keys (`\"id\"`), which the bench's poller reads back as the HTTP poller does its \
         `WATCHBRIDGE_HTTP_ITEM_KEY`: a recovery needs nothing else.\n",
        per_watch = s.per_watch,
        storage = s.storage.describe(),
    ));
    t.push_str(&summary_line(
        "end-to-end throughput, watchbridge / plain producer (memory storage)",
        &format!(
            "{:.2} ({} vs {} records/s; runs {wlo:.2}–{whi:.2})",
            mw / mb,
            rate(mw),
            rate(mb)
        ),
        "≥ 0.9",
        mw / mb >= 0.9,
    ));
    t.push_str(&summary_line(
        "end-to-end throughput, watchbridge with Avro and `wb-id` / producer writing `wb-id`",
        &format!("{:.2} (runs {alo:.2}–{ahi:.2})", ma / mh),
        "(diagnostic)",
        true,
    ));
    t.push_str(&summary_line(
        "end-to-end throughput, watchbridge with Avro in and out (registry wire format, envelope schema) / with JSON",
        &format!(
            "{:.2} ({} vs {} outputs/s; runs {jlo:.2}–{jhi:.2}; {:.2} of the plain producer)",
            ma / mw,
            rate(ma),
            rate(mw),
            ma / mb
        ),
        "(no target)",
        true,
    ));
    t.push_str(&summary_line(
        "watermark cost, 1 − `bounded(5s)` / `none`",
        &format!(
            "{:.1}% (runs {:.1}% – {:.1}%)",
            (1.0 - mw / mx) * 100.0,
            clo * 100.0,
            chi * 100.0
        ),
        "≤ 5%",
        1.0 - mw / mx <= 0.05,
    ));
    // stdout: this bench's section of bench/RESULTS.md (`make bench` collects it).
    println!("{t}");
}

//! The whole bridge at scale: memory per live watch and per seen output on one instance,
//! with everything a watch costs beyond the engine (its partition task's durable state, the
//! input offsets it holds, the consumer's buffers). Run with `make bench` (or
//! `cargo bench --bench scale`); `BENCH_SMOKE=1` only proves it runs.
//!
//! [`run_bridge`] runs in this process, with default settings, on Apache Kafka (memory
//! cases) or on both Tansu with SQLite storage and Apache Kafka (start case), with a poller
//! that serves prepared results and a poll interval of an hour, so after its first poll a
//! watch is idle. Each case runs in a fresh process ([`run_fresh`]), and measures twice: once the bridge is
//! ready with its partitions assigned and nothing to watch (`before`), and once every input
//! has started its watch, been polled once, had its outputs acknowledged and its state
//! written (`after`, a few checkpoints later). Per watch = (after − before) / watches:
//!
//! - **idle**: `SCALE_WATCHES` (default 1,000,000) watches whose poll found nothing, not
//!   final: the "≤ 300 B per idle watch" target.
//! - **seen**: `SCALE_SEEN_WATCHES` (default 2,000) watches whose first poll found
//!   `SCALE_SEEN_PER_WATCH` (default 100) outputs, not final: per seen output = (per
//!   watch here − per idle watch, as many idle watches measured in a case of their own) /
//!   outputs per watch, the "≤ 20 B per seen output" target;
//!   measured again `SCALE_SETTLE` later (default 35 s, past the 30 s after which a watch
//!   with nothing new lets go of its unsealed chunk's hashes).
//! - **start**: `SCALE_START_WATCHES` (default 200,000) inputs already on the input topic,
//!   read first by a plain consumer configured as the bridge's input consumer (the
//!   baseline) and one with librdkafka's defaults (shown), each in a group of its own,
//!   then by the bridge: watches started per second, from the bridge's first input to every
//!   watch active and its input committed (which waits for its first state record: its own
//!   or a starts record shared with the other watches of its checkpoint), against the plain
//!   consumer's records per second (first record to last); on Tansu with SQLite storage and
//!   on Apache Kafka. The target: ≥ 0.5 of the plain consumer.
//!
//! Memory: the resident set (what the OS sees: allocator overhead and librdkafka's buffers
//! and queues too) is the judged figure; the Rust heap (bytes handed out and not returned:
//! exact) is shown beside it. Every memory case runs `SCALE_RUNS` times (default 3), each in
//! a fresh process. Inputs are `SCALE_INPUT_BYTES`-byte (default 200) JSON user records with
//! 13-byte keys: the bridge keeps each live watch's input (it rewrites the watch's state
//! record from it), so their size counts.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use watchbridge::bridge::{run_bridge, BridgeError, StopSignal};
use watchbridge::config::RunConfig;
use watchbridge::kafka::clients::KafkaSettings;
use watchbridge::kafka::guarantee::Guarantee;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::{RenderError, Resolve};

#[path = "support/mod.rs"]
mod support;
use support::alloc::{live, rss, run_fresh};
use support::broker_process::BrokerProcess;
use support::cpu::cpu_seconds;
use support::kafka::{bridge_args, create_topic, input_id, produce_inputs};
use support::report::{env_or, machine, median, min_max, now_ms, summary_line};
use support::tansu_process::{tansu_bin, Storage};

#[global_allocator]
static GLOBAL: support::alloc::Counting = support::alloc::Counting;

const PARTITIONS: i32 = 4;

/// Serves watch `n` (input `{"id": n}`) `per_watch` outputs on every poll, never final (so
/// after the first poll they are all seen, and the watch stays live).
struct Prepared {
    per_watch: usize,
    base: i64,
}

impl Poller for Prepared {
    type Input = usize;

    fn poll(
        &self,
        input: Arc<usize>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let n = *input;
        let outputs = (0..self.per_watch)
            .map(|j| {
                Output::new(
                    format!("item-{n}-{j}"),
                    format!(r#"{{"watch":{n},"item":{j}}}"#),
                    self.base + j as i64,
                )
            })
            .collect();
        std::future::ready(Ok(PollResult::incomplete(outputs)))
    }
}

impl Resolve for Prepared {
    fn resolve(&self, value: &Value, _key: &[u8]) -> Result<usize, RenderError> {
        input_id(value)
    }
}

/// Bytes of each input (`SCALE_INPUT_BYTES`, default 200): a user record of realistic size,
/// `{"id": n, "name": …, "email": …, "plan": …}` padded to that length. The bridge keeps each
/// live watch's input (it rewrites the watch's state record from it), so its size counts.
fn input_bytes() -> usize {
    env_or("SCALE_INPUT_BYTES", 200)
}

/// Input `n`: a JSON user record of [`input_bytes`] bytes (at least its fields' own).
fn user_record(n: usize) -> String {
    let head = format!(
        r#"{{"id": {n}, "name": "User {n}", "email": "user{n}@example.com", "plan": "pro", "bio": ""#
    );
    let pad = input_bytes().saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// What one case measured: heap and resident bytes per watch, after the outputs and (for
/// `settle` > 0) again once the watches had nothing new for that long; and how long the
/// inputs took to become live watches.
struct Case {
    heap: f64,
    resident: f64,
    heap_settled: f64,
    resident_settled: f64,
    start_seconds: f64,
    /// Share of one core the bridge used over [`idle_window`] with every watch idle.
    idle_cpu: f64,
}

/// How long the idle bridge's CPU is measured for (a second in `BENCH_SMOKE`, which only
/// proves the bench runs).
fn idle_window() -> Duration {
    if std::env::var_os("BENCH_SMOKE").is_some() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    }
}

/// Where the bridge stands, for progress lines and a timeout's panic.
fn progress(metrics: &Metrics) -> String {
    format!(
        "inputs consumed {}, watches active {}, polls {}, outputs produced {}, state records {}",
        metrics.inputs_consumed.get(),
        metrics.watches_active.get(),
        metrics.polls_ok.get(),
        metrics.outputs_produced.get(),
        metrics.state_records_written.get(),
    )
}

/// Waits until `done()`, or panics after `limit` saying what stands where.
async fn wait_until(what: &str, limit: Duration, metrics: &Metrics, done: impl Fn() -> bool) {
    let began = Instant::now();
    let mut told = Instant::now();
    while !done() {
        if told.elapsed() >= Duration::from_secs(10) {
            told = Instant::now();
            eprintln!("scale: waiting for {what}: {}", progress(metrics));
        }
        assert!(
            began.elapsed() < limit,
            "{what}: not done after {limit:?}; {}",
            progress(metrics)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the state topic has had no new record for `quiet` (checkpoints done).
async fn wait_for_state_settled(metrics: &Metrics, quiet: Duration) {
    let mut last = metrics.state_records_written.get();
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = metrics.state_records_written.get();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// The bench bridge's settings for a case named `name`: defaults, but polls an hour apart
/// (after its first poll a watch is idle).
fn case_config(bootstrap: &str, name: &str) -> RunConfig {
    let mut args = bridge_args(bootstrap, name, PARTITIONS);
    args.poll_interval = Duration::from_secs(3600);
    // `KAFKA_*` from the environment: for trying librdkafka settings by hand.
    args.check(std::env::vars().filter(|(k, _)| k.starts_with("KAFKA_")))
        .unwrap_or_else(|e| panic!("bench bridge config: {e}"))
}

/// The bridge with the [`Prepared`] poller (`per_watch` outputs per watch), not started
/// until awaited; and its metrics and stop signal.
fn bridge<'a>(
    bootstrap: &'a str,
    config: &'a RunConfig,
    per_watch: usize,
) -> (
    impl std::future::Future<Output = Result<(), BridgeError>> + 'a,
    Arc<Metrics>,
    Arc<StopSignal>,
) {
    let metrics = Arc::new(Metrics::new());
    let stop = Arc::new(StopSignal::default());
    let poller = Arc::new(Prepared {
        per_watch,
        base: now_ms(),
    });
    let run = run_bridge(
        bootstrap,
        None,
        config,
        poller,
        metrics.clone(),
        stop.clone(),
    );
    (run, metrics, stop)
}

/// One case, in this (fresh) process: `watches` watches with `per_watch` outputs each.
fn run_case(watches: usize, per_watch: usize, settle: Duration) -> Case {
    // Apache Kafka: Tansu on SQLite, given a million inputs, stopped answering the group's
    // heartbeats in time (its one core busy) and the group rebalanced; its memory storage
    // cannot resume a paused partition inside a batch (../shared/notes/tansu-0.6.md). The
    // broker does not change the bridge's memory.
    let broker = start_broker(Broker::Kafka);
    let bootstrap = broker.bootstrap.clone();
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    let config = case_config(&bootstrap, &format!("bench-scale-{}", std::process::id()));
    let case = runtime.block_on(async {
        create_topic(&bootstrap, &config.input_topic, PARTITIONS).await;
        let (run, metrics, stop) = bridge(&bootstrap, &config, per_watch);
        let measure = async {
            let limit = Duration::from_secs(60);
            wait_until("ready", limit, &metrics, || metrics.ready.get() == 1).await;
            wait_for_state_settled(&metrics, Duration::from_secs(2)).await;
            let (heap0, rss0) = (live(), rss());

            eprintln!("scale: bridge ready; producing {watches} inputs");
            let began = Instant::now();
            let inputs = (0..watches).map(|n| (format!("watch-{n:07}"), user_record(n)));
            produce_inputs(&bootstrap, &config.input_topic, Storage::Sqlite, inputs).await;
            eprintln!("scale: inputs produced in {:.1?}", began.elapsed());
            // Generous: about 10k inputs/s would be slow, never a hang.
            let limit = Duration::from_secs(120) + Duration::from_millis(watches as u64 / 10);
            let (w, n) = (watches as i64, (watches * per_watch) as u64);
            wait_until("watches polled", limit, &metrics, || {
                metrics.watches_active.get() == w
                    && metrics.polls_ok.get() >= watches as u64
                    && metrics.outputs_produced.get() >= n
            })
            .await;
            let start_seconds = began.elapsed().as_secs_f64();
            wait_for_state_settled(&metrics, Duration::from_secs(3)).await;
            let (heap1, rss1) = (live(), rss());
            // Every watch is idle (polled, next poll in an hour): what the bridge still does
            // is its checkpoints, watermarks and metrics.
            let cpu0 = cpu_seconds("self");
            let window = idle_window();
            tokio::time::sleep(window).await;
            let idle_cpu = (cpu_seconds("self") - cpu0) / window.as_secs_f64();
            tokio::time::sleep(settle.saturating_sub(window)).await;
            wait_for_state_settled(&metrics, Duration::from_secs(2)).await;
            let (heap2, rss2) = (live(), rss());
            stop.stop();
            let per = |a: isize, b: isize| (b - a) as f64 / watches as f64;
            Case {
                heap: per(heap0, heap1),
                resident: per(rss0, rss1),
                heap_settled: per(heap0, heap2),
                resident_settled: per(rss0, rss2),
                start_seconds,
                idle_cpu,
            }
        };
        let (result, case) = tokio::join!(run, measure);
        if let Err(e) = result {
            panic!("the bridge failed: {e}");
        }
        case
    });
    drop(runtime);
    drop(broker);
    case
}

/// What the start-rate case measured: records per second of the plain consumer (its
/// faster of two reads, one before and one after the bridge), and watches started per
/// second by the bridge, and inputs per second it read (first input to last: the part of
/// its time that is reading, not the last checkpoint and commit after).
struct StartCase {
    plain: f64,
    /// The same read with librdkafka's defaults (a 500 ms fetch wait among them).
    defaults: f64,
    bridge: f64,
    bridge_read: f64,
}

/// Reads `n` records of `topic` with a plain consumer in a group of its own: configured as
/// the bridge's input consumer in mode `alike` (`KafkaSettings::input_consumer`, its fetch
/// wait and partition ends among them; nothing committed), or with librdkafka's defaults
/// (`None`); returns records per second from its first record to its last.
fn plain_read(bootstrap: &str, topic: &str, n: usize, alike: Option<Guarantee>) -> f64 {
    let mut config = match alike {
        Some(guarantee) => KafkaSettings {
            brokers: bootstrap.to_string(),
            properties: Default::default(),
            group_id: String::new(),
        }
        .input_consumer(guarantee),
        None => ClientConfig::new(),
    };
    let consumer: BaseConsumer = config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("plain-{}", now_ms()))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("create the plain consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let limit = Instant::now() + Duration::from_secs(120) + Duration::from_millis(n as u64);
    let (mut read, mut first) = (0, None);
    while read < n {
        assert!(
            Instant::now() < limit,
            "plain consumer: {read} of {n} records"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => {
                first.get_or_insert_with(Instant::now);
                read += 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => eprintln!("scale: plain consumer: {e}"),
            None => {}
        }
    }
    let took = first.expect("records read").elapsed().as_secs_f64();
    (n - 1) as f64 / took
}

/// The start-rate case, in this (fresh) process: `watches` inputs on the topic before
/// anything reads them.
fn run_start_case(watches: usize, on: Broker) -> StartCase {
    let broker = start_broker(on);
    let bootstrap = broker.bootstrap.clone();
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    let config = case_config(&bootstrap, &format!("bench-start-{}", std::process::id()));
    let case = runtime.block_on(async {
        create_topic(&bootstrap, &config.input_topic, PARTITIONS).await;
        let inputs = (0..watches).map(|n| (format!("watch-{n:07}"), user_record(n)));
        produce_inputs(&bootstrap, &config.input_topic, Storage::Sqlite, inputs).await;
        // The mode `auto` picks there (its consumer commits offsets itself, or not).
        let mode = match on {
            Broker::Kafka => Guarantee::ExactlyOnce,
            Broker::Tansu => Guarantee::Recovery,
        };
        let reads = |alike: bool| {
            let (b, t, g) = (bootstrap.clone(), config.input_topic.clone(), mode);
            tokio::task::spawn_blocking(move || plain_read(&b, &t, watches, alike.then_some(g)))
        };
        let alike_before = reads(true).await.expect("plain read");
        let defaults = reads(false).await.expect("plain read");
        eprintln!(
            "scale: plain consumer {alike_before:.0} records/s with the bridge's settings, \
             {defaults:.0} with librdkafka's"
        );
        let (run, metrics, stop) = bridge(&bootstrap, &config, 0);
        let measure = async {
            let limit = Duration::from_secs(120) + Duration::from_millis(watches as u64 / 10);
            wait_until("the first input", limit, &metrics, || {
                metrics.inputs_consumed.get() > 0
            })
            .await;
            let began = Instant::now();
            let w = watches as i64;
            wait_until("every input read", limit, &metrics, || {
                metrics.inputs_consumed.get() >= watches as u64
            })
            .await;
            let read = began.elapsed();
            wait_until("watches started", limit, &metrics, || {
                metrics.watches_active.get() == w
            })
            .await;
            let active = began.elapsed();
            let committed = group_committed(&bootstrap, &config.group_id, &config.input_topic);
            let end = watches as i64;
            while committed() < end {
                assert!(
                    began.elapsed() < limit,
                    "inputs committed: {} of {end}",
                    committed()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let took = began.elapsed();
            eprintln!(
                "scale: the bridge read every input in {:.2} s, had every watch active at {:.2} s, \
                 every input committed at {:.2} s",
                read.as_secs_f64(),
                active.as_secs_f64(),
                took.as_secs_f64()
            );
            let bridge = watches as f64 / took.as_secs_f64();
            stop.stop();
            (bridge, watches as f64 / read.as_secs_f64())
        };
        let (result, (bridge, bridge_read)) = tokio::join!(run, measure);
        if let Err(e) = result {
            panic!("the bridge failed: {e}");
        }
        let alike_after = reads(true).await.expect("plain read");
        eprintln!(
            "scale: bridge {bridge:.0} watches/s; plain consumer again {alike_after:.0} records/s"
        );
        StartCase {
            plain: alike_before.max(alike_after),
            defaults,
            bridge,
            bridge_read,
        }
    });
    drop(runtime);
    drop(broker);
    case
}

/// The broker a case runs on.
#[derive(Clone, Copy, PartialEq)]
enum Broker {
    /// Tansu on SQLite storage.
    Tansu,
    /// Apache Kafka, one KRaft node (`scripts/kafka.sh`).
    Kafka,
}

fn start_broker(on: Broker) -> BrokerProcess {
    match on {
        Broker::Tansu => {
            BrokerProcess::tansu(&tansu_bin(), Storage::Sqlite, "watchbridge-bench-tansu-")
        }
        Broker::Kafka => BrokerProcess::kafka("watchbridge-bench-kafka-"),
    }
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The sum of `group`'s committed offsets on `topic`'s partitions (a partition with none
/// counts 0), asked afresh at each call.
fn group_committed(bootstrap: &str, group: &str, topic: &str) -> impl Fn() -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("create the offsets reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    move || {
        consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(5))
            .map(|c| {
                c.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("SCALE_LOG").unwrap_or_else(|_| "warn".into()),
        ))
        .with_writer(std::io::stderr)
        .init();
    if let Ok(case) = std::env::var("BENCH_CASE") {
        if let Some(rest) = case.strip_prefix("start:") {
            let (watches, on) = match rest.split_once(':') {
                Some((n, "kafka")) => (n, Broker::Kafka),
                Some((n, _)) => (n, Broker::Tansu),
                None => (rest, Broker::Tansu),
            };
            let c = run_start_case(watches.parse().expect("start:<watches>[:kafka]"), on);
            println!("{} {} {} {}", c.plain, c.bridge, c.bridge_read, c.defaults);
            return;
        }
        let n: Vec<u64> = case.split(':').map(|x| x.parse().unwrap()).collect();
        let c = run_case(n[0] as usize, n[1] as usize, Duration::from_secs(n[2]));
        println!(
            "{} {} {} {} {} {}",
            c.heap, c.resident, c.heap_settled, c.resident_settled, c.start_seconds, c.idle_cpu
        );
        return;
    }
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let idle = env_or("SCALE_WATCHES", if smoke { 2_000 } else { 1_000_000 });
    let starts = env_or("SCALE_START_WATCHES", if smoke { 2_000 } else { 200_000 });
    let seen_watches = env_or("SCALE_SEEN_WATCHES", if smoke { 200 } else { 2_000 });
    let per_watch = env_or("SCALE_SEEN_PER_WATCH", 100);
    let settle = env_or("SCALE_SETTLE", if smoke { 0 } else { 35 });
    let runs = env_or("SCALE_RUNS", if smoke { 1 } else { 3 });

    // Each memory case `runs` times, each in a fresh process: figure by figure, the runs'
    // values. Measured when every watch has had its first poll, and again `settle` later:
    // by then each one's progress is written and its partition task lets the copy go (an
    // idle watch's steady state; see `Pending` in kafka/durable/live.rs). The idle watches
    // of the seen case's count: what a watch costs besides its outputs, fixed costs shared
    // out alike, at the same two moments.
    let (mut i, mut i_seen, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        i.push(run_fresh(&format!("{idle}:0:{settle}"), 6));
        i_seen.push(run_fresh(&format!("{seen_watches}:0:{settle}"), 6));
        s.push(run_fresh(
            &format!("{seen_watches}:{per_watch}:{settle}"),
            6,
        ));
    }
    let start = run_fresh(&format!("start:{starts}:tansu"), 4);
    let start_kafka = run_fresh(&format!("start:{starts}:kafka"), 4);
    // Figure `k` of every run: its median, and the range as text.
    let of = |runs: &[Vec<f64>], k: usize| runs.iter().map(|r| r[k]).collect::<Vec<f64>>();
    let per_output = |k: usize| -> Vec<f64> {
        s.iter()
            .zip(&i_seen)
            .map(|(s, i)| (s[k] - i[k]) / per_watch as f64)
            .collect()
    };
    let shown = |v: &[f64], decimals: usize| {
        let (lo, hi) = min_max(v);
        if v.len() > 1 {
            format!("{:.d$} ({lo:.d$}–{hi:.d$})", median(v), d = decimals)
        } else {
            format!("{:.d$}", median(v), d = decimals)
        }
    };
    let met = |v: f64, target: f64| if v <= target { "met" } else { "NOT met" };
    let input_size = input_bytes();
    println!("## The whole bridge at scale: memory per watch and per seen output\n");
    println!(
        "`cargo bench --bench scale`: `run_bridge` in one process on Apache Kafka (one node; \
         `exactly_once`, the mode `auto` picks there), {PARTITIONS} input partitions, a \
         poller serving prepared results, poll interval 1 h; per watch = growth from the \
         ready bridge with nothing to watch to every watch polled, its outputs acknowledged \
         and its state written, divided by the watches. **Resident** = the process's \
         resident set (everything: allocator overhead, librdkafka's buffers and queues; the \
         judged figure); heap = Rust allocations only (exact). Inputs: {input_size}-byte JSON \
         user records with 13-byte keys (`SCALE_INPUT_BYTES`): the bridge keeps each live \
         watch's input, so its size counts. {runs} run(s) of each case, each in a fresh \
         process: median (min–max). {}.\n",
        machine()
    );
    println!("| figure | resident | heap | target (resident) |");
    println!("|---|---|---|---|");
    let became = median(&of(&i, 4));
    println!(
        "| bytes per watch just polled ({idle} live watches, each right after its first poll; they became live in {became:.1} s, {:.0} inputs/s) | {} | {} | |",
        idle as f64 / became,
        shown(&of(&i, 1), 0),
        shown(&of(&i, 0), 0),
    );
    let idle_resident = median(&of(&i, 3));
    println!(
        "| bytes per idle watch ({idle} live watches, {settle} s later: each one's progress written) | {} | {} | <= 300: {} |",
        shown(&of(&i, 3), 0),
        shown(&of(&i, 2), 0),
        met(idle_resident, 300.0)
    );
    println!(
        "| bytes per seen output ({seen_watches} watches x {per_watch} outputs, at once) | {} | {} | |",
        shown(&per_output(1), 1),
        shown(&per_output(0), 1),
    );
    let seen_resident = median(&per_output(3));
    println!(
        "| bytes per seen output ({seen_watches} watches x {per_watch} outputs, {settle} s later) | {} | {} | <= 20: {} |",
        shown(&per_output(3), 1),
        shown(&per_output(2), 1),
        met(seen_resident, 20.0)
    );
    println!(
        "\nWith all {idle} watches idle (each polled, its next poll an hour away), the bridge \
         used {:.1}% of one core over {} s: its checkpoints, watermarks and metrics.",
        median(&of(&i, 5)) * 100.0,
        idle_window().as_secs()
    );
    println!(
        "\n### Watch starts\n\n{starts} inputs ({input_size}-byte user records) on the input \
         topic before anything reads them (4 partitions), read first by a plain consumer in a \
         group of its own configured as the bridge's input consumer (its settings from \
         `KafkaSettings::input_consumer`: a 20 ms fetch wait, partition ends reported, \
         cooperative-sticky; records/s from its first record to its last; the faster of a \
         read before and one after the bridge's) and once with librdkafka's defaults (shown, \
         not the baseline), then by the bridge with default settings (watches/s from its \
         first input to every watch active and its input committed, which waits for the \
         watch's first state record: its own, or a starts record shared with the other \
         watches of its checkpoint). The bridge's read rate is its inputs per second from its \
         first input to its last: the rest of its time is the last checkpoint and commit.\n"
    );
    println!("| broker (the mode `auto` picks) | plain consumer as the bridge's, records/s | with librdkafka's defaults | bridge, inputs read/s | bridge, watches started/s | bridge / plain | target ≥ 0.5 |");
    println!("|---|---|---|---|---|---|---|");
    let brokers = [
        ("Tansu 0.6, SQLite storage (`recovery`)", &start),
        ("Apache Kafka, one node (`exactly_once`)", &start_kafka),
    ];
    for (name, figures) in brokers {
        let ratio = figures[1] / figures[0];
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {ratio:.3} | {} |",
            figures[0],
            figures[3],
            figures[2],
            figures[1],
            if ratio >= 0.5 { "met" } else { "NOT met" }
        );
    }
    print!(
        "{}",
        summary_line(
            &format!("whole bridge: resident bytes per idle watch ({idle} watches, {input_size}-byte inputs, `exactly_once`, librdkafka included, {settle} s after their first poll)"),
            &format!(
                "{} B (heap {} B)",
                shown(&of(&i, 3), 0),
                shown(&of(&i, 2), 0)
            ),
            "≤ 300 B",
            idle_resident <= 300.0
        )
    );
    print!(
        "{}",
        summary_line(
            &format!("whole bridge: resident bytes per seen output, everything counted ({settle} s after the outputs)"),
            &format!(
                "{} B (heap {} B)",
                shown(&per_output(3), 1),
                shown(&per_output(2), 1)
            ),
            "≤ 20 B",
            seen_resident <= 20.0
        )
    );
    for (name, figures) in brokers {
        let ratio = figures[1] / figures[0];
        print!(
            "{}",
            summary_line(
                &format!("whole bridge: watch starts ÷ a plain consumer configured alike ({starts} inputs, {name})"),
                &format!(
                    "{ratio:.3} ({:.0} watches/s vs {:.0} records/s; with librdkafka's defaults {:.0})",
                    figures[1], figures[0], figures[3]
                ),
                "≥ 0.5",
                ratio >= 0.5
            )
        );
    }
}

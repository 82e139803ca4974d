//! Restore benchmark: how long bringing back 100,000 watches with 100 seen outputs each
//! takes, the figure issue 6 asks for ("restore 100k watches x 100 seen"). Run with
//! `make bench`; `RESTORE_CASES` (`<broker>:<watches>,…`, the broker `embedded` or `kafka`;
//! default 100,000 watches on each, then 1,000,000 on Kafka, whose target is 10 s),
//! `RESTORE_SEEN` and `RESTORE_RUNS` (each case 3 times by default, a broker of its own each
//! time: the median and the range are reported, and a target is met only by every run)
//! change the cases.
//!
//! It goes through the bridge's own recovery path end to end, on the embedded broker
//! (librdkafka's in-process mock cluster, [`EmbeddedBroker`]) and on Apache Kafka (one
//! KRaft node, a log on disk; [`KAFKA_PARTITIONS`] partitions). Not timed: the topics are
//! created (input, output, watermark, state) and the state topic is filled as a writer
//! leaves it — per watch, its seen chunks then its watch record, with the bridge's producer
//! settings (lz4, idempotent, `acks=all`) — plus, per partition, an [`OutputOffsets`]
//! record pointing at offset 0 of the empty output topic.
//!
//! The mock cluster keeps at most 5 MiB of records per partition and silently drops the
//! oldest beyond that (a fixed limit in librdkafka), so the state goes to as many
//! partitions as keep each under 4 MiB (input and state topics alike, as the bridge
//! requires; `RESTORE_PARTITIONS` overrides): one for the smoke run's 1,000 watches, 46 for
//! 100,000 watches of 100 seen outputs. The bench checks that every partition still starts
//! at offset 0. Each partition is then recovered as its task would — read, then plan — one
//! after the other, the times summed, and all watches go to one engine. Three phases (a
//! watch is complete only once its partition has been read to the end: a later record may
//! replace an earlier one):
//!
//! - **read**: [`recovery::read`] — a consumer reads the state partition to its end, keeps
//!   the latest value per key and decodes it, then reads the output topic from the
//!   checkpoint's offsets (nothing there);
//! - **plan**: [`recovery::plan`] — rebuilds each watch's seen set and journal from its
//!   chunks, resolves its input again with the poller, and builds the partition's durable
//!   state;
//! - **engine**: hands every watch to a running engine as [`Command::Restore`] until it has
//!   answered [`Event::Restored`] for each.
//!
//! The baseline is the same engine starting as many new watches ([`Command::Watch`] until
//! [`Event::Started`]): the ratio is what durable state adds to bringing a partition's
//! watches up. No poll runs in either case: the bench holds the engine's only poll permit,
//! so only the start or restore itself is timed. The poller's `resolve` does no work (its
//! input is `()`), so the plan phase is a floor: a real poller renders a URL or path there.
//!
//! A read has a fixed cost, whatever the partition holds: about 0.15 s here, mostly
//! waiting — librdkafka takes some 0.1 s to close the consumer, and the output topic's end
//! offset is asked for once the last fetch (a long poll of `fetch.wait.max.ms`, 50 ms) has
//! come back (on Apache Kafka about 0.15 s too). Summed over many partitions this
//! dominates the read phase, so with more than one partition (up to [`AT_ONCE_MAX`]) the
//! recoveries are timed again all at once, each partition on a thread of its own reading
//! then planning, as the bridge's partition tasks run them (each reads on a blocking
//! thread, then plans in the task, partitions side by side on the runtime's workers), and
//! the total counts that time plus the engine's (the phases one after the other are shown
//! beside it). The engine phase stays one engine for every watch, where the bridge gives
//! each partition an engine of its own: not overlapped, so not flattered.
//!
//! The mock cluster keeps the topics in memory in this process, so the peak resident set
//! reported (`VmHWM`, of the process so far: the cases run one after the other) includes
//! the broker's copy of the state partition in the embedded cases.
//!
//! Targets (issue 50): 100,000 watches within 1 s and 1,000,000 within 10 s, from the start
//! of the reads to the last watch restored.

#[path = "support/mod.rs"]
mod support;
use support::broker_process::BrokerProcess;
use support::report::{env_or, summary_line};

/// What the `watchbridge` binary allocates with.
#[global_allocator]
static GLOBAL: watchbridge::Allocator = watchbridge::Allocator;
use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use watchbridge::clock::{Clock, Millis};
use watchbridge::engine::{Command, Engine, EngineConfig, Event};
use watchbridge::kafka::clients::{Isolation, KafkaSettings};
use watchbridge::kafka::embedded::EmbeddedBroker;
use watchbridge::kafka::recovery::{self, Lookups, RecoverySource};
use watchbridge::limits::Limits;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::pollers::{RenderError, Resolve};
use watchbridge::schedule::Schedule;
use watchbridge::seen::{hash_key, OutputHash};
use watchbridge::state::{OutputOffsets, SeenJournal, WatchRecord};
use watchbridge::termination::Termination;
use watchbridge::watch::WatchRules;

/// A day: far enough ahead that no restored watch is due while the bench runs.
const LATER: Millis = 86_400_000;

const INPUT: &str = "bench-input";
const OUTPUT: &str = "bench-output";
const WATERMARKS: &str = "bench-watermarks";
const STATE: &str = "bench-state";

/// Never asked to poll (the bench holds the only permit); answers nothing if it were.
/// Resolves every input to `()`.
struct NoOp;

impl Poller for NoOp {
    type Input = ();

    fn poll(
        &self,
        _input: Arc<()>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        std::future::ready(Ok(PollResult::incomplete(Vec::<Output>::new())))
    }
}

impl Resolve for NoOp {
    fn resolve(&self, _value: &Value, _key: &[u8]) -> Result<(), RenderError> {
        Ok(())
    }
}

/// The hash of watch `i`'s `j`th output.
fn output_hash(i: usize, j: usize) -> OutputHash {
    hash_key(format!("http://127.0.0.1:1/feed/{i}/item/{j}").as_bytes())
}

/// Watch `i`'s state records, (key, value) in the order a writer produces them: its seen
/// chunks (`seen` hashes), then its watch record.
fn watch_records(i: usize, seen: usize, now: Millis) -> Vec<(Vec<u8>, Vec<u8>)> {
    let key = Bytes::from(format!("user-{i:06}"));
    let mut journal = SeenJournal::new();
    for j in 0..seen {
        journal.add(output_hash(i, j));
    }
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = journal
        .checkpoint()
        .into_iter()
        .map(|chunk| {
            let e = chunk.to_entry(&key).expect("a small chunk");
            (e.key, e.value)
        })
        .collect();
    let value = format!(r#"{{"user":"user-{i:06}","url":"http://127.0.0.1:1/feed/{i}"}}"#);
    let record = WatchRecord {
        watch_key: key.clone(),
        input_key: Some(key),
        input_value: Bytes::from(value),
        input_time: now - 60_000,
        arrived: now - 50_000,
        last_new: now - 10_000,
        polls: 20,
        hold: now - 60_000,
        next_poll: now + LATER,
        empty_streak: 1,
        failures: 0,
        seen_chunks: journal.chunks(),
        finished: None,
        resume: None,
        conditions: None,
    };
    let e = record.to_entry().expect("a small record");
    records.push((e.key, e.value));
    records
}

/// How much of the state topic one partition of the embedded broker may hold here. The
/// mock cluster keeps at most 5 MiB of record batches per partition (a fixed limit in
/// librdkafka, `rd_kafka_mock_partition_init`) and drops the oldest batches beyond it, as a
/// retention would; 4 MiB leaves room for batch overhead.
const PARTITION_BYTES: usize = 4 << 20;

/// What was written to the state topic.
struct Written {
    records: usize,
    bytes: usize,
    /// Per partition: the records on it.
    per_partition: Vec<u64>,
}

/// `store` with the four topics — input, state and output with `partitions` partitions,
/// watermark with one — the state topic holding `watches` watches
/// that have seen `seen` outputs each (watch `i` on partition `i % partitions`, as it would
/// be if its input came from that input partition), then on every partition the output
/// offsets of a checkpoint (offset 0 of its own partition of the empty output topic).
fn fill_broker(
    store: &Store,
    runtime: &tokio::runtime::Runtime,
    watches: usize,
    seen: usize,
    partitions: i32,
    now: Millis,
) -> Written {
    for (topic, count) in [
        (INPUT, partitions),
        (OUTPUT, partitions),
        (WATERMARKS, 1),
        (STATE, partitions),
    ] {
        store.create_topic(runtime, topic, count);
    }
    // The bridge's producer settings (src/bridge.rs), with more batching.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", store.bootstrap())
        .set("compression.type", "lz4")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "262144")
        .create()
        .expect("producer");
    let mut written = Written {
        records: 0,
        bytes: 0,
        per_partition: vec![0; partitions as usize],
    };
    let mut send = |partition: i32, key: &[u8], value: &[u8]| {
        loop {
            let record = BaseRecord::<[u8], [u8]>::to(STATE)
                .partition(partition)
                .key(key)
                .payload(value);
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("cannot produce a state record: {e}"),
            }
        }
        producer.poll(Duration::ZERO);
        written.records += 1;
        written.bytes += key.len() + value.len();
        written.per_partition[partition as usize] += 1;
    };
    for i in 0..watches {
        for (key, value) in watch_records(i, seen, now) {
            send(i as i32 % partitions, &key, &value);
        }
    }
    // Outputs are placed by input partition (the bridge's layout): state partition p's
    // checkpoint names output partition p alone.
    for partition in 0..partitions {
        let offsets = OutputOffsets {
            offsets: vec![(partition, 0)],
        }
        .to_entry()
        .expect("a small record");
        send(partition, &offsets.key, &offsets.value);
    }
    producer
        .flush(Duration::from_secs(300))
        .expect("every state record delivered");
    // Every record acknowledged and still there: each partition runs from offset 0 to as
    // many records as were sent to it.
    for partition in 0..partitions {
        let (low, high) = producer
            .client()
            .fetch_watermarks(STATE, partition, Duration::from_secs(15))
            .expect("watermarks");
        assert_eq!(
            (low, high),
            (0, written.per_partition[partition as usize] as i64),
            "state partition {partition}: the mock cluster dropped its oldest records (more \
             than {PARTITION_BYTES} bytes on one partition?)"
        );
    }
    written
}

/// Where a case's topics live.
enum Store {
    /// librdkafka's in-process mock cluster ([`EmbeddedBroker`]): memory only, at most
    /// 5 MiB a partition.
    Embedded(EmbeddedBroker),
    /// Apache Kafka, one KRaft node (`scripts/kafka.sh`): a log on disk, as in production.
    Kafka(BrokerProcess),
}

impl Store {
    /// `embedded` or `kafka`.
    fn start(kind: &str) -> Self {
        match kind {
            "embedded" => Store::Embedded(EmbeddedBroker::start().expect("embedded broker")),
            "kafka" => Store::Kafka(
                BrokerProcess::kafka("watchbridge-bench-restore-")
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            other => panic!("RESTORE_CASES: {other:?} is not a broker (embedded or kafka)"),
        }
    }

    fn bootstrap(&self) -> String {
        match self {
            Store::Embedded(b) => b.bootstrap(),
            Store::Kafka(b) => b.bootstrap.clone(),
        }
    }

    fn create_topic(&self, runtime: &tokio::runtime::Runtime, topic: &str, partitions: i32) {
        match self {
            Store::Embedded(b) => b.create_topic(topic, partitions).expect("topic created"),
            Store::Kafka(b) => runtime.block_on(support::kafka::create_topic(
                &b.bootstrap,
                topic,
                partitions,
            )),
        }
    }

    /// State partitions for `watches` watches of `seen` outputs (`RESTORE_PARTITIONS` sets
    /// it): on the embedded broker as few as keep each within [`PARTITION_BYTES`], on Kafka
    /// [`KAFKA_PARTITIONS`].
    fn partitions_for(&self, watches: usize, seen: usize) -> i32 {
        let needed = match self {
            Store::Embedded(_) => {
                let per_watch: usize = watch_records(0, seen, 0)
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 64)
                    .sum();
                let per_partition = (PARTITION_BYTES / per_watch).max(1);
                watches.div_ceil(per_partition).max(1)
            }
            Store::Kafka(_) => KAFKA_PARTITIONS,
        };
        env_or("RESTORE_PARTITIONS", needed) as i32
    }

    fn describe(&self, partitions: i32) -> String {
        match (self, partitions) {
            (Store::Embedded(_), 1) => "embedded broker".into(),
            (Store::Embedded(_), p) => format!(
                "embedded broker, state on {p} partitions: the mock cluster keeps 5 MiB per partition"
            ),
            (Store::Kafka(_), p) => format!(
                "Apache Kafka, one KRaft node, state on {p} partitions"
            ),
        }
    }
}

/// State (and input) partitions on Kafka, where a partition holds any size.
const KAFKA_PARTITIONS: usize = 8;

/// Peak resident set of this process (`VmHWM`), in bytes, where Linux tells it.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn engine_time(
    runtime: &tokio::runtime::Runtime,
    n: usize,
    commands: impl Iterator<Item = Command<()>>,
    counts: fn(&Event) -> bool,
) -> Duration {
    runtime.block_on(async {
        let limits = Limits::new(1, None);
        // Holding the only poll permit: no watch polls, so only starts or restores are timed.
        let _permit = limits
            .in_flight()
            .clone()
            .try_acquire_owned()
            .expect("a free permit");
        let config = EngineConfig {
            rules: WatchRules {
                catch_up: Default::default(),
                termination: Termination::Never,
                schedule: Schedule::default(),
            },
            poll_timeout: Duration::from_secs(10),
            seed: Some(1),
            checkpoints: false,
            remember_ended: false,
        };
        let metrics = Arc::new(Metrics::new());
        let engine = Engine::new(Arc::new(NoOp), config, limits, Clock::system(), metrics);
        let (commands_tx, commands_rx) = mpsc::channel(65_536);
        let (events_tx, mut events) = mpsc::channel(65_536);
        let task = tokio::spawn(engine.run(commands_rx, events_tx));
        let counter = tokio::spawn(async move {
            let mut counted = 0;
            while counted < n {
                let event = events.recv().await.expect("engine running");
                // A change of the minimum hold comes before the first answer; not counted.
                if matches!(event, Event::Hold { .. }) {
                    continue;
                }
                assert!(counts(&event), "unexpected event {event:?}");
                counted += 1;
            }
            events
        });
        let t0 = Instant::now();
        for c in commands {
            commands_tx.send(c).await.expect("engine running");
        }
        let events = counter.await.expect("event counter");
        let elapsed = t0.elapsed();
        commands_tx.send(Command::Shutdown).await.expect("engine");
        task.await.expect("engine task");
        drop(events);
        elapsed
    })
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments. `BENCH_SMOKE=1` proves
    // the bench still runs, in seconds (used by `make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cases = std::env::var("RESTORE_CASES").unwrap_or_else(|_| {
        if smoke {
            "embedded:1000,kafka:1000"
        } else {
            "embedded:100000,kafka:100000,kafka:1000000"
        }
        .into()
    });
    let seen = env_or("RESTORE_SEEN", 100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Each case this many times, each on a broker of its own: the summary gives the median
    // and the range, and a target counts as met only if every run met it.
    let runs = env_or("RESTORE_RUNS", if smoke { 1 } else { 3 });
    println!("## Recovery: restoring watches from the state topic\n");
    println!("Each case {runs} time(s), each run on a broker of its own; a line per run.\n");
    for case in cases.split(',') {
        let (on, n) = case
            .trim()
            .split_once(':')
            .and_then(|(on, n)| Some((on, n.parse().ok()?)))
            .unwrap_or_else(|| panic!("RESTORE_CASES: {case:?} is not <broker>:<watches>"));
        let mut results: Vec<Restored> = (0..runs)
            .map(|_| restore_case(&runtime, on, n, seen))
            .collect();
        println!();
        let target =
            (seen == TARGET_SEEN && n >= TARGET_FROM).then(|| n as f64 * TARGET_US_PER_WATCH / 1e6);
        let met = target.is_none_or(|t| results.iter().all(|r| r.total <= t));
        results.sort_by(|a, b| a.total.total_cmp(&b.total));
        let (low, high) = (results[0].total, results[results.len() - 1].total);
        let median = &results[results.len() / 2];
        print!(
            "{}",
            summary_line(
                &format!(
                    "recovery: restore {n} watches x {seen} seen outputs from the state topic, {on}"
                ),
                &format!(
                    "{:.2} s, median of {runs} (runs {low:.2}–{high:.2} s; the median run: {}; {:.1}x a fresh start)",
                    median.total, median.phases, median.ratio
                ),
                &target.map_or("(measured)".into(), |t| format!("≤ {t} s, every run")),
                met
            )
        );
    }
}

/// One run of a case, for the summary.
struct Restored {
    /// Seconds from the first read to the last watch restored.
    total: f64,
    /// The phases, as printed.
    phases: String,
    /// `total` over a fresh start's.
    ratio: f64,
}

/// Issue 50's targets: 100,000 watches of 100 seen outputs restored within 1 s, 1,000,000
/// within 10 s — both 10 µs per watch. Smaller sizes (the smoke run) are measured without a
/// target.
const TARGET_US_PER_WATCH: f64 = 10.0;
const TARGET_SEEN: usize = 100;
const TARGET_FROM: usize = 100_000;

/// Watches whose every seen hash is checked after the restore: all of them up to this
/// many, else every `n / CHECKED`th (computing 100 hashes of a million watches again would
/// take longer than the restore).
const CHECKED: usize = 100_000;

/// Partitions up to which the recoveries are also timed all at once.
const AT_ONCE_MAX: i32 = 64;

/// A partition's plan as its task makes it ([`NoOp`] resolves every input; a day's
/// retention).
fn plan_partition(
    source: &RecoverySource,
    found: recovery::Found,
    partition: i32,
    now: Millis,
) -> recovery::Plan<()> {
    recovery::plan(
        found,
        &NoOp,
        source.state_topic.clone(),
        partition,
        86_400_000,
        now,
    )
}

/// One run of a case: fill a broker (`on`: `embedded` or `kafka`) with `n` watches of
/// `seen` outputs, restore them, print the line.
fn restore_case(runtime: &tokio::runtime::Runtime, on: &str, n: usize, seen: usize) -> Restored {
    // The baseline first, on a heap the restore has not used yet.
    let keys: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(format!("user-{i:06}")))
        .collect();
    let fresh = engine_time(
        runtime,
        n,
        keys.into_iter().map(|key| Command::Watch {
            key,
            input: Arc::new(()),
            input_time: 0,
        }),
        |e| matches!(e, Event::Started { .. }),
    );

    let clock = Clock::system();
    let store = Store::start(on);
    let partitions = store.partitions_for(n, seen);
    let described = store.describe(partitions);
    let written = fill_broker(&store, runtime, n, seen, partitions, clock.now_ms());
    // The bridge's readers' settings (`kafka/clients.rs`), with no `KAFKA_*` property.
    let clients = KafkaSettings {
        brokers: store.bootstrap(),
        properties: Default::default(),
        group_id: "restore-bench".into(),
    };
    let kafka = watchbridge::kafka::health::KafkaContext::new(
        watchbridge::kafka::health::BrokerHealth::new(
            &store.bootstrap(),
            Arc::new(watchbridge::metrics::Metrics::new()),
        ),
    );
    let lookups = Lookups::start(&clients, &kafka, INPUT);
    let source = RecoverySource {
        consumer_config: clients.recovery_reader(Isolation::ReadCommitted),
        kafka,
        input_topic: INPUT.into(),
        group_id: "restore-bench".into(),
        watermark_topic: WATERMARKS.into(),
        state_topic: STATE.into(),
        output_topic: OUTPUT.into(),
        output_partitions: partitions,
        outputs_by_input_partition: true,
        read_outputs: true,
        settle_outputs: false,
        output_keys: None,
        lookups,
    };

    // Each partition as its task recovers it: read, then plan. The bridge runs the
    // partitions' recoveries side by side; here one after the other, the times summed.
    let (mut read, mut planned) = (Duration::ZERO, Duration::ZERO);
    let mut restores = Vec::with_capacity(n);
    let mut states = Vec::new();
    for partition in 0..partitions {
        let t0 = Instant::now();
        let found = recovery::read(&source, partition).expect("the state partition read back");
        read += t0.elapsed();
        assert_eq!(
            found.state_records, written.per_partition[partition as usize],
            "every record of state partition {partition} read"
        );
        assert_eq!((found.undecodable, found.outputs_read), (0, 0));
        assert!(found.offsets.is_some(), "the checkpoint's output offsets");
        let live = found.live.len();

        let t0 = Instant::now();
        let plan = plan_partition(&source, found, partition, clock.now_ms());
        planned += t0.elapsed();
        assert_eq!(plan.restores.len(), live, "every watch restored");
        assert!(!plan.first_time && plan.tombstones.is_empty());
        restores.extend(plan.restores);
        states.push(plan.state);
    }
    assert_eq!(restores.len(), n, "every watch restored");
    // Each watch with exactly the hashes it was saved with (not timed; a sample of a large
    // restore, see CHECKED).
    let stride = n.div_ceil(CHECKED).max(1);
    for w in restores.iter().step_by(stride) {
        let i: usize = std::str::from_utf8(&w.key)
            .ok()
            .and_then(|k| k.strip_prefix("user-"))
            .and_then(|i| i.parse().ok())
            .expect("a key this bench wrote");
        assert_eq!(w.seen.len(), seen, "watch {i}: every seen hash restored");
        assert!(
            (0..seen).all(|j| w.seen.contains(output_hash(i, j))),
            "watch {i}: every seen hash restored"
        );
    }
    assert_eq!(states.iter().map(|s| s.live()).sum::<usize>(), n);

    let restored = engine_time(
        runtime,
        n,
        restores.into_iter().map(|w| Command::Restore(Box::new(w))),
        |e| matches!(e, Event::Restored { .. }),
    );
    drop(states);

    // With more than one partition, the recoveries once more, all at once, each partition
    // on a thread of its own reading then planning, as the bridge's partition tasks run
    // them (the read on a blocking thread, the plan in the task; the runtime's workers and
    // the blocking threads share the machine's cores): most of a read is fixed waiting
    // (below), which these overlap, and the plans share the cores. Timed from the first
    // read to the last plan. (Not past AT_ONCE_MAX partitions: a consumer per partition,
    // each with its threads.)
    let at_once = (partitions > 1 && partitions <= AT_ONCE_MAX).then(|| {
        let t0 = Instant::now();
        std::thread::scope(|scope| {
            let recoveries: Vec<_> = (0..partitions)
                .map(|partition| {
                    let source = &source;
                    scope.spawn(move || {
                        let found = recovery::read(source, partition)?;
                        let plan = plan_partition(source, found, partition, clock.now_ms());
                        Ok::<_, recovery::Unreadable>(plan.restores.len())
                    })
                })
                .collect();
            let live: usize = recoveries
                .into_iter()
                .map(|r| {
                    r.join()
                        .expect("a recovery")
                        .expect("a partition read back")
                })
                .sum();
            assert_eq!(live, n, "every watch read back and planned");
        });
        t0.elapsed()
    });
    drop(store);

    // The recoveries as the bridge runs them: all at once where timed so.
    let total = match at_once {
        Some(both) => both + restored,
        None => read + planned + restored,
    };
    let peak = peak_rss().map_or(String::new(), |b| {
        format!("; peak RSS of the process so far {:.2} GB", b as f64 / 1e9)
    });
    let read_detail = match at_once {
        None if partitions == 1 => format!(
            "{:.0} MB/s",
            written.bytes as f64 / 1e6 / read.as_secs_f64()
        ),
        _ => format!(
            "{partitions} partitions one after the other, {:.0} ms each",
            read.as_secs_f64() * 1e3 / partitions as f64
        ),
    };
    // The phases one after the other, then (where timed) the reads and plans all at once.
    let phases = format!(
        "read {:.2} s, plan {:.2} s{}, engine {:.2} s",
        read.as_secs_f64(),
        planned.as_secs_f64(),
        at_once.map_or(String::new(), |t| format!(
            " (read and plan all at once {:.2} s)",
            t.as_secs_f64()
        )),
        restored.as_secs_f64(),
    );
    println!(
        "restore ({}): {n} watches x {seen} seen: {} records, {:.1} MB ({read_detail}); {phases}; total {:.2} s with the recoveries {} ({:.1} us/watch); fresh start {:.2} s; ratio {:.1}x{peak}",
        described,
        written.records,
        written.bytes as f64 / 1e6,
        total.as_secs_f64(),
        if at_once.is_some() { "all at once" } else { "one after the other" },
        total.as_secs_f64() * 1e6 / n as f64,
        fresh.as_secs_f64(),
        total.as_secs_f64() / fresh.as_secs_f64(),
    );
    Restored {
        total: total.as_secs_f64(),
        phases,
        ratio: total.as_secs_f64() / fresh.as_secs_f64(),
    }
}

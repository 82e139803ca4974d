//! Versus a peer on the JVM (issue 14): the real `watchbridge` binary against the same job
//! written with the plain Kafka Java client (`bench/java/NaiveBridge.java`, compiled by
//! `scripts/java-peer.sh`), on the same feed server and the same broker, Apache Kafka
//! itself, as ratios measured in one run. Run with `make bench` (or `cargo bench --bench
//! vs_java`); `BENCH_SMOKE=1` only proves it runs (tiny sizes, one run, under a minute).
//!
//! The peer was meant to be Kafka Connect (standalone) running castorm's HTTP source
//! connector (`com.github.castorm:kafka-connect-http`, one connector per URL); Maven Central
//! does not serve it (see [`CONNECT_PEER`]), so the peer is the plain-client program, as the
//! issue allows.
//!
//! **Throughput.** W watches, each an input `{"id": n}` (key `n`) on a topic of 4
//! partitions, produced before the job starts (not timed); the feed server
//! (`benches/support/feeds.rs`) answers `GET /feeds/{n}` with K items, complete at once,
//! after a fixed delay per response (`VS_JAVA_DELAYS_MS`, default `0,20`). Each job runs with
//! its own group and topics, measured by the observer (`benches/support/outputs.rs`: a
//! consumer in this process reading the output topic from the beginning until every one of
//! the N = W x K (watch, item) pairs was read). Figures: outputs/s = N / (job spawned → the
//! last missing output read), start-up included; steady = (N − 1) / (first → last output
//! read); CPU = the job process's CPU seconds (from /proc) per output; memory = its peak
//! resident set (`VmHWM`). Then the job gets SIGTERM and the observer reads to the end
//! offsets, so late duplicates count.
//!
//! **Crash.** W' feeds of K' items that grow: item 0 until the job's first output is read,
//! then item j appears j x (T / K') after that (`VS_JAVA_CRASH_SECS` = T), polled every
//! second. Half-way through T the job is SIGKILLed and started again at once with the same
//! settings (it gets its input partitions back once the killed member's session expired:
//! `session.timeout.ms`, the clients' default 45 s; `VS_JAVA_SESSION_TIMEOUT_MS` sets it for
//! both jobs, the smoke run 6 s). Once every output was read (at the latest, the session
//! timeout + 30 s after the feeds were complete) it gets SIGTERM, and the observer reads the
//! output topic to its end offsets, counting every (feed, item) pair with no dedup before
//! counting: duplicates = reads beyond the first, lost = pairs never read.
//!
//! Runs: `VS_JAVA_RUNS` (default 3) of the throughput cases, interleaved (watchbridge then
//! Java for each delay); median and min–max, ratios watchbridge / Java per run. One crash
//! run per job. Sizes: `VS_JAVA_WATCHES` (W, default 2,000), `VS_JAVA_ITEMS` (K, default
//! 100), `VS_JAVA_CRASH_WATCHES` (W', default 500), `VS_JAVA_CRASH_ITEMS` (K', default 40),
//! `VS_JAVA_CRASH_SECS` (T, default 20). `VS_JAVA_LOG` is watchbridge's log filter (default
//! `warn`). The broker is a fresh Apache Kafka (`scripts/kafka.sh`,
//! `tests/support/kafka_process.rs`) for the whole bench. The section goes to stdout: `make bench` writes it to `bench/results/vs_java.md`.

use rdkafka::consumer::BaseConsumer;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

#[path = "support/mod.rs"]
mod support;
use support::broker_process::BrokerProcess;
use support::feeds::{feed_items, FeedServer, Feeds, PAYLOAD_BYTES};
use support::job::{log_path, log_tail, spawn_logged, watchbridge_command};
use support::kafka::watch_inputs;
use support::outputs::{observer, Observed};
use support::report::{
    command_output, disturbed_note, env_ms_list, env_or, machine, median, min_max, now_ms, rate,
    summary_line, utc_now,
};
use support::tansu_process::Storage;
use support::versus::{measure, ratios, stop, Case, Measured, Observe};

/// Partitions of the input and output topics.
const PARTITIONS: i32 = 4;
/// The jobs, in the order each run runs them.
const JOBS: [Job; 2] = [Job::Watchbridge, Job::Java];
/// Why the peer is not Kafka Connect: what Maven Central answered (checked 2026-12-01 with
/// `mvn dependency:get` and by URL).
const CONNECT_PEER: &str = "castorm's HTTP source connector for Kafka Connect \
    (`com.github.castorm:kafka-connect-http` 0.8.11, its `plugin` `tar.gz`) is not served by \
    Maven Central: the plugin archive, the jar, the pom and the artifact's \
    `maven-metadata.xml` all answer 404 (`mvn dependency:get \
    -Dartifact=com.github.castorm:kafka-connect-http:0.8.11:tar.gz:plugin` fails, and so \
    does the `RELEASE` version). So, as issue 14 allows, the peer is the same job written \
    as a plain-client Java program";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Watchbridge,
    Java,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::Watchbridge => "watchbridge",
            Job::Java => "java",
        }
    }
}

struct Sizes {
    watches: usize,
    items: usize,
    delays_ms: Vec<u64>,
    runs: usize,
    crash_watches: usize,
    crash_items: usize,
    crash_secs: usize,
    /// The consumer groups' session timeout, ms, for both jobs (None: the clients' default,
    /// 45 s): a restarted member gets its partitions once the killed one's session expired.
    session_timeout_ms: Option<usize>,
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in well under a minute (`make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let (watches, items, runs, delays) = if smoke {
        (20, 10, 1, "0")
    } else {
        (2_000, 100, 3, "0,20")
    };
    let (crash_watches, crash_items, crash_secs) = if smoke { (20, 10, 4) } else { (500, 40, 20) };
    // The smoke run cuts the 45 s wait for the killed member's session to the broker's
    // minimum (`group.min.session.timeout.ms`, 6 s) to stay under a minute.
    let session_timeout_ms = std::env::var("VS_JAVA_SESSION_TIMEOUT_MS")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("VS_JAVA_SESSION_TIMEOUT_MS={v} is not a number of ms"))
        })
        .or(smoke.then_some(6_000));
    let delays_ms = env_ms_list("VS_JAVA_DELAYS_MS", delays);
    let s = Sizes {
        watches: env_or("VS_JAVA_WATCHES", watches),
        items: env_or("VS_JAVA_ITEMS", items),
        delays_ms,
        runs: env_or("VS_JAVA_RUNS", runs),
        crash_watches: env_or("VS_JAVA_CRASH_WATCHES", crash_watches),
        crash_items: env_or("VS_JAVA_CRASH_ITEMS", crash_items),
        crash_secs: env_or("VS_JAVA_CRASH_SECS", crash_secs),
        session_timeout_ms,
    };
    assert!(
        s.watches >= 1
            && s.items >= 1
            && s.runs >= 1
            && s.crash_watches >= 1
            && s.crash_items >= 1
            && s.crash_secs >= 2,
        "VS_JAVA_* sizes must be at least 1 (VS_JAVA_CRASH_SECS at least 2)"
    );
    s
}

// ---------------------------------------------------------------------------------------
// The jobs.

/// How to start the jobs on one broker.
struct Jobs {
    bootstrap: String,
    /// The Java peer's class path (`scripts/java-peer.sh classpath`).
    classpath: String,
    session_timeout_ms: Option<usize>,
    broker_pid: String,
}

impl Jobs {
    /// `job` for the topics and group named `id`, polling the feeds at `feeds`.
    fn command(&self, job: Job, id: &str, feeds: &str) -> Command {
        let session = self.session_timeout_ms.map(|ms| ms.to_string());
        match job {
            Job::Watchbridge => {
                let mut c = watchbridge_command(&self.bootstrap, id, feeds, "VS_JAVA_LOG");
                if let Some(ms) = &session {
                    c.env("KAFKA_SESSION_TIMEOUT_MS", ms);
                }
                c
            }
            Job::Java => {
                // The JVM's defaults (heap, GC) are what a user gets; only the clients'
                // logging is cut to warnings, as watchbridge's is.
                let mut c = Command::new("java");
                c.arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                    .args(["-cp", &self.classpath, "NaiveBridge"])
                    .args(["--bootstrap", &self.bootstrap])
                    .args(["--group", &format!("{id}-group")])
                    .args(["--input-topic", &format!("{id}.in")])
                    .args(["--output-topic", &format!("{id}.out")])
                    .args(["--url", &format!("{feeds}/feeds/{{id}}")])
                    .args(["--poll-interval", "1"]);
                if let Some(ms) = &session {
                    c.args(["--session-timeout-ms", ms]);
                }
                c
            }
        }
    }

    fn spawn(&self, job: Job, id: &str, feeds: &str, log: &Path) -> Child {
        spawn_logged(self.command(job, id, feeds), job.name(), log)
    }
}

/// The Java peer's class path, compiled once into the cache by `scripts/java-peer.sh`.
fn java_classpath() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("scripts/java-peer.sh")
        .arg("classpath")
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {root}/scripts/java-peer.sh: {e}"));
    assert!(
        out.status.success(),
        "{root}/scripts/java-peer.sh failed ({}): see its message above",
        out.status
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Records for `wait`, counted by `seen`.
fn observe(consumer: &BaseConsumer, seen: &mut Observed, job: Job, wait: Duration) {
    match consumer.poll(wait) {
        Some(Ok(msg)) => seen.record(&msg),
        Some(Err(e)) => panic!("{}: observer: {e}", job.name()),
        None => {}
    }
}

// ---------------------------------------------------------------------------------------
// Throughput.

/// One throughput case of `job`: topics, inputs and feed server, then the job, measured
/// by the observer ([`measure`]).
fn run_throughput(
    runtime: &tokio::runtime::Runtime,
    s: &Sizes,
    jobs: &Jobs,
    job: Job,
    delay_ms: u64,
    id: &str,
) -> Measured {
    let case = Case {
        job: job.name(),
        bootstrap: &jobs.bootstrap,
        broker_pid: &jobs.broker_pid,
        // Inputs batched as usual: Apache Kafka serves a fetch from inside a batch.
        storage: Storage::Sqlite,
        id,
        partitions: PARTITIONS,
        watches: s.watches,
        items: s.items,
        delay_ms,
        // As its figures were first measured (no target rests on them); vs_python samples
        // high watermarks instead (`Observe::EndOffsets`).
        observe: Observe::Reading,
    };
    measure(runtime, &case, |feeds, log| jobs.spawn(job, id, feeds, log))
}

// ---------------------------------------------------------------------------------------
// Crash.

/// What one job emitted around a SIGKILL and a restart.
struct Crash {
    expected: usize,
    /// Output records read in all (watermarks aside).
    read: usize,
    duplicates: usize,
    lost: usize,
    wrong_time: usize,
    /// Outputs read before the kill.
    before_kill: usize,
    /// Job started → killed.
    killed_at: Duration,
    /// Restart → every output read (None: not every output was ever read).
    recovered_after: Option<Duration>,
}

impl Crash {
    fn recovered(&self) -> String {
        self.recovered_after
            .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
    }
}

fn run_crash(
    runtime: &tokio::runtime::Runtime,
    s: &Sizes,
    jobs: &Jobs,
    job: Job,
    id: &str,
) -> Crash {
    let output = format!("{id}.out");
    let (w, k) = (s.crash_watches, s.crash_items);
    let reveal = Duration::from_secs(s.crash_secs as u64);
    runtime.block_on(watch_inputs(
        &jobs.bootstrap,
        id,
        PARTITIONS,
        w,
        Storage::Sqlite,
    ));
    let consumer = observer(&jobs.bootstrap, &output, PARTITIONS);
    let log = log_path(id);
    let mut seen = Observed::new(w, k, PARTITIONS);
    // The feeds start growing when the job's first output is read, so that the kill falls
    // in the middle of the growth however long the job takes to start.
    let growth = Arc::new(OnceLock::new());
    let server = runtime.block_on(FeedServer::start(
        Feeds::Growing {
            items: feed_items(w, k, now_ms()),
            start: growth.clone(),
            step: reveal / k as u32,
        },
        Duration::ZERO,
    ));
    let spawned = Instant::now();
    let mut child = jobs.spawn(job, id, &server.url, &log);
    // The kill: half-way through the growth.
    while growth
        .get()
        .is_none_or(|g: &Instant| g.elapsed() < reveal / 2)
    {
        observe(&consumer, &mut seen, job, Duration::from_millis(20));
        if seen.first.is_some() {
            growth.get_or_init(Instant::now);
        }
        assert!(
            spawned.elapsed() < reveal + Duration::from_secs(120),
            "{}: no output after 120 s; the end of its log ({}):\n{}",
            job.name(),
            log.display(),
            log_tail(&log)
        );
    }
    let killed_at = spawned.elapsed();
    // SIGKILL, and at once the same job again.
    let _ = child.kill();
    let _ = child.wait();
    let before_kill = seen.read.iter().map(|&c| c as usize).sum();
    let restarted = Instant::now();
    let mut child = jobs.spawn(job, id, &server.url, &log);
    // Long enough for the killed member's session to expire (45 s by default) and for the
    // restarted job to catch up.
    let session = Duration::from_millis(s.session_timeout_ms.unwrap_or(45_000) as u64);
    let deadline = Instant::now() + reveal / 2 + session + Duration::from_secs(30);
    while seen.complete.is_none() && Instant::now() < deadline {
        observe(&consumer, &mut seen, job, Duration::from_millis(20));
        if let Some(status) = child.try_wait().expect("poll the job") {
            panic!(
                "{} exited after its restart ({status}); the end of its log ({}):\n{}",
                job.name(),
                log.display(),
                log_tail(&log)
            );
        }
    }
    let recovered_after = seen.complete.map(|at| at.duration_since(restarted));
    stop(job.name(), &mut child, &log);
    seen.read_to_end(&consumer, &jobs.bootstrap, &output, Duration::from_secs(30));
    drop(consumer);
    drop(server);
    if seen.lost() == 0 {
        let _ = std::fs::remove_file(&log);
    } else {
        eprintln!(
            "crash: {} lost outputs; its log is kept: {}",
            job.name(),
            log.display()
        );
    }
    Crash {
        expected: w * k,
        read: seen.read.iter().map(|&c| c as usize).sum(),
        duplicates: seen.duplicates,
        lost: seen.lost(),
        wrong_time: seen.wrong_time,
        before_kill,
        killed_at,
        recovered_after,
    }
}

// ---------------------------------------------------------------------------------------
// The report.

fn command_line() -> String {
    support::report::command_line(
        "vs_java",
        &[
            "BENCH_SMOKE",
            "VS_JAVA_WATCHES",
            "VS_JAVA_ITEMS",
            "VS_JAVA_DELAYS_MS",
            "VS_JAVA_RUNS",
            "VS_JAVA_CRASH_WATCHES",
            "VS_JAVA_CRASH_ITEMS",
            "VS_JAVA_CRASH_SECS",
            "VS_JAVA_SESSION_TIMEOUT_MS",
        ],
    )
}

fn median_rss(runs: &[Measured]) -> f64 {
    median(&runs.iter().map(|m| m.peak_rss as f64).collect::<Vec<_>>())
}

fn mb(bytes: f64) -> String {
    format!("{:.0} MB", bytes / 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let began = Instant::now();
    let classpath = java_classpath();
    // One broker for the whole bench (a JVM takes seconds to start); every job gets its own
    // topics and group.
    let broker = BrokerProcess::kafka("watchbridge-bench-kafka-").unwrap_or_else(|e| panic!("{e}"));
    let jobs = Jobs {
        bootstrap: broker.bootstrap.clone(),
        broker_pid: broker.pid(),
        classpath,
        session_timeout_ms: s.session_timeout_ms,
    };
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    let tag = std::process::id();

    // results[delay][job]: one Measured per run.
    let mut results: Vec<Vec<Vec<Measured>>> = s
        .delays_ms
        .iter()
        .map(|_| JOBS.iter().map(|_| Vec::new()).collect())
        .collect();
    for run in 0..s.runs {
        for (d, &delay) in s.delays_ms.iter().enumerate() {
            for (j, &job) in JOBS.iter().enumerate() {
                let id = format!("bench-vs-java-{tag}-{run}-{delay}ms-{}", job.name());
                let m = run_throughput(&runtime, &s, &jobs, job, delay, &id);
                eprintln!(
                    "run {}: delay {delay} ms: {}: {} outputs/s (first output after {:.2?}, then {} \
                     outputs/s); {:.1} CPU µs per output, {:.2} cores; peak RSS {}; duplicates {}, \
                     wrong timestamps {}; cores busy: broker {:.2}, others {:.2}",
                    run + 1,
                    job.name(),
                    rate(m.rate),
                    m.first_after,
                    rate(m.steady),
                    m.cpu_per_output * 1e6,
                    m.job_cores,
                    mb(m.peak_rss as f64),
                    m.duplicates,
                    m.wrong_time,
                    m.broker_cores,
                    m.others
                );
                results[d][j].push(m);
            }
        }
    }
    let crashes: Vec<Crash> = JOBS
        .iter()
        .map(|&job| {
            let id = format!("bench-vs-java-{tag}-crash-{}", job.name());
            let c = run_crash(&runtime, &s, &jobs, job, &id);
            eprintln!(
                "crash: {}: {} of {} outputs read before the kill; in all {} read, {} duplicates, \
                 {} lost, {} wrong timestamps; every output read {} after the restart",
                job.name(),
                c.before_kill,
                c.expected,
                c.read,
                c.duplicates,
                c.lost,
                c.wrong_time,
                c.recovered()
            );
            c
        })
        .collect();
    drop(runtime);
    drop(broker);
    let elapsed = began.elapsed();
    print!(
        "{}",
        report(&s, &results, &crashes, &jobs.classpath, elapsed)
    );
}

fn report(
    s: &Sizes,
    results: &[Vec<Vec<Measured>>],
    crashes: &[Crash],
    classpath: &str,
    elapsed: Duration,
) -> String {
    let mut t = String::new();
    t.push_str(
        "## watchbridge versus a peer on the JVM: the plain Kafka Java client (issue 14)\n\n",
    );
    t.push_str(&format!(
        "{CONNECT_PEER} (`bench/java/NaiveBridge.java`).\n\n**What each is.** watchbridge \
         starts one *watch* per input record: a new record on the input topic is a new URL to \
         poll, its outputs are deduplicated per watch, and what it has seen is kept on a state \
         topic. A Kafka Connect HTTP source like castorm's is *one connector per URL*, set up \
         through Connect's configuration, not by records; it keeps a source offset (the last \
         item's key or time) in Connect's offset store, written every \
         `offset.flush.interval.ms` (default 60 s). The Java peer here is the watchbridge job \
         written directly on the clients: a consumer group on the input topic, one watch per \
         input key, polls on a pool of 32 threads, a set of seen ids per watch in memory, a \
         producer with watchbridge's settings (idempotent, acks=all, lz4, linger.ms=5), and the \
         input offsets committed by hand every second up to the oldest input whose watch has \
         not ended (after a producer flush). **After a crash** the Java peer starts every \
         unfinished watch again from nothing, so it emits again what it had emitted for them \
         (at least once); Connect would re-emit what came after its last offset flush (at \
         least once as well); watchbridge restores every watch from its state topic and emits \
         each output once. The crash table below measures what each emitted.\n\n"
    ));
    t.push_str(&format!(
        "Throughput: {} watches x {} items = {} outputs (~{PAYLOAD_BYTES}-byte payloads), one \
         poll per watch (every feed complete at once), {PARTITIONS} partitions, one Apache \
         Kafka broker for the whole bench, fresh topics and group per job and run; {} run(s), \
         interleaved; median and min–max over the runs. **watchbridge**: the release binary, \
         `watchbridge run` with the HTTP poller, defaults otherwise (up to 256 polls in \
         flight, durable state, watermarks `bounded(5s)`). **java**: `NaiveBridge` on the \
         JVM's defaults (heap, GC). Rate: outputs / (job started → every output read by a \
         consumer of the output topic), start-up included; steady: (outputs − 1) / (first \
         output read → last). CPU: the job process's CPU time per output, start-up included; \
         memory: its peak resident set (VmHWM). Ratios: watchbridge / java, per run.\n\n",
        rate(s.watches as f64),
        s.items,
        rate((s.watches * s.items) as f64),
        s.runs
    ));
    t.push_str(
        "| resource latency | job | outputs/s (median) | min–max | steady outputs/s | first output after | CPU µs per output | job cores | peak RSS | duplicates |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut ratio_rows = String::new();
    let mut summary = String::new();
    for (d, &delay) in s.delays_ms.iter().enumerate() {
        for (j, job) in JOBS.iter().enumerate() {
            let m = &results[d][j];
            let of = |f: fn(&Measured) -> f64| -> Vec<f64> { m.iter().map(f).collect() };
            let rates = of(|m| m.rate);
            let (lo, hi) = min_max(&rates);
            let dups: usize = m.iter().map(|m| m.duplicates + m.wrong_time).sum();
            t.push_str(&format!(
                "| {delay} ms | {} | {} | {}–{} | {} | {:.2} s | {:.0} | {:.2} | {} | {dups} |\n",
                job.name(),
                rate(median(&rates)),
                rate(lo),
                rate(hi),
                rate(median(&of(|m| m.steady))),
                median(&of(|m| m.first_after.as_secs_f64())),
                median(&of(|m| m.cpu_per_output)) * 1e6,
                median(&of(|m| m.job_cores)),
                mb(median_rss(m)),
            ));
        }
        let ratio = |f| ratios(&results[d][0], &results[d][1], f);
        let (rates, steady) = (ratio(|m| m.rate), ratio(|m| m.steady));
        let cpu = ratio(|m| m.cpu_per_output);
        let rss = ratio(|m| m.peak_rss as f64);
        let ((rlo, rhi), (clo, chi), (mlo, mhi)) = (min_max(&rates), min_max(&cpu), min_max(&rss));
        ratio_rows.push_str(&format!(
            "| {delay} ms | **{:.2}x** | {rlo:.2}–{rhi:.2} | {:.2}x | **{:.2}** | {clo:.2}–{chi:.2} | **{:.2}** | {mlo:.2}–{mhi:.2} |\n",
            median(&rates),
            median(&steady),
            median(&cpu),
            median(&rss),
        ));
        let peer = "the same job on the plain Kafka Java client";
        summary.push_str(&summary_line(
            &format!("watchbridge / {peer}, outputs/s, resource latency {delay} ms"),
            &format!(
                "{:.2}x (runs {rlo:.2}–{rhi:.2}; steady {:.2}x)",
                median(&rates),
                median(&steady)
            ),
            "(no target)",
            true,
        ));
        summary.push_str(&summary_line(
            &format!("watchbridge / {peer}, CPU per output, resource latency {delay} ms"),
            &format!("{:.2} (runs {clo:.2}–{chi:.2})", median(&cpu)),
            "(no target)",
            true,
        ));
        summary.push_str(&summary_line(
            &format!("watchbridge / {peer}, peak RSS, resource latency {delay} ms"),
            &format!(
                "{:.2} ({} vs {})",
                median(&rss),
                mb(median_rss(&results[d][0])),
                mb(median_rss(&results[d][1])),
            ),
            "(no target)",
            true,
        ));
    }
    t.push_str(
        "\n| resource latency | outputs/s, watchbridge / java | min–max | steady | CPU per output, watchbridge / java | min–max | peak RSS, watchbridge / java | min–max |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    t.push_str(&ratio_rows);
    t.push_str(&format!(
        "\nCrash: {} growing feeds x {} items (item 0 until the job's first output is read, \
         then item j appears j x {:.2} s after that: complete after {} s), polled every second; \
         the job SIGKILLed half-way through the growth and started again at once with the same \
         group: \
         it gets the input partitions back once the killed member's session expired \
         (`session.timeout.ms`: {}). Then SIGTERM once every output was read (or, at the \
         latest, the session timeout + 30 s after the feeds were complete), and the output topic read to its end offsets, every (feed, item) counted with \
         no dedup before counting.\n\n\
         | job | expected outputs | killed after | read before the kill | read in all | duplicates | lost | wrong timestamps | every output read after the restart |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        s.crash_watches,
        s.crash_items,
        s.crash_secs as f64 / s.crash_items as f64,
        s.crash_secs,
        s.session_timeout_ms
            .map_or("the clients' default, 45 s".into(), |ms| format!("{ms} ms, for both jobs")),
    ));
    for (job, c) in JOBS.iter().zip(crashes) {
        t.push_str(&format!(
            "| {} | {} | {:.1} s | {} | {} | {} | {} | {} | {} |\n",
            job.name(),
            c.expected,
            c.killed_at.as_secs_f64(),
            c.before_kill,
            c.read,
            c.duplicates,
            c.lost,
            c.wrong_time,
            c.recovered()
        ));
    }
    let crash = |c: &Crash| format!("{} duplicates, {} lost", c.duplicates, c.lost);
    summary.push_str(&summary_line(
        &format!(
            "after a SIGKILL and a restart, of {} outputs: watchbridge / the plain Java client",
            crashes[0].expected
        ),
        &format!("{} / {}", crash(&crashes[0]), crash(&crashes[1])),
        "(no target)",
        true,
    ));
    let others: Vec<f64> = results
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.others)
        .collect();
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let clients = classpath
        .split(':')
        .filter_map(|jar| jar.rsplit('/').next()?.strip_prefix("kafka-clients-"))
        .map(|v| v.trim_end_matches(".jar"))
        .next()
        .unwrap_or("?");
    t.push_str(&format!(
        "\n- machine: {}; cores busy besides the job and the broker (this bench's observer and \
         feed server, anything else): up to {:.2}; the broker: up to {:.2}\n- versions: {}, watchbridge {} (commit {}, \
         librdkafka {librdkafka}), {}, Kafka Java client {clients}, broker Apache Kafka {clients} \
         (`scripts/kafka.sh`: one KRaft node, 512 MB heap)\n\
         - command: `{}` ({:.0} s)\n- date: {}\n",
        machine(),
        min_max(&others).1,
        results
            .iter()
            .flatten()
            .flatten()
            .map(|m| m.broker_cores)
            .fold(0.0, f64::max),
        command_output("rustc", &["-V"]),
        env!("CARGO_PKG_VERSION"),
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        command_output("java", &["--version"])
            .lines()
            .next()
            .unwrap_or("java"),
        command_line(),
        elapsed.as_secs_f64(),
        utc_now(),
    ));
    t.push_str(&disturbed_note(&others));
    t.push_str(&summary);
    t
}

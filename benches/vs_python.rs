//! Versus what a user would write instead (issue 8, case 5; issue 50): the real
//! `watchbridge` binary against the same job written in Python with confluent-kafka, in
//! two ways, on the same data, as ratios with 95% intervals. **Python, concurrent**
//! (`bench/python/concurrent_bridge.py`): what a competent Python engineer would write, an
//! asyncio task per watch, aiohttp on uvloop, orjson, as many polls in flight as
//! watchbridge's default (`WATCHBRIDGE_MAX_IN_FLIGHT`, 256, read from `watchbridge run
//! --help`) bounded by a semaphore. **Python, sequential** (`bench/python/naive_bridge.py`): one loop that
//! consumes inputs and polls every active watch's URL in turn, one request in flight, the
//! standard library's `json` (the obvious way, the comparison of issue 8). Both
//! keep a `set` of seen ids per watch, produce with an idempotent producer with
//! watchbridge's settings (acks=all, lz4, linger.ms=5) and count delivery reports, and
//! consume with watchbridge's input consumer's `fetch.wait.max.ms` (20 ms: Tansu holds
//! every fetch for the whole wait, librdkafka's 500 ms would delay each batch of inputs).
//! Run with `make bench` (or `cargo bench --bench vs_python`); `BENCH_SMOKE=1` only proves
//! it runs (20 watches x 10 items, one run).
//!
//! The data: W watches, each an input `{"id": n}` (key `n`) on a topic of 4 partitions,
//! produced before the job starts (not timed). An HTTP server in this process answers
//! `GET /feeds/{n}` with `{"items": [{"id", "time" (epoch ms), "payload" (~100 bytes)}
//! x K], "complete": true}` after a fixed delay per response: 0 ms (a local resource) and
//! 20 ms (a remote API). So every watch takes one poll and yields K outputs, N = W x K in
//! all.
//!
//! Each job (`watchbridge run` as a subprocess with the HTTP poller; the Python scripts from
//! the venv of `scripts/python-venv.sh`) runs on a fresh broker of its own, with its own
//! group and topics: Tansu (memory storage; `VS_PYTHON_STORAGE=sqlite` for the SQLite one)
//! and Apache Kafka (one KRaft node, a log on disk), a section each (`VS_PYTHON_BROKER`:
//! `tansu`, `kafka` or `both`, the default; the smoke run Tansu only), and is
//! measured by the same observer in this process. While the job runs it only asks the
//! broker for the output partitions' high watermarks every 2 ms (`support/end_offsets.rs`);
//! once the topic holds N records it reads them, until every one of the N (watch, item)
//! pairs was read, checking each was read once and carries its item's time as its
//! timestamp. Each output was on the topic at the first sample whose high watermark had
//! passed its offset. Figures: outputs/s = N / (job spawned → the last missing output on
//! the topic), start-up included; and first → last output, (N − 1) / that time. CPU per
//! output: the job process's user + system time (all its threads, `/proc/PID/stat`) from
//! its start to the sample that first shows N records on the topic, read at that moment
//! while the job still runs, over N; start-up included. Every job, the Python ones too, is
//! then stopped the same way (SIGTERM: it flushes and leaves), so none exits and is reaped
//! before its CPU time is read; the observer reads on to the end of the topic to count late
//! duplicates. Outputs per CPU-second = 1 / CPU per output. `VS_PYTHON_OBSERVE=reading`
//! reads every output as it comes instead (the observer of earlier versions: on these 2
//! cores it took about a third of the machine from watchbridge's run).
//!
//! Runs: `VS_PYTHON_RUNS` (default 5), alternating (each run: every workload, and in each
//! watchbridge, Python concurrent, Python sequential); median and min–max per job, and
//! watchbridge ÷ each Python job as the geometric mean of the per-run ratios with its 95%
//! interval (`support/stats.rs`). Sizes: `VS_PYTHON_WATCHES` (W, default 2,000),
//! `VS_PYTHON_ITEMS` (K, default 100), `VS_PYTHON_DELAYS_MS` (default `0,20`).
//! `VS_PYTHON_CONCURRENT_ARGS`: more arguments for the concurrent job, comma-separated
//! (`--json=stdlib,--loop=asyncio` runs it without orjson and uvloop). `VS_PYTHON`
//! is a Python interpreter to use instead of the venv's (it needs
//! `bench/python/requirements.txt`). `VS_PYTHON_LOG` is watchbridge's log filter (default
//! `warn`). The table goes to stdout: `make bench` writes it to `bench/results/vs_python.md`,
//! a section of `bench/RESULTS.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

#[path = "support/mod.rs"]
mod support;
use support::broker_process::BrokerProcess;
use support::feeds::PAYLOAD_BYTES;
use support::job::{spawn_logged, watchbridge_command};
use support::report::{
    command_output, disturbed_note, env_ms_list, env_or, machine, median, min_max, rate,
    summary_line, utc_now,
};
use support::stats::{paired_ratio, Interval};
use support::tansu_process;
use support::versus::{measure, Case, Measured, Observe};
use tansu_process::{tansu_bin, tansu_version, Storage};

/// Partitions of the input and output topics.
const PARTITIONS: i32 = 4;
/// The jobs, in the order each run runs them; watchbridge first (the ratios' numerator).
const JOBS: [Job; 3] = [
    Job::Watchbridge,
    Job::PythonConcurrent,
    Job::PythonSequential,
];
/// Outputs per CPU-second, watchbridge ÷ the concurrent Python job (issue 50).
const CPU_TARGET: f64 = 10.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Watchbridge,
    /// `bench/python/concurrent_bridge.py`: asyncio, as many polls in flight as watchbridge.
    PythonConcurrent,
    /// `bench/python/naive_bridge.py`: one poll after the other.
    PythonSequential,
}

impl Job {
    /// For topic and group names.
    fn slug(self) -> &'static str {
        match self {
            Job::Watchbridge => "watchbridge",
            Job::PythonConcurrent => "python-concurrent",
            Job::PythonSequential => "python-sequential",
        }
    }

    /// For the tables.
    fn label(self) -> &'static str {
        match self {
            Job::Watchbridge => "watchbridge",
            Job::PythonConcurrent => "Python, concurrent",
            Job::PythonSequential => "Python, sequential",
        }
    }
}

struct Sizes {
    /// The brokers, each a section of its own (`VS_PYTHON_BROKER`).
    brokers: Vec<On>,
    storage: Storage,
    watches: usize,
    items: usize,
    delays_ms: Vec<u64>,
    runs: usize,
    observe: Observe,
}

impl Sizes {
    fn outputs(&self) -> usize {
        self.watches * self.items
    }
}

/// The broker a section runs on.
#[derive(Clone, Copy, PartialEq)]
enum On {
    /// Tansu (`VS_PYTHON_STORAGE`: memory or SQLite).
    Tansu,
    /// Apache Kafka, one KRaft node (`scripts/kafka.sh`): a log on disk.
    Kafka,
}

impl On {
    fn start(self, s: &Sizes, setup: &Setup) -> BrokerProcess {
        match self {
            On::Tansu => BrokerProcess::tansu(&setup.tansu, s.storage, "watchbridge-bench-tansu-"),
            On::Kafka => BrokerProcess::kafka("watchbridge-bench-kafka-"),
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Tansu's storage; Kafka's batches are read as Tansu's SQLite ones are (whole).
    fn storage(self, s: &Sizes) -> Storage {
        match self {
            On::Tansu => s.storage,
            On::Kafka => Storage::Sqlite,
        }
    }

    fn name(self) -> &'static str {
        match self {
            On::Tansu => "Tansu",
            On::Kafka => "Apache Kafka",
        }
    }

    /// The broker, its version and storage, for the report.
    fn describe(self, s: &Sizes, setup: &Setup) -> String {
        match self {
            On::Tansu => format!("{} ({})", tansu_version(&setup.tansu), s.storage.describe()),
            On::Kafka => "Apache Kafka (`scripts/kafka.sh`: one KRaft node, a log on disk)".into(),
        }
    }
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in seconds (used by `make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let (watches, items, runs) = if smoke { (20, 10, 1) } else { (2_000, 100, 5) };
    let storage = match std::env::var("VS_PYTHON_STORAGE").as_deref() {
        Err(_) | Ok("memory") => Storage::Memory,
        Ok("sqlite") => Storage::Sqlite,
        Ok(other) => {
            panic!("VS_PYTHON_STORAGE={other}: expected `memory` (the default) or `sqlite`")
        }
    };
    let delays_ms = env_ms_list("VS_PYTHON_DELAYS_MS", "0,20");
    let brokers = match std::env::var("VS_PYTHON_BROKER").as_deref() {
        Err(_) if smoke => vec![On::Tansu],
        Err(_) | Ok("both") => vec![On::Tansu, On::Kafka],
        Ok("tansu") => vec![On::Tansu],
        Ok("kafka") => vec![On::Kafka],
        Ok(other) => {
            panic!("VS_PYTHON_BROKER={other}: expected `tansu`, `kafka` or `both` (the default)")
        }
    };
    let observe = match std::env::var("VS_PYTHON_OBSERVE").as_deref() {
        Err(_) | Ok("end-offsets") => Observe::EndOffsets,
        Ok("reading") => Observe::Reading,
        Ok(other) => {
            panic!("VS_PYTHON_OBSERVE={other}: expected `end-offsets` (the default) or `reading`")
        }
    };
    let s = Sizes {
        brokers,
        storage,
        watches: env_or("VS_PYTHON_WATCHES", watches),
        items: env_or("VS_PYTHON_ITEMS", items),
        delays_ms,
        runs: env_or("VS_PYTHON_RUNS", runs),
        observe,
    };
    assert!(
        s.watches >= 1 && s.items >= 1 && s.runs >= 1 && !s.delays_ms.is_empty(),
        "VS_PYTHON_WATCHES, VS_PYTHON_ITEMS and VS_PYTHON_RUNS must be at least 1, \
         VS_PYTHON_DELAYS_MS must name a delay"
    );
    s
}

// ---------------------------------------------------------------------------------------
// The jobs.

/// The Python interpreter of the venv (`scripts/python-venv.sh`), or `$VS_PYTHON`.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("VS_PYTHON") {
        return python.into();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("scripts/python-venv.sh")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {root}/scripts/python-venv.sh: {e}"));
    assert!(
        out.status.success(),
        "{root}/scripts/python-venv.sh failed ({}): see its message above; \
         or set VS_PYTHON to a python with bench/python/requirements.txt installed",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The most polls watchbridge keeps in flight here: `WATCHBRIDGE_MAX_IN_FLIGHT` if this
/// process has it (the bridge inherits it), else the default its `run --help` states. The
/// concurrent Python job gets as many, whatever the default becomes.
fn bridge_max_in_flight() -> usize {
    if let Ok(v) = std::env::var("WATCHBRIDGE_MAX_IN_FLIGHT") {
        return v
            .parse()
            .unwrap_or_else(|_| panic!("WATCHBRIDGE_MAX_IN_FLIGHT={v}: expected a number"));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_watchbridge"))
        .args(["run", "--help"])
        .output()
        .expect("run `watchbridge run --help`");
    let help = String::from_utf8_lossy(&out.stdout);
    help.split_once("--max-in-flight")
        .and_then(|(_, rest)| rest.split_once("[default: "))
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(default, _)| default.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!("no `--max-in-flight … [default: N]` in `watchbridge run --help`:\n{help}")
        })
}

/// Starts `job` for one case; its output goes to `log`. Every job runs until SIGTERM (the
/// Python ones without `--expect`), so its CPU time is read while it still runs.
fn spawn(
    job: Job,
    python: &Path,
    max_in_flight: usize,
    bootstrap: &str,
    id: &str,
    feeds: &str,
    log: &Path,
) -> Child {
    let script = match job {
        Job::Watchbridge => {
            let command = watchbridge_command(bootstrap, id, feeds, "VS_PYTHON_LOG");
            return spawn_logged(command, job.slug(), log);
        }
        Job::PythonConcurrent => "bench/python/concurrent_bridge.py",
        Job::PythonSequential => "bench/python/naive_bridge.py",
    };
    let mut c = Command::new(python);
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .args(["--bootstrap", bootstrap])
        .args(["--group", &format!("{id}-group")])
        .args(["--input-topic", &format!("{id}.in")])
        .args(["--output-topic", &format!("{id}.out")])
        .args(["--url", &format!("{feeds}/feeds/{{id}}")])
        .args(["--poll-interval", "1"]);
    if job == Job::PythonConcurrent {
        c.args(["--max-in-flight", &max_in_flight.to_string()]);
        // E.g. `--json=stdlib,--loop=asyncio`: the job without its faster libraries.
        if let Ok(extra) = std::env::var("VS_PYTHON_CONCURRENT_ARGS") {
            c.args(extra.split(',').map(str::trim).filter(|a| !a.is_empty()));
        }
    }
    spawn_logged(c, job.slug(), log)
}

/// What every case needs besides its job and workload.
struct Setup {
    tansu: PathBuf,
    python: PathBuf,
    max_in_flight: usize,
}

/// One job on one workload: a fresh broker, then [`measure`] (topics, inputs and feed
/// server; then the job, measured by the observer, then stopped with SIGTERM).
fn run_case(
    runtime: &tokio::runtime::Runtime,
    s: &Sizes,
    setup: &Setup,
    on: On,
    job: Job,
    delay_ms: u64,
    id: &str,
) -> Measured {
    let broker = on.start(s, setup);
    let case = Case {
        job: job.label(),
        bootstrap: &broker.bootstrap,
        broker_pid: &broker.pid(),
        storage: on.storage(s),
        id,
        partitions: PARTITIONS,
        watches: s.watches,
        items: s.items,
        delay_ms,
        observe: s.observe,
    };
    measure(runtime, &case, |feeds, log| {
        let (python, max) = (&setup.python, setup.max_in_flight);
        spawn(job, python, max, &broker.bootstrap, id, feeds, log)
    })
}

/// Outputs per CPU-second of the job process.
fn per_cpu_second(m: &Measured) -> f64 {
    1.0 / m.cpu_per_output
}

/// A rate, or `–` where there was none to time (every output in one sample of the
/// observer: a steady rate of a tiny smoke run).
fn rate_or_dash(r: f64) -> String {
    if r.is_finite() {
        rate(r)
    } else {
        "–".into()
    }
}

/// [`Interval::show`], or `–` where a run had no finite figure.
fn show_or_dash(i: &Interval) -> String {
    if i.estimate.is_finite() && i.estimate > 0.0 {
        i.show(1, "pairs")
    } else {
        "–".into()
    }
}

/// `f` of every run of one job.
fn of(runs: &[Measured], f: fn(&Measured) -> f64) -> Vec<f64> {
    runs.iter().map(f).collect()
}

/// watchbridge ÷ another job, per pair of runs: outputs per CPU-second, outputs/s, steady.
struct Versus {
    per_cpu: Interval,
    rate: Interval,
    steady: Interval,
}

impl Versus {
    fn new(watchbridge: &[Measured], other: &[Measured]) -> Versus {
        let ratio = |f| paired_ratio(&of(watchbridge, f), &of(other, f));
        Versus {
            per_cpu: ratio(per_cpu_second),
            rate: ratio(|m| m.rate),
            steady: ratio(|m| m.steady),
        }
    }
}

// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// The report.

fn command_line() -> String {
    support::report::command_line(
        "vs_python",
        &[
            "BENCH_SMOKE",
            "VS_PYTHON_WATCHES",
            "VS_PYTHON_ITEMS",
            "VS_PYTHON_DELAYS_MS",
            "VS_PYTHON_RUNS",
            "VS_PYTHON_STORAGE",
            "VS_PYTHON_BROKER",
            "VS_PYTHON_OBSERVE",
            "VS_PYTHON_CONCURRENT_ARGS",
            "VS_PYTHON",
        ],
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let setup = Setup {
        tansu: tansu_bin(),
        python: python(),
        max_in_flight: bridge_max_in_flight(),
    };
    let python_versions = command_output(
        setup.python.to_str().expect("a UTF-8 path"),
        &[
            "-c",
            "import sys, importlib.metadata as m, confluent_kafka as ck; \
             v = lambda p: f'{p} {m.version(p)}'; \
             print(f'Python {sys.version.split()[0]}, confluent-kafka {m.version(\"confluent-kafka\")} \
             (librdkafka {ck.libversion()[0]}), ' + ', '.join(map(v, ['requests', 'aiohttp', 'uvloop', 'orjson'])))",
        ],
    );
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");

    let mut sections = String::new();
    for &on in &s.brokers {
        let began = Instant::now();
        let results = run_all(&runtime, &s, &setup, on);
        sections.push_str(&report(
            &s,
            &setup,
            on,
            &results,
            &python_versions,
            began.elapsed(),
        ));
    }
    drop(runtime);
    print!("{sections}");
}

/// Every run of every workload and job on `on`: results[workload][job], one `Measured`
/// per run.
fn run_all(
    runtime: &tokio::runtime::Runtime,
    s: &Sizes,
    setup: &Setup,
    on: On,
) -> Vec<Vec<Vec<Measured>>> {
    let mut results: Vec<Vec<Vec<Measured>>> = s
        .delays_ms
        .iter()
        .map(|_| JOBS.iter().map(|_| Vec::new()).collect())
        .collect();
    let tag = std::process::id();
    for run in 0..s.runs {
        for (w, &delay) in s.delays_ms.iter().enumerate() {
            for (j, &job) in JOBS.iter().enumerate() {
                let id = format!("bench-vs-python-{tag}-{run}-{delay}ms-{}", job.slug());
                let m = run_case(runtime, s, setup, on, job, delay, &id);
                eprintln!(
                    "{}, run {}: delay {delay} ms: {}: {} outputs/s (first output after {:.2?}, then {} outputs/s); \
                     CPU {:.2} µs/output ({} outputs per CPU-second); duplicates {}, wrong timestamps {}; \
                     cores busy: job {:.2}, broker {:.2}, others {:.2}",
                    on.name(),
                    run + 1,
                    job.label(),
                    rate(m.rate),
                    m.first_after,
                    rate_or_dash(m.steady),
                    m.cpu_per_output * 1e6,
                    rate(per_cpu_second(&m)),
                    m.duplicates,
                    m.wrong_time,
                    m.job_cores,
                    m.broker_cores,
                    m.others
                );
                results[w][j].push(m);
            }
        }
    }
    results
}

/// This bench's section of bench/RESULTS.md.
fn report(
    s: &Sizes,
    setup: &Setup,
    on: On,
    results: &[Vec<Vec<Measured>>],
    python_versions: &str,
    elapsed: std::time::Duration,
) -> String {
    let inflight = setup.max_in_flight;
    let mut t = String::new();
    let _ = write!(
        t,
        "## watchbridge versus the same job in Python, on {} (issue 8, case 5; issue 50)\n\n",
        on.name()
    );
    let _ = write!(
        t,
        "{} watches x {} items = {} outputs (~{PAYLOAD_BYTES}-byte payloads), one poll per watch \
         (every feed complete at once), {PARTITIONS} partitions, a fresh {} per job and run; \
         {} run(s), alternating (watchbridge, Python concurrent, Python sequential); median and \
         min–max over the runs. **watchbridge**: the release binary, `watchbridge run` with the \
         HTTP poller, defaults otherwise (up to {inflight} polls in flight, durable state, \
         watermarks `bounded(5s)`). **Python, concurrent**: `bench/python/concurrent_bridge.py`, \
         an asyncio task per watch, aiohttp on uvloop, orjson, up to {inflight} polls in \
         flight (a semaphore: watchbridge's `WATCHBRIDGE_MAX_IN_FLIGHT`). **Python, \
         sequential**: `bench/python/naive_bridge.py`, one loop polling the watches one after \
         the other (requests Session, the standard library's `json`). Both Python jobs: a `set` of seen ids per watch, a confluent-kafka \
         Producer with watchbridge's settings (idempotent, acks=all, lz4, linger.ms=5) whose \
         delivery reports they count, and watchbridge's consumer fetch wait \
         (`fetch.wait.max.ms` 20). Rate: outputs / (job started → every output on the output \
         topic), start-up included; steady: (outputs − 1) / (first output on the topic → \
         last). {} CPU: user + system time of the job process (all its threads) from its \
         start to the moment the topic held every output, read then while it still ran \
         (every job is stopped afterwards with SIGTERM), over the outputs; start-up \
         included.\n\n",
        rate(s.watches as f64),
        s.items,
        rate(s.outputs() as f64),
        on.name(),
        s.runs,
        match s.observe {
            Observe::EndOffsets =>
                "When an output was on the topic: the first of the observer's \
                samples of the partitions' high watermarks (a `Fetch` of zero bytes every 2 ms) \
                past its offset; the outputs are read (and checked) once the topic holds them \
                all, so the observer takes no CPU from the job while it runs.",
            Observe::Reading =>
                "When an output was on the topic: when the observer (a \
                consumer reading the topic while the job runs) read it \
                (`VS_PYTHON_OBSERVE=reading`).",
        }
    );
    t.push_str(
        "| resource latency | job | outputs/s (median) | min–max | steady outputs/s (median) | min–max | first output after | CPU µs/output (median) | min–max | outputs per CPU-second | duplicates | job cores |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (w, &delay) in s.delays_ms.iter().enumerate() {
        for (j, job) in JOBS.iter().enumerate() {
            let m = &results[w][j];
            let rates = of(m, |m| m.rate);
            let steady = of(m, |m| m.steady);
            let cpu = of(m, |m| m.cpu_per_output * 1e6);
            let dups: usize = m.iter().map(|m| m.duplicates + m.wrong_time).sum();
            let ((rlo, rhi), (slo, shi), (clo, chi)) =
                (min_max(&rates), min_max(&steady), min_max(&cpu));
            let _ = writeln!(
                t,
                "| {delay} ms | {} | {} | {}–{} | {} | {}–{} | {:.2} s | {:.2} | {clo:.2}–{chi:.2} | {} | {dups} | {:.2} |",
                job.label(),
                rate(median(&rates)),
                rate(rlo),
                rate(rhi),
                rate_or_dash(median(&steady)),
                rate_or_dash(slo),
                rate_or_dash(shi),
                median(&of(m, |m| m.first_after.as_secs_f64())),
                median(&cpu),
                rate(1e6 / median(&cpu)),
                median(&of(m, |m| m.job_cores)),
            );
        }
    }

    t.push_str(
        "\nwatchbridge ÷ each Python job: the geometric mean of the per-run ratios (each run's \
         jobs ran one after the other), with its 95% interval.\n\n\
         | resource latency | versus | outputs per CPU-second | outputs/s | steady outputs/s |\n\
         |---|---|---|---|---|\n",
    );
    let mut summary = String::new();
    for (w, &delay) in s.delays_ms.iter().enumerate() {
        let concurrent = Versus::new(&results[w][0], &results[w][1]);
        let sequential = Versus::new(&results[w][0], &results[w][2]);
        for (job, v) in [(JOBS[1], &concurrent), (JOBS[2], &sequential)] {
            let _ = writeln!(
                t,
                "| {delay} ms | {} | **{}** | **{}** | {} |",
                job.label(),
                v.per_cpu.show(1, "pairs"),
                v.rate.show(1, "pairs"),
                show_or_dash(&v.steady),
            );
        }
        let concurrent_job = format!("Python, concurrent (asyncio, {inflight} polls in flight)");
        summary.push_str(&summary_line(
            &format!(
                "outputs per CPU-second, watchbridge / the same job in {concurrent_job}, \
                 resource latency {delay} ms, {}",
                on.name()
            ),
            &concurrent.per_cpu.show(1, "pairs"),
            &format!("≥ {CPU_TARGET}, the whole 95% interval (issue 50)"),
            concurrent.per_cpu.at_least(CPU_TARGET),
        ));
        summary.push_str(&summary_line(
            &format!(
                "outputs/s, watchbridge / the same job in {concurrent_job}, resource latency \
                 {delay} ms, {}",
                on.name()
            ),
            &concurrent.rate.show(1, "pairs"),
            "(no target)",
            true,
        ));
        summary.push_str(&summary_line(
            &format!(
                "watchbridge / the same job in Python, sequential (one request in flight), \
                 resource latency {delay} ms, {}",
                on.name()
            ),
            &format!(
                "outputs/s {}; outputs per CPU-second {}",
                sequential.rate.show(1, "pairs"),
                sequential.per_cpu.show(1, "pairs")
            ),
            "(no target)",
            true,
        ));
    }
    t.push_str(
        "\nDuplicates: outputs read more than once, plus outputs whose timestamp was not their \
         item's time, over all runs (every run also checks that every output arrived). Job \
         cores: CPU seconds of the job process / (job started → every output on the topic); \
         the Python jobs run one interpreter thread (the concurrent one also a worker thread \
         for the consumer's blocking `consume`) plus librdkafka's threads.\n",
    );
    // What bounds each job, from the shape of the work rather than from this run's figures.
    let ceilings = |in_flight: usize| -> String {
        let c: Vec<String> = s
            .delays_ms
            .iter()
            .filter(|&&d| d > 0)
            .map(|&d| {
                let r = (in_flight * s.items) as f64 * 1000.0 / d as f64;
                format!("{} outputs/s at {d} ms", rate(r))
            })
            .collect();
        if c.is_empty() {
            "none measured".into()
        } else {
            c.join(", ")
        }
    };
    let _ = write!(
        t,
        "\nReading the figures: the sequential Python loop waits for one response at a time, \
         so with a latency per response it cannot beat K items per response time ({}), \
         whatever the machine. The concurrent one waits for up to {inflight} at once (at most \
         {}), so like watchbridge it is bound by CPU rather than latency: by its one \
         interpreter thread (parsing, `json.dumps` and `produce` for every item), where \
         watchbridge spreads its work over both cores. Outputs per CPU-second compare the work \
         each does per output whatever the cores it had. watchbridge's start-up (group join, \
         creating and restoring its state, watermark and dead-letter topics) is in the rate \
         and in its CPU per output, not in the steady rate; the Python jobs' (interpreter and imports, \
         group join) likewise.\n",
        ceilings(1),
        ceilings(inflight),
    );
    let others: Vec<f64> = results
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.others)
        .collect();
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let _ = write!(
        t,
        "\n- machine: {}; cores busy besides the job and the broker (this bench's observer and \
         feed server, and anything else): up to {:.2}\n- versions: {}, watchbridge {} \
         (commit {}, librdkafka {librdkafka}), {python_versions}, {}\n- command: `{}` \
         ({:.0} s)\n- date: {}\n",
        machine(),
        min_max(&others).1,
        command_output("rustc", &["-V"]),
        env!("CARGO_PKG_VERSION"),
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        on.describe(s, setup),
        command_line(),
        elapsed.as_secs_f64(),
        utc_now(),
    );
    t.push_str(&disturbed_note(&others));
    t.push_str(&summary);
    // stdout: this bench's section of bench/RESULTS.md (`make bench` collects it).
    t.push('\n');
    t
}

//! Versus what a user would write instead (issue 8, case 5): the real `watchbridge` binary
//! against the same job written the obvious way in Python with confluent-kafka
//! (`bench/python/naive_bridge.py`: one loop that consumes inputs and polls every active
//! watch's URL in turn, a `set` of seen ids per watch, an idempotent producer with
//! watchbridge's settings), on the same data, as ratios. Run with `make bench` (or `cargo
//! bench --bench vs_python`); `BENCH_SMOKE=1` only proves it runs (20 watches x 10 items,
//! one run).
//!
//! The data: W watches, each an input `{"id": n}` (key `n`) on a topic of 4 partitions,
//! produced before the job starts (not timed). An HTTP server in this process answers
//! `GET /feeds/{n}` with `{"items": [{"id", "time" (epoch ms), "payload" (~100 bytes)}
//! x K], "complete": true}` after a fixed delay per response: 0 ms (a local resource) and
//! 20 ms (a remote API). So every watch takes one poll and yields K outputs, N = W x K in
//! all.
//!
//! Each job (`watchbridge run` as a subprocess with the HTTP poller, `naive_bridge.py` from
//! the venv of `scripts/python-venv.sh`) runs on a fresh Tansu of its own (memory storage;
//! `VS_PYTHON_STORAGE=sqlite` for the SQLite one), with its own group and topics, and is
//! measured by the same observer in this process. While the job runs it only asks the
//! broker for the output partitions' high watermarks every 2 ms (`support/end_offsets.rs`);
//! once the topic holds N records it reads them, until every one of the N (watch, item)
//! pairs was read, checking each was read once and carries its item's time as its
//! timestamp. Each output was on the topic at the first sample whose high watermark had
//! passed its offset. Figures: outputs/s = N / (job spawned → the last missing output on
//! the topic), start-up included; and first → last output, (N − 1) / that time. Afterwards
//! the job is stopped (watchbridge: SIGTERM; Python exits by itself after `--expect N`
//! deliveries), and the observer reads on to the end of the topic to count late duplicates.
//! `VS_PYTHON_OBSERVE=reading` reads every output as it comes instead (the observer of
//! earlier versions: on these 2 cores it took about a third of the machine from
//! watchbridge's run, and a few percent from Python's single-threaded one).
//!
//! Runs: `VS_PYTHON_RUNS` (default 3), interleaved (each run: both workloads, watchbridge
//! then Python); median and min–max, and the ratio watchbridge / Python per run. Sizes:
//! `VS_PYTHON_WATCHES` (W, default 2,000), `VS_PYTHON_ITEMS` (K, default 100),
//! `VS_PYTHON_DELAYS_MS` (default `0,20`). `VS_PYTHON` is a Python interpreter to use instead
//! of the venv's (it needs confluent-kafka and requests). `VS_PYTHON_LOG` is watchbridge's
//! log filter (default `warn`). The table goes to stdout: `make bench` writes it to
//! `bench/results/vs_python.md`, a section of `bench/RESULTS.md`.

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
use support::tansu_process;
use support::versus::{measure, ratios, Case, Measured, Observe};
use tansu_process::{tansu_bin, tansu_version, Storage};

/// Partitions of the input and output topics.
const PARTITIONS: i32 = 4;
/// The jobs, in the order each run runs them.
const JOBS: [Job; 2] = [Job::Watchbridge, Job::Python];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Watchbridge,
    Python,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::Watchbridge => "watchbridge",
            Job::Python => "python",
        }
    }
}

struct Sizes {
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

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in seconds (used by `make test`).
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    let (watches, items, runs) = if smoke { (20, 10, 1) } else { (2_000, 100, 3) };
    let storage = match std::env::var("VS_PYTHON_STORAGE").as_deref() {
        Err(_) | Ok("memory") => Storage::Memory,
        Ok("sqlite") => Storage::Sqlite,
        Ok(other) => {
            panic!("VS_PYTHON_STORAGE={other}: expected `memory` (the default) or `sqlite`")
        }
    };
    let delays_ms = env_ms_list("VS_PYTHON_DELAYS_MS", "0,20");
    let observe = match std::env::var("VS_PYTHON_OBSERVE").as_deref() {
        Err(_) | Ok("end-offsets") => Observe::EndOffsets,
        Ok("reading") => Observe::Reading,
        Ok(other) => {
            panic!("VS_PYTHON_OBSERVE={other}: expected `end-offsets` (the default) or `reading`")
        }
    };
    let s = Sizes {
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
         or set VS_PYTHON to a python with confluent-kafka and requests",
        out.status
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Starts `job` for one case; its output goes to `log`.
fn spawn(
    job: Job,
    python: &Path,
    bootstrap: &str,
    id: &str,
    feeds: &str,
    outputs: usize,
    log: &Path,
) -> Child {
    let command = match job {
        Job::Watchbridge => watchbridge_command(bootstrap, id, feeds, "VS_PYTHON_LOG"),
        Job::Python => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/python/naive_bridge.py");
            let mut c = Command::new(python);
            c.arg(script)
                .args(["--bootstrap", bootstrap])
                .args(["--group", &format!("{id}-group")])
                .args(["--input-topic", &format!("{id}.in")])
                .args(["--output-topic", &format!("{id}.out")])
                .args(["--url", &format!("{feeds}/feeds/{{id}}")])
                .args(["--poll-interval", "1"])
                .args(["--expect", &outputs.to_string()]);
            c
        }
    };
    spawn_logged(command, job.name(), log)
}

/// One job on one workload: a fresh broker, then [`measure`] (topics, inputs and feed
/// server; then the job, measured by the observer).
fn run_case(
    runtime: &tokio::runtime::Runtime,
    s: &Sizes,
    tansu: &Path,
    python: &Path,
    job: Job,
    delay_ms: u64,
    id: &str,
) -> Measured {
    let broker = BrokerProcess::tansu(tansu, s.storage, "watchbridge-bench-tansu-")
        .unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        job: job.name(),
        bootstrap: &broker.bootstrap,
        broker_pid: &broker.pid(),
        storage: s.storage,
        id,
        partitions: PARTITIONS,
        watches: s.watches,
        items: s.items,
        delay_ms,
        observe: s.observe,
    };
    // Python exits by itself once N outputs are delivered; watchbridge gets SIGTERM.
    measure(runtime, &case, |feeds, log| {
        spawn(job, python, &broker.bootstrap, id, feeds, s.outputs(), log)
    })
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
            "VS_PYTHON_OBSERVE",
            "VS_PYTHON",
        ],
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    let began = Instant::now();
    let tansu = tansu_bin();
    let python = python();
    let python_versions = command_output(
        python.to_str().expect("a UTF-8 path"),
        &[
            "-c",
            "import sys, importlib.metadata as m, confluent_kafka as ck; \
             print(f'Python {sys.version.split()[0]}, confluent-kafka {m.version(\"confluent-kafka\")} \
             (librdkafka {ck.libversion()[0]}), requests {m.version(\"requests\")}')",
        ],
    );
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");

    // results[workload][job]: one Measured per run.
    let mut results: Vec<Vec<Vec<Measured>>> = s
        .delays_ms
        .iter()
        .map(|_| JOBS.iter().map(|_| Vec::new()).collect())
        .collect();
    let tag = std::process::id();
    for run in 0..s.runs {
        for (w, &delay) in s.delays_ms.iter().enumerate() {
            for (j, &job) in JOBS.iter().enumerate() {
                let id = format!("bench-vs-python-{tag}-{run}-{delay}ms-{}", job.name());
                let m = run_case(&runtime, &s, &tansu, &python, job, delay, &id);
                eprintln!(
                    "run {}: delay {delay} ms: {}: {} outputs/s (first output after {:.2?}, then {} outputs/s); \
                     duplicates {}, wrong timestamps {}; cores busy: job {:.2}, tansu {:.2}, others {:.2}",
                    run + 1,
                    job.name(),
                    rate(m.rate),
                    m.first_after,
                    rate(m.steady),
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
    drop(runtime);
    let elapsed = began.elapsed();

    let mut t = String::new();
    t.push_str("## watchbridge versus a naive Python bridge (issue 8, case 5)\n\n");
    t.push_str(&format!(
        "{} watches x {} items = {} outputs (~{PAYLOAD_BYTES}-byte payloads), one poll per watch \
         (every feed complete at once), {PARTITIONS} partitions, a fresh Tansu per job and run; \
         {} run(s), interleaved; median and min–max over the runs. **watchbridge**: the release \
         binary, `watchbridge run` with the HTTP poller, defaults otherwise (up to 256 polls in \
         flight, durable state, watermarks `bounded(5s)`). **python**: \
         `bench/python/naive_bridge.py`, one loop polling the watches one after the other \
         (requests Session), a `set` per watch, confluent-kafka Producer with the same settings \
         (idempotent, acks=all, lz4, linger.ms=5). Rate: outputs / (job started → every output \
         on the output topic), start-up included; steady: (outputs − 1) / (first output on the \
         topic → last). {} Ratio: watchbridge / python, per run.\n\n",
        rate(s.watches as f64),
        s.items,
        rate(s.outputs() as f64),
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
    ));
    t.push_str(
        "| resource latency | job | outputs/s (median) | min–max | steady outputs/s (median) | min–max | first output after | duplicates | job cores |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut ratio_rows = String::new();
    let mut summary = String::new();
    for (w, &delay) in s.delays_ms.iter().enumerate() {
        for (j, job) in JOBS.iter().enumerate() {
            let m = &results[w][j];
            let rates: Vec<f64> = m.iter().map(|m| m.rate).collect();
            let steady: Vec<f64> = m.iter().map(|m| m.steady).collect();
            let firsts: Vec<f64> = m.iter().map(|m| m.first_after.as_secs_f64()).collect();
            let cores: Vec<f64> = m.iter().map(|m| m.job_cores).collect();
            let dups: usize = m.iter().map(|m| m.duplicates + m.wrong_time).sum();
            let ((rlo, rhi), (slo, shi)) = (min_max(&rates), min_max(&steady));
            t.push_str(&format!(
                "| {delay} ms | {} | {} | {}–{} | {} | {}–{} | {:.2} s | {dups} | {:.2} |\n",
                job.name(),
                rate(median(&rates)),
                rate(rlo),
                rate(rhi),
                rate(median(&steady)),
                rate(slo),
                rate(shi),
                median(&firsts),
                median(&cores),
            ));
        }
        let ratio = |f| ratios(&results[w][0], &results[w][1], f);
        let (overall, steady) = (ratio(|m| m.rate), ratio(|m| m.steady));
        let ((olo, ohi), (slo, shi)) = (min_max(&overall), min_max(&steady));
        ratio_rows.push_str(&format!(
            "| {delay} ms | **{:.1}x** | {olo:.1}–{ohi:.1} | {:.1}x | {slo:.1}–{shi:.1} |\n",
            median(&overall),
            median(&steady)
        ));
        summary.push_str(&summary_line(
            &format!("watchbridge / the same job in Python with confluent-kafka, resource latency {delay} ms"),
            &format!("{:.1}x (runs {olo:.1}–{ohi:.1}; steady {:.1}x)", median(&overall), median(&steady)),
            "≥ 10x (issue 19)",
            median(&overall) >= 10.0,
        ));
    }
    t.push_str(
        "\n| resource latency | watchbridge / python (median of the per-run ratios) | min–max | steady | min–max |\n\
         |---|---|---|---|---|\n",
    );
    t.push_str(&ratio_rows);
    t.push_str(
        "\nDuplicates: outputs read more than once, plus outputs whose timestamp was not their \
         item's time, over all runs (every run also checks that every output arrived). Job \
         cores: CPU seconds of the job process / (job started → every output read); the Python \
         job runs on one thread plus librdkafka's.\n",
    );
    // What bounds each job, from the shape of the work rather than from this run's figures.
    let ceilings: Vec<String> = s
        .delays_ms
        .iter()
        .filter(|&&d| d > 0)
        .map(|&d| {
            format!(
                "{} outputs/s at {d} ms",
                rate(s.items as f64 * 1000.0 / d as f64)
            )
        })
        .collect();
    t.push_str(&format!(
        "\nReading the figures: the Python loop waits for one response at a time, so with a \
         latency per response it cannot beat K items per response time ({}), whatever the \
         machine; at 0 ms it is bound by its one interpreter thread (parsing, `json.dumps` and \
         `produce` for every item). watchbridge keeps up to 256 polls in flight, so latency \
         barely moves its rate; its start-up (group join, creating and restoring its state, \
         watermark and dead-letter topics) is in the first column and not in the steady one.\n",
        if ceilings.is_empty() {
            "none measured".to_string()
        } else {
            ceilings.join(", ")
        }
    ));
    let others: Vec<f64> = results
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.others)
        .collect();
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let date = utc_now();
    t.push_str(&format!(
        "\n- machine: {}; cores busy besides the job and the broker (this bench's observer and \
         feed server, and anything else): up to {:.2}\n- versions: {}, watchbridge {} \
         (commit {}, librdkafka {librdkafka}), {python_versions}, {} ({})\n- command: `{}` \
         ({:.0} s)\n- date: {date}\n",
        machine(),
        min_max(&others).1,
        command_output("rustc", &["-V"]),
        env!("CARGO_PKG_VERSION"),
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        tansu_version(&tansu),
        s.storage.describe(),
        command_line(),
        elapsed.as_secs_f64(),
    ));
    t.push_str(&disturbed_note(&others));
    t.push_str(&summary);
    // stdout: this bench's section of bench/RESULTS.md (`make bench` collects it).
    println!("{t}");
}

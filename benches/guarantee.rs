//! What `WATCHBRIDGE_GUARANTEE=exactly_once` costs (issue 14): the real `watchbridge` binary
//! on Apache Kafka itself, once with `recovery` and once with `exactly_once` (transactions),
//! on the same feeds, as ratios measured in one run. Run with `make bench` (or `cargo bench
//! --bench guarantee`); `BENCH_SMOKE=1` only proves it runs (tiny sizes, one run).
//!
//! W watches, each an input `{"id": n}` on a topic of 4 partitions, produced before the job
//! starts (not timed); the feed server (`benches/support/feeds.rs`) answers `GET /feeds/{n}`
//! with K items, complete at once. Each run measures both modes, one after the other, with
//! their own group and topics, by the observer (`benches/support/outputs.rs`, a consumer in
//! this process reading the output topic `read_committed`, as consumers of the transactional
//! mode must): outputs/s = N / (job spawned → the last missing output read), start-up
//! included; steady = (N − 1) / (first → last output read); CPU per output of the job
//! process; and **latency**: per output, from when the bridge emitted it (its
//! `watchbridge-first-seen` header, processing time in ms) to when the observer read it,
//! p50 and p99 — the transactional mode's outputs become visible only at the commit that
//! ends each checkpoint interval (500 ms). Then SIGTERM and the observer reads to the end
//! offsets: duplicates count.
//!
//! Sizes: `GUARANTEE_WATCHES` (W, default 2,000), `GUARANTEE_ITEMS` (K, default 100),
//! `GUARANTEE_RUNS` (default 3). `GUARANTEE_LOG` is watchbridge's log filter (default
//! `warn`). The section goes to stdout: `make bench` writes it to
//! `bench/results/guarantee.md`.

use std::time::Instant;

#[path = "support/mod.rs"]
mod support;
use support::broker_process::BrokerProcess;
use support::job::{spawn_logged, watchbridge_command};
use support::report::{
    command_output, disturbed_note, env_or, machine, median, min_max, rate, summary_line, utc_now,
};
use support::tansu_process::Storage;
use support::versus::{measure, quantile, ratios, Case, Measured, Observe};

/// Partitions of the input and output topics.
const PARTITIONS: i32 = 4;
/// The modes compared, in the order each run measures them.
const MODES: [&str; 2] = ["recovery", "exactly_once"];

struct Sizes {
    watches: usize,
    items: usize,
    runs: usize,
}

fn sizes() -> Sizes {
    let smoke = std::env::var_os("BENCH_SMOKE").is_some();
    Sizes {
        watches: env_or("GUARANTEE_WATCHES", if smoke { 20 } else { 2_000 }),
        items: env_or("GUARANTEE_ITEMS", if smoke { 10 } else { 100 }),
        runs: env_or("GUARANTEE_RUNS", if smoke { 1 } else { 3 }),
    }
}

fn main() {
    let s = sizes();
    let began = Instant::now();
    let broker = BrokerProcess::kafka("watchbridge-bench-kafka-").unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Runtime::new().expect("start the async runtime");
    let tag = std::process::id();
    let mut results: Vec<Vec<Measured>> = MODES.iter().map(|_| Vec::new()).collect();
    for run in 0..s.runs {
        for (m, mode) in MODES.iter().enumerate() {
            let id = format!("bench-guarantee-{tag}-{run}-{mode}");
            let case = Case {
                job: mode,
                bootstrap: &broker.bootstrap,
                broker_pid: &broker.pid(),
                storage: Storage::Sqlite,
                id: &id,
                partitions: PARTITIONS,
                watches: s.watches,
                items: s.items,
                delay_ms: 0,
                // The latency is when each output was read.
                observe: Observe::Reading,
            };
            let measured = measure(&runtime, &case, |feeds, log| {
                let mut command =
                    watchbridge_command(&broker.bootstrap, &id, feeds, "GUARANTEE_LOG");
                command.env("WATCHBRIDGE_GUARANTEE", mode);
                // The latency is read from each output's first-seen time.
                command.env("WATCHBRIDGE_OUTPUT_HEADERS", "first_seen");
                spawn_logged(command, mode, log)
            });
            eprintln!(
                "run {}: {mode}: {} outputs/s (steady {}), latency p50 {:?} ms p99 {:?} ms, \
                 {:.1} CPU µs per output, duplicates {}",
                run + 1,
                rate(measured.rate),
                rate(measured.steady),
                quantile(&measured.latencies_ms, 0.5),
                quantile(&measured.latencies_ms, 0.99),
                measured.cpu_per_output * 1e6,
                measured.duplicates
            );
            assert_eq!(measured.duplicates, 0, "{mode}: duplicates in a clean run");
            assert!(
                !measured.latencies_ms.is_empty(),
                "{mode}: no output carried its emission time"
            );
            results[m].push(measured);
        }
    }
    drop(runtime);
    drop(broker);
    print!("{}", report(&s, &results, began.elapsed()));
}

/// The median over `runs` of each run's `q` latency quantile, in ms.
fn latency(runs: &[Measured], q: f64) -> f64 {
    let per_run: Vec<f64> = runs
        .iter()
        .filter_map(|m| quantile(&m.latencies_ms, q))
        .map(|v| v as f64)
        .collect();
    median(&per_run)
}

fn report(s: &Sizes, results: &[Vec<Measured>], elapsed: std::time::Duration) -> String {
    use std::fmt::Write;
    let (recovery, exactly_once) = (&results[0], &results[1]);
    let n = s.watches * s.items;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The transactional mode's cost (`benches/guarantee.rs`)\n"
    );
    let _ = writeln!(
        out,
        "- {} on Apache Kafka (the release `scripts/kafka.sh` pins, one KRaft node), {}; {} \
         watches x {} items = {n} outputs per job, {} run(s), interleaved; took {:.0?}.",
        utc_now(),
        machine(),
        s.watches,
        s.items,
        s.runs,
        elapsed
    );
    let _ = writeln!(
        out,
        "- rustc: {}\n",
        command_output("rustc", &["--version"]).trim()
    );
    let _ = writeln!(
        out,
        "| mode | outputs/s (median, min–max) | steady outputs/s | latency p50 | latency p99 | CPU µs/output | duplicates |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for (mode, runs) in MODES.iter().zip(results) {
        let rates: Vec<f64> = runs.iter().map(|m| m.rate).collect();
        let steady: Vec<f64> = runs.iter().map(|m| m.steady).collect();
        let (lo, hi) = min_max(&rates);
        let cpu: Vec<f64> = runs.iter().map(|m| m.cpu_per_output * 1e6).collect();
        let _ = writeln!(
            out,
            "| `{mode}` | {} ({}–{}) | {} | {:.0} ms | {:.0} ms | {:.1} | {} |",
            rate(median(&rates)),
            rate(lo),
            rate(hi),
            rate(median(&steady)),
            latency(runs, 0.5),
            latency(runs, 0.99),
            median(&cpu),
            runs.iter().map(|m| m.duplicates).sum::<usize>()
        );
    }
    let ratio = median(&ratios(exactly_once, recovery, |m| m.rate));
    let _ = writeln!(
        out,
        "\nThroughput `exactly_once` / `recovery`: **{ratio:.2}** (median of the per-run \
         ratios). Latency is emission → read by a `read_committed` consumer under this full \
         load: in `exactly_once` an output becomes visible at the commit that ends its \
         checkpoint interval (`WATCHBRIDGE_CHECKPOINT_INTERVAL`, 500 ms), so up to that much \
         later. {}\n",
        disturbed_note(
            &results
                .iter()
                .flatten()
                .map(|m| m.others)
                .collect::<Vec<_>>()
        )
    );
    let _ = writeln!(
        out,
        "{}",
        summary_line(
            "exactly_once throughput / recovery (Apache Kafka)",
            &format!("{ratio:.2}"),
            "(no target)",
            true
        )
    );
    let _ = writeln!(
        out,
        "{}",
        summary_line(
            "exactly_once latency p99 (emitted → read_committed)",
            &format!(
                "{:.0} ms (recovery: {:.0} ms)",
                latency(exactly_once, 0.99),
                latency(recovery, 0.99)
            ),
            "≤ checkpoint interval + recovery's",
            latency(exactly_once, 0.99) <= 500.0 + latency(recovery, 0.99)
        )
    );
    out
}

//! Engine benchmark: memory per seen output, memory per idle watch, and no-op polls
//! dispatched per second with 1,000,000 active watches. Run with `make bench`.
//!
//! Memory is measured two ways: bytes the allocator handed out (a counting global
//! allocator: exact and repeatable) and the process's resident set growth (what the OS
//! sees, including allocator overhead). Throughput is a rate over a fixed wall-clock window
//! on the machine's real cores, so expect noise; the figure is printed with its spread over
//! several windows.

use bytes::Bytes;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use watchbridge::clock::Clock;
use watchbridge::engine::{Command, Engine, EngineConfig};
use watchbridge::limits::Limits;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::schedule::Schedule;
use watchbridge::seen::{hash_key, SeenSet};
use watchbridge::table::WatchTable;
use watchbridge::termination::Termination;
use watchbridge::watch::WatchRules;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Resident set size in bytes, from /proc (0 where unavailable).
fn rss() -> isize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<isize>().ok())
        .map_or(0, |pages| pages * 4096)
}

struct Sizes {
    watches: usize,
    outputs_per_set: usize,
    sets: usize,
    window: Duration,
    windows: usize,
}

fn sizes() -> Sizes {
    // `BENCH_SMOKE=1` proves the bench still runs, in seconds (used by `make test`).
    if std::env::var_os("BENCH_SMOKE").is_some() {
        Sizes {
            watches: 10_000,
            outputs_per_set: 10_000,
            sets: 100,
            window: Duration::from_millis(200),
            windows: 2,
        }
    } else {
        Sizes {
            watches: 1_000_000,
            outputs_per_set: 1_000_000,
            sets: 10_000,
            window: Duration::from_secs(2),
            windows: 5,
        }
    }
}

/// Grow a seen set the way a watch does: a few new outputs per poll.
fn grow(set: &mut SeenSet, n: usize, salt: u64) {
    let mut i = 0u64;
    while (i as usize) < n {
        let batch = 1 + (i % 7);
        for j in 0..batch {
            set.insert(hash_key(&(salt, i + j).to_le_bytes_pair()));
        }
        i += batch;
    }
}

trait PairBytes {
    fn to_le_bytes_pair(&self) -> [u8; 16];
}

impl PairBytes for (u64, u64) {
    fn to_le_bytes_pair(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.0.to_le_bytes());
        b[8..].copy_from_slice(&self.1.to_le_bytes());
        b
    }
}

/// One watch that has seen `n` outputs.
fn one_big_seen_set(n: usize) -> (f64, f64) {
    let (a0, r0) = (live(), rss());
    let mut one = SeenSet::new();
    grow(&mut one, n, 0);
    let n = one.len() as f64;
    let result = ((live() - a0) as f64 / n, (rss() - r0) as f64 / n);
    drop(one);
    result
}

/// `sets` watches that have seen 100 outputs each (the sets' own pointers not counted).
fn many_small_seen_sets(sets: usize) -> (f64, f64) {
    let per = 100;
    let mut many: Vec<SeenSet> = (0..sets).map(|_| SeenSet::new()).collect();
    let (a0, r0) = (live(), rss());
    for (i, set) in many.iter_mut().enumerate() {
        grow(set, per, i as u64 + 1);
    }
    let n = (sets * per) as f64;
    let result = ((live() - a0) as f64 / n, (rss() - r0) as f64 / n);
    drop(many);
    result
}

/// Stands for an input record (its key): it is what a watch keeps per input. The no-op
/// poller never reads it.
#[allow(dead_code)]
struct Key(Bytes);

fn idle_watch_bytes(watches: usize, termination: &str) -> (f64, f64) {
    let rules = WatchRules {
        termination: termination.parse().expect("termination"),
        schedule: Schedule::default(),
    };
    let (a0, r0) = (live(), rss());
    let mut table: WatchTable<Key> = WatchTable::new(rules, Some(1));
    for i in 0..watches {
        let key = Bytes::from(format!("user-{i:010}"));
        let input = Arc::new(Key(key.clone()));
        // Distinct input timestamps, as real inputs have: each is a separate hold.
        table.insert(key, input, i as i64, 0).expect("unique keys");
    }
    let n = watches as f64;
    let result = ((live() - a0) as f64 / n, (rss() - r0) as f64 / n);
    drop(table);
    result
}

/// Answers every poll at once with nothing: measures the engine, not a resource.
struct NoOp;

impl Poller for NoOp {
    type Input = Key;

    fn poll(
        &self,
        _input: Arc<Key>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        std::future::ready(Ok(PollResult::incomplete(Vec::<Output>::new())))
    }
}

fn noop_polls_per_second(s: &Sizes) -> Vec<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let metrics = Arc::new(Metrics::new());
        let rules = WatchRules {
            termination: Termination::Never,
            // Every watch is always due: the engine runs flat out.
            schedule: Schedule {
                interval: Duration::from_millis(1),
                jitter: 0.0,
                ..Schedule::default()
            },
        };
        let config = EngineConfig {
            rules,
            poll_timeout: Duration::from_secs(10),
            seed: Some(1),
            checkpoints: false,
        };
        let engine = Engine::new(
            Arc::new(NoOp),
            config,
            Limits::new(10_000, None),
            Clock::system(),
            metrics.clone(),
        );
        let (commands, rx) = mpsc::channel(65_536);
        let (tx, mut events) = mpsc::channel(65_536);
        let task = tokio::spawn(engine.run(rx, tx));
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        for i in 0..s.watches {
            let key = Bytes::from(format!("user-{i:010}"));
            let input = Arc::new(Key(key.clone()));
            commands
                .send(Command::Watch {
                    key,
                    input,
                    input_time: 0,
                })
                .await
                .expect("engine running");
        }
        let mut rates = Vec::new();
        for _ in 0..s.windows {
            let (p0, t0) = (metrics.polls_ok.get(), Instant::now());
            tokio::time::sleep(s.window).await;
            let polls = metrics.polls_ok.get() - p0;
            rates.push(polls as f64 / t0.elapsed().as_secs_f64());
        }
        commands
            .send(Command::Shutdown)
            .await
            .expect("engine running");
        task.await.expect("engine task");
        rates
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs one memory case named by `BENCH_CASE` and prints "allocated resident" per item.
fn run_case(case: &str) -> (f64, f64) {
    let parts: Vec<&str> = case.splitn(3, ':').collect();
    let count = |i: usize| parts.get(i).and_then(|n| n.parse().ok()).unwrap_or(0);
    match parts[0] {
        "seen-one" => one_big_seen_set(count(1)),
        "seen-many" => many_small_seen_sets(count(1)),
        "idle" => idle_watch_bytes(count(1), parts.get(2).copied().unwrap_or("never")),
        other => panic!("unknown BENCH_CASE {other}"),
    }
}

/// Each memory figure comes from a fresh process (this binary again, with `BENCH_CASE`),
/// so memory freed by one case cannot hide the growth of the next in the resident figure.
fn measure(case: &str) -> (f64, f64) {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .env("BENCH_CASE", case)
        .output()
        .expect("run a memory case");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut nums = text
        .split_whitespace()
        .filter_map(|w| w.parse::<f64>().ok());
    match (nums.next(), nums.next()) {
        (Some(a), Some(r)) if out.status.success() => (a, r),
        _ => panic!(
            "memory case {case} failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    if let Ok(case) = std::env::var("BENCH_CASE") {
        let (alloc, rss) = run_case(&case);
        println!("{alloc} {rss}");
        return;
    }
    let s = sizes();
    println!("## watchbridge engine benchmark\n");
    println!("Memory: allocated = bytes handed out by the allocator (exact); resident = growth");
    println!("of the process's resident set (what the OS sees, with allocator overhead).\n");
    println!("| figure | value | target |");
    println!("|---|---|---|");
    let seen_cases = [
        (
            format!("seen-one:{}", s.outputs_per_set),
            format!("one watch, {} seen outputs", s.outputs_per_set),
        ),
        (
            format!("seen-many:{}", s.sets),
            format!("{} watches x 100 seen outputs", s.sets),
        ),
    ];
    for (case, what) in seen_cases {
        let (alloc, rss) = measure(&case);
        println!(
            "| bytes per seen output ({what}) | {alloc:.1} allocated, {rss:.1} resident | <= 20 |"
        );
    }
    // At the target size, and at 70% of it: growing structures (the timer heap, the key
    // index) double, so a count just past a power of two is their worst case.
    for watches in [s.watches, s.watches * 7 / 10] {
        for termination in ["never", "any(total(1h), stable(10m))"] {
            let (alloc, rss) = measure(&format!("idle:{watches}:{termination}"));
            println!(
                "| bytes per idle watch ({watches} watches, `{termination}`, input = its 15-byte key) | {alloc:.0} allocated, {rss:.0} resident | <= 300 |"
            );
        }
    }
    let mut rates = noop_polls_per_second(&s);
    let (lo, hi) = (
        rates.iter().cloned().fold(f64::MAX, f64::min),
        rates.iter().cloned().fold(f64::MIN, f64::max),
    );
    println!(
        "| no-op polls per second ({} active watches, 2 worker threads) | {:.0} median of {} x {:?} (range {:.0}-{:.0}) | >= 100000 |",
        s.watches,
        median(&mut rates),
        rates.len(),
        s.window,
        lo,
        hi
    );
}

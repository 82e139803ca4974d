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

fn seen_output_bytes(s: &Sizes) -> Vec<(String, f64, f64)> {
    let mut rows = Vec::new();
    let (a0, r0) = (live(), rss());
    let mut one = SeenSet::new();
    grow(&mut one, s.outputs_per_set, 0);
    let n = one.len() as f64;
    rows.push((
        format!("one watch, {} seen outputs", one.len()),
        (live() - a0) as f64 / n,
        (rss() - r0) as f64 / n,
    ));
    drop(one);

    let per = 100;
    let (a0, r0) = (live(), rss());
    let mut many: Vec<SeenSet> = (0..s.sets).map(|_| SeenSet::new()).collect();
    let shell = live() - a0;
    for (i, set) in many.iter_mut().enumerate() {
        grow(set, per, i as u64 + 1);
    }
    let n = (s.sets * per) as f64;
    rows.push((
        format!("{} watches x {per} seen outputs", s.sets),
        (live() - a0 - shell) as f64 / n,
        (rss() - r0 - shell) as f64 / n,
    ));
    drop(many);
    rows
}

/// Stands for an input record (its key): it is what a watch keeps per input. The no-op
/// poller never reads it.
#[allow(dead_code)]
struct Key(Bytes);

fn idle_watch_bytes(s: &Sizes, termination: &str) -> (f64, f64) {
    let rules = WatchRules {
        termination: termination.parse().expect("termination"),
        schedule: Schedule::default(),
    };
    let (a0, r0) = (live(), rss());
    let mut table: WatchTable<Key> = WatchTable::new(rules, Some(1));
    for i in 0..s.watches {
        let key = Bytes::from(format!("user-{i:010}"));
        let input = Arc::new(Key(key.clone()));
        // Distinct input timestamps, as real inputs have: each is a separate hold.
        table.insert(key, input, i as i64, 0).expect("unique keys");
    }
    let n = s.watches as f64;
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

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let s = sizes();
    println!("## watchbridge engine benchmark\n");
    println!("| figure | value | target |");
    println!("|---|---|---|");
    for (what, alloc, rss) in seen_output_bytes(&s) {
        println!(
            "| bytes per seen output ({what}) | {alloc:.1} allocated, {rss:.1} resident | <= 20 |"
        );
    }
    for termination in ["never", "any(total(1h), stable(10m))"] {
        let (alloc, rss) = idle_watch_bytes(&s, termination);
        println!(
            "| bytes per idle watch ({} watches, `{termination}`, 15-byte key) | {alloc:.0} allocated, {rss:.0} resident | <= 300 |",
            s.watches
        );
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

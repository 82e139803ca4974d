//! Restore benchmark: how long bringing back 100,000 watches with 100 seen outputs each
//! takes, the figure issue 6 asks for ("restore 100k watches x 100 seen"). Run with
//! `make bench`; `RESTORE_WATCHES` and `RESTORE_SEEN` change the sizes.
//!
//! Only the CPU side of a restore is timed: the state-topic records are built in memory
//! first, in the order a writer produces them (a watch's seen chunks, then its watch
//! record). Reading them from Kafka is not included; that is measured separately. Two
//! phases, run one after the other because a watch is complete only once its partition has
//! been read to the end (a later record may replace an earlier one):
//!
//! - **decode**: decode every record, keep the latest value per key, and rebuild each live
//!   watch's seen set and journal from its chunks ([`SeenJournal::restore`]);
//! - **engine**: hand every watch to a running engine as [`Command::Restore`] until it has
//!   answered [`Event::Restored`] for each.
//!
//! The baseline is the same engine starting as many new watches ([`Command::Watch`] until
//! [`Event::Started`]): the ratio is what durable state adds to bringing a partition's
//! watches up. Resolving the input again (the poller decoding the input value) is left out
//! of both, as it is the same for either. No poll runs in either case: the bench holds the
//! engine's only poll permit, so only the start or restore itself is timed.
//!
//! Resident set growth is not reported: the helper for it lives in `benches/engine.rs`,
//! which another bench cannot share.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use watchbridge::clock::{Clock, Millis};
use watchbridge::engine::{Command, Engine, EngineConfig, Event, RestoreWatch};
use watchbridge::limits::Limits;
use watchbridge::metrics::Metrics;
use watchbridge::poll::{Output, PollError, PollResult, Poller};
use watchbridge::schedule::Schedule;
use watchbridge::seen::hash_key;
use watchbridge::state::{
    decode_entry, Entry, SeenChunk, SeenJournal, WatchRecord, DEFAULT_CHUNK_HASHES,
};
use watchbridge::termination::Termination;
use watchbridge::watch::WatchRules;

/// A day: far enough ahead that no restored watch is due while the bench runs.
const LATER: Millis = 86_400_000;

/// Never asked to poll (the bench holds the only permit); answers nothing if it were.
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

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a count"))
        })
        .unwrap_or(default)
}

/// The state topic of `watches` watches that have seen `seen` outputs each, as (key, value)
/// pairs in the order they were written.
fn state_records(watches: usize, seen: usize, now: Millis) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut records = Vec::new();
    for i in 0..watches {
        let key = Bytes::from(format!("user-{i:06}"));
        let mut journal = SeenJournal::new();
        for j in 0..seen {
            journal.add(hash_key(
                format!("http://127.0.0.1:1/feed/{i}/item/{j}").as_bytes(),
            ));
        }
        for chunk in journal.checkpoint() {
            let e = chunk.to_entry(&key).expect("a small chunk");
            records.push((e.key, e.value));
        }
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
        };
        let e = record.to_entry().expect("a small record");
        records.push((e.key, e.value));
    }
    records
}

/// What a partition's records say about one watch so far.
#[derive(Default)]
struct Found {
    record: Option<WatchRecord>,
    chunks: Vec<SeenChunk>,
}

/// Phase "decode": the watches to restore, and their journals (which the bridge keeps
/// beside the engine for its next checkpoints).
fn decode(records: &[(Vec<u8>, Vec<u8>)]) -> (Vec<RestoreWatch<()>>, Vec<SeenJournal>) {
    let mut by_watch: HashMap<Bytes, Found> = HashMap::new();
    for (key, value) in records {
        match decode_entry(key, Some(value)).expect("a record this bench wrote") {
            Entry::Watch(r) => {
                let found = by_watch.entry(r.watch_key.clone()).or_default();
                found.record = Some(r);
            }
            Entry::Seen { watch_key, chunk } => {
                let chunks = &mut by_watch.entry(watch_key).or_default().chunks;
                // The latest value per key: a chunk written again replaces the older one.
                match chunks.iter_mut().find(|c| c.index() == chunk.index()) {
                    Some(old) => *old = chunk,
                    None => chunks.push(chunk),
                }
            }
            // Tombstones, and records that are not per watch.
            other => unreachable!("this bench writes no {other:?}"),
        }
    }
    let (mut watches, mut journals) = (Vec::new(), Vec::new());
    for (key, found) in by_watch {
        // Chunks without a live watch record are deleted by a restore, not restored.
        let Some(record) = found.record.filter(|r| r.finished.is_none()) else {
            continue;
        };
        let (seen, journal) =
            SeenJournal::restore(found.chunks, record.seen_chunks, DEFAULT_CHUNK_HASHES)
                .expect("every chunk was written");
        journals.push(journal);
        watches.push(RestoreWatch {
            key,
            input: Arc::new(()),
            progress: record.progress(),
            seen,
            next_poll: record.next_poll,
        });
    }
    (watches, journals)
}

/// Time from sending the first of `commands` to the `n`th event `counts`, on a fresh engine.
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
                termination: Termination::Never,
                schedule: Schedule::default(),
            },
            poll_timeout: Duration::from_secs(10),
            seed: Some(1),
            checkpoints: false,
        };
        let metrics = Arc::new(Metrics::new());
        let engine = Engine::new(Arc::new(NoOp), config, limits, Clock::system(), metrics);
        let (commands_tx, commands_rx) = mpsc::channel(65_536);
        let (events_tx, mut events) = mpsc::channel(65_536);
        let task = tokio::spawn(engine.run(commands_rx, events_tx));
        let counter = tokio::spawn(async move {
            for _ in 0..n {
                let event = events.recv().await.expect("engine running");
                assert!(counts(&event), "unexpected event {event:?}");
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
    let n = env_or("RESTORE_WATCHES", if smoke { 1_000 } else { 100_000 });
    let seen = env_or("RESTORE_SEEN", 100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // The baseline first, on a heap the restore has not used yet.
    let keys: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(format!("user-{i:06}")))
        .collect();
    let fresh = engine_time(
        &runtime,
        n,
        keys.into_iter().map(|key| Command::Watch {
            key,
            input: Arc::new(()),
            input_time: 0,
        }),
        |e| matches!(e, Event::Started { .. }),
    );

    let records = state_records(n, seen, Clock::system().now_ms());
    let (count, bytes) = (
        records.len(),
        records
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>(),
    );

    let t0 = Instant::now();
    let (watches, journals) = decode(&records);
    let decoded = t0.elapsed();
    assert_eq!(watches.len(), n);
    assert!(
        watches.iter().all(|w| w.seen.len() == seen),
        "every seen hash restored"
    );
    drop(records);

    let restored = engine_time(
        &runtime,
        n,
        watches.into_iter().map(|w| Command::Restore(Box::new(w))),
        |e| matches!(e, Event::Restored { .. }),
    );
    drop(journals);

    let total = decoded + restored;
    println!(
        "restore: {n} watches x {seen} seen: {} records, {:.1} MB; decode+journal {:.2} s, engine {:.2} s, total {:.2} s ({:.1} us/watch); fresh start of {n} watches {:.2} s; ratio {:.1}x",
        count,
        bytes as f64 / 1e6,
        decoded.as_secs_f64(),
        restored.as_secs_f64(),
        total.as_secs_f64(),
        total.as_secs_f64() * 1e6 / n as f64,
        fresh.as_secs_f64(),
        total.as_secs_f64() / fresh.as_secs_f64(),
    );
}

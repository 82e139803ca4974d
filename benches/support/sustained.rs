//! A job at a sustained, offered rate rather than draining a burst: inputs are produced at
//! a fixed pace while the job runs, and the latency of its outputs is measured in the steady
//! state. A burst measures how fast a backlog drains (its p99 is the tail of the backlog);
//! an operator runs the bridge below its maximum and cares how soon each output is visible.
//!
//! The job is started and waited for until it is ready (`/readyz` on its metrics address);
//! then one input `{"id": n}` is produced every `1 / (rate / K)` s (each watch yields K
//! items, complete at once), for a warm-up and then the measured window. The observer (a
//! consumer in this process, `read_committed` as librdkafka's default) reads every output
//! as it comes; the window's figures are over the outputs read inside it: their latency from
//! emitted (the job's `watchbridge-first-seen` header) to read, the rate they were read at,
//! and the job's CPU per output over the window. Then the job is stopped and the observer
//! reads to the topic's end offsets, so duplicates and losses count.

use super::feeds::{FeedServer, Feeds};
use super::job::{log_path, log_tail};
use super::kafka::{create_topic, producer, InFlight};
use super::outputs::{observer, Observed};
use super::report::now_ms;
use super::versus::stop;
use rdkafka::producer::FutureRecord;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// What is offered to the job.
pub struct Offered {
    /// Outputs per second (inputs per second × `items`).
    pub rate: f64,
    /// Items per watch.
    pub items: usize,
    /// Before the window: start-up backlog and caches settle.
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
}

/// The figures of one sustained run.
pub struct Sustained {
    /// Outputs read per second in the window (≈ the offered rate when the job keeps up).
    pub achieved: f64,
    /// Emitted → read, ms, of each output read in the window, sorted.
    pub latencies_ms: Vec<i64>,
    /// The job's CPU seconds over the window per output read in it.
    pub cpu_per_output: f64,
    pub duplicates: usize,
    pub lost: usize,
}

/// Runs the job `spawn` starts (given the feeds' URL and its log) at `offered`, on topics
/// `{id}.in` and `{id}.out` of `partitions` partitions; `ready` is the job's `/readyz` URL.
pub fn sustain(
    runtime: &tokio::runtime::Runtime,
    bootstrap: &str,
    id: &str,
    partitions: i32,
    offered: &Offered,
    ready: &str,
    spawn: impl FnOnce(&str, &Path) -> Child,
) -> Sustained {
    let watches_per_sec = offered.rate / offered.items as f64;
    let watches =
        (watches_per_sec * (offered.warmup + offered.window).as_secs_f64()).ceil() as usize;
    let (input, output) = (format!("{id}.in"), format!("{id}.out"));
    let server = runtime.block_on(async {
        create_topic(bootstrap, &input, partitions).await;
        create_topic(bootstrap, &output, partitions).await;
        FeedServer::start(
            Feeds::complete(watches, offered.items, now_ms()),
            Duration::ZERO,
        )
        .await
    });
    let log = log_path(id);
    let mut seen = Observed::new(watches, offered.items, partitions);
    let consumer = observer(bootstrap, &output, partitions);
    let mut child = spawn(&server.url, &log);
    let pid = child.id().to_string();
    wait_ready(runtime, ready, &mut child, &log);

    // The inputs, at the offered pace, from a task of the runtime.
    let pace = {
        let (bootstrap, input) = (bootstrap.to_string(), input.clone());
        runtime.spawn(async move {
            let producer = producer(&bootstrap);
            let mut in_flight = InFlight::new("sustained inputs");
            let began = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut sent = 0;
            while sent < watches {
                tick.tick().await;
                let due = ((began.elapsed().as_secs_f64() * watches_per_sec) as usize).min(watches);
                while sent < due {
                    let (key, value) = (sent.to_string(), format!(r#"{{"id": {sent}}}"#));
                    let record = FutureRecord::to(&input)
                        .key(key.as_str())
                        .payload(value.as_bytes());
                    in_flight.send(&producer, record).await;
                    sent += 1;
                }
            }
            in_flight.delivered().await;
        })
    };
    let began = Instant::now();
    let (window_from, window_to) = (
        began + offered.warmup,
        began + offered.warmup + offered.window,
    );
    let limit = window_to + Duration::from_secs(60);
    let (mut from, mut to) = (None, None);
    while seen.complete.is_none() {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(msg)) => seen.record(&msg),
            Some(Err(e)) => panic!("{id}: observer: {e}"),
            None => {}
        }
        let now = Instant::now();
        if from.is_none() && now >= window_from {
            from = Some((seen.latencies_ms.len(), super::cpu::cpu_seconds(&pid)));
        }
        if to.is_none() && now >= window_to {
            to = Some((seen.latencies_ms.len(), super::cpu::cpu_seconds(&pid)));
        }
        if now > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{id}: {} of {} outputs read 60 s after the offered load ended; the end of its log ({}):\n{}",
                seen.distinct,
                watches * offered.items,
                log.display(),
                log_tail(&log)
            );
        }
    }
    runtime.block_on(pace).expect("the input producer");
    stop(id, &mut child, &log);
    let (from, to) = (
        from.expect("a window start"),
        to.unwrap_or((seen.latencies_ms.len(), f64::NAN)),
    );
    seen.read_to_end(&consumer, bootstrap, &output, Duration::from_secs(30));
    drop(server);
    if std::env::var_os("BENCH_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_file(&log);
    }
    let mut latencies_ms = seen.latencies_ms[from.0..to.0].to_vec();
    latencies_ms.sort_unstable();
    let outputs = (to.0 - from.0) as f64;
    Sustained {
        achieved: outputs / offered.window.as_secs_f64(),
        latencies_ms,
        cpu_per_output: (to.1 - from.1) / outputs,
        duplicates: seen.duplicates,
        lost: seen.lost(),
    }
}

/// Waits until `ready` answers 200 (the job has its partitions and restored them), or fails
/// the bench with the job's log after 60 s or when the job exits.
fn wait_ready(runtime: &tokio::runtime::Runtime, ready: &str, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = runtime.block_on(async {
            reqwest::get(ready)
                .await
                .is_ok_and(|r| r.status().is_success())
        });
        if ok {
            return;
        }
        let exited = child.try_wait().expect("poll the job");
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the job was not ready ({ready}) within 60 s ({exited:?}); the end of its log ({}):\n{}",
                log.display(),
                log_tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

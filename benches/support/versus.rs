//! One throughput case of a versus bench (vs_python, vs_java): a job against every feed
//! complete at once, measured by the observer from its start until every output was read.

use super::cpu::{cpu_seconds, machine_cpu_seconds};
use super::end_offsets::{self, EndOffsets};
use super::feeds::{FeedServer, Feeds};
use super::job::{log_path, log_tail, peak_rss, terminate, wait_or_kill};
use super::kafka::watch_inputs;
use super::outputs::{observer, reader, Observed};
use super::report::now_ms;
use super::tansu_process::Storage;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// Where and what one case runs.
pub struct Case<'a> {
    /// For messages: the job's name.
    pub job: &'a str,
    pub bootstrap: &'a str,
    /// The broker's pid, for its CPU time.
    pub broker_pid: &'a str,
    /// How the inputs are produced (see [`super::kafka::produce_inputs`]).
    pub storage: Storage,
    /// Names the topics `{id}.in`, `{id}.out` and the job's group.
    pub id: &'a str,
    pub partitions: i32,
    pub watches: usize,
    pub items: usize,
    /// The feed server's delay per response.
    pub delay_ms: u64,
    pub observe: Observe,
}

/// How the observer tells when each output was on the output topic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Observe {
    /// Read every output as it comes: when it was read (and, from its first-seen header,
    /// its latency). The reading competes with the job for the machine's cores.
    Reading,
    /// Sample the partitions' end offsets while the job runs, and read the outputs once
    /// the topic holds at least N records: each output was there at the first sample past
    /// its offset (see [`super::end_offsets`]). For throughput, where a reader as fast as
    /// the job would take a third of a core from it.
    EndOffsets,
}

/// One job's figures from one case.
pub struct Measured {
    /// N / (spawned → all N on the topic (read, with [`Observe::Reading`])).
    pub rate: f64,
    /// (N − 1) / (first output on the topic → all N).
    pub steady: f64,
    /// Spawned → first output on the topic.
    pub first_after: Duration,
    pub duplicates: usize,
    pub wrong_time: usize,
    /// CPU seconds of the job process per output.
    pub cpu_per_output: f64,
    /// CPU seconds of the job process / (spawned → all N read).
    pub job_cores: f64,
    /// Peak resident set of the job process (`VmHWM`), bytes.
    pub peak_rss: u64,
    pub broker_cores: f64,
    /// Cores busy besides the job and the broker: this process (the observer and the feed
    /// server) and everything else on the machine.
    pub others: f64,
    /// Emitted (watchbridge's `watchbridge-first-seen`) → read by the observer, per output,
    /// sorted (empty for a job without that header, and with [`Observe::EndOffsets`]).
    pub latencies_ms: Vec<i64>,
}

/// Topics, inputs and feed server for `case`; then the job `spawn` starts (given the feeds'
/// URL and its log), until every output was read; then SIGTERM unless it exited by itself,
/// and the observer reads on to the end of the topic, so late duplicates count.
pub fn measure(
    runtime: &tokio::runtime::Runtime,
    case: &Case,
    spawn: impl FnOnce(&str, &Path) -> Child,
) -> Measured {
    let (job, delay_ms) = (case.job, case.delay_ms);
    let output = format!("{}.out", case.id);
    let server = runtime.block_on(async {
        watch_inputs(
            case.bootstrap,
            case.id,
            case.partitions,
            case.watches,
            case.storage,
        )
        .await;
        let feeds = Feeds::complete(case.watches, case.items, now_ms());
        FeedServer::start(feeds, Duration::from_millis(delay_ms)).await
    });
    let log = log_path(case.id);
    let n = case.watches * case.items;
    let mut seen = Observed::new(case.watches, case.items, case.partitions);
    // With `EndOffsets`, the observer starts once the topic holds N records.
    let (mut consumer, sampler) = match case.observe {
        Observe::Reading => (
            Some(observer(case.bootstrap, &output, case.partitions)),
            None,
        ),
        Observe::EndOffsets => (
            None,
            Some(EndOffsets::start(case.bootstrap, &output, case.partitions)),
        ),
    };
    let (broker_cpu0, machine0) = (cpu_seconds(case.broker_pid), machine_cpu_seconds());
    let spawned = Instant::now();
    let mut child = spawn(&server.url, &log);
    let pid = child.id().to_string();
    // Generous: a job that stalls fails the bench instead of hanging it. A job may poll one
    // feed after the other, so W x delay at least.
    let limit =
        Duration::from_secs(120) + Duration::from_millis(case.watches as u64 * delay_ms * 3);
    let (mut job_cpu, mut rss) = (0.0, 0);
    // CPU time used by the end of the job's work (see [`Usage`]).
    let mut usage = None;
    let mut sampled = Instant::now();
    let mut exited = None;
    while seen.complete.is_none() {
        match &consumer {
            Some(consumer) => match consumer.poll(Duration::from_millis(20)) {
                Some(Ok(msg)) => seen.record(&msg),
                Some(Err(e)) => panic!("{job}: observer: {e}"),
                None => {}
            },
            None if sampler.as_ref().is_some_and(|s| s.total() >= n as i64) => {
                // The job's work is (about) done: what the machine did until now is its.
                usage = Some(Usage::now(&pid, case.broker_pid));
                consumer = Some(reader(case.bootstrap, &output, case.partitions));
            }
            None => std::thread::sleep(end_offsets::EVERY),
        }
        // The job's CPU time and memory, sampled (it may exit by itself right after its
        // last output).
        if sampled.elapsed() > Duration::from_millis(100) {
            sampled = Instant::now();
            if exited.is_none() {
                if usage.is_none() {
                    job_cpu = cpu_seconds(&pid).max(job_cpu);
                }
                rss = peak_rss(&pid).max(rss);
                exited = child.try_wait().expect("poll the job");
            }
            let failed = exited.is_some_and(|status| !status.success());
            if failed || spawned.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{job} (delay {delay_ms} ms): {} of {n} outputs read after {:.1?} ({}); \
                     duplicates {}, unexpected {}; the end of its log ({}):\n{}",
                    seen.distinct,
                    spawned.elapsed(),
                    match exited {
                        Some(status) => format!("exited: {status}"),
                        None => "still running".into(),
                    },
                    seen.duplicates,
                    seen.unexpected,
                    log.display(),
                    log_tail(&log)
                );
            }
        }
    }
    let (first, complete) = match sampler {
        None => (seen.first.unwrap(), seen.complete.unwrap()),
        Some(sampler) => {
            let samples = sampler.stop();
            let when = |at: Option<Instant>, what: &str| {
                at.unwrap_or_else(|| panic!("{job}: no end-offset sample shows {what}"))
            };
            (
                when(
                    end_offsets::first_passing(&samples, &seen.first_offsets),
                    "the first output",
                ),
                when(
                    end_offsets::first_reaching(&samples, &seen.needed),
                    "every output",
                ),
            )
        }
    };
    if exited.is_none() {
        rss = peak_rss(&pid).max(rss);
    }
    let usage = usage.unwrap_or_else(|| Usage::now(&pid, case.broker_pid));
    // The larger: a job that exited by itself reads as 0 once reaped.
    let job_cpu = usage.job_cpu.max(job_cpu);
    let wall = complete.duration_since(spawned).as_secs_f64();
    match exited {
        None => stop(job, &mut child, &log),
        // It exited by itself, successfully (checked above): reap it.
        Some(_) => {
            let _ = child.wait();
        }
    }
    let consumer = consumer.expect("every output was read");
    seen.read_to_end(&consumer, case.bootstrap, &output, Duration::from_secs(30));
    drop(consumer);
    drop(server);
    // `BENCH_KEEP_LOGS=1` keeps it (with a debug filter in the job's log variable, a
    // timeline of its start-up).
    if std::env::var_os("BENCH_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_file(&log);
    }

    let mut latencies_ms = match case.observe {
        Observe::Reading => std::mem::take(&mut seen.latencies_ms),
        // Read after the job wrote them: not a latency.
        Observe::EndOffsets => Vec::new(),
    };
    latencies_ms.sort_unstable();
    let steady_secs = complete.duration_since(first).as_secs_f64();
    // Cores over the time the usage covers (for `EndOffsets`, until the reading began).
    let used = usage.at.duration_since(spawned).as_secs_f64();
    let machine = (usage.machine_cpu - machine0) / used;
    let broker_cores = (usage.broker_cpu - broker_cpu0) / used;
    let job_cores = job_cpu / used;
    Measured {
        rate: n as f64 / wall,
        steady: if steady_secs > 0.0 {
            (n - 1) as f64 / steady_secs
        } else {
            f64::INFINITY
        },
        first_after: first.duration_since(spawned),
        duplicates: seen.duplicates,
        wrong_time: seen.wrong_time,
        cpu_per_output: job_cpu / n as f64,
        job_cores,
        peak_rss: rss,
        broker_cores,
        others: (machine - job_cores - broker_cores).max(0.0),
        latencies_ms,
    }
}

/// CPU seconds used until `at`: the job's, the broker's, the whole machine's. Taken when
/// the last output was read, or with [`Observe::EndOffsets`] when the reading began (once
/// the topic held N records), so that the observer's reading after the job is not counted
/// as other work during it.
struct Usage {
    job_cpu: f64,
    broker_cpu: f64,
    machine_cpu: f64,
    at: Instant,
}

impl Usage {
    fn now(job_pid: &str, broker_pid: &str) -> Usage {
        Usage {
            job_cpu: cpu_seconds(job_pid),
            broker_cpu: cpu_seconds(broker_pid),
            machine_cpu: machine_cpu_seconds(),
            at: Instant::now(),
        }
    }
}

/// The `q` quantile (0..=1) of sorted `values`, if any.
pub fn quantile(sorted: &[i64], q: f64) -> Option<i64> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((last as f64) * q).round() as usize])
}

/// SIGTERM, the orderly stop of every job here; warns when the job did not stop cleanly
/// within 40 s (then it is killed).
pub fn stop(job: &str, child: &mut Child, log: &Path) {
    terminate(child);
    match wait_or_kill(child, Duration::from_secs(40)) {
        Some(status) if status.success() => {}
        // A JVM's exit status after its shutdown hooks ran on SIGTERM.
        Some(status) if status.code() == Some(143) => {}
        other => eprintln!(
            "warning: {job} did not stop cleanly ({}); the end of its log:\n{}",
            other.map_or("killed after 40 s".into(), |s| s.to_string()),
            log_tail(log)
        ),
    }
}

/// `f(a) / f(b)` for each run: one job's figure over the other's, measured side by side.
pub fn ratios(a: &[Measured], b: &[Measured], f: fn(&Measured) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| f(a) / f(b)).collect()
}

/// The machine's 1-minute load average now (the first field of `/proc/loadavg`); NaN where
/// it cannot be read.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The 1-minute load average, sampled every 200 ms (the kernel updates it every 5 s) on a
/// thread of its own while a case runs: how busy the machine was during it (its job, the
/// broker and this process included), beside the load just before. Dropped, it stops.
pub struct LoadDuring {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<f64>>,
}

impl LoadDuring {
    pub fn start() -> LoadDuring {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut highest = load_average();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                highest = highest.max(load_average());
            }
            highest
        });
        LoadDuring {
            stop,
            sampler: Some(sampler),
        }
    }

    /// The highest 1-minute load average seen since [`LoadDuring::start`].
    pub fn highest(mut self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sampler = self.sampler.take().expect("sampling");
        sampler.join().expect("the load sampler")
    }
}

impl Drop for LoadDuring {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

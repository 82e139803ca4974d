//! The producers a bridge's output rate is measured against (`benches/e2e.rs`): librdkafka
//! at its best on the same records ([`Fast`]), and the two reference tools, librdkafka's own
//! `rdkafka_performance` ([`rdkafka_performance`]) and Apache Kafka's `ProducerPerformance`
//! ([`kafka_producer_performance`]).
//!
//! [`Fast`] is what a producer written for speed does with librdkafka's C API, with nothing
//! of rdkafka's per-record machinery: one producing thread per core, each with a client of
//! its own (or one per partition, [`Clients`]); records handed over with `rd_kafka_produceva` by topic handle
//! (`rd_kafka_topic_new` once per client), to an explicit partition, with an integer opaque
//! (no allocation per record) and without a copy of the value (the records outlive their
//! delivery); deliveries counted in librdkafka's delivery-report callback, served by
//! `rd_kafka_poll` every 1,000 records (as `rdkafka_performance` does); a full queue waited
//! out in `rd_kafka_poll` with a 10 ms timeout, never spun on.

use bytes::Bytes;
use rdkafka::bindings as rdsys;
use std::ffi::{c_char, c_void, CStr, CString};
use std::process::{Command, Stdio};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;

/// One record for [`Fast`].
#[derive(Clone)]
pub struct Record {
    pub partition: i32,
    pub key: Bytes,
    pub value: Bytes,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// One header, `(name, value)`, or none.
    pub header: Option<(&'static str, Bytes)>,
}

/// How [`Fast`]'s threads hold their clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clients {
    /// A client per partition, as the bridge has a producer per partition task: as many
    /// requests in flight as the bridge where each connection has one, but more librdkafka
    /// threads and smaller batches.
    PerPartition,
    /// One client per thread, for all of its partitions (the faster, on 2 cores).
    PerThread,
}

impl Clients {
    pub fn name(self) -> &'static str {
        match self {
            Clients::PerPartition => "a client per partition",
            Clients::PerThread => "a client per thread",
        }
    }
}

/// One thread's counters, on a cache line of its own: only that thread writes them.
#[repr(align(64))]
#[derive(Default)]
struct Counter {
    /// Records handed to librdkafka (published every 256, and at the first).
    sent: AtomicU64,
    /// Records acknowledged (the warm-up records not counted).
    acked: AtomicU64,
    /// Records that failed, and the first failure's error.
    failed: AtomicU64,
    error: Mutex<Option<String>>,
}

/// What [`Fast`]'s threads have done so far, for a monitor to sample.
#[derive(Default)]
pub struct Progress {
    counters: Vec<Counter>,
}

impl Progress {
    pub fn sent(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.sent.load(Ordering::Relaxed))
            .sum()
    }

    pub fn acked(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.acked.load(Ordering::Relaxed))
            .sum()
    }

    /// The first delivery failure, if any record failed.
    pub fn failure(&self) -> Option<String> {
        let failed: u64 = self
            .counters
            .iter()
            .map(|c| c.failed.load(Ordering::Relaxed))
            .sum();
        (failed > 0).then(|| {
            let first = self
                .counters
                .iter()
                .find_map(|c| c.error.lock().unwrap().clone())
                .unwrap_or_default();
            format!("{failed} record(s) not delivered, the first: {first}")
        })
    }
}

/// The opaque of the warm-up records, which are not counted.
const WARM_UP: usize = usize::MAX;

/// librdkafka's delivery-report callback: `opaque` is the producing thread's [`Counter`]
/// (the client's opaque), the record's own opaque its index (or [`WARM_UP`]).
unsafe extern "C" fn delivered(
    _rk: *mut rdsys::rd_kafka_t,
    message: *const rdsys::rd_kafka_message_t,
    opaque: *mut c_void,
) {
    let counter = &*(opaque as *const Counter);
    let message = &*message;
    if message.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        if counter.failed.fetch_add(1, Ordering::Relaxed) == 0 {
            let text = CStr::from_ptr(rdsys::rd_kafka_err2str(message.err));
            *counter.error.lock().unwrap() = Some(text.to_string_lossy().into_owned());
        }
    } else if message._private as usize != WARM_UP {
        counter.acked.fetch_add(1, Ordering::Relaxed);
    }
}

/// One librdkafka producer and its handle of the topic.
struct Client {
    rk: *mut rdsys::rd_kafka_t,
    rkt: *mut rdsys::rd_kafka_topic_t,
}

impl Client {
    fn new(settings: &[(String, String)], topic: &str, counter: *const Counter) -> Client {
        let mut error = [0 as c_char; 512];
        unsafe {
            let conf = rdsys::rd_kafka_conf_new();
            for (key, value) in settings {
                let (k, v) = (
                    CString::new(key.as_str()).unwrap(),
                    CString::new(value.as_str()).unwrap(),
                );
                let res = rdsys::rd_kafka_conf_set(
                    conf,
                    k.as_ptr(),
                    v.as_ptr(),
                    error.as_mut_ptr(),
                    error.len(),
                );
                assert!(
                    res == rdsys::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK,
                    "producer setting {key}={value}: {}",
                    CStr::from_ptr(error.as_ptr()).to_string_lossy()
                );
            }
            rdsys::rd_kafka_conf_set_dr_msg_cb(conf, Some(delivered));
            rdsys::rd_kafka_conf_set_opaque(conf, counter as *mut c_void);
            let rk = rdsys::rd_kafka_new(
                rdsys::rd_kafka_type_t::RD_KAFKA_PRODUCER,
                conf,
                error.as_mut_ptr(),
                error.len(),
            );
            assert!(
                !rk.is_null(),
                "create a producer: {}",
                CStr::from_ptr(error.as_ptr()).to_string_lossy()
            );
            let name = CString::new(topic).unwrap();
            let rkt = rdsys::rd_kafka_topic_new(rk, name.as_ptr(), ptr::null_mut());
            assert!(!rkt.is_null(), "a handle of topic {topic}");
            Client { rk, rkt }
        }
    }

    /// Hands `record` over, its opaque `token`; while the queue is full, waits up to 10 ms at
    /// a time for deliveries (serving their reports) and tries again.
    fn produce(&self, record: &Record, token: usize) {
        use rdsys::rd_kafka_vtype_t::*;
        loop {
            let headers = match &record.header {
                None => ptr::null_mut(),
                Some((name, value)) => unsafe {
                    let list = rdsys::rd_kafka_headers_new(1);
                    rdsys::rd_kafka_header_add(
                        list,
                        name.as_ptr() as *const c_char,
                        name.len() as isize,
                        value.as_ptr() as *const c_void,
                        value.len() as isize,
                    );
                    list
                },
            };
            let vus = [
                vu(
                    RD_KAFKA_VTYPE_RKT,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 { rkt: self.rkt },
                ),
                vu(
                    RD_KAFKA_VTYPE_PARTITION,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                        i32_: record.partition,
                    },
                ),
                // No RD_KAFKA_MSG_F_COPY: the value is referenced until its delivery (the
                // records outlive the producer); librdkafka copies keys whatever the flags.
                vu(
                    RD_KAFKA_VTYPE_MSGFLAGS,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 { i: 0 },
                ),
                vu(RD_KAFKA_VTYPE_VALUE, mem(&record.value)),
                vu(RD_KAFKA_VTYPE_KEY, mem(&record.key)),
                vu(
                    RD_KAFKA_VTYPE_OPAQUE,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                        ptr: token as *mut c_void,
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_TIMESTAMP,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                        i64_: record.timestamp,
                    },
                ),
                vu(
                    RD_KAFKA_VTYPE_HEADERS,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 { headers },
                ),
            ];
            let n = if headers.is_null() {
                vus.len() - 1
            } else {
                vus.len()
            };
            let error = unsafe { rdsys::rd_kafka_produceva(self.rk, vus.as_ptr(), n) };
            if error.is_null() {
                return;
            }
            let code = unsafe { rdsys::rd_kafka_error_code(error) };
            unsafe { rdsys::rd_kafka_error_destroy(error) };
            if !headers.is_null() {
                unsafe { rdsys::rd_kafka_headers_destroy(headers) };
            }
            if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL {
                let text = unsafe { CStr::from_ptr(rdsys::rd_kafka_err2str(code)) };
                panic!("produce: {}", text.to_string_lossy());
            }
            unsafe { rdsys::rd_kafka_poll(self.rk, 10) };
        }
    }

    /// Serves the delivery reports that have arrived, without waiting.
    fn poll(&self) {
        unsafe { rdsys::rd_kafka_poll(self.rk, 0) };
    }

    /// Waits until every record handed over is delivered (or failed), serving the reports.
    fn flush(&self) {
        let err = unsafe { rdsys::rd_kafka_flush(self.rk, 120_000) };
        assert!(
            err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
            "flush: records still undelivered after 120 s"
        );
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        unsafe {
            rdsys::rd_kafka_topic_destroy(self.rkt);
            rdsys::rd_kafka_destroy(self.rk);
        }
    }
}

fn mem(bytes: &Bytes) -> rdsys::rd_kafka_vu_s__bindgen_ty_1 {
    rdsys::rd_kafka_vu_s__bindgen_ty_1 {
        mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
            ptr: bytes.as_ptr() as *mut c_void,
            size: bytes.len(),
        },
    }
}

fn vu(
    vtype: rdsys::rd_kafka_vtype_t,
    u: rdsys::rd_kafka_vu_s__bindgen_ty_1,
) -> rdsys::rd_kafka_vu_t {
    rdsys::rd_kafka_vu_t { vtype, u }
}

/// A pointer to a thread's counter, which lives in the [`Progress`] the thread holds.
struct CounterPtr(*const Counter);
unsafe impl Send for CounterPtr {}

/// librdkafka at its best on prepared records: started with [`Fast::start`] (clients made and
/// warmed up, not timed), released with [`Fast::go`], sampled through [`Fast::progress`].
pub struct Fast {
    pub progress: Arc<Progress>,
    start: Arc<Barrier>,
    threads: Vec<JoinHandle<()>>,
}

impl Fast {
    /// `threads` threads, thread `t` producing the records of the partitions `p` with
    /// `p % threads == t` in the order given, to `topic` of `partitions` partitions, with
    /// the producer `settings` (`bootstrap.servers` among them). Returns once every client
    /// has delivered a warm-up record (its connection, metadata and, for an idempotent
    /// producer, its producer id settled; one empty record per client, not counted).
    pub fn start(
        settings: Vec<(String, String)>,
        topic: &str,
        partitions: i32,
        threads: usize,
        clients: Clients,
        records: Vec<Record>,
    ) -> Fast {
        assert!(threads >= 1 && partitions >= 1);
        let mut per_thread: Vec<Vec<Record>> = (0..threads).map(|_| Vec::new()).collect();
        for r in records {
            per_thread[r.partition as usize % threads].push(r);
        }
        let progress = Arc::new(Progress {
            counters: (0..threads).map(|_| Counter::default()).collect(),
        });
        // Each thread says it is ready and drops its sender: one that panicked before (its
        // client refused, its warm-up undelivered) leaves the channel closed, not a hang.
        let (ready, warmed) = std::sync::mpsc::channel::<()>();
        let start = Arc::new(Barrier::new(threads + 1));
        let settings = Arc::new(settings);
        let handles = per_thread
            .into_iter()
            .enumerate()
            .map(|(t, records)| {
                let (progress, ready, start, settings) = (
                    progress.clone(),
                    ready.clone(),
                    start.clone(),
                    settings.clone(),
                );
                let topic = topic.to_string();
                let counter = CounterPtr(&progress.counters[t] as *const Counter);
                std::thread::Builder::new()
                    .name(format!("fast-producer-{t}"))
                    .spawn(move || {
                        let counter = counter;
                        // This thread's partitions, and which of its clients each goes
                        // through (`client[p]`).
                        let mine: Vec<i32> = (0..partitions)
                            .filter(|p| *p as usize % threads == t)
                            .collect();
                        let mut client = vec![usize::MAX; partitions as usize];
                        for (i, p) in mine.iter().enumerate() {
                            client[*p as usize] = match clients {
                                Clients::PerPartition => i,
                                Clients::PerThread => 0,
                            };
                        }
                        let count = match clients {
                            Clients::PerPartition => mine.len(),
                            Clients::PerThread => mine.len().min(1),
                        };
                        let made: Vec<Client> = (0..count)
                            .map(|_| Client::new(&settings, &topic, counter.0))
                            .collect();
                        let slot = |p: i32| &made[client[p as usize]];
                        // A warm-up record through each client, to its first partition.
                        for (c, made_client) in made.iter().enumerate() {
                            let first = mine
                                .iter()
                                .find(|p| client[**p as usize] == c)
                                .expect("every client has a partition");
                            let warm = Record {
                                partition: *first,
                                key: Bytes::from_static(b"warm-up"),
                                value: Bytes::new(),
                                timestamp: 0,
                                header: None,
                            };
                            made_client.produce(&warm, WARM_UP);
                        }
                        made.iter().for_each(Client::flush);
                        ready.send(()).expect("the bench waits for the warm-up");
                        drop(ready);
                        start.wait();
                        let counter = unsafe { &*counter.0 };
                        for (i, r) in records.iter().enumerate() {
                            slot(r.partition).produce(r, i);
                            if i == 0 || i % 256 == 255 {
                                counter.sent.store(i as u64 + 1, Ordering::Relaxed);
                            }
                            if i % 1000 == 999 {
                                made.iter().for_each(Client::poll);
                            }
                        }
                        counter.sent.store(records.len() as u64, Ordering::Relaxed);
                        made.iter().for_each(Client::flush);
                        // The clients are destroyed before the records they referenced.
                        drop(made);
                        drop(records);
                    })
                    .expect("start a producing thread")
            })
            .collect();
        drop(ready);
        for _ in 0..threads {
            if warmed.recv().is_err() {
                panic!("a producing thread of the fast producer failed before it was ready");
            }
        }
        if let Some(failure) = progress.failure() {
            panic!("the fast producer's warm-up: {failure}");
        }
        Fast {
            progress,
            start,
            threads: handles,
        }
    }

    /// Lets the threads produce.
    pub fn go(&self) {
        self.start.wait();
    }

    /// Every thread has ended (its records delivered, or it panicked).
    pub fn ended(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Waits for the threads (every record delivered or failed, the clients destroyed).
    pub fn join(self) {
        for t in self.threads {
            t.join().expect("a producing thread panicked");
        }
        if let Some(failure) = self.progress.failure() {
            panic!("the fast producer: {failure}");
        }
    }
}

/// What a reference tool measured: its own rate (records/s, by its own clock: from its first
/// send to its last acknowledgement) and the whole process's CPU time (user + system,
/// start-up included) and wall time.
pub struct ToolRun {
    pub rate: f64,
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
}

/// User + system CPU of every child process waited for so far (`RUSAGE_CHILDREN`), seconds:
/// its change over a tool's run is that run's CPU (the bench waits for no other child then).
fn children_cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Runs `command` to its end; its stdout, with its CPU and wall time.
fn run_tool(what: &str, command: &mut Command) -> (String, f64, f64) {
    let cpu = children_cpu_seconds();
    let began = std::time::Instant::now();
    let out = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let wall = began.elapsed().as_secs_f64();
    let cpu = children_cpu_seconds() - cpu;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, cpu, wall)
}

/// librdkafka's `rdkafka_performance` (the binary `bin`, `scripts/rdkafka-perf.sh path`)
/// producing `count` messages of `size` bytes to `topic` on `bootstrap`, with `settings`
/// (`-X name=value` each). Its rate: the `… msgs/s` of its summary line, delivered messages
/// over its first send (before its connection and producer id) → last delivery report.
pub fn rdkafka_performance(
    bin: &std::path::Path,
    bootstrap: &str,
    topic: &str,
    count: u64,
    size: usize,
    settings: &[(&str, &str)],
) -> ToolRun {
    let mut command = Command::new(bin);
    command.args(["-P", "-t", topic, "-b", bootstrap]);
    command.args(["-s", &size.to_string(), "-c", &count.to_string()]);
    for (key, value) in settings {
        command.args(["-X", &format!("{key}={value}")]);
    }
    let (stdout, cpu_seconds, wall_seconds) = run_tool("rdkafka_performance", &mut command);
    // "% 2000000 messages produced (200000000 bytes), 2000000 delivered (offset …, 0 failed)
    // in 3350ms: 597014 msgs/s and 59.70 MB/s, …"
    let summary = stdout
        .lines()
        .rfind(|l| l.contains(" messages produced ") && l.contains(" msgs/s"))
        .unwrap_or_else(|| panic!("no summary line from rdkafka_performance:\n{stdout}"));
    let delivered = number_before(summary, " delivered");
    assert_eq!(
        delivered as u64, count,
        "rdkafka_performance delivered {delivered} of {count}: {summary}"
    );
    ToolRun {
        rate: number_before(summary, " msgs/s"),
        cpu_seconds,
        wall_seconds,
    }
}

/// Apache Kafka's `org.apache.kafka.tools.ProducerPerformance` (kafka-producer-perf-test) on
/// the class path `classpath` (`scripts/kafka.sh classpath`), producing `count` records of
/// `size` bytes to `topic` with `props` (`bootstrap.servers` among them) as fast as it can
/// (`--throughput -1`). Its rate: the `records/sec` of its final line, records over its
/// first send (its metadata and producer id included) → every record acknowledged.
pub fn kafka_producer_performance(
    classpath: &str,
    topic: &str,
    count: u64,
    size: usize,
    props: &[(String, String)],
) -> ToolRun {
    let mut command = Command::new("java");
    command.args([
        "-Xmx512m",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath,
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        &count.to_string(),
        "--record-size",
        &size.to_string(),
        "--throughput",
        "-1",
        "--producer-props",
    ]);
    command.args(props.iter().map(|(k, v)| format!("{k}={v}")));
    let (stdout, cpu_seconds, wall_seconds) = run_tool("ProducerPerformance", &mut command);
    // "2000000 records sent, 412371.1 records/sec (39.33 MB/sec), … ms avg latency, …,
    // 3 ms 50th, …" (the final line; the periodic ones have no percentiles).
    let summary = stdout
        .lines()
        .rfind(|l| l.contains(" records sent, ") && l.contains(" 50th"))
        .unwrap_or_else(|| panic!("no final line from ProducerPerformance:\n{stdout}"));
    let sent = number_before(summary, " records sent");
    assert_eq!(
        sent as u64, count,
        "ProducerPerformance sent {sent} of {count}: {summary}"
    );
    ToolRun {
        rate: number_before(summary, " records/sec"),
        cpu_seconds,
        wall_seconds,
    }
}

/// The number just before `marker` in `line` (`… 597014 msgs/s` → 597014).
fn number_before(line: &str, marker: &str) -> f64 {
    let at = line
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"));
    line[..at]
        .rsplit(|c: char| c.is_whitespace() || c == '(' || c == ',')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before {marker:?} in {line:?}"))
}

//! When each record of a topic was on the broker, without reading the records while a job
//! writes them: a thread that asks for the partitions' high watermarks every [`EVERY`] and
//! keeps what it heard with the time it heard it.
//!
//! Why: the versus benches measure a job that writes a few hundred thousand outputs per
//! second on a 2-core machine. A consumer that reads them as they come took a third of the
//! machine from the job it measures (`perf`: its poll loop and librdkafka's fetch thread,
//! decompressing); a small request every 2 ms costs next to nothing. The records are read
//! afterwards, and the offset of each one says when it was there: the first sample whose
//! high watermark had passed it. The high watermark is what a consumer can read up to, so
//! this is "readable by a consumer", without a consumer's own fetch delay.
//!
//! The request is a `Fetch` (v4, the oldest Apache Kafka 4 serves) of zero bytes per
//! partition, not `ListOffsets`: Tansu 0.6 on memory storage answers `ListOffsets` for the
//! latest offset with the last batch's *base* offset + 1 (5 records in one batch: 1), while
//! its `Fetch` carries the true high watermark. Written by hand (a few fields of one
//! request and its answer) rather than through librdkafka, which offers no fetch without
//! records.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the high watermarks are asked for: the error of a time taken from them is at
/// most this plus one round trip.
pub const EVERY: Duration = Duration::from_millis(2);

/// One answer: when it arrived and every partition's high watermark then.
pub struct Sample {
    pub at: Instant,
    pub ends: Vec<i64>,
}

/// A connection to the (single) broker of `bootstrap` that asks for `topic`'s high
/// watermarks.
pub struct HighWatermarks {
    stream: TcpStream,
    request: Vec<u8>,
    topic: String,
    partitions: i32,
    answer: Vec<u8>,
}

impl HighWatermarks {
    pub fn connect(bootstrap: &str, topic: &str, partitions: i32) -> HighWatermarks {
        let broker = bootstrap.split(',').next().unwrap_or(bootstrap);
        let stream = TcpStream::connect(broker)
            .unwrap_or_else(|e| panic!("high watermarks: connect to {broker}: {e}"));
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        HighWatermarks {
            stream,
            request: fetch_request(topic, partitions),
            topic: topic.to_string(),
            partitions,
            answer: Vec::new(),
        }
    }

    /// Every partition's high watermark now.
    pub fn ask(&mut self) -> Vec<i64> {
        let topic = &self.topic;
        let failed = |what: &str, e: &dyn std::fmt::Display| -> ! {
            panic!("high watermarks of {topic}: {what}: {e}")
        };
        self.stream
            .write_all(&self.request)
            .unwrap_or_else(|e| failed("send", &e));
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .unwrap_or_else(|e| failed("read", &e));
        self.answer.resize(i32::from_be_bytes(size) as usize, 0);
        self.stream
            .read_exact(&mut self.answer)
            .unwrap_or_else(|e| failed("read", &e));
        fetch_answer(&self.answer, self.partitions).unwrap_or_else(|e| failed("answer", &e))
    }
}

/// `Fetch` v4: no wait, no minimum, zero bytes per partition, each from offset 0.
fn fetch_request(topic: &str, partitions: i32) -> Vec<u8> {
    let mut m = Vec::new();
    let string = |m: &mut Vec<u8>, s: &str| {
        m.extend((s.len() as i16).to_be_bytes());
        m.extend(s.as_bytes());
    };
    // Header: api key 1 (Fetch), version 4, correlation id, client id.
    m.extend(1i16.to_be_bytes());
    m.extend(4i16.to_be_bytes());
    m.extend(1i32.to_be_bytes());
    string(&mut m, "watchbridge-bench-high-watermarks");
    // replica id (a consumer), max wait, min bytes, max bytes, isolation (read uncommitted).
    for v in [-1i32, 0, 0, 0] {
        m.extend(v.to_be_bytes());
    }
    m.push(0);
    m.extend(1i32.to_be_bytes());
    string(&mut m, topic);
    m.extend(partitions.to_be_bytes());
    for p in 0..partitions {
        m.extend(p.to_be_bytes());
        m.extend(0i64.to_be_bytes());
        m.extend(0i32.to_be_bytes());
    }
    let mut framed = (m.len() as i32).to_be_bytes().to_vec();
    framed.extend(m);
    framed
}

/// The high watermark of each partition in a `Fetch` v4 answer (records skipped).
fn fetch_answer(a: &[u8], partitions: i32) -> Result<Vec<i64>, String> {
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let bytes = a.get(at..at + n).ok_or("cut short")?;
        at += n;
        Ok(bytes)
    };
    let i16_of = |b: &[u8]| i16::from_be_bytes(b.try_into().unwrap());
    let i32_of = |b: &[u8]| i32::from_be_bytes(b.try_into().unwrap());
    let i64_of = |b: &[u8]| i64::from_be_bytes(b.try_into().unwrap());
    take(8)?; // correlation id, throttle time
    let mut ends = vec![None; partitions as usize];
    for _ in 0..i32_of(take(4)?) {
        let name = i16_of(take(2)?).max(0) as usize;
        take(name)?;
        for _ in 0..i32_of(take(4)?) {
            let p = i32_of(take(4)?);
            let error = i16_of(take(2)?);
            let high = i64_of(take(8)?);
            take(8)?; // last stable offset
            let aborted = i32_of(take(4)?).max(0) as usize;
            take(aborted * 16)?;
            let records = i32_of(take(4)?).max(0) as usize;
            take(records)?;
            if error != 0 {
                return Err(format!("partition {p}: error code {error}"));
            }
            *ends
                .get_mut(p as usize)
                .ok_or(format!("partition {p}: not asked for"))? = Some(high);
        }
    }
    ends.into_iter()
        .enumerate()
        .map(|(p, end)| end.ok_or(format!("partition {p}: no answer")))
        .collect()
}

/// The sampling thread; [`EndOffsets::stop`] ends it and returns what it heard.
pub struct EndOffsets {
    stop: Arc<AtomicBool>,
    /// The sum of the high watermarks in the latest sample (records on the topic by then).
    total: Arc<AtomicI64>,
    thread: JoinHandle<Vec<Sample>>,
}

impl EndOffsets {
    /// Starts sampling `topic`'s `partitions`; returns once the first answer came (so the
    /// connection is made before the job starts).
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> EndOffsets {
        let mut broker = HighWatermarks::connect(bootstrap, topic, partitions);
        let mut ask = move || Sample {
            ends: broker.ask(),
            at: Instant::now(),
        };
        let first = ask();
        let stop = Arc::new(AtomicBool::new(false));
        let total = Arc::new(AtomicI64::new(first.ends.iter().sum()));
        let thread = {
            let (stop, total) = (stop.clone(), total.clone());
            std::thread::spawn(move || {
                let mut samples = vec![first];
                loop {
                    // Read before the sample, so that the last sample was asked for after
                    // `stop`: it covers every record read before the stop.
                    let stopping = stop.load(Ordering::Relaxed);
                    std::thread::sleep(EVERY);
                    let sample = ask();
                    total.store(sample.ends.iter().sum(), Ordering::Relaxed);
                    samples.push(sample);
                    if stopping {
                        return samples;
                    }
                }
            })
        };
        EndOffsets {
            stop,
            total,
            thread,
        }
    }

    /// Records on the topic at the latest sample, all partitions together.
    pub fn total(&self) -> i64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Stops sampling (after one more sample); every sample, oldest first.
    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the end-offset sampler panicked")
    }
}

/// The first sample at which every partition `p` had reached `needed[p]` (an end offset
/// past the records wanted), if one did.
pub fn first_reaching(samples: &[Sample], needed: &[i64]) -> Option<Instant> {
    samples
        .iter()
        .find(|s| s.ends.iter().zip(needed).all(|(end, need)| end >= need))
        .map(|s| s.at)
}

/// The first sample at which some partition `p` had passed `offsets[p]` (`None` in it: no
/// record wanted there).
pub fn first_passing(samples: &[Sample], offsets: &[Option<i64>]) -> Option<Instant> {
    samples
        .iter()
        .find(|s| {
            s.ends
                .iter()
                .zip(offsets)
                .any(|(end, at)| at.is_some_and(|at| *end > at))
        })
        .map(|s| s.at)
}

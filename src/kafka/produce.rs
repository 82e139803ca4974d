//! Handing a record to librdkafka by topic handle: the path every output takes.
//!
//! rdkafka's `BaseProducer::send` names the topic by its name: for each record it builds a
//! `CString` of the name, and librdkafka looks the topic up by name under its lock and parses
//! the call's varargs (together ~4% of the bridge's CPU at 400,000 outputs/s). A
//! [`Sender`] keeps a handle for each topic it writes to (`rd_kafka_topic_new`, once) and
//! hands each record over with `rd_kafka_produceva`, naming the handle. The rest is what
//! rdkafka's `send` does: librdkafka copies the key and value (`RD_KAFKA_MSG_F_COPY`), and
//! the record's opaque (its token, `reports.rs`) comes back with its delivery report to the
//! producer's context, as for a record rdkafka sent.

use super::records::OutRecord;
use super::reports::OnceRoute;
use super::stats::BridgeProducer;
use rdkafka::bindings as rdsys;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

/// Sends records through one producer, keeping a handle per topic it wrote to.
pub struct Sender {
    /// Declared before `producer`, so dropped before it: a topic handle is destroyed
    /// before its client.
    topics: Vec<(Arc<str>, TopicHandle)>,
    producer: BridgeProducer,
}

/// librdkafka's application handle of a topic (reference-counted there, thread-safe).
struct TopicHandle(NonNull<rdsys::rd_kafka_topic_t>);

// librdkafka's topic handles may be used from any thread.
unsafe impl Send for TopicHandle {}
unsafe impl Sync for TopicHandle {}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        unsafe { rdsys::rd_kafka_topic_destroy(self.0.as_ptr()) }
    }
}

/// A header list built for one record: librdkafka owns it once the record is accepted,
/// the sender frees it if the record is refused.
struct Headers(*mut rdsys::rd_kafka_headers_t);

impl Headers {
    fn of(record: &OutRecord) -> Self {
        if record.headers.is_empty() {
            // No list at all: librdkafka would allocate one per record.
            return Self(ptr::null_mut());
        }
        let list = unsafe { rdsys::rd_kafka_headers_new(record.headers.len()) };
        for (name, value) in &record.headers {
            let (value, size) = value
                .as_ref()
                .map_or((ptr::null(), 0), |v| (v.as_ptr() as *const c_void, v.len()));
            // Copies the name and value; fails only for a read-only list (never here).
            unsafe {
                rdsys::rd_kafka_header_add(
                    list,
                    name.as_ptr() as *const _,
                    name.len() as isize,
                    value,
                    size as isize,
                );
            }
        }
        Self(list)
    }

    /// librdkafka took the list with the record.
    fn handed_over(mut self) {
        self.0 = ptr::null_mut();
    }
}

impl Drop for Headers {
    fn drop(&mut self) {
        if !self.0.is_null() {
            unsafe { rdsys::rd_kafka_headers_destroy(self.0) }
        }
    }
}

impl Sender {
    pub fn new(producer: &BridgeProducer) -> Self {
        Self {
            topics: Vec::new(),
            producer: producer.clone(),
        }
    }

    /// Hand `record` to the producer, its delivery report to carry `token`; refused (its
    /// queue full, say), the error says why, as rdkafka's `send` would.
    pub fn send(&mut self, record: &OutRecord, token: usize) -> Result<(), KafkaError> {
        let topic = self.topic(&record.topic)?;
        let headers = Headers::of(record);
        let (value, value_len) = bytes(record.value.as_deref());
        let (key, key_len) = bytes(record.key.as_deref());
        use rdsys::rd_kafka_vtype_t::*;
        let vus = [
            vu(
                RD_KAFKA_VTYPE_RKT,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 { rkt: topic },
            ),
            vu(
                RD_KAFKA_VTYPE_PARTITION,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i32_: record.partition.unwrap_or(-1),
                },
            ),
            vu(
                RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i: rdsys::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(RD_KAFKA_VTYPE_VALUE, mem(value, value_len)),
            vu(RD_KAFKA_VTYPE_KEY, mem(key, key_len)),
            vu(
                RD_KAFKA_VTYPE_OPAQUE,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    ptr: token as *mut c_void,
                },
            ),
            vu(
                RD_KAFKA_VTYPE_TIMESTAMP,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i64_: record.timestamp.unwrap_or(0),
                },
            ),
            vu(
                RD_KAFKA_VTYPE_HEADERS,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 { headers: headers.0 },
            ),
        ];
        let error = unsafe {
            rdsys::rd_kafka_produceva(self.producer.client().native_ptr(), vus.as_ptr(), vus.len())
        };
        if error.is_null() {
            headers.handed_over();
            return Ok(());
        }
        let code = unsafe { rdsys::rd_kafka_error_code(error) };
        unsafe { rdsys::rd_kafka_error_destroy(error) };
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::from(code)))
    }

    /// The handle of topic `name`, made on first use.
    fn topic(&mut self, name: &Arc<str>) -> Result<*mut rdsys::rd_kafka_topic_t, KafkaError> {
        if let Some((_, handle)) = self.topics.iter().find(|(known, _)| known == name) {
            return Ok(handle.0.as_ptr());
        }
        let c_name = CString::new(name.as_bytes())?;
        let handle = unsafe {
            rdsys::rd_kafka_topic_new(
                self.producer.client().native_ptr(),
                c_name.as_ptr(),
                ptr::null_mut(),
            )
        };
        let handle = NonNull::new(handle).ok_or_else(|| {
            KafkaError::MessageProduction(RDKafkaErrorCode::from(unsafe {
                rdsys::rd_kafka_last_error()
            }))
        })?;
        self.topics.push((name.clone(), TopicHandle(handle)));
        Ok(handle.as_ptr())
    }
}

fn bytes(b: Option<&[u8]>) -> (*mut c_void, usize) {
    b.map_or((ptr::null_mut(), 0), |b| {
        (b.as_ptr() as *mut c_void, b.len())
    })
}

fn mem(ptr: *mut c_void, size: usize) -> rdsys::rd_kafka_vu_s__bindgen_ty_1 {
    rdsys::rd_kafka_vu_s__bindgen_ty_1 {
        mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 { ptr, size },
    }
}

fn vu(
    vtype: rdsys::rd_kafka_vtype_t,
    u: rdsys::rd_kafka_vu_s__bindgen_ty_1,
) -> rdsys::rd_kafka_vu_t {
    rdsys::rd_kafka_vu_t { vtype, u }
}

/// Send one record and wait for where it landed; while the producer's queue is full, try again
/// every 100 ms for up to `queue_timeout` (what `FutureProducer::send` did for the few
/// records sent this way: the merged watermark, the end of time). Handed over as every
/// other record is ([`Sender`]).
pub async fn send_and_wait(
    producer: &BridgeProducer,
    record: &OutRecord,
    queue_timeout: Duration,
) -> Result<(i32, i64), KafkaError> {
    let route = OnceRoute::open(producer);
    let deadline = tokio::time::Instant::now() + queue_timeout;
    let mut sender = Sender::new(producer);
    loop {
        match sender.send(record, route.token()) {
            Ok(()) => break,
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                route.close();
                return Err(e);
            }
        }
    }
    route.landed().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::health::{BrokerHealth, KafkaContext};
    use crate::kafka::reports::Route;
    use crate::kafka::stats::ProducerStats;
    use bytes::Bytes;
    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, PurgeConfig};

    /// `record` as rdkafka's own `send` takes it (how every record was handed over before
    /// [`Sender`]), to compare with.
    fn by_name(record: &OutRecord, token: usize) -> BaseRecord<'_, [u8], [u8], usize> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key: key.as_ref(),
                value: value.as_deref(),
            });
        }
        let mut base = BaseRecord::with_opaque_to(&record.topic, token).headers(headers);
        if let Some(key) = &record.key {
            base = base.key(key.as_ref());
        }
        if let Some(value) = &record.value {
            base = base.payload(value.as_ref());
        }
        if let Some(ts) = record.timestamp {
            base = base.timestamp(ts);
        }
        if let Some(p) = record.partition {
            base = base.partition(p);
        }
        base
    }

    /// A producer that never reaches a broker: records wait in its queue until purged, and
    /// come back with their reports.
    fn producer(queue_messages: usize) -> BridgeProducer {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let health = BrokerHealth::new("127.0.0.1:9", metrics.clone());
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("queue.buffering.max.messages", queue_messages.to_string())
            .create_with_context(ProducerStats::new(metrics, KafkaContext::new(health)))
            .expect("a producer")
    }

    fn record(topic: &Arc<str>, n: u8) -> OutRecord {
        OutRecord {
            topic: topic.clone(),
            partition: Some(2),
            key: Some(Bytes::from(vec![b'k', n])),
            value: Some(Bytes::from(vec![b'v', n, 0, 255])),
            timestamp: Some(1_700_000_000_000 + i64::from(n)),
            headers: vec![
                ("wb-id".into(), Some(Bytes::from_static(b"0:7"))),
                ("empty".into(), None),
            ],
        }
    }

    /// What librdkafka holds for a record handed over by handle is the record: its key,
    /// value, timestamp and headers (a null one included) come back whole with its report,
    /// and the report finds its route and slot by the token.
    #[tokio::test]
    async fn a_record_handed_over_by_handle_comes_back_whole_with_its_report() {
        let producer = producer(100);
        let mut route = Route::open(&producer);
        let mut sender = Sender::new(&producer);
        let outputs: Arc<str> = Arc::from("outputs");
        let other: Arc<str> = Arc::from("other");
        for n in 0..3 {
            sender
                .send(&record(&outputs, n), route.token(u32::from(n)))
                .unwrap();
        }
        // Another topic, and the first again by an equal name from another allocation.
        sender.send(&record(&other, 3), route.token(3)).unwrap();
        sender
            .send(&record(&Arc::from("outputs"), 4), route.token(4))
            .unwrap();
        assert_eq!(sender.topics.len(), 2, "one handle per topic");
        // And one through rdkafka's own `send`, to compare with.
        producer
            .send(by_name(&record(&outputs, 5), route.token(5)))
            .map_err(|(e, _)| e)
            .unwrap();
        producer.purge(PurgeConfig::default().queue());
        let mut reports = Vec::new();
        while reports.len() < 6 {
            let got = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                route.recv_many(&mut reports, 10),
            )
            .await
            .expect("every purged record is reported");
            assert!(got > 0);
        }
        reports.sort_by_key(|(slot, _)| *slot);
        let mut timestamps = Vec::new();
        for (n, (slot, outcome)) in reports.into_iter().enumerate() {
            assert_eq!(slot, n as u32);
            let undelivered = outcome.expect_err("purged, never delivered");
            let parts = *undelivered.record.expect("the record comes back");
            let sent = record(&outputs, n as u8);
            assert_eq!(parts.key, sent.key);
            assert_eq!(parts.value, sent.value);
            assert_eq!(parts.headers, sent.headers);
            timestamps.push(parts.timestamp);
        }
        // librdkafka reports no timestamp for a record it never sent: the same for both.
        assert!(
            timestamps.iter().all(|t| *t == timestamps[5]),
            "{timestamps:?}"
        );
    }

    /// A record the producer refuses (its queue full) is not queued, its error says why, and
    /// the header list built for it is freed by the sender (librdkafka never took it).
    #[tokio::test]
    async fn a_refused_record_says_why_and_is_not_queued() {
        let producer = producer(1);
        let route = Route::open(&producer);
        let mut sender = Sender::new(&producer);
        let topic: Arc<str> = Arc::from("outputs");
        sender.send(&record(&topic, 0), route.token(0)).unwrap();
        for n in 1..50 {
            let refused = sender.send(&record(&topic, n), route.token(u32::from(n)));
            assert!(
                matches!(
                    refused,
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                ),
                "{refused:?}"
            );
        }
        // Only the first is queued: one report after a purge.
        let mut route = route;
        producer.purge(PurgeConfig::default().queue());
        let mut reports = Vec::new();
        let wait = std::time::Duration::from_millis(500);
        while tokio::time::timeout(wait, route.recv_many(&mut reports, 100))
            .await
            .is_ok()
        {}
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].0, 0);
    }
}

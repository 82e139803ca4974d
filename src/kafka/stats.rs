//! librdkafka's statistics as metrics: the producers' queue depth (summed over the bridge's
//! producers) and the consumer's lag per assigned input partition, every
//! `statistics.interval.ms` (5 s unless `KAFKA_STATISTICS_INTERVAL_MS` says otherwise). Only
//! the bridge's own producers and group consumer ask for them: other clients (recovery
//! reads, the watermark reader, admin) would log them instead.

use super::health::KafkaContext;
use super::reports::{outcome, Routed, Routes};
use crate::internal_events::KafkaStatistics;
use crate::metrics::Metrics;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientConfig, ClientContext};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The librdkafka property, and its value unless the user set `KAFKA_STATISTICS_INTERVAL_MS`.
pub const INTERVAL_PROPERTY: &str = "statistics.interval.ms";
const DEFAULT_INTERVAL_MS: &str = "5000";

/// A producer of the bridge: each partition task's own (idempotent, or transactional in the
/// exactly-once mode), and the shared one for what no partition owns (the merged watermark,
/// a bounded run's end of time). Its context feeds the metrics and routes the delivery
/// reports (`reports.rs`).
pub type BridgeProducer = ThreadedProducer<ProducerStats>;

/// How the bridge's producers are made: their settings (idempotent, `acks=all`:
/// `clients::KafkaSettings::output_producer`; in the exactly-once mode with the transaction
/// timeouts: `transactional_producer`) and
/// where their reports go. One place, so that the shared producer and every partition's own
/// are made alike.
#[derive(Clone)]
pub struct ProducerSettings {
    pub config: ClientConfig,
    pub metrics: Arc<Metrics>,
    /// Their errors and log lines go to the bridge's broker health.
    pub kafka: KafkaContext,
}

impl ProducerSettings {
    /// A new producer (a librdkafka client of its own: its threads and connections), with
    /// `transactional_id` if given.
    pub fn create(&self, transactional_id: Option<&str>) -> KafkaResult<BridgeProducer> {
        let mut config = self.config.clone();
        if let Some(id) = transactional_id {
            config.set("transactional.id", id);
        }
        config.create_with_context(ProducerStats::new(self.metrics.clone(), self.kafka.clone()))
    }
}

/// The producer's context: its statistics count in `watchbridge_producer_queue_messages`;
/// its errors and log lines go to the bridge's broker health (`health.rs`); each delivery
/// report goes to the route that sent the record.
pub struct ProducerStats {
    pub metrics: Arc<Metrics>,
    pub kafka: KafkaContext,
    pub routes: Arc<Routes>,
    /// This producer's part of the queue gauge (its last `msg_cnt`): the gauge is the sum
    /// over the bridge's producers, so each adds what changed, and takes its part back when
    /// it goes.
    queued: AtomicU64,
}

impl ProducerStats {
    pub fn new(metrics: Arc<Metrics>, kafka: KafkaContext) -> Self {
        Self {
            metrics,
            kafka,
            routes: Arc::default(),
            queued: AtomicU64::new(0),
        }
    }

    /// Count `queued_messages` as this producer's part of the queue gauge.
    fn count_queued(&self, queued_messages: u64) {
        let before = self.queued.swap(queued_messages, Ordering::Relaxed);
        KafkaStatistics::Producer {
            queued_messages,
            before,
        }
        .emit(&self.metrics);
    }
}

impl Drop for ProducerStats {
    fn drop(&mut self) {
        self.count_queued(0);
    }
}

impl ProducerContext for ProducerStats {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, token: usize) {
        self.routes.deliver(token, outcome(result));
    }
}

impl Routed for ProducerStats {
    fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }
}

impl ClientContext for ProducerStats {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.kafka.health.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.kafka.health.error(error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        self.count_queued(statistics.msg_cnt);
    }
}

/// Ask `c` for statistics at the user's interval (in `kafka`, the `KAFKA_*` properties),
/// else every 5 s.
pub fn enable(c: &mut ClientConfig, kafka: &[(String, String)]) {
    let interval = kafka
        .iter()
        .find(|(key, _)| key == INTERVAL_PROPERTY)
        .map_or(DEFAULT_INTERVAL_MS, |(_, value)| value.as_str());
    c.set(INTERVAL_PROPERTY, interval);
}

/// The consumer lag of each `assigned` partition of `topic`, where librdkafka knows it: it
/// reports -1 before it has both an end offset and a position, and lists its internal
/// "unassigned" partition -1 too.
///
/// In the exactly-once mode the consumer commits nothing itself (its transactions do), so
/// librdkafka does not know the lag; `committed` holds the positions the partitions'
/// transactions committed, and the lag is the partition's end (its last stable offset,
/// what a `read_committed` consumer can reach) minus that.
pub fn consumer_lag(
    statistics: &Statistics,
    topic: &str,
    assigned: &[i32],
    committed: &HashMap<i32, i64>,
) -> Vec<(i32, i64)> {
    let Some(topic) = statistics.topics.get(topic) else {
        return Vec::new();
    };
    let mut lag: Vec<(i32, i64)> = assigned
        .iter()
        .filter(|&&p| p >= 0)
        .filter_map(|p| topic.partitions.get(p))
        .filter_map(|p| {
            if p.consumer_lag >= 0 {
                return Some((p.partition, p.consumer_lag));
            }
            let position = committed.get(&p.partition)?;
            let end = if p.ls_offset >= 0 {
                p.ls_offset
            } else {
                p.hi_offset
            };
            (end >= 0).then(|| (p.partition, (end - position).max(0)))
        })
        .collect();
    lag.sort_unstable();
    lag
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::statistics::{Partition, Topic};

    fn statistics(topic: &str, lags: &[(i32, i64)]) -> Statistics {
        let mut t = Topic {
            topic: topic.into(),
            ..Topic::default()
        };
        for &(partition, consumer_lag) in lags {
            t.partitions.insert(
                partition,
                Partition {
                    partition,
                    consumer_lag,
                    ..Partition::default()
                },
            );
        }
        let mut s = Statistics::default();
        s.topics.insert(topic.into(), t);
        s
    }

    #[test]
    fn lag_of_assigned_partitions_only_where_known() {
        let s = statistics("users", &[(-1, 0), (0, 7), (1, -1), (2, 0), (3, 4)]);
        let none = HashMap::new();
        assert_eq!(
            consumer_lag(&s, "users", &[3, 0, 1, 2], &none),
            [(0, 7), (2, 0), (3, 4)]
        );
        assert_eq!(
            consumer_lag(&s, "users", &[0], &none),
            [(0, 7)],
            "3 is not ours"
        );
        assert_eq!(consumer_lag(&s, "users", &[-1], &none), []);
        assert_eq!(consumer_lag(&s, "other", &[0], &none), []);
    }

    #[test]
    fn in_the_exactly_once_mode_the_lag_is_the_stable_end_minus_the_committed_position() {
        let mut s = statistics("users", &[(0, -1), (1, -1)]);
        let partitions = &mut s.topics.get_mut("users").unwrap().partitions;
        for p in partitions.values_mut() {
            (p.hi_offset, p.ls_offset) = (12, 10);
        }
        let committed = HashMap::from([(0, 4)]);
        assert_eq!(
            consumer_lag(&s, "users", &[0, 1], &committed),
            [(0, 6)],
            "partition 1 has committed nothing yet: unknown"
        );
    }

    /// Each producer counts its own queue: the gauge is their sum, and a producer that goes
    /// (a partition task's, as it ends) takes its part back.
    #[test]
    fn the_queue_gauge_sums_the_producers() {
        let metrics = Arc::new(Metrics::new());
        let health = crate::kafka::health::BrokerHealth::new("127.0.0.1:9", metrics.clone());
        let kafka = KafkaContext::new(health);
        let (a, b) = (
            ProducerStats::new(metrics.clone(), kafka.clone()),
            ProducerStats::new(metrics.clone(), kafka),
        );
        a.count_queued(5);
        b.count_queued(3);
        assert_eq!(metrics.producer_queue_messages.get(), 8);
        a.count_queued(2);
        assert_eq!(metrics.producer_queue_messages.get(), 5);
        drop(a);
        assert_eq!(metrics.producer_queue_messages.get(), 3);
    }

    #[test]
    fn the_users_interval_wins() {
        let mut c = ClientConfig::new();
        enable(&mut c, &[]);
        assert_eq!(c.get(INTERVAL_PROPERTY), Some("5000"));
        let kafka = [(INTERVAL_PROPERTY.to_string(), "500".to_string())];
        enable(&mut c, &kafka);
        assert_eq!(c.get(INTERVAL_PROPERTY), Some("500"));
    }
}

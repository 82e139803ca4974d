//! The embedded broker: librdkafka's in-process mock cluster, used when
//! `WATCHBRIDGE_BROKERS` is unset, and by `watchbridge broker`. It speaks the Kafka protocol
//! on a loopback port (so `kcat` can use it too) and keeps everything in memory: it is for
//! trying watchbridge out, never for data that matters.

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub struct EmbeddedBroker {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl EmbeddedBroker {
    pub fn start() -> Result<Self, String> {
        let cluster =
            MockCluster::new(1).map_err(|e| format!("cannot start the embedded broker: {e}"))?;
        Ok(Self { cluster })
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// The mock cluster does not take the admin API's CreateTopics; it has its own call.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), String> {
        self.cluster
            .create_topic(topic, partitions, 1)
            .map_err(|e| e.to_string())
    }
}

//! What really reached Kafka: a plain consumer reads `demo.events` and the dead-letter
//! topic back as the bridge produces, counts outputs per user, and checks every record —
//! the bridge's own counters could not prove that a record arrived once, keyed, stamped
//! and labelled right.

use super::outputs::OutputValues;
use crate::clock::Millis;
use crate::kafka::records::{ERROR, ERROR_KIND, FIRST_SEEN, OUTPUT_KEY};
use crate::pollers::event_time::parse_rfc3339;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Problems kept for the summary (all are counted).
const KEEP_PROBLEMS: usize = 5;

/// Reads the output and dead-letter topics from the beginning, outside any consumer group
/// (it assigns itself every partition), so it sees everything and commits nothing.
pub struct Reader {
    consumer: StreamConsumer,
    outputs_topic: String,
    /// How output values are read (the bridge's output format).
    values: OutputValues,
}

impl Reader {
    pub fn assign(
        brokers: &str,
        outputs: &str,
        dead_letters: &str,
        partitions: i32,
        values: OutputValues,
    ) -> Result<Self, String> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "watchbridge-demo-view")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| format!("cannot create the demo's consumer: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        for topic in [outputs, dead_letters] {
            for p in 0..partitions {
                tpl.add_partition_offset(topic, p, Offset::Beginning)
                    .map_err(|e| e.to_string())?;
            }
        }
        consumer
            .assign(&tpl)
            .map_err(|e| format!("cannot read {outputs} and {dead_letters}: {e}"))?;
        Ok(Self {
            consumer,
            outputs_topic: outputs.to_string(),
            values,
        })
    }

    /// The next record of either topic (cancellation safe).
    pub async fn recv(&self) -> Result<BorrowedMessage<'_>, KafkaError> {
        self.consumer.recv().await
    }
}

/// A record of the dead-letter topic.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub key: String,
    pub kind: String,
    pub error: String,
}

/// Everything read so far, and what the checks found.
#[derive(Debug, Default)]
pub struct Tally {
    /// Output records per record key (the watch key: the user).
    pub per_user: HashMap<String, u64>,
    /// In-band watermark records read from the output topic.
    pub markers: u64,
    pub outputs: u64,
    /// Output keys (`watchbridge-output-key`) read so far.
    keys: HashSet<String>,
    /// Output keys read more than once.
    pub repeated: u64,
    /// Outputs whose Kafka timestamp equals their item's `at`.
    pub on_time: u64,
    /// Outputs whose key, headers or value do not match.
    pub mislabelled: u64,
    /// Outputs whose value does not decode in the output format.
    pub undecoded: u64,
    /// The Avro schema ids the outputs were framed with.
    pub schema_ids: BTreeSet<u32>,
    pub problems: Vec<String>,
    pub dead_letters: Vec<DeadLetter>,
}

impl Tally {
    pub async fn record(&mut self, reader: &Reader, message: &BorrowedMessage<'_>) {
        // In-band watermark records share the output topic; they are not outputs.
        if header(message, crate::kafka::records::CONTROL).is_some() {
            self.markers += 1;
            return;
        }
        if message.topic() == reader.outputs_topic {
            self.output(reader, message).await;
        } else {
            self.dead_letters.push(DeadLetter {
                key: text(message.key()),
                kind: header(message, ERROR_KIND).unwrap_or_default(),
                error: header(message, ERROR).unwrap_or_default(),
            });
        }
    }

    async fn output(&mut self, reader: &Reader, m: &BorrowedMessage<'_>) {
        self.outputs += 1;
        let user = text(m.key());
        *self.per_user.entry(user.clone()).or_default() += 1;
        let output_key = header(m, OUTPUT_KEY).unwrap_or_default();
        let where_ = format!("{user} / {output_key} (partition {})", m.partition());
        if !self.keys.insert(output_key.clone()) {
            self.repeated += 1;
            self.problem(format!("{where_}: produced again"));
        }
        // JSON or Avro, the item as the feed served it; from here on, one code path.
        let item = match reader.values.decode(m.payload()).await {
            Ok(decoded) => {
                self.schema_ids.extend(decoded.schema_id);
                decoded.item
            }
            Err(e) => {
                self.undecoded += 1;
                self.problem(format!("{where_}: the value does not decode: {e}"));
                serde_json::Value::Null
            }
        };
        let at: Option<Millis> = item["at"].as_str().and_then(|t| parse_rfc3339(t).ok());
        let timestamp = m.timestamp().to_millis();
        if at.is_some() && at == timestamp {
            self.on_time += 1;
        } else {
            self.problem(format!(
                "{where_}: timestamp {timestamp:?}, but the item's `at` is {}",
                item["at"]
            ));
        }
        let labelled = m.key().is_some_and(|k| !k.is_empty())
            && item["id"].as_str() == Some(output_key.as_str())
            && output_key.starts_with(&format!("{user}-"))
            && header(m, FIRST_SEEN).is_some();
        if !labelled {
            self.mislabelled += 1;
            self.problem(format!(
                "{where_}: key, headers and value do not name the same user and item"
            ));
        }
    }

    fn problem(&mut self, text: String) {
        if self.problems.len() < KEEP_PROBLEMS {
            self.problems.push(text);
        }
    }

    /// Every output read passed every check.
    pub fn all_good(&self) -> bool {
        self.repeated == 0
            && self.mislabelled == 0
            && self.undecoded == 0
            && self.on_time == self.outputs
    }
}

fn header(m: &BorrowedMessage<'_>, name: &str) -> Option<String> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn text(bytes: Option<&[u8]>) -> String {
    String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned()
}

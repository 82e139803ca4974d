//! What the state topic says about a watch, read by any instance: so that an instance
//! asked about a watch another instance owns can answer from its last checkpoint, and so
//! that any instance can restart or reset ended watches (`POST /watches/{key}/restart`,
//! `…/reset`, `POST /restart`).
//!
//! A restart or a reset is the watch's input produced again into its input partition
//! (explicitly: the partition its state is in), marked with the [`CONTROL_HEADER`]: the
//! owner then takes it as it takes any input delivered again. A failed watch's input starts
//! it again knowing the outputs it had found (only new ones come out); with `reset` it
//! starts knowing none, a finished watch too (everything comes out again). So the owner's
//! usual path, with its guarantees in both modes, does the work, and no instance needs to
//! know which instance owns which partition. It needs WRITE on the input topic
//! (docs/brokers.md, "Least privilege").

use crate::kafka::health::KafkaContext;
use crate::kafka::tools::read_topic_with;
use crate::reason::TerminatedReason;
use crate::state::{decode_entry, Entry, Part, WatchRecord};
use bytes::Bytes;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use rdkafka::Message;
use std::collections::HashMap;
use std::time::Duration;

/// The header that marks an input produced again by an operator's order: `restart` or
/// `reset`.
pub const CONTROL_HEADER: &str = "wb-control";

/// What an operator asks of an ended watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// A failed watch starts again, knowing what it had found.
    Restart,
    /// An ended watch starts again knowing nothing: every output comes out again.
    Reset,
}

impl Again {
    /// Its [`CONTROL_HEADER`] value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::Reset => "reset",
        }
    }

    /// The order an input's [`CONTROL_HEADER`] carries, if any.
    pub fn of_header(value: &[u8]) -> Option<Self> {
        match value {
            b"restart" => Some(Self::Restart),
            b"reset" => Some(Self::Reset),
            _ => None,
        }
    }
}

/// A watch as its latest state record says.
#[derive(Debug, Clone)]
pub struct Remembered {
    /// Its input partition (its state's partition).
    pub partition: i32,
    /// Its latest record.
    pub record: WatchRecord,
}

impl Remembered {
    /// Whether it ended `failed`.
    pub fn failed(&self) -> bool {
        self.record
            .finished
            .as_ref()
            .is_some_and(|f| f.reason == TerminatedReason::Failed.as_str())
    }

    /// As the operations API shows it (no input value: that is shown only by the owner,
    /// and only with `WATCHBRIDGE_CONTROL_SHOW_INPUTS`).
    pub fn view(&self) -> serde_json::Value {
        let r = &self.record;
        serde_json::json!({
            "key": String::from_utf8_lossy(&r.watch_key),
            "partition": self.partition,
            "state": if r.finished.is_some() { "finished" } else { "live" },
            "reason": r.finished.as_ref().map(|f| f.reason.clone()),
            "ended_ms": r.finished.as_ref().map(|f| f.at),
            "started_ms": r.arrived,
            "polls_ok": r.polls,
            "failures_in_a_row": r.failures,
            "hold_ms": r.hold,
            "answered_from": "the state topic: the watch's owner is another instance; this is its last checkpoint",
        })
    }
}

/// Reads the state topic for the operations API, and produces inputs again.
pub struct StateLookup {
    /// The reader's settings ([`KafkaSettings::state_lookup_reader`]).
    ///
    /// [`KafkaSettings::state_lookup_reader`]: super::clients::KafkaSettings::state_lookup_reader
    reader: ClientConfig,
    brokers: String,
    state_topic: String,
    input_topic: String,
    /// The input (and state) topic's partition count.
    partitions: i32,
    /// Whether the watch key is the input record's key (no `WATCHBRIDGE_WATCH_KEY`): then
    /// the partitioners say where to look first.
    keyed_by_record_key: bool,
    producer: FutureProducer<KafkaContext>,
}

impl StateLookup {
    /// A lookup of `state_topic` (with `partitions`), producing to `input_topic` with
    /// `writer`'s settings.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        reader: ClientConfig,
        writer: ClientConfig,
        kafka: &KafkaContext,
        brokers: &str,
        state_topic: &str,
        input_topic: &str,
        partitions: i32,
        keyed_by_record_key: bool,
    ) -> Result<Self, String> {
        let producer = writer
            .create_with_context(kafka.clone())
            .map_err(|e| format!("cannot create the operations API's producer: {e}"))?;
        Ok(Self {
            reader,
            brokers: brokers.to_string(),
            state_topic: state_topic.to_string(),
            input_topic: input_topic.to_string(),
            partitions,
            keyed_by_record_key,
            producer,
        })
    }

    /// The partitions to read for `key`, likeliest first.
    fn candidates(&self, key: &[u8]) -> Vec<i32> {
        let mut order = Vec::new();
        if self.keyed_by_record_key && self.partitions > 0 {
            let likely = crate::control::partition_of_key(key, self.partitions);
            for name in ["murmur2", "crc32"] {
                if let Some(p) = likely[name].as_i64() {
                    order.push(p as i32);
                }
            }
        }
        for p in 0..self.partitions {
            order.push(p);
        }
        let mut seen = std::collections::HashSet::new();
        order.retain(|p| seen.insert(*p));
        order
    }

    /// `key`'s watch as its latest state record says (`None`: no record of it).
    pub async fn find(&self, key: &[u8]) -> Result<Option<Remembered>, String> {
        for partition in self.candidates(key) {
            let key = Bytes::copy_from_slice(key);
            let found = self.read(partition, move |k| k == key.as_ref()).await?;
            if let Some(record) = found.into_values().next() {
                return Ok(Some(Remembered { partition, record }));
            }
        }
        Ok(None)
    }

    /// Every watch whose latest record says it ended `failed`.
    pub async fn failed(&self) -> Result<Vec<Remembered>, String> {
        let mut all = Vec::new();
        for partition in 0..self.partitions {
            let latest = self.read(partition, |_| true).await?;
            let mut failed: Vec<Remembered> = latest
                .into_values()
                .map(|record| Remembered { partition, record })
                .filter(Remembered::failed)
                .collect();
            failed.sort_by(|a, b| a.record.watch_key.cmp(&b.record.watch_key));
            all.extend(failed);
        }
        Ok(all)
    }

    /// The latest watch record of each watch key `wanted` accepts in `partition`, to the
    /// partition's end as of now.
    async fn read(
        &self,
        partition: i32,
        wanted: impl Fn(&[u8]) -> bool + Send + 'static,
    ) -> Result<HashMap<Bytes, WatchRecord>, String> {
        let (reader, brokers, topic) = (
            self.reader.clone(),
            self.brokers.clone(),
            self.state_topic.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let mut latest: HashMap<Bytes, Option<WatchRecord>> = HashMap::new();
            read_topic_with(reader, &brokers, &topic, Some(partition), true, |m| {
                let key = m.key().unwrap_or_default();
                match decode_entry(key, m.payload()) {
                    Ok(Entry::Watch(w)) if wanted(&w.watch_key) => {
                        latest.insert(w.watch_key.clone(), Some(w));
                    }
                    Ok(Entry::Tombstone {
                        watch_key,
                        part: Part::Watch,
                    }) if wanted(&watch_key) => {
                        latest.insert(watch_key, None);
                    }
                    Ok(Entry::Starts(starts)) => {
                        for w in starts.watches {
                            if wanted(&w.watch_key) {
                                latest.insert(w.watch_key.clone(), Some(w));
                            }
                        }
                    }
                    _ => {}
                }
                Ok(())
            })
            .map_err(|e| format!("cannot read the state topic {topic}: {e}"))?;
            Ok(latest
                .into_iter()
                .filter_map(|(k, w)| w.map(|w| (k, w)))
                .collect())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Produce `watch`'s input again into its input partition, marked `again`. Returns the
    /// offset it got.
    pub async fn produce_again(&self, watch: &Remembered, again: Again) -> Result<i64, String> {
        let r = &watch.record;
        let headers = OwnedHeaders::new().insert(Header {
            key: CONTROL_HEADER,
            value: Some(again.as_str()),
        });
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.input_topic)
            .partition(watch.partition)
            .payload(r.input_value.as_ref())
            .timestamp(r.input_time)
            .headers(headers);
        if let Some(key) = &r.input_key {
            record = record.key(key.as_ref());
        }
        let delivered = self
            .producer
            .send(record, Duration::from_secs(15))
            .await
            .map_err(|(e, _)| {
                format!(
                    "cannot produce the input of watch `{}` again to {} partition {} (the \
                     bridge needs WRITE on the input topic for this): {e}",
                    String::from_utf8_lossy(&r.watch_key),
                    self.input_topic,
                    watch.partition
                )
            })?;
        Ok(delivered.offset)
    }
}

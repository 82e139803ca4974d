//! `watchbridge produce` and `watchbridge consume`: the smallest Kafka clients, for feeding
//! the input topic and reading the output topic by hand (what `kcat -P` / `kcat -C` do; the
//! kcat in Debian links a librdkafka too old for some brokers, Tansu among them).
//! [`read_topic`], under `consume`, also reads the state topic for `watchbridge state
//! inspect` (`crate::inspect`).

use crate::kafka::clients::KafkaSettings;
use crate::pollers::event_time::format_rfc3339;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::io::BufRead;
use std::time::Duration;

/// Produce `values` (or, if none, stdin's lines), each with `key`, or split at
/// `key_delimiter` into key and value. Returns how many were acknowledged.
pub async fn produce(
    brokers: &str,
    topic: &str,
    key: Option<&str>,
    key_delimiter: Option<&str>,
    values: &[String],
) -> Result<usize, String> {
    let producer: FutureProducer = KafkaSettings::from_env(brokers)?
        .tool_producer()
        .create()
        .map_err(|e| format!("cannot create a producer: {e}"))?;
    let lines: Vec<String> = if values.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("reading stdin: {e}"))?
    } else {
        values.to_vec()
    };
    let mut sent = 0;
    for line in lines.iter().filter(|l| !l.is_empty()) {
        let (k, v) = match key_delimiter.and_then(|d| line.split_once(d)) {
            Some((k, v)) => (Some(k), v),
            None => (key, line.as_str()),
        };
        let mut record = FutureRecord::to(topic).payload(v);
        if let Some(k) = k {
            record = record.key(k);
        }
        producer
            .send(record, Timeout::After(Duration::from_secs(15)))
            .await
            .map_err(|(e, _)| format!("producing to {topic}: {e} (does the topic exist?)"))?;
        sent += 1;
    }
    Ok(sent)
}

/// A header's value as `consume` prints it: as it is if it is printable text, else in hex
/// (`0x…`; watchbridge's own `wb-id` is binary).
fn header_text(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => {
            let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// Why a reading tool stopped early.
#[derive(Debug)]
pub enum ReadError {
    /// The brokers, the topic or the partition: the message names the setting.
    Kafka(String),
    /// Writing what was read failed (e.g. the reader of stdout went away).
    Output(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Kafka(m) => f.write_str(m),
            ReadError::Output(e) => write!(f, "writing the output: {e}"),
        }
    }
}

/// Hand every record of `topic` (or of its partition `only`) to `each`, from the
/// beginning. With `to_end`, stop at the end offsets the partitions had when it started
/// (records written later are not handed over); else wait for more, forever. Returns how
/// many records were handed over. Errors name the setting at fault (`--brokers`,
/// `--topic`, `--partition`); an error from `each` stops the reading.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    only: Option<i32>,
    to_end: bool,
    each: impl FnMut(&BorrowedMessage<'_>) -> std::io::Result<()>,
) -> Result<usize, ReadError> {
    let config = KafkaSettings::from_env(brokers)
        .map_err(ReadError::Kafka)?
        .tool_consumer();
    read_topic_with(config, brokers, topic, only, to_end, each)
}

/// [`read_topic`] with a consumer made from `config`, a reader of partitions to their end
/// (`kafka/clients.rs`: `consume`'s, or the bridge's state lookup's, with its security and
/// its group id), read `read_committed` unless `config` says otherwise.
pub fn read_topic_with(
    config: ClientConfig,
    brokers: &str,
    topic: &str,
    only: Option<i32>,
    to_end: bool,
    mut each: impl FnMut(&BorrowedMessage<'_>) -> std::io::Result<()>,
) -> Result<usize, ReadError> {
    let kafka = ReadError::Kafka;
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| kafka(format!("cannot create a consumer: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| {
            kafka(format!(
                "cannot read topic {topic}'s metadata from the brokers {brokers} \
                 (--brokers, WATCHBRIDGE_BROKERS): {e}"
            ))
        })?;
    let mut partitions = metadata
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            kafka(format!(
                "topic {topic} (--topic) does not exist on {brokers}"
            ))
        })?;
    if let Some(p) = only {
        if !partitions.contains(&p) {
            partitions.sort_unstable();
            return Err(kafka(format!(
                "--partition {p}: topic {topic} has no such partition (it has {})",
                partitions
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        partitions = vec![p];
    }
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for &p in &partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| kafka(e.to_string()))?;
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_err(|e| kafka(format!("cannot read partition {p}'s end offset: {e}")))?;
        ends.insert(p, high);
    }
    consumer.assign(&tpl).map_err(|e| kafka(e.to_string()))?;
    let mut positions: HashMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
    let mut handed = 0;
    loop {
        if to_end && positions.iter().all(|(p, &o)| o >= ends[p]) {
            return Ok(handed);
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = match message {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(p)) => {
                let position = consumer.position().ok().and_then(|tpl| {
                    match tpl.find_partition(topic, p)?.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    }
                });
                if let Some(o) = position {
                    let seen = positions.entry(p).or_insert(0);
                    *seen = (*seen).max(o);
                }
                continue;
            }
            Err(e) => return Err(kafka(e.to_string())),
        };
        positions.insert(m.partition(), m.offset() + 1);
        if to_end && m.offset() >= ends.get(&m.partition()).copied().unwrap_or(i64::MAX) {
            // Written after the start: past the end this reading stops at.
            continue;
        }
        each(&m).map_err(ReadError::Output)?;
        handed += 1;
    }
}

/// Print every record of `topic` from the beginning, one line each:
/// `partition:offset key timestamp headers value`. With `to_end`, stop at the end.
pub fn consume(
    brokers: &str,
    topic: &str,
    to_end: bool,
    out: &mut impl std::io::Write,
) -> Result<usize, ReadError> {
    read_topic(brokers, topic, None, to_end, |m| {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| format!("{}={}", h.key, header_text(h.value.unwrap_or_default())))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        writeln!(
            out,
            "{}:{} {} {} {} {}",
            m.partition(),
            m.offset(),
            String::from_utf8_lossy(m.key().unwrap_or_default()),
            m.timestamp()
                .to_millis()
                .map(format_rfc3339)
                .unwrap_or_else(|| "-".into()),
            if headers.is_empty() {
                "-".to_string()
            } else {
                headers
            },
            String::from_utf8_lossy(m.payload().unwrap_or_default())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::header_text;

    #[test]
    fn header_values_print_as_text_or_else_in_hex() {
        assert_eq!(header_text(b"e1"), "e1");
        assert_eq!(header_text(&[0x00, 0xff, 0x10]), "0x00ff10");
        assert_eq!(header_text(b"a\nb"), "0x610a62");
    }
}

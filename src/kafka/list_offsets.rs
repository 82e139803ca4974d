//! The first or end offsets of many partitions in one request: librdkafka's
//! `offsets_for_times` with a logical offset as each partition's timestamp (`ListOffsets`
//! takes -2 for the first offset, -1 for the end; one request per leader for the whole
//! list). A lookup per partition (`fetch_watermarks`: two requests each, one after the
//! other) took milliseconds of every start on a broker that answers a connection's
//! requests in order (Tansu). The end offsets are the last stable ones when the client
//! reads `read_committed` (librdkafka sends its isolation level with the request).
//!
//! Each element is set with `Offset::Beginning` or `Offset::End`: rdkafka refuses
//! `Offset::Offset(-1)` but leaves the element in the list unset (-1001), which librdkafka
//! sends as the timestamp, and Tansu 0.6 fails on that value and never answers.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

/// Where each of `partitions` starts (`Offset::Beginning`) or ends (`Offset::End`): `at`.
pub fn list_offsets<C: ConsumerContext>(
    client: &BaseConsumer<C>,
    partitions: &[(&str, i32)],
    at: Offset,
    timeout: Duration,
) -> KafkaResult<Listed> {
    assert!(
        matches!(at, Offset::Beginning | Offset::End),
        "a first or end offset is asked"
    );
    let mut list = TopicPartitionList::new();
    for &(topic, partition) in partitions {
        list.add_partition_offset(topic, partition, at)
            .expect("a logical offset is a valid one");
    }
    client.offsets_for_times(list, timeout).map(Listed)
}

/// The answer: each partition's offset, or its own error.
pub struct Listed(TopicPartitionList);

impl Listed {
    pub fn offset(&self, topic: &str, partition: i32) -> Result<i64, String> {
        let element = self
            .0
            .find_partition(topic, partition)
            .ok_or_else(|| format!("no offset of {topic}/{partition} in the answer"))?;
        element
            .error()
            .map_err(|e| format!("cannot read the offsets of {topic}/{partition}: {e}"))?;
        match element.offset() {
            Offset::Offset(o) => Ok(o),
            other => Err(format!("no offset of {topic}/{partition} ({other:?})")),
        }
    }
}

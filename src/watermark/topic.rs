//! The watermark topic read back: what every reader of it (the merged-watermark reader of
//! each instance) folds its records into, so that every instance, fresh or long running,
//! derives the same values from the same topic — also after compaction, which keeps only
//! the last record of each key.
//!
//! * **Partitions.** The last record of each input partition is its state (its value never
//!   goes back within a run, so the last is also the highest). A partition taken over
//!   starts from it ([`WatermarkTopic::partition`]).
//! * **Merged.** The minimum over the partitions' states (see [`MergedWatermark`]), never
//!   below the last `merged` record: that record is the merged value already promised, and
//!   it survives compaction where the history of partition records that produced it does
//!   not (all partitions idle once lifted it to the maximum; one that resumed lower would
//!   otherwise pull a fresh reader's value back).
//! * **End of time.** A bounded run that finished publishes `i64::MAX` for each partition
//!   and then for the merged value: "this run is complete". A run that comes after it (a
//!   streaming run, or the next bounded run of the group) is a new run, as in Flink, where
//!   every job starts its watermarks afresh: an end-of-time record resets its partition
//!   (or, `merged`, the merged floor) instead of pinning it at the end of time. So a
//!   partition's values on the topic only go up, except right after an end-of-time record,
//!   where a new run begins.

use super::merged::MergedWatermark;
use super::message::WatermarkMessage;
use crate::clock::Millis;
use std::collections::BTreeMap;

/// One [`WatermarkTopic`] shared by the topic's reader, which applies what it reads, and the
/// partition tasks, which take their floors from it.
pub type SharedWatermarkTopic = std::sync::Arc<std::sync::Mutex<WatermarkTopic>>;

pub use crate::clock::END_OF_TIME;

/// A partition's state as its owner last published it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionState {
    pub watermark: Millis,
    pub idle: bool,
}

/// The state of one input topic's watermarks, folded from the watermark topic's records.
#[derive(Debug, Clone)]
pub struct WatermarkTopic {
    input_topic: String,
    input_partitions: i32,
    partitions: BTreeMap<i32, PartitionState>,
    merged: MergedWatermark,
}

impl WatermarkTopic {
    /// Nothing read yet: every partition of the input topic unknown (which holds the
    /// merged value back until it reports or goes idle).
    pub fn new(input_topic: &str, input_partitions: i32) -> Self {
        let mut merged = MergedWatermark::new();
        for p in 0..input_partitions {
            merged.assign(p);
        }
        Self {
            input_topic: input_topic.to_owned(),
            input_partitions,
            partitions: BTreeMap::new(),
            merged,
        }
    }

    /// Take in the next record of the topic. Records about other input topics, or
    /// partitions the input topic does not have, change nothing.
    pub fn apply(&mut self, message: &WatermarkMessage) {
        match message {
            WatermarkMessage::Partition {
                topic,
                partition,
                watermark_ms,
                idle,
            } if *topic == self.input_topic && *partition < self.input_partitions => {
                if *watermark_ms == END_OF_TIME {
                    self.partitions.remove(partition);
                    self.merged.reset(*partition);
                    return;
                }
                let state = self.partitions.entry(*partition).or_insert(PartitionState {
                    watermark: *watermark_ms,
                    idle: *idle,
                });
                state.watermark = state.watermark.max(*watermark_ms);
                state.idle = *idle;
                self.merged.set(*partition, Some(state.watermark), *idle);
            }
            WatermarkMessage::Merged {
                topic,
                watermark_ms,
            } if *topic == self.input_topic => {
                if *watermark_ms == END_OF_TIME {
                    self.merged.end_of_run();
                } else {
                    self.merged.floor(*watermark_ms);
                }
            }
            _ => {}
        }
    }

    /// The merged watermark (`None`: none yet in this run).
    pub fn merged(&self) -> Option<Millis> {
        self.merged.current()
    }

    /// [`new`](Self::new), to share between the topic's reader and the partition tasks.
    pub fn shared(input_topic: &str, input_partitions: i32) -> SharedWatermarkTopic {
        std::sync::Arc::new(std::sync::Mutex::new(Self::new(
            input_topic,
            input_partitions,
        )))
    }

    /// The partition's state as last published in this run (`None`: nothing yet).
    pub fn partition(&self, partition: i32) -> Option<PartitionState> {
        self.partitions.get(&partition).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: Millis = 1_700_000_000_000;

    fn part(partition: i32, watermark_ms: Millis, idle: bool) -> WatermarkMessage {
        WatermarkMessage::Partition {
            topic: "in".into(),
            partition,
            watermark_ms,
            idle,
        }
    }

    fn merged(watermark_ms: Millis) -> WatermarkMessage {
        WatermarkMessage::Merged {
            topic: "in".into(),
            watermark_ms,
        }
    }

    fn read(records: &[WatermarkMessage]) -> WatermarkTopic {
        let mut topic = WatermarkTopic::new("in", 2);
        for r in records {
            topic.apply(r);
        }
        topic
    }

    /// What compaction leaves: the last record of each key, in their order.
    fn compacted(records: &[WatermarkMessage]) -> Vec<WatermarkMessage> {
        let last: BTreeMap<String, usize> = records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.key(), i))
            .collect();
        records
            .iter()
            .enumerate()
            .filter(|(i, r)| last[&r.key()] == *i)
            .map(|(_, r)| r.clone())
            .collect()
    }

    #[test]
    fn a_fresh_reader_starts_from_the_last_merged_record_not_below_it() {
        // All idle lifted the merged value to the maximum; then partition 0 resumed lower.
        let history = vec![
            part(0, T0 + 1_000, true),
            part(1, T0 + 9_000, true),
            merged(T0 + 9_000),
            part(0, T0 + 1_000, false),
        ];
        assert_eq!(read(&history).merged(), Some(T0 + 9_000));
        assert_eq!(read(&compacted(&history)).merged(), Some(T0 + 9_000));
        // Without the merged record, the minimum over the active partitions alone.
        assert_eq!(read(&history[..2]).merged(), Some(T0 + 9_000));
        let mut without = history.clone();
        without.remove(2);
        assert_eq!(read(&compacted(&without)).merged(), Some(T0 + 1_000));
    }

    #[test]
    fn the_end_of_time_ends_a_run_and_the_next_starts_afresh() {
        let finished = vec![
            part(0, T0, false),
            part(1, T0, false),
            merged(T0),
            part(0, END_OF_TIME, false),
            part(1, END_OF_TIME, false),
            merged(END_OF_TIME),
        ];
        let t = read(&finished);
        assert_eq!(
            t.merged(),
            None,
            "the next run is not pinned at the end of time"
        );
        assert_eq!(t.partition(0), None);
        let mut next = finished.clone();
        next.extend([part(0, T0 - 5_000, false), part(1, T0 - 6_000, false)]);
        let t = read(&next);
        assert_eq!(t.merged(), Some(T0 - 6_000));
        assert_eq!(
            t.partition(1),
            Some(PartitionState {
                watermark: T0 - 6_000,
                idle: false
            })
        );
        assert_eq!(read(&compacted(&next)).merged(), Some(T0 - 6_000));
    }

    #[test]
    fn other_topics_and_partitions_change_nothing() {
        let mut t = WatermarkTopic::new("in", 1);
        t.apply(&WatermarkMessage::Partition {
            topic: "other".into(),
            partition: 0,
            watermark_ms: T0,
            idle: false,
        });
        t.apply(&part(5, T0, false));
        t.apply(&WatermarkMessage::Merged {
            topic: "other".into(),
            watermark_ms: T0,
        });
        assert_eq!((t.merged(), t.partition(0)), (None, None));
        t.apply(&part(0, T0, true));
        assert_eq!(t.merged(), Some(T0));
    }

    proptest! {
        /// Records as owners write them (each partition's values never go back, `merged`
        /// records carry what a reader derived): a reader that starts after any prefix,
        /// on the topic compacted or not, never derives a merged value below the last
        /// `merged` record, and a reader that goes on reading never goes back.
        #[test]
        fn a_reader_started_at_any_time_never_goes_below_what_was_published(
            steps in prop::collection::vec((0i32..3, 0i64..1_000, any::<bool>(), any::<bool>()), 1..60),
        ) {
            let mut topic: Vec<WatermarkMessage> = Vec::new();
            let mut writer = WatermarkTopic::new("in", 3);
            let mut values = [0i64; 3];
            for (p, step, idle, publish_merged) in steps {
                values[p as usize] += step;
                let record = part(p, T0 + values[p as usize], idle);
                writer.apply(&record);
                topic.push(record);
                if publish_merged {
                    if let Some(m) = writer.merged() {
                        topic.push(merged(m));
                    }
                }
                let last_merged = topic.iter().rev().find_map(|r| match r {
                    WatermarkMessage::Merged { watermark_ms, .. } => Some(*watermark_ms),
                    _ => None,
                });
                for replayed in [read_3(&topic), read_3(&compacted(&topic))] {
                    prop_assert!(replayed.merged() >= last_merged);
                    prop_assert!(replayed.merged() <= writer.merged());
                }
            }
        }
    }

    fn read_3(records: &[WatermarkMessage]) -> WatermarkTopic {
        let mut topic = WatermarkTopic::new("in", 3);
        for r in records {
            topic.apply(r);
        }
        topic
    }
}

//! Publishing the partition's watermark: on the watermark topic and in every output
//! partition, when it changed.
//!
//! Without transactions the in-band copies go out only once the watermark topic has
//! acknowledged the value ([`InBandCopies`]). A delivery that fails may still land (on a
//! replicated cluster, once a follower catches up), and the partition's next task takes its
//! floor from the watermark topic: a copy that landed with no record on the topic to match
//! it would stand above that floor, and the next task's markers would go back below it (seen
//! on three nodes: in-band markers back by 2 s, outputs after them unflagged). In the
//! exactly-once mode the transaction makes the topic record and its copies one.

use super::*;

impl<P: Resolve> PartitionTask<P> {
    /// Publish the partition's watermark if it changed since the last tick.
    pub(super) async fn tick_watermark(&mut self) {
        if let Some(floor) = self.state_on_topic() {
            // Normally applied at the recovery already; here in case the topic could not be
            // read back in time then.
            self.watermark.resume_from(floor.watermark);
        }
        // The engine's, and those of the watches it has not answered for yet.
        let min_hold = self
            .starting
            .iter()
            .map(Starting::hold)
            .chain(self.min_hold)
            .min();
        let now = self.shared.clock.now_ms();
        if self.waiting.is_some() {
            self.watermark.input_waiting(now);
        }
        if let Some(update) = self.watermark.update(min_hold, now) {
            // A partition that never had a watermark still says when it goes idle, so the
            // merged watermark stops waiting for it; its value is then the beginning of time.
            let watermark = update.watermark.unwrap_or(Millis::MIN);
            self.publish_watermark(watermark, update.idle).await;
        }
    }

    /// A record of the repartition topic that is an input partition's in-band watermark
    /// (`watchbridge-control: watermark`, written by the repartition stage,
    /// `kafka/repartition/`): taken in by the partition's input watermark (the minimum of
    /// the input partitions', `watermark::upstream`) and committed with the inputs around
    /// it. Returns whether `message` was one.
    pub(super) fn take_upstream_watermark(&mut self, message: &OwnedMessage) -> bool {
        if !OutRecord::is_watermark(message) {
            return false;
        }
        match WatermarkMessage::parse(message.payload().unwrap_or_default()) {
            Ok(WatermarkMessage::Partition {
                partition,
                watermark_ms,
                idle,
                ..
            }) => {
                let watermark = (watermark_ms != Millis::MIN).then_some(watermark_ms);
                let now = self.shared.clock.now_ms();
                self.watermark.on_upstream(partition, watermark, idle, now);
            }
            other => tracing::warn!(
                partition = self.partition,
                offset = message.offset(),
                error = ?other,
                "a watermark record on the repartition topic cannot be read; it is skipped"
            ),
        }
        self.input_done(message.offset());
        true
    }

    /// Take the partition over from the state the watermark topic holds for it (its previous
    /// owner's, or an earlier run's): called by the recovery once the topic is read back,
    /// before any watch is restored or input read, so that every output is judged against
    /// it.
    pub(super) fn take_over_watermark(&mut self) {
        if let Some(state) = self.state_on_topic() {
            self.watermark.take_over(state.watermark, state.idle);
        }
    }

    /// The partition's state on the watermark topic in the current run, as read back.
    fn state_on_topic(&self) -> Option<PartitionState> {
        let topic = self.shared.watermarks.read_back.lock().ok()?;
        topic.partition(self.partition)
    }

    /// One watermark message on the watermark topic, and a copy in every output partition.
    pub(super) async fn publish_watermark(&mut self, watermark: Millis, idle: bool) {
        PartitionWatermarkChanged {
            partition: self.partition,
            watermark,
            idle,
        }
        .emit(&self.shared.metrics);
        {
            let mut status = super::lock_status(&self.status);
            status.watermark_ms = Some(watermark);
            status.idle = idle;
        }
        let message = WatermarkMessage::Partition {
            topic: self.shared.input_topic.to_string(),
            partition: self.partition,
            watermark_ms: watermark,
            idle,
        };
        let settings = &self.shared.watermarks;
        let records = OutRecord::watermark_copies(
            &message,
            &settings.topic,
            &self.shared.output_topic,
            settings.output_partitions,
        );
        let mut records = records.into_iter();
        if self.txn.is_some() {
            for record in records {
                self.send_watermark(record, None).await;
            }
        } else if let Some(on_topic) = records.next() {
            // The topic's record first (`watermark_copies`), its copies once it is there.
            let seq = self.in_band.hold(records.collect());
            self.send_watermark(on_topic, Some(seq)).await;
        }
    }

    /// The watermark topic acknowledged publication `seq`: send the in-band copies it
    /// lets out.
    pub(super) async fn watermark_on_topic(&mut self, seq: u64) {
        for record in self.in_band.acknowledged(seq) {
            self.send_watermark(record, None).await;
        }
    }

    async fn send_watermark(&mut self, record: OutRecord, on_topic: Option<u64>) {
        self.send(Pending {
            record,
            origin: Origins::None,
            attempt: 1,
            kind: Kind::Watermark { on_topic },
        })
        .await;
    }
}

/// In-band copies of watermarks whose record on the watermark topic is not acknowledged
/// yet, by publication. Watermarks only rise within a task, so the copies of the latest
/// publication the topic holds supersede those of earlier ones.
#[derive(Default)]
pub(super) struct InBandCopies {
    next: u64,
    waiting: VecDeque<(u64, Vec<OutRecord>)>,
}

impl InBandCopies {
    /// Hold a publication's copies; its number, for its topic record's report.
    fn hold(&mut self, copies: Vec<OutRecord>) -> u64 {
        self.next += 1;
        self.waiting.push_back((self.next, copies));
        self.next
    }

    /// The topic acknowledged publication `seq`: the copies of the latest publication up to
    /// it that are still held (none if a later acknowledgement let them out already).
    fn acknowledged(&mut self, seq: u64) -> Vec<OutRecord> {
        let mut latest = Vec::new();
        while self.waiting.front().is_some_and(|(s, _)| *s <= seq) {
            latest = self.waiting.pop_front().map(|(_, c)| c).unwrap_or_default();
        }
        latest
    }

    /// Publication `seq`'s topic record failed: its copies never go out (the watermark is
    /// published again).
    pub(super) fn failed(&mut self, seq: u64) {
        self.waiting.retain(|(s, _)| *s != seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copies(n: usize) -> Vec<OutRecord> {
        let message = WatermarkMessage::Partition {
            topic: "in".into(),
            partition: 0,
            watermark_ms: n as i64,
            idle: false,
        };
        OutRecord::watermark_copies(&message, &Arc::from("wm"), &Arc::from("out"), n as i32)
    }

    #[test]
    fn copies_wait_for_their_topic_record_and_the_latest_acknowledged_wins() {
        let mut in_band = InBandCopies::default();
        let first = in_band.hold(copies(1));
        let second = in_band.hold(copies(2));
        let third = in_band.hold(copies(3));
        // The second's acknowledgement lets out the second's copies only (the first's are
        // superseded), the first's late report nothing.
        assert_eq!(in_band.acknowledged(second).len(), 3);
        assert!(in_band.acknowledged(first).is_empty());
        // A failed topic record's copies never go out.
        in_band.failed(third);
        assert!(in_band.acknowledged(third).is_empty());
        let fourth = in_band.hold(copies(4));
        assert_eq!(in_band.acknowledged(fourth).len(), 5);
    }
}

//! Publishing the partition's watermark: on the watermark topic and in every output
//! partition, when it changed.

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
        for record in records {
            self.send(Pending {
                record,
                origin: Origins::None,
                attempt: 1,
                kind: Kind::Watermark,
            })
            .await;
        }
    }
}

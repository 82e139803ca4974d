//! The watermark of one input partition: its records' watermark and its watches' holds.
//!
//! Every output a partition's watches emit is due to one of its input records, so the
//! partition's watermark may pass neither the input's watermark (records still to come may
//! start watches at their timestamps) nor any live watch's hold (Beam's watermark hold: the
//! watch may still emit at or after it). Its value is therefore
//!
//! ```text
//! min(input watermark, unless the input is idle;  minimum hold of the live watches, if any)
//! ```
//!
//! and, like Flink's per-split output, it never moves backwards: the published value is the
//! highest so far. With neither term (no input watermark yet or an idle input, and no live
//! watch) there is no new value and the last one stays.
//!
//! **Idleness.** Two different questions, answered differently:
//!
//! * *Does the input still constrain?* Not once it is idle (no record for `idle_timeout`):
//!   otherwise a quiet partition under `bounded(d)` would pin its watermark at its last
//!   record's timestamp minus `d` while its watches' holds move on, and hold back every
//!   window downstream.
//! * *Is the partition idle, i.e. may the merged watermark ignore it?* Only when its input
//!   is idle **and** it has no live watch (`min_hold` is `None`). A live watch can still
//!   emit outputs at its hold; if the merged watermark passed it meanwhile, those outputs
//!   would be late downstream for no reason but a quiet input topic. When the last watch
//!   ends the partition turns idle at once; a record or a new watch makes it active again.
//!
//! Callers hand [`PartitionWatermark::update`] the engine's current minimum hold after each
//! record, after each change of the hold, and at [`InputWatermark::idle_at`] (idleness
//! comes from time passing, not from an event), and publish the [`Update`]s it returns:
//! only changes are returned.
//!
//! **Lateness.** A watermark `w` promises no more outputs with event time before `w`: an
//! output whose event time is below its partition's published watermark is late
//! ([`PartitionWatermark::is_late`]). An output exactly at a hold is on time, which is what
//! a hold means.

use super::generator::InputWatermark;
use crate::clock::Millis;

/// A change of a partition's published state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    /// The partition's watermark; `None` while it has never had one (no record with a
    /// watermark yet and no watch), which is also how a partition starts.
    pub watermark: Option<Millis>,
    /// The merged watermark may ignore this partition (see the module doc).
    pub idle: bool,
}

#[derive(Debug)]
pub struct PartitionWatermark {
    input: InputWatermark,
    /// Highest value so far; what was last published.
    published: Option<Millis>,
    /// The idle flag last published. A partition starts active, so a new one holds the
    /// merged watermark back until it has a value or its input times out (as a new split
    /// does in Flink) — a partition that starts behind the others must not find the merged
    /// watermark already past its records.
    idle: bool,
    /// The next update returns the state even if unchanged: what was published may not
    /// have reached the topic ([`republish`](Self::republish)).
    stale: bool,
}

impl PartitionWatermark {
    /// A partition whose records feed `input`. It starts as "no watermark, active", the
    /// state [`super::merged::MergedWatermark::assign`] registers a partition in.
    pub fn new(input: InputWatermark) -> Self {
        Self {
            input,
            published: None,
            idle: false,
            stale: false,
        }
    }

    /// An input record with event time `timestamp`, read at processing time `now`. Takes
    /// effect at the next [`update`](Self::update).
    pub fn on_record(&mut self, timestamp: Millis, value: Option<&serde_json::Value>, now: Millis) {
        self.input.on_record(timestamp, value, now);
    }

    /// An upstream partition's in-band watermark (a repartitioned bridge's watch side,
    /// `super::upstream`). Takes effect at the next [`update`](Self::update).
    pub fn on_upstream(
        &mut self,
        partition: i32,
        watermark: Option<Millis>,
        idle: bool,
        now: Millis,
    ) {
        self.input.on_upstream(partition, watermark, idle, now);
    }

    pub fn input(&self) -> &InputWatermark {
        &self.input
    }

    /// Recompute at `now` with the minimum hold of the partition's live watches (`None`: no
    /// live watch). Returns the new state only when the watermark or the idle flag changed.
    pub fn update(&mut self, min_hold: Option<Millis>, now: Millis) -> Option<Update> {
        self.input.emit_periodic();
        let input_idle = self.input.is_idle(now);
        let candidate = match (self.input.current(now), min_hold) {
            (Some(w), Some(h)) => Some(w.min(h)),
            (w, h) => w.or(h),
        };
        let watermark = self.published.max(candidate);
        let idle = input_idle && min_hold.is_none();
        if watermark == self.published && idle == self.idle && !self.stale {
            return None;
        }
        self.published = watermark;
        self.idle = idle;
        self.stale = false;
        Some(Update { watermark, idle })
    }

    /// A watermark this partition already published under a previous owner (read back from
    /// the watermark topic): never publish below it, and judge outputs against it from now
    /// on. Takes effect at once for [`is_late`](Self::is_late), at the next update for what
    /// is published.
    pub fn resume_from(&mut self, floor: Millis) {
        self.published = self.published.max(Some(floor));
    }

    /// Take the partition over from the state its previous owner left on the watermark
    /// topic (`watermark`, `idle`): [`resume_from`](Self::resume_from) the value, and count
    /// the topic's idle flag as the one last published, so that the next update publishes
    /// whatever differs from it — a stale `idle: true` while restored watches are live is
    /// corrected at once, though the value did not change.
    pub fn take_over(&mut self, watermark: Millis, idle: bool) {
        self.resume_from(watermark);
        self.idle = idle;
    }

    /// The partition starts reading its input at `now` (after its recovery, which may have
    /// taken longer than the idle timeout): its input is not idle before `now` plus the
    /// timeout.
    pub fn start_reading(&mut self, now: Millis) {
        self.input.activity_at(now);
    }

    /// An input was read at `now` whose event time is not known yet (its Avro schema is
    /// being fetched): the input is not idle, so the partition keeps holding the merged
    /// watermark back for it.
    pub fn input_waiting(&mut self, now: Millis) {
        self.input.activity_at(now);
    }

    /// What was last published may not have reached the topic (its delivery failed): the
    /// next update returns the state again even if nothing changed. (Sending the failed
    /// record again could land it after a later, higher one.)
    pub fn republish(&mut self) {
        self.stale = true;
    }

    /// The watermark last returned by [`update`](Self::update).
    pub fn published(&self) -> Option<Millis> {
        self.published
    }

    /// The idle flag last returned by [`update`](Self::update).
    pub fn is_idle(&self) -> bool {
        self.idle
    }

    /// An output of this partition with `event_time` is late: below the published watermark.
    pub fn is_late(&self, event_time: Millis) -> bool {
        self.published.is_some_and(|w| event_time < w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watermark::strategy::WatermarkStrategy;
    use proptest::prelude::*;
    use std::time::Duration;

    const T0: Millis = 1_700_000_000_000;
    const MINUTE: Duration = Duration::from_secs(60);

    fn partition(strategy: WatermarkStrategy) -> PartitionWatermark {
        PartitionWatermark::new(InputWatermark::new(strategy, MINUTE, T0))
    }

    fn bounded_5s() -> PartitionWatermark {
        partition(WatermarkStrategy::default())
    }

    fn up(watermark: Millis, idle: bool) -> Option<Update> {
        Some(Update {
            watermark: Some(watermark),
            idle,
        })
    }

    #[test]
    fn the_value_is_the_minimum_of_the_input_watermark_and_the_holds() {
        let mut p = bounded_5s();
        assert_eq!(
            p.update(None, T0),
            None,
            "nothing yet: no change from the start"
        );
        p.on_record(T0 + 10_000, None, T0);
        assert_eq!(p.update(Some(T0 + 10_000), T0), up(T0 + 4_999, false));
        // A hold below the input watermark wins.
        p.on_record(T0 + 30_000, None, T0 + 1);
        assert_eq!(p.update(Some(T0 + 8_000), T0 + 1), up(T0 + 8_000, false));
        // The hold rising lets the input watermark through.
        assert_eq!(p.update(Some(T0 + 40_000), T0 + 2), up(T0 + 24_999, false));
        // No live watch: the input watermark alone.
        p.on_record(T0 + 35_000, None, T0 + 3);
        assert_eq!(p.update(None, T0 + 3), up(T0 + 29_999, false));
        assert_eq!(p.published(), Some(T0 + 29_999));
    }

    #[test]
    fn updates_come_only_on_a_change() {
        let mut p = bounded_5s();
        p.on_record(T0 + 10_000, None, T0);
        assert_eq!(p.update(None, T0), up(T0 + 4_999, false));
        assert_eq!(p.update(None, T0 + 1), None);
        assert_eq!(
            p.update(Some(T0 + 9_000), T0 + 2),
            None,
            "a higher hold changes nothing"
        );
        p.on_record(T0 + 1_000, None, T0 + 3);
        assert_eq!(
            p.update(Some(T0 + 9_000), T0 + 3),
            None,
            "an older record changes nothing"
        );
    }

    #[test]
    fn it_never_moves_back() {
        let mut p = bounded_5s();
        p.on_record(T0 + 10_000, None, T0);
        assert_eq!(p.update(None, T0), up(T0 + 4_999, false));
        // A new watch for an old (late) record holds below the published value: kept.
        assert_eq!(p.update(Some(T0 + 1_000), T0 + 1), None);
        assert_eq!(p.published(), Some(T0 + 4_999));
        assert!(
            p.is_late(T0 + 1_000),
            "its outputs below the watermark are late"
        );
        assert!(!p.is_late(T0 + 4_999));
        assert!(p.is_late(T0 + 4_998));
    }

    #[test]
    fn holds_alone_drive_a_partition_under_none() {
        let mut p = partition(WatermarkStrategy::None);
        p.on_record(T0 + 10_000, None, T0);
        assert_eq!(p.update(None, T0), None, "no watermark from records");
        assert_eq!(p.update(Some(T0 + 10_000), T0), up(T0 + 10_000, false));
        assert_eq!(p.update(Some(T0 + 12_000), T0 + 5), up(T0 + 12_000, false));
        // Watches over: no new value, the last one stays; the input is not idle yet.
        assert_eq!(p.update(None, T0 + 6), None);
        assert_eq!(p.published(), Some(T0 + 12_000));
        assert_eq!(p.update(None, T0 + 60_000), up(T0 + 12_000, true));
    }

    #[test]
    fn an_idle_input_stops_constraining_but_live_watches_keep_the_partition_active() {
        let mut p = bounded_5s();
        p.on_record(T0 + 10_000, None, T0);
        assert_eq!(p.update(Some(T0 + 10_000), T0), up(T0 + 4_999, false));
        // The input goes quiet at T0 + 60s: the holds alone decide, and the partition is
        // not idle while a watch lives.
        assert_eq!(p.update(Some(T0 + 10_000), T0 + 59_999), None);
        assert_eq!(
            p.update(Some(T0 + 10_000), T0 + 60_000),
            up(T0 + 10_000, false)
        );
        assert_eq!(
            p.update(Some(T0 + 50_000), T0 + 70_000),
            up(T0 + 50_000, false)
        );
        // The last watch ends: idle at once, keeping its value.
        assert_eq!(p.update(None, T0 + 80_000), up(T0 + 50_000, true));
        assert!(p.is_idle());
        // A record makes it active again at once; its watermark is below the published
        // value, which stays.
        p.on_record(T0 + 20_000, None, T0 + 90_000);
        assert_eq!(p.update(None, T0 + 90_000), up(T0 + 50_000, false));
        // A new watch alone also makes it active.
        assert_eq!(p.update(None, T0 + 150_000), up(T0 + 50_000, true));
        assert_eq!(
            p.update(Some(T0 + 60_000), T0 + 160_000),
            up(T0 + 60_000, false)
        );
    }

    #[test]
    fn a_partition_without_records_holds_back_until_its_input_times_out() {
        let mut p = bounded_5s();
        assert_eq!(p.update(None, T0 + 59_999), None);
        assert_eq!(
            p.update(None, T0 + 60_000),
            Some(Update {
                watermark: None,
                idle: true
            })
        );
        assert!(!p.is_late(Millis::MIN));
    }

    #[test]
    fn a_disabled_input_leaves_only_the_holds() {
        let mut p = PartitionWatermark::new(InputWatermark::disabled());
        p.on_record(T0, None, T0);
        assert_eq!(
            p.update(None, T0),
            Some(Update {
                watermark: None,
                idle: true
            })
        );
        assert_eq!(p.update(Some(T0 + 5), T0), up(T0 + 5, false));
        assert_eq!(p.update(None, T0), up(T0 + 5, true));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Record(i64),
        Hold(Option<i64>),
        Wait(i64),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            (-50_000i64..50_000).prop_map(Step::Record),
            prop::option::of(-50_000i64..50_000).prop_map(Step::Hold),
            (0i64..40_000).prop_map(Step::Wait),
        ];
        prop::collection::vec(step, 0..60)
    }

    fn strategies() -> impl Strategy<Value = WatermarkStrategy> {
        prop_oneof![
            (0u64..10_000).prop_map(|ms| WatermarkStrategy::Bounded(Duration::from_millis(ms))),
            Just(WatermarkStrategy::Monotonic),
            Just(WatermarkStrategy::None),
        ]
    }

    proptest! {
        #[test]
        fn never_decreases_and_follows_the_rules_under_any_steps(
            steps in steps(),
            strategy in strategies(),
            timeout_ms in 1u64..60_000,
        ) {
            let mut p = PartitionWatermark::new(
                InputWatermark::new(strategy, Duration::from_millis(timeout_ms), T0),
            );
            let mut now = T0;
            let mut hold = None;
            let mut last = (None, false);
            for step in steps {
                match step {
                    Step::Record(ts) => p.on_record(T0 + ts, None, now),
                    Step::Hold(h) => hold = h.map(|h| T0 + h),
                    Step::Wait(dt) => now += dt,
                }
                let before = p.published();
                let update = p.update(hold, now);

                // Model: min of the input watermark (unless idle) and the hold, never back.
                let input = p.input().current(now);
                let candidate = match (input, hold) {
                    (Some(w), Some(h)) => Some(w.min(h)),
                    (w, h) => w.or(h),
                };
                let want = before.max(candidate);
                let idle = p.input().is_idle(now) && hold.is_none();
                prop_assert!(p.published() >= before, "moved back: {:?} -> {:?}", before, p.published());
                prop_assert_eq!(p.published(), want);
                prop_assert_eq!(p.is_idle(), idle);

                // Holds constrain: a value that was not past the hold does not pass it.
                if let Some(h) = hold {
                    if before.is_none_or(|b| b <= h) {
                        prop_assert!(p.published().is_some_and(|w| w <= h), "passed the hold {}", h - T0);
                    }
                }
                // So does an input that is not idle.
                if let Some(w) = input {
                    if before.is_none_or(|b| b <= w) {
                        prop_assert!(p.published().is_some_and(|v| v <= w));
                    }
                }
                // An update exactly when something changed, carrying the new state.
                let now_state = (p.published(), p.is_idle());
                match update {
                    Some(u) => {
                        prop_assert_ne!(now_state, last);
                        prop_assert_eq!((u.watermark, u.idle), now_state);
                    }
                    None => prop_assert_eq!(now_state, last),
                }
                last = now_state;
            }
        }
    }

    #[test]
    fn a_recovery_longer_than_the_idle_timeout_does_not_make_the_input_idle() {
        // Created at the assignment (T0); the recovery took two minutes.
        let mut p = bounded_5s();
        p.start_reading(T0 + 120_000);
        assert!(!p.input().is_idle(T0 + 120_000));
        assert_eq!(p.input().idle_at(), Some(T0 + 180_000));
        assert_eq!(
            p.update(Some(T0 + 1_000), T0 + 120_000),
            up(T0 + 1_000, false)
        );
        assert_eq!(p.update(None, T0 + 179_999), None, "still active");
        assert_eq!(p.update(None, T0 + 180_000), up(T0 + 1_000, true));
    }

    #[test]
    fn a_takeover_corrects_a_stale_idle_flag_though_the_value_did_not_change() {
        let mut p = bounded_5s();
        // The topic says: 5 s, idle. The new owner has restored a watch holding at 5 s.
        p.take_over(T0 + 5_000, true);
        assert!(p.is_late(T0 + 4_999), "the floor judges outputs at once");
        assert_eq!(p.update(Some(T0 + 5_000), T0), up(T0 + 5_000, false));
        // The same state as the topic's: nothing to publish.
        let mut q = bounded_5s();
        q.take_over(T0 + 5_000, false);
        assert_eq!(q.update(Some(T0 + 5_000), T0), None);
    }

    #[test]
    fn a_watermark_whose_delivery_failed_is_published_again_unchanged() {
        let mut p = bounded_5s();
        assert_eq!(p.update(Some(T0), T0), up(T0, false));
        assert_eq!(p.update(Some(T0), T0), None);
        p.republish();
        assert_eq!(p.update(Some(T0), T0), up(T0, false));
        assert_eq!(p.update(Some(T0), T0), None);
    }

    #[test]
    fn a_new_owner_never_publishes_below_what_the_previous_owner_did() {
        let input = InputWatermark::new(WatermarkStrategy::Monotonic, Duration::from_secs(30), T0);
        let mut w = PartitionWatermark::new(input);
        w.resume_from(T0 + 5_000);
        w.on_record(T0 + 1_000, None, T0);
        assert_eq!(
            w.update(None, T0),
            None,
            "below the floor: nothing to publish"
        );
        assert!(w.is_late(T0 + 4_999));
        w.on_record(T0 + 9_001, None, T0);
        assert_eq!(
            w.update(None, T0),
            Some(Update {
                watermark: Some(T0 + 9_000),
                idle: false
            })
        );
    }
}

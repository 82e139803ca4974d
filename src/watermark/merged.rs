//! The watermark of all input partitions a bridge instance holds: the minimum over those
//! that are not idle, Flink's `CombinedWatermarkStatus` over per-split outputs.
//!
//! Partitions report their [`super::partition::Update`]s with [`MergedWatermark::set`]. A
//! partition whose state is not yet known is registered with [`MergedWatermark::assign`]
//! as "no watermark, active", which holds the merged value where it is until the partition
//! has a value or goes idle: a partition assigned behind the others must not find the merged
//! watermark already past its records. A revoked partition must be released with
//! [`MergedWatermark::remove`]: it would otherwise hold the merged value forever.
//!
//! The merged value never moves backwards: a partition that becomes active again below it
//! (or is assigned anew) simply does not move it until it catches up.
//!
//! **All partitions idle.** The merged value becomes the maximum over the partitions'
//! watermarks, as Flink does (`StatusWatermarkValve` since FLINK-7728, and the FLIP-27
//! per-split `CombinedWatermarkStatus` since FLINK-38454; before, it only said "idle" and
//! kept its value). The reasons: an idle partition is by definition ignored, so when all
//! are idle none constrains, and downstream windows can close once input stops; and
//! without it the result would depend on the order in which partitions went quiet (the
//! last to go idle wins under "min over active": partition A at 5 then B at 4 gives 5, B
//! first gives 4). Should an idle partition resume below that value, its outputs below it
//! are late — the same risk idleness takes for any partition it lets the others outrun.
//! With no partitions at all (all revoked), there is no new value and the last one stays.

use super::partition::Update;
use crate::clock::Millis;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reported {
    watermark: Option<Millis>,
    idle: bool,
}

#[derive(Debug, Clone, Default)]
pub struct MergedWatermark {
    partitions: BTreeMap<i32, Reported>,
    published: Option<Millis>,
}

impl MergedWatermark {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a partition just assigned, as "no watermark, active" (the state a new
    /// [`super::partition::PartitionWatermark`] starts in). A partition already known keeps
    /// its state. It cannot change the merged value, so there is nothing to return.
    pub fn assign(&mut self, partition: i32) {
        self.partitions.entry(partition).or_insert(Reported {
            watermark: None,
            idle: false,
        });
    }

    /// A partition's state (registering it if unknown). Returns the merged watermark when
    /// it changed.
    pub fn set(&mut self, partition: i32, watermark: Option<Millis>, idle: bool) -> Option<Millis> {
        self.partitions
            .insert(partition, Reported { watermark, idle });
        self.republish()
    }

    /// [`set`](Self::set) from a partition's update.
    pub fn apply(&mut self, partition: i32, update: Update) -> Option<Millis> {
        self.set(partition, update.watermark, update.idle)
    }

    /// Release a revoked partition. Returns the merged watermark when it changed (only ever
    /// upwards: the partition no longer holds it back).
    pub fn remove(&mut self, partition: i32) -> Option<Millis> {
        self.partitions.remove(&partition)?;
        self.republish()
    }

    /// A merged value already published (the last `merged` record on the watermark topic):
    /// never publish below it. Returns the merged watermark when it changed.
    pub fn floor(&mut self, published: Millis) -> Option<Millis> {
        let next = self.published.max(Some(published));
        if next == self.published {
            return None;
        }
        self.published = next;
        next
    }

    /// A partition starts afresh (a run ended there, see `watermark::topic`): back to "no
    /// watermark, active", which holds the merged value where it is until it reports.
    pub fn reset(&mut self, partition: i32) {
        self.partitions.insert(
            partition,
            Reported {
                watermark: None,
                idle: false,
            },
        );
    }

    /// A run ended everywhere (its end-of-time `merged` record): the next run's merged
    /// value starts afresh, below it. The partitions keep what they reported.
    pub fn end_of_run(&mut self) {
        self.published = None;
    }

    /// The merged watermark published so far (`None`: there has not been one yet).
    pub fn current(&self) -> Option<Millis> {
        self.published
    }

    /// Whether the partition is registered.
    pub fn contains(&self, partition: i32) -> bool {
        self.partitions.contains_key(&partition)
    }

    /// Number of partitions registered.
    pub fn len(&self) -> usize {
        self.partitions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// Every partition is idle (vacuously true with none).
    pub fn all_idle(&self) -> bool {
        self.partitions.values().all(|r| r.idle)
    }

    fn republish(&mut self) -> Option<Millis> {
        let next = self.published.max(self.candidate());
        if next == self.published {
            return None;
        }
        self.published = next;
        next
    }

    /// Min over active partitions (`None` if one has no value yet); with none active, max
    /// over all.
    fn candidate(&self) -> Option<Millis> {
        let mut active = self.partitions.values().filter(|r| !r.idle).peekable();
        if active.peek().is_some() {
            // `None < Some`: an active partition without a value holds everything back.
            active.map(|r| r.watermark).min().flatten()
        } else {
            self.partitions.values().filter_map(|r| r.watermark).max()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watermark::generator::InputWatermark;
    use crate::watermark::partition::PartitionWatermark;
    use crate::watermark::strategy::WatermarkStrategy;
    use proptest::prelude::*;
    use std::time::Duration;

    const T0: Millis = 1_700_000_000_000;

    #[test]
    fn the_minimum_over_active_partitions() {
        let mut m = MergedWatermark::new();
        assert_eq!(m.set(0, Some(T0 + 100), false), Some(T0 + 100));
        assert_eq!(m.set(1, Some(T0 + 50), false), None, "never back");
        assert_eq!(m.current(), Some(T0 + 100));
        assert_eq!(
            m.set(0, Some(T0 + 300), false),
            None,
            "partition 1 holds it"
        );
        assert_eq!(m.set(1, Some(T0 + 200), false), Some(T0 + 200));
        assert_eq!(m.set(1, Some(T0 + 400), false), Some(T0 + 300));
        assert_eq!(
            m.set(1, Some(T0 + 400), false),
            None,
            "no change, no update"
        );
    }

    #[test]
    fn idle_partitions_are_ignored_until_they_are_active_again() {
        let mut m = MergedWatermark::new();
        m.set(0, Some(T0 + 100), false);
        m.set(1, Some(T0 + 500), false);
        assert_eq!(m.current(), Some(T0 + 100));
        assert_eq!(m.set(0, Some(T0 + 100), true), Some(T0 + 500));
        assert_eq!(m.set(1, Some(T0 + 700), false), Some(T0 + 700));
        // Back, below the merged value: it stays, and holds further progress.
        assert_eq!(m.set(0, Some(T0 + 150), false), None);
        assert_eq!(m.set(1, Some(T0 + 900), false), None);
        assert_eq!(m.current(), Some(T0 + 700));
        assert_eq!(m.set(0, Some(T0 + 800), false), Some(T0 + 800));
    }

    #[test]
    fn all_idle_gives_the_maximum_whatever_the_order_they_went_idle_in() {
        for order in [[0, 1], [1, 0]] {
            let mut m = MergedWatermark::new();
            m.set(1, Some(T0 + 4), false);
            m.set(0, Some(T0 + 5), false);
            assert_eq!(m.current(), Some(T0 + 4));
            m.set(order[0], Some(T0 + [5, 4][order[0] as usize]), true);
            m.set(order[1], Some(T0 + [5, 4][order[1] as usize]), true);
            assert!(m.all_idle());
            assert_eq!(m.current(), Some(T0 + 5), "order {order:?}");
        }
    }

    #[test]
    fn a_partition_without_a_value_holds_back_until_it_has_one_or_goes_idle() {
        let mut m = MergedWatermark::new();
        m.assign(0);
        m.assign(1);
        assert_eq!(
            m.set(0, Some(T0 + 100), false),
            None,
            "partition 1 is still unknown"
        );
        assert_eq!(m.current(), None);
        assert_eq!(m.set(1, None, true), Some(T0 + 100));
        // `assign` does not reset a known partition.
        m.assign(0);
        assert_eq!(m.set(1, Some(T0 + 500), false), None);
        assert_eq!(m.current(), Some(T0 + 100));
        assert_eq!(m.len(), 2);
        assert!(m.contains(1) && !m.contains(2));
    }

    #[test]
    fn releasing_a_revoked_partition_lets_the_rest_move_on_and_never_moves_back() {
        let mut m = MergedWatermark::new();
        m.assign(2);
        assert_eq!(m.set(0, Some(T0 + 100), false), None);
        assert_eq!(m.set(1, Some(T0 + 300), false), None);
        assert_eq!(m.current(), None, "partition 2 holds it back");
        assert_eq!(m.remove(2), Some(T0 + 100));
        assert_eq!(m.remove(0), Some(T0 + 300));
        assert_eq!(m.remove(7), None, "unknown: nothing happens");
        // With no partition at all the value stays.
        assert_eq!(m.remove(1), None);
        assert!(m.is_empty());
        assert_eq!(m.current(), Some(T0 + 300));
        // A partition assigned anew behind it does not move it back.
        assert_eq!(m.set(0, Some(T0 + 10), false), None);
        assert_eq!(m.current(), Some(T0 + 300));
    }

    #[test]
    fn all_idle_without_any_value_gives_nothing() {
        let mut m = MergedWatermark::new();
        assert_eq!(m.set(0, None, true), None);
        assert_eq!(m.set(1, None, true), None);
        assert_eq!(m.current(), None);
        assert_eq!(
            m.apply(
                1,
                Update {
                    watermark: Some(T0),
                    idle: true
                }
            ),
            Some(T0)
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Assign(i32),
        Set(i32, Option<i64>, bool),
        Remove(i32),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            1 => (0i32..5).prop_map(Op::Assign),
            4 => (0i32..5, prop::option::of(0i64..1_000), any::<bool>())
                .prop_map(|(p, w, i)| Op::Set(p, w, i)),
            1 => (0i32..5).prop_map(Op::Remove),
        ];
        prop::collection::vec(op, 0..50)
    }

    proptest! {
        #[test]
        fn min_over_active_or_max_when_all_idle_and_never_back(ops in ops()) {
            let mut m = MergedWatermark::new();
            let mut model: BTreeMap<i32, (Option<Millis>, bool)> = BTreeMap::new();
            for op in ops {
                let before = m.current();
                let returned = match op {
                    Op::Assign(p) => {
                        model.entry(p).or_insert((None, false));
                        m.assign(p);
                        None
                    }
                    Op::Set(p, w, idle) => {
                        model.insert(p, (w.map(|w| T0 + w), idle));
                        m.set(p, w.map(|w| T0 + w), idle)
                    }
                    Op::Remove(p) => {
                        model.remove(&p);
                        let r = m.remove(p);
                        prop_assert!(m.current() >= before, "releasing moved it back");
                        r
                    }
                };
                let active: Vec<Option<Millis>> =
                    model.values().filter(|(_, idle)| !idle).map(|(w, _)| *w).collect();
                let candidate = if active.is_empty() {
                    model.values().filter_map(|(w, _)| *w).max()
                } else if active.contains(&None) {
                    None
                } else {
                    active.iter().flatten().copied().min()
                };
                prop_assert!(m.current() >= before, "moved back");
                prop_assert_eq!(m.current(), before.max(candidate));
                prop_assert_eq!(returned, (m.current() != before).then_some(m.current()).flatten());
                prop_assert_eq!(m.len(), model.len());
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Record(usize, i64),
        Hold(usize, Option<i64>),
        Wait(i64),
    }

    proptest! {
        /// Partitions feeding the merged value through their updates: while none ever goes
        /// idle, the merged value never passes any partition's, so no output is on time for
        /// its partition yet late for the merged watermark.
        #[test]
        fn fed_by_active_partitions_it_never_passes_any_of_them(
            steps in prop::collection::vec(prop_oneof![
                (0usize..3, -20_000i64..20_000).prop_map(|(p, t)| Step::Record(p, t)),
                (0usize..3, prop::option::of(-20_000i64..20_000)).prop_map(|(p, h)| Step::Hold(p, h)),
                (0i64..10_000).prop_map(Step::Wait),
            ], 0..60),
        ) {
            let mut parts: Vec<PartitionWatermark> = (0..3)
                .map(|_| PartitionWatermark::new(InputWatermark::new(
                    WatermarkStrategy::default(), Duration::MAX, T0)))
                .collect();
            let mut holds = [None; 3];
            let mut m = MergedWatermark::new();
            for p in 0..3 {
                m.assign(p);
            }
            let mut now = T0;
            for step in steps {
                match step {
                    Step::Record(p, t) => parts[p].on_record(T0 + t, None, now),
                    Step::Hold(p, h) => holds[p] = h.map(|h| T0 + h),
                    Step::Wait(dt) => now += dt,
                }
                let before = m.current();
                for (p, part) in parts.iter_mut().enumerate() {
                    if let Some(u) = part.update(holds[p], now) {
                        prop_assert!(!u.idle);
                        m.apply(p as i32, u);
                    }
                }
                prop_assert!(m.current() >= before);
                if let Some(w) = m.current() {
                    for part in &parts {
                        prop_assert!(part.published().is_some_and(|v| v >= w));
                    }
                }
            }
        }
    }
}

//! The watermark of one input partition's records: Flink's per-split watermark generator.
//!
//! One [`InputWatermark`] per input partition is fed every record's timestamp and says how
//! far event time has got on that partition: `bounded(d)` gives the highest timestamp seen
//! minus `d` minus 1 ms (Flink's `BoundedOutOfOrdernessWatermarks`), `monotonic` the highest
//! minus 1 ms (Flink's `AscendingTimestampsWatermarks`, the same with `d = 0`), `none`
//! nothing. The extra millisecond is Flink's convention that a watermark `w` promises no
//! more records at or before `w`; under watchbridge's "late means strictly before the
//! watermark" it is one millisecond more cautious, never less.
//!
//! It also knows when its partition has gone quiet (Flink's `withIdleness`): no record for
//! `idle_timeout`, counted from the last record or, before the first one, from the
//! generator's creation — so a partition that never sees a record does not hold everything
//! back forever. A record makes it active again at once. An idle input stops constraining
//! the watermark ([`InputWatermark::current`] is `None`); whether the *partition* counts as
//! idle is decided with its watches in [`super::partition`].
//!
//! Pure: every question takes `now` (processing time, epoch ms).

use super::strategy::WatermarkStrategy;
use crate::clock::{millis, Millis};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct InputWatermark {
    /// How far the watermark trails the highest timestamp, in ms; `None`: the strategy gives
    /// no watermark.
    lag: Option<Millis>,
    idle_timeout: Millis,
    /// Highest record timestamp seen.
    max_timestamp: Option<Millis>,
    /// Processing time of the latest record, or of creation before any.
    last_activity: Millis,
    /// Nothing is tracked at all (see [`InputWatermark::disabled`]).
    disabled: bool,
}

impl InputWatermark {
    /// A generator for a partition assigned at `now`. It becomes idle after `idle_timeout`
    /// without records (`Duration::MAX`: never).
    pub fn new(strategy: WatermarkStrategy, idle_timeout: Duration, now: Millis) -> Self {
        let lag = match strategy {
            // The bound saturates: a bound of centuries is simply "very far behind".
            WatermarkStrategy::Bounded(bound) => Some(millis(bound).saturating_add(1)),
            WatermarkStrategy::Monotonic => Some(1),
            WatermarkStrategy::None => None,
        };
        Self {
            lag,
            idle_timeout: millis(idle_timeout),
            max_timestamp: None,
            last_activity: now,
            disabled: false,
        }
    }

    /// A generator that tracks nothing, for bounded runs where nobody reads a watermark:
    /// [`on_record`](Self::on_record) does nothing, there is never a value, and the input
    /// counts as idle from the start, so only the watches' holds could move its partition.
    pub fn disabled() -> Self {
        Self {
            lag: None,
            idle_timeout: 0,
            max_timestamp: None,
            last_activity: Millis::MIN,
            disabled: true,
        }
    }

    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// An input record with event time `timestamp`, read at processing time `now`.
    pub fn on_record(&mut self, timestamp: Millis, now: Millis) {
        if self.disabled {
            return;
        }
        self.max_timestamp = Some(self.max_timestamp.map_or(timestamp, |m| m.max(timestamp)));
        // A clock that steps back must not make the partition look quiet for longer.
        self.last_activity = self.last_activity.max(now);
    }

    /// Count `now` as the last activity (not a record): the idle timeout runs from here.
    pub fn activity_at(&mut self, now: Millis) {
        if !self.disabled {
            self.last_activity = self.last_activity.max(now);
        }
    }

    /// The watermark of the records seen so far, whether or not the input is idle.
    pub fn watermark(&self) -> Option<Millis> {
        let lag = self.lag?;
        Some(self.max_timestamp?.saturating_sub(lag))
    }

    /// The watermark as a constraint at `now`: [`watermark`](Self::watermark), unless the
    /// input is idle, when it constrains nothing.
    pub fn current(&self, now: Millis) -> Option<Millis> {
        if self.is_idle(now) {
            None
        } else {
            self.watermark()
        }
    }

    /// No record for `idle_timeout` (since creation, before the first record).
    pub fn is_idle(&self, now: Millis) -> bool {
        self.disabled || now.saturating_sub(self.last_activity) >= self.idle_timeout
    }

    /// When the input turns idle unless a record comes first (`None`: never, or it is
    /// disabled), so a caller can wake up then and publish the change.
    pub fn idle_at(&self) -> Option<Millis> {
        if self.disabled || self.idle_timeout == Millis::MAX {
            return None;
        }
        Some(self.last_activity.saturating_add(self.idle_timeout))
    }

    /// Highest record timestamp seen.
    pub fn max_timestamp(&self) -> Option<Millis> {
        self.max_timestamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: Millis = 1_700_000_000_000;
    const MINUTE: Duration = Duration::from_secs(60);

    fn bounded(secs: u64) -> WatermarkStrategy {
        WatermarkStrategy::Bounded(Duration::from_secs(secs))
    }

    #[test]
    fn bounded_trails_the_highest_timestamp_by_the_bound_and_one_ms() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        assert_eq!(g.watermark(), None);
        assert_eq!(g.current(T0), None);
        g.on_record(T0 + 10_000, T0);
        assert_eq!(g.current(T0), Some(T0 + 4_999));
        // An older record does not move it back.
        g.on_record(T0 + 1_000, T0 + 1);
        assert_eq!(g.current(T0 + 1), Some(T0 + 4_999));
        g.on_record(T0 + 20_000, T0 + 2);
        assert_eq!(g.current(T0 + 2), Some(T0 + 14_999));
        assert_eq!(g.max_timestamp(), Some(T0 + 20_000));

        let mut zero = InputWatermark::new(bounded(0), MINUTE, T0);
        zero.on_record(T0, T0);
        assert_eq!(zero.current(T0), Some(T0 - 1));
    }

    #[test]
    fn monotonic_is_the_highest_timestamp_minus_one_ms_and_none_never_has_a_value() {
        let mut m = InputWatermark::new(WatermarkStrategy::Monotonic, MINUTE, T0);
        m.on_record(T0 + 7, T0);
        m.on_record(T0 + 3, T0);
        assert_eq!(m.current(T0), Some(T0 + 6));

        let mut n = InputWatermark::new(WatermarkStrategy::None, MINUTE, T0);
        n.on_record(T0 + 7, T0);
        assert_eq!((n.watermark(), n.current(T0)), (None, None));
        assert_eq!(n.max_timestamp(), Some(T0 + 7));
        // `none` still knows when its partition goes quiet.
        assert!(!n.is_idle(T0 + 59_999));
        assert!(n.is_idle(T0 + 60_000));
    }

    #[test]
    fn extreme_timestamps_and_bounds_saturate() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        g.on_record(Millis::MIN, T0);
        assert_eq!(g.current(T0), Some(Millis::MIN));
        let mut huge = InputWatermark::new(WatermarkStrategy::Bounded(Duration::MAX), MINUTE, T0);
        huge.on_record(T0, T0);
        assert_eq!(huge.current(T0), Some(T0 - Millis::MAX));
    }

    #[test]
    fn idle_after_the_timeout_without_records_and_active_again_on_a_record() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        g.on_record(T0 + 10_000, T0 + 1_000);
        assert_eq!(g.idle_at(), Some(T0 + 61_000));
        assert!(!g.is_idle(T0 + 60_999));
        assert_eq!(g.current(T0 + 60_999), Some(T0 + 4_999));
        assert!(g.is_idle(T0 + 61_000));
        assert_eq!(
            g.current(T0 + 61_000),
            None,
            "an idle input constrains nothing"
        );
        assert_eq!(g.watermark(), Some(T0 + 4_999), "but keeps its value");

        g.on_record(T0 + 9_000, T0 + 90_000);
        assert!(!g.is_idle(T0 + 90_000));
        assert_eq!(g.current(T0 + 90_000), Some(T0 + 4_999));
        assert_eq!(g.idle_at(), Some(T0 + 150_000));
    }

    #[test]
    fn a_partition_without_records_is_idle_once_the_timeout_passed_since_creation() {
        let g = InputWatermark::new(bounded(5), MINUTE, T0);
        assert!(!g.is_idle(T0));
        assert!(!g.is_idle(T0 + 59_999));
        assert!(g.is_idle(T0 + 60_000));
        assert_eq!(g.idle_at(), Some(T0 + 60_000));

        let never = InputWatermark::new(bounded(5), Duration::MAX, T0);
        assert!(!never.is_idle(Millis::MAX));
        assert_eq!(never.idle_at(), None);
    }

    #[test]
    fn a_clock_stepping_back_does_not_make_the_input_idle_early() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        g.on_record(T0, T0 + 30_000);
        g.on_record(T0, T0 + 10_000);
        assert!(!g.is_idle(T0 + 89_999));
        assert!(g.is_idle(T0 + 90_000));
    }

    #[test]
    fn disabled_tracks_nothing_and_is_idle_from_the_start() {
        let mut g = InputWatermark::disabled();
        g.on_record(T0, T0);
        assert!(g.is_disabled());
        assert_eq!(
            (g.watermark(), g.current(T0), g.max_timestamp()),
            (None, None, None)
        );
        assert!(g.is_idle(T0));
        assert!(g.is_idle(Millis::MIN));
        assert_eq!(g.idle_at(), None);
    }

    /// A record (timestamp offset, processing-time step) or a pure time step.
    fn steps() -> impl Strategy<Value = Vec<(Option<i64>, i64)>> {
        prop::collection::vec(
            (prop::option::of(-100_000i64..100_000), 0i64..90_000),
            0..40,
        )
    }

    proptest! {
        #[test]
        fn idle_exactly_when_no_record_came_within_the_timeout(
            steps in steps(),
            timeout_ms in 0u64..120_000,
            strategy in prop_oneof![
                (0u64..20_000).prop_map(|ms| WatermarkStrategy::Bounded(Duration::from_millis(ms))),
                Just(WatermarkStrategy::Monotonic),
                Just(WatermarkStrategy::None),
            ],
        ) {
            let timeout = timeout_ms as i64;
            let mut g = InputWatermark::new(strategy, Duration::from_millis(timeout_ms), T0);
            let mut now = T0;
            let mut last = T0;
            let mut max: Option<Millis> = None;
            let mut before = None;
            for (record, dt) in steps {
                now += dt;
                if let Some(ts) = record {
                    g.on_record(T0 + ts, now);
                    last = now;
                    max = max.max(Some(T0 + ts));
                    prop_assert!(timeout == 0 || !g.is_idle(now), "a record makes it active at once");
                }
                for probe in [now, now + timeout - 1, now + timeout] {
                    prop_assert_eq!(g.is_idle(probe), probe - last >= timeout, "at {}", probe - T0);
                }
                let lag = match strategy {
                    WatermarkStrategy::Bounded(b) => Some(b.as_millis() as i64 + 1),
                    WatermarkStrategy::Monotonic => Some(1),
                    WatermarkStrategy::None => None,
                };
                let want = lag.and_then(|lag| max.map(|m| m - lag));
                prop_assert_eq!(g.watermark(), want);
                prop_assert!(g.watermark() >= before, "the input watermark never goes back");
                before = g.watermark();
                let idle = g.is_idle(now);
                prop_assert_eq!(g.current(now), if idle { None } else { want });
            }
        }
    }
}

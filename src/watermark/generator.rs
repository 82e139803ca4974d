//! The watermark of one input partition's records: Flink's per-split watermark generator.
//!
//! One [`InputWatermark`] per input partition is fed every record and says how far event
//! time has got on that partition. What the records' times mean for the watermark is its
//! [`WatermarkGenerator`]'s (Flink's interface of that name): it sees each record
//! ([`WatermarkGenerator::on_event`]) and is asked at each update
//! ([`WatermarkGenerator::on_periodic_emit`]), and emits watermarks, or marks its input
//! idle, through a [`WatermarkOutput`]. The built-in strategies are generators:
//! `bounded(d)` ([`BoundedOutOfOrderness`]) gives the highest timestamp seen minus `d`
//! minus 1 ms (Flink's `BoundedOutOfOrdernessWatermarks`), `monotonic` the highest minus
//! 1 ms (Flink's `AscendingTimestampsWatermarks`, the same with `d = 0`), `none`
//! ([`NoWatermarks`]) nothing. The extra millisecond is Flink's convention that a
//! watermark `w` promises no more records at or before `w`; under watchbridge's "late means
//! strictly before the watermark" it is one millisecond more cautious, never less. A
//! generator's watermark never goes back: a lower one than it emitted before is ignored.
//!
//! It also knows when its partition has gone quiet (Flink's `withIdleness`, around every
//! generator): no record for `idle_timeout`, counted from the last record or, before the
//! first one, from the generator's creation — so a partition that never sees a record does
//! not hold everything back forever. A record makes it active again at once. A generator
//! may also mark its input idle itself (a punctuated one told so by its records) until it
//! emits a watermark or marks it active again. An idle input stops constraining the
//! watermark ([`InputWatermark::current`] is `None`); whether the *partition* counts as
//! idle is decided with its watches in [`super::partition`].
//!
//! Pure: every question takes `now` (processing time, epoch ms).

use super::strategy::WatermarkStrategy;
use crate::clock::{millis, Millis};
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// One input record as a [`WatermarkGenerator`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct InputEvent<'a> {
    /// Its event time: the input's time ([`crate::formats`]: the record timestamp, or the
    /// time a timestamp assigner read from the value).
    pub timestamp: Millis,
    /// Its decoded value, if it decoded (a record the bridge dead-letters still moves the
    /// watermark by its record timestamp, with no value).
    pub value: Option<&'a Value>,
}

/// Where a [`WatermarkGenerator`] puts what it decides (Flink's `WatermarkOutput`).
#[derive(Debug, Clone, Default)]
pub struct WatermarkOutput {
    watermark: Option<Millis>,
    idle: bool,
}

impl WatermarkOutput {
    /// No record earlier than `watermark` is expected any more on this input. A value
    /// lower than one emitted before is ignored (the watermark never goes back). Marks the
    /// input active.
    pub fn emit_watermark(&mut self, watermark: Millis) {
        self.watermark = self.watermark.max(Some(watermark));
        self.idle = false;
    }

    /// The input has nothing to say for now: it stops holding the watermark back until
    /// the next [`emit_watermark`](Self::emit_watermark) or
    /// [`mark_active`](Self::mark_active).
    pub fn mark_idle(&mut self) {
        self.idle = true;
    }

    /// The input counts again (after [`mark_idle`](Self::mark_idle)).
    pub fn mark_active(&mut self) {
        self.idle = false;
    }

    /// The highest watermark emitted so far.
    pub fn watermark(&self) -> Option<Millis> {
        self.watermark
    }

    /// Whether the generator marked its input idle.
    pub fn is_idle(&self) -> bool {
        self.idle
    }
}

/// Decides an input partition's watermark from its records (Flink's
/// `WatermarkGenerator`): one per input partition, made when the partition is assigned.
///
/// A periodic generator keeps what it needs in `on_event` and emits in `on_periodic_emit`
/// (called after every record and at every watermark update,
/// `WATCHBRIDGE_WATERMARK_INTERVAL`); a punctuated one emits in `on_event`, when a record
/// says so.
pub trait WatermarkGenerator: Send + 'static {
    /// An input record was read.
    fn on_event(&mut self, event: &InputEvent<'_>, output: &mut WatermarkOutput);
    /// Called after every record and at every watermark update.
    fn on_periodic_emit(&mut self, output: &mut WatermarkOutput);
    /// The watermark of upstream input partition `partition` (`None`: none yet), read
    /// in-band on the repartition topic (`super::upstream`): only the watch side's
    /// generator of a repartitioned bridge is told; an input partition's never is.
    fn on_upstream(
        &mut self,
        _partition: i32,
        _watermark: Option<Millis>,
        _idle: bool,
        _output: &mut WatermarkOutput,
    ) {
    }
}

/// Makes each input partition's [`WatermarkGenerator`] (the part of Flink's
/// `WatermarkStrategy` that makes generators): a built-in [`WatermarkStrategy`], or a
/// function of the partition number.
#[derive(Clone)]
pub struct Generators {
    name: Arc<str>,
    make: Arc<dyn Fn(i32) -> Box<dyn WatermarkGenerator> + Send + Sync>,
}

impl Generators {
    /// Generators of the built-in `strategy`.
    pub fn builtin(strategy: WatermarkStrategy) -> Self {
        Self {
            name: strategy.to_string().into(),
            make: Arc::new(move |_| strategy.generator()),
        }
    }

    /// Generators made by `make` (given the input partition), named `name` in logs.
    pub fn custom<G, F>(name: &str, make: F) -> Self
    where
        G: WatermarkGenerator,
        F: Fn(i32) -> G + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            make: Arc::new(move |partition| Box::new(make(partition))),
        }
    }

    /// The generator of input partition `partition`.
    pub fn make(&self, partition: i32) -> Box<dyn WatermarkGenerator> {
        (self.make)(partition)
    }

    /// What it is called in logs: the strategy's text form, or the custom name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Generators {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Generators").field(&self.name).finish()
    }
}

impl From<WatermarkStrategy> for Generators {
    fn from(strategy: WatermarkStrategy) -> Self {
        Self::builtin(strategy)
    }
}

/// `bounded(d)` and `monotonic` (`d = 0`): the highest timestamp seen, less the bound and
/// 1 ms, emitted periodically.
#[derive(Debug, Clone)]
pub struct BoundedOutOfOrderness {
    /// The bound plus 1 ms.
    lag: Millis,
    max_timestamp: Option<Millis>,
}

impl BoundedOutOfOrderness {
    /// Records arrive at most `bound` out of order.
    pub fn new(bound: Duration) -> Self {
        Self {
            // The bound saturates: a bound of centuries is simply "very far behind".
            lag: millis(bound).saturating_add(1),
            max_timestamp: None,
        }
    }
}

impl WatermarkGenerator for BoundedOutOfOrderness {
    fn on_event(&mut self, event: &InputEvent<'_>, _output: &mut WatermarkOutput) {
        self.max_timestamp = self.max_timestamp.max(Some(event.timestamp));
    }

    fn on_periodic_emit(&mut self, output: &mut WatermarkOutput) {
        if let Some(max) = self.max_timestamp {
            output.emit_watermark(max.saturating_sub(self.lag));
        }
    }
}

/// `none`: the input's records say nothing about event time; only the watches' holds
/// move the partition's watermark.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWatermarks;

impl WatermarkGenerator for NoWatermarks {
    fn on_event(&mut self, _event: &InputEvent<'_>, _output: &mut WatermarkOutput) {}
    fn on_periodic_emit(&mut self, _output: &mut WatermarkOutput) {}
}

impl WatermarkStrategy {
    /// A generator of this strategy, for one input partition.
    pub fn generator(&self) -> Box<dyn WatermarkGenerator> {
        match *self {
            WatermarkStrategy::Bounded(bound) => Box::new(BoundedOutOfOrderness::new(bound)),
            WatermarkStrategy::Monotonic => Box::new(BoundedOutOfOrderness::new(Duration::ZERO)),
            WatermarkStrategy::None => Box::new(NoWatermarks),
        }
    }
}

/// One input partition's watermark: its generator, what it emitted, and the idle timeout
/// around it.
pub struct InputWatermark {
    /// `None`: nothing is tracked at all (see [`InputWatermark::disabled`]).
    generator: Option<Box<dyn WatermarkGenerator>>,
    output: WatermarkOutput,
    idle_timeout: Millis,
    /// Highest record timestamp seen.
    max_timestamp: Option<Millis>,
    /// Processing time of the latest record, or of creation before any.
    last_activity: Millis,
}

impl fmt::Debug for InputWatermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputWatermark")
            .field("output", &self.output)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_timestamp", &self.max_timestamp)
            .field("last_activity", &self.last_activity)
            .field("disabled", &self.generator.is_none())
            .finish()
    }
}

impl InputWatermark {
    /// A generator of the built-in `strategy` for a partition assigned at `now`. It becomes
    /// idle after `idle_timeout` without records (`Duration::MAX`: never).
    pub fn new(strategy: WatermarkStrategy, idle_timeout: Duration, now: Millis) -> Self {
        Self::with_generator(strategy.generator(), idle_timeout, now)
    }

    /// [`InputWatermark::new`] with any generator.
    pub fn with_generator(
        generator: Box<dyn WatermarkGenerator>,
        idle_timeout: Duration,
        now: Millis,
    ) -> Self {
        Self {
            generator: Some(generator),
            output: WatermarkOutput::default(),
            idle_timeout: millis(idle_timeout),
            max_timestamp: None,
            last_activity: now,
        }
    }

    /// A generator that tracks nothing, for bounded runs where nobody reads a watermark:
    /// [`on_record`](Self::on_record) does nothing, there is never a value, and the input
    /// counts as idle from the start, so only the watches' holds could move its partition.
    pub fn disabled() -> Self {
        Self {
            generator: None,
            output: WatermarkOutput::default(),
            idle_timeout: 0,
            max_timestamp: None,
            last_activity: Millis::MIN,
        }
    }

    /// Whether it tracks nothing ([`InputWatermark::disabled`]).
    pub fn is_disabled(&self) -> bool {
        self.generator.is_none()
    }

    /// An input record with event time `timestamp` (its value, if it decoded), read at
    /// processing time `now`.
    pub fn on_record(&mut self, timestamp: Millis, value: Option<&Value>, now: Millis) {
        let Some(generator) = self.generator.as_mut() else {
            return;
        };
        self.max_timestamp = self.max_timestamp.max(Some(timestamp));
        // A clock that steps back must not make the partition look quiet for longer.
        self.last_activity = self.last_activity.max(now);
        generator.on_event(&InputEvent { timestamp, value }, &mut self.output);
        generator.on_periodic_emit(&mut self.output);
    }

    /// Ask the generator for its periodic watermark (at each update of the partition).
    pub fn emit_periodic(&mut self) {
        if let Some(generator) = self.generator.as_mut() {
            generator.on_periodic_emit(&mut self.output);
        }
    }

    /// An upstream partition's in-band watermark (`super::upstream`), read at `now`: the
    /// markers keep the input active while they come.
    pub fn on_upstream(
        &mut self,
        partition: i32,
        watermark: Option<Millis>,
        idle: bool,
        now: Millis,
    ) {
        let Some(generator) = self.generator.as_mut() else {
            return;
        };
        self.last_activity = self.last_activity.max(now);
        generator.on_upstream(partition, watermark, idle, &mut self.output);
        generator.on_periodic_emit(&mut self.output);
    }

    /// Count `now` as the last activity (not a record): the idle timeout runs from here.
    pub fn activity_at(&mut self, now: Millis) {
        if !self.is_disabled() {
            self.last_activity = self.last_activity.max(now);
        }
    }

    /// The watermark of the records seen so far, whether or not the input is idle.
    pub fn watermark(&self) -> Option<Millis> {
        self.output.watermark()
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

    /// No record for `idle_timeout` (since creation, before the first record), or the
    /// generator marked its input idle.
    pub fn is_idle(&self, now: Millis) -> bool {
        self.is_disabled()
            || self.output.is_idle()
            || now.saturating_sub(self.last_activity) >= self.idle_timeout
    }

    /// When the input turns idle unless a record comes first (`None`: never, or it is
    /// disabled), so a caller can wake up then and publish the change.
    pub fn idle_at(&self) -> Option<Millis> {
        if self.is_disabled() || self.idle_timeout == Millis::MAX {
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
        g.on_record(T0 + 10_000, None, T0);
        assert_eq!(g.current(T0), Some(T0 + 4_999));
        // An older record does not move it back.
        g.on_record(T0 + 1_000, None, T0 + 1);
        assert_eq!(g.current(T0 + 1), Some(T0 + 4_999));
        g.on_record(T0 + 20_000, None, T0 + 2);
        assert_eq!(g.current(T0 + 2), Some(T0 + 14_999));
        assert_eq!(g.max_timestamp(), Some(T0 + 20_000));

        let mut zero = InputWatermark::new(bounded(0), MINUTE, T0);
        zero.on_record(T0, None, T0);
        assert_eq!(zero.current(T0), Some(T0 - 1));
    }

    #[test]
    fn monotonic_is_the_highest_timestamp_minus_one_ms_and_none_never_has_a_value() {
        let mut m = InputWatermark::new(WatermarkStrategy::Monotonic, MINUTE, T0);
        m.on_record(T0 + 7, None, T0);
        m.on_record(T0 + 3, None, T0);
        assert_eq!(m.current(T0), Some(T0 + 6));

        let mut n = InputWatermark::new(WatermarkStrategy::None, MINUTE, T0);
        n.on_record(T0 + 7, None, T0);
        assert_eq!((n.watermark(), n.current(T0)), (None, None));
        assert_eq!(n.max_timestamp(), Some(T0 + 7));
        // `none` still knows when its partition goes quiet.
        assert!(!n.is_idle(T0 + 59_999));
        assert!(n.is_idle(T0 + 60_000));
    }

    #[test]
    fn extreme_timestamps_and_bounds_saturate() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        g.on_record(Millis::MIN, None, T0);
        assert_eq!(g.current(T0), Some(Millis::MIN));
        let mut huge = InputWatermark::new(WatermarkStrategy::Bounded(Duration::MAX), MINUTE, T0);
        huge.on_record(T0, None, T0);
        assert_eq!(huge.current(T0), Some(T0 - Millis::MAX));
    }

    #[test]
    fn idle_after_the_timeout_without_records_and_active_again_on_a_record() {
        let mut g = InputWatermark::new(bounded(5), MINUTE, T0);
        g.on_record(T0 + 10_000, None, T0 + 1_000);
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

        g.on_record(T0 + 9_000, None, T0 + 90_000);
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
        g.on_record(T0, None, T0 + 30_000);
        g.on_record(T0, None, T0 + 10_000);
        assert!(!g.is_idle(T0 + 89_999));
        assert!(g.is_idle(T0 + 90_000));
    }

    #[test]
    fn disabled_tracks_nothing_and_is_idle_from_the_start() {
        let mut g = InputWatermark::disabled();
        g.on_record(T0, None, T0);
        assert!(g.is_disabled());
        assert_eq!(
            (g.watermark(), g.current(T0), g.max_timestamp()),
            (None, None, None)
        );
        assert!(g.is_idle(T0));
        assert!(g.is_idle(Millis::MIN));
        assert_eq!(g.idle_at(), None);
    }

    /// Watermarks carried by marker records (`{"watermark": t}`), and `{"idle": true}`.
    struct Punctuated;

    impl WatermarkGenerator for Punctuated {
        fn on_event(&mut self, event: &InputEvent<'_>, output: &mut WatermarkOutput) {
            let value = event.value;
            if let Some(t) = value
                .and_then(|v| v.get("watermark"))
                .and_then(Value::as_i64)
            {
                output.emit_watermark(t);
            }
            if value.and_then(|v| v.get("idle")) == Some(&Value::Bool(true)) {
                output.mark_idle();
            }
        }
        fn on_periodic_emit(&mut self, _output: &mut WatermarkOutput) {}
    }

    #[test]
    fn a_custom_generator_decides_the_value_and_may_mark_its_input_idle() {
        let mut g = InputWatermark::with_generator(Box::new(Punctuated), MINUTE, T0);
        let marker = |t: Millis| serde_json::json!({ "watermark": t });
        g.on_record(T0 + 50, Some(&serde_json::json!({"id": 1})), T0);
        assert_eq!(g.current(T0), None, "an ordinary record says nothing");
        g.on_record(T0, Some(&marker(T0 + 10)), T0 + 1);
        assert_eq!(g.current(T0 + 1), Some(T0 + 10));
        g.on_record(T0, Some(&marker(T0 + 5)), T0 + 2);
        assert_eq!(
            g.current(T0 + 2),
            Some(T0 + 10),
            "a lower one never takes it back"
        );
        g.on_record(T0, Some(&serde_json::json!({"idle": true})), T0 + 3);
        assert!(
            g.is_idle(T0 + 3),
            "idle as the generator says, before the timeout"
        );
        assert_eq!(g.current(T0 + 3), None);
        g.on_record(T0, Some(&marker(T0 + 20)), T0 + 4);
        assert!(!g.is_idle(T0 + 4), "a watermark makes it active again");
        assert_eq!(g.current(T0 + 4), Some(T0 + 20));
        assert_eq!(g.max_timestamp(), Some(T0 + 50));
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
                    g.on_record(T0 + ts, None, now);
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

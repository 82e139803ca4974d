//! Processing time for the engine.
//!
//! Every decision the engine makes about time (is a watch due, has `total(5m)` passed, how
//! late did a poll start) reads one [`Clock`]. The clock is built on tokio's `Instant`, so a
//! test that runs under tokio's paused time (`#[tokio::test(start_paused = true)]`) gets a
//! fully deterministic, virtual clock without any other change; the pure state machines
//! (termination, schedule, dedup) take `now` as an argument and need no clock at all.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Milliseconds since the Unix epoch. Event times, watermarks and processing times all use
/// this unit: it is what Kafka record timestamps carry.
pub type Millis = i64;

/// The event time that ends a run: the watermark of a source whose every watch ended
/// (written as such on the watermark topic, shown as `+Inf` in metrics).
pub const END_OF_TIME: Millis = Millis::MAX;

/// Wall-clock milliseconds, anchored once and then advanced by tokio's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_base: Millis,
    instant_base: Instant,
}

impl Clock {
    /// A clock that starts at the system's wall time now.
    pub fn system() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0);
        Self::starting_at(wall)
    }

    /// A clock whose `now_ms()` is `wall_ms` at this instant (tests pick a fixed start).
    pub fn starting_at(wall_ms: Millis) -> Self {
        Self {
            wall_base: wall_ms,
            instant_base: Instant::now(),
        }
    }

    /// Processing time now, in epoch milliseconds.
    pub fn now_ms(&self) -> Millis {
        self.wall_base + self.instant_base.elapsed().as_millis() as Millis
    }

    /// The tokio instant at which `now_ms()` will read `at` (never before the clock's start).
    pub fn instant_at(&self, at: Millis) -> Instant {
        let offset = at.saturating_sub(self.wall_base).max(0) as u64;
        self.instant_base + Duration::from_millis(offset)
    }
}

/// A duration in whole milliseconds, saturating instead of overflowing.
pub fn millis(d: Duration) -> Millis {
    d.as_millis().min(Millis::MAX as u128) as Millis
}

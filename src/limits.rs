//! Limits shared by every engine of one process: how many polls may be in flight at once,
//! and how often one host may be polled.
//!
//! The per-host limit is a token bucket (governor's GCRA, lock-free, keyed by host). Its clock
//! is tokio's, so under tokio's paused time in tests the bucket refills in virtual time,
//! exactly like the schedule.

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// governor's clock, read from tokio's (virtual under paused time).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> Self::Instant {
        tokio::time::Instant::now().into_std()
    }
}

type HostLimiter = RateLimiter<
    Arc<str>,
    DashMapStateStore<Arc<str>>,
    TokioClock,
    NoOpMiddleware<std::time::Instant>,
>;

/// A per-host rate: `per_second` polls a second on average, bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRate {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

#[derive(Clone)]
pub struct Limits {
    in_flight: Arc<Semaphore>,
    per_host: Option<Arc<HostLimiter>>,
}

impl Limits {
    /// At most `max_in_flight` polls at once across every engine sharing these limits.
    pub fn new(max_in_flight: usize, per_host: Option<HostRate>) -> Self {
        let per_host = per_host.map(|rate| {
            let quota = Quota::per_second(rate.per_second).allow_burst(rate.burst);
            Arc::new(RateLimiter::dashmap_with_clock(quota, TokioClock))
        });
        Self {
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            per_host,
        }
    }

    pub fn in_flight(&self) -> &Arc<Semaphore> {
        &self.in_flight
    }

    /// Take a token for `host`; if there is none, how long until there is one.
    pub fn check_host(&self, host: &Arc<str>) -> Result<(), Duration> {
        match &self.per_host {
            None => Ok(()),
            Some(limiter) => limiter.check_key(host).map_err(|not_until| {
                let earliest = not_until.earliest_possible();
                earliest.duration_since(TokioClock.now())
            }),
        }
    }
}

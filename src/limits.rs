//! Limits shared by every engine of one process: how many polls may be in flight at once,
//! and how often one host may be polled.
//!
//! A poll holds its place under `WATCHBRIDGE_MAX_IN_FLIGHT` (a [`PollSlot`]) from its start
//! until the runtime has handed its new outputs on (to the producer), not only while its
//! request runs: the outputs are views of the poll's response, so the limit bounds the
//! response bytes held (`WATCHBRIDGE_HTTP_MAX_POLL_BYTES` × the limit, as the docs say), and
//! when the bridge cannot hand outputs on as fast as its polls find them (every core busy,
//! the producer's queue full), fewer polls run instead of more responses piling up. With a
//! resource that answers at once, 256 polls in flight whose outputs then waited in the
//! engines' event channels had made a 200,000-output run 10–15% slower than fewer in
//! flight (memory touched anew, 256 connections opened at once); a slow resource still gets
//! every slot, its outputs being handed on long before its next answers come.
//!
//! The per-host limit is a token bucket (governor's GCRA, lock-free, keyed by host). Its clock
//! is tokio's, so under tokio's paused time in tests the bucket refills in virtual time,
//! exactly like the schedule.
//!
//! `WATCHBRIDGE_HOST_RATE` is the rate of the whole group of instances, not of each: an
//! instance polls a host at the rate times the share of the input topic's partitions it owns
//! (each partition task holds a [`PartitionShare`] while it runs), so two instances with half
//! the partitions each keep the host at the rate together, and a rebalance moves the share
//! with the partitions. And when a host says to wait (`Retry-After`, `RateLimit-*`), every
//! watch of this instance polling that host waits ([`Limits::hold_host`]), not only the one
//! that was told.

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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

/// A poll's place under `WATCHBRIDGE_MAX_IN_FLIGHT`, given back when dropped: by the engine
/// when the poll found nothing new, else by the runtime once it has handed the poll's
/// outputs on (the slot travels with them in [`crate::engine::Event::Outputs`]). A runtime
/// that keeps output events stops the engine's polls at the limit.
#[derive(Default)]
pub struct PollSlot(Option<OwnedSemaphorePermit>);

impl PollSlot {
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        Self(Some(permit))
    }
}

/// A copy of an event holds no place: the slot stays with the original.
impl Clone for PollSlot {
    fn clone(&self) -> Self {
        Self(None)
    }
}

/// Events compare by what they say; which slot they hold is not part of it.
impl PartialEq for PollSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PollSlot {}

impl std::fmt::Debug for PollSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PollSlot"
        } else {
            "PollSlot(none)"
        })
    }
}

#[derive(Clone)]
pub struct Limits {
    in_flight: Arc<Semaphore>,
    per_host: Option<Arc<HostLimits>>,
    holds: Arc<Holds>,
}

/// Hosts that said to wait, until when. Every poll of a rate-keyed poller asks; almost
/// always none is held, which `any` says without taking the lock all engines share.
#[derive(Default)]
struct Holds {
    any: AtomicBool,
    until: Mutex<HashMap<Arc<str>, Instant>>,
}

/// The per-host rate of the group, and this instance's share of it.
struct HostLimits {
    group: HostRate,
    /// Partitions of the input topic (0: not known yet, the whole rate is this instance's).
    partitions: AtomicU32,
    /// Partitions this instance owns.
    owned: AtomicU32,
    /// Rebuilt when the share changes (a bucket's quota cannot change): the buckets start
    /// full again, so a rebalance may let one burst through.
    limiter: RwLock<HostLimiter>,
}

impl HostLimits {
    /// This instance's quota: the group's rate times owned/partitions, in whole tokens per
    /// period (a share of 10/s over 3 of 4 partitions is one token every 133 ms, bursts of 7).
    fn quota(&self) -> Quota {
        let rate = self.group.per_second.get() as f64;
        let burst = self.group.burst.get() as f64;
        let (partitions, owned) = (
            self.partitions.load(Ordering::Relaxed),
            self.owned.load(Ordering::Relaxed),
        );
        let share = if partitions == 0 || owned == 0 || owned >= partitions {
            1.0
        } else {
            owned as f64 / partitions as f64
        };
        let period = Duration::from_secs_f64(1.0 / (rate * share));
        let burst = NonZeroU32::new((burst * share).floor() as u32).unwrap_or(NonZeroU32::MIN);
        Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(self.group.per_second))
            .allow_burst(burst)
    }

    fn rebuild(&self) {
        let limiter = RateLimiter::dashmap_with_clock(self.quota(), TokioClock);
        *self.limiter.write().unwrap_or_else(|p| p.into_inner()) = limiter;
    }
}

/// An input partition this instance owns, for as long as it lives: its share of
/// `WATCHBRIDGE_HOST_RATE` is this instance's until it is dropped.
pub struct PartitionShare {
    host: Option<Arc<HostLimits>>,
}

impl Drop for PartitionShare {
    fn drop(&mut self) {
        if let Some(host) = &self.host {
            host.owned.fetch_sub(1, Ordering::Relaxed);
            host.rebuild();
        }
    }
}

impl Limits {
    /// At most `max_in_flight` polls at once across every engine sharing these limits (a
    /// poll counting until its outputs are handed on: [`PollSlot`]).
    pub fn new(max_in_flight: usize, per_host: Option<HostRate>) -> Self {
        let per_host = per_host.map(|group| {
            // The whole rate until the partitions are known (`HostLimits::quota`).
            Arc::new(HostLimits {
                group,
                partitions: AtomicU32::new(0),
                owned: AtomicU32::new(0),
                limiter: RwLock::new(RateLimiter::dashmap_with_clock(
                    Quota::per_second(group.per_second).allow_burst(group.burst),
                    TokioClock,
                )),
            })
        });
        Self {
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            per_host,
            holds: Arc::default(),
        }
    }

    pub fn in_flight(&self) -> &Arc<Semaphore> {
        &self.in_flight
    }

    /// The input topic has `partitions` partitions: from now on this instance's rate per
    /// host is the share of them it owns.
    pub fn share_among(&self, partitions: u32) {
        if let Some(host) = &self.per_host {
            host.partitions.store(partitions, Ordering::Relaxed);
            host.rebuild();
        }
    }

    /// This instance now owns one more input partition, until the share is dropped.
    pub fn own_partition(&self) -> PartitionShare {
        if let Some(host) = &self.per_host {
            host.owned.fetch_add(1, Ordering::Relaxed);
            host.rebuild();
        }
        PartitionShare {
            host: self.per_host.clone(),
        }
    }

    /// `host` said to wait `wait` (a `Retry-After`, a `RateLimit-Reset`): no watch of this
    /// instance polls it before then.
    pub fn hold_host(&self, host: &Arc<str>, wait: Duration) {
        let until = Instant::now() + wait;
        let mut holds = self.holds.until.lock().unwrap_or_else(|p| p.into_inner());
        holds.retain(|_, at| *at > Instant::now());
        let at = holds.entry(host.clone()).or_insert(until);
        *at = (*at).max(until);
        self.holds.any.store(true, Ordering::Relaxed);
    }

    /// Take a token for `host`; if there is none, or the host said to wait, how long until
    /// it may be polled.
    pub fn check_host(&self, host: &Arc<str>) -> Result<(), Duration> {
        if self.holds.any.load(Ordering::Relaxed) {
            let mut holds = self.holds.until.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            holds.retain(|_, at| *at > now);
            self.holds.any.store(!holds.is_empty(), Ordering::Relaxed);
            if let Some(until) = holds.get(host) {
                return Err(*until - now);
            }
        }
        match &self.per_host {
            None => Ok(()),
            Some(limits) => {
                let limiter = limits.limiter.read().unwrap_or_else(|p| p.into_inner());
                limiter.check_key(host).map_err(|not_until| {
                    let earliest = not_until.earliest_possible();
                    earliest.duration_since(TokioClock.now())
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(n: u32) -> Option<HostRate> {
        let n = NonZeroU32::new(n).unwrap();
        Some(HostRate {
            per_second: n,
            burst: n,
        })
    }

    /// Tokens taken one after the other until the bucket says no.
    fn burst(limits: &Limits, host: &Arc<str>) -> usize {
        (0..100)
            .take_while(|_| limits.check_host(host).is_ok())
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_polls_at_the_share_of_the_partitions_it_owns() {
        let host: Arc<str> = "api.example".into();
        let limits = Limits::new(10, rate(10));
        assert_eq!(
            burst(&limits, &host),
            10,
            "partitions not known: the whole rate"
        );

        limits.share_among(4);
        let shares: Vec<_> = (0..3).map(|_| limits.own_partition()).collect();
        assert_eq!(burst(&limits, &host), 7, "3 of 4 partitions: 7.5/s");
        let wait = limits.check_host(&host).unwrap_err();
        assert!(
            (Duration::from_millis(120)..=Duration::from_millis(134)).contains(&wait),
            "{wait:?}"
        );

        drop(shares);
        let _one = limits.own_partition();
        assert_eq!(burst(&limits, &host), 2, "1 of 4: 2.5/s");
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(limits.check_host(&host).is_ok());
        assert!(limits.check_host(&host).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_that_said_wait_is_held_until_then_and_others_are_not() {
        let (a, b): (Arc<str>, Arc<str>) = ("a.example".into(), "b.example".into());
        let limits = Limits::new(10, None);
        limits.hold_host(&a, Duration::from_secs(3));
        limits.hold_host(&a, Duration::from_secs(1)); // a shorter wait does not cut it
        assert_eq!(limits.check_host(&a), Err(Duration::from_secs(3)));
        assert_eq!(limits.check_host(&b), Ok(()));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(limits.check_host(&a), Ok(()));
    }
}

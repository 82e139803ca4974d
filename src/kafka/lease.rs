//! Whether this instance may still write for the partitions it was assigned: the guard
//! against writing as a zombie without transactions.
//!
//! An instance that stalls (SIGSTOP, a frozen VM, a long pause) past its group session
//! timeout loses its partitions to another instance while it cannot tell. When it runs
//! again, its partition tasks would go on where they were — emit outputs, write
//! checkpoints — on top of what the new owner wrote, until librdkafka hears from the group
//! that the assignment is lost. The lease closes most of that gap:
//!
//! - a keeper thread ticks every `TICK`; a gap between two ticks longer than `stall`
//!   (half the session timeout) means the whole process stood still long enough to have
//!   lost the session, and the lease becomes *suspect*;
//! - a task writes only while the lease is fresh (ticked within `stall`) and not suspect,
//!   so after a stall no task writes before the keeper has even run again;
//! - a suspect lease is confirmed by the consumer thread once librdkafka has had time to
//!   hear from the group (two heartbeat intervals) without reporting the assignment lost,
//!   or by a rebalance that is not a loss; a lost assignment stops the tasks without
//!   letting them write anything (`Partitions::stop` with `lost`).
//!
//! What is left (docs/architecture.md, "What a crash does"): records already handed to
//! librdkafka when the stall began are sent when it ends, and a write between a task's
//! check and its hand-over to librdkafka when the stall hits exactly there.

use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the keeper ticks.
const TICK: Duration = Duration::from_millis(100);

pub struct Lease {
    /// [`coarse_ms`] when the lease started.
    origin: u64,
    /// Milliseconds since `origin` of the keeper's last tick.
    last_tick: AtomicU64,
    /// Milliseconds since `origin` plus one when the lease became suspect; 0: not suspect.
    suspect_since: AtomicU64,
    stall: Duration,
    confirm: Duration,
    metrics: Arc<Metrics>,
}

impl Lease {
    /// A lease for a member with these group timeouts, with its keeper thread running (it
    /// ends when the lease is dropped).
    pub fn start(
        session_timeout: Duration,
        heartbeat_interval: Duration,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let lease = Arc::new(Self {
            origin: coarse_ms(),
            last_tick: AtomicU64::new(0),
            suspect_since: AtomicU64::new(0),
            stall: session_timeout / 2,
            confirm: heartbeat_interval.max(Duration::from_millis(500)) * 2,
            metrics,
        });
        let keeper = Arc::downgrade(&lease);
        let _ = std::thread::Builder::new()
            .name("watchbridge-lease".into())
            .spawn(move || keep(keeper));
        lease
    }

    fn now_ms(&self) -> u64 {
        coarse_ms().saturating_sub(self.origin)
    }

    /// Whether a partition task may write now.
    pub fn may_write(&self) -> bool {
        let since_tick = self
            .now_ms()
            .saturating_sub(self.last_tick.load(Ordering::SeqCst));
        self.suspect_since.load(Ordering::SeqCst) == 0
            && Duration::from_millis(since_tick) < self.stall
    }

    fn tick(&self) {
        let now = self.now_ms();
        let last = self.last_tick.swap(now, Ordering::SeqCst);
        let gap = Duration::from_millis(now.saturating_sub(last));
        if gap >= self.stall
            && self
                .suspect_since
                .compare_exchange(0, now + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            crate::internal_events::InstanceStalled { stalled: gap }.emit(&self.metrics);
        }
    }

    /// From the consumer thread: after a stall, confirm membership once librdkafka has had
    /// time to hear from the group and has not reported the assignment `lost`.
    pub fn confirm_unless_lost(&self, lost: bool) {
        let since = self.suspect_since.load(Ordering::SeqCst);
        if since == 0 || lost {
            return;
        }
        let suspect_for = Duration::from_millis(self.now_ms().saturating_sub(since - 1));
        if suspect_for >= self.confirm {
            self.confirmed();
        }
    }

    /// How long librdkafka takes to hear from the group (two heartbeat intervals): a
    /// membership not reported lost by then is the group's word that it holds.
    pub fn confirm_window(&self) -> Duration {
        self.confirm
    }

    /// The group answered as to a member (a rebalance that is not a loss).
    pub fn confirmed(&self) {
        if self.suspect_since.swap(0, Ordering::SeqCst) != 0 {
            tracing::info!("still a member of the group after the stall; partitions write again");
        }
    }
}

/// Milliseconds on the monotonic clock, read coarsely: `may_write` reads it for every record
/// a task hands to the producer, and the precise clock (`Instant::now`) cost ~1% of the
/// bridge's CPU there; the coarse one is a read of the kernel's last tick (a few ms apart),
/// far finer than the stall it looks for (half the session timeout).
#[cfg(target_os = "linux")]
fn coarse_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Cannot fail for this clock on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

#[cfg(not(target_os = "linux"))]
fn coarse_ms() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn keep(lease: Weak<Lease>) {
    while let Some(lease) = lease.upgrade() {
        lease.tick();
        drop(lease);
        std::thread::sleep(TICK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_past_half_the_session_stops_writes_until_membership_is_confirmed() {
        let metrics = Arc::new(Metrics::new());
        let lease = Lease::start(
            Duration::from_millis(400),
            Duration::from_millis(100),
            metrics.clone(),
        );
        std::thread::sleep(Duration::from_millis(350));
        assert!(lease.may_write(), "fresh");
        // The keeper stands still (as when the process is stopped): no tick for 300 ms.
        lease
            .last_tick
            .store(lease.now_ms() - 300, Ordering::SeqCst);
        assert!(!lease.may_write(), "stale before the keeper runs again");
        std::thread::sleep(Duration::from_millis(150));
        assert!(!lease.may_write(), "suspect once the keeper saw the gap");
        lease.confirm_unless_lost(false);
        assert!(!lease.may_write(), "not confirmed before two heartbeats");
        std::thread::sleep(Duration::from_millis(1100));
        lease.confirm_unless_lost(true);
        assert!(!lease.may_write(), "a lost assignment confirms nothing");
        lease.confirm_unless_lost(false);
        assert!(lease.may_write(), "confirmed");
        assert_eq!(metrics.instance_stalls.get(), 1);
    }
}

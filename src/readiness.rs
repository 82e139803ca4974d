//! Whether this instance is doing its share of the work (`/readyz`, `watchbridge_ready`).
//!
//! **Ready** = the start has reached the brokers, the consumer has received its first
//! assignment from the group, no assigned partition is still restoring its state, nothing
//! waits to read the watermark topic past a previous owner's last value, and the bridge is
//! not stopping. A partition whose recovery waits for a topic partition it cannot read
//! (offline, no leader) is named, with what it waits for. A bounded run
//! (`WATCHBRIDGE_MODE=bounded`) assigns itself every partition; the same rule applies.
//!
//! An assignment may be empty: an instance with no partitions (more instances than input
//! partitions) is ready. It is a healthy standby that takes partitions over at the next
//! rebalance; failing its probe would only get it restarted, or hold a rollout, for nothing.
//!
//! Derived rather than tracked twice: the partitions still restoring are the gauge
//! `watchbridge_partitions_recovering`, which the recovery events keep (it goes up when a
//! partition is assigned, inside the rebalance callback, so there is no moment between
//! assignment and recovery in which the instance looks ready). This adds only the two facts
//! no metric has, as atomics: checking costs three atomic loads.

use crate::internal_events::ReadinessChanged;
use crate::metrics::Metrics;
pub use crate::not_ready::{NotReady, WatermarkWaiter};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Debug)]
pub struct Readiness {
    /// While the start waits for the brokers: their bootstrap servers.
    waiting_for: Mutex<Option<std::sync::Arc<str>>>,
    assigned: AtomicBool,
    /// Waits for the watermark topic's reader (`kafka::merged::ReadBackWait`).
    reading_watermarks: Mutex<BTreeSet<WatermarkWaiter>>,
    /// Input partitions whose recovery waits for something it cannot read, and what.
    recovery_waits: Mutex<BTreeMap<i32, String>>,
    /// The input consumer's error, while it has not read since.
    consumer_error: Mutex<Option<String>>,
    /// Why `WATCHBRIDGE_GUARANTEE=auto` fell back to `recovery`, if it did: said beside
    /// "ready" (it is no reason not to be).
    guarantee_fallback: Mutex<Option<String>>,
    /// Running on the embedded broker (`WATCHBRIDGE_BROKERS=embedded`): said beside "ready"
    /// too, so a probe or a person reading it cannot take it for a real cluster.
    embedded_broker: AtomicBool,
    stopping: AtomicBool,
    /// The last state reported through [`ReadinessChanged`] (`true`: ready); the lock also
    /// keeps two reporters from logging the same change twice or out of order.
    reported: Mutex<bool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Not ready: nothing assigned yet.
    pub fn new() -> Self {
        Self {
            waiting_for: Mutex::new(None),
            assigned: AtomicBool::new(false),
            reading_watermarks: Mutex::new(BTreeSet::new()),
            recovery_waits: Mutex::new(BTreeMap::new()),
            consumer_error: Mutex::new(None),
            guarantee_fallback: Mutex::new(None),
            embedded_broker: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            reported: Mutex::new(false),
        }
    }

    /// The start waits for `brokers` to answer (`None`: they did).
    pub fn waiting_for_brokers(&self, brokers: Option<&str>, m: &Metrics) {
        *self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) = brokers.map(Into::into);
        let _ = self.refresh(m);
    }

    /// The consumer received an assignment (possibly empty). Call after the assigned
    /// partitions were counted as recovering.
    pub fn assignment_received(&self, m: &Metrics) {
        self.assigned.store(true, Ordering::SeqCst);
        let _ = self.refresh(m);
    }

    /// `waiter` waits (or no longer waits) for the watermark topic's reader to pass its
    /// previous owner's records.
    pub fn reading_watermarks(&self, waiter: WatermarkWaiter, waiting: bool, m: &Metrics) {
        {
            let mut waiters = self
                .reading_watermarks
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if waiting {
                waiters.insert(waiter);
            } else {
                waiters.remove(&waiter);
            }
        }
        let _ = self.refresh(m);
    }

    /// Input partition `partition`'s recovery waits to read `what` (`None`: no longer).
    pub fn recovery_waits(&self, partition: i32, what: Option<&str>, m: &Metrics) {
        {
            let mut waits = self
                .recovery_waits
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match what {
                Some(what) => waits.insert(partition, what.to_string()),
                None => waits.remove(&partition),
            };
        }
        let _ = self.refresh(m);
    }

    /// The input consumer failed with `error` (`None`: it reads again).
    pub fn consumer_failing(&self, error: Option<&str>, m: &Metrics) {
        *self
            .consumer_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = error.map(str::to_string);
        let _ = self.refresh(m);
    }

    /// `auto` fell back to `recovery`, for this reason.
    pub fn guarantee_fell_back(&self, why: &str) {
        *self
            .guarantee_fallback
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }

    /// The bridge runs on the embedded broker.
    pub fn on_embedded_broker(&self) {
        self.embedded_broker.store(true, Ordering::SeqCst);
    }

    /// What `/readyz` adds to "ready", a line each: that the broker is the embedded one,
    /// `auto`'s fallback; `None` when neither.
    pub fn note(&self) -> Option<String> {
        let embedded = self.embedded_broker.load(Ordering::SeqCst).then(|| {
            "broker: embedded (WATCHBRIDGE_BROKERS=embedded): in memory, it keeps nothing"
                .to_string()
        });
        let fallback = self
            .guarantee_fallback
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|why| {
                format!("guarantee: recovery (WATCHBRIDGE_GUARANTEE=auto fell back: {why})")
            });
        let lines: Vec<String> = embedded.into_iter().chain(fallback).collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    }

    /// The bridge is stopping: not ready again, whatever else holds.
    pub fn stopping(&self, m: &Metrics) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.refresh(m);
    }

    /// Ready, or why not.
    pub fn check(&self, m: &Metrics) -> Result<(), NotReady> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(NotReady::Stopping);
        }
        if let Some(brokers) = &*self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(NotReady::WaitingForBrokers(brokers.clone()));
        }
        if !self.assigned.load(Ordering::SeqCst) {
            return Err(NotReady::NoAssignment);
        }
        // Before `Recovering`: a partition waiting for a topic is still restoring, and
        // these say what for.
        {
            let waits = self
                .recovery_waits
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !waits.is_empty() {
                let waits = waits.iter().map(|(p, what)| (*p, what.clone())).collect();
                return Err(NotReady::RecoveryWaiting(waits));
            }
        }
        if let Some(error) = &*self
            .consumer_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
        {
            return Err(NotReady::ConsumerFailing(error.clone()));
        }
        {
            let waiters = self
                .reading_watermarks
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !waiters.is_empty() {
                return Err(NotReady::ReadingWatermarks(
                    waiters.iter().copied().collect(),
                ));
            }
        }
        match m.partitions_recovering.get() {
            n if n > 0 => Err(NotReady::Recovering(n)),
            _ => Ok(()),
        }
    }

    /// Check, and report a change (log line and `watchbridge_ready`). Called wherever an
    /// input of the rule changes, and on every probe and scrape.
    pub fn refresh(&self, m: &Metrics) -> Result<(), NotReady> {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.check(m);
        if now.is_ok() != *reported {
            *reported = now.is_ok();
            ReadinessChanged {
                not_ready: now.clone().err(),
            }
            .emit(m);
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_assigned_and_restored_until_stopping() {
        let m = Metrics::new();
        let r = Readiness::new();
        assert_eq!(r.refresh(&m), Err(NotReady::NoAssignment));
        // Two partitions assigned: counted as recovering before the assignment is reported.
        m.partitions_recovering.add(2);
        r.assignment_received(&m);
        assert_eq!(r.check(&m), Err(NotReady::Recovering(2)));
        assert_eq!(m.ready.get(), 0);
        m.partitions_recovering.dec();
        assert_eq!(r.refresh(&m), Err(NotReady::Recovering(1)));
        m.partitions_recovering.dec();
        assert_eq!(r.refresh(&m), Ok(()));
        assert_eq!(m.ready.get(), 1);
        // A rebalance brings one more partition: not ready while it restores.
        m.partitions_recovering.inc();
        assert_eq!(r.refresh(&m), Err(NotReady::Recovering(1)));
        assert_eq!(m.ready.get(), 0);
        m.partitions_recovering.dec();
        assert_eq!(r.refresh(&m), Ok(()));
        r.stopping(&m);
        assert_eq!(r.check(&m), Err(NotReady::Stopping));
        assert_eq!(m.ready.get(), 0);
    }

    #[test]
    fn an_empty_assignment_is_ready() {
        let m = Metrics::new();
        let r = Readiness::new();
        r.assignment_received(&m);
        assert_eq!(r.check(&m), Ok(()));
        assert_eq!(m.ready.get(), 1);
    }

    #[test]
    fn not_ready_while_the_start_waits_for_the_brokers() {
        let m = Metrics::new();
        let r = Readiness::new();
        r.waiting_for_brokers(Some("k1:9092,k2:9092"), &m);
        assert_eq!(
            r.check(&m),
            Err(NotReady::WaitingForBrokers("k1:9092,k2:9092".into()))
        );
        assert_eq!(
            r.check(&m).unwrap_err().to_string(),
            "waiting for the brokers at k1:9092,k2:9092 to answer"
        );
        r.waiting_for_brokers(None, &m);
        assert_eq!(r.check(&m), Err(NotReady::NoAssignment));
    }

    #[test]
    fn not_ready_while_waiting_for_the_watermark_topic() {
        let m = Metrics::new();
        let r = Readiness::new();
        r.assignment_received(&m);
        r.reading_watermarks(WatermarkWaiter::Merged, true, &m);
        r.reading_watermarks(WatermarkWaiter::Partition(3), true, &m);
        assert_eq!(
            r.check(&m).unwrap_err().to_string(),
            "waiting to read the watermark topic past the previous owner's last value of input \
             partition 3, the merged watermark (a transaction open on it ends within its timeout)"
        );
        assert_eq!(m.ready.get(), 0);
        r.reading_watermarks(WatermarkWaiter::Partition(3), false, &m);
        r.reading_watermarks(WatermarkWaiter::Merged, false, &m);
        assert_eq!(r.check(&m), Ok(()));
        assert_eq!(m.ready.get(), 1);
    }

    #[test]
    fn not_ready_while_a_recovery_waits_and_the_reason_names_it() {
        let m = Metrics::new();
        let r = Readiness::new();
        m.partitions_recovering.add(2);
        r.assignment_received(&m);
        r.recovery_waits(3, Some("out/3 (Local: Timed out)"), &m);
        r.recovery_waits(1, Some("st/1 (Broker: Leader not available)"), &m);
        assert_eq!(
            r.check(&m).unwrap_err().to_string(),
            "input partition 1 cannot be restored: waiting to read st/1 (Broker: Leader not \
             available); input partition 3 cannot be restored: waiting to read out/3 (Local: \
             Timed out)"
        );
        r.recovery_waits(1, None, &m);
        m.partitions_recovering.dec();
        assert!(r
            .check(&m)
            .unwrap_err()
            .to_string()
            .starts_with("input partition 3"));
        r.recovery_waits(3, None, &m);
        assert_eq!(r.check(&m), Err(NotReady::Recovering(1)));
        m.partitions_recovering.dec();
        assert_eq!(r.refresh(&m), Ok(()));
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(
            NotReady::Recovering(3).to_string(),
            "3 partition(s) restoring their state"
        );
        assert_eq!(
            NotReady::NoAssignment.to_string(),
            "waiting for the consumer group's assignment"
        );
    }

    /// What `/readyz` says beside "ready": a line for the embedded broker, one for `auto`'s
    /// fallback, in that order; nothing without either.
    #[test]
    fn the_note_says_embedded_and_the_fallback_a_line_each() {
        let r = Readiness::new();
        assert_eq!(r.note(), None);
        r.on_embedded_broker();
        assert_eq!(
            r.note().as_deref(),
            Some("broker: embedded (WATCHBRIDGE_BROKERS=embedded): in memory, it keeps nothing")
        );
        r.guarantee_fell_back("no EndTxn");
        assert_eq!(
            r.note().unwrap().lines().collect::<Vec<_>>(),
            [
                "broker: embedded (WATCHBRIDGE_BROKERS=embedded): in memory, it keeps nothing",
                "guarantee: recovery (WATCHBRIDGE_GUARANTEE=auto fell back: no EndTxn)"
            ]
        );
    }
}

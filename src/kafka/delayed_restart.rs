//! Partitions whose restart waits: one whose transactional producer was fenced (issue 46,
//! case 2), and one whose delivery failed on a replicated cluster (case 4).
//!
//! **Fenced.** The broker fences a `transactional.id` in two cases that look the same to
//! the producer (a fatal `PRODUCER_FENCED` / `INVALID_PRODUCER_EPOCH`): the partition's
//! next owner called `init_transactions` with it (a real fencing: this instance is a
//! zombie), or the transaction coordinator aborted a transaction that outlived
//! `transaction.timeout.ms` and bumped the epoch (a stall of this instance — a GC pause, a
//! frozen VM — or a commit that waited long). After the second, the partition is still
//! this instance's, and left without a task nothing would poll or commit it while the group
//! went on assigning it here. So a fenced partition waits: long enough for librdkafka to
//! hear from the group (two heartbeat intervals, the lease's confirmation window,
//! `kafka::lease`) and at least a backoff that doubles with each fencing in a row. A zombie
//! learns meanwhile that its assignment is lost (or gets the partition revoked), and the
//! wait is dropped. A partition still assigned when its wait is over starts again from its
//! last commit with a new producer, which fences nothing but this instance's own dead one.
//! Should a real fencing ever pass the wait, the two owners' producers fence each other at
//! most once per backoff step until the group settles it.
//!
//! **A failed delivery** (`recovery`, `at_least_once`): the record may be on the topic
//! after all, and the partition starts again, reading its outputs back to learn which. On
//! a replicated cluster "may be" lasts: a record the leader appended stays above the high
//! watermark — invisible to the read-back — until the followers have it or drop out of the
//! in-sync set (`replica.lag.time.max.ms`), and a leader that was paused appends a request
//! it got before the pause when it runs again, up to `broker.session.timeout.ms` later
//! (after that the controller has fenced it, and what it appends is truncated). A read-back
//! before both have passed misses a record that commits afterwards, and its output is
//! emitted again: a duplicate. So the partition waits out that window
//! ([`DeliveryWindow`]) after the failure before it starts again.
//!
//! **Records still in flight when the partition goes.** The window does not end when the
//! partition leaves this instance: records handed to librdkafka before a lost assignment,
//! or a failed delivery whose wait the loss cut short, may still commit. So the instance
//! keeps, per partition, until when its records may land (`settling`), and a partition the
//! group assigns to it again before then waits out the rest (seen on three nodes: a
//! delivery failed, the assignment was lost 10 s later and came back 5 s after that; the
//! read-back missed the record that committed later, and its output came twice). Another
//! instance's records are out of sight: a partition whose owner died with deliveries in
//! flight is assigned elsewhere a session timeout after the owner's last heartbeat, and its
//! records may commit up to the window after the death. So every partition the group
//! assigns waits the window less that (`DeliveryWindow::takeover`): 2 s with Kafka's and
//! librdkafka's defaults (a 44 s window, a 45 s session, 3 s heartbeats), none with a
//! session of 47 s or more, 8 s in the chaos test on the test cluster (a 13 s window, a 6 s
//! session, 1 s heartbeats).
//!
//! **Refused** (an ACL missing, `kafka::refusal`): nothing passes by waiting a moment, so the
//! partition waits a backoff (1 s doubling to a minute) before it tries again, its input not
//! committed and nothing dead-lettered; `/readyz` says why meanwhile.
//!
//! **Newer state** (a state record of a newer format version than this build reads,
//! `state::versions`): the partition started nothing and wrote nothing; it waits the same
//! backoff before it reads its state again, so that a roll forward (or the rest of a rolling
//! upgrade, which moves the partition to an instance that reads it) is taken up within a
//! minute, and a rollback that lasts costs one read of the state partition a minute.
//!
//! A waiting partition is paused (nothing it fetched meanwhile would be used) and does not
//! restart once the group has taken it away.

use super::client::BrokerSettings;
use super::partition::Bounds;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The longest wait between a fencing and the partition's restart.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// An abort this soon after the previous one of the partition is one in a row.
const ABORTS_IN_A_ROW: Duration = Duration::from_secs(10);

/// A fencing this long after the previous one of the partition starts the backoff over.
const QUIET: Duration = Duration::from_secs(300);

/// A partition waiting to be restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub due: Instant,
    /// The input position of its last committed transaction (else the group's).
    pub position: Option<i64>,
    pub bounds: Option<Bounds>,
}

/// The partitions of one instance waiting to restart, and how often each was fenced
/// lately.
#[derive(Debug, Default)]
pub struct DelayedRestarts {
    waiting: HashMap<i32, Waiting>,
    /// Per partition: fencings (or refusals) in a row, and when the last was.
    history: HashMap<i32, (u32, Instant)>,
    /// Per partition: transaction aborts in a row, and when the last was.
    aborts: HashMap<i32, (u32, Instant)>,
    /// Per partition: until when records this instance sent for it may still commit (a
    /// failed delivery's, a lost assignment's). Kept when the partition goes, for if it
    /// comes back.
    settling: HashMap<i32, Instant>,
}

impl DelayedRestarts {
    /// `partition` was fenced at `now`; it waits at least `confirm` (for the group's word)
    /// and its backoff. Returns the wait.
    pub fn fenced(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        confirm: Duration,
        now: Instant,
    ) -> Duration {
        self.backoff(partition, position, bounds, confirm, now)
    }

    /// The brokers refused `partition` a write or a read at `now` (an ACL missing,
    /// `kafka::refusal`): it waits its backoff, 1 s doubling to a minute, so that a refusal
    /// that lasts costs a request a minute, and a grant is taken up within one.
    pub fn refused(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        now: Instant,
    ) -> Duration {
        self.backoff(partition, position, bounds, Duration::ZERO, now)
    }

    /// `partition`'s recovery found state records of a newer format version at `now`: it
    /// waits its backoff, as a refused one does (1 s doubling to a minute), and reads its
    /// state again.
    pub fn newer_state(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        now: Instant,
    ) -> Duration {
        self.backoff(partition, position, bounds, Duration::ZERO, now)
    }

    /// `partition`'s transaction was aborted at `now`: it restarts at once, unless its last
    /// abort was less than [`ABORTS_IN_A_ROW`] ago; then after a backoff, 1 s doubling to a
    /// minute (a cause that lasts — an output topic refused to the transaction shows only as
    /// records purged from it — restarted it several times a second). `None`: no wait.
    pub fn aborted(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        now: Instant,
    ) -> Option<Duration> {
        let (times, last) = self.aborts.entry(partition).or_insert((0, now));
        let in_a_row = *times > 0 && now.saturating_duration_since(*last) < ABORTS_IN_A_ROW;
        *times = if in_a_row { *times + 1 } else { 1 };
        *last = now;
        if !in_a_row {
            return None;
        }
        let wait = backoff(*times - 1);
        self.wait(partition, now + wait, position, bounds);
        Some(wait)
    }

    /// The wait after a failure that repeats (fenced, refused): at least `floor`, and the
    /// partition's backoff for failures in a row.
    fn backoff(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        floor: Duration,
        now: Instant,
    ) -> Duration {
        let (times, last) = self.history.entry(partition).or_insert((0, now));
        if now.saturating_duration_since(*last) > QUIET {
            *times = 0;
        }
        *times += 1;
        *last = now;
        let wait = floor.max(backoff(*times));
        self.wait(partition, now + wait, position, bounds);
        wait
    }

    /// `partition` starts again at `due`, from `position` (`None`: the group's commit).
    fn wait(
        &mut self,
        partition: i32,
        due: Instant,
        position: Option<i64>,
        bounds: Option<Bounds>,
    ) {
        self.waiting.insert(
            partition,
            Waiting {
                due,
                position,
                bounds,
            },
        );
    }

    /// `partition`'s delivery failed at `now`: it waits out `window`.
    pub fn failed_delivery(
        &mut self,
        partition: i32,
        position: Option<i64>,
        bounds: Option<Bounds>,
        window: Duration,
        now: Instant,
    ) {
        self.unsettled(partition, now + window);
        self.wait(partition, now + window, position, bounds);
    }

    /// Records sent for `partition` may still commit until `until` (it was lost with
    /// deliveries in flight).
    pub fn unsettled(&mut self, partition: i32, until: Instant) {
        let settling = self.settling.entry(partition).or_insert(until);
        *settling = (*settling).max(until);
    }

    /// The group assigned `partition` at `now`: how long it waits before it starts (from
    /// the group's commit) — the rest of its own records' window, and at least `takeover`
    /// for a previous owner's — if at all.
    pub fn assigned(
        &mut self,
        partition: i32,
        takeover: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let own = self
            .settling
            .remove(&partition)
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        let wait = own.max(takeover);
        if wait.is_zero() {
            return None;
        }
        let due = now + wait;
        self.wait(partition, due, None, None);
        Some(wait)
    }

    /// The partitions whose wait is over at `now`, no longer waiting.
    pub fn take_due(&mut self, now: Instant) -> Vec<(i32, Waiting)> {
        let due: Vec<i32> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.due <= now)
            .map(|(p, _)| *p)
            .collect();
        due.into_iter()
            .filter_map(|p| self.waiting.remove(&p).map(|w| (p, w)))
            .collect()
    }

    /// `partition` is no longer this instance's (revoked, lost): it does not restart.
    /// Returns whether it was waiting.
    pub fn forget(&mut self, partition: i32) -> bool {
        self.history.remove(&partition);
        self.aborts.remove(&partition);
        self.waiting.remove(&partition).is_some()
    }

    /// Every waiting partition goes: the assignment was lost.
    pub fn forget_all(&mut self) -> Vec<(i32, Waiting)> {
        self.history.clear();
        self.aborts.clear();
        self.waiting.drain().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// How long after a failed delivery its record may still commit (above): a paused leader
/// may append it up to `broker.session.timeout.ms` later, and it may sit above the high
/// watermark `replica.lag.time.max.ms` more; plus `MARGIN` (below). None on a
/// single broker, which has no followers, no other leader, and whose pause stalls the
/// read-back too.
pub struct DeliveryWindow;

impl DeliveryWindow {
    pub const BROKER_SESSION: &'static str = "broker.session.timeout.ms";
    pub const REPLICA_LAG: &'static str = "replica.lag.time.max.ms";
    /// Kafka's defaults, for brokers that do not say.
    const DEFAULT_BROKER_SESSION: Duration = Duration::from_secs(9);
    const DEFAULT_REPLICA_LAG: Duration = Duration::from_secs(30);
    /// For the controller's and the leader's timers to act on those timeouts.
    const MARGIN: Duration = Duration::from_secs(5);

    pub fn of(brokers: &BrokerSettings) -> Duration {
        if brokers.brokers <= 1 {
            return Duration::ZERO;
        }
        let session = brokers
            .millis(Self::BROKER_SESSION)
            .unwrap_or(Self::DEFAULT_BROKER_SESSION);
        let lag = brokers
            .millis(Self::REPLICA_LAG)
            .unwrap_or(Self::DEFAULT_REPLICA_LAG);
        session + lag + Self::MARGIN
    }

    /// How long a partition the group assigns waits for its previous owner's records
    /// (above): the group hears of a dead owner `session_timeout` after its last heartbeat,
    /// at most `heartbeat` before it died; its records may commit up to `window` after.
    pub fn takeover(window: Duration, session_timeout: Duration, heartbeat: Duration) -> Duration {
        if window.is_zero() {
            return Duration::ZERO;
        }
        (window + heartbeat).saturating_sub(session_timeout)
    }
}

/// 1 s after the first fencing in a row, doubling, at most [`MAX_BACKOFF`].
fn backoff(times: u32) -> Duration {
    let doublings = times.saturating_sub(1).min(6);
    (Duration::from_secs(1) * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIRM: Duration = Duration::from_secs(2);

    #[test]
    fn a_fenced_partition_waits_for_the_group_then_backs_off_with_each_fencing_in_a_row() {
        let mut fenced = DelayedRestarts::default();
        let t0 = Instant::now();
        // The first waits for the group's word (two heartbeats), the later ones longer.
        let waits: Vec<Duration> = (0..8)
            .map(|i| fenced.fenced(3, Some(10), None, CONFIRM, t0 + Duration::from_secs(i)))
            .collect();
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [2, 2, 4, 8, 16, 32, 60, 60]);
        // Quiet for long: the backoff starts over.
        let later = t0 + Duration::from_secs(8) + QUIET + Duration::from_secs(1);
        assert_eq!(fenced.fenced(3, Some(10), None, CONFIRM, later), CONFIRM);
    }

    #[test]
    fn a_partition_with_newer_state_backs_off_to_a_minute_and_starts_over_after_a_quiet_spell() {
        let mut restarts = DelayedRestarts::default();
        let t0 = Instant::now();
        let secs: Vec<u64> = (0..9)
            .map(|i| {
                restarts
                    .newer_state(1, None, None, t0 + Duration::from_secs(i))
                    .as_secs()
            })
            .collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let due = restarts.take_due(t0 + Duration::from_secs(8 + 60));
        assert_eq!(
            due.iter()
                .map(|(p, w)| (*p, w.position))
                .collect::<Vec<_>>(),
            [(1, None)],
            "from the group's commit, which it never moved"
        );
        let later = t0 + Duration::from_secs(8) + QUIET + Duration::from_secs(1);
        assert_eq!(
            restarts.newer_state(1, None, None, later),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_failed_delivery_waits_out_the_brokers_window_on_a_cluster_and_nothing_on_one_broker() {
        let session = DeliveryWindow::BROKER_SESSION;
        let lag = DeliveryWindow::REPLICA_LAG;
        let told = BrokerSettings::known(3, [(session, "6000"), (lag, "4000")]);
        assert_eq!(DeliveryWindow::of(&told), Duration::from_secs(15));
        // Kafka's defaults where the brokers do not say.
        let silent = BrokerSettings::unknown(3, "not authorized".into());
        assert_eq!(DeliveryWindow::of(&silent), Duration::from_secs(44));
        let one = BrokerSettings::known(1, [(session, "6000"), (lag, "4000")]);
        assert_eq!(DeliveryWindow::of(&one), Duration::ZERO);
    }

    #[test]
    fn a_partition_assigned_again_waits_out_the_rest_of_its_records_window() {
        let mut restarts = DelayedRestarts::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(24);
        // A delivery failed, the assignment was lost 10 s later (its wait forgotten), and
        // the group gave the partition back 5 s after that: 9 s are left.
        restarts.failed_delivery(1, Some(7), None, window, t0);
        assert_eq!(restarts.forget_all().len(), 1);
        let back = t0 + Duration::from_secs(15);
        assert_eq!(
            restarts.assigned(1, Duration::ZERO, back),
            Some(Duration::from_secs(9))
        );
        let due = restarts.take_due(back + Duration::from_secs(9));
        assert_eq!(
            (due[0].0, due[0].1.position),
            (1, None),
            "from the group's commit"
        );
        // Once over, it is over; another partition waits only the takeover's share.
        assert_eq!(restarts.assigned(1, Duration::ZERO, back + window), None);
        restarts.unsettled(2, t0 + Duration::from_secs(3));
        let takeover = Duration::from_secs(8);
        assert_eq!(
            restarts.assigned(2, takeover, t0 + Duration::from_secs(1)),
            Some(takeover)
        );
    }

    #[test]
    fn a_takeover_waits_the_window_less_the_groups_session_timeout() {
        let secs = Duration::from_secs;
        assert_eq!(
            DeliveryWindow::takeover(secs(13), secs(6), secs(1)),
            secs(8)
        );
        // Kafka's and librdkafka's defaults: 44 s window, 45 s session, 3 s heartbeat.
        assert_eq!(
            DeliveryWindow::takeover(secs(44), secs(45), secs(3)),
            secs(2)
        );
        assert_eq!(
            DeliveryWindow::takeover(secs(44), secs(60), secs(3)),
            Duration::ZERO
        );
        // One broker, or transactions: no window, no wait.
        assert_eq!(
            DeliveryWindow::takeover(Duration::ZERO, secs(6), secs(1)),
            Duration::ZERO
        );
    }

    #[test]
    fn only_partitions_whose_wait_is_over_are_taken_and_a_forgotten_one_never_is() {
        let mut fenced = DelayedRestarts::default();
        let t0 = Instant::now();
        fenced.fenced(1, Some(5), None, CONFIRM, t0);
        fenced.fenced(2, None, None, CONFIRM, t0 + Duration::from_secs(1));
        fenced.fenced(4, None, None, CONFIRM, t0);
        assert!(fenced.forget(4), "4 was waiting");
        assert!(fenced.take_due(t0 + Duration::from_secs(1)).is_empty());
        let due = fenced.take_due(t0 + CONFIRM);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].0, due[0].1.position), (1, Some(5)));
        assert!(!fenced.is_empty(), "2 still waits");
        let rest = fenced.forget_all();
        assert_eq!(rest.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [2]);
        assert!(fenced.is_empty());
        assert!(fenced.take_due(t0 + Duration::from_secs(100)).is_empty());
    }
}

//! Why this instance is not ready, in words an operator acts on: the reasons
//! `crate::readiness` finds and the events that report it (`internal_events`) carry. A
//! leaf below both, so the events need not know the tracker.

/// What waits for the watermark topic's reader to pass a previous owner's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WatermarkWaiter {
    /// An input partition taken over: its floor is its previous owner's last value.
    Partition(i32),
    /// The new writer of the `merged` record (the owner of input partition 0).
    Merged,
}

impl std::fmt::Display for WatermarkWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatermarkWaiter::Partition(p) => write!(f, "input partition {p}"),
            WatermarkWaiter::Merged => write!(f, "the merged watermark"),
        }
    }
}

/// Why an instance is not ready (the body of a 503 from `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The start waits for the brokers (these bootstrap servers) to answer.
    WaitingForBrokers(std::sync::Arc<str>),
    /// The consumer has not been given its partitions yet (starting, or joining the group).
    NoAssignment,
    /// These wait to read the watermark topic past their previous owner's last value
    /// (behind a transaction still open on it, or the topic cannot be read).
    ReadingWatermarks(Vec<WatermarkWaiter>),
    /// These input partitions' recoveries wait for what they cannot read (what, and why).
    RecoveryWaiting(Vec<(i32, String)>),
    /// The input consumer's last poll failed with this (an ACL missing, a batch it cannot
    /// decode), and it has not read since.
    ConsumerFailing(String),
    /// This many assigned partitions are still restoring their state.
    Recovering(i64),
    Stopping,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::WaitingForBrokers(brokers) => {
                write!(f, "waiting for the brokers at {brokers} to answer")
            }
            NotReady::NoAssignment => write!(f, "waiting for the consumer group's assignment"),
            NotReady::ReadingWatermarks(waiters) => {
                write!(
                    f,
                    "waiting to read the watermark topic past the previous owner's last value of "
                )?;
                for (i, waiter) in waiters.iter().enumerate() {
                    write!(f, "{}{waiter}", if i == 0 { "" } else { ", " })?;
                }
                write!(f, " (a transaction open on it ends within its timeout)")
            }
            NotReady::RecoveryWaiting(waits) => {
                for (i, (partition, what)) in waits.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(
                        f,
                        "{sep}input partition {partition} cannot be restored: waiting to read {what}"
                    )?;
                }
                Ok(())
            }
            NotReady::ConsumerFailing(error) => {
                write!(f, "the input consumer cannot read: {error}")
            }
            NotReady::Recovering(n) => write!(f, "{n} partition(s) restoring their state"),
            NotReady::Stopping => write!(f, "stopping"),
        }
    }
}

//! Why a watch stopped. Recorded on the watch's last event and used as a metric label, so the
//! set of values is small and fixed (custom conditions add their own name).

use std::fmt;
use std::sync::Arc;

/// Why a watch ended: a fixed name per built-in condition, or a user condition's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TerminatedReason {
    /// The poller said the set of outputs is final.
    Final,
    /// `total(d)`: the watch has run for `d` since its input arrived.
    Total,
    /// `stable(d)`: no new output for `d` (or none at all for `d` since the start).
    Stable,
    /// `polls(n)`: `n` polls have completed.
    Polls,
    /// `all(...)`: every child condition holds at once.
    All,
    /// Poll errors reached the retry limit, or the poller reported a permanent error.
    Failed,
    /// The watch was stopped from outside (its partition was revoked, or the bridge shut down).
    Stopped,
    /// A user-defined condition, by its name.
    Custom(Arc<str>),
}

impl TerminatedReason {
    /// Its name, as in logs, the state topic and the `reason` metric label.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Final => "final",
            Self::Total => "total",
            Self::Stable => "stable",
            Self::Polls => "polls",
            Self::All => "all",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
            Self::Custom(name) => name,
        }
    }
}

impl fmt::Display for TerminatedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

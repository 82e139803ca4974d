//! How a watch over a resource with a long history catches up (issue 52): where it starts
//! (`WATCHBRIDGE_START_FROM`) and how many new outputs one poll may emit
//! (`WATCHBRIDGE_MAX_OUTPUTS_PER_POLL`), so that onboarding many inputs at once does not
//! flood the output topic.
//!
//! Both act in [`crate::watch::Watch::on_success`], after the seen set has told new from
//! old: a watch starting from `now` marks its first successful poll's items seen and emits
//! none of them; a capped watch emits the earliest `max` new outputs (by event time) and
//! holds the rest back, in memory, for its next polls (see `watch.rs`, `Backlog`).

use std::num::NonZeroUsize;

/// Where a new watch starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StartFrom {
    /// Everything the resource shows is new (Beam's `Watch`): the default.
    #[default]
    Earliest,
    /// What the first successful poll shows is the past: recorded as seen (and so kept on
    /// the state topic) but not emitted; only what comes after it is.
    Now,
}

impl StartFrom {
    /// `earliest` or `now` (any case).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "earliest" => Ok(Self::Earliest),
            "now" => Ok(Self::Now),
            other => Err(format!("`{other}`: expected `earliest` or `now`")),
        }
    }
}

/// A watch's catch-up rules: [`StartFrom`] and the cap on outputs per poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatchUp {
    pub start_from: StartFrom,
    /// Most new outputs one poll emits (`None`: all of them).
    pub max_outputs_per_poll: Option<NonZeroUsize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_from_reads_earliest_or_now() {
        assert_eq!(StartFrom::parse("earliest"), Ok(StartFrom::Earliest));
        assert_eq!(StartFrom::parse(" NOW "), Ok(StartFrom::Now));
        let e = StartFrom::parse("latest").unwrap_err();
        assert!(e.contains("`latest`") && e.contains("`now`"), "{e}");
    }
}

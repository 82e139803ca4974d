//! `WATCHBRIDGE_POLLER`: which built-in poller a run uses, with all of their settings.
//!
//! The runtime is generic over the poller (no dynamic dispatch per poll), so choosing one at
//! start goes through [`UsePoller`]: the caller says what to do with *a* poller, and
//! [`PollerArgs::build`] calls it with the concrete one the settings name.

use super::glob::{GlobArgs, GlobPoller};
use super::http::{HttpArgs, HttpPoller};
use super::object_store::{ObjectArgs, ObjectStorePoller};
use super::sharded::{ShardedArgs, ShardedPoller};
use super::{ConfigError, Resolve};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollerKind {
    /// A JSON HTTP API (WATCHBRIDGE_HTTP_*).
    #[default]
    Http,
    /// Files matching a path pattern (WATCHBRIDGE_GLOB*).
    Glob,
    /// The shards PREFIX-SSSSS-of-NNNNN of one output (WATCHBRIDGE_SHARDED_*).
    Sharded,
    /// The objects under an S3, GCS or Azure prefix (WATCHBRIDGE_OBJECT_*).
    #[value(name = "object_store", alias = "object-store")]
    ObjectStore,
}

/// The poller settings of `watchbridge run` (and `poll-once`).
#[derive(clap::Args, Debug, Clone)]
pub struct PollerArgs {
    /// Which built-in poller watches the outside world.
    #[arg(long, env = "WATCHBRIDGE_POLLER", value_name = "WATCHBRIDGE_POLLER", value_enum, default_value_t = PollerKind::Http)]
    pub poller: PollerKind,
    /// Deadline of one poll, all its requests included (humantime: 500ms, 30s).
    #[arg(long, env = "WATCHBRIDGE_POLL_TIMEOUT", value_name = "WATCHBRIDGE_POLL_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub poll_timeout: Duration,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub glob: GlobArgs,
    #[command(flatten)]
    pub sharded: ShardedArgs,
    #[command(flatten)]
    pub object: ObjectArgs,
}

/// Something to do with whichever poller the settings name.
pub trait UsePoller {
    type Output;
    fn with<P: Resolve>(self, poller: Arc<P>) -> Self::Output;
}

impl PollerArgs {
    /// Check the chosen poller's settings, build it, and hand it to `use_it`.
    pub fn build<U: UsePoller>(&self, use_it: U) -> Result<U::Output, ConfigError> {
        if self.poll_timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_POLL_TIMEOUT",
                "must be more than zero",
            ));
        }
        Ok(match self.poller {
            PollerKind::Http => {
                let env = |name: &str| std::env::var(name).ok();
                let config = self.http.config(self.poll_timeout, &env)?;
                use_it.with(Arc::new(HttpPoller::new(config)?))
            }
            PollerKind::Glob => use_it.with(Arc::new(GlobPoller::new(self.glob.config()?))),
            PollerKind::Sharded => {
                use_it.with(Arc::new(ShardedPoller::new(self.sharded.config()?)))
            }
            PollerKind::ObjectStore => {
                let config = self.object.config(self.poll_timeout)?;
                use_it.with(Arc::new(ObjectStorePoller::new(config)?))
            }
        })
    }
}

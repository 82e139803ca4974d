//! The `demo` command's settings: with the other commands' here, so that the list of
//! every known setting (`known`) is built where the settings are.

use std::num::NonZeroU32;
use std::time::Duration;

/// `watchbridge demo`'s settings. The bridge settings a newcomer may want to try take the
/// same variables and flags as `watchbridge run`, with defaults that keep a run short.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// How many "new user" records to produce (each starts one watch).
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub users: u32,
    /// Time between polls of one watch (humantime: 500ms, 2s).
    #[arg(long, env = "WATCHBRIDGE_POLL_INTERVAL", value_name = "WATCHBRIDGE_POLL_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// When a watch ends besides its feed saying `done`, e.g. `any(total(20s), stable(4s))`.
    #[arg(
        long,
        env = "WATCHBRIDGE_TERMINATION",
        value_name = "WATCHBRIDGE_TERMINATION",
        default_value = "any(total(20s), stable(4s))"
    )]
    pub termination: String,
    /// Deadline of one poll (humantime).
    #[arg(long, env = "WATCHBRIDGE_POLL_TIMEOUT", value_name = "WATCHBRIDGE_POLL_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub poll_timeout: Duration,
    /// Most polls in flight at once.
    #[arg(
        long,
        env = "WATCHBRIDGE_MAX_IN_FLIGHT",
        value_name = "WATCHBRIDGE_MAX_IN_FLIGHT",
        default_value_t = 256
    )]
    pub max_in_flight: usize,
    /// Most polls per second to the feeds' host (unset: no limit).
    #[arg(
        long,
        env = "WATCHBRIDGE_HOST_RATE",
        value_name = "WATCHBRIDGE_HOST_RATE"
    )]
    pub host_rate: Option<NonZeroU32>,
    /// Seed of the simulated feeds: the same seed, the same feeds.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print the bridge's Prometheus metrics after the summary.
    #[arg(long)]
    pub metrics: bool,
}

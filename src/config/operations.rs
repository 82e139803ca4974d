//! The operations surface's settings: where the control API listens (apart from the
//! metrics and probes), what it shows, the control topic that carries the group's orders,
//! and when a stalled engine fails liveness.

use crate::config_error::ConfigError;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct OperationsArgs {
    /// Where the control and watch API listens (`/watches`, `/partitions`, `/pause`,
    /// `/resume`, `/restart`), as host:port, or `off`. Loopback unless set: it shows watch
    /// keys and changes what the group does. Each of its requests needs
    /// `WATCHBRIDGE_ADMIN_TOKEN`. The same address as WATCHBRIDGE_METRICS_ADDR serves both
    /// on one port.
    #[arg(
        long,
        env = "WATCHBRIDGE_CONTROL_ADDR",
        value_name = "WATCHBRIDGE_CONTROL_ADDR",
        default_value = "127.0.0.1:9899"
    )]
    pub control_addr: String,
    /// Whether a watch's status shows the value of the input record it was started from
    /// (often personal data). Off: the input's key and time only.
    #[arg(
        long,
        env = "WATCHBRIDGE_CONTROL_SHOW_INPUTS",
        value_name = "WATCHBRIDGE_CONTROL_SHOW_INPUTS",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub control_show_inputs: bool,
    /// The compacted topic that carries the group's standing orders (pauses): every instance
    /// reads it, so an order given to one applies on all and survives restarts (default:
    /// `<group id>.control`).
    #[arg(
        long,
        env = "WATCHBRIDGE_CONTROL_TOPIC",
        value_name = "WATCHBRIDGE_CONTROL_TOPIC"
    )]
    pub control_topic: Option<String>,
    /// `/healthz` fails when a partition's engine has had work (live watches, inputs) but
    /// has not turned for this long: a stuck process that only a restart mends (`0s`: never).
    /// Waiting on Kafka is not a stall (the brokers' own alerts cover that).
    #[arg(long, env = "WATCHBRIDGE_STALL_TIMEOUT", value_name = "WATCHBRIDGE_STALL_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub stall_timeout: Duration,
}

/// [`OperationsArgs`], checked.
#[derive(Debug, Clone)]
pub struct OperationsConfig {
    /// Where the control API listens (`None`: `off`).
    pub control_addr: Option<SocketAddr>,
    /// `WATCHBRIDGE_CONTROL_SHOW_INPUTS`.
    pub show_inputs: bool,
    /// The control topic's name.
    pub control_topic: String,
    /// `None`: never.
    pub stall_timeout: Option<Duration>,
}

impl OperationsArgs {
    /// No control API and no stall check (the demo, the benchmarks: nobody operates them).
    pub fn off() -> Self {
        Self {
            control_addr: "off".into(),
            control_show_inputs: false,
            control_topic: None,
            stall_timeout: Duration::ZERO,
        }
    }

    /// Checked, for the group `group_id`.
    pub fn check(&self, group_id: &str) -> Result<OperationsConfig, ConfigError> {
        let control_topic = match &self.control_topic {
            Some(t) if t.trim().is_empty() => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_CONTROL_TOPIC",
                    "must not be empty",
                ))
            }
            Some(t) => t.trim().to_string(),
            None => format!("{group_id}.control"),
        };
        Ok(OperationsConfig {
            control_addr: address(
                "WATCHBRIDGE_CONTROL_ADDR",
                &self.control_addr,
                "127.0.0.1:9899, [::1]:9899",
            )?,
            show_inputs: self.control_show_inputs,
            control_topic,
            stall_timeout: Some(self.stall_timeout).filter(|t| !t.is_zero()),
        })
    }
}

/// An IP address and port (port 0: any free one), or `off`; errors name `var` and give
/// `examples` of the setting's own.
pub fn address(
    var: &'static str,
    value: &str,
    examples: &str,
) -> Result<Option<SocketAddr>, ConfigError> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        ConfigError::new(
            var,
            format!("`{value}` is not an IP address and port (e.g. {examples}), or `off`"),
        )
    })
}

//! Everything `watchbridge run` checks before it contacts anything, in one place, for `run`
//! itself and for `watchbridge config --check`: no variable of the prefix that is not a
//! setting ([`super::known`]), the settings [`RunArgs::check`] checks, and the chosen
//! poller's settings (the poller is built, as `run` builds it, but not used). Every error is
//! reported, not only the first, so one round of fixes is enough.

use super::{RunArgs, RunConfig};
use crate::config_error::ConfigError;
use crate::pollers::builtin::UsePoller;
use crate::pollers::Resolve;
use std::sync::Arc;

/// The checked settings, or every error found (each naming its variable).
pub fn check_run(
    args: &RunArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<RunConfig, Vec<ConfigError>> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    let mut errors =
        super::known::unknown_variables(env.iter().cloned(), &super::known::known_names());
    let config = match args.check(env) {
        Ok(config) => Some(config),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    if let Err(e) = super::require_brokers(args.brokers.as_deref()) {
        errors.push(e);
    }
    if let Err(e) = args.poller.build(BuildOnly) {
        if !errors.contains(&e) {
            errors.push(e);
        }
    }
    match config {
        Some(config) if errors.is_empty() => Ok(config),
        _ => Err(errors),
    }
}

/// Builds the poller and drops it: its settings are checked as for a run.
struct BuildOnly;

impl UsePoller for BuildOnly {
    type Output = ();
    fn with<P: Resolve>(self, _poller: Arc<P>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn every_error_is_reported_each_naming_its_variable() {
        let args = super::super::parse_run_args(&[
            "--input-topic",
            "users",
            "--output-topic",
            "events",
            "--termination",
            "stabel(1m)",
            "--http-url",
            "http://api/{/id}",
            "--http-items",
            "data",
        ])
        .unwrap();
        let errors = check_run(&args, env(&[("WATCHBRIDGE_BROKER", "kafka:9092")])).unwrap_err();
        let vars: Vec<&str> = errors.iter().map(|e| e.var.as_ref()).collect();
        assert_eq!(
            vars,
            [
                "WATCHBRIDGE_BROKER",
                "WATCHBRIDGE_TERMINATION",
                "WATCHBRIDGE_BROKERS",
                "WATCHBRIDGE_HTTP_ITEMS"
            ],
            "{errors:?}"
        );
        let good = super::super::parse_run_args(&[
            "--input-topic",
            "users",
            "--output-topic",
            "events",
            "--brokers",
            "kafka:9092",
            "--http-url",
            "http://api/{/id}",
        ])
        .unwrap();
        let config = check_run(&good, env(&[("WATCHBRIDGE_TEST_BROKER", "kafka")])).unwrap();
        assert_eq!(config.brokers.as_deref(), Some("kafka:9092"));
    }
}

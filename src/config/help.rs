//! The headings `watchbridge run --help` groups its hundred-odd settings under, the same
//! sections as docs/configuration.md. Given by variable name in one place (the settings
//! are declared in several modules: formats, pollers), and applied to the command before it
//! parses; a setting without a heading fails the unit test below.

/// The heading of the setting read from `var`, or `None` for a variable that is not a
/// setting of `run`.
pub fn heading(var: &str) -> Option<&'static str> {
    let name = var.strip_prefix(super::known::PREFIX)?;
    let prefixed = |p: &str| name.starts_with(p);
    Some(match name {
        "BROKERS" | "GROUP_ID" | "INPUT_TOPIC" | "OUTPUT_TOPIC" | "DLQ_TOPIC" | "CREATE_TOPICS"
        | "PARTITIONS" | "REPLICATION_FACTOR" | "TOPIC_CONFIG" => KAFKA,
        "INPUT_FORMAT"
        | "INPUT_KEY_FORMAT"
        | "INPUT_SCHEMA"
        | "INPUT_TIME"
        | "INPUT_TIME_UNIT"
        | "INPUT_TIME_FALLBACK"
        | "OUTPUT_FORMAT"
        | "OUTPUT_HEADERS"
        | "OUTPUT_SCHEMA"
        | "OUTPUT_SUBJECT_STRATEGY" => FORMATS,
        _ if prefixed("SCHEMA_REGISTRY_") => FORMATS,
        "WATCH_KEY"
        | "REPARTITION"
        | "REPARTITION_TOPIC"
        | "POLLER"
        | "POLL_INTERVAL"
        | "POLL_TIMEOUT"
        | "POLL_JITTER"
        | "BACKOFF"
        | "MAX_IN_FLIGHT"
        | "INPUT_HOLD_BYTES"
        | "HOST_RATE"
        | "MODE"
        | "START_FROM"
        | "MAX_OUTPUTS_PER_POLL" => POLLING,
        _ if prefixed("RETRY_") => POLLING,
        "TERMINATION" => TERMINATION,
        _ if prefixed("HTTP_") => HTTP,
        "GLOB" => FILES,
        _ if prefixed("GLOB_") || prefixed("SHARDED_") || prefixed("OBJECT_") => FILES,
        "WATERMARK_STRATEGY" | "WATERMARK_INTERVAL" | "IDLE_TIMEOUT" | "WATERMARK_TOPIC" => {
            WATERMARKS
        }
        "STATE_TOPIC" | "CHECKPOINT_INTERVAL" | "GUARANTEE" | "FINISHED_RETENTION" => STATE,
        "SHUTDOWN_TIMEOUT"
        | "START_TIMEOUT"
        | "METRICS_ADDR"
        | "ADMIN_TOKEN"
        | "LOG_FORMAT"
        | "CONTROL_ADDR"
        | "CONTROL_SHOW_INPUTS"
        | "CONTROL_TOPIC"
        | "STALL_TIMEOUT" => OPERATIONS,
        _ => return None,
    })
}

const KAFKA: &str = "Kafka and topics";
const FORMATS: &str = "Formats (docs/formats.md)";
const POLLING: &str = "Watches and polling";
const TERMINATION: &str = "Termination";
const HTTP: &str = "HTTP poller (WATCHBRIDGE_POLLER=http)";
const FILES: &str = "File and object-store pollers (glob, sharded, object_store)";
const WATERMARKS: &str = "Watermarks";
const STATE: &str = "Durable state";
const OPERATIONS: &str = "Operations";

/// `command` and its subcommands with every setting under its [`heading`].
pub fn with_headings(command: clap::Command) -> clap::Command {
    command
        .mut_args(
            |arg| match arg.get_env().and_then(|e| e.to_str()).and_then(heading) {
                Some(h) => arg.help_heading(h),
                None => arg,
            },
        )
        .mut_subcommands(with_headings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting of `run` has a heading: one added without fails here, naming it.
    #[test]
    fn every_setting_of_run_has_a_heading() {
        use clap::Args;
        let run = super::super::RunArgs::augment_args(clap::Command::new("run"));
        let mut settings = 0;
        for arg in run.get_arguments() {
            let Some(var) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            settings += 1;
            assert!(
                heading(var).is_some(),
                "{var} has no heading in config/help.rs"
            );
        }
        assert!(settings > 90, "{settings}");
        assert_eq!(heading("WATCHBRIDGE_LOG_FORMAT"), Some(OPERATIONS));
        assert_eq!(heading("WATCHBRIDGE_GLOB"), Some(FILES));
        assert_eq!(heading("PATH"), None);
    }
}

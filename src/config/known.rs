//! Which `WATCHBRIDGE_*` environment variables are settings. A misspelt one
//! (`WATCHBRIDGE_BROKER`) would otherwise be ignored without a word and its default used, so
//! `watchbridge run` and `watchbridge config --check` refuse every variable of the prefix
//! that is not a setting, naming the closest one that is.
//!
//! The names are read from the commands themselves (every clap `env` of `run` and `demo`),
//! not listed by hand, so a new setting is known the moment it has a flag.

use crate::config_error::ConfigError;
use std::collections::BTreeSet;

/// The prefix of every setting's variable.
pub const PREFIX: &str = "WATCHBRIDGE_";

/// Variables the test suite sets in its own environment (`WATCHBRIDGE_TEST_BROKER=kafka`,
/// `WATCHBRIDGE_TEST_KEEP_LOGS`, …), which the bridges it starts inherit: reserved, never a
/// setting, never refused.
pub const TEST_PREFIX: &str = "WATCHBRIDGE_TEST_";

/// Variables of the repository's scripts and test helpers, which a developer may keep
/// exported in the shell that runs the bridge: where `scripts/*.sh` cache the test brokers
/// (`WATCHBRIDGE_CACHE`), and keeping the test brokers' directories
/// (`WATCHBRIDGE_KEEP_TEST_DIRS`). Reserved like [`TEST_PREFIX`].
pub const RESERVED: &[&str] = &["WATCHBRIDGE_CACHE", "WATCHBRIDGE_KEEP_TEST_DIRS"];

/// The log filter and format: read by the logging set-up, before any command (the format
/// is a flag of every command too).
pub const LOGGING: &[&str] = &["WATCHBRIDGE_LOG", "WATCHBRIDGE_LOG_FORMAT"];

/// Every `WATCHBRIDGE_*` variable that is a setting of some command: the `env` of each
/// argument of `run` and `demo` (the other commands take a subset of `run`'s), the logging
/// variables, and `NAME_FILE` for each secret that may come from a file
/// ([`super::SECRETS_FROM_FILES`]).
pub fn known_names() -> BTreeSet<String> {
    use clap::Args;
    let commands = [
        super::RunArgs::augment_args(clap::Command::new("run")),
        super::DemoArgs::augment_args(clap::Command::new("demo")),
    ];
    let mut names: BTreeSet<String> = commands
        .iter()
        .flat_map(|c| c.get_arguments())
        .filter_map(|a| a.get_env())
        .filter_map(|e| e.to_str())
        .map(str::to_string)
        .collect();
    names.extend(LOGGING.iter().map(|n| n.to_string()));
    names.extend(
        super::SECRETS_FROM_FILES
            .iter()
            .map(|n| format!("{n}_FILE")),
    );
    names
}

/// Every variable of `env` with the [`PREFIX`] that is not a setting (nor reserved for the
/// tests), each an error naming it and, when one is close, the setting meant.
pub fn unknown_variables(
    env: impl IntoIterator<Item = (String, String)>,
    known: &BTreeSet<String>,
) -> Vec<ConfigError> {
    let mut unknown: Vec<String> = env
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| {
            n.starts_with(PREFIX)
                && !n.starts_with(TEST_PREFIX)
                && !RESERVED.contains(&n.as_str())
                && !known.contains(n)
        })
        .collect();
    unknown.sort();
    unknown
        .into_iter()
        .map(|name| {
            let message = match closest(&name, known) {
                Some(meant) => format!("is not a setting; did you mean {meant}?"),
                None => "is not a setting (`watchbridge run --help` lists them; \
                         WATCHBRIDGE_TEST_* is reserved for the test suite)"
                    .to_string(),
            };
            ConfigError::new(name, message)
        })
        .collect()
}

/// The known name nearest to `name` by edit distance, if near enough to be a slip: at most
/// a third of the part after the prefix, and at least 2 edits allowed.
fn closest<'a>(name: &str, known: &'a BTreeSet<String>) -> Option<&'a str> {
    let rest = name.len().saturating_sub(PREFIX.len());
    let allowed = (rest / 3).max(2);
    known
        .iter()
        .map(|k| (levenshtein(name, k), k))
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

/// Edits (insert, delete, replace one character) that turn `a` into `b`.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(names: &[&str]) -> Vec<(String, String)> {
        names.iter().map(|n| (n.to_string(), "x".into())).collect()
    }

    #[test]
    fn edit_distance() {
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("BROKER", "BROKERS"), 1);
        assert_eq!(levenshtein("same", "same"), 0);
    }

    #[test]
    fn every_setting_of_run_and_demo_is_known_and_a_slip_is_named() {
        let known = known_names();
        for name in [
            "WATCHBRIDGE_BROKERS",
            "WATCHBRIDGE_HTTP_URL",
            "WATCHBRIDGE_GLOB",
            "WATCHBRIDGE_OBJECT_URL",
            "WATCHBRIDGE_SCHEMA_REGISTRY_URL",
            "WATCHBRIDGE_ADMIN_TOKEN_FILE",
            "WATCHBRIDGE_HTTP_TOKEN_FILE",
            "WATCHBRIDGE_LOG",
            "WATCHBRIDGE_LOG_FORMAT",
        ] {
            assert!(known.contains(name), "{name}");
        }
        let errors = unknown_variables(
            env(&[
                "WATCHBRIDGE_BROKER",
                "WATCHBRIDGE_POLL_INTERVALL",
                "WATCHBRIDGE_TEST_BROKER",
                "WATCHBRIDGE_CACHE",
                "WATCHBRIDGE_BROKERS",
                "KAFKA_ACKS",
                "PATH",
                "WATCHBRIDGE_SOMETHING_ELSE_ENTIRELY",
            ]),
            &known,
        );
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "WATCHBRIDGE_BROKER: is not a setting; did you mean WATCHBRIDGE_BROKERS?",
                "WATCHBRIDGE_POLL_INTERVALL: is not a setting; did you mean WATCHBRIDGE_POLL_INTERVAL?",
                "WATCHBRIDGE_SOMETHING_ELSE_ENTIRELY: is not a setting (`watchbridge run --help` \
                 lists them; WATCHBRIDGE_TEST_* is reserved for the test suite)",
            ]
        );
    }
}

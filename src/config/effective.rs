//! `watchbridge config`: every setting `run` would use, its value, and where it came from
//! (a flag, the environment, a `NAME_FILE` secret file, or the default), so that what a
//! deployment actually configured can be read, and diffed, instead of guessed. Secrets are
//! never shown: the rule is the one for logs ([`crate::secrets::is_secret`], `hide_env_values`, and
//! [`crate::logging::redact_url`] for URLs).

use clap::parser::ValueSource;
use std::collections::HashMap;

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag (which wins over the variable).
    Flag,
    /// Its environment variable.
    Env,
    /// Its environment variable, set from the file `NAME_FILE` names.
    File,
    /// Nothing set: the default.
    Default,
    /// Nothing set and no default.
    Unset,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::File => "file",
            Source::Default => "default",
            Source::Unset => "unset",
        }
    }
}

/// One setting as `run` would see it.
#[derive(Debug, Clone)]
pub struct Setting {
    /// Its variable, e.g. `WATCHBRIDGE_BROKERS` (or a `KAFKA_*` one).
    pub name: String,
    /// Its value, secrets redacted (`None`: unset).
    pub value: Option<String>,
    pub source: Source,
    /// The `--help` heading it is listed under.
    pub heading: &'static str,
}

/// Every setting of `command` (the parsed subcommand, `run`'s arguments flattened into it)
/// as `matches` has it, then `WATCHBRIDGE_LOG` and every `KAFKA_*` variable of `env`.
pub fn settings(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    env: &HashMap<String, String>,
) -> Vec<Setting> {
    let mut out = Vec::new();
    for arg in command.get_arguments() {
        let Some(name) = arg.get_env().and_then(|e| e.to_str()) else {
            continue;
        };
        let id = arg.get_id().as_str();
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) if env.contains_key(&format!("{name}_FILE")) => {
                Source::File
            }
            Some(ValueSource::EnvVariable) => Source::Env,
            Some(ValueSource::DefaultValue) => Source::Default,
            _ => Source::Unset,
        };
        let value = matches.get_raw(id).map(|values| {
            values
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",")
        });
        // A URL hidden from `--help` is shown with its secrets redacted, as logs show it.
        let secret =
            crate::secrets::is_secret(name) || (arg.is_hide_env_values_set() && !is_url(name));
        out.push(Setting {
            name: name.to_string(),
            value: value.map(|v| shown(name, &v, secret)),
            source,
            heading: super::help::heading(name).unwrap_or("Other"),
        });
    }
    out.push(match env.get("WATCHBRIDGE_LOG") {
        Some(v) => Setting {
            name: "WATCHBRIDGE_LOG".into(),
            value: Some(shown("WATCHBRIDGE_LOG", v, false)),
            source: Source::Env,
            heading: "Operations",
        },
        None => Setting {
            name: "WATCHBRIDGE_LOG".into(),
            value: Some("info".into()),
            source: Source::Default,
            heading: "Operations",
        },
    });
    let mut kafka: Vec<(&String, &String)> = env
        .iter()
        .filter(|(name, _)| name.starts_with("KAFKA_"))
        .collect();
    kafka.sort();
    for (name, value) in kafka {
        let property = name["KAFKA_".len()..]
            .to_ascii_lowercase()
            .replace('_', ".");
        let secret = crate::secrets::is_secret(&property) || crate::secrets::is_secret(name);
        out.push(Setting {
            name: name.clone(),
            value: Some(shown(name, value, secret)),
            source: Source::Env,
            heading: "Kafka client properties (KAFKA_*)",
        });
    }
    out
}

/// A value as it may be shown: a secret not at all, a URL's secrets redacted, control
/// characters escaped.
fn shown(name: &str, value: &str, secret: bool) -> String {
    if secret {
        return crate::logging::REDACTED.to_string();
    }
    if is_url(name) {
        crate::logging::url(value).to_string()
    } else {
        crate::logging::outside(value).to_string()
    }
}

fn is_url(name: &str) -> bool {
    name.ends_with("_URL") || name.ends_with("_PROXY")
}

/// One `NAME=value  (source)` line per setting (`NAME  (unset)` for one without a value),
/// under `# heading` lines: plain text that `grep` and `diff` read.
pub fn to_text(settings: &[Setting]) -> String {
    let mut out = String::new();
    let mut heading = "";
    for s in settings {
        if s.heading != heading {
            if !heading.is_empty() {
                out.push('\n');
            }
            heading = s.heading;
            out.push_str(&format!("# {heading}\n"));
        }
        match &s.value {
            Some(v) => out.push_str(&format!("{}={v}  ({})\n", s.name, s.source.as_str())),
            None => out.push_str(&format!("{}  ({})\n", s.name, s.source.as_str())),
        }
    }
    out
}

/// The settings as a JSON array of `{"name", "value", "source", "heading"}` (`value` null
/// when unset).
pub fn to_json(settings: &[Setting]) -> String {
    let list: Vec<serde_json::Value> = settings
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name,
                "value": s.value,
                "source": s.source.as_str(),
                "heading": s.heading,
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_default() + "\n"
}

/// Settings in the order of their headings' first appearance, each heading's settings
/// together (the command lists them in the order they are declared).
pub fn grouped(settings: Vec<Setting>) -> Vec<Setting> {
    let mut order: Vec<&'static str> = Vec::new();
    for s in &settings {
        if !order.contains(&s.heading) {
            order.push(s.heading);
        }
    }
    let mut out = settings;
    out.sort_by_key(|s| order.iter().position(|h| *h == s.heading));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_url_secrets_are_never_shown() {
        assert_eq!(
            shown("WATCHBRIDGE_ADMIN_TOKEN", "t0ken", true),
            "<redacted>"
        );
        assert_eq!(
            shown(
                "WATCHBRIDGE_HTTP_URL",
                "https://u:p@h/x?api_key=k&page=2",
                false
            ),
            "https://<redacted>@h/x?api_key=<redacted>&page=2"
        );
        assert_eq!(shown("WATCHBRIDGE_GLOB", "/a\nb", false), "/a\\nb");
    }
}

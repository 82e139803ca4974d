//! The formats of records in and out: how an input record's value and key are read
//! (`input`), where its event time comes from (`time`), and how output values are written
//! (`output`). Avro itself (the mapping to JSON, the wire format, the registry) is
//! `crate::avro`'s. Control records (watermarks) and dead letters are not affected: they
//! stay JSON and keep the original bytes.

pub mod input;
pub mod output;
pub mod time;
pub mod watch_input;

use crate::avro::registry::{RegistryAuth, RegistryClient, RegistrySettings};
use crate::config_error::ConfigError;
use crate::metrics::Metrics;
use apache_avro::Schema;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// An input value's format (`WATCHBRIDGE_INPUT_FORMAT`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputFormat {
    /// A JSON document.
    #[default]
    Json,
    /// Avro: bare datums of WATCHBRIDGE_INPUT_SCHEMA when it is set, else the Confluent
    /// wire format through WATCHBRIDGE_SCHEMA_REGISTRY_URL.
    Avro,
    /// UTF-8 text, seen by templates as `{"value": "<text>"}`.
    String,
}

/// An input key's format (`WATCHBRIDGE_INPUT_KEY_FORMAT`), when the record key is the
/// watch key.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyFormat {
    /// The key's bytes as they are.
    #[default]
    Raw,
    /// UTF-8 text (anything else is refused).
    String,
    /// JSON; a string is the watch key as is, a number or boolean its JSON text.
    Json,
    /// Avro in the Confluent wire format (needs the registry); mapped as `json`.
    Avro,
}

/// An output value's format (`WATCHBRIDGE_OUTPUT_FORMAT`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// The item as the poller returned it.
    #[default]
    Json,
    /// Avro in the Confluent wire format, registered in WATCHBRIDGE_SCHEMA_REGISTRY_URL.
    Avro,
}

/// The format settings of `watchbridge run`.
#[derive(clap::Args, Debug, Clone)]
pub struct FormatArgs {
    /// Format of input record values: `json`, `avro` or `string`.
    #[arg(long, env = "WATCHBRIDGE_INPUT_FORMAT", value_name = "WATCHBRIDGE_INPUT_FORMAT", value_enum, default_value_t = InputFormat::Json)]
    pub input_format: InputFormat,
    /// Format of input record keys, when the record key is the watch key: `raw`, `string`,
    /// `json` or `avro`.
    #[arg(long, env = "WATCHBRIDGE_INPUT_KEY_FORMAT", value_name = "WATCHBRIDGE_INPUT_KEY_FORMAT", value_enum, default_value_t = KeyFormat::Raw)]
    pub input_key_format: KeyFormat,
    /// An Avro schema file (.avsc): input values are bare Avro datums of this schema (not
    /// the registry's wire format).
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_SCHEMA",
        value_name = "WATCHBRIDGE_INPUT_SCHEMA"
    )]
    pub input_schema: Option<PathBuf>,
    /// JSON pointer to the input's event time in its value (default: the record
    /// timestamp): epoch number or RFC 3339 text.
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_TIME",
        value_name = "WATCHBRIDGE_INPUT_TIME"
    )]
    pub input_time: Option<String>,
    /// Unit of an epoch number at WATCHBRIDGE_INPUT_TIME: `ms`, `s` or `us`.
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_TIME_UNIT",
        value_name = "WATCHBRIDGE_INPUT_TIME_UNIT",
        default_value = "ms"
    )]
    pub input_time_unit: String,
    /// An input whose WATCHBRIDGE_INPUT_TIME is missing or unreadable: `dead_letter` or
    /// `record_timestamp` (use the record's timestamp).
    #[arg(
        long,
        env = "WATCHBRIDGE_INPUT_TIME_FALLBACK",
        value_name = "WATCHBRIDGE_INPUT_TIME_FALLBACK",
        default_value = "dead_letter"
    )]
    pub input_time_fallback: String,
    /// Format of output record values: `json` or `avro`.
    #[arg(long, env = "WATCHBRIDGE_OUTPUT_FORMAT", value_name = "WATCHBRIDGE_OUTPUT_FORMAT", value_enum, default_value_t = OutputFormat::Json)]
    pub output_format: OutputFormat,
    /// An Avro schema file (.avsc) each output item is mapped onto (default: an envelope
    /// of output key, event time and the item as JSON text).
    #[arg(
        long,
        env = "WATCHBRIDGE_OUTPUT_SCHEMA",
        value_name = "WATCHBRIDGE_OUTPUT_SCHEMA"
    )]
    pub output_schema: Option<PathBuf>,
    /// Registry subject of the output schema: `topic` (`<topic>-value`), `record` (the
    /// record's full name) or `topic_record`.
    #[arg(
        long,
        env = "WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY",
        value_name = "WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY",
        default_value = "topic"
    )]
    pub output_subject_strategy: String,
    /// Base URL of a Confluent-compatible schema registry (http or https). (Its value is
    /// not shown by `--help`: a URL may carry credentials.)
    #[arg(
        long,
        env = "WATCHBRIDGE_SCHEMA_REGISTRY_URL",
        value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_URL",
        hide_env_values = true
    )]
    pub schema_registry_url: Option<String>,
    /// User for the registry's basic authentication (with WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD).
    #[arg(
        long,
        env = "WATCHBRIDGE_SCHEMA_REGISTRY_USER",
        value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_USER"
    )]
    pub schema_registry_user: Option<String>,
    /// Password for the registry's basic authentication.
    #[arg(
        long,
        env = "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD",
        value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD",
        hide_env_values = true
    )]
    pub schema_registry_password: Option<String>,
    /// Bearer token for the registry (instead of basic authentication).
    #[arg(
        long,
        env = "WATCHBRIDGE_SCHEMA_REGISTRY_TOKEN",
        value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_TOKEN",
        hide_env_values = true
    )]
    pub schema_registry_token: Option<String>,
    /// PEM file of certificates to trust for an https registry, besides the built-in roots.
    #[arg(
        long,
        env = "WATCHBRIDGE_SCHEMA_REGISTRY_CA_FILE",
        value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_CA_FILE"
    )]
    pub schema_registry_ca_file: Option<PathBuf>,
    /// Longest wait for one registry request.
    #[arg(long, env = "WATCHBRIDGE_SCHEMA_REGISTRY_TIMEOUT", value_name = "WATCHBRIDGE_SCHEMA_REGISTRY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub schema_registry_timeout: Duration,
}

/// `FormatArgs`, checked: files read, schemas parsed.
#[derive(Debug, Clone)]
pub struct FormatConfig {
    pub input_format: InputFormat,
    pub input_key_format: KeyFormat,
    pub input_schema: Option<Arc<Schema>>,
    /// How an input's event time is read (`WATCHBRIDGE_INPUT_TIME`, or a library user's
    /// assigner; `None`: its record timestamp).
    pub input_time: Option<Arc<dyn time::TimestampAssigner>>,
    pub output_format: OutputFormat,
    /// `None`: the envelope.
    pub output_schema: Option<Schema>,
    pub output_subject_strategy: output::SubjectStrategy,
    pub registry: Option<RegistrySettings>,
}

impl Default for FormatConfig {
    /// JSON in and out, the record key and timestamp: the bridge before formats.
    fn default() -> Self {
        Self {
            input_format: InputFormat::Json,
            input_key_format: KeyFormat::Raw,
            input_schema: None,
            input_time: None,
            output_format: OutputFormat::Json,
            output_schema: None,
            output_subject_strategy: output::SubjectStrategy::Topic,
            registry: None,
        }
    }
}

fn schema_file(var: &'static str, path: &PathBuf) -> Result<Schema, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(var, format!("cannot read `{}`: {e}", path.display())))?;
    Schema::parse_str(&text).map_err(|e| {
        ConfigError::new(
            var,
            format!("`{}` is not an Avro schema: {e}", path.display()),
        )
    })
}

impl FormatArgs {
    pub fn check(&self) -> Result<FormatConfig, ConfigError> {
        let registry = match &self.schema_registry_url {
            None => None,
            Some(url) => Some(self.registry(url)?),
        };
        let input_schema = match &self.input_schema {
            Some(path) => Some(Arc::new(schema_file("WATCHBRIDGE_INPUT_SCHEMA", path)?)),
            None => None,
        };
        if self.input_format == InputFormat::Avro && registry.is_none() && input_schema.is_none() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_INPUT_FORMAT",
                "`avro` needs WATCHBRIDGE_SCHEMA_REGISTRY_URL (values in the Confluent wire format) or WATCHBRIDGE_INPUT_SCHEMA (bare datums of that schema)",
            ));
        }
        if self.input_format != InputFormat::Avro && input_schema.is_some() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_INPUT_SCHEMA",
                "is only read with WATCHBRIDGE_INPUT_FORMAT=avro",
            ));
        }
        if self.input_key_format == KeyFormat::Avro && registry.is_none() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_INPUT_KEY_FORMAT",
                "`avro` needs WATCHBRIDGE_SCHEMA_REGISTRY_URL (keys in the Confluent wire format)",
            ));
        }
        let input_time = match &self.input_time {
            None => None,
            Some(p) if !p.starts_with('/') => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_INPUT_TIME",
                    format!("`{p}` is not a JSON pointer: write `/{p}`"),
                ))
            }
            Some(p) => Some(time::InputTime {
                pointer: p.clone(),
                unit: self
                    .input_time_unit
                    .parse()
                    .map_err(|e| ConfigError::new("WATCHBRIDGE_INPUT_TIME_UNIT", e))?,
                fallback: self
                    .input_time_fallback
                    .parse()
                    .map_err(|e| ConfigError::new("WATCHBRIDGE_INPUT_TIME_FALLBACK", e))?,
            }),
        };
        let output_schema = match &self.output_schema {
            Some(path) => Some(schema_file("WATCHBRIDGE_OUTPUT_SCHEMA", path)?),
            None => None,
        };
        if self.output_format == OutputFormat::Avro && registry.is_none() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_OUTPUT_FORMAT",
                "`avro` needs WATCHBRIDGE_SCHEMA_REGISTRY_URL (the output schema is registered there)",
            ));
        }
        if self.output_format != OutputFormat::Avro && output_schema.is_some() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_OUTPUT_SCHEMA",
                "is only used with WATCHBRIDGE_OUTPUT_FORMAT=avro",
            ));
        }
        let output_subject_strategy: output::SubjectStrategy = self
            .output_subject_strategy
            .parse()
            .map_err(|e| ConfigError::new("WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY", e))?;
        if let Some(schema) = &output_schema {
            output_subject_strategy
                .subject("topic", schema)
                .map_err(|e| ConfigError::new("WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY", e))?;
        }
        Ok(FormatConfig {
            input_format: self.input_format,
            input_key_format: self.input_key_format,
            input_schema,
            input_time: input_time.map(|t| Arc::new(t) as Arc<dyn time::TimestampAssigner>),
            output_format: self.output_format,
            output_schema,
            output_subject_strategy,
            registry,
        })
    }

    fn registry(&self, url: &str) -> Result<RegistrySettings, ConfigError> {
        const VAR: &str = "WATCHBRIDGE_SCHEMA_REGISTRY_URL";
        let parsed = url::Url::parse(url).map_err(|e| {
            ConfigError::new(
                VAR,
                format!("`{}` is not a URL: {e}", crate::logging::url(url)),
            )
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ConfigError::new(VAR, "must be an http or https URL"));
        }
        let auth = match (
            &self.schema_registry_user,
            &self.schema_registry_password,
            &self.schema_registry_token,
        ) {
            (None, None, None) => RegistryAuth::None,
            (None, None, Some(token)) => RegistryAuth::Bearer(token.clone()),
            (Some(user), Some(password), None) => RegistryAuth::Basic {
                user: user.clone(),
                password: password.clone(),
            },
            (_, _, Some(_)) => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_SCHEMA_REGISTRY_TOKEN",
                    "set either a token or a user and password, not both",
                ))
            }
            (Some(_), None, None) => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD",
                    "is needed with WATCHBRIDGE_SCHEMA_REGISTRY_USER",
                ))
            }
            (None, Some(_), None) => {
                return Err(ConfigError::new(
                    "WATCHBRIDGE_SCHEMA_REGISTRY_USER",
                    "is needed with WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD",
                ))
            }
        };
        let ca_pem = match &self.schema_registry_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                ConfigError::new(
                    "WATCHBRIDGE_SCHEMA_REGISTRY_CA_FILE",
                    format!("cannot read `{}`: {e}", path.display()),
                )
            })?),
            None => None,
        };
        if self.schema_registry_timeout.is_zero() {
            return Err(ConfigError::new(
                "WATCHBRIDGE_SCHEMA_REGISTRY_TIMEOUT",
                "must be more than zero",
            ));
        }
        Ok(RegistrySettings {
            url: parsed,
            auth,
            ca_pem,
            timeout: self.schema_registry_timeout,
        })
    }
}

/// What the bridge reads and writes with, ready: the registry client, the input decoder
/// and the output encoder (its schema registered).
pub struct Formats {
    pub decoder: Arc<input::InputDecoder>,
    pub encoder: Arc<output::OutputEncoder>,
}

/// The most one Avro value may make the decoder allocate at once (a string, bytes, an
/// array's items). A datum cannot hold more than its record, but a few hostile bytes can
/// declare a 500 MB string; apache-avro's own limit (512 MiB) would allocate that much
/// before finding the datum short.
pub const AVRO_MAX_ALLOCATION: usize = 64 * 1024 * 1024;

/// Set [`AVRO_MAX_ALLOCATION`] for the process (the first call wins; apache-avro keeps it
/// in a global).
pub fn limit_avro_allocations() -> usize {
    apache_avro::util::max_allocation_bytes(AVRO_MAX_ALLOCATION)
}

impl FormatConfig {
    /// The schema Avro outputs are written with, and whether it is the user's
    /// (`WATCHBRIDGE_OUTPUT_SCHEMA`) rather than the envelope.
    pub fn avro_output_schema(&self) -> Result<(Schema, bool), String> {
        match &self.output_schema {
            Some(s) => Ok((s.clone(), true)),
            None => Schema::parse_str(output::ENVELOPE_SCHEMA)
                .map(|s| (s, false))
                .map_err(|e| format!("the envelope schema: {e}")),
        }
    }

    /// Build the decoder and encoder; registers the output schema (retrying while the
    /// registry does not answer, until `deadline`).
    pub async fn start(
        &self,
        watch_key: Option<String>,
        output_topic: &str,
        metrics: &Arc<Metrics>,
        deadline: tokio::time::Instant,
    ) -> Result<Formats, String> {
        limit_avro_allocations();
        let registry = match &self.registry {
            Some(settings) => Some(Arc::new(
                RegistryClient::new(settings.clone(), metrics.clone())
                    .map_err(|e| format!("WATCHBRIDGE_SCHEMA_REGISTRY_CA_FILE: {e}"))?,
            )),
            None => None,
        };
        let encoder = match (self.output_format, &registry) {
            (OutputFormat::Avro, Some(registry)) => {
                let (schema, user_schema) = self.avro_output_schema()?;
                let subject = self
                    .output_subject_strategy
                    .subject(output_topic, &schema)?;
                let id = register_until(registry, &subject, &schema, deadline).await?;
                tracing::info!(subject, id, "output schema registered");
                output::OutputEncoder::Avro {
                    id,
                    schema,
                    user_schema,
                }
            }
            _ => output::OutputEncoder::Json,
        };
        let decoder = input::InputDecoder {
            value_format: self.input_format,
            key_format: self.input_key_format,
            registry,
            schema: self.input_schema.clone(),
            watch_key,
            time: self.input_time.clone(),
        };
        Ok(Formats {
            decoder: Arc::new(decoder),
            encoder: Arc::new(encoder),
        })
    }
}

async fn register_until(
    registry: &RegistryClient,
    subject: &str,
    schema: &Schema,
    deadline: tokio::time::Instant,
) -> Result<u32, String> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match registry.register(subject, schema).await {
            Ok(id) => return Ok(id),
            Err(e) if tokio::time::Instant::now() + backoff < deadline => {
                tracing::warn!(subject, error = %e, "cannot register the output schema yet; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                return Err(format!(
                    "cannot register the output schema under the subject `{subject}` (WATCHBRIDGE_SCHEMA_REGISTRY_URL): {e}"
                ))
            }
        }
    }
}

impl FormatArgs {
    /// The format settings from the environment alone, defaults for the rest (for
    /// commands that build their run settings in code, such as `watchbridge demo`).
    pub fn from_env() -> Result<Self, clap::Error> {
        use clap::{Args, FromArgMatches};
        let command = Self::augment_args(clap::Command::new("formats").no_binary_name(true));
        Self::from_arg_matches(&command.try_get_matches_from(Vec::<String>::new())?)
    }
}

impl Default for FormatArgs {
    /// The defaults `--help` lists: JSON in and out, the record key and timestamp.
    fn default() -> Self {
        Self {
            input_format: InputFormat::Json,
            input_key_format: KeyFormat::Raw,
            input_schema: None,
            input_time: None,
            input_time_unit: "ms".into(),
            input_time_fallback: "dead_letter".into(),
            output_format: OutputFormat::Json,
            output_schema: None,
            output_subject_strategy: "topic".into(),
            schema_registry_url: None,
            schema_registry_user: None,
            schema_registry_password: None,
            schema_registry_token: None,
            schema_registry_ca_file: None,
            schema_registry_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("s.avsc");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn error(args: FormatArgs) -> ConfigError {
        args.check().expect_err("a bad setting")
    }

    #[test]
    fn the_defaults_are_json_in_and_out() {
        let c = FormatArgs::default().check().unwrap();
        assert_eq!(c.input_format, InputFormat::Json);
        assert_eq!(c.output_format, OutputFormat::Json);
        assert!(c.registry.is_none() && c.input_time.is_none());
    }

    #[test]
    fn bad_format_settings_name_their_variable() {
        let avro_in = FormatArgs {
            input_format: InputFormat::Avro,
            ..Default::default()
        };
        assert_eq!(error(avro_in).var, "WATCHBRIDGE_INPUT_FORMAT");
        let avro_out = FormatArgs {
            output_format: OutputFormat::Avro,
            ..Default::default()
        };
        assert_eq!(error(avro_out).var, "WATCHBRIDGE_OUTPUT_FORMAT");
        let avro_key = FormatArgs {
            input_key_format: KeyFormat::Avro,
            ..Default::default()
        };
        assert_eq!(error(avro_key).var, "WATCHBRIDGE_INPUT_KEY_FORMAT");
        let time = FormatArgs {
            input_time: Some("ts".into()),
            ..Default::default()
        };
        assert!(error(time).message.contains("`/ts`"));
        let unit = FormatArgs {
            input_time: Some("/ts".into()),
            input_time_unit: "minutes".into(),
            ..Default::default()
        };
        assert_eq!(error(unit).var, "WATCHBRIDGE_INPUT_TIME_UNIT");
        let url = FormatArgs {
            schema_registry_url: Some("ftp://registry".into()),
            ..Default::default()
        };
        assert_eq!(error(url).var, "WATCHBRIDGE_SCHEMA_REGISTRY_URL");
        let half = FormatArgs {
            schema_registry_url: Some("http://registry:8081".into()),
            schema_registry_user: Some("u".into()),
            ..Default::default()
        };
        assert_eq!(error(half).var, "WATCHBRIDGE_SCHEMA_REGISTRY_PASSWORD");
        let missing = FormatArgs {
            input_format: InputFormat::Avro,
            input_schema: Some("/nonexistent/x.avsc".into()),
            ..Default::default()
        };
        let e = error(missing);
        assert_eq!(e.var, "WATCHBRIDGE_INPUT_SCHEMA");
        assert!(e.message.contains("/nonexistent/x.avsc"), "{}", e.message);
        let dir = tempfile::tempdir().unwrap();
        let not_avro = FormatArgs {
            input_format: InputFormat::Avro,
            input_schema: Some(schema_file(&dir, r#"{"type": "recrod"}"#)),
            ..Default::default()
        };
        assert!(error(not_avro).message.contains("not an Avro schema"));
        let unnamed = FormatArgs {
            schema_registry_url: Some("http://registry:8081".into()),
            output_format: OutputFormat::Avro,
            output_schema: Some(schema_file(&dir, r#""string""#)),
            output_subject_strategy: "record".into(),
            ..Default::default()
        };
        assert_eq!(error(unnamed).var, "WATCHBRIDGE_OUTPUT_SUBJECT_STRATEGY");
    }

    #[test]
    fn a_registry_with_credentials_and_a_time_field() {
        let c = FormatArgs {
            schema_registry_url: Some("https://registry.example:8081/base".into()),
            schema_registry_token: Some("t".into()),
            input_format: InputFormat::Avro,
            input_time: Some("/at".into()),
            input_time_unit: "s".into(),
            input_time_fallback: "record_timestamp".into(),
            ..Default::default()
        }
        .check()
        .unwrap();
        let registry = c.registry.unwrap();
        assert_eq!(registry.auth, RegistryAuth::Bearer("t".into()));
        assert_eq!(registry.url.path(), "/base");
        // Seconds, and the record timestamp when the field is missing.
        let time = c.input_time.unwrap();
        let value = serde_json::json!({"at": 5});
        assert_eq!(time.extract_timestamp(&value, 1), Ok(5_000));
        assert_eq!(time.extract_timestamp(&serde_json::json!({}), 7), Ok(7));
    }
}

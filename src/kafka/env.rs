//! `KAFKA_*` variables → librdkafka properties. `KAFKA_SECURITY_PROTOCOL=SASL_SSL` becomes
//! (`security.protocol`, `SASL_SSL`): lower case, `_` → `.`. `KAFKA_CONSUMER_*` and
//! `KAFKA_PRODUCER_*` name a property for one kind of client ([`super::properties`]). In
//! the Kafka layer, so that `run`'s settings (`crate::config`) and the small clients
//! (`kafka/tools.rs`) read them alike, and the clients never reach up into the settings.
//!
//! Three things in a real environment are not properties, and each is handled here, once,
//! for `run` and the small clients alike:
//! - Kubernetes' service links: a Service named `kafka` gives every pod of its namespace
//!   `KAFKA_PORT=tcp://…`, `KAFKA_PORT_9092_TCP…` and `KAFKA_SERVICE_HOST/PORT…`. They are
//!   skipped, with one line saying so (librdkafka refused `port` and the start stopped).
//! - A secret mounted as a file: `KAFKA_SASL_PASSWORD_FILE=/run/secrets/pw` gives
//!   `sasl.password` the file's contents (one trailing line end dropped). librdkafka reads
//!   a property once, when a client is made: a changed file counts from the next start.
//! - The brokers: `WATCHBRIDGE_BROKERS` is the one setting. `KAFKA_BOOTSTRAP_SERVERS` (or
//!   `metadata.broker.list`) would win over it in some clients and not in others, so it is
//!   refused, naming both.

use crate::config_error::ConfigError;
use crate::secrets::read_secret_file;
use std::collections::BTreeMap;

/// The librdkafka properties the environment gives, by the clients they are for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties {
    /// `KAFKA_*`: every client.
    pub all: Vec<(String, String)>,
    /// `KAFKA_CONSUMER_*`: consumers only.
    pub consumer: Vec<(String, String)>,
    /// `KAFKA_PRODUCER_*`: producers only.
    pub producer: Vec<(String, String)>,
}

/// The properties of `env`, each checked by librdkafka; an error names the variable.
pub fn kafka_properties(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<KafkaProperties, ConfigError> {
    let mut service_links = Vec::new();
    let mut variables = BTreeMap::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("KAFKA_") else {
            continue;
        };
        if rest.is_empty() {
            continue;
        }
        if is_service_link(rest) {
            service_links.push(name);
            continue;
        }
        variables.insert(name, value);
    }
    if !service_links.is_empty() {
        tracing::info!(
            variables = service_links.join(","),
            "ignoring Kubernetes service-link variables: they are not librdkafka properties \
             (the brokers are WATCHBRIDGE_BROKERS; enableServiceLinks: false in the pod spec \
             leaves them out)"
        );
    }
    let variables = read_secret_files(variables)?;
    let mut props = KafkaProperties::default();
    for (name, value) in variables {
        let rest = &name["KAFKA_".len()..];
        let (list, prefix, property) = if let Some(p) = rest.strip_prefix("CONSUMER_") {
            (&mut props.consumer, "KAFKA_CONSUMER", p)
        } else if let Some(p) = rest.strip_prefix("PRODUCER_") {
            (&mut props.producer, "KAFKA_PRODUCER", p)
        } else {
            (&mut props.all, "KAFKA", rest)
        };
        if property.is_empty() {
            continue;
        }
        let key = property.to_ascii_lowercase().replace('_', ".");
        check(prefix, &key, &value)?;
        list.push((key, value));
    }
    Ok(props)
}

/// `PORT`, `PORT_9092_TCP…`, `SERVICE_HOST`, `SERVICE_PORT…` after `KAFKA_`: no librdkafka
/// property starts with `port` or `service`.
fn is_service_link(rest: &str) -> bool {
    rest == "PORT" || rest.starts_with("PORT_") || rest.starts_with("SERVICE_")
}

/// `KAFKA_X_FILE=path` → `KAFKA_X` = the file's contents. No librdkafka property ends in
/// `.file`, so the suffix is free for this.
fn read_secret_files(
    variables: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut read = BTreeMap::new();
    for (name, value) in &variables {
        let Some(base) = name.strip_suffix("_FILE") else {
            read.insert(name.clone(), value.clone());
            continue;
        };
        if variables.contains_key(base) {
            return Err(ConfigError::new(
                name.clone(),
                format!("both {base} and {name} are set: keep one"),
            ));
        }
        let secret = read_secret_file(value).map_err(|e| ConfigError::new(name.clone(), e))?;
        read.insert(base.to_string(), secret);
    }
    Ok(read)
}

/// librdkafka refuses unknown properties and bad values; say which variable it was. The
/// brokers are `WATCHBRIDGE_BROKERS`'s alone.
fn check(prefix: &str, key: &str, value: &str) -> Result<(), ConfigError> {
    let var = format!("{prefix}_{}", key.to_ascii_uppercase().replace('.', "_"));
    if key == "bootstrap.servers" || key == "metadata.broker.list" {
        return Err(ConfigError::new(
            var,
            "the brokers are set by WATCHBRIDGE_BROKERS (or --brokers) alone: put the list \
             there and unset this one",
        ));
    }
    let mut one = rdkafka::ClientConfig::new();
    one.set(key, value);
    if let Err(e) = one.create_native_config() {
        // librdkafka's message may quote the value: not for secrets.
        let why = if crate::secrets::is_secret(key) {
            "the value is refused".to_string()
        } else {
            e.to_string()
        };
        return Err(ConfigError::new(
            var,
            format!("librdkafka property `{key}`: {why}"),
        ));
    }
    Ok(())
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

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        env(list)
    }

    #[test]
    fn kafka_variables_become_librdkafka_properties_of_their_clients() {
        let props = kafka_properties(env(&[
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_PASSWORD", "pw"),
            ("KAFKA_", "ignored"),
            ("PATH", "/bin"),
            ("KAFKA_CONSUMER_FETCH_MAX_BYTES", "1000000"),
            ("KAFKA_PRODUCER_LINGER_MS", "20"),
        ]))
        .unwrap();
        assert_eq!(props.consumer, pairs(&[("fetch.max.bytes", "1000000")]));
        assert_eq!(props.producer, pairs(&[("linger.ms", "20")]));
        assert_eq!(
            props.all,
            pairs(&[
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.password", "pw"),
                ("security.protocol", "SASL_SSL"),
            ])
        );
    }

    #[test]
    fn service_links_are_skipped_and_nothing_else() {
        let props = kafka_properties(env(&[
            ("KAFKA_PORT", "tcp://10.0.0.1:9092"),
            ("KAFKA_PORT_9092_TCP_ADDR", "10.0.0.1"),
            ("KAFKA_SERVICE_HOST", "10.0.0.1"),
            ("KAFKA_SERVICE_PORT_BROKER", "9092"),
            ("KAFKA_SASL_KERBEROS_SERVICE_NAME", "kafka"),
        ]))
        .unwrap();
        assert_eq!(props.all, pairs(&[("sasl.kerberos.service.name", "kafka")]));
    }

    #[test]
    fn a_secret_comes_from_its_file_and_both_forms_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let path = file.to_str().unwrap();
        let props = kafka_properties(env(&[
            ("KAFKA_SASL_PASSWORD_FILE", path),
            ("KAFKA_PRODUCER_SSL_KEY_PASSWORD_FILE", path),
        ]))
        .unwrap();
        assert_eq!(props.all, pairs(&[("sasl.password", "s3cret")]));
        assert_eq!(props.producer, pairs(&[("ssl.key.password", "s3cret")]));
        let e = kafka_properties(env(&[
            ("KAFKA_SASL_PASSWORD_FILE", path),
            ("KAFKA_SASL_PASSWORD", "inline"),
        ]))
        .unwrap_err();
        assert_eq!(e.var, "KAFKA_SASL_PASSWORD_FILE");
        assert!(e.message.contains("both") && !e.message.contains("inline"));
        let e =
            kafka_properties(env(&[("KAFKA_SASL_PASSWORD_FILE", "/nonexistent/pw")])).unwrap_err();
        assert_eq!(e.var, "KAFKA_SASL_PASSWORD_FILE");
        assert!(e.message.contains("/nonexistent/pw"), "{e}");
    }

    #[test]
    fn the_brokers_are_watchbridge_brokers_alone() {
        for var in [
            "KAFKA_BOOTSTRAP_SERVERS",
            "KAFKA_METADATA_BROKER_LIST",
            "KAFKA_CONSUMER_BOOTSTRAP_SERVERS",
        ] {
            let e = kafka_properties(env(&[(var, "a:9092")])).unwrap_err();
            assert_eq!(e.var, var);
            assert!(e.message.contains("WATCHBRIDGE_BROKERS"), "{e}");
        }
    }

    #[test]
    fn a_property_librdkafka_refuses_is_named_without_its_secret_value() {
        let e = kafka_properties(env(&[("KAFKA_NO_SUCH_THING", "1")])).unwrap_err();
        assert_eq!(e.var, "KAFKA_NO_SUCH_THING");
        assert!(e.message.contains("no.such.thing"), "{e}");
        let e = kafka_properties(env(&[("KAFKA_ACKS", "sometimes")])).unwrap_err();
        assert_eq!(e.var, "KAFKA_ACKS");
    }
}

//! A client of a Confluent-compatible schema registry: the writer schema of an id (cached,
//! with the schemas it references), and the id a schema is registered under.
//!
//! Written here rather than taken from `schema_registry_converter` (6.0), which the bridge
//! cannot use as is: it treats every HTTP status but 502 and 503 as permanent and caches
//! it, so a registry answering 500 or 504 during an outage would send inputs to the
//! dead-letter topic, and it brings a second HTTP and TLS stack (reqwest 0.13 on OpenSSL)
//! beside the HTTP poller's. The protocol is three requests; the Avro work is
//! `apache-avro`'s.
//!
//! What the bridge needs from the answers: *not found* is a fact about the record (its id
//! is unknown: dead letter), anything else (a refused connection, a timeout, a 5xx, a 401)
//! is the registry's trouble: the caller retries and loses nothing.

use crate::internal_events::SchemaRegistryRequest;
use crate::metrics::Metrics;
use apache_avro::Schema;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the registry is reached (`WATCHBRIDGE_SCHEMA_REGISTRY_*`).
#[derive(Debug, Clone)]
pub struct RegistrySettings {
    pub url: url::Url,
    pub auth: RegistryAuth,
    /// PEM certificates trusted besides the built-in roots (a private CA).
    pub ca_pem: Option<Vec<u8>>,
    pub timeout: Duration,
}

#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    None,
    Basic { user: String, password: String },
    Bearer(String),
}

impl std::fmt::Debug for RegistryAuth {
    // Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => write!(f, "None"),
            Self::Basic { user, .. } => write!(f, "Basic({user}, ***)"),
            Self::Bearer(_) => write!(f, "Bearer(***)"),
        }
    }
}

/// A writer schema, parsed, with the named schemas it references.
#[derive(Debug)]
pub struct WriterSchema {
    pub id: u32,
    pub schema: Schema,
    pub references: Vec<Schema>,
}

/// The registry does not know the id (or what it holds is not an Avro schema the bridge
/// can read): the record's fault, not the registry's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema id {id}: {reason}")]
pub struct UnknownSchema {
    pub id: u32,
    pub reason: String,
}

/// The registry could not answer: try again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the schema registry is unavailable: {0}")]
pub struct Unavailable(pub String);

/// What a subject is escaped with in a URL path: everything but RFC 3986's unreserved
/// characters (so `a.b-value` stays readable, `/` cannot split the path).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// An id known unknown is asked again after this long (the registry may have been
/// restored, or a replica was behind).
const UNKNOWN_FOR: Duration = Duration::from_secs(60);

pub struct RegistryClient {
    http: reqwest::Client,
    settings: RegistrySettings,
    cache: Mutex<Cache>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Cache {
    found: HashMap<u32, Arc<WriterSchema>>,
    unknown: HashMap<u32, (UnknownSchema, Instant)>,
}

/// One answer of the registry, parsed.
#[derive(serde::Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

#[derive(serde::Deserialize, serde::Serialize, Clone)]
struct Reference {
    name: String,
    subject: String,
    version: i64,
}

impl RegistryClient {
    pub fn new(settings: RegistrySettings, metrics: Arc<Metrics>) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout);
        if let Some(pem) = &settings.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("not PEM certificates: {e}"))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| e.to_string())?;
        Ok(Self {
            http,
            settings,
            cache: Mutex::new(Cache::default()),
            metrics,
        })
    }

    /// The writer schema of `id` if it is cached (no request): `None` when it must be
    /// fetched.
    pub fn cached(&self, id: u32) -> Option<Result<Arc<WriterSchema>, UnknownSchema>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = cache.found.get(&id) {
            return Some(Ok(found.clone()));
        }
        match cache.unknown.get(&id) {
            Some((unknown, at)) if at.elapsed() < UNKNOWN_FOR => Some(Err(unknown.clone())),
            _ => None,
        }
    }

    /// Fetch the writer schema of `id` (and what it references), and cache the answer.
    pub async fn fetch(
        &self,
        id: u32,
    ) -> Result<Result<Arc<WriterSchema>, UnknownSchema>, Unavailable> {
        let answer = match self
            .get_json(&format!("schemas/ids/{id}"), "schema")
            .await?
        {
            Some(answer) => answer,
            None => return Ok(Err(self.remember_unknown(id, "not found in the registry"))),
        };
        let parsed = self.parse(id, answer).await?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match parsed {
            Ok(schema) => {
                let schema = Arc::new(schema);
                cache.found.insert(id, schema.clone());
                self.metrics.schema_cache_size.set(cache.found.len() as i64);
                Ok(Ok(schema))
            }
            Err(reason) => {
                drop(cache);
                Ok(Err(self.remember_unknown(id, &reason)))
            }
        }
    }

    fn remember_unknown(&self, id: u32, reason: &str) -> UnknownSchema {
        let unknown = UnknownSchema {
            id,
            reason: reason.to_string(),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.unknown.insert(id, (unknown.clone(), Instant::now()));
        unknown
    }

    /// The schema of an answer with every reference it names (fetched by subject and
    /// version, depth first), parsed together. `Err` (inside): not a usable Avro schema.
    async fn parse(
        &self,
        id: u32,
        answer: SchemaAnswer,
    ) -> Result<Result<WriterSchema, String>, Unavailable> {
        if let Some(kind) = answer.schema_type.as_deref().filter(|k| *k != "AVRO") {
            return Ok(Err(format!("is a {kind} schema, not Avro")));
        }
        let mut texts = Vec::new();
        let mut pending = answer.references.clone();
        let mut fetched = std::collections::HashSet::new();
        while let Some(r) = pending.pop() {
            if !fetched.insert((r.subject.clone(), r.version)) || fetched.len() > 100 {
                continue;
            }
            let path = format!(
                "subjects/{}/versions/{}",
                percent_encoding::utf8_percent_encode(
                    &r.subject,
                    percent_encoding::NON_ALPHANUMERIC
                ),
                r.version
            );
            match self.get_json(&path, "reference").await? {
                Some(referenced) => {
                    pending.extend(referenced.references.iter().cloned());
                    texts.push(referenced.schema);
                }
                None => {
                    return Ok(Err(format!(
                        "its reference {} ({} version {}) is not in the registry",
                        r.name, r.subject, r.version
                    )))
                }
            }
        }
        let parsed = if texts.is_empty() {
            Schema::parse_str(&answer.schema).map(|s| (s, Vec::new()))
        } else {
            Schema::parse_str_with_list(&answer.schema, &texts)
        };
        Ok(parsed
            .map(|(schema, references)| WriterSchema {
                id,
                schema,
                references,
            })
            .map_err(|e| format!("not a valid Avro schema: {e}")))
    }

    /// Register `schema` under `subject` (or find it there): its id.
    pub async fn register(&self, subject: &str, schema: &Schema) -> Result<u32, Unavailable> {
        #[derive(serde::Deserialize)]
        struct Id {
            id: u32,
        }
        let path = format!(
            "subjects/{}/versions",
            percent_encoding::utf8_percent_encode(subject, SEGMENT)
        );
        // The full schema, not its Parsing Canonical Form: that one drops logical types
        // (a consumer would read `timestamp-millis` as a plain long) and docs.
        let text = serde_json::to_string(schema)
            .map_err(|e| Unavailable(format!("the schema does not serialize: {e}")))?;
        let body = serde_json::json!({ "schema": text });
        let request = self
            .request(reqwest::Method::POST, &path)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/vnd.schemaregistry.v1+json",
            )
            .body(body.to_string());
        let answer = self.send(request, "register").await?;
        match answer {
            Some(bytes) => serde_json::from_slice::<Id>(&bytes)
                .map(|i| i.id)
                .map_err(|e| {
                    Unavailable(format!(
                        "its answer to a registration is not {{\"id\": n}}: {e}"
                    ))
                }),
            None => Err(Unavailable(format!(
                "registering a schema under the subject `{subject}` was answered 404"
            ))),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut url = self.settings.url.clone();
        {
            let base = url.path().trim_end_matches('/').to_string();
            url.set_path(&format!("{base}/{path}"));
        }
        let request = self.http.request(method, url).header(
            reqwest::header::ACCEPT,
            "application/vnd.schemaregistry.v1+json",
        );
        match &self.settings.auth {
            RegistryAuth::None => request,
            RegistryAuth::Basic { user, password } => request.basic_auth(user, Some(password)),
            RegistryAuth::Bearer(token) => request.bearer_auth(token),
        }
    }

    async fn get_json(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<Option<SchemaAnswer>, Unavailable> {
        let request = self.request(reqwest::Method::GET, path);
        match self.send(request, what).await? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                let error = format!("its answer is not a schema: {e}");
                Unavailable(error)
            }),
        }
    }

    /// Send and classify: `Ok(Some(body))` on success, `Ok(None)` on 404, else
    /// [`Unavailable`]. Every request is logged (failures) and counted by result.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &'static str,
    ) -> Result<Option<bytes::Bytes>, Unavailable> {
        let result = async {
            let response = request.send().await.map_err(|e| {
                Unavailable(crate::logging::redact_url(&e.to_string()).into_owned())
            })?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .map_err(|e| Unavailable(format!("reading its answer: {e}")))?;
            if status.is_success() {
                Ok(Some(body))
            } else if status == reqwest::StatusCode::NOT_FOUND {
                Ok(None)
            } else {
                Err(Unavailable(format!(
                    "answered {status}: {}",
                    crate::logging::outside(&String::from_utf8_lossy(&body))
                )))
            }
        }
        .await;
        SchemaRegistryRequest {
            request: what,
            result: &result,
        }
        .emit(&self.metrics);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::registry_server::RegistryServer;

    const USER: &str = r#"{"type":"record","name":"User","fields":[{"name":"id","type":"long"}]}"#;

    fn client(server: &RegistryServer, auth: RegistryAuth) -> (RegistryClient, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let settings = RegistrySettings {
            url: server.url().parse().unwrap(),
            auth,
            ca_pem: None,
            timeout: Duration::from_secs(5),
        };
        (
            RegistryClient::new(settings, metrics.clone()).unwrap(),
            metrics,
        )
    }

    fn count(m: &Metrics, request: &str, result: &str) -> u64 {
        m.schema_registry_requests
            .with_label_values(&[request, result])
            .get()
    }

    #[tokio::test]
    async fn a_schema_is_fetched_once_and_cached_by_id() {
        let server = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let id = server.register("users-value", USER);
        let (client, metrics) = client(&server, RegistryAuth::None);
        assert!(client.cached(id).is_none());
        let schema = client.fetch(id).await.unwrap().unwrap();
        assert_eq!(schema.id, id);
        assert!(matches!(schema.schema, Schema::Record(_)));
        let requests = server.requests();
        assert!(client.cached(id).unwrap().is_ok(), "cached, no request");
        assert_eq!(server.requests(), requests);
        assert_eq!(count(&metrics, "schema", "ok"), 1);
        assert_eq!(metrics.schema_cache_size.get(), 1);
    }

    #[tokio::test]
    async fn an_unknown_id_is_the_records_fault_and_an_outage_is_the_registrys() {
        let server = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let (client, metrics) = client(&server, RegistryAuth::None);
        let unknown = client.fetch(4242).await.unwrap().unwrap_err();
        assert!(unknown.to_string().contains("4242"), "{unknown}");
        assert_eq!(count(&metrics, "schema", "not_found"), 1);
        assert!(
            client.cached(4242).unwrap().is_err(),
            "remembered for a while"
        );
        let id = server.register("users-value", USER);
        for status in [500, 503, 504, 429] {
            server.fail_with(Some(status));
            let e = client.fetch(id).await.unwrap_err();
            assert!(e.to_string().contains(&status.to_string()), "{e}");
            assert!(client.cached(id).is_none(), "an outage is never cached");
        }
        assert_eq!(count(&metrics, "schema", "unavailable"), 4);
        server.fail_with(None);
        assert!(client.fetch(id).await.unwrap().is_ok());
        // Nothing listening: unavailable too.
        server.shutdown();
        let gone = client.fetch(id + 1).await;
        assert!(gone.is_err(), "{gone:?}");
    }

    #[tokio::test]
    async fn credentials_are_sent_and_a_refusal_is_retried_not_dead_lettered() {
        let server = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let id = server.register("users-value", USER);
        // `user:secret` in base64.
        server.require_auth(Some("Basic dXNlcjpzZWNyZXQ=".into()));
        let (basic, _) = client(
            &server,
            RegistryAuth::Basic {
                user: "user".into(),
                password: "secret".into(),
            },
        );
        assert!(basic.fetch(id).await.unwrap().is_ok());
        let (wrong, _) = client(&server, RegistryAuth::Bearer("nope".into()));
        let e = wrong.fetch(id).await.unwrap_err();
        assert!(e.to_string().contains("401"), "{e}");
        assert!(!format!("{:?}", RegistryAuth::Bearer("nope".into())).contains("nope"));
        server.require_auth(Some("Bearer t0k".into()));
        let (bearer, _) = client(&server, RegistryAuth::Bearer("t0k".into()));
        assert!(bearer.fetch(id).await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn registering_gives_the_same_id_for_the_same_schema() {
        let server = RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let (client, metrics) = client(&server, RegistryAuth::None);
        let schema = Schema::parse_str(crate::formats::output::ENVELOPE_SCHEMA).unwrap();
        let id = client.register("out-value", &schema).await.unwrap();
        assert_eq!(client.register("out-value", &schema).await.unwrap(), id);
        assert_eq!(count(&metrics, "register", "ok"), 2);
        // What is registered keeps its logical types (a consumer reads timestamps).
        let fetched = client.fetch(id).await.unwrap().unwrap();
        assert_eq!(fetched.schema, schema);
    }
}

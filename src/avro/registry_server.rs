//! An in-memory schema registry speaking the Confluent Schema Registry's REST protocol, on
//! loopback: the demo's embedded registry (beside its embedded broker), and the one tests
//! and benches run the bridge and real registry clients against. It keeps nothing; it is a
//! stand-in for the real service, not a replacement.
//!
//! What it answers (JSON bodies, content type `application/vnd.schemaregistry.v1+json`;
//! query parameters such as `?normalize=false`, `?subject=…` or `?fetchMaxId=false` are
//! accepted and ignored):
//!
//! | request | answer |
//! |---|---|
//! | `GET /schemas/ids/{id}` | `{"schema", "schemaType" (when not AVRO), "references" (when any)}` |
//! | `GET /schemas/ids/{id}/versions` | `[{"subject", "version"}]` |
//! | `POST /subjects/{subject}/versions` | register: `{"id"}` |
//! | `POST /subjects/{subject}` | lookup: `{"subject", "id", "version", "schema"}` |
//! | `GET /subjects/{subject}/versions/latest` and `/versions/{n}` | `{"subject", "id", "version", "schema"}` |
//! | `GET /subjects` | the subjects' names |
//! | `GET /subjects/{subject}/versions` | the subject's version numbers |
//! | `GET /config`, `GET /config/{subject}` | `{"compatibilityLevel": "BACKWARD"}` (never enforced) |
//!
//! As in the real registry, ids are global: the same schema under the same subject answers
//! its existing id and version, and under another subject it gets a new version there with
//! the same id. Schemas are the same when their Avro canonical forms are (Parsing Canonical
//! Form, [`apache_avro::Schema::canonical_form`]); other schema types (JSON, PROTOBUF) are
//! stored as they come, compared by their text, and not checked. Errors are the registry's
//! JSON `{"error_code": 40403, "message": "Schema not found"}`: 40401 subject not found,
//! 40402 version not found, 40403 schema not found, 42201 invalid schema (status 422), 400
//! a body that is not the JSON expected, 404 and 405 an unknown path or method. (Anything
//! else is such a 404, among them `GET /associations/resources/{namespace}/{topic}`, which
//! confluent-kafka-python 2.16's deserializer asks first, by its default subject strategy,
//! and reads as "no associations", as from a registry without them.)
//!
//! Test hooks, to play a registry that is down, slow or locked: [`RegistryServer::fail_with`],
//! [`RegistryServer::set_delay`], [`RegistryServer::require_auth`]; and what it was asked:
//! [`RegistryServer::requests`], [`RegistryServer::requests_to`],
//! [`RegistryServer::request_log`]. [`RegistryServer::register`] registers from Rust.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use percent_encoding::percent_decode_str;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpListener;

/// The content type of every answer.
pub const CONTENT_TYPE_V1: &str = "application/vnd.schemaregistry.v1+json";

/// The largest request body read (a schema is a few kilobytes; more is refused with 413).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// A client that has not sent its request headers by then is dropped.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The running registry; stopped (its connections closed) by [`RegistryServer::shutdown`]
/// or when dropped.
pub struct RegistryServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// What the server and its handle share.
#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    hooks: Mutex<Hooks>,
    /// Every request, in order: method, path, query string (empty when none).
    log: Mutex<Vec<(Method, String, String)>>,
}

/// The test hooks' settings.
#[derive(Default)]
struct Hooks {
    fail_with: Option<u16>,
    delay: Duration,
    auth: Option<String>,
}

/// One stored schema; its id is its index in [`Registry::schemas`] plus one.
struct Stored {
    /// The text as first registered.
    text: String,
    /// "AVRO", "JSON" or "PROTOBUF".
    schema_type: String,
    /// The `references` array as registered (empty when none).
    references: Vec<Value>,
    /// What two registrations are compared by: the type, the canonical form (Avro) or the
    /// text (other types), and the references.
    key: String,
}

#[derive(Default)]
struct Registry {
    schemas: Vec<Stored>,
    /// Subject → the ids of its versions (version n is at index n - 1).
    subjects: BTreeMap<String, Vec<u32>>,
}

/// An error answer: status, the registry's error code, message.
struct ApiError(StatusCode, u32, String);

impl ApiError {
    fn subject_not_found(subject: &str) -> Self {
        Self(
            StatusCode::NOT_FOUND,
            40401,
            format!("Subject '{subject}' not found."),
        )
    }
    fn version_not_found() -> Self {
        Self(StatusCode::NOT_FOUND, 40402, "Version not found.".into())
    }
    fn schema_not_found() -> Self {
        Self(StatusCode::NOT_FOUND, 40403, "Schema not found".into())
    }
    fn invalid_schema(why: impl std::fmt::Display) -> Self {
        Self(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            format!("Invalid schema: {why}"),
        )
    }
    fn bad_request(why: impl std::fmt::Display) -> Self {
        Self(StatusCode::BAD_REQUEST, 400, why.to_string())
    }
}

type Answer = Result<(StatusCode, Value), ApiError>;

impl RegistryServer {
    /// Listen on `addr` (port 0: a free port) and serve, on the current tokio runtime, until
    /// shut down or dropped. Fails when it cannot listen, or outside a tokio runtime.
    pub fn start(addr: SocketAddr) -> io::Result<RegistryServer> {
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            io::Error::other(format!("the schema registry needs a tokio runtime: {e}"))
        })?;
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let listener = {
            let _entered = handle.enter();
            TcpListener::from_std(std_listener)?
        };
        let shared = Arc::new(Shared::default());
        let task = handle.spawn(serve(listener, shared.clone()));
        Ok(RegistryServer { addr, shared, task })
    }

    /// The address it listens on (the port chosen, when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, `http://127.0.0.1:PORT`, what a registry client is configured with.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop serving: the listener and every open connection close (shortly, on the runtime).
    pub fn shutdown(&self) {
        self.task.abort();
    }

    /// Test hook: register `schema_text` (Avro) under `subject` as a client's `POST
    /// /subjects/{subject}/versions` would, and return its id.
    ///
    /// # Panics
    /// If the schema is not valid Avro (a bug in the test calling it); see
    /// [`RegistryServer::try_register`].
    pub fn register(&self, subject: &str, schema_text: &str) -> u32 {
        self.try_register(subject, schema_text)
            .unwrap_or_else(|e| panic!("registering under {subject}: {e}"))
    }

    /// Register `schema_text` (Avro) under `subject` and return its id, or why the schema is
    /// invalid.
    pub fn try_register(&self, subject: &str, schema_text: &str) -> Result<u32, String> {
        lock(&self.shared.registry)
            .register(subject, schema_text, "AVRO", Vec::new())
            .map(|(id, _)| id)
            .map_err(|ApiError(_, _, message)| message)
    }

    /// Test hook, an outage: while `Some(status)`, every request is answered `status` (a
    /// 4xx or 5xx; anything else is answered 503) with the registry's
    /// JSON error body, error code 50001. `None` ends it.
    pub fn fail_with(&self, status: Option<u16>) {
        lock(&self.shared.hooks).fail_with = status;
    }

    /// Test hook, a slow registry: wait `delay` before each answer (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.shared.hooks).delay = delay;
    }

    /// Test hook, a registry behind authentication: while `Some(value)`, a request whose
    /// `Authorization` header is not exactly `value` (e.g. `Basic dXNlcjpwYXNz` or
    /// `Bearer token`) is answered 401 with error code 401.
    pub fn require_auth(&self, value: Option<String>) {
        lock(&self.shared.hooks).auth = value;
    }

    /// Test hook: how many requests it has received (answered or not).
    pub fn requests(&self) -> u64 {
        lock(&self.shared.log).len() as u64
    }

    /// Test hook: how many requests had a path starting with `path_prefix` (e.g.
    /// `/schemas/ids/`; the query string is not part of the path, and the path is compared
    /// as sent, still percent-encoded).
    pub fn requests_to(&self, path_prefix: &str) -> u64 {
        lock(&self.shared.log)
            .iter()
            .filter(|(_, path, _)| path.starts_with(path_prefix))
            .count() as u64
    }

    /// Test hook: every request so far, in order, as its method and target (path and query
    /// string as sent, e.g. `"GET /schemas/ids/1?subject=users-value"`).
    pub fn request_log(&self) -> Vec<String> {
        lock(&self.shared.log)
            .iter()
            .map(|(method, path, query)| match query.as_str() {
                "" => format!("{method} {path}"),
                query => format!("{method} {path}?{query}"),
            })
            .collect()
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A lock that a panicking holder does not poison for the others (the state is always
/// consistent between statements).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Accept and serve connections until aborted.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in the set, so aborting this task closes them too.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((io, _)) => {
                    let shared = shared.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    });
                    connections.spawn(
                        hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .serve_connection(TokioIo::new(io), service),
                    );
                }
                Err(e) => {
                    // Out of file descriptors, most likely: wait, rather than spin.
                    tracing::debug!(error = %e, "the schema registry cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One request: logged, then the hooks, then the registry's answer.
async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    lock(&shared.log).push((req.method().clone(), path.clone(), query));
    let (fail_with, delay, auth) = {
        let hooks = lock(&shared.hooks);
        (hooks.fail_with, hooks.delay, hooks.auth.clone())
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = fail_with {
        let status = StatusCode::from_u16(status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return error_response(ApiError(
            status,
            50001,
            "Injected failure (test hook)".into(),
        ));
    }
    if let Some(required) = auth {
        let given = req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes);
        if given != Some(required.as_bytes()) {
            return error_response(ApiError(
                StatusCode::UNAUTHORIZED,
                401,
                "Unauthorized".into(),
            ));
        }
    }
    let method = req.method().clone();
    let body = if method == Method::POST {
        match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return error_response(ApiError(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    413,
                    format!("The request body is over {MAX_BODY_BYTES} bytes"),
                ))
            }
            Err(e) => {
                return error_response(ApiError::bad_request(format!(
                    "Cannot read the request body: {e}"
                )))
            }
        }
    } else {
        Bytes::new()
    };
    let segments: Option<Vec<String>> = path
        .split('/')
        .skip(1)
        .map(|s| {
            percent_decode_str(s)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
        })
        .collect();
    let answer = match segments {
        Some(segments) => {
            let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
            route(shared, &method, &segments, &body)
        }
        None => Err(ApiError::bad_request("The path is not UTF-8 once decoded")),
    };
    match answer {
        Ok((status, value)) => json_response(status, &value),
        Err(e) => error_response(e),
    }
}

/// The registry's answer to `method` on the path's decoded `segments`.
fn route(shared: &Shared, method: &Method, segments: &[&str], body: &[u8]) -> Answer {
    let ok = |value: Value| Ok((StatusCode::OK, value));
    let get = method == Method::GET;
    let post = method == Method::POST;
    let mut registry = lock(&shared.registry);
    match segments {
        ["schemas", "ids", id] if get => ok(registry.by_id(parse_id(id)?)?),
        ["schemas", "ids", id, "versions"] if get => ok(registry.versions_of(parse_id(id)?)?),
        ["subjects"] if get => ok(json!(registry.subjects.keys().collect::<Vec<_>>())),
        ["subjects", subject, "versions"] if post => {
            let (text, schema_type, references) = schema_body(body)?;
            let (id, _) = registry.register(subject, &text, &schema_type, references)?;
            ok(json!({ "id": id }))
        }
        ["subjects", subject, "versions"] if get => {
            let versions = registry
                .subjects
                .get(*subject)
                .ok_or_else(|| ApiError::subject_not_found(subject))?;
            ok(json!((1..=versions.len()).collect::<Vec<_>>()))
        }
        ["subjects", subject] if post => {
            let (text, schema_type, references) = schema_body(body)?;
            ok(registry.lookup(subject, &text, &schema_type, &references)?)
        }
        ["subjects", subject, "versions", version] if get => {
            ok(registry.subject_version(subject, version)?)
        }
        ["config"] | ["config", _] if get => ok(json!({ "compatibilityLevel": "BACKWARD" })),
        ["schemas", "ids", ..] | ["subjects", ..] | ["config"] | ["config", _] => Err(ApiError(
            StatusCode::METHOD_NOT_ALLOWED,
            405,
            "HTTP 405 Method Not Allowed".into(),
        )),
        _ => Err(ApiError(
            StatusCode::NOT_FOUND,
            404,
            "HTTP 404 Not Found".into(),
        )),
    }
}

/// A schema id from the URL (an unknown or malformed one is not found, as in the registry).
fn parse_id(id: &str) -> Result<u32, ApiError> {
    id.parse().map_err(|_| ApiError::schema_not_found())
}

/// The schema, its type and references from a register or lookup body.
fn schema_body(body: &[u8]) -> Result<(String, String, Vec<Value>), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("The body is not JSON: {e}")))?;
    let text = value
        .get("schema")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("The body has no \"schema\" string"))?
        .to_string();
    let schema_type = match value.get("schemaType") {
        None | Some(Value::Null) => "AVRO".to_string(),
        Some(Value::String(t)) => t.to_ascii_uppercase(),
        Some(_) => return Err(ApiError::bad_request("\"schemaType\" is not a string")),
    };
    let references = match value.get("references") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(references)) => references.clone(),
        Some(_) => return Err(ApiError::bad_request("\"references\" is not an array")),
    };
    Ok((text, schema_type, references))
}

impl Registry {
    /// The comparison key of a schema, or why it is invalid. An Avro schema with references
    /// is parsed with the referenced subjects' schemas as named types it may use.
    fn key(&self, text: &str, schema_type: &str, references: &[Value]) -> Result<String, ApiError> {
        let body = match schema_type {
            "AVRO" => {
                let referenced = references
                    .iter()
                    .map(|r| self.referenced_text(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let schema = if referenced.is_empty() {
                    apache_avro::Schema::parse_str(text)
                } else {
                    apache_avro::Schema::parse_str_with_list(text, &referenced).map(|(s, _)| s)
                };
                schema.map_err(ApiError::invalid_schema)?.canonical_form()
            }
            "JSON" | "PROTOBUF" => text.to_string(),
            other => {
                return Err(ApiError::invalid_schema(format!(
                    "unknown schemaType {other}"
                )))
            }
        };
        Ok(format!("{schema_type}\n{}\n{body}", json!(references)))
    }

    /// The text of the schema a reference (`{"name", "subject", "version"}`) points at.
    fn referenced_text(&self, reference: &Value) -> Result<String, ApiError> {
        let subject = reference
            .get("subject")
            .and_then(Value::as_str)
            .unwrap_or("");
        let version = match reference.get("version") {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.clone(),
            _ => "latest".to_string(),
        };
        let id = self
            .version_id(subject, &version)
            .map_err(|_| ApiError::invalid_schema(format!("reference {reference} not found")))?;
        Ok(self.schemas[id as usize - 1].text.clone())
    }

    /// Register under `subject`: the existing id and version when the subject has the
    /// schema, else a new version (with the schema's id when another subject has it).
    fn register(
        &mut self,
        subject: &str,
        text: &str,
        schema_type: &str,
        references: Vec<Value>,
    ) -> Result<(u32, usize), ApiError> {
        let key = self.key(text, schema_type, &references)?;
        let id = match self.schemas.iter().position(|s| s.key == key) {
            Some(index) => index as u32 + 1,
            None => {
                self.schemas.push(Stored {
                    text: text.to_string(),
                    schema_type: schema_type.to_string(),
                    references,
                    key,
                });
                self.schemas.len() as u32
            }
        };
        let versions = self.subjects.entry(subject.to_string()).or_default();
        let version = match versions.iter().position(|v| *v == id) {
            Some(index) => index + 1,
            None => {
                versions.push(id);
                versions.len()
            }
        };
        Ok((id, version))
    }

    /// `GET /schemas/ids/{id}`.
    fn by_id(&self, id: u32) -> Result<Value, ApiError> {
        let stored = self.stored(id)?;
        let mut answer = json!({ "schema": stored.text });
        if stored.schema_type != "AVRO" {
            answer["schemaType"] = json!(stored.schema_type);
        }
        if !stored.references.is_empty() {
            answer["references"] = json!(stored.references);
        }
        Ok(answer)
    }

    /// `GET /schemas/ids/{id}/versions`: every subject and version with that id.
    fn versions_of(&self, id: u32) -> Result<Value, ApiError> {
        self.stored(id)?;
        let pairs: Vec<Value> = self
            .subjects
            .iter()
            .flat_map(|(subject, ids)| {
                ids.iter()
                    .enumerate()
                    .filter(|(_, v)| **v == id)
                    .map(move |(i, _)| json!({ "subject": subject, "version": i + 1 }))
            })
            .collect();
        Ok(json!(pairs))
    }

    /// `POST /subjects/{subject}`: the subject's version that has this schema.
    fn lookup(
        &self,
        subject: &str,
        text: &str,
        schema_type: &str,
        references: &[Value],
    ) -> Result<Value, ApiError> {
        let versions = self
            .subjects
            .get(subject)
            .ok_or_else(|| ApiError::subject_not_found(subject))?;
        let key = self.key(text, schema_type, references)?;
        versions
            .iter()
            .enumerate()
            .find(|(_, id)| self.schemas[**id as usize - 1].key == key)
            .map(|(i, id)| self.subject_answer(subject, i + 1, *id))
            .ok_or_else(ApiError::schema_not_found)
    }

    /// `GET /subjects/{subject}/versions/{version}` (a number or `latest`).
    fn subject_version(&self, subject: &str, version: &str) -> Result<Value, ApiError> {
        let id = self.version_id(subject, version)?;
        let versions = &self.subjects[subject];
        let number = match version {
            "latest" | "-1" => versions.len(),
            n => n.parse().unwrap_or(versions.len()),
        };
        Ok(self.subject_answer(subject, number, id))
    }

    /// The id of a subject's version (a number, `latest` or `-1`).
    fn version_id(&self, subject: &str, version: &str) -> Result<u32, ApiError> {
        let versions = self
            .subjects
            .get(subject)
            .ok_or_else(|| ApiError::subject_not_found(subject))?;
        let index = match version {
            "latest" | "-1" => versions.len().checked_sub(1),
            n => n
                .parse::<usize>()
                .ok()
                .and_then(|n| n.checked_sub(1))
                .filter(|i| *i < versions.len()),
        };
        index
            .map(|i| versions[i])
            .ok_or_else(ApiError::version_not_found)
    }

    /// `{"subject", "id", "version", "schema"}` (plus "schemaType" and "references" as in
    /// [`Registry::by_id`]).
    fn subject_answer(&self, subject: &str, version: usize, id: u32) -> Value {
        let mut answer = self.by_id(id).unwrap_or_else(|_| json!({}));
        answer["subject"] = json!(subject);
        answer["id"] = json!(id);
        answer["version"] = json!(version);
        answer
    }

    fn stored(&self, id: u32) -> Result<&Stored, ApiError> {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| self.schemas.get(i))
            .ok_or_else(ApiError::schema_not_found)
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_V1));
    response
}

fn error_response(ApiError(status, code, message): ApiError) -> Response<Full<Bytes>> {
    json_response(status, &json!({ "error_code": code, "message": message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORD: &str =
        r#"{"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}"#;

    fn start() -> RegistryServer {
        RegistryServer::start("127.0.0.1:0".parse().unwrap()).unwrap()
    }

    async fn send(request: reqwest::RequestBuilder) -> (u16, Option<String>, Value) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let body = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        (status, content_type, body)
    }

    fn register_body(schema: &str) -> String {
        json!({ "schema": schema }).to_string()
    }

    #[tokio::test]
    async fn registers_and_answers_by_id_subject_and_version() {
        let server = start();
        let client = reqwest::Client::new();
        let url = server.url();
        let (status, content_type, body) = send(
            client
                .post(format!(
                    "{url}/subjects/users-value/versions?normalize=false"
                ))
                .body(register_body(RECORD)),
        )
        .await;
        assert_eq!(
            (status, content_type.as_deref()),
            (200, Some(CONTENT_TYPE_V1))
        );
        assert_eq!(body, json!({ "id": 1 }));

        // The same schema, written differently: the same id, no new version.
        let respelled = r#"{"name": "User", "type": "record", "fields": [{"type": "long", "name": "id", "doc": "x"}]}"#;
        let (_, _, body) = send(
            client
                .post(format!("{url}/subjects/users-value/versions"))
                .body(register_body(respelled)),
        )
        .await;
        assert_eq!(body, json!({ "id": 1 }));
        // Under another subject (percent-encoded): the global id, version 1 there.
        let (_, _, body) = send(
            client
                .post(format!("{url}/subjects/other%2Fsubject/versions"))
                .body(register_body(RECORD)),
        )
        .await;
        assert_eq!(body, json!({ "id": 1 }));

        let (status, _, body) = send(client.get(format!(
            "{url}/schemas/ids/1?subject=users-value&fetchMaxId=false"
        )))
        .await;
        assert_eq!((status, body), (200, json!({ "schema": RECORD })));
        let (_, _, body) = send(client.get(format!("{url}/schemas/ids/1/versions"))).await;
        assert_eq!(
            body,
            json!([{"subject": "other/subject", "version": 1}, {"subject": "users-value", "version": 1}])
        );

        let second = r#"{"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string", "default": ""}]}"#;
        assert_eq!(server.register("users-value", second), 2);
        let (status, _, body) =
            send(client.get(format!("{url}/subjects/users-value/versions/latest"))).await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"subject": "users-value", "id": 2, "version": 2, "schema": second})
        );
        let (_, _, body) = send(client.get(format!("{url}/subjects/users-value/versions/1"))).await;
        assert_eq!(body["id"], json!(1));
        let (_, _, body) = send(client.get(format!("{url}/subjects/users-value/versions"))).await;
        assert_eq!(body, json!([1, 2]));
        let (_, _, body) = send(client.get(format!("{url}/subjects"))).await;
        assert_eq!(body, json!(["other/subject", "users-value"]));
        let (_, _, body) = send(
            client
                .post(format!("{url}/subjects/users-value"))
                .body(register_body(RECORD)),
        )
        .await;
        assert_eq!(body["version"], json!(1));
        assert_eq!(body["id"], json!(1));
        let (_, _, body) = send(client.get(format!("{url}/config/users-value"))).await;
        assert_eq!(body, json!({"compatibilityLevel": "BACKWARD"}));

        assert_eq!(server.requests_to("/subjects/users-value"), 6);
        assert_eq!(server.requests(), 11);
    }

    #[tokio::test]
    async fn errors_are_the_registrys_json() {
        let server = start();
        let client = reqwest::Client::new();
        let url = server.url();
        let (status, content_type, body) = send(client.get(format!("{url}/schemas/ids/7"))).await;
        assert_eq!(
            (status, content_type.as_deref()),
            (404, Some(CONTENT_TYPE_V1))
        );
        assert_eq!(
            body,
            json!({"error_code": 40403, "message": "Schema not found"})
        );
        let (status, _, body) = send(client.get(format!("{url}/schemas/ids/x"))).await;
        assert_eq!((status, body["error_code"].clone()), (404, json!(40403)));
        let (status, _, body) = send(client.get(format!("{url}/subjects/nope/versions/1"))).await;
        assert_eq!((status, body["error_code"].clone()), (404, json!(40401)));
        server.register("s", RECORD);
        let (status, _, body) = send(client.get(format!("{url}/subjects/s/versions/2"))).await;
        assert_eq!((status, body["error_code"].clone()), (404, json!(40402)));
        let (status, _, body) = send(
            client
                .post(format!("{url}/subjects/s"))
                .body(register_body(r#""string""#)),
        )
        .await;
        assert_eq!((status, body["error_code"].clone()), (404, json!(40403)));
        let (status, _, body) = send(
            client
                .post(format!("{url}/subjects/s/versions"))
                .body(register_body(r#"{"type": "record"}"#)),
        )
        .await;
        assert_eq!((status, body["error_code"].clone()), (422, json!(42201)));
        let (status, _, body) = send(
            client
                .post(format!("{url}/subjects/s/versions"))
                .body("not json"),
        )
        .await;
        assert_eq!((status, body["error_code"].clone()), (400, json!(400)));
        let (status, _, _) = send(client.get(format!("{url}/nowhere"))).await;
        assert_eq!(status, 404);
        assert!(server.try_register("s", "{").is_err());
    }

    #[tokio::test]
    async fn injected_failure_delay_and_auth() {
        let server = start();
        let client = reqwest::Client::new();
        let url = server.url();
        let id = server.register("s", RECORD);

        server.fail_with(Some(503));
        let (status, _, body) = send(client.get(format!("{url}/schemas/ids/{id}"))).await;
        assert_eq!((status, body["error_code"].clone()), (503, json!(50001)));
        server.fail_with(None);

        server.set_delay(Duration::from_millis(150));
        let started = std::time::Instant::now();
        let (status, _, _) = send(client.get(format!("{url}/schemas/ids/{id}"))).await;
        assert_eq!(status, 200);
        assert!(started.elapsed() >= Duration::from_millis(150));
        server.set_delay(Duration::ZERO);

        server.require_auth(Some("Basic dXNlcjpwYXNz".into()));
        let (status, _, body) = send(client.get(format!("{url}/schemas/ids/{id}"))).await;
        assert_eq!((status, body["error_code"].clone()), (401, json!(401)));
        let (status, _, _) = send(
            client
                .get(format!("{url}/schemas/ids/{id}"))
                .basic_auth("user", Some("pass")),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(server.requests_to("/schemas/ids/"), 4);

        server.shutdown();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(client.get(format!("{url}/subjects")).send().await.is_err());
    }
}

//! The operations servers. Two surfaces, each on its own address unless both are given the
//! same one:
//!
//! - **Metrics and probes** on `WATCHBRIDGE_METRICS_ADDR` (all interfaces by default, for
//!   Prometheus and the kubelet): `GET /metrics` (Prometheus text format), `GET /healthz`
//!   (the process answers and no engine is stalled: no Kafka, so a slow broker never gets a
//!   live instance restarted), `GET /readyz` (see [`Readiness`]), `GET /version`.
//! - **The control and watch API** on `WATCHBRIDGE_CONTROL_ADDR` (loopback by default: it
//!   shows watch keys and changes what the group does), every request with
//!   `Authorization: Bearer <WATCHBRIDGE_ADMIN_TOKEN>`: the watches' status (`GET /watches`,
//!   `GET /watches/{key}`, `GET /partitions`, `GET /orders`), and orders (`control.rs`,
//!   `kafka/control_topic.rs`): `POST /watches/{key}/stop|poll|pause|resume`, `POST /pause`,
//!   `POST /resume`. Pauses go through the control topic, so they hold on every instance and
//!   survive restarts. An input's value is shown only with `WATCHBRIDGE_CONTROL_SHOW_INPUTS`.
//!
//! A known path asked with another method answers 405 with `Allow`; anything else is a
//! 404. The servers start before the bridge's topics are checked, so `/healthz` answers
//! during a long start, and stop when the bridge has. Each bounds what a client can take: at
//! most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's accept queue until
//! one ends), [`HEADER_READ_TIMEOUT`] to send a request's headers, and a failing `accept`
//! (out of file descriptors) is retried with backoff rather than in a busy loop.

use crate::control::{partition_of_key, Controls, ListQuery, Lookup};
use crate::internal_events::{ControlAction, ControlRefused};
use crate::kafka::control_topic::{ControlTopic, Order};
use crate::kafka::state_lookup::{Again, StateLookup};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// A client that has not sent its request headers by then is dropped (a stuck or
/// malicious client must not hold a connection open forever).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections served at once. Prometheus and the probes need a few; past it, new
/// connections wait in the kernel's accept queue until one ends.
pub const MAX_CONNECTIONS: usize = 64;

/// Wait after a failed `accept` (e.g. `EMFILE`: out of file descriptors), doubling with each
/// failure in a row up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Which surfaces a server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serves {
    /// `/metrics`, `/healthz`, `/readyz`, `/version`.
    pub probes: bool,
    /// The control and watch API.
    pub control: bool,
}

impl Serves {
    /// The setting that names its address, for errors.
    fn var(self) -> &'static str {
        if self.probes {
            "WATCHBRIDGE_METRICS_ADDR"
        } else {
            "WATCHBRIDGE_CONTROL_ADDR"
        }
    }
}

/// The running server; stopped (its connections closed) when dropped.
pub struct OpsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl OpsServer {
    /// Listen on `addr` and serve `serves` until dropped. The error names the setting.
    pub async fn start(addr: SocketAddr, api: Arc<OpsApi>, serves: Serves) -> Result<Self, String> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{}: cannot listen on {addr}: {e}", serves.var()))?;
        let addr = listener.local_addr().unwrap_or(addr);
        let task = tokio::spawn(serve(listener, api, serves, MAX_CONNECTIONS));
        Ok(Self { addr, task })
    }

    /// The address it listens on (the port chosen, when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for OpsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where connections come from: a [`TcpListener`], or a stand-in in tests.
trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Listener for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<Self::Io> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// What the servers answer from.
pub struct OpsApi {
    /// Rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Asked at `/readyz`.
    pub readiness: Arc<Readiness>,
    /// This instance's partitions and watches.
    pub controls: Arc<Controls>,
    /// `WATCHBRIDGE_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// Where orders go (set once the start has read the control topic).
    pub orders: Arc<OnceLock<ControlTopic>>,
    /// What the state topic remembers, and the way to produce an input again (set once the
    /// start has checked the topics).
    pub state: Arc<OnceLock<StateLookup>>,
    /// `WATCHBRIDGE_CONTROL_SHOW_INPUTS`.
    pub show_inputs: bool,
    /// `WATCHBRIDGE_STALL_TIMEOUT` (`None`: never).
    pub stall_timeout: Option<Duration>,
}

#[cfg(test)]
impl OpsApi {
    /// Metrics and readiness only, no partitions (tests).
    pub fn basic(metrics: Arc<Metrics>, readiness: Arc<Readiness>) -> Self {
        Self {
            metrics,
            readiness,
            controls: Arc::new(Controls::default()),
            admin_token: None,
            orders: Arc::default(),
            state: Arc::default(),
            show_inputs: false,
            stall_timeout: None,
        }
    }
}

/// Accept and serve connections, at most `max_connections` at once, until aborted.
async fn serve<L: Listener>(
    mut listener: L,
    api: Arc<OpsApi>,
    serves: Serves,
    max_connections: usize,
) {
    // Connections live in the set, so aborting this task closes them too.
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff: Option<Duration> = None;
    loop {
        // At the cap, take no new connection until one ends.
        while connections.len() >= max_connections.max(1) {
            let _ = connections.join_next().await;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(io) => {
                    if backoff.take().is_some() {
                        tracing::info!("the operations server accepts connections again");
                    }
                    let api = api.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let api = api.clone();
                        async move { Ok::<_, Infallible>(respond(&api, serves, &req).await) }
                    });
                    connections.spawn(
                        hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .serve_connection(TokioIo::new(io), service),
                    );
                }
                Err(e) => {
                    let wait = match backoff {
                        None => {
                            tracing::warn!(
                                error = %e,
                                "the operations server cannot accept a connection; retrying with backoff"
                            );
                            ACCEPT_BACKOFF_FIRST
                        }
                        Some(previous) => {
                            tracing::debug!(error = %e, "accept failed again");
                            (previous * 2).min(ACCEPT_BACKOFF_MAX)
                        }
                    };
                    backoff = Some(wait);
                    // Connections that end meanwhile free their descriptors: reap them.
                    let pause = tokio::time::sleep(wait);
                    tokio::pin!(pause);
                    loop {
                        tokio::select! {
                            () = &mut pause => break,
                            Some(_) = connections.join_next(), if !connections.is_empty() => {}
                        }
                    }
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The response to one request.
async fn respond<B>(api: &OpsApi, serves: Serves, req: &Request<B>) -> Response<Full<Bytes>> {
    let (method, path) = (req.method(), req.uri().path());
    if serves.probes {
        if let Some(response) = probe(api, method, path) {
            return response;
        }
    }
    if serves.control {
        if let Some(allowed) = control_route(path) {
            if !allowed.contains(method) {
                return wrong_method(allowed);
            }
            if let Some(refused) = refusal(api, req) {
                return refused;
            }
            return control(api, req).await;
        }
    }
    text(StatusCode::NOT_FOUND, "not found\n".into())
}

/// 405, with the methods the path takes.
fn wrong_method(allowed: &[Method]) -> Response<Full<Bytes>> {
    let list: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed: use {}\n", list.join(", ")),
    );
    if let Ok(value) = HeaderValue::from_str(&list.join(", ")) {
        response.headers_mut().insert(ALLOW, value);
    }
    response
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];

/// The methods a control API path takes (`None`: not one of its paths).
fn control_route(path: &str) -> Option<&'static [Method]> {
    match path {
        "/watches" | "/watches/" | "/partitions" | "/orders" => Some(GET),
        "/pause" | "/resume" | "/restart" => Some(POST),
        _ => match path.strip_prefix("/watches/") {
            Some(rest) => Some(match watch_action(rest).1 {
                None => GET,
                Some(_) => POST,
            }),
            None => None,
        },
    }
}

/// What follows `/watches/`: the (percent-encoded) key and the action, if any.
fn watch_action(rest: &str) -> (&str, Option<&'static str>) {
    for action in ["stop", "poll", "pause", "resume", "restart", "reset"] {
        if let Some(key) = rest.strip_suffix(action).and_then(|k| k.strip_suffix('/')) {
            if !key.is_empty() {
                return (key, Some(action));
            }
        }
    }
    (rest, None)
}

/// A request of the control API, its method checked and its token accepted.
async fn control<B>(api: &OpsApi, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    match path {
        "/partitions" => json(StatusCode::OK, &api.controls.partitions().await),
        "/orders" => {
            let pause = &api.controls.pause;
            let keys: Vec<String> = pause
                .paused_keys()
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            json(
                StatusCode::OK,
                &serde_json::json!({ "paused": pause.is_paused(), "paused_watches": keys }),
            )
        }
        "/pause" | "/resume" => {
            let paused = path == "/pause";
            match give(api, Order::PauseAll(paused)).await {
                Ok(offset) => {
                    ControlAction {
                        action: if paused { "pause" } else { "resume" },
                        key: None,
                    }
                    .emit(&api.metrics);
                    json(
                        StatusCode::OK,
                        &serde_json::json!({ "paused": paused, "scope": "group", "order_offset": offset }),
                    )
                }
                Err(refused) => *refused,
            }
        }
        "/watches" | "/watches/" => list(api, req).await,
        "/restart" => restart_failed(api).await,
        _ => {
            let rest = path.strip_prefix("/watches/").unwrap_or_default();
            watch(api, rest, req.uri().query().unwrap_or_default()).await
        }
    }
}

/// Write `order` to the control topic; the answer to send if it could not be.
async fn give(api: &OpsApi, order: Order) -> Result<i64, Box<Response<Full<Bytes>>>> {
    let Some(orders) = api.orders.get() else {
        return Err(Box::new(json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "error": "the bridge is still starting: it takes orders once it has read its control topic" }),
        )));
    };
    orders.give(&order).await.map_err(|e| {
        tracing::error!(error = %e, "an order of the operations API was not given");
        Box::new(json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "error": e }),
        ))
    })
}

/// `GET /watches`.
async fn list<B>(api: &OpsApi, req: &Request<B>) -> Response<Full<Bytes>> {
    let (partition, query) = match list_query(req.uri().query().unwrap_or_default()) {
        Ok(q) => q,
        Err(e) => return json(StatusCode::BAD_REQUEST, &serde_json::json!({ "error": e })),
    };
    let (total, watches) = api.controls.list(partition, &query).await;
    json(
        StatusCode::OK,
        &serde_json::json!({
            "total": total,
            "offset": query.offset,
            "limit": query.limit,
            "watches": watches,
        }),
    )
}

/// The state topic's reader, or the answer to send while there is none yet.
fn state(api: &OpsApi) -> Result<&StateLookup, Box<Response<Full<Bytes>>>> {
    api.state.get().ok_or_else(|| {
        Box::new(json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "error": "the bridge is still starting: it reads the state topic once it has checked its topics" }),
        ))
    })
}

/// `POST /restart`: every watch that ended `failed` (as the state topic says) starts again,
/// knowing what it had found, on whichever instance owns it.
async fn restart_failed(api: &OpsApi) -> Response<Full<Bytes>> {
    let state = match state(api) {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let failed = match state.failed().await {
        Ok(f) => f,
        Err(e) => {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({ "error": e }),
            )
        }
    };
    let mut restarted = Vec::new();
    for watch in &failed {
        if let Err(e) = state.produce_again(watch, Again::Restart).await {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({ "error": e, "restarted": restarted }),
            );
        }
        restarted.push(String::from_utf8_lossy(&watch.record.watch_key).into_owned());
    }
    ControlAction {
        action: "restart",
        key: None,
    }
    .emit(&api.metrics);
    json(
        StatusCode::ACCEPTED,
        &serde_json::json!({ "restarting": restarted.len(), "watches": restarted }),
    )
}

/// `POST /watches/{key}/restart` and `…/reset?confirm={key}`: an ended watch's input is
/// produced again (`kafka/state_lookup.rs`).
async fn again(api: &OpsApi, key: &[u8], again: Again, query: &str) -> Response<Full<Bytes>> {
    let shown = String::from_utf8_lossy(key).into_owned();
    if again == Again::Reset {
        let confirmed = url::form_urlencoded::parse(query.as_bytes())
            .any(|(name, value)| name == "confirm" && value.as_bytes() == key);
        if !confirmed {
            return json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({
                    "error": "a reset forgets every output the watch found, and emits them all again: confirm with `?confirm=<the watch key>`",
                    "key": shown,
                }),
            );
        }
    }
    let state = match state(api) {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let watch = match state.find(key).await {
        Ok(Some(w)) => w,
        Ok(None) => {
            return json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({ "error": "the state topic has no record of this watch (never started, or ended longer ago than WATCHBRIDGE_FINISHED_RETENTION)", "key": shown }),
            )
        }
        Err(e) => {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({ "error": e }),
            )
        }
    };
    let refusal = match (&watch.record.finished, again) {
        (None, Again::Restart) => Some("it is live: only an ended watch restarts"),
        (None, Again::Reset) => Some("it is live: stop it first (POST /watches/{key}/stop), then reset it"),
        (Some(_), Again::Restart) if !watch.failed() => Some(
            "it ended, but not `failed`: a restart keeps what a watch found and so only suits a failed one; a reset starts it over (POST /watches/{key}/reset?confirm={key})",
        ),
        _ => None,
    };
    if let Some(why) = refusal {
        let mut body = watch.view();
        body["error"] = why.into();
        return json(StatusCode::CONFLICT, &body);
    }
    match state.produce_again(&watch, again).await {
        Ok(offset) => {
            ControlAction {
                action: again.as_str(),
                key: Some(key),
            }
            .emit(&api.metrics);
            json(
                StatusCode::ACCEPTED,
                &serde_json::json!({
                    "key": shown,
                    "partition": watch.partition,
                    again.as_str(): "its input is produced again; its owner starts it",
                    "input_offset": offset,
                }),
            )
        }
        Err(e) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "error": e }),
        ),
    }
}

/// `/watches/{key}` and its actions (`rest`: what follows `/watches/`).
async fn watch(api: &OpsApi, rest: &str, query: &str) -> Response<Full<Bytes>> {
    let (key, action) = watch_action(rest);
    let key = percent_encoding::percent_decode_str(key).collect::<Vec<u8>>();
    let shown = String::from_utf8_lossy(&key).into_owned();
    let not_here = |owned: Vec<i32>| {
        if api.controls.repartitioned() {
            // The partition is known: the repartition stage put the key there.
            let partition = crate::control::crc32_partition(&key, api.controls.input_partitions());
            return json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({
                    "error": "no live or remembered watch with this key on this instance",
                    "key": shown,
                    "owned_partitions": owned,
                    "partition": partition,
                    "hint": "the inputs go through the repartition topic (WATCHBRIDGE_REPARTITION), keyed by the watch key: the watch lives in this partition of it, on the instance that owns it (GET /partitions on each instance says which it owns). Pauses and resumes are taken by any instance",
                }),
            );
        }
        json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "error": "no live or remembered watch with this key on this instance",
                "key": shown,
                "owned_partitions": owned,
                "input_partition": partition_of_key(&key, api.controls.input_partitions()),
                "hint": "a watch lives on the instance that owns its input partition: the one its input records go to, `murmur2` if they are produced by a Java client's default partitioner, `crc32` by librdkafka's (C, Go, Python, .NET); GET /partitions on each instance says which it owns. Pauses and resumes are taken by any instance",
            }),
        )
    };
    match action {
        None => match api.controls.status(&key).await {
            Lookup::Here(_, mut status) => {
                if !api.show_inputs {
                    status.hide_input_value();
                }
                json(StatusCode::OK, &status)
            }
            Lookup::NotHere(owned) => match api.state.get() {
                // Another instance's: its last checkpoint, from the state topic.
                Some(state) => match state.find(&key).await {
                    Ok(Some(remembered)) => {
                        let mut view = remembered.view();
                        let pause = &api.controls.pause;
                        view["paused"] = (pause.is_paused() || pause.is_key_paused(&key)).into();
                        json(StatusCode::OK, &view)
                    }
                    _ => not_here(owned),
                },
                None => not_here(owned),
            },
        },
        Some("restart") => again(api, &key, Again::Restart, query).await,
        Some("reset") => again(api, &key, Again::Reset, query).await,
        Some("stop") => match api.controls.stop(&key).await {
            Lookup::Here(partition, ()) => json(
                StatusCode::OK,
                &serde_json::json!({ "stopped": shown, "partition": partition }),
            ),
            Lookup::NotHere(owned) => not_here(owned),
        },
        Some("poll") => match api.controls.poll_now(&key).await {
            Lookup::Here(partition, moved) => json(
                StatusCode::OK,
                &serde_json::json!({
                    "key": shown,
                    "partition": partition,
                    "polling": if moved { "now" } else { "already" },
                }),
            ),
            Lookup::NotHere(owned) => not_here(owned),
        },
        Some(pause_or_resume) => {
            let paused = pause_or_resume == "pause";
            match give(api, Order::PauseOne(Bytes::from(key.clone()), paused)).await {
                Ok(offset) => {
                    ControlAction {
                        action: if paused { "pause" } else { "resume" },
                        key: Some(&key),
                    }
                    .emit(&api.metrics);
                    json(
                        StatusCode::OK,
                        &serde_json::json!({ "key": shown, "paused": paused, "scope": "watch", "order_offset": offset }),
                    )
                }
                Err(refused) => *refused,
            }
        }
    }
}

/// `GET /watches`' query: `partition`, `state`, `holds_watermark`, `offset`, `limit`.
fn list_query(query: &str) -> Result<(Option<i32>, ListQuery), String> {
    let mut partition = None;
    let mut list = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let number = |what: &str| {
            value
                .parse::<usize>()
                .map_err(|_| format!("`{what}` must be a whole number, not `{value}`"))
        };
        match &*name {
            "partition" => {
                partition = Some(
                    value
                        .parse()
                        .map_err(|_| format!("`partition` must be a number, not `{value}`"))?,
                )
            }
            "state" => list.state = Some(value.parse()?),
            "holds_watermark" => list.holds_watermark = value == "true",
            "offset" => list.offset = number("offset")?,
            "limit" => list.limit = number("limit")?.min(1000),
            other => {
                return Err(format!(
                    "`{other}` is not a filter: partition, state, holds_watermark, offset, limit"
                ))
            }
        }
    }
    Ok((partition, list))
}

/// A control request carries `Authorization: Bearer <WATCHBRIDGE_ADMIN_TOKEN>`; without the
/// setting, no control request is taken. The refusal to send, if the request is refused.
fn refusal<B>(api: &OpsApi, req: &Request<B>) -> Option<Response<Full<Bytes>>> {
    let path = req.uri().path();
    let Some(token) = &api.admin_token else {
        ControlRefused {
            path,
            why: "no WATCHBRIDGE_ADMIN_TOKEN",
        }
        .emit(&api.metrics);
        return Some(json(
            StatusCode::FORBIDDEN,
            &serde_json::json!({ "error": "control requests are off: set WATCHBRIDGE_ADMIN_TOKEN to take them" }),
        ));
    };
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compared in full whatever the first difference, so the time taken says nothing.
    let matches = given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if matches {
        return None;
    }
    ControlRefused {
        path,
        why: "missing or wrong token",
    }
    .emit(&api.metrics);
    let mut response = json(
        StatusCode::UNAUTHORIZED,
        &serde_json::json!({ "error": "this request needs `Authorization: Bearer <WATCHBRIDGE_ADMIN_TOKEN>`" }),
    );
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec_pretty(body).unwrap_or_default();
    body.push(b'\n');
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The response to a request for metrics, liveness, readiness or the version (`None`: not
/// one of those paths).
fn probe(api: &OpsApi, method: &Method, path: &str) -> Option<Response<Full<Bytes>>> {
    if !matches!(path, "/healthz" | "/readyz" | "/metrics" | "/version") {
        return None;
    }
    if method != Method::GET {
        return Some(wrong_method(GET));
    }
    let (metrics, readiness) = (&*api.metrics, &*api.readiness);
    Some(match path {
        "/healthz" => match api
            .stall_timeout
            .and_then(|timeout| api.controls.stalled(timeout))
        {
            None => text(StatusCode::OK, "ok\n".into()),
            Some((partition, since)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "stalled: the engine of input partition {partition} has had work but not \
                     turned for {}s (WATCHBRIDGE_STALL_TIMEOUT)\n",
                    since.as_secs()
                ),
            ),
        },
        "/readyz" => match readiness.refresh(metrics) {
            Ok(()) => match readiness.note() {
                Some(note) => text(StatusCode::OK, format!("ready\n{note}\n")),
                None => text(StatusCode::OK, "ready\n".into()),
            },
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            ),
        },
        "/version" => json(
            StatusCode::OK,
            &serde_json::json!({
                "name": env!("CARGO_PKG_NAME"),
                "version": env!("CARGO_PKG_VERSION"),
                "state_format": crate::state::FORMAT_VERSION,
            }),
        ),
        _ => {
            // So that `watchbridge_ready` is current in every scrape.
            let _ = readiness.refresh(metrics);
            let mut response = text(StatusCode::OK, metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(prometheus::TEXT_FORMAT),
            );
            response
        }
    })
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const BOTH: Serves = Serves {
        probes: true,
        control: true,
    };

    async fn server() -> OpsServer {
        let addr = "127.0.0.1:0".parse().unwrap();
        let api = OpsApi::basic(Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        OpsServer::start(addr, Arc::new(api), BOTH).await.unwrap()
    }

    /// A listener that plays a script of accept results, then waits forever; it notes when
    /// each accept was called.
    struct Scripted {
        script: std::collections::VecDeque<io::Result<tokio::io::DuplexStream>>,
        calls: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
    }

    impl Listener for Scripted {
        type Io = tokio::io::DuplexStream;

        async fn accept(&mut self) -> io::Result<Self::Io> {
            self.calls.lock().unwrap().push(tokio::time::Instant::now());
            match self.script.pop_front() {
                Some(result) => result,
                None => std::future::pending().await,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_and_the_server_recovers() {
        let emfile = || Err(io::Error::from_raw_os_error(24)); // EMFILE
        let (client, server_side) = tokio::io::duplex(4096);
        let mut script: std::collections::VecDeque<_> = (0..12).map(|_| emfile()).collect();
        script.push_back(Ok(server_side));
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let listener = Scripted {
            script,
            calls: calls.clone(),
        };
        let task = tokio::spawn(serve(
            listener,
            Arc::new(OpsApi::basic(
                Arc::new(Metrics::new()),
                Arc::new(Readiness::new()),
            )),
            BOTH,
            MAX_CONNECTIONS,
        ));
        let mut client = client;
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        task.abort();

        let calls = calls.lock().unwrap().clone();
        // 12 failures, the connection, then waiting (again after the connection ended).
        assert!(calls.len() >= 14, "{calls:?}");
        let gaps: Vec<u128> = calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(
            gaps[..13],
            [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000, 1000, 0],
            "the wait after each failed accept, none after a success"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_cap_wait_for_a_free_one() {
        let server = server().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(server.addr()).await.unwrap());
        }
        let mut probe = TcpStream::connect(server.addr()).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = vec![0; 1024];
        let early = tokio::time::timeout(Duration::from_millis(500), probe.read(&mut answer)).await;
        assert!(
            early.is_err(),
            "answered with {MAX_CONNECTIONS} connections already open: {:?}",
            early.map(|n| String::from_utf8_lossy(&answer[..n.unwrap_or(0)]).into_owned())
        );
        // One of them ends: the waiting connection is served.
        drop(idle.pop());
        let n = tokio::time::timeout(Duration::from_secs(5), probe.read(&mut answer))
            .await
            .expect("not answered after a connection had ended")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }

    fn ask(api: &OpsApi, serves: Serves, method: Method, path: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap();
        let response = futures::executor::block_on(respond(api, serves, &req));
        let status = response.status();
        let bytes =
            futures::executor::block_on(http_body_util::BodyExt::collect(response.into_body()))
                .unwrap()
                .to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[test]
    fn routes() {
        let api = OpsApi::basic(Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        let get = |path| ask(&api, BOTH, Method::GET, path);
        assert_eq!(get("/healthz"), (StatusCode::OK, "ok\n".into()));
        assert_eq!(
            get("/readyz"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: waiting for the consumer group's assignment\n".into()
            )
        );
        api.readiness.assignment_received(&api.metrics);
        assert_eq!(get("/readyz"), (StatusCode::OK, "ready\n".into()));
        let (status, body) = get("/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("watchbridge_ready 1"), "{body}");
        let (status, body) = get("/version");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(env!("CARGO_PKG_VERSION")), "{body}");
        assert_eq!(get("/").0, StatusCode::NOT_FOUND);
        assert_eq!(get("/metrics/x").0, StatusCode::NOT_FOUND);
        // A known path with another method: 405 naming the one it takes.
        let (status, body) = ask(&api, BOTH, Method::POST, "/healthz");
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
        assert_eq!(
            ask(&api, BOTH, Method::DELETE, "/pause").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            ask(&api, BOTH, Method::GET, "/watches/k/stop").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            ask(&api, BOTH, Method::POST, "/watches").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        // Without WATCHBRIDGE_ADMIN_TOKEN the control API takes nothing, reads included.
        assert_eq!(get("/watches").0, StatusCode::FORBIDDEN);
    }

    #[test]
    fn each_surface_serves_only_its_own_paths() {
        let mut api = OpsApi::basic(Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        api.admin_token = Some("t".into());
        let probes = Serves {
            probes: true,
            control: false,
        };
        let control = Serves {
            probes: false,
            control: true,
        };
        assert_eq!(
            ask(&api, probes, Method::GET, "/watches").0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ask(&api, probes, Method::POST, "/pause").0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ask(&api, control, Method::GET, "/metrics").0,
            StatusCode::NOT_FOUND
        );
        // The control API asks for the token on reads too.
        assert_eq!(
            ask(&api, control, Method::GET, "/watches").0,
            StatusCode::UNAUTHORIZED
        );
        let req = Request::builder()
            .uri("/watches")
            .header("authorization", "Bearer t")
            .body(())
            .unwrap();
        let response = futures::executor::block_on(respond(&api, control, &req));
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[test]
    fn a_stalled_engine_fails_liveness() {
        let mut api = OpsApi::basic(Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        api.stall_timeout = Some(Duration::from_millis(50));
        let registered = api.controls.register(3);
        registered.heartbeat.turned(true);
        assert_eq!(ask(&api, BOTH, Method::GET, "/healthz").0, StatusCode::OK);
        std::thread::sleep(Duration::from_millis(80));
        let (status, body) = ask(&api, BOTH, Method::GET, "/healthz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("input partition 3"), "{body}");
        // Idle (no work): not a stall, however long.
        registered.heartbeat.turned(false);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(ask(&api, BOTH, Method::GET, "/healthz").0, StatusCode::OK);
        // Blocked on a full events channel (its task waits on Kafka): not a stall either.
        let (events, _receiver) = tokio::sync::mpsc::channel(1);
        registered.heartbeat.sends_to(&events);
        registered.heartbeat.turned(true);
        events
            .try_send(crate::engine::Event::Hold { min: None })
            .unwrap();
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(ask(&api, BOTH, Method::GET, "/healthz").0, StatusCode::OK);
    }

    /// The variable that makes [`child_at_the_descriptor_limit`] run (in a child process).
    const FD_CHILD: &str = "WATCHBRIDGE_TEST_FD_CHILD";

    /// CPU time this process has used, in clock ticks (utime + stime of `/proc/self/stat`,
    /// opened beforehand: there may be no descriptor left to open it then).
    fn cpu_ticks(proc_stat: &mut std::fs::File) -> u64 {
        use std::io::{Read, Seek};
        proc_stat.rewind().unwrap();
        let mut stat = String::new();
        proc_stat.read_to_string(&mut stat).unwrap();
        // Fields after the command name in parentheses: state is field 3, utime 14, stime 15.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }

    /// Out of file descriptors with a connection waiting: the server must not spin on the
    /// failing `accept`, and must answer again once descriptors are free. Run by the test
    /// below in a child process with a low `RLIMIT_NOFILE`, so the rest of the tests keep
    /// their descriptors.
    #[test]
    #[ignore = "runs in a child process started by at_the_descriptor_limit_accept_backs_off"]
    fn child_at_the_descriptor_limit() {
        if std::env::var_os(FD_CHILD).is_none() {
            return;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(server());
        let addr = server.addr();
        let mut proc_stat = std::fs::File::open("/proc/self/stat").unwrap();
        // Take every descriptor left, then free one for a client: its connection waits in
        // the accept queue, and accepting it fails with EMFILE.
        let mut hogs = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => hogs.push(f),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(24), "{e}");
                    break;
                }
            }
        }
        hogs.pop();
        let _waiting = std::net::TcpStream::connect(addr).unwrap();
        let before = cpu_ticks(&mut proc_stat);
        std::thread::sleep(Duration::from_secs(2));
        let used = cpu_ticks(&mut proc_stat) - before;
        println!("CPU ticks used in 2 s at the descriptor limit: {used}");
        // A busy loop on accept takes one core: about 200 ticks (at 100 per second).
        assert!(
            used < 40,
            "the server used {used} CPU ticks in 2 s while accept failed: a busy loop"
        );
        drop(hogs.drain(..16));
        let mut probe = std::net::TcpStream::connect(addr).unwrap();
        probe
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        std::io::Write::write_all(
            &mut probe,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut probe, &mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
        drop(server);
        rt.shutdown_background();
    }

    #[test]
    fn at_the_descriptor_limit_accept_backs_off() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", "ulimit -n 128 && exec \"$0\" \"$@\""])
            .arg(exe)
            .args([
                "--exact",
                "ops_server::tests::child_at_the_descriptor_limit",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FD_CHILD, "1")
            .output()
            .unwrap();
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the child failed:\n{log}");
        assert!(log.contains("1 passed"), "the child did not run:\n{log}");
    }
}

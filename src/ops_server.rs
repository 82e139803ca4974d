//! The operations server on `WATCHBRIDGE_METRICS_ADDR`: `GET /metrics` (Prometheus text
//! format), `GET /healthz` (the process answers: no locks, no Kafka, so a slow broker never
//! gets a live instance restarted) and `GET /readyz` (see [`Readiness`]); the watches'
//! status (`GET /watches`, `GET /watches/{key}`, `GET /partitions`, JSON) and, only with
//! `WATCHBRIDGE_ADMIN_TOKEN` and that token on the request, control (`POST
//! /watches/{key}/stop`, `POST /pause`, `POST /resume`; `control.rs`); anything else is a
//! 404. It starts before the bridge's topics are checked, so `/healthz` answers during a
//! long start, and stops when the bridge has.
//!
//! Apart from control requests it is unauthenticated (docs/operations.md, "Security"): a
//! status shows watch keys and errors, so expose it only where those may be seen. It bounds
//! what a client can
//! take: at most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's accept
//! queue until one ends), [`HEADER_READ_TIMEOUT`] to send a request's headers, and a failing
//! `accept` (out of file descriptors) is retried with backoff rather than in a busy loop.

use crate::control::{partition_of_key, Controls, ListQuery, Lookup};
use crate::internal_events::{ControlRefused, PollingPaused};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
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

/// The running server; stopped (its connections closed) when dropped.
pub struct OpsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl OpsServer {
    /// Listen on `addr` and serve until dropped. The error names `WATCHBRIDGE_METRICS_ADDR`.
    pub async fn start(addr: SocketAddr, api: OpsApi) -> Result<Self, String> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("WATCHBRIDGE_METRICS_ADDR: cannot listen on {addr}: {e}"))?;
        let addr = listener.local_addr().unwrap_or(addr);
        let task = tokio::spawn(serve(listener, Arc::new(api), MAX_CONNECTIONS));
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

/// What the server answers from.
pub struct OpsApi {
    /// Rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Asked at `/readyz`.
    pub readiness: Arc<Readiness>,
    /// This instance's partitions and watches.
    pub controls: Arc<Controls>,
    /// `WATCHBRIDGE_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
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
        }
    }
}

/// Accept and serve connections, at most `max_connections` at once, until aborted.
async fn serve<L: Listener>(mut listener: L, api: Arc<OpsApi>, max_connections: usize) {
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
                        async move { Ok::<_, Infallible>(respond(&api, &req).await) }
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
async fn respond<B>(api: &OpsApi, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let method = req.method();
    if let Some(rest) = path.strip_prefix("/watches") {
        return watches(api, req, rest).await;
    }
    match (method, path) {
        (&Method::GET, "/partitions") => json(StatusCode::OK, &api.controls.partitions().await),
        (&Method::POST, "/pause" | "/resume") => {
            if let Some(refused) = refusal(api, req) {
                return refused;
            }
            let paused = path == "/pause";
            api.controls.pause.set(paused);
            PollingPaused { paused }.emit(&api.metrics);
            json(StatusCode::OK, &serde_json::json!({ "paused": paused }))
        }
        _ => answer(&api.metrics, &api.readiness, method, path),
    }
}

/// `/watches` (`rest`: what follows it in the path).
async fn watches<B>(api: &OpsApi, req: &Request<B>, rest: &str) -> Response<Full<Bytes>> {
    let method = req.method();
    if rest.is_empty() || rest == "/" {
        if method != Method::GET {
            return text(StatusCode::NOT_FOUND, "not found\n".into());
        }
        let (partition, query) = match list_query(req.uri().query().unwrap_or_default()) {
            Ok(q) => q,
            Err(e) => return json(StatusCode::BAD_REQUEST, &serde_json::json!({ "error": e })),
        };
        let (total, watches) = api.controls.list(partition, &query).await;
        return json(
            StatusCode::OK,
            &serde_json::json!({
                "total": total,
                "offset": query.offset,
                "limit": query.limit,
                "watches": watches,
            }),
        );
    }
    let rest = &rest[1..];
    let (key, action) = match rest.rsplit_once('/') {
        Some((key, "stop")) => (key, Some("stop")),
        Some((key, "poll")) => (key, Some("poll")),
        _ => (rest, None),
    };
    let key = percent_encoding::percent_decode_str(key).collect::<Vec<u8>>();
    let not_here = |owned: Vec<i32>| {
        json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "error": "no live watch with this key on this instance",
                "key": String::from_utf8_lossy(&key),
                "owned_partitions": owned,
                "input_partition": partition_of_key(&key, api.controls.input_partitions()),
                "hint": "a watch lives on the instance that owns its input partition: the one its input records go to, `murmur2` if they are produced by a Java client's default partitioner, `crc32` by librdkafka's (C, Go, Python, .NET); GET /partitions on each instance says which it owns",
            }),
        )
    };
    match (method, action) {
        (&Method::GET, None) => match api.controls.status(&key).await {
            Lookup::Here(_, status) => json(StatusCode::OK, &status),
            Lookup::NotHere(owned) => not_here(owned),
        },
        (&Method::POST, Some("stop")) => {
            if let Some(refused) = refusal(api, req) {
                return refused;
            }
            match api.controls.stop(&key).await {
                Lookup::Here(partition, ()) => json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "stopped": String::from_utf8_lossy(&key),
                        "partition": partition,
                    }),
                ),
                Lookup::NotHere(owned) => not_here(owned),
            }
        }
        (&Method::POST, Some("poll")) => {
            if let Some(refused) = refusal(api, req) {
                return refused;
            }
            match api.controls.poll_now(&key).await {
                Lookup::Here(partition, moved) => json(
                    StatusCode::OK,
                    &serde_json::json!({
                        "key": String::from_utf8_lossy(&key),
                        "partition": partition,
                        "polling": if moved { "now" } else { "already" },
                    }),
                ),
                Lookup::NotHere(owned) => not_here(owned),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
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

/// The response to a request for metrics, liveness or readiness.
fn answer(
    metrics: &Metrics,
    readiness: &Readiness,
    method: &Method,
    path: &str,
) -> Response<Full<Bytes>> {
    if method != Method::GET {
        return text(StatusCode::NOT_FOUND, "not found\n".into());
    }
    match path {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
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
        "/metrics" => {
            // So that `watchbridge_ready` is current in every scrape.
            let _ = readiness.refresh(metrics);
            let mut response = text(StatusCode::OK, metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(prometheus::TEXT_FORMAT),
            );
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
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

    async fn server() -> OpsServer {
        let addr = "127.0.0.1:0".parse().unwrap();
        let api = OpsApi::basic(Arc::new(Metrics::new()), Arc::new(Readiness::new()));
        OpsServer::start(addr, api).await.unwrap()
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

    fn get(m: &Metrics, r: &Readiness, path: &str) -> (StatusCode, String) {
        let response = answer(m, r, &Method::GET, path);
        let status = response.status();
        let body = response.into_body();
        let bytes = futures::executor::block_on(http_body_util::BodyExt::collect(body))
            .unwrap()
            .to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[test]
    fn routes() {
        let (m, r) = (Metrics::new(), Readiness::new());
        assert_eq!(get(&m, &r, "/healthz"), (StatusCode::OK, "ok\n".into()));
        assert_eq!(
            get(&m, &r, "/readyz"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: waiting for the consumer group's assignment\n".into()
            )
        );
        r.assignment_received(&m);
        assert_eq!(get(&m, &r, "/readyz"), (StatusCode::OK, "ready\n".into()));
        let (status, body) = get(&m, &r, "/metrics");
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("watchbridge_ready 1"), "{body}");
        let response = answer(&m, &r, &Method::GET, "/metrics");
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "text/plain; version=0.0.4"
        );
        assert_eq!(get(&m, &r, "/").0, StatusCode::NOT_FOUND);
        assert_eq!(get(&m, &r, "/metrics/x").0, StatusCode::NOT_FOUND);
        assert_eq!(
            answer(&m, &r, &Method::POST, "/healthz").status(),
            StatusCode::NOT_FOUND
        );
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

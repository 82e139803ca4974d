//! The operations server on `WATCHBRIDGE_METRICS_ADDR`: `GET /metrics` (Prometheus text
//! format), `GET /healthz` (the process answers: no locks, no Kafka, so a slow broker never
//! gets a live instance restarted) and `GET /readyz` (see [`Readiness`]); anything else is
//! a 404. It starts before the bridge's topics are checked, so `/healthz` answers during a
//! long start, and stops when the bridge has.
//!
//! It is unauthenticated (docs/operations.md, "Security"), so it bounds what a client can
//! take: at most [`MAX_CONNECTIONS`] connections at once (more wait in the kernel's accept
//! queue until one ends), [`HEADER_READ_TIMEOUT`] to send a request's headers, and a failing
//! `accept` (out of file descriptors) is retried with backoff rather than in a busy loop.

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
    pub async fn start(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, String> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("WATCHBRIDGE_METRICS_ADDR: cannot listen on {addr}: {e}"))?;
        let addr = listener.local_addr().unwrap_or(addr);
        let task = tokio::spawn(serve(listener, metrics, readiness, MAX_CONNECTIONS));
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

/// Accept and serve connections, at most `max_connections` at once, until aborted.
async fn serve<L: Listener>(
    mut listener: L,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
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
                    let (metrics, readiness) = (metrics.clone(), readiness.clone());
                    let service = service_fn(move |req: Request<Incoming>| {
                        let response = answer(&metrics, &readiness, req.method(), req.uri().path());
                        async move { Ok::<_, Infallible>(response) }
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
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
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
        OpsServer::start(addr, Arc::new(Metrics::new()), Arc::new(Readiness::new()))
            .await
            .unwrap()
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
            Arc::new(Metrics::new()),
            Arc::new(Readiness::new()),
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

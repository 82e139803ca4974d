//! The operations server on `WATCHBRIDGE_METRICS_ADDR`: `GET /metrics` (Prometheus text
//! format), `GET /healthz` (the process answers: no locks, no Kafka, so a slow broker never
//! gets a live instance restarted) and `GET /readyz` (see [`Readiness`]); anything else is
//! a 404. It starts before the bridge's topics are checked, so `/healthz` answers during a
//! long start, and stops when the bridge has.

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
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A client that has not sent its request headers by then is dropped (a stuck or
/// malicious client must not hold a connection open forever).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

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
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task closes them too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (metrics, readiness) = (metrics.clone(), readiness.clone());
                        let service = service_fn(move |req: Request<Incoming>| {
                            let response = answer(&metrics, &readiness, req.method(), req.uri().path());
                            async move { Ok::<_, Infallible>(response) }
                        });
                        connections.spawn(
                            hyper::server::conn::http1::Builder::new()
                                .timer(TokioTimer::new())
                                .header_read_timeout(HEADER_READ_TIMEOUT)
                                .serve_connection(TokioIo::new(stream), service),
                        );
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
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
}

//! A reverse proxy on loopback in front of an S3-API server (moto): it forwards every
//! request and records it, so a test counts the requests a poll made; switched to
//! [`Mode::SlowDown`], it answers every request itself as S3 does when throttling (503
//! `SlowDown`, which moto cannot be made to send).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// What the proxy does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// 503 `SlowDown`, with `Retry-After: <seconds>` when given.
    SlowDown(Option<u64>),
    /// Forward the first `fast` requests (from when the mode was set) at once, and each
    /// later one after `delay`.
    SlowAfter {
        fast: usize,
        delay: Duration,
    },
}

/// One request, as `METHOD path?query`.
pub type Line = String;

pub struct S3Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    upstream: String,
    mode: Mutex<Mode>,
    /// Requests since the mode was set.
    since_mode: AtomicUsize,
    seen: Mutex<Vec<Line>>,
    client: reqwest::Client,
}

impl S3Proxy {
    /// A proxy to `upstream` (`http://127.0.0.1:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_string(),
            mode: Mutex::new(Mode::Forward),
            since_mode: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
        });
        let served = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = served.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(state.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
        self.state.since_mode.store(0, Ordering::SeqCst);
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Line> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Forget the requests so far (to count those of the next poll).
    pub fn clear(&self) {
        self.state.seen.lock().unwrap().clear();
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        self.seen
            .lock()
            .unwrap()
            .push(format!("{} {target}", req.method()));
        let mode = *self.mode.lock().unwrap();
        let nth = self.since_mode.fetch_add(1, Ordering::SeqCst);
        if let Mode::SlowAfter { fast, delay } = mode {
            if nth >= fast {
                tokio::time::sleep(delay).await;
            }
        }
        if let Mode::SlowDown(after) = mode {
            let mut r = Response::builder().status(503);
            if let Some(after) = after {
                r = r.header("retry-after", after.to_string());
            }
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                        <Message>Please reduce your request rate.</Message></Error>";
            return r.body(Full::new(Bytes::from(body))).unwrap();
        }
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut forward = self
            .client
            .request(parts.method.clone(), format!("{}{target}", self.upstream))
            .body(body);
        for (name, value) in &parts.headers {
            if name != hyper::header::HOST {
                forward = forward.header(name, value);
            }
        }
        match forward.send().await {
            Ok(r) => {
                let mut out = Response::builder().status(r.status().as_u16());
                for (name, value) in r.headers() {
                    // Content-Length stays: a HEAD's is the object's size.
                    if name != hyper::header::TRANSFER_ENCODING {
                        out = out.header(name, value);
                    }
                }
                let body = r.bytes().await.unwrap_or_default();
                out.body(Full::new(body)).unwrap()
            }
            Err(e) => Response::builder()
                .status(502)
                .body(Full::new(Bytes::from(e.to_string())))
                .unwrap(),
        }
    }
}

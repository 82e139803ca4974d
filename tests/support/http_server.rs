//! A real HTTP/1.1 server on loopback for poller tests (hyper), answering each request with
//! whatever the test's handler says and recording what it was asked.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query exactly as sent (still percent-encoded).
    pub target: String,
    pub headers: HeaderMap,
    /// The request body as received (empty when there was none).
    pub body: Vec<u8>,
}

/// What to answer.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    /// Wait this long before answering.
    pub delay: Duration,
}

pub enum Body {
    Bytes(Vec<u8>),
    /// Chunks of `[1,1,1,…` forever, with no Content-Length.
    Endless,
    /// These bytes in 64 KiB chunks, with no Content-Length.
    Chunked(Vec<u8>),
}

impl Reply {
    pub fn json(body: serde_json::Value) -> Self {
        Self::status(200, body.to_string())
    }

    pub fn status(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: Body::Bytes(body.into()),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

pub struct TestServer {
    pub addr: SocketAddr,
    /// `http`, or `https` for a server started with [`TestServer::start_tls`].
    scheme: &'static str,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_with(handler, None).await
    }

    /// The same server behind TLS (see `support::tls`); a connection whose handshake fails
    /// is dropped.
    pub async fn start_tls(
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
        tls: tokio_rustls::TlsAcceptor,
    ) -> Self {
        Self::start_with(handler, Some(tls)).await
    }

    async fn start_with(
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let seen_by_server = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let seen = seen_by_server.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(answer(req, &*handler, &seen).await) }
                    });
                    let http1 = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => http1.serve_connection(TokioIo::new(stream), service).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                http1.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Self {
            addr,
            scheme,
            seen,
            task,
        }
    }

    /// `http://127.0.0.1:<port><path>` (`https://` for a TLS server)
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    /// The same URL with `host` in place of `127.0.0.1` (e.g. `localhost`, or `api.test`,
    /// which only the test proxy resolves).
    pub fn url_at(&self, host: &str, path: &str) -> String {
        format!("{}://{host}:{}{path}", self.scheme, self.addr.port())
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: Request<Incoming>,
    handler: &Handler,
    seen: &Mutex<Vec<Seen>>,
) -> Response<UnsyncBoxBody<Bytes, Infallible>> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(_) => Vec::new(),
    };
    let request = Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    seen.lock().unwrap().push(request.clone());
    let reply = handler(&request);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let body = match reply.body {
        Body::Bytes(b) => Full::new(Bytes::from(b)).boxed_unsync(),
        Body::Endless => {
            let first = futures::stream::once(async { Ok(Frame::data(Bytes::from_static(b"["))) });
            let rest =
                futures::stream::repeat_with(|| Ok(Frame::data(Bytes::from(b"1,".repeat(8192)))));
            StreamBody::new(futures::StreamExt::chain(first, rest)).boxed_unsync()
        }
        Body::Chunked(b) => {
            let chunks: Vec<Result<Frame<Bytes>, Infallible>> = b
                .chunks(64 << 10)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            StreamBody::new(futures::stream::iter(chunks)).boxed_unsync()
        }
    };
    let mut response = Response::builder().status(reply.status);
    for (name, value) in reply.headers {
        response = response.header(name, value);
    }
    response.body(body).unwrap()
}

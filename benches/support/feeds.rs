//! The resource the versus benches watch: one JSON feed per watch, over real HTTP on
//! loopback, served by this process. `GET /feeds/{n}` answers `{"items": [{"id":
//! "item-j", "time" (epoch ms), "payload" (~100 bytes)} …], "complete": …}` after a fixed
//! delay per response.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Size of each item's payload, in bytes.
pub const PAYLOAD_BYTES: usize = 100;

/// What the feeds hold.
pub enum Feeds {
    /// Every feed's whole body, complete from the first poll.
    Complete(Vec<Bytes>),
    /// Feeds that grow: only item 0 of every feed until `start` is set, then item `j`
    /// appears `j x step` after `start`; a feed is complete once its last item has appeared.
    Growing {
        items: Vec<Vec<String>>,
        start: Arc<OnceLock<Instant>>,
        step: Duration,
    },
}

/// `watches` feeds of `items` items, item `j` with time `base + j` ms (never late against
/// watchbridge's default `bounded(5s)` watermark, which follows the inputs' timestamps).
pub fn feed_items(watches: usize, items: usize, base: i64) -> Vec<Vec<String>> {
    let pad = "x".repeat(PAYLOAD_BYTES);
    (0..watches)
        .map(|n| {
            (0..items)
                .map(|j| {
                    format!(
                        r#"{{"id":"item-{j}","time":{},"payload":"feed {n} item {j} {}"}}"#,
                        base + j as i64,
                        &pad[..PAYLOAD_BYTES.saturating_sub(20)]
                    )
                })
                .collect()
        })
        .collect()
}

fn body(items: &[String], complete: bool) -> Bytes {
    Bytes::from(format!(
        r#"{{"items":[{}],"complete":{complete}}}"#,
        items.join(",")
    ))
}

impl Feeds {
    /// Every feed complete at once (the bodies prepared here, not per request).
    pub fn complete(watches: usize, items: usize, base: i64) -> Feeds {
        Feeds::Complete(
            feed_items(watches, items, base)
                .iter()
                .map(|items| body(items, true))
                .collect(),
        )
    }

    /// Feed `n`'s body now.
    fn body(&self, n: usize) -> Option<Bytes> {
        match self {
            Feeds::Complete(bodies) => bodies.get(n).cloned(),
            Feeds::Growing { items, start, step } => {
                let items = items.get(n)?;
                let steps = start.get().map_or(0, |start| {
                    start.elapsed().as_nanos() / step.as_nanos().max(1)
                });
                let visible = items.len().min(steps as usize + 1);
                Some(body(&items[..visible], visible == items.len()))
            }
        }
    }
}

/// An HTTP server answering `GET /feeds/{n}` with feed `n`'s body after `delay`. Stops
/// when dropped (open connections end when their clients close them).
pub struct FeedServer {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl FeedServer {
    pub async fn start(feeds: Feeds, delay: Duration) -> FeedServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the feed server");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let feeds = Arc::new(feeds);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let feeds = feeds.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let feeds = feeds.clone();
                        async move {
                            let body = req
                                .uri()
                                .path()
                                .strip_prefix("/feeds/")
                                .and_then(|n| n.parse::<usize>().ok())
                                .and_then(|n| feeds.body(n));
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            let response = match body {
                                Some(body) => Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(body)),
                                None => Response::builder()
                                    .status(StatusCode::NOT_FOUND)
                                    .body(Full::new(Bytes::from_static(b"no such feed"))),
                            };
                            Ok::<_, std::convert::Infallible>(response.unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FeedServer { url, task }
    }
}

impl Drop for FeedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! The hostile-server suite (issue 17): the HTTP poller, run inside an `Engine` on the real
//! clock with a short poll timeout, against loopback servers that misbehave on purpose.
//! For each behaviour: nothing panics, every poll ends within the poll timeout (plus a small
//! margin), what one poll reads stays under the per-poll budget
//! (`WATCHBRIDGE_HTTP_MAX_POLL_BYTES`), and the configured headers are seen by no origin but
//! the template's own. The last test stops the real bridge while its polls hang on a
//! slowloris server (it needs the test broker).

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use support::engine::run_one_watch;
use support::http_server::{Body, Reply, Seen, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use watchbridge::poll::{PollError, PollResult, Poller};
use watchbridge::pollers::http::config::{HttpArgs, Redacted};
use watchbridge::pollers::http::{HttpConfig, HttpPoller, HttpTarget};
use watchbridge::pollers::Resolve;

/// `WATCHBRIDGE_POLL_TIMEOUT` here: each request's deadline and the engine's per poll.
const TIMEOUT: Duration = Duration::from_millis(500);
/// What a poll may take past [`TIMEOUT`] (scheduling on a shared, busy machine).
const MARGIN: Duration = Duration::from_millis(400);
/// `WATCHBRIDGE_HTTP_MAX_BYTES` here.
const MAX_PAGE: u64 = 1 << 20;
/// `WATCHBRIDGE_HTTP_MAX_POLL_BYTES` here.
const BUDGET: u64 = 2 << 20;
/// Secret headers for the template's origin only.
const SECRETS: &str = "Authorization: Bearer s3cret\nX-Api-Key: k3y";

/// Settings: items at `/items`, next pages at `/next`, [`SECRETS`], the budget above.
fn config(url: &str, allowed_hosts: Option<String>) -> HttpConfig {
    HttpArgs {
        url: Some(url.into()),
        items: "/items".into(),
        next: Some("/next".into()),
        headers: Some(Redacted(SECRETS.into())),
        max_bytes: MAX_PAGE.to_string(),
        max_poll_bytes: BUDGET.to_string(),
        allowed_hosts,
        ..HttpArgs::defaults()
    }
    .config(TIMEOUT, &|_| None)
    .unwrap()
}

/// Which configured (or leaking) headers one request carried.
fn leaked(seen: &Seen) -> Vec<&'static str> {
    ["authorization", "x-api-key", "referer"]
        .into_iter()
        .filter(|h| seen.headers.contains_key(*h))
        .collect()
}

/// One poll as the engine ran it.
#[derive(Debug, Clone)]
struct Polled {
    took: Duration,
    /// The output bytes it returned, or its error kind (`cancelled`: the engine dropped it,
    /// at its timeout or when the watch ended).
    outcome: Result<usize, &'static str>,
    /// What the server counted as served (body bytes) while this poll ran.
    served: u64,
}

type Served = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The HTTP poller, recording every poll, also one the engine drops.
struct Recorder {
    inner: HttpPoller,
    polls: Arc<Mutex<Vec<Polled>>>,
    served: Served,
}

struct Record {
    started: Instant,
    before: u64,
    outcome: Result<usize, &'static str>,
    polls: Arc<Mutex<Vec<Polled>>>,
    served: Served,
}

impl Drop for Record {
    fn drop(&mut self) {
        let polled = Polled {
            took: self.started.elapsed(),
            outcome: self.outcome,
            served: (self.served)() - self.before,
        };
        self.polls.lock().unwrap().push(polled);
    }
}

impl Poller for Recorder {
    type Input = HttpTarget;

    fn poll(
        &self,
        input: Arc<HttpTarget>,
    ) -> impl std::future::Future<Output = Result<PollResult, PollError>> + Send + 'static {
        let poll = self.inner.poll(input);
        let polls = self.polls.clone();
        let served = self.served.clone();
        async move {
            let mut record = Record {
                started: Instant::now(),
                before: served(),
                outcome: Err("cancelled"),
                polls,
                served,
            };
            let result = poll.await;
            record.outcome = match &result {
                Ok(r) => Ok(r.outputs.iter().map(|o| o.key.len() + o.value.len()).sum()),
                Err(e) => Err(e.kind),
            };
            result
        }
    }
}

/// What one watch did in the engine: its polls and the outputs it emitted.
struct Run {
    polls: Vec<Polled>,
    outputs: Vec<String>,
}

/// One watch on `key` in an engine with the poll timeout [`TIMEOUT`], quick retries (50 ms
/// doubling to 200 ms, no limit, `Retry-After` capped at 200 ms) and `total(run_for)`;
/// then the checks every hostile behaviour must pass.
async fn run(config: HttpConfig, key: &str, served: Served, run_for: &str) -> Run {
    use watchbridge::schedule::{Retry, Schedule};
    use watchbridge::watch::WatchRules;

    let inner = HttpPoller::new(config).unwrap();
    let input = Arc::new(inner.resolve(&json!({}), key.as_bytes()).unwrap());
    let polls = Arc::new(Mutex::new(Vec::new()));
    let poller = Arc::new(Recorder {
        inner,
        polls: polls.clone(),
        served,
    });
    let rules = WatchRules {
        catch_up: Default::default(),
        termination: run_for.parse().unwrap(),
        schedule: Schedule {
            interval: Duration::from_millis(50),
            jitter: 0.0,
            retry: Retry {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
                after_max: None,
                limit: u32::MAX,
            },
            ..Schedule::default()
        },
    };
    let outputs = run_one_watch(poller, input, key, rules, TIMEOUT, "a hostile server")
        .await
        .outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.value).into_owned())
        .collect();
    let polls = polls.lock().unwrap().clone();
    assert!(!polls.is_empty(), "no poll ran");
    for p in &polls {
        assert!(
            p.took <= TIMEOUT + MARGIN,
            "a poll took {:?}, more than the poll timeout {TIMEOUT:?} + {MARGIN:?}: {p:?}",
            p.took
        );
        assert_ne!(p.outcome, Err("panic"), "{p:?}");
        // Whole pages read stay within the budget; the server may have sent (into socket
        // buffers) part or all of one more page that the poll refused.
        assert!(
            p.served <= BUDGET + MAX_PAGE,
            "a poll was served {} bytes, the budget is {BUDGET} (+ one refused page): {p:?}",
            p.served
        );
        if let Ok(bytes) = p.outcome {
            assert!(bytes as u64 <= 2 * BUDGET, "{p:?}");
        }
    }
    Run { polls, outputs }
}

fn nothing_served() -> Served {
    Arc::new(|| 0)
}

/// The polls' outcomes, each once, in order of first appearance (`cancelled` left out).
fn kinds(run: &Run) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    for p in &run.polls {
        let kind = match p.outcome {
            Ok(_) => "ok",
            Err(k) => k,
        };
        if kind != "cancelled" && !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

/// What a raw TCP server does after reading a request.
#[derive(Clone, Copy)]
enum Trickle {
    /// The status line, then one byte of a header every 50 ms, forever.
    Headers,
    /// Whole headers (`Content-Length: 100000`), then one body byte every 50 ms, forever.
    Body,
    /// Headers announcing a 10 GiB body, then one body byte every 50 ms.
    HugeLength,
}

/// A raw TCP server on loopback that answers slowly, as [`Trickle`] says.
struct Slowloris {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Slowloris {
    async fn start(mode: Trickle) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = stream.read(&mut buf).await;
                    let head: &[u8] = match mode {
                        Trickle::Headers => b"HTTP/1.1 200 OK\r\nX-Slow: ",
                        Trickle::Body => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"items\": [",
                        Trickle::HugeLength => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10737418240\r\n\r\n{\"items\": [",
                    };
                    if stream.write_all(head).await.is_err() {
                        return;
                    }
                    let byte: &[u8] = match mode {
                        Trickle::Headers => b"a",
                        _ => b" ",
                    };
                    loop {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        if stream.write_all(byte).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server that trickles its response (`trickle`): every poll times out, within the
/// poll timeout, and the watch goes on polling.
async fn every_poll_times_out(trickle: Trickle) {
    let slow = Slowloris::start(trickle).await;
    let r = run(
        config(&slow.url("/x"), None),
        "w",
        nothing_served(),
        "total(2s)",
    )
    .await;
    assert_eq!(kinds(&r), ["timeout"], "{:?}", r.polls);
    assert!(r.polls.len() >= 2, "{:?}", r.polls);
}

#[tokio::test]
async fn slowloris_headers_every_poll_times_out_within_the_poll_timeout() {
    every_poll_times_out(Trickle::Headers).await;
}

#[tokio::test]
async fn slowloris_body_every_poll_times_out_within_the_poll_timeout() {
    every_poll_times_out(Trickle::Body).await;
}

/// A page announcing 10 GiB is refused from its `Content-Length`, without reading it; an
/// endless body without one is refused at `WATCHBRIDGE_HTTP_MAX_BYTES`.
#[tokio::test]
async fn a_huge_page_is_refused_at_the_page_limit() {
    let slow = Slowloris::start(Trickle::HugeLength).await;
    let r = run(
        config(&slow.url("/x"), None),
        "w",
        nothing_served(),
        "total(1s)",
    )
    .await;
    assert_eq!(kinds(&r), ["too_large"], "{:?}", r.polls);
    for p in &r.polls {
        assert!(p.took < TIMEOUT, "refused at once, not timed out: {p:?}");
    }

    let endless = TestServer::start(|_| Reply {
        body: Body::Endless,
        ..Reply::status(200, "")
    })
    .await;
    let r = run(
        config(&endless.url("/x"), None),
        "w",
        nothing_served(),
        "total(1s)",
    )
    .await;
    assert_eq!(kinds(&r), ["too_large"], "{:?}", r.polls);
}

/// A server that always links another page: each poll ends `over_budget` with the pages
/// it read under `WATCHBRIDGE_HTTP_MAX_POLL_BYTES` (checked in [`run`]: bytes served per
/// poll). Before the budget (issue 17, item 3) a poll read `WATCHBRIDGE_HTTP_MAX_PAGES`
/// pages, whatever their size.
#[tokio::test]
async fn endless_next_pages_end_each_poll_at_the_budget() {
    const PAGE: usize = 256 << 10;
    let served = Arc::new(AtomicU64::new(0));
    let count = served.clone();
    let server = TestServer::start(move |seen| {
        let page: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap();
        let mut body =
            format!(r#"{{"items":[{page}],"next":"/p/{}","pad":""#, page + 1).into_bytes();
        body.resize(PAGE - 2, b'x');
        body.extend_from_slice(b"\"}");
        count.fetch_add(body.len() as u64, Ordering::SeqCst);
        Reply::status(200, body)
    })
    .await;
    let r = run(
        config(&server.url("/p/1"), None),
        "w",
        Arc::new(move || served.load(Ordering::SeqCst)),
        "total(2s)",
    )
    .await;
    assert_eq!(kinds(&r), ["over_budget"], "{:?}", r.polls);
    assert!(r.outputs.is_empty(), "a failed poll emits nothing");
}

/// `Retry-After` far in the future (seconds or an HTTP date) or negative: the watch is
/// retried within the cap (the retry maximum, 200 ms), never parked.
#[tokio::test]
async fn retry_after_far_future_negative_or_a_date_never_parks_a_watch() {
    let runs = ["99999999999", "-5", "Thu, 01 Jan 2099 00:00:00 GMT"].map(|value| async move {
        let server =
            TestServer::start(move |_| Reply::status(429, "busy").header("retry-after", value))
                .await;
        let r = run(
            config(&server.url("/x"), None),
            "w",
            nothing_served(),
            "total(2s)",
        )
        .await;
        assert_eq!(kinds(&r), ["http_429"], "{value:?}: {:?}", r.polls);
        // 50 ms, 100 ms, then every 200 ms: about 10 polls in 2 s; a parked watch polls once.
        assert!(
            r.polls.len() >= 5,
            "Retry-After {value:?}: {} polls in 2 s",
            r.polls.len()
        );
    });
    futures::future::join_all(runs).await;
}

/// Every answer a 5xx: retried with backoff (not a busy loop), each poll quick.
#[tokio::test]
async fn a_5xx_storm_is_retried_with_backoff() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let server = TestServer::start(move |_| {
        let status = [500, 502, 503, 504][counter.fetch_add(1, Ordering::SeqCst) % 4];
        Reply::status(status, "x".repeat(10_000))
    })
    .await;
    let r = run(
        config(&server.url("/x"), None),
        "w",
        nothing_served(),
        "total(2s)",
    )
    .await;
    let mut k = kinds(&r);
    k.sort();
    assert_eq!(k, ["http_503", "http_5xx"], "{:?}", r.polls);
    let n = server.requests().len();
    assert!((5..=40).contains(&n), "{n} requests in 2 s");
}

/// Redirects that hop between three allowed origins forever, and one chain to an origin
/// that is not allowed: the configured headers reach only the template's origin on the
/// chain's first hop, the endless chain ends at 10 redirects, and the origin not allowed
/// is never contacted.
#[tokio::test]
async fn a_redirect_chain_across_origins_carries_no_headers_and_ends() {
    let addrs: Arc<OnceLock<Vec<String>>> = Arc::new(OnceLock::new());
    let outside = TestServer::start(|_| Reply::json(json!({"items": ["outside"]}))).await;
    let outside_url = outside.url("/landing");
    // Server i redirects `/hop/n` to server (i + 1) % 3, `/away` to the outside.
    let mut servers = Vec::new();
    for i in 0..3usize {
        let addrs = addrs.clone();
        let outside_url = outside_url.clone();
        servers.push(
            TestServer::start(move |seen| {
                if seen.target == "/away" {
                    return Reply::status(302, "").header("location", outside_url.clone());
                }
                let n: usize = seen.target.rsplit('/').next().unwrap().parse().unwrap_or(0);
                let to = &addrs.get().unwrap()[(i + 1) % 3];
                Reply::status(307, "").header("location", format!("http://{to}/hop/{}", n + 1))
            })
            .await,
        );
    }
    let list: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    addrs.set(list.clone()).unwrap();
    let c = config(&servers[0].url("/{key}"), Some(list.join(",")));
    let r = run(c.clone(), "hop", nothing_served(), "total(1s)").await;
    assert_eq!(kinds(&r), ["redirect_refused"], "{:?}", r.polls);
    let r = run(c, "away", nothing_served(), "total(1s)").await;
    assert_eq!(kinds(&r), ["redirect_refused"], "{:?}", r.polls);
    assert!(outside.requests().is_empty(), "{:?}", outside.requests());
    for (i, server) in servers.iter().enumerate() {
        for seen in server.requests() {
            let first_hop = i == 0 && (seen.target == "/hop" || seen.target == "/away");
            if first_hop {
                assert_eq!(leaked(&seen), ["authorization", "x-api-key"], "{seen:?}");
            } else {
                assert_eq!(leaked(&seen), Vec::<&str>::new(), "server {i}: {seen:?}");
            }
        }
    }
}

/// A next page on another origin that echoes every request header back as items: allowed,
/// it is read, and no secret comes back; not allowed, it is never contacted.
#[tokio::test]
async fn a_header_echo_server_on_another_origin_sees_no_configured_header() {
    let echo = |seen: &Seen| {
        let items: Vec<Value> = seen
            .headers
            .iter()
            .map(|(k, v)| json!(format!("{k}: {}", String::from_utf8_lossy(v.as_bytes()))))
            .collect();
        Reply::json(json!({ "items": items }))
    };
    let allowed_echo = TestServer::start(echo).await;
    let other_echo = TestServer::start(echo).await;
    let to_allowed = allowed_echo.url("/echo");
    let to_other = other_echo.url("/echo");
    let server = TestServer::start(move |seen| {
        let next = if seen.target == "/allowed" {
            to_allowed.clone()
        } else {
            to_other.clone()
        };
        Reply::json(json!({"items": ["own"], "next": next}))
    })
    .await;
    let allowed = format!("{},{}", server.addr, allowed_echo.addr);
    let r = run(
        config(&server.url("/{key}"), Some(allowed.clone())),
        "allowed",
        nothing_served(),
        "total(1s)",
    )
    .await;
    assert_eq!(kinds(&r), ["ok"], "{:?}", r.polls);
    assert!(
        r.outputs.iter().any(|o| o.contains("user-agent")),
        "{:?}",
        r.outputs
    );
    for o in &r.outputs {
        assert!(
            !o.contains("s3cret") && !o.contains("k3y"),
            "echoed back: {o}"
        );
    }
    for seen in allowed_echo.requests() {
        assert_eq!(leaked(&seen), Vec::<&str>::new(), "{seen:?}");
    }
    let r = run(
        config(&server.url("/{key}"), Some(allowed)),
        "other",
        nothing_served(),
        "total(1s)",
    )
    .await;
    assert_eq!(kinds(&r), ["next_refused"], "{:?}", r.polls);
    assert!(other_echo.requests().is_empty());
    for seen in server.requests() {
        assert_eq!(leaked(&seen), ["authorization", "x-api-key"], "{seen:?}");
    }
}

/// The real bridge, its polls hanging on a slowloris server (poll timeout 60 s): SIGTERM
/// ends it within `WATCHBRIDGE_SHUTDOWN_TIMEOUT` (5 s). Needs the test broker.
#[tokio::test(flavor = "multi_thread")]
async fn the_bridge_stops_within_its_shutdown_timeout_while_polls_hang_on_a_slowloris_server() {
    use support::bridge::Bridge;
    use support::kafka::broker;
    const SHUTDOWN: Duration = Duration::from_secs(5);
    let slow = Slowloris::start(Trickle::Headers).await;
    let b = broker();
    let input = b.unique_topic("hostile-in");
    b.create_topic(&input, 2).await;
    let env = vec![
        ("WATCHBRIDGE_INPUT_TOPIC", input.clone()),
        ("WATCHBRIDGE_OUTPUT_TOPIC", format!("{input}-out")),
        ("WATCHBRIDGE_GROUP_ID", format!("{input}-group")),
        ("WATCHBRIDGE_HTTP_URL", slow.url("/users/{/id}")),
        ("WATCHBRIDGE_POLL_TIMEOUT", "60s".into()),
        ("WATCHBRIDGE_SHUTDOWN_TIMEOUT", "5s".into()),
    ];
    let mut bridge = Bridge::start(&env);
    bridge.wait_for_log("ready: partitions assigned", Duration::from_secs(30));
    for user in 1..=4 {
        b.produce(
            &input,
            None,
            Some(format!("user-{user}").as_bytes()),
            json!({ "id": user }).to_string().as_bytes(),
            &[],
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while slow.accepted.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "no polls reached the slowloris server:\n{}",
            bridge.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, took) = match bridge.terminate_within(Duration::from_secs(30)) {
        Ok(ended) => ended,
        Err(running) => panic!("still running {running:?} after SIGTERM:\n{}", bridge.log()),
    };
    eprintln!("the stop took {took:?}, exit code {code:?}");
    assert!(
        took <= SHUTDOWN + Duration::from_secs(1),
        "the stop took {took:?}, WATCHBRIDGE_SHUTDOWN_TIMEOUT is {SHUTDOWN:?}:\n{}",
        bridge.log()
    );
    assert!(!bridge.log().contains("panicked"), "{}", bridge.log());
}
